"""The 256-bit kernels compile for an H100/H200 (sm_90) in seconds, without a GPU: Triton's
ahead-of-time compile with the ptxas it ships. With SHA-256's 64 rounds unrolled, the rows' HMAC
kernel was still compiling after 10 minutes here, and the first H100 run lost its 256-bit stages
to that (main 9d1098a); the rounds are a run-time loop since. The bound is generous (a loaded
CI box); a re-unrolled compression blows through it."""

from __future__ import annotations

import importlib.util
import time

import pytest

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")]

BOUND_S = 120.0


@pytest.fixture(autouse=True)
def _cold_cache(tmp_path, monkeypatch):
    """An empty Triton cache: a compile, not a look-up, is what is timed."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))


def _compile(fn, signature: dict, constexprs: dict, options: dict | None = None) -> float:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for name in constexprs:
        signature[name] = "constexpr"
    start = time.perf_counter()
    try:
        triton.compile(ASTSource(fn, signature, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                       options=options or {})
    except (RuntimeError, FileNotFoundError) as error:  # no ptxas for this Triton on this machine
        if "ptxas" in str(error).lower():
            pytest.skip(f"no ptxas here: {error}")
        raise
    return time.perf_counter() - start


def test_the_rows_hmac_kernel_compiles_in_seconds():
    from watermark.kernels.hmac import ROWS, _hmac_rows_kernel

    seconds = _compile(_hmac_rows_kernel, {"k_ptr": "*i32", "mids_a_ptr": "*i64", "mids_b_ptr": "*i64",
                                           "ctx_ptr": "*i64", "ctx_stride": "i64", "width_ptr": "*i32",
                                           "batch": "i32", "keys_ptr": "*i64", "states_ptr": "*i64"},
                       {"ROWS_PER": ROWS})
    assert seconds < BOUND_S, seconds


def test_the_samplers_routed_hmac_kernel_compiles_in_seconds():
    from watermark.kernels.hmac import ROWS, _hmac_routed_kernel

    seconds = _compile(_hmac_routed_kernel, {"k_ptr": "*i32", "mids_a_ptr": "*i64", "mids_b_ptr": "*i64",
                                             "ctx_ptr": "*i64", "ctx_stride": "i64", "width_ptr": "*i32",
                                             "alpha_ptr": "*fp32", "wm_ptr": "*i8", "skey_ptr": "*i64",
                                             "pos_ptr": "*i64", "batch": "i32", "keys_ptr": "*i64",
                                             "states_ptr": "*i64"},
                       {"ROWS_PER": ROWS})
    assert seconds < BOUND_S, seconds


def test_the_256_bit_scan_kernel_compiles_in_seconds():
    from watermark import keyscan
    from watermark.kernels.keyscan_hmac import _keyscan_hmac_kernel

    seconds = _compile(_keyscan_hmac_kernel, {
        "k_ptr": "*i32", "mids_ptr": "*i64", "cols": "*i32", "toks": "*i32", "offsets_ptr": "*i64",
        "out_ptr": "*i64", "chord_ptr": "*i64", "levels_ptr": "*u8", "gof_ptr": "*i64", "xlnx_ptr": "*i64",
        "count": "i32", "key_count": "i32", "width": "i32", "level_count": "i32"},
        {"DUAL": True, "KEYS": 4, "BLOCK": 128, "CHORD_BUCKETS": keyscan.CHORD_BUCKETS,
         "LEVEL_BUCKETS": keyscan.LEVEL_BUCKETS})
    assert seconds < BOUND_S, seconds


def test_the_256_bit_verification_kernel_compiles():
    from watermark.kernels.hmac_verify import _ARGS, _verify_hmac_kernel
    from watermark.kernels.speculative import VERIFY_CONFIG, compile_time_args

    pointers = {"p_ptr": "*fp32", "q_ptr": "*fp32", "x_ptr": "*i64", "key_b_ptr": "*i64", "key_coin_ptr": "*i64",
                "keyed_ptr": "*i8", "ctx_ptr": "*i64", "width_ptr": "*i32", "wm_ptr": "*i8", "greedy_ptr": "*i8",
                "skey_ptr": "*i64", "pos_ptr": "*i64", "wide_ptr": "*i8", "hkeys_ptr": "*i64", "hstates_ptr": "*i64",
                "tokens_ptr": "*i64", "nacc_ptr": "*i64", "routes_ptr": "*i8", "part_s_ptr": "*fp32",
                "part_i_ptr": "*i32", "count_ptr": "*i32"}
    signature = {a: pointers.get(a, "i64" if a in ("ctx_sb", "ctx_sj") else "i32") for a in _ARGS}
    constexprs, options = compile_time_args(VERIFY_CONFIG, 16)
    assert _compile(_verify_hmac_kernel, signature, constexprs, options) < BOUND_S
