"""Sections of the fused sampler: the grid against the torch reference, headline targets,
sweeps of row splits and tile shapes, pruning and dense-only comparisons, temperature."""

from __future__ import annotations

import dataclasses

import torch

from bench.sampler_kernels.harness import (BANDWIDTH, REFERENCE_TIMED, Run, S, TARGETS, VLLM_0_32, eager_time_us,
                                           free, graph_time_us, make_logits, row_args, sets_for)


def bench_sampler_config(batch: int, dtype: torch.dtype, dist: str, mode: str, *, temperature: float = 1.0,
                         config=None, blocks_per_row=None, reference: bool = True, seed: int = 0,
                         bounded_config=None) -> dict:
    """``bounded_config``: time watermark.kernels.bounded.bounded_sample with it instead of
    gumbel_sample (same arguments, same reference)."""
    from tests.watermark.kernels import parity
    from watermark.kernels import bounded
    from watermark.kernels import gumbel as kernels

    gen = torch.Generator(device=S.device).manual_seed(seed)
    bytes_per_set = batch * S.vocab * torch.tensor([], dtype=dtype).element_size()
    n_sets = sets_for(bytes_per_set)
    logits_sets = [make_logits(batch, dist, dtype, gen) for _ in range(n_sets)]
    args = row_args(batch, mode, gen, temperature)
    extra = {} if config is None else {"config": config}
    if blocks_per_row is not None:
        extra["blocks_per_row"] = blocks_per_row

    def call_for(logits):
        if bounded_config is not None:
            return lambda: bounded.bounded_sample(logits, **args, config=bounded_config)
        return lambda: kernels.gumbel_sample(logits, **args, **extra)

    out = {"batch": batch, "dtype": str(dtype).replace("torch.", ""), "dist": dist, "mode": mode,
           "temperature": temperature, "input_sets": n_sets}
    got = call_for(logits_sets[0])()
    if reference:
        want = parity.reference_sample(logits_sets[0], args)
        out["bit_exact"] = bool(torch.equal(got.tokens, want.tokens) and torch.equal(got.routes, want.routes))
        if mode == "dual":
            out["rows_on_key_b"] = int((got.routes == 3).sum())
    out["us"] = graph_time_us([call_for(x) for x in logits_sets])
    out["eager_us"] = eager_time_us(call_for(logits_sets[-1]), rep_ms=60)
    out["read_floor_us"] = bytes_per_set / BANDWIDTH[0] * 1e6
    out["floor_fraction"] = out["read_floor_us"] / out["us"]
    if reference and batch in REFERENCE_TIMED:
        out["reference_us"] = eager_time_us(lambda: parity.reference_sample(logits_sets[0], args), rep_ms=100)
        out["speedup_vs_reference"] = out["reference_us"] / out["us"]
    del logits_sets
    free()
    return out


def section_sampler(run: Run, batches, dtypes, dists, modes, key: str, budget_each: float = 4.0) -> None:
    rows = run.results.setdefault(key, [])
    for batch in batches:
        for dtype in dtypes:
            for dist in dists:
                for mode in modes:
                    if run.left() < budget_each:
                        run.results["errors"].append({"section": key, "error": "budget: configurations skipped"})
                        return
                    try:
                        rows.append(bench_sampler_config(batch, dtype, dist, mode, seed=len(rows) + 1))
                    except Exception as error:  # noqa: BLE001
                        rows.append({"batch": batch, "dtype": str(dtype), "dist": dist, "mode": mode,
                                     "error": repr(error)})
                    run.save()


def headline(run: Run) -> None:
    found = {}
    for row in run.results.get("sampler", []):
        if row.get("dtype") != "float32" or "us" not in row:
            continue
        if row["batch"] == S.big:
            found[f"{'single' if row['mode'] == 'single' else 'dual'}_key_b256_{row['dist']}_us"] = row["us"]
        if row["batch"] == S.small and row["mode"] == "single" and row["dist"] == "normal":
            found["single_key_b1_us"] = row["us"]
    run.results.update({name: round(value, 2) for name, value in found.items()})
    run.results["targets"] = {name: {"target_us": target, "achieved_us": found.get(name),
                                     "met": None if name not in found else bool(found[name] <= target)}
                              for name, target in TARGETS.items()}
    run.results["vllm_0_32_reference"] = VLLM_0_32


def section_sweep(run: Run) -> None:
    from watermark.kernels.gumbel import DEFAULT_CONFIG

    b1 = run.results.setdefault("sweep_b1_fp32_normal_single", [])
    for nblk, block in ((16, 2048), (32, 2048), (64, 2048), (None, 1024), (None, 512)):
        if run.left() < 20:
            return
        config = dataclasses.replace(DEFAULT_CONFIG, block=block)
        row = bench_sampler_config(S.small, torch.float32, "normal", "single", blocks_per_row=nblk, config=config,
                                   reference=False)
        b1.append({"blocks_per_row": nblk or "default", "block": block, "us": row["us"]})
        run.save()
    sweep = run.results.setdefault("sweep_b256_fp32_normal_single", [])
    for nblk in (1, 2, 3, 4, 6, 8):
        if run.left() < 25:
            return
        row = bench_sampler_config(S.big, torch.float32, "normal", "single", blocks_per_row=nblk, reference=False)
        sweep.append({"blocks_per_row": nblk, "config": "default", "us": row["us"]})
        run.save()
    for block, warps, maxnreg in ((2048, 4, None), (2048, 8, None), (4096, 8, None), (1024, 4, 128)):
        if run.left() < 30:
            return
        config = dataclasses.replace(DEFAULT_CONFIG, block=block, num_warps=warps, maxnreg=maxnreg)
        name = f"block={block} warps={warps} maxnreg={maxnreg}"
        try:
            row = bench_sampler_config(S.big, torch.float32, "normal", "single", config=config, reference=False)
            sweep.append({"blocks_per_row": "default", "config": name, "us": row["us"]})
        except Exception as error:  # noqa: BLE001 - e.g. an option this Triton lacks
            sweep.append({"blocks_per_row": "default", "config": name, "error": repr(error)[:200]})
        run.save()


def section_compare_b256(run: Run) -> None:
    """--quick: B = 256 float32 single key, what compaction and the row split buy: compaction
    off (dense only), and 3 / 4 programs per row (the default is 2 on 132 SMs)."""
    from watermark.kernels.gumbel import DEFAULT_CONFIG

    dense = run.results.setdefault("dense_only_fp32_single", [])
    sweep = run.results.setdefault("sweep_b256_fp32_single_quick", [])
    for dist in ("zipf", "normal"):
        if run.left() < 10:
            return
        row = bench_sampler_config(S.big, torch.float32, dist, "single",
                                   config=dataclasses.replace(DEFAULT_CONFIG, compact=False), reference=True, seed=99)
        dense.append({"batch": S.big, "dist": dist, "compact": False, "us": row["us"], "bit_exact": row["bit_exact"]})
        run.save()
    for dist in ("zipf", "normal"):
        for nblk in (3, 4):
            if run.left() < 10:
                return
            row = bench_sampler_config(S.big, torch.float32, dist, "single", blocks_per_row=nblk, reference=True,
                                       seed=98)
            sweep.append({"dist": dist, "blocks_per_row": nblk, "compact": True, "us": row["us"],
                          "bit_exact": row["bit_exact"]})
            run.save()


PRUNING_CONFIGS = (  # (name, LaunchConfig changes, programs per row at B = 256 or None: the default split)
    ("default", {}, None),
    ("queue 2048/4w", {"compact": True}, None),
    ("dense 512/1w x8", {"block": 512, "num_warps": 1}, 8),
    ("queue 512/1w x8", {"block": 512, "num_warps": 1, "compact": True}, 8),
    ("queue 512/1w x16", {"block": 512, "num_warps": 1, "compact": True}, 16),
    ("queue 1024/2w x8", {"block": 1024, "num_warps": 2, "compact": True}, 8),
    ("queue 1024/4w x4", {"block": 1024, "num_warps": 4, "compact": True}, 4),
)


def section_pruning_sweep(run: Run) -> None:
    """B = 256 fp32 single key, Zipf(2) and N(0,1): the exact candidate queue with small
    programs (one or two warps: the live-token count and prefix sum stay inside a warp, no
    block barrier per tile) against the dense default, every row checked against the reference."""
    from watermark.kernels.gumbel import DEFAULT_CONFIG

    rows = run.results.setdefault("pruning_sweep_b256_fp32_single", [])
    for name, changes, nblk in PRUNING_CONFIGS:
        for dist in ("zipf", "normal"):
            if run.left() < 8:
                run.results["errors"].append({"section": "pruning_sweep", "error": "budget: configurations skipped"})
                return
            config = dataclasses.replace(DEFAULT_CONFIG, **changes)
            try:
                row = bench_sampler_config(S.big, torch.float32, dist, "single", config=config, blocks_per_row=nblk,
                                           reference=True, seed=41)
                rows.append({"config": name, "dist": dist, "us": row["us"], "bit_exact": row["bit_exact"],
                             "blocks_per_row": nblk or "default"})
            except Exception as error:  # noqa: BLE001
                rows.append({"config": name, "dist": dist, "error": repr(error)[:300]})
            run.save()


def section_dense(run: Run) -> None:
    """The same rows with compaction off (every tile raced densely): what compaction buys."""
    from watermark.kernels.gumbel import DEFAULT_CONFIG

    dense = run.results.setdefault("dense_only_fp32_single", [])
    for batch, dist in ((S.big, "zipf"), (S.big, "normal"), (S.small, "normal")):
        if run.left() < 15:
            return
        row = bench_sampler_config(batch, torch.float32, dist, "single",
                                   config=dataclasses.replace(DEFAULT_CONFIG, compact=False),
                                   reference=True, seed=99)
        dense.append({"batch": batch, "dist": dist, "compact": False, "us": row["us"], "bit_exact": row["bit_exact"]})
        run.save()


def section_temperature(run: Run) -> None:
    rows = run.results.setdefault("temperature_0p7", [])
    for dtype in (torch.float32, torch.bfloat16):
        rows.append(bench_sampler_config(S.big, dtype, "normal", "single", temperature=0.7, reference=True, seed=77))
        run.save()


def section_pruning(run: Run) -> None:
    """How much exact pruning can skip: per row, the winning exact score s*; tiles whose max
    logit + NOISE_MAX <= s* (what a tile skip can save at best) and tokens with
    logit + NOISE_MAX > s* (what per-token compaction would still have to race)."""
    from watermark import noise as gumbel_noise
    from watermark.prf import philox_torch
    from watermark.kernels import gumbel as kernels

    out = {}
    gen = torch.Generator(device=S.device).manual_seed(5)
    batch = S.big
    for dist in ("normal", "zipf"):
        logits = make_logits(batch, dist, torch.float32, gen)
        args = row_args(batch, "single", gen)
        tokens = kernels.gumbel_sample(logits, **args).tokens
        keys = args["key_a"]
        states = philox_torch.context_states_torch(keys, args["contexts"][:, :4].tolist())
        words = philox_torch.words_from_state_torch(keys, states, tokens.unsqueeze(-1))
        noise = gumbel_noise.noise_from_uniforms(philox_torch.uniforms_from_words_torch(words))[:, 0]
        best = logits.gather(1, tokens.unsqueeze(-1))[:, 0] + noise
        bound = logits + float(gumbel_noise.NOISE_MAX)
        live = bound > best.unsqueeze(-1)
        tiles = live[:, : (S.vocab // 2048) * 2048].reshape(batch, -1, 2048).any(-1)
        out[dist] = {"tokens_that_can_win_fraction": float(live.float().mean()),
                     "tiles_skippable_fraction_2048": float(1 - tiles.float().mean())}
        del logits
    run.results["pruning_potential"] = out


BOUNDED_CONFIGS = (  # (name, BoundedConfig changes)
    ("rows 32", {}),
    ("rows 16", {"rows_in_flight": 16}),
    ("rows 64", {"rows_in_flight": 64}),
    ("rows 32 block 1024", {"block": 1024}),
    ("rows 32 8 warps", {"num_warps": 8, "programs_per_sm": 2}),
    # ptxas (Triton 3.9, sm_90a): 128 registers with 400 B of spill stores under the cap, 238 without.
    ("rows 32 no cap", {"maxnreg": None, "programs_per_sm": 2}),
    ("rows 16 no cap", {"maxnreg": None, "programs_per_sm": 2, "rows_in_flight": 16}),
)


def section_bounded(run: Run) -> None:
    """The bounded sampler (row bound, two passes, persistent grid) at B = 256 fp32 against
    the dense gumbel_sample in this run, Zipf(2) and N(0,1), single and dual key; every
    configuration checked against the reference. Then B = 64 / 512 and bf16 at the default."""
    from watermark.kernels.bounded import DEFAULT_BOUNDED

    rows = run.results.setdefault("bounded_b256_fp32", [])
    for dist in ("zipf", "normal"):
        for mode in ("single", "dual"):
            if run.left() < 6:
                return
            row = bench_sampler_config(S.big, torch.float32, dist, mode, reference=True, seed=61)
            rows.append({"config": "dense gumbel_sample", "dist": dist, "mode": mode, "us": row["us"],
                         "bit_exact": row["bit_exact"]})
            run.save()
    for name, changes in BOUNDED_CONFIGS:
        for dist in ("zipf", "normal"):
            for mode in ("single", "dual"):
                if mode == "dual" and name != "rows 32":
                    continue
                if run.left() < 6:
                    run.results["errors"].append({"section": "bounded", "error": "budget: configurations skipped"})
                    return
                config = dataclasses.replace(DEFAULT_BOUNDED, **changes)
                try:
                    row = bench_sampler_config(S.big, torch.float32, dist, mode, reference=True, seed=61,
                                               bounded_config=config)
                    rows.append({"config": name, "dist": dist, "mode": mode, "us": row["us"],
                                 "bit_exact": row["bit_exact"]})
                except Exception as error:  # noqa: BLE001
                    rows.append({"config": name, "dist": dist, "mode": mode, "error": repr(error)[:300]})
                run.save()
    other = run.results.setdefault("bounded_other", [])
    for batch, dtype in ((64, torch.float32), (512, torch.float32), (S.big, torch.bfloat16)):
        for dist in ("zipf", "normal"):
            if run.left() < 6:
                return
            for kind in ("dense", "bounded"):
                row = bench_sampler_config(batch, dtype, dist, "single", reference=True, seed=62,
                                           bounded_config=DEFAULT_BOUNDED if kind == "bounded" else None)
                other.append({"kernel": kind, "batch": batch, "dtype": str(dtype), "dist": dist, "us": row["us"],
                              "bit_exact": row["bit_exact"]})
                run.save()
