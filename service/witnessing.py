"""Witnessed checkpoints: the gateway, as a log, asks its witnesses to cosign each checkpoint
before publishing it (c2sp.org/tlog-witness v1.0.0, the log's side).

The witnesses and the quorum come from a tlog-policy file (``HALLMARK_WITNESS_POLICY``,
ledger.log.policy): each ``witness`` line with a URL (its submission prefix) is sent
``POST <url>/add-checkpoint`` with ``old <size>``, the consistency proof from the size it
last cosigned, and the log-signed checkpoint. Its answers:

- 200: its cosignature lines; only a line that verifies under its key in the policy counts
  (a witness returning a bad cosignature has not cosigned);
- 409: it last cosigned another size (the body says which): resend from that size, within
  the attempts, unless that size is above ours (another replica's newer checkpoint, or our
  log went back: logged, never cosigned over);
- 422: the proof does not verify for it (it holds a different history: a fork), 403 it
  does not trust our key, 404 it does not know our origin: configuration or misbehaviour,
  logged as errors; that witness is not asked again for this checkpoint;
- a timeout, a refused connection or a 5xx: retried after a short backoff.

Witnesses are asked in parallel; a round ends when every witness answered or gave up (at
most ``witness_attempts`` requests of ``witness_timeout_seconds`` each). The checkpoint is
published (stored, then served at ``checkpoint`` and used for proofs) only when the good
cosignatures meet the quorum; otherwise the next round (the entry count or the time bound
of service.state) tries again with a newer checkpoint. Rounds run on the publisher thread,
never on a generation's path.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import httpx

from ledger.log.cosignature import cosigned_by
from ledger.log.note import NoteError
from ledger.log.policy import Policy, Witness
from ledger.log.witness_protocol import ProtocolError, parse_size, request_body

log = logging.getLogger("hallmark.log")

Consistency = Callable[[int, int], list[bytes]]


class Witnessing:
    def __init__(self, policy: Policy, *, timeout: float = 2.0, attempts: int = 3, backoff: float = 0.1) -> None:
        self.policy = policy
        self.witnesses = [w for w in policy.witnesses.values() if w.url]
        self.timeout, self.attempts, self.backoff = timeout, attempts, backoff
        self.sizes: dict[str, int] = {}
        """Per witness, the size it last cosigned (learned from its 200s and 409s)."""
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=timeout, follow_redirects=False,
                                    limits=httpx.Limits(max_keepalive_connections=max(len(self.witnesses), 1)))
        self._pool = ThreadPoolExecutor(max_workers=max(len(self.witnesses), 1), thread_name_prefix="witness")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def cosign(self, note: str, size: int, consistency: Consistency) -> tuple[str, dict[str, str]] | None:
        """Ask every witness to cosign ``note`` (the log-signed checkpoint of ``size``). The
        note with the good cosignatures appended when they meet the quorum, and each
        witness's line; None otherwise."""
        lines = dict(zip((w.name for w in self.witnesses),
                         self._pool.map(lambda w: self._one(w, note, size, consistency), self.witnesses)))
        good = {name: line for name, line in lines.items() if line}
        if not self.policy.satisfied(set(good)):
            log.warning("checkpoint of size %d not published: cosigned by %s, short of the quorum '%s'", size,
                        ", ".join(sorted(good)) or "no witness", self.policy.quorum)
            return None
        return note + "".join(good[w.name] for w in self.witnesses if w.name in good), good

    def _one(self, witness: Witness, note: str, size: int, consistency: Consistency) -> str | None:
        with self._lock:
            old = self.sizes.get(witness.name, 0)
        for attempt in range(self.attempts):
            if old > size:
                # Another replica may have had a newer checkpoint cosigned meanwhile (then the next
                # round moves on); if not, this log went back or forked: `hallmark ledger witness`
                # and `ledger verify` say which.
                log.warning("witness %s already cosigned size %d, above this checkpoint's %d (a newer checkpoint "
                            "of another replica, or this log went back)", witness.name, old, size)
                return None
            try:
                body = request_body(old, consistency(old, size) if 0 < old < size else [], note)
                answer = self._client.post(witness.url.rstrip("/") + "/add-checkpoint", content=body)
            except httpx.HTTPError as exc:
                log.warning("witness %s unreachable (attempt %d): %s", witness.name, attempt + 1, type(exc).__name__)
                time.sleep(self.backoff * (attempt + 1))
                continue
            if answer.status_code == 200:
                return self._cosignature(witness, note, size, answer.content)
            if answer.status_code == 409:
                try:
                    old = parse_size(answer.content)
                except ProtocolError:
                    log.error("witness %s answered 409 without its size", witness.name)
                    return None
                with self._lock:
                    self.sizes[witness.name] = old
                continue
            if answer.status_code in (403, 404, 422, 400):
                why = {403: "does not trust this log's key", 404: "does not know this log's origin",
                       422: "refuses the consistency proof (it holds another history: a fork?)",
                       400: "calls the request malformed"}[answer.status_code]
                log.error("witness %s %s: %s", witness.name, why, answer.text.strip()[:200])
                return None
            log.warning("witness %s answered %d (attempt %d)", witness.name, answer.status_code, attempt + 1)
            time.sleep(self.backoff * (attempt + 1))
        log.warning("witness %s did not cosign size %d after %d attempts", witness.name, size, self.attempts)
        return None

    def _cosignature(self, witness: Witness, note: str, size: int, body: bytes) -> str | None:
        """The witness's good cosignature line in its answer, or None (logged). Lines by
        other keys are ignored, as the spec says."""
        try:
            for line in body.decode("utf-8").splitlines():
                if line.startswith(f"\u2014 {witness.key.name} ") and witness.key in cosigned_by(
                        note + line + "\n", [witness.key]):
                    with self._lock:
                        self.sizes[witness.name] = size
                    return line + "\n"
        except (UnicodeDecodeError, NoteError):
            pass
        log.error("witness %s returned no good cosignature for size %d (a bad signature or another key)",
                  witness.name, size)
        return None
