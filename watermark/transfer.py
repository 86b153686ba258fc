"""Host values to device tensors without a stream synchronisation.

``torch.tensor(values, device="cuda")`` copies from pageable memory and then waits for the
stream: every per-step row parameter built that way drains the GPU queue (the local engine
did about a hundred such waits per speculative step). Built on the host, pinned and copied
with ``non_blocking=True`` instead, the copy is queued behind the work already on the
stream (the caching host allocator keeps the pinned block until the copy has run).
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on ``device`` (an asynchronous copy for CUDA; unchanged elsewhere)."""
    device = torch.device(device)
    if tensor.device == device or (device.type == "cuda" and tensor.device.type == "cuda"
                                   and device.index is None):
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def host_tensor(values, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """``torch.tensor(values, dtype=dtype)`` on ``device``, without waiting for the stream."""
    return to_device(torch.tensor(values, dtype=dtype), device)


def to_host(tensor: torch.Tensor) -> list:
    """``tensor.tolist()`` with one wait for the stream: a CUDA tensor is copied into pinned
    memory behind the queued work and read once that copy's event has completed (the
    engine's one host synchronisation per step)."""
    if tensor.device.type != "cuda":
        return tensor.tolist()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(tensor.device))
    done.synchronize()
    return host.tolist()
