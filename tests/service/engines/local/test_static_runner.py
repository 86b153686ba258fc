"""The engine over static KV caches (service/engines/local/static_runner.py): on the CPU
(eager; CUDA graphs only on CUDA) it gives the same texts as the dynamic-cache engine, and
a request's text does not depend on its batch. The GPU test replays CUDA graphs."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from service.engines.base import Delta, Finished, GenerationRequest, WatermarkPlan
from service.engines.local.engine import LocalEngine
from tests.service.engine_models import TEST_DRAFT, TEST_MODEL
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec


def _requests(tok, tokens=24):
    prompts = ["The function returns", "Return a new list of the items in the sequence. " * 8, "This module"]
    out = []
    for i in range(5):
        key = WatermarkKey(300 + i, WatermarkSpec(algorithm=("gumbel", "dual_key_gumbel")[i % 2]))
        plan = WatermarkPlan(key=key, key_id=f"k{i}", version=1, fingerprint=key.fingerprint) if i < 4 else None
        out.append(GenerationRequest(f"r{i}", tuple(tok.encode(prompts[i % 3])), tokens, seed=i, watermark=plan))
    return out


def _run(engine, requests):
    async def go():
        async def one(r):
            async for event in engine.generate(r):
                if isinstance(event, Finished):
                    return event.token_ids
        return await asyncio.gather(*(one(r) for r in requests))
    return asyncio.run_coroutine_threadsafe(go(), engine._test_loop).result()  # noqa: SLF001


def _engine(device, **kwargs):
    import threading

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    engine = LocalEngine(TEST_MODEL, TEST_DRAFT, device=device, max_batch=8, speculative_k=3, **kwargs)
    asyncio.run_coroutine_threadsafe(engine.start(), loop).result()
    engine._test_loop = loop  # noqa: SLF001
    return engine


def _stop(engine):
    asyncio.run_coroutine_threadsafe(engine.stop(), engine._test_loop).result()  # noqa: SLF001
    engine._test_loop.call_soon_threadsafe(engine._test_loop.stop)  # noqa: SLF001


@pytest.mark.slow
def test_static_cache_engine_matches_dynamic_and_is_batch_independent():
    dynamic = _engine("cpu", static_cache=False)
    static = _engine("cpu", static_cache=True)
    try:
        requests = _requests(static.tokenizer())
        batched = _run(static, requests)
        assert batched == _run(dynamic, requests)
        for request, tokens in zip(requests, batched):
            assert _run(static, [request]) == [tokens]
        assert static.telemetry.forward_counts()["speculative_target"][1] > 0  # eager on the CPU
    finally:
        _stop(dynamic)
        _stop(static)


@pytest.mark.gpu
def test_cuda_graph_engine_is_batch_independent_and_replays():
    engine = _engine("cuda")
    try:
        requests = _requests(engine.tokenizer())
        batched = _run(engine, requests)
        alone = [_run(engine, [r])[0] for r in requests]
        counts = engine.telemetry.forward_counts()
        assert counts["speculative_target"][0] > 0 and counts["plain"][0] > 0  # graph replays
        assert batched == alone
    finally:
        _stop(engine)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bundled", "hallmark-tiny-draft"])
@torch.inference_mode()
def test_static_group_follows_the_dynamic_group_across_windows_and_rejections(name):
    """Rows near the first column window's edge (128) cross it while decoding, with drafts
    rejected on the way; logits stay those of transformers' dynamic-cache group
    (float32, 1e-4 abs + rel, the model test's tolerance)."""
    from service.engines.local.runner import Group, load_model
    from service.engines.local.static_runner import StaticGroup
    from service.model_paths import resolve_model_path

    device = torch.device("cpu")
    model = load_model(resolve_model_path(name), device)
    static = StaticGroup(model, device, slots=2, context=300, graphs=False)
    dynamic = Group(model, device)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 8000, (n,), generator=g).tolist() for n in (118, 40)]
    for i, prompt in enumerate(prompts):
        for group in (static, dynamic):
            cache, mask, logits = group.prefill(prompt)
            group.join(f"r{i}", cache, mask, len(prompt))
    for step in range(6):
        inputs = torch.randint(3, 8000, (2, 3), generator=g)
        torch.testing.assert_close(static.forward(inputs), dynamic.forward(inputs), atol=1e-4, rtol=1e-4)
        counts = torch.tensor([step % 3, (step + 1) % 3])  # reject 0-2 of the 3 inputs per row
        static.reject_tail(counts)
        dynamic.reject_tail(counts)
    assert max(static.lengths) + 3 + 1 > 128  # crossed into the 256-column window


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bundled", "hallmark-tiny-draft"])
@torch.inference_mode()
def test_padded_prefill_equals_the_unpadded_one(name):
    """The padded prefill (what the prefill CUDA graphs replay) gives the unpadded prefill's
    last logits and cache: the next decode steps' logits agree (float32, 1e-4), whichever
    slot the prompt lands in."""
    from service.engines.local.runner import load_model
    from service.engines.local.static_runner import StaticGroup
    from service.model_paths import resolve_model_path

    device = torch.device("cpu")
    model = load_model(resolve_model_path(name), device)
    padded = StaticGroup(model, device, slots=3, context=300, graphs=False)
    plain = StaticGroup(model, device, slots=3, context=300, graphs=False)
    g = torch.Generator().manual_seed(2)
    for i, n in enumerate((5, 16, 40)):  # below, at and between prefill lengths
        prompt = torch.randint(3, 8000, (n,), generator=g).tolist()
        slot, valid, logits = padded.prefill(prompt, padded=True)
        slot_p, valid_p, logits_p = plain.prefill(prompt, padded=False)
        assert slot == slot_p == i and torch.equal(valid, valid_p)
        torch.testing.assert_close(logits, logits_p, atol=1e-4, rtol=1e-4)
        padded.join(f"r{i}", slot, valid, n)
        plain.join(f"r{i}", slot_p, valid_p, n)
    assert padded.eager_forwards == 3
    for _ in range(2):
        inputs = torch.randint(3, 8000, (3, 2), generator=g)
        torch.testing.assert_close(padded.forward(inputs), plain.forward(inputs), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_speculative_blocks_give_the_scheduler_step_tokens():
    """The speculative block as one fixed-shape function (spec_block.py, what the CUDA
    graphs replay), run eagerly on the CPU, gives scheduler.speculative_step's texts, and a
    request's text does not depend on its batch."""
    blocks = _engine("cpu", static_cache=True, speculative_blocks=True)
    steps = _engine("cpu", static_cache=True, speculative_blocks=False)
    try:
        assert blocks._blocks is not None and steps._blocks is None  # noqa: SLF001
        blocks._streamer.threaded = True  # noqa: SLF001 - as on CUDA: text made on the streamer thread
        requests = _requests(blocks.tokenizer(), tokens=40)
        requests[3] = dataclasses.replace(requests[3], top_k=50)  # top-k: the eager fallback's filters
        batched = _run(blocks, requests)
        assert batched == _run(steps, requests)
        assert blocks._blocks.counts.eager_blocks > 0  # noqa: SLF001
        for request, tokens in zip(requests, batched):
            assert _run(blocks, [request]) == [tokens]
        # Deferred text: the Deltas still add up to the Finished text and tokens, in order.
        for events in _events(blocks, requests):
            finished = events[-1]
            assert isinstance(finished, Finished) and all(isinstance(e, Delta) for e in events[:-1])
            assert "".join(e.text for e in events[:-1]) == finished.text
            assert sum((e.token_ids for e in events[:-1]), ()) == finished.token_ids
    finally:
        _stop(blocks)
        _stop(steps)


def _events(engine, requests):
    async def go():
        async def one(r):
            return [event async for event in engine.generate(r)]
        return await asyncio.gather(*(one(r) for r in requests))
    return asyncio.run_coroutine_threadsafe(go(), engine._test_loop).result()  # noqa: SLF001


@pytest.mark.gpu
def test_speculative_block_graphs_replay_and_are_batch_independent():
    """On CUDA, speculative blocks are graph replays (none eager after the load's warm-up,
    except batches holding a top-k row, which run the same function eagerly), and each
    request's text is the same in the batch and alone, through either path."""
    engine = _engine("cuda")
    try:
        blocks = engine._blocks  # noqa: SLF001
        assert blocks is not None and blocks.counts.captures > 0
        requests = _requests(engine.tokenizer(), tokens=40)
        eager_before = blocks.counts.eager_blocks
        batched = _run(engine, requests)
        assert blocks.counts.graph_replays > 0 and blocks.counts.eager_blocks == eager_before
        assert batched == [_run(engine, [r])[0] for r in requests]
        assert blocks.pipeline  # blocks were chained one ahead of the host; without: the same texts
        blocks.pipeline = False
        assert _run(engine, requests) == batched
        blocks.pipeline = True
        requests[3] = dataclasses.replace(requests[3], top_k=50)
        batched = _run(engine, requests)
        assert blocks.counts.eager_blocks > eager_before
        assert batched == [_run(engine, [r])[0] for r in requests]
    finally:
        _stop(engine)


@pytest.mark.gpu
def test_long_outputs_are_batch_independent_in_bf16():
    """Long outputs (600 tokens: the batch's column window passes 128, 256, 512 and 1,024
    while they run) are the same alone and beside other requests, one of them with a
    400-token prompt: dual key (speculative blocks) and single key (plain steps), in bf16."""
    engine = _engine("cuda")
    try:
        engine.eos_ids = frozenset()  # every request runs its max_tokens
        tok = engine.tokenizer()
        long = []
        for i, algorithm in enumerate(("dual_key_gumbel", "gumbel")):
            key = WatermarkKey(900 + i, WatermarkSpec(algorithm=algorithm))
            plan = WatermarkPlan(key=key, key_id=f"long{i}", version=1, fingerprint=key.fingerprint)
            long.append(GenerationRequest(f"long{i}", tuple(tok.encode("This module provides")), 600, seed=i,
                                          watermark=plan))
        prompt = tuple(tok.encode("The function returns a list. " * 80))[:400]
        others = [GenerationRequest("long-prompt", prompt, 500, seed=7)] + _requests(tok, tokens=300)[:4]
        alone = [_run(engine, [r])[0] for r in long]
        together = _run(engine, long + others)[:2]
        for request, a, b in zip(long, alone, together):
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            assert len(a) == 600 and a == b, f"{request.request_id}: first difference at token {first}"
    finally:
        _stop(engine)


@pytest.mark.slow
def test_a_block_writes_the_next_blocks_inputs():
    """What a block writes into its step buffer for the next block (spec_block.block's last
    lines, which chained launches on CUDA run from) is exactly what the host packs from
    the tokens it took (SpeculativeBlocks._pack, from the OutputTable's arrays), and both
    are what each request's own state says (its length, last token, dedup context and the
    draft's pending inputs): checked before every packed block whose rows are the last
    block's."""
    from service.engines.local.rows import right_aligned
    from service.engines.local.block import CONTEXT

    engine = _engine("cpu", static_cache=True, speculative_blocks=True)
    blocks = engine._blocks  # noqa: SLF001
    out = engine._outputs  # noqa: SLF001
    original, seen, checked = blocks._launch_packed, {}, []  # noqa: SLF001

    def spy(rows, table, dedup, bufs, *args):
        ids = tuple(r.rid for r in rows)
        expected = []
        for r in rows:
            pending = out.pending[r.row, :out.pending_count[r.row]].tolist()
            expected.append([r.length, r.last_token] + right_aligned(r.dedup.context, CONTEXT)
                            + [0] * (2 - len(pending)) + pending + [0] * (2 - len(pending)) + [1] * len(pending))
        packed, fed = blocks._pack(table, len(rows))  # noqa: SLF001
        assert packed.tolist() == expected and fed == max(out.pending_count[table.out_rows])
        if seen.get(id(bufs)) == ids and bufs.table is table:
            assert bufs.step[:len(rows)].tolist() == expected
            checked.append(len(rows))
        original(rows, table, dedup, bufs, *args)
        seen[id(bufs)] = ids

    blocks._launch_packed = spy  # noqa: SLF001
    try:
        requests = _requests(engine.tokenizer(), tokens=40)
        _run(engine, requests)
        assert len(checked) > 10 and max(checked) > 1
    finally:
        _stop(engine)


@pytest.mark.slow
@torch.inference_mode()
def test_batched_prefills_fill_slots_in_order_with_each_prompts_logits():
    """prefill_all with batching on (as a CUDA group whose load-time check passed): prompts
    go to the next free slots in order, in chunks of at most PREFILL_TOKENS padded tokens
    (long prompts one by one between them), each with its own prefill's valid columns and
    last logits (float32 on the CPU: to 1e-4; bit for bit is what the CUDA check demands)."""
    from service.engines.local.runner import load_model
    from service.engines.local.static_runner import PREFILL_TOKENS, StaticGroup, prefill_all
    from service.model_paths import resolve_model_path

    device = torch.device("cpu")
    model = load_model(resolve_model_path("hallmark-tiny-draft"), device)
    batched = StaticGroup(model, device, slots=100, context=700, graphs=False)
    single = StaticGroup(model, device, slots=100, context=700, graphs=False)
    batched.batched_prefill = True
    g = torch.Generator().manual_seed(3)
    lengths = [16] * 85 + [600] + [3, 20, 7]  # 85 x 16 > PREFILL_TOKENS: two chunks, then a long one alone
    prompts = [torch.randint(3, 8000, (n,), generator=g).tolist() for n in lengths]
    calls = []
    original = batched.prefill_many
    batched.prefill_many = lambda chunk, ahead=0: calls.append((len(chunk), ahead)) or original(chunk, ahead)
    out = prefill_all(batched, prompts)
    assert [slot for slot, _, _ in out] == list(range(len(prompts)))
    assert all(n * 16 <= PREFILL_TOKENS for n, _ in calls) and sum(n for n, _ in calls) == len(prompts) - 1
    for i, ((slot, valid, logits), prompt) in enumerate(zip(out, prompts)):
        slot_s, valid_s, logits_s = single.prefill(prompt, ahead=i)
        assert slot == slot_s and torch.equal(valid, valid_s), i
        torch.testing.assert_close(logits, logits_s, atol=1e-4, rtol=1e-4)
