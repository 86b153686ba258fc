"""The corpus-scan kernel against the CPU pass, bit for bit: through Triton's interpreter on
a CPU (every run, CI included) and on a CUDA device (``-m gpu``). No tolerance: every
statistic is an integer.

Shapes: context widths 1 to 16 (one to four Philox blocks), single and dual keys under every
p-value form, keys at the 2^32 / 2^63 / 2^64 edges, key counts that are no multiple of a
program's keys, texts of 0, 1 and tile +- 1 positions, and repetitive texts whose repeated
contexts are skipped (so the kernel sees only the scored positions of each).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
EDGE_KEYS = [0, 1, 2**32 - 1, 2**32, 2**32 + 5, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


def check(seed: int, device: str, widths=(1, 4, 6, 9, 16), tile: int = 64, keys_per_program=(1, 3)) -> int:
    """Kernel == compiled CPU pass (== numpy reference) on the shapes above; returns the
    number of launches checked. Raises AssertionError naming the first mismatch."""
    import torch

    from detector import screen
    from watermark import keyscan, keyscan_cpu
    from watermark.kernels import keyscan as kernel

    rng = np.random.default_rng(seed)
    checked = 0
    for width in widths:
        for form, dual in (("single", False), ("max", True), ("sidak", True)):
            texts = [np.array([], dtype=np.int64), np.array([5]), rng.integers(0, 3, tile + 1),
                     rng.integers(0, 2**32, tile - 1), rng.integers(0, 2**32, tile), rng.integers(0, 40, 2 * tile + 3)]
            contexts, tokens, offsets = keyscan.pack_positions(texts, width, skip_padded=width % 2 == 0)
            count = 7
            keys_a = rng.integers(0, 2**63, count).astype(np.uint64) * np.uint64(2) + np.uint64(1)
            # Indices, not the values: numpy may turn a list of ints up to 2^64 - 1 into floats,
            # which lose the edge keys (seen on numpy 2.5 as an invalid cast).
            edges = rng.choice(len(EDGE_KEYS), size=min(count, 4), replace=False)
            keys_a[: min(count, 4)] = [np.uint64(EDGE_KEYS[int(i)]) for i in edges]
            keys_b = rng.integers(0, 2**63, count).astype(np.uint64) * np.uint64(2) if dual else None
            tables = screen.scan_tables(form, float(rng.choice([0.0, 0.1, 0.5, 1.0])), int(np.diff(offsets).max()))
            expected = keyscan_cpu.scan_stats(keys_a, keys_b, contexts, tokens, offsets, tables)
            if width in widths[:2]:
                assert np.array_equal(expected, keyscan.scan_stats_reference(keys_a, keys_b, contexts, tokens,
                                                                             offsets, tables)), (seed, width, form)
            columns = torch.from_numpy(keyscan_cpu.context_columns(contexts).view(np.int32)).to(device)
            toks = torch.from_numpy((tokens & 0xFFFFFFFF).astype(np.uint32).view(np.int32)).to(device)
            offs = torch.from_numpy(offsets).to(device)
            dev = kernel.DeviceTables(tables, torch.device(device))
            a = torch.from_numpy(keys_a.view(np.int64)).to(device)
            b = None if keys_b is None else torch.from_numpy(keys_b.view(np.int64)).to(device)
            for keys in keys_per_program:
                got = kernel.scan_stats(a, b, columns, toks, offs, width, dev, keys_per_program=keys,
                                        block=tile).cpu().numpy()
                if not np.array_equal(got, expected):
                    t, k, stat = np.argwhere(got != expected)[0]
                    raise AssertionError(f"seed {seed}: width {width}, {form}, {keys} keys a program: text {t} key {k} "
                                         f"{keyscan.STATS[stat]} {got[t, k, stat]} != {expected[t, k, stat]}")
                checked += 1
    return checked


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")
def test_the_kernel_matches_the_cpu_pass_in_the_interpreter(seed):
    code = ("import sys; from tests.watermark.kernels.test_keyscan import check; "
            "print(check(int(sys.argv[1]), 'cpu', widths=(1, 6), tile=32, keys_per_program=(3,)))")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code, str(seed)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) == 6


@pytest.mark.gpu
def test_the_kernel_matches_the_cpu_pass_on_the_device(seed):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    assert check(seed, "cuda", widths=(1, 2, 3, 4, 5, 8, 9, 13, 16), tile=256, keys_per_program=(1, 4, 16)) == 81
