"""A `diverse` key through the vLLM plugin: the salt travels as ``hallmark_salt`` beside the
key (sealed or keyring), the plugin salts the secret itself, and picks exactly Hallmark's
token under the salted key; a salt is required for a diverse key and refused otherwise."""

from __future__ import annotations

import pytest
import torch

from service.engines.vllm import keyring as keyring_file
from service.engines.vllm import watermark_args
from tests.service.test_vllm_plugin import KEY_A, expected_tokens, noisy_logits, params, transport_key  # noqa: F401
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

pytestmark = pytest.mark.vllm

DIVERSE = WatermarkKey(secret=0xD1E5_0000_0000_0024, spec=WatermarkSpec(algorithm="dual_key_gumbel", mode="diverse"))


def test_the_plugin_picks_hallmarks_token_under_the_salted_key(transport_key: bytes) -> None:  # noqa: F811
    from vllm.v1.sample.logits_processor import BatchUpdate

    from service.engines.vllm.logits_processor import HallmarkLogitsProcessor

    salted = DIVERSE.with_salt(9)
    args = watermark_args.sealed_args("d", salted, 4, transport_key)
    assert args[watermark_args.SALT] == 9
    resolved = watermark_args.resolve(args)
    assert resolved.key == salted and resolved.key.prf_secret != DIVERSE.secret
    plugin = HallmarkLogitsProcessor(None, torch.device("cpu"), False)
    requests = [dict(key=salted, seed=4, params=params(salted, "d", 4, transport_key, temperature=1.0)),
                dict(key=KEY_A, seed=1, params=params(KEY_A, "a", 1, transport_key, temperature=1.0))]
    for index, request in enumerate(requests):
        request.update(prompt=[index, 5, 6], output=[])
    plugin.update_state(BatchUpdate(batch_size=2, removed=[], moved=[],
                                    added=[(i, r["params"], r["prompt"], r["output"]) for i, r in enumerate(requests)]))
    generator = torch.Generator().manual_seed(3)
    unsalted = dict(requests[0], key=DIVERSE)
    differs = False
    for step in range(30):
        logits = noisy_logits(generator, 2)
        want = expected_tokens(logits.clone(), requests)
        got = torch.isfinite(plugin.apply(logits.clone())).float().argmax(dim=1)
        assert torch.equal(got, want.tokens), f"step {step}"
        differs |= int(expected_tokens(logits.clone(), [unsalted]).tokens[0]) != int(got[0])
        for request, token in zip(requests, got.tolist()):
            request["output"].append(token)
    assert differs  # the salt matters: the unsalted key would have picked other tokens


def test_a_salt_is_required_for_a_diverse_key_and_refused_otherwise(tmp_path, monkeypatch,
                                                                    transport_key: bytes) -> None:  # noqa: F811
    with pytest.raises(watermark_args.WatermarkArgsError, match="needs 'hallmark_salt'"):
        watermark_args.resolve(watermark_args.sealed_args("d", DIVERSE, 4, transport_key))
    with pytest.raises(watermark_args.WatermarkArgsError, match="only for a key in mode 'diverse'"):
        watermark_args.resolve({**watermark_args.sealed_args("a", KEY_A, 4, transport_key), watermark_args.SALT: 1})
    bad = {**watermark_args.sealed_args("d", DIVERSE.with_salt(1), 4, transport_key), watermark_args.SALT: 16}
    with pytest.raises(watermark_args.WatermarkArgsError, match="hallmark_salt"):
        watermark_args.resolve(bad)
    # Remote mode: the keyring holds the key; the request names the salt.
    path = tmp_path / "keyring.json"
    keyring_file.write_keyring(path, [keyring_file.KeyringEntry("d", "acme", 1, DIVERSE.fingerprint, DIVERSE)])
    monkeypatch.setenv(keyring_file.KEYRING_ENV, str(path))
    args = watermark_args.reference_args("d", 4, 11)
    assert watermark_args.resolve(args).key == DIVERSE.with_salt(11)


def test_diverse_rows_keep_their_own_salt_through_batch_churn(transport_key: bytes) -> None:  # noqa: F811
    """Issue 30 (C): under a `diverse` key, 2 of 16 batched plugin generations scored weakly
    while their siblings scored 10^-87 and below. Whatever the batch does (requests finishing
    at different steps, vLLM condensing its rows by moving the last into the hole, a new
    request taking a freed row, two rows swapping), every token the plugin emits is Hallmark's
    token under that request's own salted key (a `head`-diverse request alongside: its first w
    tokens from its stream). So a weak score is the text's (repeated contexts drawn from the
    ordinary stream, an early end), not a row given another request's salt:
    bench/results/vllm-diverse-batch.json measures which."""
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from service.engines.vllm.logits_processor import HallmarkLogitsProcessor

    head = WatermarkKey(secret=0x4EAD_0000_0000_0030,
                        spec=WatermarkSpec(mode="diverse", diversity="head", dedup="all"))
    plugin = HallmarkLogitsProcessor(None, torch.device("cpu"), False)

    def request(i: int) -> dict:
        key = DIVERSE.with_salt(i % 16) if i % 5 else head
        return dict(key=key, seed=100 + i, prompt=[i % 4, 5, 6], output=[], steps=8 + (7 * i) % 13,
                    params=params(key, f"k{i}", 100 + i, transport_key, temperature=1.0))

    rows: list[dict | None] = [request(i) for i in range(8)]
    plugin.update_state(BatchUpdate(batch_size=8, removed=[], moved=[],
                                    added=[(i, r["params"], r["prompt"], r["output"]) for i, r in enumerate(rows)]))
    generator = torch.Generator().manual_seed(30)
    started, finished = 8, []
    for step in range(60):
        live = [r for r in rows if r is not None]
        if not live:
            break
        logits = noisy_logits(generator, len(rows))
        want = expected_tokens(logits.clone()[[i for i, r in enumerate(rows) if r is not None]], live)
        got = torch.isfinite(plugin.apply(logits.clone())).float().argmax(dim=1)
        got = got[[i for i, r in enumerate(rows) if r is not None]]
        assert torch.equal(got, want.tokens), f"step {step}"
        for r, token in zip(live, got.tolist()):
            r["output"].append(token)
        # As vLLM's InputBatch: finished requests leave (holes); a new request takes the
        # lowest hole (so that index is added, not removed); the batch is condensed by moving
        # its last row into each remaining hole; now and then two rows swap.
        holes = sorted(i for i, r in enumerate(rows) if r is not None and len(r["output"]) >= r["steps"])
        moved, added = [], []
        for i in holes:
            finished.append(rows[i])
            rows[i] = None
        if holes and started < 24:
            new = request(started)
            started += 1
            hole = holes.pop(0)
            added.append((hole, new["params"], new["prompt"], new["output"]))
            rows[hole] = new
        removed = list(holes)
        for hole in holes:
            last = max((i for i, r in enumerate(rows) if r is not None), default=-1)
            if last > hole:
                moved.append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
                rows[hole], rows[last] = rows[last], None
        while rows and rows[-1] is None:
            rows.pop()
        if step % 9 == 4 and len(rows) >= 2 and rows[0] is not None and rows[-1] is not None:
            moved.append((0, len(rows) - 1, MoveDirectionality.SWAP))
            rows[0], rows[-1] = rows[-1], rows[0]
        if removed or moved or added:
            plugin.update_state(BatchUpdate(batch_size=len(rows), removed=removed, moved=moved, added=added))
    assert len(finished) >= 16 and {r["key"].salt for r in finished} >= set(range(1, 5))
