"""The decode step: one call advances every running request by one or more tokens.

Requests join between steps (prefill alone, then merge into their group's batched cache)
and leave between steps (finished, cancelled). Two groups run side by side:

* ``plain``: one token per step, target model only (single-key `gumbel` requests, or no
  draft model);
* ``speculative``: k draft tokens from the draft model under key A, verified by one target
  pass with watermarked rejection sampling (dual-key and unwatermarked requests).

A single-key request never speculates: its one key would have to drive both the draft and
the residual draw at the same context, and reusing one random vector for two draws would
bias the output. Dual-key keys exist for exactly this.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from service.engines.local.request import RequestState
from service.engines.local.runner import Group
from watermark import dispatch, sampler, speculative, stream
from watermark.prf import philox_torch
from watermark.results import SampleResult
from watermark.processing import ProcessingParams, process_logits
from watermark.transfer import host_tensor


def _params(rows: list[RequestState], repeat: int, device) -> ProcessingParams:
    # Host tensors: process_logits checks them without a device read and copies them asynchronously.
    def col(values, dtype):
        return torch.tensor(values, dtype=dtype).repeat_interleave(repeat)

    return ProcessingParams(
        temperature=col([r.request.temperature for r in rows], torch.float32),
        top_k=col([r.request.top_k for r in rows], torch.int64),
        top_p=col([r.request.top_p for r in rows], torch.float32),
    )


def _keys(values: list[int], device) -> torch.Tensor:
    return philox_torch.keys_tensor(values, device)


def sample_rows(processed: torch.Tensor, rows: list[RequestState], contexts: list[tuple[int, ...]],
                repeated: list[bool], offsets: list[int], *, routed: bool, lane: int) -> SampleResult:
    """One token per row from processed logits [B, V] (:func:`process`); ``routed`` applies
    dual-key routing (alpha), otherwise dual-key rows use key A (speculative drafts)."""
    sampler_rows = sampler.sampler_rows(
        [r.keys for r in rows], contexts=contexts,
        watermark=[r.watermarked and not rep for r, rep in zip(rows, repeated)], greedy=[r.greedy for r in rows],
        stream_keys=[r.stream_key for r in rows], positions=[len(r.output) + off for r, off in zip(rows, offsets)],
        routed=routed, device=processed.device)
    return dispatch.sample(processed, sampler_rows, lane=lane)


def process(logits: torch.Tensor, rows: list[RequestState], repeat: int = 1) -> torch.Tensor:
    """Raw logits [B * repeat, V] -> processed logits (each row's temperature, top-k, top-p)."""
    return process_logits(logits, _params(rows, repeat, logits.device))


def sample_next(logits: torch.Tensor, rows: list[RequestState]) -> None:
    """Sample and emit one token per row (prefill outputs and plain decode steps)."""
    result = sample_rows(process(logits, rows), rows, [r.dedup.context for r in rows], [r.dedup.next_repeated() for r in rows],
                         [0] * len(rows), routed=True, lane=stream.LANE_SAMPLE)
    for row, token, route in zip(rows, result.tokens.tolist(), result.routes.tolist()):
        row.emit(token, route)


@dataclass
class SpeculativeGroups:
    target: Group
    draft: Group
    k: int


def plain_step(group: Group, rows: list[RequestState]) -> None:
    inputs = host_tensor([[r.last_token] for r in rows], torch.int64, group.device)
    logits = group.forward(inputs)[:, -1]
    sample_next(logits, rows)


def speculative_step(groups: SpeculativeGroups, rows: list[RequestState], pending: list[list[int]]) -> None:
    """One draft-then-verify block for every row.

    ``pending[b]`` are row b's tokens the draft model has not seen yet (one, or two after a
    fully accepted block: the last draft and the bonus token).
    """
    k, device = groups.k, groups.target.device
    batch = len(rows)
    width = max(len(p) for p in pending)
    draft_in = host_tensor([[0] * (width - len(p)) + list(p) for p in pending], torch.int64, device)
    draft_live = host_tensor([[0] * (width - len(p)) + [1] * len(p) for p in pending], torch.int64, device)
    drafts: list[list[int]] = [[] for _ in rows]
    draft_probs = []
    logits = groups.draft.forward(draft_in, draft_live)[:, -1]
    for j in range(k):
        decisions = [r.dedup.block_repeated(d)[j] for r, d in zip(rows, drafts)]
        contexts = [speculative.block_contexts(r.dedup.context, d)[j] for r, d in zip(rows, drafts)]
        processed = process(logits, rows)
        result = sample_rows(processed, rows, contexts, decisions, [j] * batch, routed=False, lane=stream.LANE_DRAFT)
        draft_probs.append(torch.softmax(processed, dim=-1))
        for d, token in zip(drafts, result.tokens.tolist()):
            d.append(token)
        if j < k - 1:
            logits = groups.draft.forward(result.tokens.unsqueeze(1))[:, -1]
    draft_tokens = host_tensor(drafts, torch.int64, device)

    target_in = host_tensor([[r.last_token] + d for r, d in zip(rows, drafts)], torch.int64, device)
    target_logits = groups.target.forward(target_in)  # [B, k + 1, V]
    processed = process(target_logits.reshape(batch * (k + 1), -1), rows, k + 1)
    target_probs = torch.softmax(processed, dim=-1).reshape(batch, k + 1, -1)
    decisions = [r.dedup.block_repeated(d) for r, d in zip(rows, drafts)]
    verify_rows = speculative.VerifyRows(
        key_b=_keys([r.keys.key_b for r in rows], device),
        key_coin=_keys([r.keys.key_coin for r in rows], device),
        keyed_coin=host_tensor([r.keyed_coin for r in rows], torch.bool, device),
        contexts=[speculative.block_contexts(r.dedup.context, d) for r, d in zip(rows, drafts)],
        watermark=host_tensor([[r.watermarked and not rep for rep in dec] for r, dec in zip(rows, decisions)],
                              torch.bool, device),
        greedy=host_tensor([r.greedy for r in rows], torch.bool, device),
        stream_keys=_keys([r.stream_key for r in rows], device),
        positions=host_tensor([len(r.output) for r in rows], torch.int64, device),
    )
    result = dispatch.verify(target_probs, torch.stack(draft_probs, dim=1), draft_tokens, verify_rows)

    accepted = result.num_accepted.tolist()
    # Target cache: last + k drafts were fed; keep last + accepted drafts.
    groups.target.reject_tail(torch.tensor([k - a for a in accepted], dtype=torch.int64))  # host counts
    # Draft cache: `pending` + first k-1 drafts were fed; keep up to the accepted drafts.
    groups.draft.reject_tail(torch.tensor([max(0, k - 1 - a) for a in accepted], dtype=torch.int64))
    tokens, routes = result.tokens.tolist(), result.routes.tolist()
    for b, row in enumerate(rows):
        row.drafted += k
        row.accepted += accepted[b]
        emitted = tokens[b][: accepted[b] + 1]
        fed_to_draft = drafts[b][: min(accepted[b], k - 1)]
        done = False
        for token, route in zip(emitted, routes[b]):
            if row.emit(token, route):
                done = True
                break
        if done:
            pending[b] = []
            continue
        # The draft has seen pending + drafts[:k-1]; it still needs what it has not seen.
        unseen = drafts[b][len(fed_to_draft):accepted[b]] + [emitted[-1]]
        pending[b] = unseen
