"""The shared number checks (plumbing.numbers) every package's validators use."""
from __future__ import annotations

import math

import pytest

from plumbing.numbers import bounds_text, broken_bound, in_range, is_integer, is_number


@pytest.mark.parametrize("v,ok", [(1, True), (2.5, True), (0, True), (True, False), (math.nan, False),
                                  (math.inf, False), ("1", False), (None, False)])
def test_is_number(v, ok):
    assert is_number(v) is ok


def test_is_integer_takes_integral_floats_only_when_asked():
    assert is_integer(3) and not is_integer(3.0) and not is_integer(False)
    assert is_integer(3.0, integral_floats=True) and not is_integer(3.5, integral_floats=True)
    assert not is_integer(math.inf, integral_floats=True)


def test_bounds_are_reported_in_order_and_as_text():
    assert broken_bound(0, gt=0) == "> 0" and broken_bound(1, gt=0) is None
    assert broken_bound(2, ge=0, le=1) == "<= 1" and broken_bound(-1, ge=0, le=1) == ">= 0"
    assert broken_bound(0.5, lt=0.5) == "< 0.5"
    assert bounds_text(gt=0, le=1) == "> 0 and <= 1" and bounds_text() == ""


def test_in_range():
    assert in_range(1, gt=0) and not in_range(0, gt=0) and not in_range(math.nan, gt=0)
    assert in_range(2, ge=1, integer=True) and not in_range(2.0, ge=1, integer=True)
    assert not in_range(True, ge=0, integer=True)
