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
from service.engines.local.rows import RowTable, right_aligned
from service.engines.local.runner import Group
from watermark import dispatch, sampler, speculative, stream
from watermark.results import SampleResult
from watermark.processing import ProcessingParams, process_logits
from watermark.transfer import host_tensor, to_host


def _params(rows: list[RequestState], repeat: int, device) -> ProcessingParams:
    # Host tensors: process_logits checks them without a device read and copies them asynchronously.
    def col(values, dtype):
        return torch.tensor(values, dtype=dtype).repeat_interleave(repeat)

    return ProcessingParams(
        temperature=col([r.request.temperature for r in rows], torch.float32),
        top_k=col([r.request.top_k for r in rows], torch.int64),
        top_p=col([r.request.top_p for r in rows], torch.float32),
    )


def sample_rows(processed: torch.Tensor, rows: list[RequestState], contexts: list[tuple[int, ...]],
                repeated: list[bool], offsets: list[int], *, routed: bool, lane: int) -> SampleResult:
    """One token per row from processed logits [B, V] (:func:`process`); ``routed`` applies
    dual-key routing (alpha), otherwise dual-key rows use key A (speculative drafts)."""
    sampler_rows = sampler.sampler_rows(
        [r.keys for r in rows], contexts=contexts,
        watermark=[r.watermarked and not rep for r, rep in zip(rows, repeated)], greedy=[r.greedy for r in rows],
        stream_keys=[r.stream_key for r in rows], positions=[r.length + off for r, off in zip(rows, offsets)],
        routed=routed, device=processed.device)
    return dispatch.sample(processed, sampler_rows, lane=lane)


def process(logits: torch.Tensor, rows: list[RequestState], repeat: int = 1) -> torch.Tensor:
    """Raw logits [B * repeat, V] -> processed logits (each row's temperature, top-k, top-p)."""
    return process_logits(logits, _params(rows, repeat, logits.device))


def sample_next(logits: torch.Tensor, rows: list[RequestState]) -> None:
    """Sample and emit one token per row (prefill outputs and plain decode steps)."""
    result = sample_rows(process(logits, rows), rows, [r.dedup.context for r in rows], [r.dedup.next_repeated() for r in rows],
                         [0] * len(rows), routed=True, lane=stream.LANE_SAMPLE)
    out = to_host(torch.stack([result.tokens, result.routes.to(torch.int64)], dim=1))
    for row, (token, route) in zip(rows, out):
        row.emit_block([token], [route])


@dataclass
class SpeculativeGroups:
    target: Group
    draft: Group
    k: int


def plain_step(group: Group, rows: list[RequestState], table: RowTable) -> None:
    """One token per row: one host-to-device copy in, one read back out."""
    device, width = group.device, table.width
    packed = host_tensor([[r.length, r.last_token, int(r.dedup.next_repeated())]
                          + list(r.dedup.context) + [0] * (width - r.dedup.width) for r in rows], torch.int64, device)
    logits = group.forward(packed[:, 1:2])[:, -1]
    sampler_rows = table.sampler_rows(table.watermarked & (packed[:, 2] == 0), packed[:, 0], routed=True)
    result = dispatch.sample_padded(table.process(logits), sampler_rows, packed[:, 3:], table.widths,
                                    lane=stream.LANE_SAMPLE)
    out = to_host(torch.stack([result.tokens, result.routes.to(torch.int64)], dim=1))
    for row, (token, route) in zip(rows, out):
        row.emit_block([token], [route])


def speculative_step(groups: SpeculativeGroups, rows: list[RequestState], pending: list[list[int]],
                     table: RowTable, dedup) -> None:
    """One draft-then-verify block for every row, with one read back (after verification).

    ``pending[b]`` are row b's tokens the draft model has not seen yet (one, or two after a
    fully accepted block: the last draft and the bonus token). ``dedup`` answers the block's
    dedup decisions (rows.HostDedup or rows.DeviceDedup).
    """
    k, device, width = groups.k, groups.target.device, table.width
    batch = len(rows)
    fed = max(len(p) for p in pending)
    # Per row: position, last token, committed context (right-aligned), then the draft
    # model's inputs (left-padded to two) and which of them are live.
    packed = host_tensor([[r.length, r.last_token] + right_aligned(r.dedup.context, width)
                          + [0] * (2 - len(p)) + list(p) + [0] * (2 - len(p)) + [1] * len(p)
                          for r, p in zip(rows, pending)], torch.int64, device)
    positions = packed[:, 0]
    # The block's sequence: committed context, then the drafts as they are drawn.
    sequence = torch.nn.functional.pad(packed[:, 2:2 + width], (0, k))
    drafts = sequence[:, width:]
    inputs = packed[:, 2 + width:]
    logits = groups.draft.forward(inputs[:, 2 - fed:2], inputs[:, 4 - fed:])[:, -1]
    draft_probs = []
    for j in range(k):
        repeated = dedup.at(drafts, j)
        processed = table.process(logits)
        sampler_rows = table.sampler_rows(table.watermarked & ~repeated, positions + j, routed=False)
        result = dispatch.sample_padded(processed, sampler_rows, table.block_contexts(sequence, j), table.widths,
                                        lane=stream.LANE_DRAFT)
        draft_probs.append(torch.softmax(processed, dim=-1))
        drafts[:, j] = result.tokens
        if j < k - 1:
            logits = groups.draft.forward(result.tokens.unsqueeze(1))[:, -1]

    target_logits = groups.target.forward(torch.cat([packed[:, 1:2], drafts], dim=1))  # [B, k + 1, V]
    processed = table.process(target_logits.reshape(batch * (k + 1), -1), k + 1)
    target_probs = torch.softmax(processed, dim=-1).reshape(batch, k + 1, -1)
    repeated = dedup.block(drafts)
    verify_rows = speculative.VerifyRows(
        key_b=table.key_b, key_coin=table.key_coin, keyed_coin=table.keyed_coin, contexts=(),
        watermark=table.watermarked.unsqueeze(1) & ~repeated, greedy=table.greedy, stream_keys=table.stream_keys,
        positions=positions, wide=table.wide)
    result = dispatch.verify_padded(target_probs, torch.stack(draft_probs, dim=1), drafts, verify_rows,
                                    table.block_contexts(sequence), table.widths)
    dedup.commit(result.tokens, result.num_accepted + 1)
    # Target cache: last + k drafts were fed; keep last + accepted drafts. Draft cache:
    # ``pending`` + the first k - 1 drafts were fed; keep up to the accepted drafts.
    rejected_target = k - result.num_accepted
    rejected_draft = (k - 1 - result.num_accepted).clamp(min=0)
    out = to_host(torch.cat([result.tokens, result.routes.to(torch.int64), drafts,
                             result.num_accepted.unsqueeze(1)], dim=1))
    accepted = [row[-1] for row in out]
    groups.target.reject_tail(torch.tensor([k - a for a in accepted], dtype=torch.int64), rejected_target)
    groups.draft.reject_tail(torch.tensor([max(0, k - 1 - a) for a in accepted], dtype=torch.int64), rejected_draft)
    for b, row in enumerate(rows):
        a = accepted[b]
        tokens, routes, drawn = out[b][:k + 1], out[b][k + 1:2 * k + 2], out[b][2 * k + 2:3 * k + 2]
        row.drafted += k
        row.accepted += a
        if row.emit_block(tokens[:a + 1], routes[:a + 1]):
            pending[b] = []
            continue
        # The draft has seen pending + drafts[:k-1]; it still needs what it has not seen.
        pending[b] = drawn[min(a, k - 1):a] + [tokens[a]]
