"""GPU hashed dedup makes exactly ContextDeduper's decisions."""

from __future__ import annotations

import pytest

from tests.watermark.kernels import parity


def test_constants_mirror_the_reference():
    """watermark.kernels.dedup keeps copies (the GPU image lacks pydantic): they must agree."""
    pytest.importorskip("pydantic")
    pytest.importorskip("triton")
    from watermark import dedup, spec
    from watermark.kernels import dedup as kernels

    assert kernels.PAD == dedup.PAD
    assert kernels.SCOPES == spec.DEDUP_SCOPES
    assert kernels.MAX_WIDTH == spec.MAX_CONTEXT_WIDTH


@pytest.mark.gpu
@pytest.mark.parametrize("repeat", range(3))
def test_gpu_dedup_matches_context_deduper(seed, cuda, repeat):
    parity.check_dedup(seed + repeat, cuda, requests=24, steps=400, k=4)


@pytest.mark.gpu
def test_dedup_step_matches_append_and_query(seed, cuda):
    parity.check_dedup_step(seed, cuda)
