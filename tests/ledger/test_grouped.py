"""Grouped ledger appends (ledger/grouped.py): many streams' entries appended in one call
are the entries the single calls make (chained, k-grams stored, logged leaf after leaf
with their own inclusion proofs), and a group with a write that would be refused runs its
writes one by one through the grouped writer, so only that write fails."""

from __future__ import annotations

import threading
import uuid
from datetime import datetime, timezone

import pytest

from keys.errors import InvalidInput
from ledger import grouped, kgrams
from ledger.entries import finish_generation, get_generation, start_generation
from ledger.log import merkle, tlog
from ledger.log.audit import audit_log
from ledger.log.leaves import entry_leaf
from ledger.verify import verify_chain
from service.access.group_commit import GroupCommit
from watermark.spec import WatermarkSpec

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def tenants(two_tenants):
    made = two_tenants(spec=WatermarkSpec(algorithm="dual_key_gumbel", context_width=3), beta_key=True)
    return made.acme_key, made.beta_key


def _started(key, generation_id):
    return dict(tenant_id=key.tenant_id, key_id=key.key_id, key_version=key.version, engine="local",
                model="tiny", spec=key.spec, prompt_tokens=4, unwatermarked_reason=None,
                generation_id=generation_id, now=NOW)


def _finished(key, generation_id, tokens):
    return dict(generation_id=generation_id, tenant_id=key.tenant_id, finish_reason="length",
                output_text="text " * len(tokens), token_ids=tokens, watermarked_tokens=len(tokens), now=NOW,
                kgram_set=kgrams.kgram_set(key.key_id, key.material.secret, tokens))


def _check_logged(session, entries) -> None:
    """Each entry's leaf sits where its Sequenced says, and its proof includes it in the tree
    of that size (what a receipt carries)."""
    for entry in entries:
        seq = entry.log
        leaf = merkle.leaf_hash(entry_leaf(entry.entry_hash, entry.kgrams_sha256))
        assert tlog.inclusion_leaf(session, seq.leaf_index) == leaf
        merkle.verify_inclusion(seq.leaf_index, seq.size, leaf, list(seq.proof), seq.root)
        assert seq.root == tlog.root_at(session, seq.size)


def test_a_group_of_streams_is_their_entries_chained_and_logged(store, tenants):
    acme, beta = tenants
    ids = [uuid.uuid4().hex for _ in range(6)]
    keys = [acme, beta, acme, acme, beta, acme]
    with store.transaction() as session:
        started = grouped.append_many(session, [(grouped.STARTED, _started(k, g)) for k, g in zip(keys, ids)])
    outputs = [[(7 * i + j) % 500 for j in range(40 + i)] for i in range(6)]
    with store.transaction() as session:
        done = grouped.append_many(session, [(grouped.FINISHED, _finished(k, g, t))
                                             for k, g, t in zip(keys, ids, outputs)])
    with store.transaction(write=False) as session:
        assert verify_chain(session).ok
        assert not audit_log(session, tlog.required_authority(session)).problems
        for entry, generation_id in zip(done, ids):
            assert entry.id == generation_id and entry.status == "finished" and entry.entries == 2
            assert get_generation(session, generation_id=generation_id, tenant_id=None) == entry
        assert [e.log.leaf_index for e in started + done] == list(range(started[0].log.leaf_index,
                                                                         started[0].log.leaf_index + 12))
        _check_logged(session, started + done)
        assert [e.seq for e in done if e.tenant_id == acme.tenant_id] == [5, 6, 7, 8]  # four starts, then these


def test_a_group_matches_the_single_writes(store, tenants):
    """The same writes one by one and in a group make the same entries (all but their
    ids, sequence numbers and hashes, which depend on where they land)."""
    acme, _ = tenants
    singles, group = [uuid.uuid4().hex for _ in range(3)], [uuid.uuid4().hex for _ in range(3)]
    tokens = [[3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610]] * 3
    with store.transaction() as session:
        one = [start_generation(session, **_started(acme, g)) for g in singles]
        one = [finish_generation(session, **_finished(acme, g, t)) for g, t in zip(singles, tokens)]
    with store.transaction() as session:
        grouped.append_many(session, [(grouped.STARTED, _started(acme, g)) for g in group])
    with store.transaction() as session:
        many = grouped.append_many(session, [(grouped.FINISHED, _finished(acme, g, t)) for g, t in zip(group, tokens)])
    skip = {"id", "ledger"}  # where they landed: seq and entry hash
    for a, b in zip(one, many):
        assert {k: v for k, v in a.to_dict().items() if k not in skip} == \
            {k: v for k, v in b.to_dict().items() if k not in skip}
        assert a.kgrams_sha256 == b.kgrams_sha256


def test_a_refused_write_in_a_group_fails_alone(store, tenants):
    """One write of the group would be refused (its generation is already finished): the
    group's append_many raises, every write runs alone, and only that one fails."""
    acme, _ = tenants
    ids = [uuid.uuid4().hex for _ in range(4)]
    with store.transaction() as session:
        grouped.append_many(session, [(grouped.STARTED, _started(acme, g)) for g in ids])
        finish_generation(session, **_finished(acme, ids[2], [1, 2, 3, 4, 5]))
    writes = GroupCommit(store, name="ledger")
    gate = threading.Event()
    writes.submit(lambda session: gate.wait(10))  # holds the thread: the writes below queue up together
    futures = []
    for g in ids:
        kwargs = _finished(acme, g, [9, 8, 7, 6, 5, 4])
        futures.append(writes.submit(lambda session, kw=kwargs: finish_generation(session, **kw),
                                     (grouped.append_many, (grouped.FINISHED, kwargs))))
    gate.set()
    with pytest.raises(InvalidInput, match="already finished"):
        futures[2].result(30)
    assert [f.result(30).status for i, f in enumerate(futures) if i != 2] == ["finished"] * 3
    assert writes.batched == 0  # the batch raised: its writes ran alone
    with store.transaction(write=False) as session:
        assert verify_chain(session).ok


def test_grouped_writes_run_as_one_batch(store, tenants):
    acme, _ = tenants
    writes = GroupCommit(store, name="ledger")
    gate = threading.Event()
    writes.submit(lambda session: gate.wait(10))
    ids = [uuid.uuid4().hex for _ in range(8)]
    futures = [writes.submit(lambda session, kw=_started(acme, g): start_generation(session, **kw),
                             (grouped.append_many, (grouped.STARTED, _started(acme, g)))) for g in ids]
    gate.set()
    assert [f.result(30).id for f in futures] == ids
    assert writes.batched == 8
    with store.transaction(write=False) as session:
        _check_logged(session, [f.result() for f in futures])
