"""Parity checks of the Triton kernels against the torch references, shared by the GPU
tests, the interpreter test (CPU) and the benchmark script.

Each ``check_*`` draws fresh random inputs from ``seed`` (callers pass a fresh seed every
run), runs kernel and reference on ``device`` and raises AssertionError, with the first
mismatching rows, unless token ids (and routes) are bit-identical.
"""

from __future__ import annotations

import dataclasses

import torch

from watermark import gumbel, results, sampler, speculative, stream
from watermark import noise as gumbel_noise
from watermark import prf
from watermark.prf import philox, philox_torch
from watermark.processing import ProcessingParams, process_logits

CONTEXT_SLOTS = 16
# Keys that exercise the high word: above 2^32, near 2^64 (as int64: -1, -2, ...) and 2^63.
EDGE_KEYS = [2**32 + 5, 2**64 - 1, 2**64 - 2, 2**63, 2**63 - 1, 0, 1, 2**32 - 1]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_keys(gen: torch.Generator, n: int) -> torch.Tensor:
    keys = torch.randint(-2**63, 2**63 - 1, (n,), generator=gen, dtype=torch.int64)
    edge = torch.rand(n, generator=gen) < 0.3
    picks = torch.randint(0, len(EDGE_KEYS), (n,), generator=gen).tolist()
    for i in edge.nonzero().flatten().tolist():
        keys[i] = prf.to_signed64(EDGE_KEYS[picks[i]])
    return keys


def seed_offset(gen: torch.Generator) -> int:
    return int(torch.randint(0, 1000, (1,), generator=gen))


def zipf_logits(gen: torch.Generator, batch: int, vocab: int) -> torch.Tensor:
    """Zipf(2) logits: -2 ln(rank) + 0.5 N(0, 1), ranks a random permutation per row (most
    tokens cannot win: the kernels' sparse path)."""
    ranks = torch.argsort(torch.rand(batch, vocab, generator=gen), dim=-1).to(torch.float32) + 1
    return -2.0 * torch.log(ranks) + 0.5 * torch.randn(batch, vocab, generator=gen)


def random_logits(gen: torch.Generator, batch: int, vocab: int, *, dtype: torch.dtype, specials: bool = True,
                  scale: float | None = None, dist: str = "normal") -> torch.Tensor:
    """float32 logits (N(0, scale^2) or Zipf(2)) with NaN, -inf (whole rows too), ties and a
    few +inf, then cast."""
    scale = scale if scale is not None else float(torch.empty(()).uniform_(0.5, 8.0, generator=gen))
    logits = torch.randn(batch, vocab, generator=gen) * scale if dist == "normal" else zipf_logits(gen, batch, vocab)
    if specials and batch >= 4:
        pick = lambda p: torch.rand(batch, vocab, generator=gen) < p  # noqa: E731
        logits[pick(0.01)] = float("nan")
        logits[pick(0.05)] = float("-inf")
        logits[0, :] = float("-inf")  # no finite logit: token 0
        logits[1, :] = float("nan")
        logits[1, vocab // 2] = 0.25  # the only defined logit
        logits[2, ::3] = logits[2, 0]  # exact ties
        if batch >= 6:
            logits[3, vocab - 1] = float("inf")
            logits[3, vocab // 3] = float("inf")
            logits[4] = torch.round(logits[4])  # many ties after scaling too
            logits[5, : vocab // 2] = float("-inf")
    return logits.to(dtype)


def non_contiguous(x: torch.Tensor, gen: torch.Generator, kind: str) -> torch.Tensor:
    """The same values as a view with another row stride ('pad'), a row offset ('offset'),
    or a column stride ('columns')."""
    batch, vocab = x.shape
    if kind == "pad":
        wide = torch.full((batch, vocab + 19), float("nan"), dtype=x.dtype, device=x.device)
        wide[:, :vocab] = x
        return wide[:, :vocab]
    if kind == "offset":
        wide = torch.full((batch, vocab + 7), float("nan"), dtype=x.dtype, device=x.device)
        wide[:, 5:5 + vocab] = x
        return wide[:, 5:5 + vocab]
    if kind == "columns":
        wide = torch.full((batch, 2 * vocab), float("nan"), dtype=x.dtype, device=x.device)
        wide[:, ::2] = x
        return wide[:, ::2]
    return x


def sampler_case(seed: int, batch: int, vocab: int, dtype: torch.dtype, device, *, layout: str = "contiguous",
                 dist: str = "normal"):
    """Random inputs of :func:`watermark.kernels.gumbel.gumbel_sample` (a dict) and the
    reference's SamplerRows: every context width 1..16, dual-key and skip rows, greedy rows,
    temperatures around 1, keys at the 2^32 / 2^64 edges, positions above 2^32."""
    gen = _gen(seed)
    logits = random_logits(gen, batch, vocab, dtype=dtype, dist=dist)
    temps = torch.tensor([1.0, 0.7, 1.3, 0.0, 2.5, 1e-3, 1.0, 0.9], dtype=torch.float32)
    temperature = temps[torch.randint(0, len(temps), (batch,), generator=gen)]
    key_a, key_b, stream_keys = (random_keys(gen, batch) for _ in range(3))
    dual = torch.rand(batch, generator=gen) < 0.5
    alpha = torch.where(dual, torch.rand(batch, generator=gen), torch.zeros(batch))
    alpha[torch.rand(batch, generator=gen) < 0.1] = 1.0
    widths = (torch.arange(batch) + seed_offset(gen)) % CONTEXT_SLOTS + 1
    widths = widths[torch.randperm(batch, generator=gen)].to(torch.int32)
    contexts = torch.randint(-1, 2**31 - 1, (batch, CONTEXT_SLOTS), generator=gen, dtype=torch.int64)
    contexts[torch.rand(batch, CONTEXT_SLOTS, generator=gen) < 0.1] = -1
    watermark = torch.rand(batch, generator=gen) < 0.75
    positions = torch.randint(0, 2**40, (batch,), generator=gen, dtype=torch.int64)
    positions[: batch // 2] %= 5000
    args = dict(temperature=temperature, key_a=key_a, key_b=key_b, alpha=alpha, contexts=contexts, widths=widths,
                watermark=watermark, stream_keys=stream_keys, positions=positions)
    args = {k: v.to(device) for k, v in args.items()}
    logits = logits.to(device)
    kernel_logits = non_contiguous(logits, gen, layout)
    return logits, kernel_logits, args


def reference_sample(logits: torch.Tensor, args: dict, lane: int = stream.LANE_SAMPLE) -> results.SampleResult:
    batch = logits.shape[0]
    widths = args["widths"].tolist()
    ctx = args["contexts"].tolist()
    rows = sampler.SamplerRows(
        key_a=args["key_a"], key_b=args["key_b"], alpha=args["alpha"],
        contexts=[ctx[b][: widths[b]] for b in range(batch)], watermark=args["watermark"],
        greedy=args["temperature"] == 0, stream_keys=args["stream_keys"], positions=args["positions"])
    params = ProcessingParams(temperature=args["temperature"], top_k=torch.zeros(batch, dtype=torch.int64),
                              top_p=torch.ones(batch))
    return sampler.sample_reference(process_logits(logits, params), rows, argmax=gumbel.gumbel_argmax_reference,
                                    lane=lane)


def _config(default, **changes):
    """``default`` with the non-None ``changes`` applied."""
    return dataclasses.replace(default, **{name: value for name, value in changes.items() if value is not None})


def assert_same(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    got = got.cpu()
    want = want.cpu().to(got.dtype)
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {tuple(got.shape)} != reference {tuple(want.shape)}")
    bad = (got != want).nonzero()
    if len(bad):
        rows = bad[:5].tolist()
        detail = ", ".join(f"{r}: {got[tuple(r)].item()} vs {want[tuple(r)].item()}" for r in rows)
        raise AssertionError(f"{name}: {len(bad)} mismatches (kernel vs reference) at {detail}")


def check_gumbel_sample(seed: int, batch: int, vocab: int, dtype: torch.dtype, device, *,
                        layout: str = "contiguous", blocks_per_row: int | None = None, dist: str = "normal",
                        compact: bool | None = None, block: int | None = None,
                        lane: int = stream.LANE_SAMPLE) -> None:
    """``compact`` / ``block`` None: the dispatchers' configuration (no variant beyond the registry's)."""
    from watermark.kernels import gumbel as kernels

    logits, kernel_logits, args = sampler_case(seed, batch, vocab, dtype, device, layout=layout, dist=dist)
    config = _config(kernels.DEFAULT_CONFIG, compact=compact, block=block)
    got = kernels.gumbel_sample(kernel_logits, **args, blocks_per_row=blocks_per_row, config=config, lane=lane)
    want = reference_sample(logits, args, lane=lane)
    assert_same(f"gumbel_sample tokens (seed {seed})", got.tokens, want.tokens)
    assert_same(f"gumbel_sample routes (seed {seed})", got.routes, want.routes)


def check_bounded_sample(seed: int, batch: int, vocab: int, dtype: torch.dtype, device, *, dist: str = "normal",
                         layout: str = "contiguous", block: int | None = None, rows_in_flight: int | None = None,
                         lane: int = stream.LANE_SAMPLE) -> None:
    """The bounded sampler (watermark.kernels.bounded) against the same reference as
    gumbel_sample; ``block`` / ``rows_in_flight`` None: its default configuration."""
    from watermark.kernels import bounded

    logits, kernel_logits, args = sampler_case(seed, batch, vocab, dtype, device, layout=layout, dist=dist)
    config = _config(bounded.DEFAULT_BOUNDED, block=block, rows_in_flight=rows_in_flight)
    want = reference_sample(logits, args, lane=lane)
    for attempt in range(2):  # a second launch: the row bounds were reset by the first
        got = bounded.bounded_sample(kernel_logits, **args, config=config, lane=lane)
        assert_same(f"bounded_sample tokens (seed {seed}, launch {attempt})", got.tokens, want.tokens)
        assert_same(f"bounded_sample routes (seed {seed}, launch {attempt})", got.routes, want.routes)


def check_seeded_sample(seed: int, batch: int, vocab: int, dtype: torch.dtype, device, *, dist: str = "normal",
                        layout: str = "contiguous", compact: bool = True, blocks_per_row: int | None = None,
                        block: int = 2048, lane: int = stream.LANE_SAMPLE) -> None:
    """The seeded two-launch sampler (watermark.kernels.bounded.seeded_sample) against the
    same reference as gumbel_sample."""
    from watermark.kernels import bounded

    logits, kernel_logits, args = sampler_case(seed, batch, vocab, dtype, device, layout=layout, dist=dist)
    want = reference_sample(logits, args, lane=lane)
    got = bounded.seeded_sample(kernel_logits, **args, compact=compact, blocks_per_row=blocks_per_row, block=block,
                                lane=lane)
    assert_same(f"seeded_sample tokens (seed {seed})", got.tokens, want.tokens)
    assert_same(f"seeded_sample routes (seed {seed})", got.routes, want.routes)


def race_case(seed: int, batch: int, vocab: int, dtype: torch.dtype, device, dist: str = "normal"):
    gen = _gen(seed)
    logits = random_logits(gen, batch, vocab, dtype=dtype, dist=dist)
    keys = random_keys(gen, batch)
    widths = [1 + (i + seed_offset(gen)) % CONTEXT_SLOTS for i in range(batch)]
    contexts = [torch.randint(-1, 2**31 - 1, (w,), generator=gen).tolist() for w in widths]
    states = philox_torch.context_states_torch(keys, contexts)
    return logits.to(device), keys.to(device), states.to(device)


def check_gumbel_argmax(seed: int, batch: int, vocab: int, dtype: torch.dtype, device, *,
                        layout: str = "contiguous", blocks_per_row: int | None = None, dist: str = "normal",
                        compact: bool | None = None) -> None:
    from watermark.kernels import gumbel as kernels

    logits, keys, states = race_case(seed, batch, vocab, dtype, device, dist=dist)
    view = non_contiguous(logits, _gen(seed + 1), layout)
    got = kernels.gumbel_argmax(view, keys, states, blocks_per_row=blocks_per_row,
                                config=_config(kernels.DEFAULT_CONFIG, compact=compact))
    assert_same(f"gumbel_argmax (seed {seed})", got, gumbel.gumbel_argmax_reference(logits, keys, states))


def random_weights(gen: torch.Generator, batch: int, vocab: int, dtype: torch.dtype) -> torch.Tensor:
    """Probability rows: dense softmax, sparse (top-k like), one-hot, all zero, tiny values."""
    logits = torch.randn(batch, vocab, generator=gen) * float(torch.empty(()).uniform_(0.5, 6.0, generator=gen))
    weights = torch.softmax(logits, -1)
    for b in range(batch):
        kind = b % 6
        if kind == 1:
            weights[b, torch.rand(vocab, generator=gen) < 0.9] = 0
        elif kind == 2:
            weights[b] = 0
            weights[b, int(torch.randint(0, vocab, (1,), generator=gen))] = 1
        elif kind == 3 and b >= 3:
            weights[b] = 0
        elif kind == 4:
            weights[b] *= 1e-30
    return weights.to(dtype)


def check_exponential_race(seed: int, batch: int, vocab: int, dtype: torch.dtype, device, *,
                           blocks_per_row: int | None = None) -> None:
    from watermark.kernels import gumbel as kernels

    gen = _gen(seed)
    _, keys, states = race_case(seed + 7, batch, 8, torch.float32, device)
    weights = random_weights(gen, batch, vocab, dtype).to(device)
    got = kernels.exponential_race(weights, keys, states, blocks_per_row=blocks_per_row)
    assert_same(f"exponential_race (seed {seed})", got, gumbel.exponential_race_reference(weights, keys, states))


def verify_case(seed: int, batch: int, k: int, vocab: int, dtype: torch.dtype, device):
    """Random inputs of the kernel's verify and the reference's VerifyRows. Row kinds cycle
    through: independent target/draft, draft == target (full acceptance), draft = 2 x target
    (rejections with an empty residual), sparse (top-k-like) rows, greedy rows whose drafts
    follow the target's argmax for a while."""
    gen = _gen(seed)
    scale = float(torch.empty(()).uniform_(0.5, 4.0, generator=gen))
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen) * scale, -1)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen) * scale, -1)
    greedy = torch.zeros(batch, dtype=torch.bool)
    kinds = (torch.arange(batch) + seed_offset(gen)) % 5
    for b in range(batch):
        kind = int(kinds[b])
        if kind == 1:
            q[b] = p[b, :k]
        elif kind == 2:
            q[b] = p[b, :k] * 2
        elif kind == 3:
            keep = torch.rand(vocab, generator=gen) < 0.05
            keep[0] = True
            p[b, :, ~keep] = 0
            q[b, :, ~keep] = 0
            p[b] /= p[b].sum(-1, keepdim=True)
            q[b] /= q[b].sum(-1, keepdim=True)
        elif kind == 4:
            greedy[b] = True
    # Drafts: sampled from q (plain multinomial: any token ids will do for verification).
    x = torch.stack([torch.multinomial(q[:, j], 1, generator=gen).squeeze(-1) for j in range(k)], -1) if k else \
        torch.zeros(batch, 0, dtype=torch.int64)
    target_argmax = p.argmax(-1)
    for b in greedy.nonzero().flatten().tolist():
        follow = int(torch.randint(0, k + 1, (1,), generator=gen))
        x[b, :follow] = target_argmax[b, :follow]
    widths = ((torch.arange(batch) + seed_offset(gen)) % CONTEXT_SLOTS + 1).to(torch.int32)
    contexts = torch.randint(-1, 2**31 - 1, (batch, k + 1, CONTEXT_SLOTS), generator=gen, dtype=torch.int64)
    args = dict(
        key_b=random_keys(gen, batch), key_coin=random_keys(gen, batch),
        keyed_coin=torch.rand(batch, generator=gen) < 0.5, contexts=contexts, widths=widths,
        watermark=torch.rand(batch, k + 1, generator=gen) < 0.8, greedy=greedy, stream_keys=random_keys(gen, batch),
        positions=torch.randint(0, 2**40, (batch,), generator=gen, dtype=torch.int64))
    args = {name: value.to(device) for name, value in args.items()}
    return p.to(dtype).to(device), q.to(dtype).to(device), x.to(device), args


def reference_verify(p, q, x, args) -> results.VerifyResult:
    batch, k = x.shape
    widths = args["widths"].tolist()
    ctx = args["contexts"].tolist()
    rows = speculative.VerifyRows(
        key_b=args["key_b"], key_coin=args["key_coin"], keyed_coin=args["keyed_coin"],
        contexts=[[ctx[b][j][: widths[b]] for j in range(k + 1)] for b in range(batch)],
        watermark=args["watermark"], greedy=args["greedy"], stream_keys=args["stream_keys"],
        positions=args["positions"])
    return speculative.verify_reference(p, q, x, rows, race=gumbel.exponential_race_reference)


def check_verify(seed: int, batch: int, k: int, vocab: int, dtype: torch.dtype, device, *,
                 blocks_per_row: int | None = None) -> dict:
    """Parity of the fused verification; returns counts of the row outcomes it covered."""
    from watermark.kernels import speculative as kernels

    p, q, x, args = verify_case(seed, batch, k, vocab, dtype, device)
    got = kernels.verify(p, q, x, **args, blocks_per_row=blocks_per_row)
    want = reference_verify(p, q, x, args)
    assert_same(f"verify tokens (seed {seed})", got.tokens, want.tokens)
    assert_same(f"verify num_accepted (seed {seed})", got.num_accepted, want.num_accepted)
    assert_same(f"verify routes (seed {seed})", got.routes, want.routes)
    accepted = want.num_accepted.cpu()
    greedy = args["greedy"].cpu()
    empty = 0
    for b in range(x.shape[0]):
        at = int(accepted[b])
        if at < k and not greedy[b]:
            residual = (p[b, at].float() - q[b, at].float()).clamp(min=0)
            empty += int(residual.sum().item() <= 0)
    return {"early_rejection": int((accepted < k).sum()), "full_acceptance": int((accepted == k).sum()),
            "empty_residual": empty, "greedy": int(greedy.sum())}


def dedup_reference():
    """watermark.dedup, importable without pydantic: it needs watermark.spec only for the
    DedupScope type alias, and the GPU image has no pydantic. Where pydantic is missing a
    stand-in module providing that alias is registered first (tests only)."""
    import importlib
    import sys
    import types

    try:
        return importlib.import_module("watermark.dedup")
    except ModuleNotFoundError as error:
        if error.name != "pydantic":
            raise
    stand_in = types.ModuleType("watermark.spec")
    stand_in.DedupScope = str
    stand_in.__doc__ = "stand-in for watermark.spec (no pydantic here): the DedupScope alias only"
    sys.modules["watermark.spec"] = stand_in
    sys.modules.pop("watermark.dedup", None)
    return importlib.import_module("watermark.dedup")


DEDUP_SEQUENCES = {
    "random": lambda gen, n: torch.randint(0, 50_000, (n,), generator=gen).tolist(),
    "binary": lambda gen, n: torch.randint(0, 2, (n,), generator=gen).tolist(),
    "loop": lambda gen, n: [1, 2, 3] * (n // 3) + [1] * (n % 3),
    "single_token": lambda gen, n: [7] * n,
    "nested": lambda gen, n: ((([1, 2] * 5 + [3]) * n)[: n // 2] + torch.randint(0, 4, (n - n // 2,), generator=gen).tolist()),
}


def check_dedup(seed: int, device, *, requests: int = 10, steps: int = 120, k: int = 3) -> None:
    """GpuDeduper against ContextDeduper: next-token and speculative-block decisions at every
    step of random and adversarially repetitive sequences, all scopes, bounded and
    unbounded windows, widths 1..16, prompts."""
    from watermark.kernels.dedup import GpuDeduper

    reference = dedup_reference()
    gen = _gen(seed)
    kinds = list(DEDUP_SEQUENCES)
    scopes = ["single_turn", "all", "none"]
    windows = [None, 1, 3, 8, 40]
    configs, sequences, refs = [], [], []
    for r in range(requests):
        width = [1, 2, 3, 4, 16, int(torch.randint(1, 17, (1,), generator=gen))][r % 6]
        scope = scopes[(r + seed) % 3] if r % 7 != 6 else "single_turn"
        window = windows[int(torch.randint(0, len(windows), (1,), generator=gen))]
        prompt = DEDUP_SEQUENCES[kinds[(r + 1) % len(kinds)]](gen, int(torch.randint(0, 12, (1,), generator=gen)))
        seq = DEDUP_SEQUENCES[kinds[(r + seed) % len(kinds)]](gen, steps + k)
        configs.append((width, scope, window, prompt))
        sequences.append(seq)
        refs.append(reference.ContextDeduper(width, scope, window, prompt=prompt))
    dedup = GpuDeduper(requests + 3, capacity=steps + 16, device=device)
    # Requests in scrambled slots, as a server would place them.
    slots = torch.randperm(requests + 3, generator=gen)[:requests]
    for r, (width, scope, window, prompt) in enumerate(configs):
        dedup.open(int(slots[r]), width=width, scope=scope, max_history=window, prompt=prompt)
    slots_dev = slots.to(device)
    for step in range(steps):
        drafts = torch.tensor([seq[step + 1: step + 1 + k] for seq in sequences], dtype=torch.int64)
        if step % 2:
            drafts[:, 1:] = torch.randint(0, 4, (requests, k - 1), generator=gen)
        got = dedup.repeated(slots_dev, drafts.to(device)).cpu()
        want = torch.tensor([ref.block_repeated(drafts[r].tolist()) for r, ref in enumerate(refs)])
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[:3].tolist()
            raise AssertionError(f"dedup block decisions differ at step {step} (seed {seed}): {bad}; "
                                 f"configs {[configs[b[0]][:3] for b in bad]}")
        nxt = dedup.repeated(slots_dev).cpu()[:, 0]
        want_next = torch.tensor([ref.next_repeated() for ref in refs])
        if not torch.equal(nxt, want_next):
            raise AssertionError(f"dedup next decisions differ at step {step} (seed {seed})")
        tokens = torch.tensor([seq[step] for seq in sequences], dtype=torch.int64)
        dedup.append(slots_dev, tokens.to(device))
        for ref, token in zip(refs, tokens.tolist()):
            ref.push(token)
    if int(dedup.overflow.sum()):
        raise AssertionError("dedup history overflowed its capacity")


def check_dedup_open_many(seed: int, device, *, requests: int = 9) -> None:
    """GpuDeduper.open_many against open one slot at a time (then each request's first
    tokens appended), on slots that held other requests before: every state tensor equal,
    every scope, bounded windows, widths 1..16, empty and long prompts."""
    from watermark.kernels.dedup import GpuDeduper

    gen = _gen(seed)
    kinds = list(DEDUP_SEQUENCES)
    scopes = ["single_turn", "all", "none"]
    one, many = (GpuDeduper(requests + 3, capacity=48, device=device) for _ in range(2))
    for dd in (one, many):  # slots in use before: open must reset what they held
        dd.open_many(list(range(requests + 3)), widths=[2] * (requests + 3), scopes=["all"] * (requests + 3),
                     max_histories=[None] * (requests + 3), prompts=[[5, 6, 7, 5, 6, 7]] * (requests + 3))
    slots = torch.randperm(requests + 3, generator=gen)[:requests].tolist()
    widths = [[1, 2, 3, 4, 16][r % 5] for r in range(requests)]
    scope = [scopes[(r + seed) % 3] for r in range(requests)]
    windows = [[None, 3, 8][r % 3] for r in range(requests)]
    prompts = [DEDUP_SEQUENCES[kinds[r % len(kinds)]](gen, [0, 1, 5, 20][r % 4]) for r in range(requests)]
    firsts = [DEDUP_SEQUENCES[kinds[(r + 1) % len(kinds)]](gen, r % 3) for r in range(requests)]
    for r, slot in enumerate(slots):
        one.open(slot, width=widths[r], scope=scope[r], max_history=windows[r], prompt=prompts[r])
        if firsts[r]:
            one.append(torch.tensor([slot], device=device), torch.tensor([firsts[r]], device=device))
    many.open_many(slots, widths=widths, scopes=scope, max_histories=windows, prompts=prompts)
    rows = [(slot, f) for slot, f in zip(slots, firsts) if f]
    widest = max(len(f) for _, f in rows)
    many.append(torch.tensor([s for s, _ in rows], device=device),
                torch.tensor([f + [0] * (widest - len(f)) for _, f in rows], device=device),
                torch.tensor([len(f) for _, f in rows], device=device))
    for name in ("history", "table", "length", "generated", "width", "scope", "max_history", "overflow"):
        if not torch.equal(getattr(one, name), getattr(many, name)):
            raise AssertionError(f"open_many differs from open in {name} (seed {seed})")


def check_dedup_step(seed: int, device, *, requests: int = 9, steps: int = 60) -> None:
    """GpuDeduper.step (commit, decide, read the context in one launch) against append +
    repeated + the history window on a second deduper, with rows that commit or not at
    each step, every scope, bounded windows and widths 1..16."""
    from watermark.kernels.dedup import PAD, GpuDeduper

    gen = _gen(seed)
    scopes = ["single_turn", "all", "none"]
    fused, plain = (GpuDeduper(requests + 2, capacity=steps + 4, device=device) for _ in range(2))
    slots = torch.randperm(requests + 2, generator=gen)[:requests]
    widths = []
    for r in range(requests):
        width = [1, 2, 3, 4, 16][r % 5]
        widths.append(width)
        for dd in (fused, plain):
            dd.open(int(slots[r]), width=width, scope=scopes[(r + seed) % 3], max_history=[None, 3, 8][r % 3],
                    prompt=[5, 6, 5][: r % 4])
    slots_dev = slots.to(device)
    pending = torch.zeros(requests + 2, dtype=torch.int64)
    for step in range(steps):
        commit = torch.rand(requests, generator=gen) < (0.8 if step else 0.0)
        contexts, marks, positions = fused.step(slots_dev, commit.to(torch.int8).to(device), pending.to(device))
        if commit.any():
            plain.append(slots_dev[commit.to(device)], pending[slots[commit]].to(device))
        want_marks = ~plain.repeated(slots_dev)[:, 0].cpu()
        length = plain.length.cpu()[slots]
        history = plain.history.cpu()[slots]
        for r in range(requests):
            w = widths[r]
            want = history[r, 16 + int(length[r]) - w: 16 + int(length[r])].tolist() + [PAD] * (16 - w)
            if contexts[r].cpu().tolist() != want:
                raise AssertionError(f"dedup step context differs at step {step}, row {r} (seed {seed})")
        if not torch.equal(marks.cpu(), want_marks):
            raise AssertionError(f"dedup step decisions differ at step {step} (seed {seed})")
        if not torch.equal(positions.cpu(), plain.generated.cpu()[slots].to(torch.int64)):
            raise AssertionError(f"dedup step positions differ at step {step} (seed {seed})")
        pending[slots] = torch.randint(0, 3, (requests,), generator=gen)  # repetitive: repeats happen
    if not torch.equal(fused.history.cpu(), plain.history.cpu()) or not torch.equal(fused.table.cpu(),
                                                                                    plain.table.cpu()):
        raise AssertionError(f"dedup step left another history or table (seed {seed})")



def check_prepared_sample(seed: int, batch: int, vocab: int, dtype: torch.dtype, device, *, calls: int = 4) -> bool:
    """PreparedSample (bound launch, rows bound by reference) against gumbel_sample on the
    same inputs, call after call: fresh logits each call (new tensors), the bound row
    tensors changed in place between calls, a row stride that changes once (re-binding),
    and the reference on the first call. Returns whether the launch was bound."""
    from watermark.kernels import gumbel as kernels

    logits, kernel_logits, args = sampler_case(seed, batch, vocab, dtype, device)
    prepared = kernels.PreparedSample(**args)
    want = reference_sample(logits, args)
    got = prepared(kernel_logits)
    assert_same(f"PreparedSample tokens (seed {seed})", got, want.tokens)
    assert_same(f"PreparedSample routes (seed {seed})", prepared.routes, want.routes)
    gen = _gen(seed + 1)
    for call in range(calls):
        fresh = random_logits(gen, batch, vocab, dtype=dtype).to(device)
        if call == calls - 1:  # another row stride: the handle is bound again
            wide = torch.full((batch, vocab + 16), float("nan"), dtype=dtype, device=device)
            wide[:, :vocab] = fresh
            fresh = wide[:, :vocab]
        args["positions"].add_(1)  # in place, as the deduper's step writes it
        args["watermark"].copy_(torch.rand(batch, generator=gen).to(device) < 0.5)
        got = prepared(fresh).clone()
        plain = kernels.gumbel_sample(fresh, **args)
        assert_same(f"PreparedSample call {call} tokens (seed {seed})", got, plain.tokens)
        assert_same(f"PreparedSample call {call} routes (seed {seed})", prepared.routes, plain.routes)
    return prepared._handle.bound and prepared._handle.fast_calls >= 1


def check_prepared_dedup_step(seed: int, device, *, requests: int = 9, steps: int = 40) -> bool:
    """GpuDeduper.prepare_step's bound handle (commit flags and pending tokens updated in
    place) against GpuDeduper.step on a second deduper. Returns whether it was bound."""
    from watermark.kernels.dedup import GpuDeduper

    gen = _gen(seed)
    scopes = ["single_turn", "all", "none"]
    bound, plain = (GpuDeduper(requests + 2, capacity=steps + 4, device=device) for _ in range(2))
    slots = torch.randperm(requests + 2, generator=gen)[:requests]
    for r in range(requests):
        for dd in (bound, plain):
            dd.open(int(slots[r]), width=[1, 2, 3, 4, 16][r % 5], scope=scopes[(r + seed) % 3],
                    max_history=[None, 3, 8][r % 3], prompt=[5, 6, 5][: r % 4])
    slots_dev = slots.to(device)
    commit_dev = torch.zeros(requests, dtype=torch.int8, device=device)
    pending_dev = torch.zeros(requests + 2, dtype=torch.int64, device=device)
    handle, contexts, marks, positions = bound.prepare_step(slots_dev, commit_dev, pending_dev)
    pending = torch.zeros(requests + 2, dtype=torch.int64)
    for step in range(steps):
        commit = (torch.rand(requests, generator=gen) < (0.8 if step else 0.0)).to(torch.int8)
        commit_dev.copy_(commit)
        pending_dev.copy_(pending)
        handle()
        want = plain.step(slots_dev, commit.to(device), pending.to(device))
        for name, got, expected in (("contexts", contexts, want[0]), ("watermark", marks, want[1]),
                                    ("positions", positions, want[2])):
            if not torch.equal(got.cpu(), expected.cpu()):
                raise AssertionError(f"prepared dedup step: {name} differ at step {step} (seed {seed})")
        pending[slots] = torch.randint(0, 3, (requests,), generator=gen)
    if not torch.equal(bound.history.cpu(), plain.history.cpu()) or not torch.equal(bound.table.cpu(),
                                                                                    plain.table.cpu()):
        raise AssertionError(f"prepared dedup step left another history or table (seed {seed})")
    return handle.bound and handle.fast_calls == steps

# (key, width-1 context, token) whose PRF uniform is the largest on the grid (mantissa
# 2^24 - 1): its noise is NOISE_MAX, so it can win from the full pruning distance below
# the best score. Found by a search over contexts with watermark.prf.words_numpy.
EDGE_KEY = 0x0123456789ABCDEF
EDGE_CASES = ((2050, 6711028), (4097, 12495425))


def pruning_edge_case(margin: float, device, dtype: torch.dtype = torch.float32):
    """Rows where the token of EDGE_CASES sits just above (margin > 0) or below (< 0) the
    score needed to win, NOISE_MAX below the best other token: the exact pruning bound's
    worst case. Returns logits [2, 5000], keys [2], states [2, 4] and the expected tokens."""
    vocab = 5000
    keys = torch.full((2,), prf.to_signed64(EDGE_KEY), dtype=torch.int64)
    states = philox_torch.context_states_torch(keys, [[ctx] for _, ctx in EDGE_CASES])
    tokens = torch.arange(vocab)
    noise = gumbel_noise.noise_from_uniforms(philox_torch.uniforms_from_words_torch(philox_torch.words_from_state_torch(keys, states,
                                                                                                 tokens)))
    logits = torch.full((2, vocab), float("-inf"))
    expected = []
    for row, (target, _) in enumerate(EDGE_CASES):
        assert noise[row, target].item() == gumbel_noise.NOISE_MAX
        others = torch.arange(0, 40, 3) + (0 if row == 0 else 2048)  # earlier tiles than the target
        logits[row, others] = 15.0
        scores = (logits[row, others] + noise[row, others]).to(torch.float64)
        best = float(scores.max())
        logits[row, target] = best - float(noise[row, target]) + margin
        expected.append(target if margin > 0 else int(others[int(scores.argmax())]))
    logits = logits.to(dtype)
    reference = gumbel.gumbel_argmax_reference(logits, keys, states)
    assert reference.tolist() == expected, (reference.tolist(), expected)
    return logits.to(device), keys.to(device), states.to(device), reference.to(device)


def bound_edge_case(margin: float, device, dtype: torch.dtype = torch.float32):
    """Rows for the row-bound pruning (watermark.pruning): one token o is the row's
    argmax (the bound token, exact score s_o) and the EDGE_CASES token, whose noise is
    NOISE_MAX, sits ``margin`` above (it wins) or below (o wins) s_o - NOISE_MAX.
    Returns logits [2, 5000], keys [2], states [2, 4] and the reference tokens."""
    vocab = 5000
    keys = torch.full((2,), prf.to_signed64(EDGE_KEY), dtype=torch.int64)
    states = philox_torch.context_states_torch(keys, [[ctx] for _, ctx in EDGE_CASES])
    tokens = torch.arange(vocab)
    noise = gumbel_noise.noise_from_uniforms(philox_torch.uniforms_from_words_torch(
        philox_torch.words_from_state_torch(keys, states, tokens)))
    logits = torch.full((2, vocab), float("-inf"))
    expected = []
    for row, (target, _) in enumerate(EDGE_CASES):
        other = 10 if row == 0 else 4500  # before and after the target
        logits[row, other] = 15.0
        best = 15.0 + float(noise[row, other])
        logits[row, target] = best - float(noise[row, target]) + margin
        logits[row, 7 * row + 1: 7 * row + 400: 7] = best - 17.0  # below the floor: pruned
        expected.append(target if margin > 0 else other)
    logits = logits.to(dtype)
    reference = gumbel.gumbel_argmax_reference(logits, keys, states)
    assert reference.tolist() == expected, (reference.tolist(), expected)
    return logits.to(device), keys.to(device), states.to(device), reference.to(device)


def check_pruning_edge(device, *, compact: bool | None = None) -> None:
    """A winner NOISE_MAX below the best other logit is found; one just short of it is not."""
    from watermark.kernels import gumbel as kernels

    for margin in (2e-3, -2e-3):
        logits, keys, states, reference = pruning_edge_case(margin, device)
        config = _config(kernels.DEFAULT_CONFIG, compact=compact)
        for blocks in (1, 2):
            got = kernels.gumbel_argmax(logits, keys, states, config=config, blocks_per_row=blocks)
            assert_same(f"pruning edge (margin {margin}, {blocks} blocks, compact {compact})", got, reference)


def check_bounded_edge(device, *, block: int | None = None, rows_in_flight: int | None = None,
                       seeded: bool = False) -> None:
    """The bounded sampler on :func:`bound_edge_case` rows (as single-key sampler rows of
    width-1 contexts): the winner NOISE_MAX below the bound token is found, 0.002 short is not."""
    from watermark.kernels import bounded

    config = _config(bounded.DEFAULT_BOUNDED, block=block, rows_in_flight=rows_in_flight)
    for margin in (2e-3, -2e-3):
        logits, keys, _, reference = bound_edge_case(margin, device)
        batch = logits.shape[0]
        args = dict(temperature=torch.ones(batch), key_a=keys.cpu(), key_b=keys.cpu(), alpha=torch.zeros(batch),
                    contexts=torch.tensor([[ctx] for _, ctx in EDGE_CASES]), widths=torch.ones(batch, dtype=torch.int32),
                    watermark=torch.ones(batch, dtype=torch.bool), stream_keys=keys.cpu(),
                    positions=torch.zeros(batch, dtype=torch.int64))
        args = {k: v.to(device) for k, v in args.items()}
        if seeded:  # the two-launch form: the bound token is the row's argmax
            for blocks in (1, 2):
                got = bounded.seeded_sample(logits, **args, blocks_per_row=blocks, block=config.block)
                assert_same(f"seeded edge (margin {margin}, {blocks} blocks)", got.tokens, reference)
            continue
        got = bounded.bounded_sample(logits, **args, config=config)
        assert_same(f"bounded edge (margin {margin})", got.tokens, reference)


def queue_order_case(seed: int, device, block: int, dtype: torch.dtype = torch.float32):
    """Rows that make the compaction queue race an earlier tile's tokens after a later dense
    tile, with exact score ties between them: the lower token must still win.

    Tile 0 is dense (nothing raced yet) at a level far below; tile 1 holds a few tokens at
    the top level, the rest far below (sparse: queued); tile 2 is all at the top level
    (dense, raced before the queue is drained); the rest is Zipf-like noise far below.
    Top level 2^30: float32 ulp 128 there, so l + g rounds to 2^30 for every noise value
    (all exact scores tie; the first index wins), or +inf (all scores +inf)."""
    gen = _gen(seed)
    vocab = 5 * block + 37
    rows = []
    for top in (2.0**30, float("inf"), 2.0**30, float("inf")):
        row = zipf_logits(gen, 1, vocab)[0] - 1000.0
        row[:block] = -500.0 + torch.randn(block, generator=gen)
        few = block + torch.randperm(block, generator=gen)[: int(torch.randint(1, 9, (1,), generator=gen))]
        row[few] = top
        row[2 * block: 3 * block] = top
        rows.append(row)
    logits = torch.stack(rows).to(dtype)
    batch = logits.shape[0]
    keys = random_keys(gen, batch)
    states = philox_torch.context_states_torch(keys, [[int(c)] for c in torch.randint(0, 2**31 - 1, (batch,),
                                                                              generator=gen)])
    reference = gumbel.gumbel_argmax_reference(logits, keys, states)
    first = [int((r == r.max()).nonzero()[0]) for r in logits.to(torch.float32)]
    assert reference.tolist() == first, (reference.tolist(), first)
    return logits.to(device), keys.to(device), states.to(device), reference.to(device)


def check_queue_order(seed: int, device, *, block: int = 2048) -> None:
    """Queued (earlier) tokens raced after a later dense tile keep the first index on ties."""
    from watermark.kernels import gumbel as kernels

    logits, keys, states, reference = queue_order_case(seed, device, block)
    config = dataclasses.replace(kernels.DEFAULT_CONFIG, block=block)
    for blocks in (1, 2):
        got = kernels.gumbel_argmax(logits, keys, states, config=config, blocks_per_row=blocks)
        assert_same(f"queue order (seed {seed}, block {block}, {blocks} blocks)", got, reference)
