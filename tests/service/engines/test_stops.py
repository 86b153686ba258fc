"""Incremental detokenisation (service/engines/stops.py): text made from windows of a
request's newest tokens is, joined, the whole output's decode, whatever the token boundaries
(random ids cut multi-byte characters anywhere) and however the tokens arrive; the local
engine's streamer makes its Deltas that way and ends with the whole decode."""

from __future__ import annotations

import random

import numpy as np
import pytest

from service.engines.base import Delta, Finished, GenerationRequest, RouteCounts
from service.engines.local.request import RequestState
from service.engines.local.streamer import Streamer
from service.engines.stops import StopTextTracker, decode_many, windowed_decoding
from service.model_paths import resolve_model_path


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path("bundled"))


def _decode(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("seed", range(6))
def test_windows_joined_are_the_whole_decode(tokenizer, seed):
    assert windowed_decoding(tokenizer)
    rng = random.Random(seed)
    size = len(tokenizer)
    tracker = StopTextTracker(tokenizer)
    released = []
    for _ in range(60):
        # Random ids (partial UTF-8 pieces included) or ids of real text, a few at a time.
        chunk = ([rng.randrange(size) for _ in range(rng.randint(1, 5))] if seed % 2 else
                 tokenizer.encode(rng.choice(["héllo wörld", " 日本語", " naïve café", "😀 ok", " x"]))[:rng.randint(1, 4)])
        tracker.token_ids.extend(chunk)
        prefix, new = decode_many(tokenizer, list(tracker.windows()))
        delta = tracker.release_window(prefix, new)
        released.append(delta)
        assert _decode(tokenizer, tracker.token_ids).startswith("".join(released))
    rest, agrees = tracker.finish_with(_decode(tokenizer, tracker.token_ids))
    assert agrees and "".join(released) + rest == _decode(tokenizer, tracker.token_ids) == tracker.text


def test_the_threaded_streamer_sends_the_whole_decode(tokenizer):
    """Deltas made from windows on the streamer's thread: joined, they are the decode of all
    the request's tokens, and so is its Finished's text."""
    events: list = []
    streamer = Streamer(threaded=True)
    state = RequestState(GenerationRequest("r", (5, 6), 200, seed=1), tokenizer, frozenset(), events.append,
                         streamer=streamer)
    rng = np.random.default_rng(3)
    sent: list[int] = []
    for _ in range(40):
        tokens = rng.integers(0, len(tokenizer), (1, 5))
        taken = np.array([int(rng.integers(1, 6))])
        sent.extend(tokens[0, :taken[0]].tolist())
        streamer.block([state], np.array([0]), tokens, taken, np.zeros((1, 4), dtype=np.int64))
    streamer.finish(state, Finished(text="", token_ids=tuple(sent), finish_reason="length", prompt_tokens=2,
                                    routes=RouteCounts()))
    assert streamer.wait(30)
    deltas = [e for e in events if isinstance(e, Delta)]
    assert isinstance(events[-1], Finished) and events[-1].text == _decode(tokenizer, sent)
    assert "".join(d.text for d in deltas) == events[-1].text
    assert sum((d.token_ids for d in deltas), ()) == tuple(sent)
