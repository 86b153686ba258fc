"""Progress lines for long CLI work (model loading, long batches, KEK rotation).

Written to stderr, and only when stderr is a terminal and the command was not asked for
``--json``: scripts, pipes and CI logs see the result alone. Libraries' own progress bars
(transformers' "Loading weights") follow the same rule (:func:`quiet_libraries`).
"""

from __future__ import annotations

import sys
import time


def enabled(as_json: bool = False) -> bool:
    return not as_json and sys.stderr.isatty()


def quiet_libraries(as_json: bool = False) -> None:
    """Turn off third-party progress bars (transformers' "Loading weights" bars, drawn on
    stderr whatever it is) unless progress is :func:`enabled`. Call before loading a model."""
    if enabled(as_json):
        return
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # child processes (vLLM workers) too
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()


def note(message: str, *, as_json: bool = False) -> None:
    """One progress line ("loading the model ..."), on a terminal only."""
    if enabled(as_json):
        sys.stderr.write(message + "\n")
        sys.stderr.flush()


class Counter:
    """A counter redrawn in place at most every ``interval`` seconds: ``1,234 lines, 0 failed``."""

    def __init__(self, what: str, *, as_json: bool = False, interval: float = 0.5) -> None:
        self.what = what
        self.on = enabled(as_json)
        self.interval = interval
        self.count = 0
        self.failed = 0
        self._shown = 0.0
        self._drawn = False

    def tick(self, failed: bool = False) -> None:
        self.count += 1
        self.failed += failed
        if self.on and time.monotonic() - self._shown >= self.interval:
            self._draw()

    def _draw(self) -> None:
        self._shown = time.monotonic()
        self._drawn = True
        sys.stderr.write(f"\r{self.count:,} {self.what}, {self.failed:,} failed")
        sys.stderr.flush()

    def close(self) -> None:
        if self.on and self._drawn:
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


class Bar:
    """A progress bar over a known total (bytes of an input file): ``37 % 12,345 texts, 2
    failed, 1,234 texts/s, 1m20s left``, redrawn in place at most every ``interval`` seconds,
    on a terminal only (:func:`enabled`)."""

    def __init__(self, what: str, total: int, *, as_json: bool = False, interval: float = 0.5) -> None:
        self.what = what
        self.total = max(1, total)
        self.on = enabled(as_json)
        self.interval = interval
        self._started = time.monotonic()
        self._shown = 0.0
        self._drawn = False
        self._state = (0, 0, 0)

    def update(self, count: int, failed: int, done: int) -> None:
        self._state = (count, failed, done)
        if self.on and time.monotonic() - self._shown >= self.interval:
            self._draw()

    def _draw(self) -> None:
        count, failed, done = self._state
        now = time.monotonic()
        self._shown = now
        self._drawn = True
        elapsed = max(now - self._started, 1e-9)
        share = min(1.0, done / self.total)
        left = elapsed * (1.0 - share) / share if share > 0 else 0.0
        width = 24
        filled = int(width * share)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {share:4.0%} {count:,} {self.what}, "
                         f"{failed:,} failed, {count / elapsed:,.0f} {self.what}/s, {_duration(left)} left  ")
        sys.stderr.flush()

    def close(self) -> None:
        if self.on and self._drawn:
            self._draw()
            sys.stderr.write("\n")
            sys.stderr.flush()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
