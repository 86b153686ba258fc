"""Model names: the bundled models (shipped under ``service/engines/assets``) and how a
name resolves to a directory. A leaf module, so that tokenizers (detection) and engines
(generation) both use it without one importing the other."""

from __future__ import annotations

from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "engines" / "assets"
BUNDLED_TARGET = "hallmark-tiny-dsv32"
BUNDLED_DRAFT = "hallmark-tiny-draft"
BUNDLED_MODELS = {"bundled": BUNDLED_TARGET, BUNDLED_TARGET: BUNDLED_TARGET, BUNDLED_DRAFT: BUNDLED_DRAFT}


def resolve_model_path(name: str) -> str:
    """A bundled model's directory for its name ('bundled' is the default target), else
    the name itself (a local path or a Hugging Face id already in the local cache)."""
    if name in BUNDLED_MODELS:
        return str(ASSETS / BUNDLED_MODELS[name])
    return name
