"""scripts/paper_ratios.py on its reduced settings: each paper's comparison keeps its direction
(SJF by a ranker beats FCFS on a burst and in synthetic data generation; VTC gives the light
client about half the service where FCFS gives it a third, and serves clients under their fair
share about all they ask). Seeded; inequalities, not golden values."""
import pytest

from scripts import paper_ratios
from scripts.stamp import is_stamp


@pytest.fixture(scope="module")
def sim():
    return paper_ratios.measure(small=True)


def test_ranker_beats_fcfs_on_a_burst(sim):
    assert sim["burst"]["ranker"] > 1.2 and sim["burst"]["oracle"] > 1.2


def test_ranker_raises_synthetic_data_throughput(sim):
    assert sim["sdg"]["ranker"] > 1.2 and sim["sdg"]["oracle"] >= sim["sdg"]["noisy"]


def test_vtc_evens_the_service_under_overload(sim):
    vtc, fcfs = sim["vtc_share"]["vtc"], sim["vtc_share"]["fcfs"]
    assert abs(vtc - 0.5) < 0.05 and abs(fcfs - 1 / 3) < 0.05
    assert sim["vtc_vs_fcfs"]["vtc"] > 1.3


def test_vtc_serves_light_clients_what_they_ask(sim):
    assert min(sim["vtc_prop"].values()) > 0.8


def test_every_comparison_has_a_row(sim):
    rows = paper_ratios.rows(sim)
    assert len(rows) == 2 + len(paper_ratios.PUBLISHED)


def test_refuses_to_overwrite_a_page_it_did_not_write(tmp_path, capsys):
    page = tmp_path / "papers.md"
    page.write_text("my notes\n")
    assert paper_ratios.main(["--out", str(page)]) == 2
    assert page.read_text() == "my notes\n"
    assert capsys.readouterr().err.startswith("error: --out")


def test_stamp_line_is_valid():
    assert is_stamp(paper_ratios.produced(paper_ratios.COMMAND, "abc1234", "2026-01-01"))
