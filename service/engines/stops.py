"""Incremental detokenization with stop strings, shared by the engines.

Text is released only when it can no longer change: a byte-level tokenizer may end on a
partial UTF-8 character (decoded as U+FFFD until the next token completes it), and text
that could still become a stop string is held back until it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StopTextTracker:
    tokenizer: object
    stop: tuple[str, ...] = ()
    token_ids: list[int] = field(default_factory=list)
    released: int = 0  # characters of text already emitted
    text: str = ""
    stopped: bool = False

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the newly releasable text. Sets ``stopped`` at a stop string."""
        self.token_ids.extend(token_ids)
        full = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
        for stop in self.stop:
            at = full.find(stop, max(0, self.released - len(stop)))
            if at != -1:
                full = full[:at]
                self.stopped = True
        self.text = full
        safe = len(full)
        if not self.stopped:
            if full.endswith("\ufffd"):
                safe = len(full) - 1
            for stop in self.stop:
                for keep in range(min(len(stop) - 1, len(full)), 0, -1):
                    if stop.startswith(full[len(full) - keep:]):
                        safe = min(safe, len(full) - keep)
                        break
        safe = max(safe, self.released)
        delta = full[self.released:safe]
        self.released = safe
        return delta

    def finish(self) -> str:
        """The rest of the text once generation is over."""
        delta = self.text[self.released:]
        self.released = len(self.text)
        return delta
