"""`hallmark scan`: a corpus (JSONL of texts or token ids) against every key of a tenant
or of every tenant, on CPU worker processes or the GPU; JSONL verdicts out, resumable
(:mod:`service.scan`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from detector.defaults import DEFAULT_THRESHOLD
from service.cli.app import CliError, app, emit


@app.command("scan")
def scan_command(
    input_path: Path = typer.Argument(..., metavar="INPUT",
                                      help='JSONL, one {"text": "..."} or {"token_ids": [...]} a line '
                                           '(optional "id", repeated in the verdict).'),
    out: Path = typer.Option(..., "--out", help="JSONL of verdicts, one a line, in input order."),
    tenant: Optional[str] = typer.Option(None, "--tenant", help="Test every stored key of this tenant."),
    all_tenants: bool = typer.Option(False, "--all-tenants", help="Test every stored key of every tenant."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer",
                                            help="Tokenizer for text lines: a model directory or 'bundled'."),
    workers: int = typer.Option(1, "--workers", min=0,
                                help="CPU worker processes (0: one per core)."),
    device: str = typer.Option("cpu", "--device", help="cpu, or cuda (the GPU kernel; needs torch and triton)."),
    resume: bool = typer.Option(False, "--resume", help="Continue a scan into an existing --out."),
    batch: int = typer.Option(64, "--batch", min=1, help="Lines per batch (a GPU scan: try 1024)."),
    threshold: float = typer.Option(DEFAULT_THRESHOLD, "--threshold", help="p-value at or below which text is watermarked."),
    statistic: str = typer.Option("auto", "--statistic", help="Dual-key statistic: auto, max, weighted or routed."),
    spans: bool = typer.Option(True, "--spans/--no-spans", help="Localise watermarked spans."),
    normalize_text: bool = typer.Option(True, "--normalize/--no-normalize",
                                        help="Also score text after undoing tokenisation tricks (as the API does)."),
    per_key: bool = typer.Option(False, "--per-key", help="Write every key's entry into each verdict."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Scan a corpus against stored keys: one verdict a line (global p, winning key, spans)."""
    from service.cli.store_detect import stored_candidates
    from service.cli.watermark_cmds import _detector_config
    from service.cli.progress import Bar
    from service.scan.run import default_workers, scan
    from service.scan.verdicts import ScanSettings

    if (tenant is None) == (not all_tenants):
        raise CliError("give --tenant T or --all-tenants")
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise CliError(f"unknown --device {device!r}; expected cpu or cuda")
    if not input_path.is_file():
        raise CliError(f"cannot read {input_path}: no such file")
    config = _detector_config(threshold, statistic, spans)
    from detector.multikey import KeySet

    keyset = KeySet.of(stored_candidates(tenant=None if all_tenants else tenant))
    settings = ScanSettings(config=config, normalize=normalize_text, per_key=per_key, tokenizer=tokenizer)
    bar = Bar("texts", input_path.stat().st_size, as_json=as_json)
    try:
        summary = scan(input_path, out, keyset, settings, workers=workers or default_workers(), device=device,
                       resume=resume, batch=batch, progress=bar.update)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    finally:
        bar.close()
    payload = {"out": str(out), "texts": summary.items, "failed": summary.failed, "watermarked": summary.watermarked,
               "skipped_as_done": summary.skipped, "keys_tested": len(keyset.candidates),
               "seconds": round(summary.seconds, 3), "tokens": summary.tokens}
    emit(payload, as_json, f"scanned {summary.items:,} texts against {len(keyset.candidates):,} keys in "
                           f"{summary.seconds:.1f} s: {summary.watermarked:,} watermarked, {summary.failed:,} failed"
                           + (f", {summary.skipped:,} done before" if summary.skipped else "") + f"; verdicts in {out}")
    if summary.failed:
        raise CliError(f"{summary.failed} line(s) failed; see the error objects in {out}")
