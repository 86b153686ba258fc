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
