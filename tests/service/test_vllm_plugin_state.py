"""The plugin's Triton path (used on CUDA) gives the CPU path's tokens, checked on the CPU
through Triton's interpreter (plugin_state_checks.py, in a subprocess: the variable must be
set before the kernels are imported)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None or importlib.util.find_spec("numba") is None,
                    reason="needs triton (interpreter) and numba")
@pytest.mark.parametrize("seed", [0, 20261202])
def test_kernel_path_matches_cpu_path(seed):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "-m", "tests.service.plugin_state_checks", str(seed)], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
