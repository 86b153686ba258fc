"""Each request's tokens (and text, finish reason, route counts) are the ones recorded
before the engine's host path was rebuilt (issue 33): vectors/cpu.json was written by main
fdd8296 on the CPU; vectors/gpu-*.json by the same commit on a GPU (bench/engine_profile.py
--parity-out). The request set covers every engine path (parity.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from service.engines.local.engine import LocalEngine
from tests.service.engine_models import TEST_DRAFT, TEST_MODEL
from tests.service.engines.local.parity import run_parity

VECTORS = Path(__file__).parent / "vectors"


def _recorded(name: str) -> dict:
    return json.loads((VECTORS / name).read_text())


def _outputs(recorded: dict, max_batch: int = 16, **engine) -> list[dict]:
    async def go():
        local = LocalEngine(TEST_MODEL, TEST_DRAFT, max_batch=max_batch, speculative_k=4, **engine)
        await local.start()
        try:
            return await run_parity(local, recorded["tokens"], recorded["extra_dual"])
        finally:
            await local.stop()

    return asyncio.run(go())


def _assert_same(got: list[dict], recorded: dict) -> None:
    for i, (new, old) in enumerate(zip(got, recorded["outputs"])):
        first = next((j for j, (a, b) in enumerate(zip(new["token_ids"], old["token_ids"])) if a != b), None)
        assert new == old, f"request {i}: first differing token {first}"
    assert len(got) == len(recorded["outputs"])


@pytest.mark.slow
@pytest.mark.parametrize("engine", [
    dict(device="cpu"),  # transformers' forward, scheduler.speculative_step
    dict(device="cpu", static_cache=True, speculative_blocks=True),  # the CUDA path's block function, eagerly
    dict(device="cpu", static_cache=True, speculative_blocks=True, streamer_thread=True),  # text on its thread
], ids=["dynamic", "blocks", "blocks-streamer-thread"])
def test_cpu_tokens_equal_the_recorded_ones(engine):
    _assert_same(_outputs(_recorded("cpu.json"), **engine), _recorded("cpu.json"))


@pytest.mark.gpu
def test_gpu_tokens_equal_the_recorded_ones():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (none found)")
    name = torch.cuda.get_device_name(0)
    files = sorted(VECTORS.glob("gpu-*.json"))
    recorded = [r for r in (_recorded(f.name) for f in files) if name in r["recorded"]]
    if not recorded:
        pytest.skip(f"no GPU vectors recorded on a {name} (recorded: {[f.name for f in files]})")
    _assert_same(_outputs(recorded[0], max_batch=64, device="cuda"), recorded[0])
