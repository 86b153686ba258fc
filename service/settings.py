"""The gateway's settings, from the environment (HALLMARK_*) or built explicitly.

The store's own settings (database URL, KEK) live in :class:`keys.settings.StoreSettings`;
this object adds what the HTTP service and its engine need. Outside development mode
a missing KEK is refused at start-up (the store refuses it); ``hallmark quickstart``
(``make run``) is the development mode that generates a KEK file under ./var.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

EMPTY_DISABLES = {"draft_model": "HALLMARK_DRAFT_MODEL"}
"""Settings an empty variable turns off (None), as docs/reference/configuration.md says: ``HALLMARK_DRAFT_MODEL=``
disables speculation. Every other empty variable is ignored (``env_ignore_empty``), so that
``HALLMARK_PORT=`` keeps the default instead of failing to parse."""


class _EmptyDisables(PydanticBaseSettingsSource):
    """:data:`EMPTY_DISABLES`'s variables set but empty, as None (ahead of the environment
    source, which drops empty values)."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return {name: None for name, variable in EMPTY_DISABLES.items() if os.environ.get(variable) == ""}



class ServiceSettings(BaseSettings):
    """Gateway, engine and limit settings."""

    model_config = SettingsConfigDict(env_prefix="HALLMARK_", extra="ignore", frozen=True,
                                      env_ignore_empty=True)

    engine: Literal["local", "vllm"] = "local"
    """Which engine generates: the embedded PyTorch engine or vLLM."""

    model: str = "bundled"
    """A Hugging Face checkpoint directory, or a bundled model name."""

    draft_model: str | None = "hallmark-tiny-draft"
    """Draft model for speculative decoding (local engine); empty/None disables it."""

    speculative_k: int = Field(default=4, ge=1, le=16)
    """Draft tokens per speculative step."""

    device: str = "auto"
    """`auto` (CUDA if available, else CPU), `cpu`, `cuda` or `cuda:N`."""

    log_format: Literal["text", "json"] = "text"
    """The server's log lines (`hallmark serve`/`quickstart`): text, or one JSON object a
    line for a log shipper (service.logs); one line per request either way."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Hallmark's and uvicorn's log level (`warning` drops the per-request lines)."""

    max_batch: int = Field(default=16, ge=1, le=1024)
    """Requests decoded together in one step; more wait in the queue."""

    max_queue: int = Field(default=256, ge=1)
    """Requests waiting beyond this are refused with 503 (back-pressure)."""

    vllm_url: str | None = None
    """Remote `vllm serve` (OpenAI-compatible) URL for the vllm engine; None runs in-process."""

    default_max_tokens: int = Field(default=128, ge=1)
    max_tokens_cap: int = Field(default=1024, ge=1)
    """Requests asking for more tokens get 422."""

    max_prompt_tokens: int = Field(default=2048, ge=1)
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    """Request bodies above this get 413."""

    max_detect_chars: int = Field(default=200_000, ge=1)
    """Detection text above this many characters gets 413."""

    max_detect_tokens: int = Field(default=100_000, ge=1)

    max_evidence_tokens: int = Field(default=5_000, ge=1)
    """Detection with ``"evidence": true`` above this many tokens gets 413 (the answer holds
    about 100 bytes per token)."""

    detect_rate_per_minute: float = Field(default=600.0, ge=0)
    """Per-token rate of /v1/detect: repeated queries leak the watermark's signal. Shared by
    every replica (see rate_limit_backend); 0 disables the limit (benchmarks only)."""

    detect_burst: int = Field(default=60, ge=1)

    # Detection access tiers (service/access; docs/concepts/detection-access.md).
    public_detect: bool = True
    """Whether POST /v1/public/detect (and the page's Check without a token) answers."""
    public_max_chars: int = Field(default=20_000, ge=1)
    """Public detection text above this many characters gets 413, before any tokenisation."""
    public_min_tokens: int = Field(default=200, ge=1)
    """Public texts shorter than this get "too short to say" (the Code of Practice's threshold)."""
    public_tokens_per_day: float = Field(default=20_000.0, gt=0)
    """Tokens one client address may have scored by the public check a day (shared by replicas)."""
    public_global_tokens_per_day: float = Field(default=5_000_000.0, gt=0)
    """Tokens the public check scores a day for every address together (bounds many-address probing)."""
    public_wide_tokens_per_day: float = Field(default=200_000.0, gt=0)
    """Tokens the public check scores a day for one wide group (an IPv4 /24, an IPv6 /48)
    together: walking a network's addresses buys at most this (service/access/addresses.py)."""
    public_reserved_tokens_per_day: float = Field(default=4_000.0, ge=0)
    """Tokens an address group may still have scored a day once the global public budget is
    used up, within ten times this for its wide group (service/access/budgets.py): no flood
    from other networks closes the public check for it."""
    trusted_proxies: str = ""
    """Comma-separated addresses or networks of reverse proxies whose ``X-Forwarded-For`` is
    believed (`hallmark serve --trusted-proxies`); none by default: the TCP peer is the client."""
    ipv6_group_prefix: int = Field(default=64, ge=1, le=128)
    """An IPv6 client counts as its /N (one subscriber's network is a /64)."""
    ipv4_share_prefix: int = Field(default=24, ge=1, le=32)
    ipv6_share_prefix: int = Field(default=48, ge=1, le=128)
    """The wide groups (IPv4 /24, IPv6 /48) that share a public budget and the probe families."""
    signed_max_p: float = Field(default=1e-6, gt=0, lt=1)
    """The provider's policy maximum: a report is signed ``watermarked`` only when the p-value
    is at most this, whatever threshold the caller chose (a stricter one is allowed)."""
    tenant_detect_tokens_per_day: float = Field(default=2_000_000.0, gt=0)
    """Tokens one tenant's detections (all its tokens together) may score a day."""
    evidence_per_day: float = Field(default=20.0, gt=0)
    """Detections with per-token evidence a day, per token holding the `evidence` scope (audited each)."""
    probe_family_per_day: int = Field(default=3, ge=1)
    """Queries a text family (a query containing >= probe_share of the token k-grams of one of
    the same family space's queries of the last 24 h, or contained in it) may make in 24 h;
    429 probe_guard beyond."""
    probe_share: float = Field(default=0.5, gt=0, le=1)
    probe_kgram: int = Field(default=5, ge=1, le=17)
    """Tokens per k-gram of the probe guard: the detector's context (4) and the token scored
    (service/access/probe.py)."""
    detect_queue: int = Field(default=16, ge=0)
    """Detections one principal may have waiting for its lane in this replica (one of its
    detections runs at a time: service/access/lanes.py); 429 beyond."""
    detect_slots: int = Field(default=2, ge=0)
    """Detections one principal (a tenant, an expert token, a client address) may run at once in
    this replica; 429 beyond, before any tokenisation (0: no limit)."""
    detect_workers: int = Field(default=1, ge=0)
    """Processes that detect bodies over the inline size (service/access/offload.py), so their
    CPU-bound Python does not hold the interpreter other principals' checks run in; 0: a
    worker thread of the gateway's own process instead."""
    detect_fair_share: float = Field(default=0.5, gt=0, le=1)
    """A principal whose detection lane was held more than this share of the recent time
    (a continuous stream) lets other principals' detections in flight go first
    (service/access/lanes.py; 1: never)."""
    detect_fair_window_s: float = Field(default=2.0, gt=0, le=60)
    """Seconds over which a principal's lane use decays (an exponential time constant): with
    the defaults a stream is over its share within about 1.5 s, one detection of a few
    hundred ms is not."""
    detect_defer_max_s: float = Field(default=0.5, ge=0, le=10)
    """The longest one wait of an over-share principal for others' detections: a stream of
    others' checks never starves it (0: it never waits)."""
    detect_worker_nice: int = Field(default=10, ge=0, le=19)
    """How much lower than the gateway's the detection workers' CPU priority is (added to
    their nice value; service/access/offload.py): the event loop, where every principal's
    small checks run, gets the cores first. 0: the same priority."""
    detect_parse_inline_bytes: int = Field(default=16_384, ge=0)
    """``POST /v1/detect`` bodies up to this many bytes are parsed and validated on the event
    loop; a larger one in a detection worker (a worker thread with ``detect_workers`` 0), so
    one client's big bodies do not hold the loop another's check waits on (an 8,000-id body:
    about 3 ms of JSON and validation; service/routes/detect.py)."""
    metrics_listen: str | None = Field(default=None, pattern=r"^[^\s:]*:[0-9]{1,5}$")
    """``host:port`` of a listener serving only /metrics (e.g. 127.0.0.1:9464); the gateway's
    own port then answers 404 on /metrics."""
    provider_name: str = "Hallmark"
    """The provider the public check names in its verdict."""

    allow_opt_out: bool = False
    """Whether tenant tokens may ask for unwatermarked output (`watermark: false`); admin
    tokens always may. Opted-out generations are recorded as such in the ledger."""

    tenant_max_concurrent_generations: int = Field(default=32, ge=0)
    """Generations one tenant may have in flight in this replica; more get 429 (0: no limit)."""

    tenant_tokens_per_minute: float = Field(default=200_000.0, ge=0)
    """Each tenant's generation budget in tokens a minute, shared by every replica; a request
    reserves its max_tokens and gets back what it did not use; 429 beyond (0: no limit)."""

    tenant_token_burst: int | None = Field(default=None, ge=1)
    """Most tokens a tenant may use at once (default: one minute's budget)."""

    rate_limit_backend: Literal["auto", "memory", "database", "redis"] = "auto"
    """Where rate-limit buckets live: `auto` is Redis when redis_url is set, else the
    database on PostgreSQL (shared by replicas), else this process's memory (SQLite)."""

    redis_url: str | None = None
    """Redis for shared rate limits, e.g. redis://127.0.0.1:6379/0."""

    token_cache_entries: int = Field(default=10_000, ge=1)
    """Known API tokens kept in the cache (least recently used evicted first); unknown tokens
    are remembered in a separate cache of the same size, so a flood of them evicts none."""
    generation_timeout_s: float = Field(default=600.0, gt=0, le=900)
    """A stream running longer is ended (finish reason ``timeout``, recorded). At most 900 s:
    the ledger reads a silent unfinished generation as interrupted after 15 minutes."""

    key_cache_seconds: float = Field(default=2.0, ge=0.0)
    """How long opened keys and token lookups are reused: rotation and revocation take
    effect within this time."""

    checkpoint_every_entries: int = Field(default=256, ge=1)
    """A transparency-log checkpoint is published for witnesses once this many entries are
    unpublished (HALLMARK_CHECKPOINT_EVERY_ENTRIES)."""
    checkpoint_every_seconds: float = Field(default=30.0, gt=0, le=3600)
    """... and at most this many seconds after an entry was logged
    (HALLMARK_CHECKPOINT_EVERY_SECONDS)."""
    witness_policy: str | None = None
    """A tlog-policy file (c2sp.org/tlog-policy) naming the witnesses (key and tlog-witness
    URL) and the quorum: a checkpoint is then published only once the quorum cosigned it
    (HALLMARK_WITNESS_POLICY). Unset: checkpoints are published as the log signs them."""
    witness_timeout_seconds: float = Field(default=2.0, gt=0, le=60)
    """One add-checkpoint request's timeout (HALLMARK_WITNESS_TIMEOUT_SECONDS)."""
    witness_attempts: int = Field(default=3, ge=1, le=10)
    """Attempts per witness and checkpoint (timeouts, 5xx, 409s) before the round gives up
    on it; the next round (at most checkpoint_every_seconds later) tries again."""
    transparency_log: bool = True
    """Off only as a benchmark's control arm (bench/log_cost.py): entries are then written
    without log leaves, so detection never cites them and receipts carry no proof."""

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        return init_settings, _EmptyDisables(settings_cls), env_settings, dotenv_settings, file_secret_settings

    @property
    def token_burst(self) -> float:
        return float(self.tenant_token_burst or self.tenant_tokens_per_minute)

    @model_validator(mode="after")
    def _proxies(self) -> "ServiceSettings":
        from service.access.addresses import parse_networks

        parse_networks(self.trusted_proxies)  # ValueError names the bad entry
        return self

    @model_validator(mode="after")
    def _caps(self) -> "ServiceSettings":
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError("default_max_tokens cannot exceed max_tokens_cap")
        if self.tenant_tokens_per_minute and self.token_burst < self.max_tokens_cap:
            raise ValueError("the tenant token burst (tenant_token_burst, default tenant_tokens_per_minute) "
                             "must be at least max_tokens_cap")
        return self
