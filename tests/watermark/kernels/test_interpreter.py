"""The kernels' logic on the CPU: parity checks through Triton's interpreter.

CI has no GPU, so this runs the same checks as the GPU tests on small shapes with
TRITON_INTERPRET=1 (numpy), in a subprocess because the variable must be set before the
kernels are decorated. The interpreter uses exact logarithms where the device uses its
fast approximations, and runs programs one after another, so device-only behaviour
(approximation error, races between programs) is covered by the GPU tests.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="triton is not installed (the vllm extra brings it); kernels not checked")
def test_kernels_match_references_in_the_interpreter(seed):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONWARNINGS="ignore")
    result = subprocess.run([sys.executable, "-m", "tests.watermark.kernels.interpreter_checks", str(seed)],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    summary = result.stdout[-4000:] + result.stderr[-4000:]
    assert result.returncode == 0, summary
