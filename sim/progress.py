"""Progress of a long command on stderr: a tqdm bar on a terminal; otherwise (a log, a CI job, a
pipe) one plain line at least every ``INTERVAL_S`` seconds, so a quiet minute never looks hung.

    bar = progress_bar(None, total=40, desc="validate", unit="request")   # None: choose by stderr
    bar.update(1); bar.close()

``progress`` is the usual tri-state of a ``--progress/--no-progress`` flag: True draws a tqdm bar,
False draws nothing (:func:`progress_bar` returns None), None picks the bar on a terminal and the
lines otherwise. The lines come from a daemon thread (a step that takes a minute still gets its
lines); it only reads the counters, so results do not depend on it.
"""
from __future__ import annotations

import os
import sys
import threading
import time

#: Seconds between two progress lines when stderr is not a terminal.
INTERVAL_S = 10.0

# held while a line is written, and across fork(): a worker forked mid-write would inherit a held
# stderr lock and hang on its first message
_WRITE = threading.Lock()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_WRITE.acquire, after_in_parent=_WRITE.release, after_in_child=_WRITE.release)

_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%), {elapsed} elapsed, {remaining} left{postfix}"
_FORMAT_OPEN = "{desc}: {n_fmt} {unit}, {elapsed} elapsed{postfix}"  # (no total known)


class ProgressLines:
    """tqdm's counting interface (``n``, ``total``, ``update``, ``set_postfix``, ``close``),
    written as a line to ``file`` every ``interval_s`` seconds and once at close (if it wrote any
    before). Lines look like ``sweep: 12/40 run (30%), 01:05 elapsed, 02:31 left, failed=0``."""

    def __init__(self, total: float | None, desc: str, unit: str, initial: float = 0,
                 interval_s: float | None = None, file=None) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.initial = initial
        self.postfix = ""
        self.file = file if file is not None else sys.stderr
        self.interval_s = INTERVAL_S if interval_s is None else interval_s
        self.lines = 0
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="priosim-progress", daemon=True)
        self._thread.start()

    def update(self, n: float = 1) -> None:
        self.n += n

    def set_postfix(self, **kw) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in kw.items())

    def line(self) -> str:
        """The current state as one line (tqdm's formatting: counts, elapsed, time left)."""
        from tqdm import tqdm

        fmt = _FORMAT if self.total else _FORMAT_OPEN
        return tqdm.format_meter(self.n, self.total, time.monotonic() - self.t0, prefix=self.desc, unit=self.unit,
                                 initial=self.initial, bar_format=fmt,
                                 postfix=self.postfix or None)

    def _write(self) -> None:
        with _WRITE:
            print(self.line(), file=self.file, flush=True)
            self.lines += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write()

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        if self.lines:  # a log that showed progress also shows the end
            self._write()


def progress_bar(progress: bool | None, *, total: float | None, desc: str, unit: str, initial: float = 0,
                 leave: bool = False):
    """A tqdm bar (``progress`` True, or None on a terminal), :class:`ProgressLines` (None
    elsewhere) or None (False). ``total`` may be None where the count is not known ahead."""
    if progress is False:
        return None
    if progress or sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, initial=initial, leave=leave, file=sys.stderr)
    return ProgressLines(total, desc, unit, initial=initial)
