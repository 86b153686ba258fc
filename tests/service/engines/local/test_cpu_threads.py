"""The local engine's intra-op threads on the CPU: one for small models, else torch's
default, unless asked for explicitly."""

from __future__ import annotations

import pytest
import torch

from service.engines.local import engine


def test_small_models_take_one_thread_and_requests_are_honoured():
    small = torch.nn.Linear(4, 4)
    assert engine._cpu_threads(small, None) == 1  # noqa: SLF001
    assert engine._cpu_threads(small, 3) == 3  # noqa: SLF001
    with pytest.raises(ValueError, match="at least 1"):
        engine._cpu_threads(small, 0)  # noqa: SLF001
