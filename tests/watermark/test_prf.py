import numpy as np
import pytest
import torch

from watermark import prf
from watermark.prf import philox, philox_torch


def test_version_string():
    assert philox.VERSION == "philox4x32-10-v1"
    assert prf.lookup("philox").version == philox.VERSION
    assert prf.lookup(philox.VERSION) is prf.lookup("philox")
    assert prf.DEFAULT == philox.VERSION


def test_golden_words_and_uniforms_numpy_and_torch(philox_golden):
    assert philox_golden["prf"] == philox.VERSION
    for case in philox_golden["cases"]:
        key = int(case["key"])
        tokens = np.array(case["tokens"])
        contexts = np.array([case["context"]] * len(tokens))
        words = philox.words_numpy(key, contexts, tokens)
        assert [int(w) for w in words] == case["words"], case["key"]
        expected_u = np.array(case["uniforms"], dtype=np.float32)
        assert np.array_equal(philox.uniforms_from_words_numpy(words), expected_u)
        torch_words = philox_torch.words_torch(philox_torch.keys_tensor([key]), torch.tensor([case["context"]]),
                                      torch.tensor(case["tokens"]))[0]
        assert torch_words.tolist() == case["words"]
        assert np.array_equal(philox_torch.uniforms_from_words_torch(torch_words).numpy(), expected_u)


def test_golden_derived_keys(philox_golden):
    for row in philox_golden["derived_keys"]:
        key = int(row["key"])
        assert prf.derive_key(key, "key_a") == int(row["key_a"])
        assert prf.derive_key(key, b"key_b") == int(row["key_b"])


def test_torch_matches_numpy_on_random_inputs_all_widths():
    rng = np.random.default_rng(7)
    for width in range(1, 17):
        batch = 5
        keys = [int(k) for k in rng.integers(0, 2**63, batch, dtype=np.uint64)] + [2**64 - 1, 2**32, 2**32 - 1]
        batch = len(keys)
        contexts = rng.integers(-1, 2**31, (batch, width))
        tokens = rng.integers(0, 300_000, 37)
        got = philox_torch.words_torch(philox_torch.keys_tensor(keys), torch.from_numpy(contexts), torch.from_numpy(tokens))
        for row, key in enumerate(keys):
            expected = philox.words_numpy(key, np.repeat(contexts[row:row + 1], len(tokens), 0), tokens)
            assert got[row].tolist() == [int(w) for w in expected]


def test_mixed_width_states_equal_per_width_states():
    keys = philox_torch.keys_tensor([3, 2**64 - 5, 2**40 + 1])
    contexts = [(1, 2), (5, 6, 7, 8, 9), (-1,)]
    states = philox_torch.context_states_torch(keys, contexts)
    for row, ctx in enumerate(contexts):
        single = torch.stack(philox_torch.context_state_torch(keys[row:row + 1], torch.tensor([ctx])), -1)
        assert torch.equal(states[row], single[0])


def test_uniforms_never_reach_zero_or_one():
    words = np.array([0, 255, 2**32 - 1, 2**32 - 256], dtype=np.uint64)
    u = philox.uniforms_from_words_numpy(words)
    assert (u > 0).all() and (u < 1).all()


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, "7", True])
def test_key_range_is_checked(bad):
    with pytest.raises(ValueError, match="64"):
        prf.check_key(bad)


def test_prf_holds_no_key():
    # The implementation takes keys per call: nothing secret lives in it or its repr.
    assert repr(prf.lookup("philox")) == "Philox(version='philox4x32-10-v1')"


def test_lookup_of_an_unknown_prf_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown prf: 'xorshift'; expected one of"):
        prf.lookup("xorshift")


def test_interface_matches_the_numpy_functions(philox_golden):
    impl = prf.lookup("philox")
    for case in philox_golden["cases"]:
        key = int(case["key"])
        tokens = np.array(case["tokens"])
        contexts = np.array([case["context"]] * len(tokens))
        assert [int(w) for w in impl.words(np.uint64(key), contexts, tokens)] == case["words"]
        per_row = impl.uniforms(np.full(len(tokens), key, dtype=np.uint64), contexts, tokens)
        assert np.array_equal(per_row, np.array(case["uniforms"], dtype=np.float32))


def test_every_name_looks_up_its_version():
    for name, version in prf.NAMES.items():
        assert prf.lookup(name).version == version == prf.canonical_name(name)
