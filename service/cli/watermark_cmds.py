"""`hallmark prf` and `hallmark detect`: the PRF and the detector on the command line.

Batch inputs (``--jsonl``) stream line by line, so a file of millions of tokens never sits
in memory twice; a malformed line yields an error object naming the line, the other
lines are still processed, and the exit code is non-zero at the end.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional

import typer

from detector.defaults import DEFAULT_THRESHOLD
from service.cli.app import CliError, app, emit
from service.cli.choices import Algorithm, CoinKind, DedupScope, DualStatistic

if TYPE_CHECKING:  # loaded by the commands that use them (`hallmark --help` loads none)
    from detector.detect import DetectorConfig
    from detector.normalize import NormalizedText
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

MAX_TOKEN_ID = 2**32 - 1  # the PRF reads token ids as 32-bit words


def _secret(value: Any, *, source: str) -> int:
    """A u64 secret: :func:`keys.importing.parse_secret` (decimal or 0x hex, never echoed),
    also given as a JSON integer (a JSONL batch's ``"key": 42``)."""
    from keys.importing import parse_secret as parse

    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return parse(value, source=source)


def spec_from_options(**fields: Any) -> "WatermarkSpec":
    from pydantic import ValidationError

    from watermark.validation import describe
    from watermark.spec import WatermarkSpec

    try:
        return WatermarkSpec(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise CliError(f"invalid watermark spec: {describe(exc)}") from None


def _open_lines(path: str) -> Iterator[str]:
    if path == "-":
        yield from sys.stdin
        return
    try:
        handle = open(path, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        yield from handle


def _token_list(value: Any) -> list[int]:
    # Checked in C (a set of the element types, min and max): per-token Python checks were
    # a third of a --jsonl batch's time.
    if not isinstance(value, list) or set(map(type, value)) - {int}:
        raise ValueError("token ids must be a JSON list of integers")
    if value and (min(value) < 0 or max(value) > MAX_TOKEN_ID):
        raise ValueError("token ids must be in [0, 2**32)")
    return value


def _batch(path: str, handle_line, *, as_json: bool = False, parse=json.loads) -> None:
    from pydantic import ValidationError

    from watermark.validation import describe
    from service.cli.progress import Counter

    failures = 0
    counter = Counter("lines", as_json=as_json)  # on a terminal only (stderr), not with --json
    for number, line in enumerate(_open_lines(path), start=1):
        if not line.strip():
            continue
        try:
            item = parse(line)
            if not isinstance(item, dict):
                raise ValueError("each line must be a JSON object")
            out = handle_line(item)
        except json.JSONDecodeError as exc:
            out, failures = {"line": number, "error": f"invalid JSON: {exc.msg}"}, failures + 1
        except ValidationError as exc:
            out, failures = {"line": number, "error": describe(exc)}, failures + 1
        except (ValueError, TypeError, KeyError) as exc:
            message = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
            out, failures = {"line": number, "error": message}, failures + 1
        sys.stdout.write(json.dumps(out) + "\n")
        counter.tick(failed="error" in out)
    sys.stdout.flush()
    counter.close()
    if failures:
        raise CliError(f"{failures} line(s) failed; see the error objects in the output")


@app.command("prf")
def prf_command(
    jsonl: str = typer.Option(..., "--jsonl", help='File ("-" for stdin): {"key": "<u64>", "context": [...], "tokens": [...]} per line.'),
    as_json: bool = typer.Option(False, "--json", help="Accepted for uniformity: the output is always JSON lines."),
) -> None:
    """PRF words and uniforms for (key, context, tokens), one output line per input line."""
    import numpy as np

    from watermark.prf import philox

    def one(item: dict) -> dict:
        key = _secret(item["key"], source='the line\'s "key"')
        context = _token_list_or_pad(item["context"])
        tokens = _token_list(item["tokens"])
        if not 1 <= len(context) <= 16:
            raise ValueError("context must hold 1 to 16 entries")
        words = philox.words_numpy(key, np.array([context] * len(tokens), dtype=np.int64).reshape(len(tokens), len(context)),
                                np.array(tokens, dtype=np.int64))
        uniforms = philox.uniforms_from_words_numpy(words)
        return {"words": [int(w) for w in words], "uniforms": [float(u) for u in uniforms]}

    _batch(jsonl, one, as_json=as_json)


def _token_list_or_pad(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ValueError("context must be a JSON list of integers (-1 for padding)")
    if any(t < -1 or t > MAX_TOKEN_ID for t in value):
        raise ValueError("context entries must be -1 or in [0, 2**32)")
    return value


def _detector_config(threshold: float, statistic: str, spans: bool) -> "DetectorConfig":
    from pydantic import ValidationError

    from detector.detect import DetectorConfig
    from watermark.validation import describe

    try:
        return DetectorConfig(threshold=threshold, dual_statistic=statistic, spans=spans)
    except ValidationError as exc:
        raise CliError(f"invalid detector option: {describe(exc)}") from None


def served_tokenizer() -> str:
    """The tokenizer text is read with when --tokenizer is not given: the served model's,
    as the gateway's /v1/detect reads it (HALLMARK_MODEL, else the bundled model)."""
    import os

    return os.environ.get("HALLMARK_MODEL") or "bundled"


def _tokenize(texts: list[str], tokenizer_path: str, origin: str = "") -> list[tuple[list[int], list[tuple[int, int]] | None]]:
    """Token ids and character offsets of each text (offsets None without a fast tokenizer):
    the API's tokenisation, through the model's tokenizer.json without transformers where it
    has one (seconds less per command; service.tokenization.load_text_encoder). ``origin``
    says where the tokenizer's name came from (for the error)."""
    from service.tokenization import load_text_encoder

    try:
        encoder = load_text_encoder(tokenizer_path)
    except (OSError, ValueError) as exc:
        looks_like_path = tokenizer_path.startswith(("/", ".", "~")) or Path(tokenizer_path).suffix != ""
        missing = not Path(tokenizer_path).expanduser().exists()
        why = "no such directory" if looks_like_path and missing else \
            "no such directory, bundled model or Hugging Face model in the local cache" if missing else \
            str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise CliError(f"cannot load tokenizer {tokenizer_path!r}{origin}: {why}; pass --tokenizer DIR (the "
                       f"generating model's checkpoint directory) or --tokenizer bundled") from None
    except Exception as exc:  # tokenizers' own errors (a malformed tokenizer.json)
        raise CliError(f"cannot load tokenizer {tokenizer_path!r}{origin}: {type(exc).__name__}: {exc}; "
                       "pass --tokenizer bundled or the generating model's checkpoint directory") from None
    return [encoder.encode(text) for text in texts]


def _single_input(token_ids: Optional[str], token_ids_file: Optional[Path], text: Optional[str],
                  text_file: Optional[Path], tokenizer: Optional[str],
                  normalize_text: bool = True
                  ) -> tuple[list[list[int]], "NormalizedText | None", list[str], str | None, list | None]:
    """The input's token ids: one form, or for text changed by normalisation several (as
    given and normalised; the API's rule, detector.forms), the normalisation when applied,
    the forms' names, the text as given (None for token ids) and, for text, each form's
    tokens' character offsets in the text as given (None for token ids)."""
    given = [x is not None for x in (token_ids, token_ids_file, text, text_file)]
    if sum(given) != 1:
        raise CliError("give exactly one input: --token-ids, --token-ids-file, --text or --text-file (or --jsonl)")
    if text is not None or text_file is not None:
        origin = "" if tokenizer else " (the served model's, from HALLMARK_MODEL)"
        tokenizer = tokenizer or served_tokenizer()
        if tokenizer == "bundled":
            origin = ""
        if text_file is not None:
            try:
                text = text_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise CliError(f"cannot read {text_file}: {exc.strerror}") from None
            except UnicodeDecodeError:
                raise CliError(f"cannot read {text_file} as UTF-8 text") from None
        _check_input(text=text)
        from detector.forms import TextForm, original_offsets, text_forms

        forms, normalized = text_forms(text) if normalize_text else ([TextForm("as_sent", text, None)], None)
        tokenized = _tokenize([form.text for form in forms], tokenizer, origin)
        from service.tokenization import load_text_encoder

        forms, tokenized = load_text_encoder(tokenizer).with_runs_merged(forms, tokenized)  # as the API
        offsets = [None if chars is None else original_offsets(form, chars)
                   for form, (_, chars) in zip(forms, tokenized)]
        return [ids for ids, _ in tokenized], normalized, [form.name for form in forms], text, offsets
    raw = token_ids
    if token_ids_file is not None:
        try:
            raw = token_ids_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(f"cannot read {token_ids_file}: {exc.strerror}") from None
    try:
        ids = _token_list(json.loads(raw))
    except json.JSONDecodeError:
        raise CliError("token ids must be a JSON list of integers, e.g. [12, 7, 99]") from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    # The vocabulary is known when --tokenizer names the model; an inline key alone may
    # belong to any model's deployment.
    from service.tokenization import model_vocab_size

    _check_input(token_ids=ids, vocab_size=model_vocab_size(tokenizer) if tokenizer else None)
    return [ids], None, ["as_sent"], None, None


def _check_input(text: str | None = None, token_ids: list[int] | None = None, vocab_size: int | None = None) -> None:
    """The API's refusal of degenerate input (service.detect_input), as a CLI error."""
    from service.detect_input import DegenerateInput, check_detect_input

    try:
        check_detect_input(text, token_ids, vocab_size)
    except DegenerateInput as exc:
        raise CliError(str(exc)) from None


def _inline_key(key: Optional[str], key_file: Optional[Path], spec: "WatermarkSpec") -> "WatermarkKey":
    from watermark.key import WatermarkKey

    if key_file is not None:
        try:
            key = key_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"cannot read key file {key_file}: {exc.strerror}") from None
    try:
        return WatermarkKey(_secret(key, source=f"the key file {key_file}" if key_file else "--key"), spec)
    except ValueError as exc:
        raise CliError(str(exc)) from None


@app.command("detect")
def detect_command(
    token_ids: Optional[str] = typer.Option(None, "--token-ids", help="JSON list of token ids."),
    token_ids_file: Optional[Path] = typer.Option(None, "--token-ids-file", help="File holding a JSON list of token ids."),
    text: Optional[str] = typer.Option(None, "--text", help="Text to score (read with --tokenizer)."),
    text_file: Optional[Path] = typer.Option(None, "--text-file", help="File of text to score (read with --tokenizer)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", metavar="DIR|bundled",
                                            help="The generating model's tokenizer: its checkpoint directory, or "
                                                 "'bundled' (the bundled model's). Default: the served model's "
                                                 "(HALLMARK_MODEL, else 'bundled')."),
    jsonl: Optional[str] = typer.Option(None, "--jsonl", help='Batch file ("-" for stdin): {"token_ids": [...], "key": {...}} per line.'),
    tenant: Optional[str] = typer.Option(None, "--tenant", help="Test every stored key of this tenant."),
    all_tenants: bool = typer.Option(False, "--all-tenants", help="Test every stored key of every tenant."),
    key: Optional[str] = typer.Option(None, "--key", help="Inline secret (u64). Prefer --key-file: arguments are visible to other users."),
    key_file: Optional[Path] = typer.Option(None, "--key-file", help="File holding the inline secret."),
    algorithm: Algorithm = typer.Option("gumbel", "--algorithm", help="Inline key: the deployment's watermark "
                                        "algorithm (as at generation: a wrong spec detects nothing)."),
    context_width: int = typer.Option(4, "--context-width", help="Inline key: previous tokens seeding each token (1-16)."),
    alpha: float = typer.Option(0.1, "--alpha", help="Inline dual_key_gumbel key: share of key-B tokens (0-1)."),
    dedup: DedupScope = typer.Option("single_turn", "--dedup", help="Inline key: which repeated contexts were "
                                     "sampled unwatermarked."),
    coin: CoinKind = typer.Option("ordinary", "--coin", help="Inline dual_key_gumbel key: the speculative "
                                  "acceptance coin."),
    threshold: float = typer.Option(DEFAULT_THRESHOLD, "--threshold", help="p-value at or below which text is watermarked."),
    statistic: DualStatistic = typer.Option("auto", "--statistic", help="Dual-key statistic (auto picks by key)."),
    spans: bool = typer.Option(True, "--spans/--no-spans", help="Localise watermarked spans."),
    normalize_text: bool = typer.Option(True, "--normalize/--no-normalize",
                                        help="Also score text after undoing tokenisation tricks (as the API does)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Score text against an inline key, a tenant's stored keys, or a JSONL batch."""
    from detector.detect import detect as run_detect
    from detector.forms import detect_forms
    from detector.result import Candidate, salted_candidates
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    config = _detector_config(threshold, statistic, spans)
    if jsonl is not None:
        if any(x is not None for x in (token_ids, token_ids_file, text, text_file, key, key_file, tenant)):
            raise CliError("--jsonl carries its inputs and keys per line; drop the other input and key options")

        from service.detect_input import check_detect_input
        from watermark import jit

        candidates: dict[str, Candidate] = {}  # a batch usually repeats a few keys

        def one(item: dict) -> dict:
            if not isinstance(item["key"], dict):
                raise ValueError('"key" must be a JSON object holding "secret" and the spec\'s fields')
            memo = json.dumps(item["key"], sort_keys=True)
            candidate = candidates.get(memo)
            if candidate is None:
                spec_fields = dict(item["key"])
                secret = _secret(spec_fields.pop("secret"), source='the line\'s key "secret"')
                candidate = Candidate.inline(WatermarkKey(secret, WatermarkSpec(**spec_fields)))
                if len(candidates) < 4096:
                    candidates[memo] = candidate
            tokens = item["token_ids"]  # a checked array from parse_line, or a list to check
            check_detect_input(None, tokens, None)
            result = run_detect(tokens if not isinstance(tokens, list) else _token_list(tokens),
                                salted_candidates([candidate]), config).to_dict()
            # After the first line, the compiled paths: a batch is what numba's ~0.3 s of
            # loading pays for (the first detection itself stays on numpy; watermark.jit).
            if not jit.loaded():
                import gc

                from detector import trgof

                trgof.warm_up()
                # What is loaded now lives as long as the batch: out of the collector's
                # reach, and collections rarer (each line leaves no cycles behind), as the
                # gateway does after its start (measured: ~10 us of a ~420 us line).
                gc.freeze()
                gc.set_threshold(50_000, 50, 100)
            return result

        from service.cli.token_lines import parse_line

        _batch(jsonl, one, as_json=as_json, parse=parse_line)
        return
    forms, normalized, form_names, text_input, offsets = _single_input(token_ids, token_ids_file, text, text_file,
                                                                       tokenizer, normalize_text)
    if tenant is not None or all_tenants:
        if key is not None or key_file is not None:
            raise CliError("give either an inline key (--key/--key-file) or --tenant/--all-tenants, not both")
        from service.cli.store_detect import stored_candidates

        candidates = stored_candidates(tenant=None if all_tenants else tenant)
        store_scope = True
    else:
        if key is None and key_file is None:
            raise CliError("give a key: --key-file F (or --key), or --tenant T to use stored keys")
        spec = spec_from_options(algorithm=algorithm, context_width=context_width, alpha=alpha, dedup=dedup, coin=coin)
        candidates = salted_candidates([Candidate.inline(_inline_key(key, key_file, spec))])
        store_scope = False
    try:
        result, scored_form = detect_forms(forms, candidates, config)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if offsets is not None and offsets[scored_form] is not None:  # spans in the text as given, as the API
        from detector.forms import with_span_chars

        result = with_span_chars(result, offsets[scored_form])
    payload = result.to_dict()
    if store_scope:  # the ledger's evidence too, as the API reports it
        from service.cli.store_detect import add_ledger_evidence

        payload = add_ledger_evidence(payload, tenant=None if all_tenants else tenant, text=text_input,
                                      forms=forms, candidates=candidates, config=config)
    if normalized is not None:
        payload["normalization"] = {**normalized.to_dict(), "scored": form_names[scored_form]}
    normalised = ""
    if normalized is not None and normalized.changed:  # what the JSON's `normalization` says
        normalised = (f"; normalised: {', '.join(f'{count} {step}' for step, count in normalized.changes.items())}"
                      f" (scored {form_names[scored_form]})")
    from service.cli.detect_summary import summary

    emit(payload, as_json, summary(payload, normalised=normalised))
