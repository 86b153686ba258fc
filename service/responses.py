"""What each JSON route answers with 200: the response bodies as /docs and /openapi.json show
them (attached to the routes' 200 responses; the routes still return plain dicts, which these
models do not filter). Fields every response has are required; optional parts are not; nested
parts whose format another module owns (signed statements, per-key results, spans) are
objects described here and specified there. Extra fields are allowed: a client must ignore
fields it does not know."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)


class Usage(_Body):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class LedgerPosition(_Body):
    """Where the generation's entry sits in its tenant's ledger chain."""

    seq: int
    entry_hash: str


class SignedDocument(_Body):
    """A statement and its signature (ledger.receipts): a receipt or a detection report,
    verifiable offline against /.well-known/hallmark-keys.json (`hallmark receipt verify`,
    `hallmark report verify`)."""

    statement: dict[str, Any]
    """What is attested (type `hallmark.receipt` or `hallmark.detection_report`)."""
    signature: dict[str, Any]
    """`alg` (Ed25519, or Ed25519+ML-DSA-44 with `ml_dsa_44_sig` too: both must verify), `kid` (the signing key) and `sig` (base64url)."""
    log: dict[str, Any] | None = None
    """A receipt's transparency-log proof: `leaf_index`, `tree_size`, a signed `checkpoint`, the
    `inclusion_proof`, and all of it as `tlog_proof` (c2sp.org/tlog-proof@v1 text; against a
    witness-cosigned checkpoint when fetched again once one covers the entry). A detection
    report's: `tlog_proofs`, one for each ledger entry it cites."""
    entry: dict[str, Any] | None = None
    """A receipt's attested ledger entry, every hashed field (they hash to `statement.ledger.entry_hash`):
    what keeps the receipt verifiable through the log if its signing key is revoked later."""


class Watermark(_Body):
    """The key a generation was watermarked with (never its secret) and how much of it was."""

    key_id: str | None = None
    version: int | None = None
    fingerprint: str | None = None
    key_state: str | None = None
    algorithm: str
    spec: dict[str, Any]
    watermarked_tokens: int
    watermarked_share: float
    """Watermarked tokens / output tokens."""


class GenerateResponse(_Body):
    generation_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    model: str
    usage: Usage
    watermark: Watermark | None
    """None when the output is not watermarked (temperature 0, or an allowed opt-out)."""
    ledger: LedgerPosition | None
    receipt: SignedDocument | None
    """The signed receipt; null only where the store has no signing key."""


class HallmarkExtension(_Body):
    """Hallmark's part of an OpenAI-compatible response: the generation's record."""

    generation_id: str
    watermark: Watermark | None = None
    token_ids: list[int] | None = None
    ledger: LedgerPosition | None = None
    receipt: SignedDocument | None = None


class CompletionChoice(_Body):
    index: int
    finish_reason: str
    text: str | None = None
    """`/v1/completions`."""
    message: dict[str, Any] | None = None
    """`/v1/chat/completions`: `{"role": "assistant", "content": ...}`."""
    logprobs: None = None


class CompletionResponse(_Body):
    """OpenAI's `text_completion` or `chat.completion` object, plus `hallmark`."""

    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    hallmark: HallmarkExtension


class Model(_Body):
    id: str
    object: str
    created: int
    owned_by: str


class ModelList(_Body):
    object: str
    data: list[Model]


class DetectResponse(_Body):
    """The verdict and its evidence (docs/concepts/detection.md)."""

    watermarked: bool
    """The global p-value is at most `threshold`, or the ledger is a basis (`basis`)."""
    p_value: float | None
    log10_p_value: float | None
    """Null in a tenant token's answer about a text that does not pass (`p_band` says "p > threshold")."""
    p_band: str | None = None
    """A tenant token's answer only: "p <= 1e-N" (the rounded p) or "p > <threshold>" (issue 31)."""
    threshold: float
    scored_tokens: int
    total_tokens: int
    key: dict[str, Any] | None
    """The winning key (tenant, key_id, version, state, fingerprint, algorithm) when watermarked."""
    keys_tested: int
    """Keys tested (a `diverse` key under its salts counts once)."""
    tests: int | None = None
    """Tests the global p is corrected for: (key, salt) pairs, a `diverse` key's salts each one."""
    per_key: list[dict[str, Any]]
    """Each key's statistic, score, scored tokens and p-values (own and Holm-adjusted)."""
    spans: list[dict[str, Any]]
    """Watermarked stretches: token (and, for text, character) offsets and p-values."""
    basis: list[str]
    """What the verdict rests on: `watermark`, `ledger`."""
    correction: str
    """The multiple-testing correction behind the global p (components and their shares)."""
    ledger_matches: list[dict[str, Any]] = []
    """Recorded generations whose output is exactly this text."""
    kgram_matches: list[dict[str, Any]] = []
    """Recorded generations sharing keyed eight-token sequences with the text."""
    normalization: dict[str, Any] | None = None
    """Text input: what normalisation changed and which form was scored."""
    scored_as: str | None = None
    """What was scored: `text` (as the tokenizer encodes it, and its normalised forms),
    `generation_ids` (an exact copy, on the token ids its generation wrote, proven by their
    recorded hash) or `token_ids` (ids sent as such)."""
    evidence: dict[str, Any] | None = None
    """With `evidence: true`: each token's offsets, whether it was scored (and why not), its score."""
    evidence_withheld: str | None = None
    """Tenant tier: why the per-token evidence asked for is not shown (only a tenant's own
    generation, unedited, gets it: docs/concepts/detection-access.md#per-token-evidence)."""
    report: SignedDocument
    """The signed detection report."""


class GenerationRecord(_Body):
    """A generation's provenance record in the ledger."""

    id: str
    tenant: str
    tenant_id: str
    key_id: str | None
    key_version: int | None
    key_state_at_generation: str | None = None
    key_state_now: str | None = None
    engine: str
    model: str
    spec: dict[str, Any] | None
    prompt_tokens: int
    output_tokens: int
    watermarked_tokens: int
    watermarked: bool
    unwatermarked_reason: str | None
    """Why not every token is watermarked (`dedup`, `temperature_0`, `opt_out`, ...)."""
    unwatermarked_tokens: int
    """The tokens `unwatermarked_reason` applies to: output tokens less watermarked ones."""
    unwatermarked_share: float
    """Unwatermarked tokens / output tokens."""
    output_sha256: str
    token_ids_sha256: str | None
    status: str
    """`in_progress`, `finished` or `interrupted`."""
    finish_reason: str | None
    created_at: str
    """When the generation started."""
    updated_at: str | None
    """When its latest entry was written (a finished generation: when it finished)."""
    ledger: dict[str, Any]
    """The latest entry's `seq`, `entry_hash` and the generation's number of `entries`."""
    details: dict[str, Any] | None


class GenerationPage(_Body):
    generations: list[GenerationRecord]
    limit: int
    offset: int
    has_more: bool
    next_offset: int | None


class KeySet(_Body):
    """The public keys that sign receipts and reports (retired ones too), each with its
    signing-key event in the transparency log, and the log's own key and latest checkpoint."""

    log: dict[str, Any] | None
    """`origin`, `vkey` (the log's note verifier key), `tree_size`, `checkpoint`; null before
    the log exists."""
    keys: list[dict[str, Any]]


class InclusionProof(_Body):
    leaf_index: int
    tree_size: int
    leaf_hash: str
    """Base64."""
    inclusion_proof: list[str]
    """Base64 hashes, RFC 6962 order."""


class ConsistencyProof(_Body):
    from_: int = Field(alias="from")
    to: int
    consistency_proof: list[str]


class Me(_Body):
    token_id: str
    tenant: str | None
    """Null for a global admin token."""
    admin: bool
    kind: str
    """``standard`` (a tenant's or an admin's token); expert tokens detect only and get 403 here."""
    scopes: list[str]
    """Extra scopes an admin granted (``evidence``: per-token evidence in the tenant tier)."""
    expires_at: str | None = None
    """When the token stops working (ISO 8601); null: never."""
    last_used_at: str | None = None
    """When it was last used before this request (to about a minute); null: not yet."""


class TenantList(_Body):
    tenants: list[dict[str, Any]]


class KeyList(_Body):
    keys: list[dict[str, Any]]
    """Key id, tenant, version, state, fingerprint, spec, dates: never the secret."""


class Rotation(_Body):
    new: dict[str, Any]
    previous: dict[str, Any]


class KeyInfo(_Body):
    key_id: str
    tenant: str
    version: int
    state: str


class AuditLog(_Body):
    events: list[dict[str, Any]]


class PublicDetectResponse(_Body):
    """The public tier's answer (docs/concepts/detection-access.md): words and a band, no numbers of the test."""

    tier: str
    """`public`."""
    verdict: str
    """`watermarked`; `recorded` (the provenance ledger records the text, or an edited copy, as
    generated, though the watermark alone does not show it); `not_watermarked`; `too_short`
    (under the public minimum of tokens: not tested)."""
    watermarked: bool
    provider: str
    tenant: str | None
    """The tenant whose key or ledger entry the verdict rests on, only where that tenant opted in."""
    confidence: str
    """`strong` (p <= 1e-12), `moderate` (p <= 1e-6, the threshold) or `none`."""
    tokens: int
    min_tokens: int | None = None
    basis: list[str]
    verdict_text: str
    report: SignedDocument | None
    """The signed detection report of what this tier saw (`hallmark report verify`)."""


class Health(_Body):
    status: str


class Ready(_Body):
    status: str
    engine: str
    model: str


def ok(model: type[BaseModel], description: str = "Successful Response") -> dict[int | str, dict[str, Any]]:
    """A route decorator's ``responses`` entry documenting its 200 body as ``model``."""
    return {200: {"model": model, "description": description}}
