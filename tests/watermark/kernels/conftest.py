"""Fixtures of the kernel parity tests: a fresh seed per test, reported on failure."""

from __future__ import annotations

import secrets

import pytest


@pytest.fixture
def seed(request) -> int:
    """A new seed every run (the parity checks name it in their failure messages)."""
    value = secrets.randbits(31)
    request.node.user_properties.append(("seed", value))
    return value


@pytest.fixture(scope="module")
def cuda():
    import torch

    return torch.device("cuda")
