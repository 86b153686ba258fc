"""Degenerate detection input, refused before any scoring (422 in the documented error shape;
the CLI prints the same message): a text with nothing to score, an empty token list, and token
ids outside the model's vocabulary, which no generation of it can have produced (scoring them
would give a verdict about tokens that cannot exist)."""

from __future__ import annotations

from collections.abc import Sequence


class DegenerateInput(ValueError):
    """The input cannot be scored; the message says what to send instead, ``code`` (the API
    error's) what was wrong: ``empty_input`` or ``token_out_of_vocabulary``."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def check_text(text: str) -> None:
    if not text.strip():
        raise DegenerateInput("text is empty" + (" (only whitespace)" if text else "") +
                              ": there is nothing to score; send the text to check", "empty_input")


def check_token_ids(token_ids: Sequence[int], vocab_size: int | None) -> None:
    """``vocab_size`` None or 0: unknown (only emptiness is checked)."""
    if len(token_ids) == 0:
        raise DegenerateInput("token_ids is empty: there is nothing to score; send the token ids to check",
                              "empty_input")
    # min and max run in C; the offending position is searched only when there is one.
    if vocab_size and (min(token_ids) < 0 or max(token_ids) >= vocab_size):
        for i, token in enumerate(token_ids):
            if not 0 <= token < vocab_size:
                raise DegenerateInput(f"token_ids[{i}] = {token} is outside the model's vocabulary "
                                      f"[0, {vocab_size}): no generation can contain it; send token ids "
                                      "of the model that generated the text", "token_out_of_vocabulary")


def check_detect_input(text: str | None, token_ids: Sequence[int] | None, vocab_size: int | None) -> None:
    """Whichever of ``text`` and ``token_ids`` is given."""
    if text is not None:
        check_text(text)
    if token_ids is not None:
        check_token_ids(token_ids, vocab_size)
