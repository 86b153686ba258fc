"""The local engine's running batch: admission, steps with their containment, retirement.

What the step loop (engine.py) calls between its waits: requests are admitted together
(prefills back to back or batched, one draw of their first tokens, one join per group),
each step runs the plain group and the speculative group's block, and finished or
cancelled requests leave. A failing admission or step is contained to the requests it
belongs to (see LocalEngine's docstring). A mixin of LocalEngine, whose state it uses.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from service.engines.local.request import RequestState
from service.engines.local.rows import HostDedup, RowTable
from service.engines.local.runner import Group
from service.engines.local.scheduler import plain_step, process, sample_next, sample_rows, speculative_step
from service.engines.local.static_runner import prefill_all
from service.engines.local.telemetry import StepReport
from watermark import stream

log = logging.getLogger("hallmark.engine.local")


class BatchSteps:
    # ------------------------------------------------------------------ admission

    def _admit_all(self, states: list[RequestState]) -> None:
        """Admit requests together (prefills back to back, one draw of their first tokens,
        one join per group); if that fails, each alone, so that only a failing one fails."""
        self._drain_blocks()
        if len(states) > 1:
            snapshot = self._snapshot()
            try:
                self._admit(states)
                return
            except Exception as exc:  # noqa: BLE001 - find whose admission fails, one by one
                log.warning("admitting %d requests together failed (%s); admitting them one by one",
                            len(states), type(exc).__name__)
                self._restore(snapshot)
                for state in states:
                    self._forget(state)
        for state in states:
            self._admit_contained(state)

    def _forget(self, state: RequestState) -> None:
        """Undo a request's admission (it has not emitted anything that was kept)."""
        if state in self._running:
            self._set_running([s for s in self._running if s is not state])
        if self._dedup_slots is not None:
            self._dedup_slots.close(state.rid)
        state.detach()

    def _admit_contained(self, state: RequestState) -> None:
        """Admit one request; if its prefill or first draw fails, only it fails."""
        self._drain_blocks()
        snapshot = self._snapshot()
        try:
            self._admit([state])
        except Exception as exc:  # noqa: BLE001 - this request's own failure
            log.warning("request %s failed at admission: %s", state.request.request_id, exc)
            self._restore(snapshot)
            self._forget(state)
            state.fail(exc)

    def _admit(self, states: list[RequestState]) -> None:
        """Prefill ``states`` (each alone, back to back), draw their first tokens together,
        join them to their groups. A request that ends at its first token joins too and
        leaves at the next retire."""
        self._drain_blocks()
        for state in states:
            state.rid = state.request.request_id + f"#{id(state)}"
            state.attach(self._outputs)
        groups = [self.spec_target if self._uses_speculation(s) else self.plain for s in states]
        prefills: list = [None] * len(states)
        for group in (self.plain, self.spec_target):
            index = [i for i, g in enumerate(groups) if g is group]
            for i, prefill in zip(index, prefill_all(group, [list(states[i].request.prompt_ids) for i in index])):
                prefills[i] = prefill
        sample_next(torch.stack([logits for _, _, logits in prefills]), states)
        spec_states = []
        for group in (self.plain, self.spec_target):
            members = [(s, p) for s, g, p in zip(states, groups, prefills) if g is group]
            if members:
                group.join_many([s.rid for s, _ in members], [p[0] for _, p in members], [p[1] for _, p in members],
                                [len(s.request.prompt_ids) for s, _ in members])
            if group is self.spec_target:
                spec_states = [s for s, _ in members]
        if spec_states:
            drafts = prefill_all(self.spec.draft, [list(s.request.prompt_ids) for s in spec_states])
            self.spec.draft.join_many([s.rid for s in spec_states], [d[0] for d in drafts], [d[1] for d in drafts],
                                      [len(s.request.prompt_ids) for s in spec_states])
            rows = np.array([s.row for s in spec_states], dtype=np.int64)
            self._outputs.set_pending(rows, self._outputs.last_tokens(rows), np.zeros_like(rows),
                                      np.ones_like(rows))
            if self._dedup_slots is not None:
                self._dedup_slots.open_many(spec_states)
        self._set_running(self._running + states)
        if any(s.finished for s in states):
            self._retire()

    # ------------------------------------------------------------------ steps

    def _step_contained(self) -> None:
        """One step; a row whose own sampling fails is removed and the step retried."""
        while self._running:
            snapshot = self._snapshot()
            try:
                self._step()
                return
            except Exception as exc:
                failure = exc
            self._restore(snapshot)
            culprits = [s for s in self._running if not s.finished and not self._row_ok(s)]
            if not culprits:
                raise failure
            for state in culprits:
                log.warning("request %s failed in a step and was removed: %s", state.request.request_id, failure)
                state.fail(failure)
            self._retire()

    def _row_ok(self, state: RequestState) -> bool:
        """Whether one row alone goes through the sampler (on neutral logits) and its next
        input is a valid token: what a step needs from the row itself."""
        try:
            if state.last_token is None or not 0 <= state.last_token < self.vocab_size:
                return False
            logits = torch.zeros((1, self.vocab_size), device=self.device)
            for routed, lane in ((True, stream.LANE_SAMPLE), (False, stream.LANE_DRAFT)):
                sample_rows(process(logits, [state]), [state], [state.dedup.context], [False], [0],
                            routed=routed, lane=lane)
            return True
        except Exception:  # noqa: BLE001 - the probe's answer
            return False

    def _groups(self) -> list[Group]:
        return [g for g in (self.plain, self.spec_target, self.spec.draft if self.spec else None) if g is not None]

    def _snapshot(self) -> list:
        """Each group's state and the rows' outputs, restorable after a failed step (see
        Group.snapshot; the OutputTable's counters are copied, its tokens beyond the
        restored lengths are rewritten)."""
        out = self._outputs
        saved = [(out.length.copy(), out.routes.copy(), out.drafted.copy(), out.accepted.copy(),
                  out.pending.copy(), out.pending_count.copy())]
        return saved + [(group, group.snapshot()) for group in self._groups()]

    def _drain_blocks(self) -> None:
        """Take the speculative blocks in flight (before rows join or leave the groups)."""
        if self._blocks is not None:
            self._blocks.drain()

    def _restore(self, saved: list) -> None:
        if self._blocks is not None:
            self._blocks.abandon()
        out = self._outputs
        (out.length[:], out.routes[:], out.drafted[:], out.accepted[:], out.pending[:],
         out.pending_count[:]) = saved[0]
        for group, state in saved[1:]:
            group.restore(state)
        if self._dedup_slots is not None:  # undo a commit the failed step made on the device
            self._dedup_slots.resync(self._running)

    def _reset_groups(self) -> None:
        if self._blocks is not None:
            self._blocks.abandon()
        for group in (self.plain, self.spec_target, self.spec.draft if self.spec else None):
            if group is not None:
                group.keep([])
        self._tables.clear()
        self._members.clear()
        if self._dedup_slots is not None:
            for rid in list(self._dedup_slots.slot_of):
                self._dedup_slots.close(rid)

    def _uses_speculation(self, state: RequestState) -> bool:
        # Dual keys speculate on either key size: 256-bit rows carry their keys' HMAC midstates
        # into the draft sampler and the verification (watermark.hmac_rows, kernels/hmac_verify.py).
        return self.spec is not None and (state.request.watermark is None or state.dual_key)

    def _rows_of(self, name: str, group) -> list[RequestState]:
        """The running requests of a group in its row order (rebuilt when rows join or leave)."""
        rows = self._members.get(name)
        if rows is None:
            order = {rid: i for i, rid in enumerate(group.ids)}
            rows = sorted((s for s in self._running if s.rid in order), key=lambda s: order[s.rid])
            self._members[name] = rows
        return rows

    def _step(self) -> None:
        plain = self._rows_of("plain", self.plain)
        spec = self._rows_of("spec", self.spec_target) if self.spec is not None else []
        plain_table = self._table("plain", plain) if plain else None
        spec_table = self._table("spec", spec) if spec else None
        report = None
        if self.step_hooks:  # lengths before the step
            report = StepReport(self._lengths(plain_table), self._lengths(spec_table), self.k)
        if plain:
            plain_step(self.plain, plain, plain_table[0])
        if spec:
            table, dedup = spec_table
            if self._blocks is not None:
                self._blocks.step(spec, table, dedup)
            else:
                out = self._outputs
                pending = [out.pending[s.row, :out.pending_count[s.row]].tolist() for s in spec]
                speculative_step(self.spec, spec, pending, table, dedup)
                for s, p in zip(spec, pending):
                    out.pending[s.row, :len(p)] = p
                    out.pending_count[s.row] = len(p)
        if report is not None:
            self._run_hooks(report)

    def _lengths(self, cached) -> np.ndarray:
        """[B] prompt + output tokens of a group's rows (the telemetry's step report)."""
        if cached is None:
            return np.zeros(0, dtype=np.int64)
        table = cached[0]
        return table.prompt_lengths + self._outputs.length[table.out_rows]

    def _table(self, name: str, rows: list[RequestState]) -> tuple:
        """The group's RowTable and dedup for these rows, rebuilt only when its rows change."""
        cached = self._tables.get(name)
        if cached is None or cached[1] is not rows:
            table = RowTable.build(rows, self.device, self.k)
            slots = self._dedup_slots if name == "spec" else None
            cached = (table, rows, slots.for_rows(rows) if slots is not None else HostDedup(rows))
            self._tables[name] = cached
        return cached[0], cached[2]

    def _run_hooks(self, report: StepReport) -> None:
        # A failing hook must not fail (and so roll back and repeat) a step that has emitted tokens.
        for hook in self.step_hooks:
            try:
                hook(report)
            except Exception:  # noqa: BLE001 - telemetry never takes generation down
                log.exception("engine step hook failed")

    def _set_running(self, states: list[RequestState]) -> None:
        """The running requests (a new list whenever they change: the caches key on it)."""
        self._running = states
        self._members.clear()
        self._running_rows = np.array([s.row for s in states], dtype=np.int64)

    def _retire(self) -> None:
        """Let finished and cancelled requests leave (a look at the table's flags while none
        has: no loop over the rows)."""
        if self._cancelling.is_set():
            self._cancelling.clear()
            for state in self._running:
                if state.cancelled.is_set() and not state.finished:
                    state.finish("cancelled")
        if not self._outputs.done[self._running_rows].any():
            return
        self._drain_blocks()  # its rows may finish too
        alive = [s for s in self._running if not s.finished]
        ids = {s.rid for s in alive}
        self.plain.keep([i for i in self.plain.ids if i in ids])
        if self.spec is not None:
            self.spec_target.keep([i for i in self.spec_target.ids if i in ids])
            self.spec.draft.keep([i for i in self.spec.draft.ids if i in ids])
        for s in self._running:
            if s.finished:
                if self._dedup_slots is not None:
                    self._dedup_slots.close(s.rid)
                s.detach()
        self._set_running(alive)
