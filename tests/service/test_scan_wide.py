"""The GPU scan (service.scan.gpu.GpuScanner) with 256-bit keys: hmac-sha256-philox-v1 groups
through their kernel (watermark.kernels.keyscan_hmac), vLLM's hmac-sha256-v1 groups through the
CPU words, both equal to the CPU pass. Imports nothing of the key store, so the GPU image (no
SQLAlchemy there) runs it too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from detector.detect import DetectorConfig
from detector.multikey import KeySet
from detector.result import Candidate
from tests.synthetic import generate, human_like
from watermark.key import WatermarkKey
from watermark.spec import WatermarkSpec

REPO = Path(__file__).resolve().parents[2]


def wide_scan_matches_cpu_words(device: str) -> int:
    """GpuScanner's statistics of 256-bit keys equal the CPU pass's (the PRF's compiled words
    into keyscan.scan_stats_from_words, detector.multikey's path). Returns the nonzero statistics."""
    from service.scan.gpu import GpuScanner

    keys = [WatermarkKey(2**255 + 3, WatermarkSpec(prf="hmac-sha256-philox-v1", algorithm="dual_key_gumbel")),
            WatermarkKey(2**200 + 5, WatermarkSpec(prf="hmac-sha256-philox-v1", context_width=7)),
            WatermarkKey(2**256 - 5, WatermarkSpec(prf="hmac_sha256"))]
    forms = [generate(keys[0], 40, seed=1)[0], human_like(30, seed=2), generate(keys[1], 25, seed=3)[0], []]
    scanner = GpuScanner(KeySet.of([Candidate.inline(k) for k in keys]), DetectorConfig(), device=device)
    got = scanner.stats(forms)
    scanner.keys = [None if p.group.wide is not None else k for p, k in zip(scanner.plans, scanner.keys)]
    want = scanner.stats(forms)
    assert all(np.array_equal(g, w) for g, w in zip(got, want)), (got, want)
    return int(sum(np.count_nonzero(g) for g in got))


def test_the_gpu_scan_of_256_bit_keys_in_the_interpreter():
    pytest.importorskip("triton")
    code = "from tests.service.test_scan_wide import wide_scan_matches_cpu_words as f; print(f('interpret'))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO),
                               "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 0


@pytest.mark.gpu
def test_the_gpu_scan_of_256_bit_keys_on_the_device():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    assert wide_scan_matches_cpu_words("cuda") > 0
