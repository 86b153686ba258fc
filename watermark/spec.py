"""The watermark spec: everything about a key except its secret.

Same fields, meaning and defaults as vLLM 0.32's ``WatermarkConfig`` (its ``key`` aside),
so a vLLM deployment's ``--watermark-config`` imports as it is (:meth:`from_vllm`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from watermark import prf

Algorithm = Literal["gumbel", "dual_key_gumbel"]
DedupScope = Literal["none", "single_turn", "all"]
CoinKind = Literal["ordinary", "keyed"]
Mode = Literal["diverse", "deterministic"]
Diversity = Literal["salt", "head"]

ALGORITHMS: tuple[str, ...] = ("gumbel", "dual_key_gumbel")
DEDUP_SCOPES: tuple[str, ...] = ("none", "single_turn", "all")
MODES: tuple[str, ...] = ("diverse", "deterministic")
DIVERSITIES: tuple[str, ...] = ("salt", "head")
NEW_KEY_MODE = "diverse"
"""The mode a new key gets when its creator names none (:func:`keys.lifecycle.build_spec`)."""
NEW_KEY_DIVERSITY = "head"
"""How a new `diverse` key varies its generations (:func:`keys.lifecycle.build_spec`): it
needs dedup scope `all`, which a new key then gets unless its creator names another."""
NEW_KEY_PRF = prf.NEW_KEY
"""The PRF a new key gets when its creator names none: 256-bit keys (:mod:`watermark.prf`)."""
MAX_CONTEXT_WIDTH = 16
# vLLM options that change nothing a detector must know.
_VLLM_GENERATION_ONLY = {"allow_target_only_watermarking"}


class WatermarkSpec(BaseModel):
    """How a key watermarks and how its text is scored."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    algorithm: Algorithm = "gumbel"
    """`gumbel` (one key) or `dual_key_gumbel` (keys A and B derived from the secret)."""

    context_width: int = Field(default=4, ge=1, le=MAX_CONTEXT_WIDTH)
    """Number of previous generated tokens that seed each token's random vector."""

    alpha: float = Field(default=0.1, ge=0.0, le=1.0)
    """Dual key, no speculation: probability that a token uses key B (vLLM's `alpha`)."""

    dedup: DedupScope = Field(default="single_turn", alias="deduplicate_contexts")
    """Which history is searched for a repeated context, sampled without the watermark."""

    dedup_max_history: int | None = Field(default=8192, ge=1, alias="deduplicate_contexts_max_history")
    """Most recent history positions searched for a repeat; None searches the whole scope."""

    prf: str = prf.DEFAULT
    """The PRF version: `philox4x32-10-v1` (64-bit keys, vLLM's `philox`), `hmac-sha256-philox-v1`
    (256-bit keys; what new keys get) or `hmac-sha256-v1` (256-bit keys, vLLM's `hmac_sha256`).
    A spec that names none is `philox4x32-10-v1`, as every spec written before 256-bit keys."""

    coin: CoinKind = "ordinary"
    """Speculative acceptance coin: `ordinary` (vLLM's) or `keyed` (a third derived key
    decides acceptance, which lets the detector weigh each token's key)."""

    mode: Mode = "deterministic"
    """`diverse`: each generation draws a salt (watermark.salt) so that repeated generations
    of one prompt differ; detection tests the salts unless the ledger names one.
    `deterministic`: vLLM's scheme bit for bit (one prompt, one text per key). A spec that
    names no mode is `deterministic`: every spec written before modes existed, and vLLM's
    configs. New keys are `diverse` (:data:`NEW_KEY_MODE`)."""

    diversity: Diversity = "salt"
    """How a `diverse` key makes repeated generations differ (ignored, and left at `salt`, in
    mode `deterministic`). `salt` (the first scheme): each generation draws one of 16 salts
    (watermark.salt); detection without the ledger searches the 16 salted keys, at a cost of
    log10(16) in p. `head`: the key is never salted; its first ``context_width`` tokens, whose
    contexts still hold padding, are sampled without the watermark from the request's own
    random stream (dedup scope `all`'s rule, vLLM's too, so it needs ``dedup`` `all`), and that
    randomness runs on through every later context. Detection reads it back from the text
    itself: one key, no search, no correction (watermark/head.py says why and what it costs).
    A spec that names none is `salt`: every `diverse` key made before this field."""

    @property
    def salted(self) -> bool:
        """Whether each generation draws a salt (a `diverse` key of the `salt` scheme)."""
        return self.mode == "diverse" and self.diversity == "salt"

    @field_validator("prf", mode="before")
    @classmethod
    def _known_prf(cls, value: Any) -> str:
        return prf.canonical_name(value)

    @property
    def key_bits(self) -> int:
        """The secret's size in bits (64 or 256), fixed by the PRF."""
        return prf.key_bits(self.prf)

    @field_validator("context_width", mode="before")
    @classmethod
    def _width_is_int(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError("context_width must be an integer between 1 and 16")
        return value

    @model_validator(mode="after")
    def _coin_needs_dual_key(self) -> "WatermarkSpec":
        if self.coin == "keyed" and self.algorithm != "dual_key_gumbel":
            raise ValueError("a keyed acceptance coin needs algorithm dual_key_gumbel")
        if self.diversity == "head" and self.mode != "diverse":
            raise ValueError("diversity 'head' is for a key in mode 'diverse'")
        if self.diversity == "head" and self.dedup != "all":
            raise ValueError("diversity 'head' needs deduplicate_contexts 'all' (its first context_width "
                             "tokens are the ones scope 'all' samples without the watermark)")
        return self

    @classmethod
    def from_vllm(cls, config: dict[str, Any]) -> tuple[int, "WatermarkSpec"]:
        """Split a vLLM ``--watermark-config`` dict into (secret key, spec)."""
        config = dict(config)
        if "key" not in config:
            raise ValueError("the vLLM watermark config has no 'key'")
        key = config.pop("key")
        if isinstance(key, str):
            key = int(key, 0)
        prf.check_key(key, prf.key_bits(config.get("prf", prf.DEFAULT)))
        if config.get("algorithm", "gumbel") not in ALGORITHMS:
            raise ValueError(
                f"unsupported vLLM watermark algorithm: {config['algorithm']!r}; "
                f"expected one of {list(ALGORITHMS)}"
            )
        if config.get("context_width") is None:
            config.pop("context_width", None)
        for name in _VLLM_GENERATION_ONLY:
            config.pop(name, None)
        return key, cls.model_validate(config)

    def to_vllm(self) -> dict[str, Any]:
        """The vLLM ``WatermarkConfig`` fields for this spec (without the key)."""
        if self.coin != "ordinary":
            raise ValueError("vLLM has no keyed acceptance coin; use coin='ordinary'")
        if self.salted:
            raise ValueError("vLLM has no per-generation salt; use mode='deterministic' or diversity='head'")
        if self.prf not in prf.VLLM_NAMES:
            raise ValueError(f"vLLM has no {self.prf} PRF; use prf='philox' or 'hmac_sha256'")
        return {
            "algorithm": self.algorithm,
            "alpha": self.alpha,
            "context_width": self.context_width,
            "deduplicate_contexts": self.dedup,
            "deduplicate_contexts_max_history": self.dedup_max_history,
            "prf": prf.VLLM_NAMES[self.prf],
        }

    def public_dict(self) -> dict[str, Any]:
        """The spec as stored and shown. ``mode`` is left out when `deterministic` and
        ``diversity`` when `salt`, so every spec written before either existed (key rows, ledger
        entries, receipts, keyrings) reads, and re-serialises, exactly as before."""
        out = self.model_dump(by_alias=False)
        if out["mode"] == "deterministic":
            del out["mode"]
        if out["diversity"] == "salt":
            del out["diversity"]
        return out
