"""Deployment profiles: a vLLM deployment described in YAML (``deploy/*.yaml``).

A profile names the model, the hardware, the watermark mode and the ``vllm serve``
options, and :func:`launch_commands` turns it into the exact command per node. Options
are written as vLLM's own ``--config`` YAML writes them (names without ``--``; ``true``
for a flag, ``false`` for its ``--no-`` form, a mapping for a JSON option), so what is
validated is what runs. Key material never appears in a profile: the engine-key mode
passes a 0600 ``--config`` file, the plugin mode a 0600 keyring file in the environment.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.engines.vllm.keyring import KEYRING_ENV
from service.engines.vllm import PLUGIN
from service.engines.vllm.watermark_args import REQUIRE_ENV
from watermark.validation import error_lines

WatermarkMode = Literal["engine-key", "plugin"]
PROFILE_DIR = Path(__file__).resolve().parents[3] / "deploy"
# Options a profile may not set itself: the mode decides them, or they would carry a key.
_MODE_OPTIONS = ("watermark-config", "config", "logits-processors")


class ProfileError(ValueError):
    """A profile that cannot be read; the message says what to fix."""


class Hardware(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: str
    """GPU model, e.g. ``H200``."""
    gpu_memory_gib: float = Field(gt=0)
    """Memory per GPU as the driver reports it."""
    gpus_per_node: int = Field(ge=1)
    nodes: int = Field(default=1, ge=1)


class ModelFacts(BaseModel):
    """What the offline check needs to know about the model (vLLM reads it from the
    checkpoint's config.json, which the check does not download)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attention_heads: int = Field(ge=1)
    use_mla: bool = False
    sparse_mla: bool = False
    """Has DeepSeek Sparse Attention's lightning indexer (``index_topk`` in its config)."""
    mtp_layers: int = Field(default=0, ge=0)
    """``num_nextn_predict_layers``: MTP modules shipped with the checkpoint."""


class Profile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    model: str
    """The model as ``vllm serve`` takes it (a Hugging Face id or a path on the nodes)."""
    watermark: WatermarkMode
    """``engine-key``: vLLM's dual_key_gumbel under the engine key (speculation allowed).
    ``plugin``: Hallmark's per-request-key plugin (no speculation)."""
    hardware: Hardware
    model_facts: ModelFacts
    engine_key_file: str | None = None
    """engine-key mode: the 0600 ``--config`` file on every node (``hallmark deploy engine-key``)."""
    keyring_file: str | None = None
    """plugin mode: the 0600 keyring file on the server (``hallmark deploy keyring``)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """``vllm serve`` options shared by every node."""
    nodes: list[dict[str, Any]] = Field(default_factory=lambda: [{}])
    """Per-node options, indexed by node rank (one entry per node)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of ``vllm serve`` (no secrets; see ``secret_env``)."""
    secret_env: list[str] = Field(default_factory=list)
    """Variables the operator must set from a secret store (e.g. ``VLLM_API_KEY``)."""

    @model_validator(mode="after")
    def _consistent(self) -> "Profile":
        if len(self.nodes) != self.hardware.nodes:
            raise ValueError(f"'nodes' lists {len(self.nodes)} node(s) but hardware.nodes is {self.hardware.nodes}")
        for options in [self.args, *self.nodes]:
            for name in options:
                if name.startswith("-") or "_" in name:
                    raise ValueError(f"write option {name!r} as vLLM's --config file does: "
                                     f"{name.lstrip('-').replace('_', '-')!r}")
                if name in _MODE_OPTIONS:
                    raise ValueError(f"option {name!r} is set by the watermark mode; remove it from the profile")
        if self.watermark == "engine-key" and not self.engine_key_file:
            raise ValueError("watermark 'engine-key' needs engine_key_file (the --config file on the nodes)")
        if self.watermark == "plugin" and not self.keyring_file:
            raise ValueError("watermark 'plugin' needs keyring_file (the plugin's keyring on the server)")
        if self.engine_key_file and not self.engine_key_file.endswith((".yaml", ".yml")):
            raise ValueError("engine_key_file must end in .yaml or .yml (vLLM's --config rule)")
        return self

    def node_options(self, rank: int) -> dict[str, Any]:
        return {**self.args, **self.nodes[rank]}

    def environment(self) -> dict[str, str]:
        env = dict(self.env)
        if self.watermark == "plugin":
            env[KEYRING_ENV] = self.keyring_file or ""
            env.setdefault(REQUIRE_ENV, "1")
        return env


def find_profile(name_or_path: str) -> Path:
    """A profile file: a path, or a name in ``deploy/`` (``dsv32-h200x8`` or ``dsv32-h200x8.yaml``)."""
    candidate = Path(name_or_path)
    if candidate.is_file():
        return candidate
    for path in (PROFILE_DIR / name_or_path, PROFILE_DIR / f"{name_or_path}.yaml"):
        if path.is_file():
            return path
    known = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))) or "none"
    raise ProfileError(f"no profile {name_or_path!r}: give a YAML file or one of: {known}")


def load_profile(name_or_path: str) -> Profile:
    path = find_profile(name_or_path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path} is not valid YAML: {exc}") from None
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(error_lines(exc, default="profile"))
        raise ProfileError(f"{path}: {problems}") from None


def options_to_argv(options: dict[str, Any]) -> list[str]:
    """vLLM's ``load_config_file`` rules: ``true`` -> ``--name``; ``false`` -> ``--no-name``
    (stricter than vLLM, which drops a ``false`` it cannot negate: here the parser then
    rejects it, so a profile never holds a setting that silently does nothing); a list ->
    ``--name a b``; a mapping -> ``--name <json>``."""
    argv: list[str] = []
    for name, value in options.items():
        flag = f"--{name}"
        if isinstance(value, bool):
            argv.append(flag if value else f"--no-{name}")
        elif isinstance(value, list):
            argv += [flag, *(str(item) for item in value)]
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value, separators=(",", ":"))]
        elif value is None:
            continue
        else:
            argv += [flag, str(value)]
    return argv


def node_argv(profile: Profile, rank: int, key_file: str | None = None) -> list[str]:
    """``vllm serve`` arguments (after the sub-command) of node ``rank``."""
    argv = [profile.model, *options_to_argv(profile.node_options(rank))]
    if profile.watermark == "plugin":
        argv += ["--logits-processors", PLUGIN]
    else:
        argv += ["--config", key_file or profile.engine_key_file or ""]
    return argv


def launch_commands(profile: Profile) -> list[str]:
    """The shell command that starts each node, rank 0 first."""
    env = " ".join(f"{name}={shlex.quote(value)}" for name, value in profile.environment().items())
    prefix = f"{env} " if env else ""
    return [prefix + shlex.join(["vllm", "serve", *node_argv(profile, rank)])
            for rank in range(profile.hardware.nodes)]
