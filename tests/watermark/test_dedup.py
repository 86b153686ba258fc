"""Hashed context deduplication makes exactly the decisions of a scan of the history."""

import random
import zlib

import numpy as np
import pytest

from watermark.dedup import ContextDeduper, context_matrix, first_occurrence_mask, repeated_by_scan


def _scan_decisions(prompt, generated, width, scope, max_history):
    history = (list(prompt) if scope == "all" else [])
    decisions = []
    for i, token in enumerate(generated):
        own = ([-1] * width + list(generated[:i]))[-width:]
        if scope == "none":
            decisions.append(False)
        elif scope == "all" and i < width:
            decisions.append(True)
        else:
            decisions.append(repeated_by_scan(history, own, width, max_history))
        history.append(token)
    return decisions


def _hashed_decisions(prompt, generated, width, scope, max_history):
    dedup = ContextDeduper(width, scope, max_history, prompt=prompt)
    decisions = []
    for token in generated:
        decisions.append(dedup.next_repeated())
        dedup.push(token)
    return decisions


SEQUENCES = {
    "random": lambda rng: [rng.randrange(50) for _ in range(400)],
    "loop": lambda rng: [1, 2, 3] * 100,
    "single_token": lambda rng: [7] * 300,
    "nested_loops": lambda rng: ([1, 2] * 5 + [3]) * 30 + [rng.randrange(4) for _ in range(100)],
    "drifting": lambda rng: [i // 7 % 5 for i in range(500)],
}


@pytest.mark.parametrize("name", sorted(SEQUENCES))
@pytest.mark.parametrize("scope", ["none", "single_turn", "all"])
@pytest.mark.parametrize("width", [1, 2, 4, 7])
@pytest.mark.parametrize("max_history", [None, 1, 5, 64])
def test_hashed_equals_scan(name, scope, width, max_history):
    rng = random.Random(zlib.crc32(f"{name}/{scope}/{width}/{max_history}".encode()))  # fixed per case
    generated = SEQUENCES[name](rng)
    prompt = [rng.randrange(50) for _ in range(30)] + generated[:10]
    assert _hashed_decisions(prompt, generated, width, scope, max_history) == \
        _scan_decisions(prompt, generated, width, scope, max_history)


@pytest.mark.parametrize("scope", ["single_turn", "all"])
@pytest.mark.parametrize("max_history", [None, 3, 50])
def test_block_decisions_equal_sequential_decisions(scope, max_history):
    rng = random.Random(3)
    for _ in range(60):
        history = [rng.randrange(4) for _ in range(rng.randrange(0, 40))]
        drafts = [rng.randrange(4) for _ in range(rng.randrange(0, 6))]
        prompt = [rng.randrange(4) for _ in range(5)]
        block = ContextDeduper(3, scope, max_history, prompt=prompt)
        block.extend(history)
        got = block.block_repeated(drafts)
        seq = ContextDeduper(3, scope, max_history, prompt=prompt)
        seq.extend(history)
        expected = []
        for token in drafts + [None]:
            expected.append(seq.next_repeated())
            if token is not None:
                seq.push(token)
        assert got == expected


def test_memory_stays_bounded_with_a_window():
    dedup = ContextDeduper(2, "single_turn", 100, prompt=())
    rng = random.Random(0)
    for _ in range(20_000):
        dedup.next_repeated()
        dedup.push(rng.randrange(10_000))
    assert len(dedup._last_seen) <= 101


def test_context_is_last_generated_tokens():
    dedup = ContextDeduper(3, "all", None, prompt=[9, 9, 9])
    assert dedup.context == (-1, -1, -1)
    dedup.extend([1, 2])
    assert dedup.context == (-1, 1, 2)


def test_detector_mask_equals_a_set_scan():
    rng = np.random.default_rng(1)
    for width in (1, 3, 4, 9):
        for tokens in (rng.integers(0, 6, 500), np.array([4, 4, 4, 5] * 50), rng.integers(0, 10**6, 300)):
            seen, expected = set(), []
            for row in map(tuple, context_matrix(tokens, width).tolist()):
                expected.append(row not in seen)
                seen.add(row)
            assert first_occurrence_mask(tokens, width).tolist() == expected
            padded = first_occurrence_mask(tokens, width, skip_padded=True)
            assert not padded[:width].any()
