"""A corpus scan: items in batches, on CPU worker processes or the GPU, verdicts in order.

CPU: each batch goes to a worker process (forked, so the opened keys are inherited, never
sent); the worker tokenises, scans every key (compiled pass) and finishes the few keys
that can matter. GPU: the workers tokenise, this process runs the kernel over the whole
batch, the workers finish. Batches come back in input order (``imap``) and are appended to
the output and flushed; see :mod:`service.scan.corpus` for resuming.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from detector.multikey import KeySet
from service.scan import corpus
from service.scan.corpus import Item
from service.scan.verdicts import Prepared, ScanSettings, error_record, prepare, verdict

DEFAULT_BATCH = 64


@dataclass
class Summary:
    items: int = 0
    failed: int = 0
    watermarked: int = 0
    skipped: int = 0
    """Lines an earlier run had done (resumed)."""
    seconds: float = 0.0
    tokens: int = 0


# The worker processes' state: set in the parent before forking, inherited by the workers.
_STATE: dict[str, Any] = {}


def _encoder():
    encode = _STATE.get("encode")
    if encode is None and _STATE["settings"].tokenizer is not None:
        from service.tokenization import load_text_encoder

        encode = _STATE["encode"] = load_text_encoder(_STATE["settings"].tokenizer).encode
    return encode


def _prepare_batch(batch: list[Item]) -> list[Prepared | dict]:
    out: list[Prepared | dict] = []
    for item in batch:
        if item.error is not None:
            out.append(error_record(item, item.error))
            continue
        try:
            out.append(prepare(item, _STATE["settings"], _encoder()))
        except ValueError as exc:
            out.append(error_record(item, str(exc)))
    return out


def _finish(prepared: list[Prepared | dict], scans: list[dict] | None = None) -> list[dict]:
    out = []
    for number, entry in enumerate(prepared):
        if isinstance(entry, dict):
            out.append(entry)
            continue
        try:
            out.append(verdict(entry, _STATE["keyset"], _STATE["settings"], None if scans is None else scans[number]))
        except ValueError as exc:
            out.append(error_record(entry.item, str(exc)))
    return out


def _scan_batch(batch: list[Item]) -> list[dict]:
    from watermark import jit

    jit.load()  # a scan is the batch work numba pays for (see watermark.jit)
    return _finish(_prepare_batch(batch))


def _finish_batch(args: tuple[list[Prepared | dict], list[dict]]) -> list[dict]:
    from watermark import jit

    jit.load()
    return _finish(*args)


def keys_digest(keyset: KeySet) -> str:
    """Names the keys a scan tests (ids, versions, fingerprints, states, specs; no secret)."""
    h = hashlib.sha256()
    for c in keyset.candidates:
        h.update(json.dumps([c.info.tenant, c.info.key_id, c.info.version, c.info.fingerprint, c.info.state,
                             c.key.spec.public_dict()], sort_keys=True).encode())
    return h.hexdigest()[:16]


def _batches(items: Iterable[tuple[Item, int]], size: int) -> Iterator[tuple[list[Item], int]]:
    batch: list[Item] = []
    position = 0
    for item, position in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch, position
            batch = []
    if batch:
        yield batch, position


def scan(input_path: Path, out_path: Path, keyset: KeySet, settings: ScanSettings, *, workers: int = 1,
         device: str = "cpu", resume: bool = False, batch: int = DEFAULT_BATCH,
         progress: Callable[[int, int, int], None] | None = None) -> Summary:
    """Scan every item of ``input_path`` against ``keyset``, appending verdicts to
    ``out_path``. ``progress(items_done, failed, bytes_read)`` is called after each batch."""
    input_path, out_path = Path(input_path), Path(out_path)
    if not input_path.is_file():
        raise ValueError(f"cannot read {input_path}: no such file")
    if out_path.exists() and not resume and out_path.stat().st_size:
        raise ValueError(f"{out_path} exists; pass --resume to continue that scan, or choose another --out")
    meta = {"hallmark_scan": 1, "input": str(input_path.resolve()), "keys": keys_digest(keyset),
            "keys_tested": len(keyset.candidates),
            "config": {**settings.config.model_dump(), "normalize": settings.normalize, "per_key": settings.per_key,
                       "tokenizer": settings.tokenizer}}
    corpus.check_or_write_meta(out_path, meta, resume=resume)
    done = corpus.completed_lines(out_path) if resume else set()
    summary = Summary(skipped=len(done))
    started = time.perf_counter()
    from watermark import jit

    jit.load()  # a scan is the batch work numba pays for (watermark.jit); forked workers inherit it
    _STATE.clear()
    _STATE.update(keyset=keyset, settings=settings)
    scanner = None
    if device != "cpu":
        from service.scan.gpu import GpuScanner

        scanner = GpuScanner(keyset, settings.config, device)
    context = multiprocessing.get_context("fork") if workers > 1 and "fork" in multiprocessing.get_all_start_methods() \
        else None
    pool = context.Pool(workers) if context is not None else None
    try:
        with open(out_path, "a", encoding="utf-8") as out:
            for records in _records(corpus.items(input_path, done), batch, pool, scanner, workers):
                bytes_read = records.pop()
                for record in records:
                    out.write(json.dumps(record) + "\n")
                    summary.items += 1
                    summary.failed += "error" in record
                    summary.watermarked += bool(record.get("watermarked"))
                    summary.tokens += int(record.get("total_tokens", 0))
                out.flush()
                if progress is not None:
                    progress(summary.items, summary.failed, bytes_read)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        _STATE.clear()
    summary.seconds = time.perf_counter() - started
    return summary


def _records(items, batch: int, pool, scanner, workers: int) -> Iterator[list]:
    """Each batch's records in input order, then the bytes read so far (last element)."""
    batches = _batches(items, batch)
    if scanner is None:
        if pool is None:
            for chunk, position in batches:
                yield _scan_batch(chunk) + [position]
            return
        positions: list[int] = []

        def feed():
            for chunk, position in batches:
                positions.append(position)
                yield chunk

        for number, records in enumerate(pool.imap(_scan_batch, feed())):
            yield records + [positions[number]]
        return
    for chunk, position in batches:
        if pool is None:
            prepared = _prepare_batch(chunk)
        else:  # tokenise across the workers, a slice each
            step = max(1, -(-len(chunk) // workers))
            prepared = [p for part in pool.map(_prepare_batch, [chunk[i:i + step] for i in range(0, len(chunk), step)])
                        for p in part]
        forms = [form for p in prepared if isinstance(p, Prepared) for form in p.forms]
        stats = iter(scanner.stats(forms))
        scans = [{tuple(form): next(stats) for form in p.forms} if isinstance(p, Prepared) else {} for p in prepared]
        if pool is None:
            records = _finish(prepared, scans)
        else:
            step = max(1, -(-len(prepared) // workers))
            parts = [(prepared[i:i + step], scans[i:i + step]) for i in range(0, len(prepared), step)]
            records = [r for part in pool.map(_finish_batch, parts) for r in part]
        yield records + [position]


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
