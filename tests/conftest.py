"""Shared test configuration: markers that skip with a reason, and statistics helpers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# A copy of shared/golden lives in tests/data so that a clean clone tests against it.
GOLDEN = Path(os.environ.get("HALLMARK_GOLDEN_DIR", REPO / "tests" / "data"))


def _load_golden(name: str):
    path = GOLDEN / name
    if not path.exists():
        pytest.skip(f"golden file {path} not present (set HALLMARK_GOLDEN_DIR)")
    return json.loads(path.read_text())


@pytest.fixture(scope="session")
def philox_golden():
    return _load_golden("philox4x32-10-v1.json")


@pytest.fixture(scope="session")
def vllm_sequences():
    return _load_golden("vllm-0.32-watermarked-sequences.json")


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (none found); runs on the H200")
    for item in items:
        # The marker, not item.keywords: keywords also hold path parts (a checkout named "gpu").
        if item.get_closest_marker("gpu") is not None and not has_cuda:
            item.add_marker(skip_gpu)
