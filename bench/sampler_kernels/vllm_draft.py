"""vLLM 0.34 beside ours, the parts 0.34 added: the fused multi-step draft sampler
(``draft_philox_gumbel_sample``, temperature divided inside the kernel with ``div_rn``) and the
target sampler at a temperature other than 1 (vLLM divides before its kernel, ours inside;
both IEEE round-to-nearest), plus the 256-bit sampler's cost beside Philox's.

Draft sampler: R requests x S steps under one key (a dual-key request drafts under key A),
every request watermarked (contexts >= 0, temperature > 0, no dedup). vLLM samples the S
steps in its own loop, shifting each request's context by the token it drew; ours runs
``gumbel_sample`` step by step with the same contexts, key, temperature and
``lane=LANE_DRAFT``. Unwatermarked draft rows are not compared: vLLM 0.34 mixes the step into
the request's seed (``spec_step_seed``) for its ordinary stream, which Hallmark's stream
(:mod:`watermark.stream`) does not reproduce and no detector reads.
"""

from __future__ import annotations

from pathlib import Path

import torch

from bench.sampler_kernels.harness import Run, S, free, graph_time_us, make_logits, sets_for
from bench.sampler_kernels.vllm_side import load_vllm


def _ours_draft(logits: torch.Tensor, contexts: torch.Tensor, key: int, temperature: torch.Tensor, steps: int):
    from watermark import prf, stream
    from watermark.kernels import gumbel as kernels

    reqs = contexts.shape[0]
    width = contexts.shape[1]
    ctx = contexts.clone()
    out = torch.empty(reqs, steps, dtype=torch.int64, device=logits.device)
    signed = prf.to_signed64(key)
    for step in range(steps):
        result = kernels.gumbel_sample(
            logits[:, step], temperature=temperature, key_a=torch.full((reqs,), signed, device=logits.device),
            key_b=torch.full((reqs,), signed, device=logits.device), alpha=torch.zeros(reqs, device=logits.device),
            contexts=ctx, widths=torch.full((reqs,), width, dtype=torch.int32, device=logits.device),
            watermark=torch.ones(reqs, dtype=torch.bool, device=logits.device),
            stream_keys=torch.arange(reqs, device=logits.device),
            positions=torch.full((reqs,), step, device=logits.device), lane=stream.LANE_DRAFT)
        out[:, step] = result.tokens
        ctx = torch.cat([ctx[:, 1:], result.tokens.unsqueeze(1)], dim=1)
    return out


def _theirs_draft(module, logits: torch.Tensor, contexts: torch.Tensor, key: int, temperature: torch.Tensor,
                  steps: int):
    reqs, _, vocab = logits.shape
    device = logits.device
    ctx = contexts.clone()  # the sampler shifts it in place
    sampled = module.draft_philox_gumbel_sample(
        logits.reshape(reqs * steps, vocab), ctx, key, num_steps=steps,
        expanded_idx_mapping=torch.arange(reqs, device=device).repeat_interleave(steps).to(torch.int32),
        temperatures=temperature, seeds=torch.arange(reqs, device=device, dtype=torch.int64),
        positions=torch.arange(steps, device=device).repeat(reqs).to(torch.int64),
        enabled=torch.ones(reqs, dtype=torch.bool, device=device),
        logits_cache=torch.empty(reqs, steps, vocab, dtype=logits.dtype, device=device),
        logits_cache_col=torch.arange(steps, device=device).repeat(reqs).to(torch.int64), use_fp64=False,
        prior_contexts=torch.zeros(reqs, steps, contexts.shape[1], dtype=torch.int64, device=device),
        all_token_ids=None, prompt_lens=torch.zeros(reqs, dtype=torch.int32, device=device), total_lens=None,
        deduplicate=False, max_history=None, include_prompt=False)
    return sampled.view(reqs, steps)


def section_vllm_draft(run: Run, dest: Path) -> None:
    module = load_vllm(dest)
    out = run.results.setdefault("vllm_0_34", {"source": str(dest)})
    if not hasattr(module, "draft_philox_gumbel_sample"):
        out["draft_sampler"] = "not in this vLLM (0.34 added it)"
        return
    rows = out.setdefault("draft_sampler", [])
    grid = ((2, 2, 4),) if S.smoke else ((1, 4, 4), (16, 4, 4), (64, 4, 1), (64, 3, 16))
    for reqs, steps, width in grid:
        gen = torch.Generator(device=S.device).manual_seed(2000 + reqs)
        logits = torch.randn(reqs, steps, S.vocab, device=S.device, generator=gen) * 2
        contexts = torch.randint(0, min(S.vocab, 129_000), (reqs, width), device=S.device, generator=gen)
        temperature = torch.tensor([0.7, 1.0, 1.3, 0.05], device=S.device).repeat(reqs)[:reqs]
        key = 0x0123456789ABCDEF
        ours = _ours_draft(logits, contexts, key, temperature, steps)
        theirs = _theirs_draft(module, logits, contexts, key, temperature, steps)
        rows.append({"requests": reqs, "steps": steps, "width": width,
                     "token_agreement": float((ours == theirs).float().mean())})
        run.save()
    out["draft_all_tokens_agree"] = all(r["token_agreement"] == 1.0 for r in rows)


def section_vllm_temperature(run: Run, dest: Path) -> None:
    """Target sampling at temperatures != 1: vLLM's kernel on logits / T (torch), ours with T."""
    from watermark import prf
    from watermark.kernels import gumbel as kernels

    module = load_vllm(dest)
    out = run.results.setdefault("vllm_0_34", {"source": str(dest)})
    rows = out.setdefault("temperature", [])
    batch = 3 if S.smoke else 256
    gen = torch.Generator(device=S.device).manual_seed(3000)
    logits = make_logits(batch, "normal", torch.float32, gen)
    contexts = torch.randint(0, 129_000, (batch, 4), device=S.device, generator=gen)
    key = 0x0FEDCBA987654321
    for t in (0.7, 1.3, 0.05):
        temperature = torch.full((batch,), t, device=S.device)
        ours = kernels.gumbel_sample(
            logits, temperature=temperature, key_a=torch.full((batch,), prf.to_signed64(key), device=S.device),
            key_b=torch.full((batch,), prf.to_signed64(key), device=S.device), alpha=torch.zeros(batch, device=S.device),
            contexts=contexts, widths=torch.full((batch,), 4, dtype=torch.int32, device=S.device),
            watermark=torch.ones(batch, dtype=torch.bool, device=S.device),
            stream_keys=torch.zeros(batch, dtype=torch.int64, device=S.device),
            positions=torch.zeros(batch, dtype=torch.int64, device=S.device))
        theirs = module.philox_gumbel_sample(logits / temperature[:, None], contexts, key)
        rows.append({"batch": batch, "temperature": t, "token_agreement": float((ours.tokens == theirs).float().mean())})
    out["temperature_all_tokens_agree"] = all(r["token_agreement"] == 1.0 for r in rows)
    run.save()


def section_hmac_sampler(run: Run) -> None:
    """The sampler step at B = 256 with 256-bit keys (two launches: HMAC rows, then the race)
    beside the Philox kernel, same harness and logits; tokens checked against the reference."""
    from tests.watermark.kernels.hmac_parity import reference_sample_wide
    from watermark.hmac_rows import WideRows
    from watermark.kernels import gumbel as kernels
    from watermark.kernels.hmac import gumbel_sample_hmac
    from watermark.prf import hmac_philox

    rows = run.results.setdefault("hmac_sampler", [])
    for batch, dist, dual in ((S.big, "normal", False), (S.big, "normal", True), (S.big, "zipf", False),
                              (S.small, "normal", False)):
        gen = torch.Generator(device=S.device).manual_seed(4000 + batch)
        sets = [make_logits(batch, dist, torch.float32, gen) for _ in range(sets_for(batch * S.vocab * 4))]
        keys = [(2**255 + 7919 * b) for b in range(batch)]
        mids = torch.tensor([hmac_philox.midstates(k) for k in keys], dtype=torch.int64, device=S.device)
        mids_b = torch.tensor([hmac_philox.midstates(k + 1) for k in keys], dtype=torch.int64, device=S.device)
        wide = WideRows(mids_a=mids, mids_b=mids_b, wide=torch.ones(batch, dtype=torch.bool, device=S.device))
        args = dict(temperature=torch.ones(batch, device=S.device),
                    key_a=torch.randint(-2**62, 2**62, (batch,), device=S.device, generator=gen),
                    key_b=torch.randint(-2**62, 2**62, (batch,), device=S.device, generator=gen),
                    alpha=torch.full((batch,), 0.5 if dual else 0.0, device=S.device),
                    contexts=torch.randint(0, 129_000, (batch, 4), device=S.device, generator=gen),
                    widths=torch.full((batch,), 4, dtype=torch.int32, device=S.device),
                    watermark=torch.ones(batch, dtype=torch.bool, device=S.device),
                    stream_keys=torch.randint(-2**62, 2**62, (batch,), device=S.device, generator=gen),
                    positions=torch.randint(0, 4096, (batch,), device=S.device, generator=gen))
        got = gumbel_sample_hmac(sets[0], **args, mids_a=wide.mids_a, mids_b=wide.mids_b, wide=wide.wide)
        want = reference_sample_wide(sets[0], args, wide)  # the torch reference, on the same device
        row = {"batch": batch, "dist": dist, "mode": "dual" if dual else "single", "input_sets": len(sets),
               "bit_exact": bool(torch.equal(got.tokens.cpu(), want.tokens.cpu())
                                 and torch.equal(got.routes.cpu(), want.routes.cpu()))}
        row["philox_us"] = graph_time_us([(lambda x=x: kernels.gumbel_sample(x, **args)) for x in sets])
        row["hmac_us"] = graph_time_us([(lambda x=x: gumbel_sample_hmac(x, **args, mids_a=wide.mids_a,
                                                                        mids_b=wide.mids_b, wide=wide.wide))
                                        for x in sets])
        row["hmac_over_philox"] = row["hmac_us"] / row["philox_us"]
        rows.append(row)
        del sets
        free()
        run.save()
