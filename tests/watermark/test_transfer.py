"""Host values to device tensors (watermark/transfer.py): the same values and dtypes as
torch.tensor, on the CPU and, asynchronously, on CUDA."""

from __future__ import annotations

import pytest
import torch

from watermark.transfer import host_tensor, to_device


@pytest.mark.parametrize("values,dtype", [([1, -2, 2**62], torch.int64), ([True, False], torch.bool),
                                          ([[0.5, 1.0], [2.0, 3.0]], torch.float32)])
def test_host_tensor_equals_torch_tensor_on_cpu(values, dtype):
    out = host_tensor(values, dtype, "cpu")
    assert out.dtype == dtype and out.device.type == "cpu"
    assert torch.equal(out, torch.tensor(values, dtype=dtype))


@pytest.mark.gpu
def test_host_tensor_arrives_on_cuda_in_stream_order():
    # Queue GPU work, then copies; reading on the same stream sees the copied values.
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(5):
        big = big @ big / 64
    outs = [host_tensor([i, i + 1, 2**40 + i], torch.int64, "cuda") for i in range(100)]
    assert all(o.device.type == "cuda" for o in outs)
    assert [o.tolist() for o in outs] == [[i, i + 1, 2**40 + i] for i in range(100)]
    same = torch.ones(3, device="cuda")
    assert to_device(same, "cuda") is same
