"""Per-row device state of the local engine's batch groups (service/engines/local/rows.py):
block contexts from the device table equal watermark.speculative.block_contexts, the GPU
deduper's block decisions equal each request's ContextDeduper, and a step's tokens reach
the client as one Delta per request with the text of one-by-one emission."""

from __future__ import annotations

import pytest
import torch

from service.engines.base import Delta, Finished, GenerationRequest, WatermarkPlan
from service.engines.local.request import RequestState
from service.engines.local.rows import DedupSlots, HostDedup, RowTable, right_aligned
from service.model_paths import resolve_model_path
from watermark import speculative
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

K = 4
SPECS = [None, dict(algorithm="gumbel", context_width=1), dict(algorithm="dual_key_gumbel", context_width=3),
         dict(algorithm="dual_key_gumbel", dedup="all", context_width=2),
         dict(algorithm="gumbel", dedup_max_history=3, context_width=2)]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_path("bundled"))


def _rows(tokenizer, histories, sink=lambda event: None):
    rows = []
    for i, (spec, history) in enumerate(zip(SPECS, histories)):
        plan = None
        if spec is not None:
            key = WatermarkKey(40 + i, WatermarkSpec(**spec))
            plan = WatermarkPlan(key=key, key_id=f"k{i}", version=1, fingerprint=key.fingerprint)
        state = RequestState(GenerationRequest(f"r{i}", (5, 6, 7, 5, 6), 100, seed=i, watermark=plan), tokenizer,
                             frozenset(), sink)
        state.rid = f"r{i}"
        for token in history:
            state.emit(token, 2)
        rows.append(state)
    return rows


def _histories(seed: int):
    g = torch.Generator().manual_seed(seed)
    # Small alphabets so that contexts repeat, inside the history and inside the block.
    return [torch.randint(5, 8, (int(n),), generator=g).tolist() for n in torch.randint(0, 12, (len(SPECS),), generator=g)]


def test_block_contexts_equal_the_speculative_reference(tokenizer):
    rows = _rows(tokenizer, _histories(1))
    table = RowTable.build(rows, torch.device("cpu"), K)
    drafts = torch.randint(5, 8, (len(rows), K), generator=torch.Generator().manual_seed(2))
    committed = torch.tensor([right_aligned(r.dedup.context, table.width) for r in rows])
    sequence = torch.cat([committed, drafts], dim=1)
    expected = [speculative.block_contexts(r.dedup.context, d) for r, d in zip(rows, drafts.tolist())]
    block = table.block_contexts(sequence)
    for b, row in enumerate(rows):
        width = row.dedup.width
        for j in range(K + 1):
            assert tuple(block[b, j, :width].tolist()) == expected[b][j]
            assert block[b, j, width:].eq(0).all()
            assert table.block_contexts(sequence, j)[b].tolist() == block[b, j].tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_gpu_dedup_decisions_equal_the_request_dedupers(tokenizer, seed):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (none found); runs on the H200")
    device = torch.device("cuda")
    histories = _histories(seed)
    rows = _rows(tokenizer, histories)
    slots = DedupSlots(8, 64, device)
    for row in rows:
        slots.open(row)
    gpu, host = slots.for_rows(rows), HostDedup(rows)
    g = torch.Generator().manual_seed(seed)
    for _ in range(4):  # blocks, each committed before the next
        drafts = torch.randint(5, 8, (len(rows), K), generator=g)
        for j in range(K):
            assert gpu.at(drafts.to(device), j).cpu().tolist() == host.at(drafts, j).tolist()
        assert gpu.block(drafts.to(device)).cpu().tolist() == host.block(drafts).tolist()
        counts = torch.randint(1, K + 2, (len(rows),), generator=g)
        gpu.commit(drafts.to(device).repeat(1, 2)[:, :K + 1], counts.to(device))
        for row, d, c in zip(rows, drafts.repeat(1, 2)[:, :K + 1].tolist(), counts.tolist()):
            row.emit_block(d[:c], [2] * c)


@pytest.mark.gpu
def test_gpu_dedup_resync_undoes_a_commit_the_requests_never_took(tokenizer):
    """A rolled-back step may have committed its block on the device (engine._restore):
    resync sets the histories back to what each request took, so that the retried step's
    commit is not a second copy, and the decisions equal the requests' dedupers again."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (none found); runs on the H200")
    device = torch.device("cuda")
    rows = _rows(tokenizer, _histories(6))
    slots = DedupSlots(8, 64, device)
    for row in rows:
        slots.open(row)
    gpu, host = slots.for_rows(rows), HostDedup(rows)
    g = torch.Generator().manual_seed(6)
    drafts = torch.randint(5, 8, (len(rows), K), generator=g)
    counts = torch.full((len(rows),), K + 1)
    tokens = drafts.repeat(1, 2)[:, :K + 1]
    length = slots.deduper.length.clone()
    gpu.commit(tokens.to(device), counts.to(device))  # the failed step's commit
    slots.resync(rows)
    assert torch.equal(slots.deduper.length, length)
    gpu.commit(tokens.to(device), counts.to(device))  # the retried step's
    for row, d in zip(rows, tokens.tolist()):
        row.emit_block(d, [2] * (K + 1))
    drafts = torch.randint(5, 8, (len(rows), K), generator=g)
    assert gpu.block(drafts.to(device)).cpu().tolist() == host.block(drafts).tolist()


def test_a_block_is_one_delta_with_the_one_by_one_text(tokenizer):
    tokens = tokenizer.encode(" the function returns a new list of items")
    blocked, single = [], []
    a = _rows(tokenizer, [[]] * len(SPECS), sink=blocked.append)[2]
    b = _rows(tokenizer, [[]] * len(SPECS), sink=single.append)[2]
    for start in range(0, len(tokens), 3):
        a.emit_block(tokens[start:start + 3], [2] * len(tokens[start:start + 3]))
        for token in tokens[start:start + 3]:
            b.emit(token, 2)
    deltas = [e for e in blocked if isinstance(e, Delta)]
    assert len(deltas) == -(-len(tokens) // 3)
    assert "".join(d.text for d in deltas) == "".join(e.text for e in single if isinstance(e, Delta))
    assert sum((d.token_ids for d in deltas), ()) == tuple(tokens) and a.output == b.output
    assert a.dedup.context == b.dedup.context and a.routes() == b.routes()


def test_a_block_stops_at_eos_and_at_max_tokens(tokenizer):
    events = []
    row = _rows(tokenizer, [[]] * len(SPECS), sink=events.append)[0]
    row.eos_ids = frozenset({9})
    assert not row.emit_block([11, 12], [1, 1])
    assert row.emit_block([13, 9, 14], [1, 1, 1])
    assert row.output == [11, 12, 13]
    assert isinstance(events[-1], Finished) and events[-1].finish_reason == "stop"
    events.clear()
    row = _rows(tokenizer, [[]] * len(SPECS), sink=events.append)[0]
    row.request = GenerationRequest("r", (5,), 3, seed=0)
    assert row.emit_block([11, 12, 13, 14], [1, 1, 1, 1])
    assert row.output == [11, 12, 13] and events[-1].finish_reason == "length"
