"""The batch-invariant attention kernels (service/engines/local/model/attention.py) and the
MoE's row-invariant products (model/matmul.py): parity
with their torch references and bit-identical results for a row whatever its batch, its
window and its row's other queries; on the H200 (float32 and bfloat16) and on the CPU
through Triton's interpreter (float32; the interpreter runs programs one by one, so only
the GPU test says anything about the device's own arithmetic)."""

from __future__ import annotations

import importlib.util
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.service.engines.local.model import attention_checks as checks

REPO = Path(__file__).resolve().parents[5]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@needs_triton
def test_kernels_in_the_interpreter():
    seed = secrets.randbits(31)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "-m", "tests.service.engines.local.model.attention_checks", str(seed)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"seed {seed}: " + result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [dict(heads=4, groups=1, dim=64, dim2=16, dim_v=64),  # the bundled MLA, absorbed
                                   dict(heads=3, groups=1, dim=64, dim2=0, dim_v=64),  # the bundled Llama draft
                                   dict(heads=8, groups=2, dim=32, dim2=0, dim_v=16)])
def test_attention_on_cuda(dtype, shape):
    seed = secrets.randbits(31)
    cuda = torch.device("cuda")
    checks.check_attention(seed, cuda, dtype, **shape)
    checks.check_attention_invariance(seed + 1, cuda, dtype, **shape)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_index_scores_on_cuda(dtype):
    checks.check_index_scores(secrets.randbits(31), torch.device("cuda"), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_linear_on_cuda(dtype):
    checks.check_batched_linear(secrets.randbits(31), torch.device("cuda"), dtype)
