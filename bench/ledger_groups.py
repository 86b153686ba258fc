"""Ledger entries per second through the gateway's grouped writer (service.access.group_commit),
as N concurrent streams write them: each stream's ``started`` entry, then its ``finished``
entry with the k-grams of ``--tokens`` watermarked tokens (what service.generation submits
for a streamed generation of that length; ``--checkpoints``: that many checkpoint entries
between them, as a stream sending more than CHECKPOINT_TOKENS tokens writes), on SQLite and
on PostgreSQL.

    python bench/ledger_groups.py [--streams 256] [--tokens 128] [--database-url URL] [--profile]
        [--single] [--max-group 64]

Per store: every stream submits its started entry at once, waits for it, then submits its
finished entry (the engine's time between them is left out: this is the store's bound on
generation, the rate at which it can take 256 streams' entries); entries/s over the whole
run, groups committed and their mean size, and what one entry costs the writer's thread.
Grouped writes run as one ``ledger.grouped.append_many`` per group (as the gateway submits
them); ``--single``: each in its own savepoint, as before that existed.
``--profile``: the writer thread's top functions (cProfile) for the run.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import json
import pstats
import sys
import tempfile
import time
import uuid
from concurrent.futures import wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rows import emit  # noqa: E402


def run(database_url: str | None, streams: int, tokens: int, profile: bool, single: bool, max_group: int,
        checkpoints: int) -> dict:
    import random

    from keys.db import open_store
    from keys.material import active_key
    from keys.tenants import get_tenant
    from ledger import kgrams
    from ledger.entries import CHECKPOINT_TOKENS, checkpoint_generation, finish_generation, start_generation
    from ledger.grouped import CHECKPOINT, FINISHED, STARTED, append_many
    from service.access.group_commit import GroupCommit
    from tests.service.gateway import provision

    tmp = Path(tempfile.mkdtemp(prefix="ledger-groups-"))
    settings, _ = provision(tmp, database_url)
    store = open_store(settings, require_kek=True)
    with store.transaction(write=False) as session:
        tenant = get_tenant(session, name="acme")
        key = active_key(session, store.keyring, tenant_id=tenant.id)
    writes = GroupCommit(store, name="ledger", max_group=max_group)
    rng = random.Random(0)
    outputs = [[rng.randrange(8000) for _ in range(tokens)] for _ in range(streams)]
    ids = [uuid.uuid4().hex for _ in range(streams)]

    def started(i: int):
        kwargs = dict(tenant_id=key.tenant_id, key_id=key.key_id, key_version=key.version, engine="local",
                      model="bench", spec=key.spec, prompt_tokens=4, unwatermarked_reason=None, generation_id=ids[i])
        return (lambda session: start_generation(session, **kwargs)), (append_many, (STARTED, kwargs))

    def finished(i: int):
        kwargs = dict(generation_id=ids[i], tenant_id=key.tenant_id, finish_reason="length",
                      output_text="x" * tokens, token_ids=outputs[i], watermarked_tokens=tokens,
                      kgram_set=kgrams.kgram_set(key.key_id, key.material.secret, outputs[i]))
        return (lambda session: finish_generation(session, **kwargs)), (append_many, (FINISHED, kwargs))

    def checkpoint(i: int, n: int):
        kwargs = dict(generation_id=ids[i], tenant_id=key.tenant_id, output_text="x" * n, token_ids=outputs[i][:n],
                      watermarked_tokens=n)
        return (lambda session: checkpoint_generation(session, **kwargs)), (append_many, (CHECKPOINT, kwargs))

    def submit(pair):
        return writes.submit(pair[0], None if single else pair[1])

    profiler = cProfile.Profile() if profile else None
    if profiler is not None:  # the writer's thread, profiled from its first group
        original = writes._commit  # noqa: SLF001

        def commit(group, attempt=0):
            profiler.enable()
            try:
                return original(group, attempt)
            finally:
                profiler.disable()

        writes._commit = commit  # noqa: SLF001
    start, cpu = time.perf_counter(), time.process_time()
    first = [submit(started(i)) for i in range(streams)]
    wait(first)
    mid = time.perf_counter()
    second = []
    for n in range(CHECKPOINT_TOKENS + 1, tokens, CHECKPOINT_TOKENS + 1)[:checkpoints]:  # as a stream covers
        round_ = [submit(checkpoint(i, n)) for i in range(streams)]
        wait(round_)
        second += round_
    last = [submit(finished(i)) for i in range(streams)]
    wait(last)
    second += last
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    errors = [f.exception() for f in first + second if f.exception() is not None]
    entries = len(first) + len(second) - len(errors)
    row = {"bench": "ledger_groups", "database": str(store.url).split(":")[0], "streams": streams, "tokens": tokens,
           "entries": entries, "errors": [type(e).__name__ + ": " + str(e)[:120] for e in errors[:3]],
           "seconds": round(seconds, 3), "entries_per_second": round(entries / seconds, 1),
           "started_entries_per_second": round(streams / (mid - start), 1),
           "later_entries_per_second": round(len(second) / (seconds - mid + start), 1),
           "checkpoints_per_stream": len(second) // streams - 1,
           "batched": not single, "max_group": max_group, "writes_batched": writes.batched,
           "groups": writes.groups, "mean_group": round(writes.writes / max(writes.groups, 1), 1),
           "ms_per_entry": round(1e3 * seconds / max(entries, 1), 3),
           # the process's CPU (the writer's thread, nearly all of it): on a shared machine
           # the steadier figure; 1000 / it is the rate with a core to itself
           "cpu_ms_per_entry": round(1e3 * cpu / max(entries, 1), 3)}
    if profiler is not None:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(os.environ.get("PROFILE_SORT", "tottime")).print_stats(45)
        row["profile"] = out.getvalue()
    store.close()
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--database-url", action="append", default=None,
                        help="a database to write, empty (repeatable; sqlite, the default: a new SQLite file)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--single", action="store_true", help="each write alone in its savepoint (no run_many)")
    parser.add_argument("--max-group", type=int, default=64)
    parser.add_argument("--checkpoints", type=int, default=0,
                        help="checkpoint entries per stream between started and finished (at most one per "
                             "CHECKPOINT_TOKENS + 1 tokens, as a stream writes them)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    for url in args.database_url or ["sqlite"]:
        url = None if url == "sqlite" else url  # "sqlite": a new SQLite file
        row = run(url, args.streams, args.tokens, args.profile, args.single, args.max_group, args.checkpoints)
        profile = row.pop("profile", None)
        row["command"] = "python bench/ledger_groups.py " + " ".join(sys.argv[1:])
        emit(row, args.out)
        if profile:
            print(profile)


if __name__ == "__main__":
    main()
