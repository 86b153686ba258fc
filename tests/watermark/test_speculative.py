"""Watermarked speculative sampling keeps the target distribution and the acceptance rate."""

import numpy as np
import pytest
import torch

from tests.stats_helpers import binomial_two_sided_p, chi_square_p, two_proportion_z
from watermark import dispatch, results, sampler, speculative, stream

P = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05])
Q = torch.tensor([0.10, 0.35, 0.15, 0.20, 0.05, 0.15])
K = 3
N = 30_000
WIDTH = 4


def _keys(gen, n):
    return torch.randint(-2**63, 2**63 - 1, (n,), generator=gen)


def _run(seed: int, *, watermark: bool, keyed_coin: bool, greedy: bool = False):
    gen = torch.Generator().manual_seed(seed)
    key_a, key_b, key_c, skeys = (_keys(gen, N) for _ in range(4))
    base = torch.randint(0, 6, (N, WIDTH), generator=gen).tolist()
    positions = torch.randint(0, 1000, (N,), generator=gen)
    wm = torch.full((N,), watermark)
    draft_logits = Q.log().expand(N, -1).clone()
    drafts = []
    for j in range(K):
        contexts = [tuple((base[i] + [d[i] for d in drafts])[-WIDTH:]) for i in range(N)]
        rows = sampler.SamplerRows(key_a=key_a, key_b=key_b, alpha=torch.zeros(N), contexts=contexts,
                                   watermark=wm, greedy=torch.full((N,), greedy), stream_keys=skeys,
                                   positions=positions + j)
        drafts.append(dispatch.sample(draft_logits, rows, lane=stream.LANE_DRAFT).tokens.tolist())
    draft_tokens = torch.tensor(drafts).T.contiguous()
    contexts = [speculative.block_contexts(base[i], draft_tokens[i].tolist()) for i in range(N)]
    rows = speculative.VerifyRows(
        key_b=key_b, key_coin=key_c, keyed_coin=torch.full((N,), keyed_coin), contexts=contexts,
        watermark=wm.unsqueeze(-1).expand(N, K + 1).clone(), greedy=torch.full((N,), greedy),
        stream_keys=skeys, positions=positions)
    return dispatch.verify(P.expand(N, K + 1, -1).clone(), Q.expand(N, K, -1).clone(), draft_tokens, rows)


ACCEPT = float(torch.minimum(P, Q).sum())


@pytest.mark.statistical
@pytest.mark.parametrize("keyed_coin", [False, True])
def test_emitted_tokens_follow_the_target(keyed_coin):
    result = _run(21 + keyed_coin, watermark=True, keyed_coin=keyed_coin)
    first = np.bincount(result.tokens[:, 0].numpy(), minlength=6)
    assert chi_square_p(first, P.numpy()) > 1e-3
    continued = result.num_accepted >= 1
    second = np.bincount(result.tokens[continued, 1].numpy(), minlength=6)
    assert chi_square_p(second, P.numpy()) > 1e-3


@pytest.mark.statistical
@pytest.mark.parametrize("keyed_coin", [False, True])
def test_acceptance_rate_equals_plain_speculative_sampling(keyed_coin):
    marked = _run(31 + keyed_coin, watermark=True, keyed_coin=keyed_coin)
    plain = _run(41 + keyed_coin, watermark=False, keyed_coin=keyed_coin)
    accepted_marked = int((marked.num_accepted >= 1).sum())
    accepted_plain = int((plain.num_accepted >= 1).sum())
    assert binomial_two_sided_p(accepted_marked, N, ACCEPT) > 1e-3
    assert two_proportion_z(accepted_marked, N, accepted_plain, N) > 1e-3
    # Whole blocks too: P(all K accepted) = ACCEPT ** K.
    assert binomial_two_sided_p(int((marked.num_accepted == K).sum()), N, ACCEPT ** K) > 1e-3


@pytest.mark.statistical
def test_chi_square_detects_a_biased_residual():
    result = _run(51, watermark=True, keyed_coin=False)
    biased = P.numpy().copy()
    biased[0] += 0.02
    biased[5] -= 0.02
    assert chi_square_p(np.bincount(result.tokens[:, 0].numpy(), minlength=6), biased) < 1e-6


def test_routes_and_layout():
    result = _run(61, watermark=True, keyed_coin=False)
    for row in range(200):
        n = int(result.num_accepted[row])
        routes = result.routes[row].tolist()
        assert routes[:n] == [results.ROUTE_KEY_A] * n
        assert routes[n] == results.ROUTE_KEY_B
        assert all(r == -1 for r in routes[n + 1:])
        assert all(t == -1 for t in result.tokens[row, n + 1:].tolist())


def test_greedy_rows_accept_only_the_target_argmax():
    result = _run(71, watermark=True, keyed_coin=False, greedy=True)
    assert (result.tokens[:, 0] == 0).all()  # argmax of P
    assert (result.routes[:, 0] == results.ROUTE_GREEDY).all()


def test_cpu_scalar_paths_equal_the_tensor_paths():
    """Coins and correction states: the plain-int CPU path against the tensor path."""
    gen = torch.Generator().manual_seed(9)
    batch, k = 40, 3
    rows = speculative.VerifyRows(
        key_b=_keys(gen, batch), key_coin=_keys(gen, batch), keyed_coin=torch.rand(batch, generator=gen) < 0.5,
        contexts=[[tuple(torch.randint(-1, 99, (1 + b % 9,), generator=gen).tolist()) for _ in range(k + 1)]
                  for b in range(batch)],
        watermark=torch.rand(batch, k + 1, generator=gen) < 0.8, greedy=torch.zeros(batch, dtype=torch.bool),
        stream_keys=_keys(gen, batch), positions=torch.randint(0, 2**40, (batch,), generator=gen))
    assert torch.equal(speculative.coin_values(rows, k), speculative.coin_values_torch(rows, k))
    at = torch.randint(0, k + 1, (batch,), generator=gen)
    wm = rows.watermark.gather(1, at.unsqueeze(-1)).squeeze(-1)
    keys = torch.where(wm, rows.key_b, rows.stream_keys)
    assert torch.equal(speculative.correction_states(rows, at, keys, wm),
                       speculative.correction_states_torch(rows, at, wm))
