"""The corpus-scan kernel on a GPU: bit-exact parity with the CPU pass, and throughput.

    python3 bench/keyscan_gpu.py --out DIR            (on the GPU machine; no pydantic needed)
    TRITON_INTERPRET=1 python3 bench/keyscan_gpu.py --smoke --out DIR     (the logic, on a CPU)

1. Parity: :func:`watermark.kernels.keyscan.scan_stats` against the compiled CPU pass
   (:func:`watermark.keyscan_cpu.scan_stats`, itself tested against the numpy reference)
   on odd shapes: context widths 1-16, single and dual keys, every p-value form, keys at
   the 2^32 / 2^63 / 2^64 edges, key counts that are no multiple of the keys a program
   takes, texts of 0, 1 and block +- 1 positions and repetitive texts whose repeated
   contexts are skipped. Every statistic must be equal; no tolerance.
2. Throughput: T texts of 1,000 scored positions against K keys (``--texts``, ``--keys``),
   single and dual keys, over launch shapes (keys per program, tile, warps); medians of
   CUDA-event timings after a warm-up; key.tokens/s. For dual keys a key.token is two PRF
   streams.
3. The ceiling: a kernel that does nothing but chained Philox-4x32-10 rounds in registers
   (Philox evaluations/s), and the fraction of the H200's integer-instruction rate the scan
   reaches, from its SASS (integer instructions of the tile loop, counted by
   ``cuobjdump``) x the measured rate / (SMs x 64 integer lanes per clock x clock).

Writes DIR/keyscan-gpu.json (and the kernel's SASS, DIR/keyscan-sass.txt).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from detector import screen  # noqa: E402
from watermark import keyscan, keyscan_cpu  # noqa: E402
from watermark.kernels import keyscan as kernel  # noqa: E402
from watermark.kernels.philox import philox  # noqa: E402

EDGE_KEYS = [0, 1, 2**32 - 1, 2**32, 2**32 + 5, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


def _keys(rng: np.random.Generator, count: int) -> np.ndarray:
    keys = rng.integers(0, 2**63, count, dtype=np.int64).astype(np.uint64) * np.uint64(2) + rng.integers(
        0, 2, count).astype(np.uint64)
    for i in range(min(count, len(EDGE_KEYS))):
        keys[(i * 7) % count] = np.uint64(EDGE_KEYS[i])
    return keys


def _texts(rng: np.random.Generator, count: int, block: int, vocab: int = 5000) -> list[np.ndarray]:
    lengths = [0, 1, 2, block - 1, block, block + 1, 2 * block + 3]
    out = []
    for i in range(count):
        n = lengths[i] if i < len(lengths) else int(rng.integers(1, 3 * block))
        if i % 3 == 2:  # repetitive: many contexts repeat and are skipped
            out.append(rng.integers(0, 6, n))
        else:
            out.append(rng.integers(0, vocab, n))
    return out


def _device_inputs(contexts, tokens, offsets, device):
    columns = torch.from_numpy(keyscan_cpu.context_columns(contexts).view(np.int32)).to(device)
    toks = torch.from_numpy((np.asarray(tokens, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32))
    return columns, toks.to(device), torch.from_numpy(np.asarray(offsets, dtype=np.int64)).to(device)


def parity(device: torch.device, smoke: bool, rng: np.random.Generator) -> list[dict]:
    rows = []
    widths = (1, 4, 6) if smoke else (1, 2, 3, 4, 5, 6, 8, 9, 13, 16)
    for width in widths:
        for form, dual in (("single", False), ("max", True), ("sidak", True)):
            block = 64 if smoke else 256
            texts = _texts(rng, 9 if smoke else 37, block)
            skip = width % 2 == 0
            contexts, tokens, offsets = keyscan.pack_positions(texts, width, skip_padded=skip)
            count = 5 if smoke else 13
            keys_a = _keys(rng, count)
            keys_b = _keys(rng, count)[::-1].copy() if dual else None
            alpha = float(rng.choice([0.0, 0.1, 0.3, 0.5, 1.0]))
            tables = screen.scan_tables(form, alpha, int(np.diff(offsets).max(initial=0)))
            cpu = keyscan_cpu.scan_stats(keys_a, keys_b, contexts, tokens, offsets, tables)
            if smoke or width in (1, 6):
                reference = keyscan.scan_stats_reference(keys_a, keys_b, contexts, tokens, offsets, tables)
                assert np.array_equal(reference, cpu), f"CPU pass != reference (width {width}, {form})"
            columns, toks, offs = _device_inputs(contexts, tokens, offsets, device)
            dev = kernel.DeviceTables(tables, device)
            for keys_per_program, tile in ((2, block), (3, block // 2) if smoke else (4, 128)):
                out = kernel.scan_stats(torch.from_numpy(keys_a.view(np.int64)).to(device),
                                        None if keys_b is None else torch.from_numpy(keys_b.view(np.int64)).to(device),
                                        columns, toks, offs, width, dev, keys_per_program=keys_per_program,
                                        block=tile).cpu().numpy()
                equal = bool(np.array_equal(out, cpu))
                rows.append({"width": width, "form": form, "dual": dual, "alpha": alpha, "texts": len(texts),
                             "positions": int(len(tokens)), "keys": count, "keys_per_program": keys_per_program,
                             "block": tile, "bit_exact": equal,
                             "mismatches": int((out != cpu).sum())})
                if not equal:
                    print("MISMATCH", rows[-1], flush=True)
    return rows


def _time_ms(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return float(np.median(times))


def throughput(device: torch.device, texts: int, keys: int, n: int, shapes, repeats: int,
               rng: np.random.Generator) -> list[dict]:
    rows = []
    token_ids = rng.integers(0, 2**31, size=(texts, n + 4))
    contexts, tokens, offsets = keyscan.pack_positions(list(token_ids), 4, skip_padded=False)
    columns, toks, offs = _device_inputs(contexts, tokens, offsets, device)
    for dual in (False, True):
        tables = screen.scan_tables("sidak" if dual else "single", 0.1, n + 4)
        dev = kernel.DeviceTables(tables, device)
        keys_a = torch.from_numpy(_keys(rng, keys).view(np.int64)).to(device)
        keys_b = torch.from_numpy(_keys(rng, keys).view(np.int64)).to(device) if dual else None
        key_tokens = keys * int(len(tokens))
        for keys_per_program, block, warps in shapes:
            try:
                ms = _time_ms(lambda: kernel.scan_stats(keys_a, keys_b, columns, toks, offs, 4, dev,
                                                        keys_per_program=keys_per_program, block=block,
                                                        num_warps=warps), repeats)
            except Exception as exc:  # noqa: BLE001 - a shape that does not compile is reported
                rows.append({"dual": dual, "keys_per_program": keys_per_program, "block": block, "warps": warps,
                             "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                continue
            rows.append({"dual": dual, "keys_per_program": keys_per_program, "block": block, "warps": warps,
                         "texts": texts, "keys": keys, "positions": int(len(tokens)), "ms": round(ms, 3),
                         "key_tokens_per_s": key_tokens / (ms / 1e3)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


@triton.jit
def _philox_peak_kernel(out_ptr, ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
    lane = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c0 = lane.to(tl.uint32)
    c1 = c0 ^ 0x1234
    c2 = c0 + 77
    c3 = c0 * 3
    k0 = tl.full([], 0x9E3779B9, tl.uint32)
    k1 = tl.full([], 0x85EBCA6B, tl.uint32)
    for _ in range(ROUNDS):
        c0, c1, c2, c3 = philox(c0, c1, c2, c3, k0 ^ c3, k1)
    tl.store(out_ptr + lane, c0 ^ c1 ^ c2 ^ c3)


def philox_peak(device: torch.device, repeats: int) -> dict:
    """Chained Philox-4x32-10 evaluations per second with nothing else in the loop (a
    per-element key, like the scan's token words, so none of it hoists)."""
    block, programs, rounds = 256, 132 * 64, 64
    out = torch.empty(block * programs, dtype=torch.int32, device=device)
    ms = _time_ms(lambda: _philox_peak_kernel[(programs,)](out, ROUNDS=rounds, BLOCK=block), repeats)
    return {"evaluations": block * programs * rounds, "ms": round(ms, 3),
            "philox_per_s": block * programs * rounds / (ms / 1e3)}


INTEGER = re.compile(r"\b(IMAD|IADD3|IADD|VIADD|LOP3|LOP|SHF|SHL|SHR|ISETP|SEL|IMNMX|VIMNMX|PRMT|LEA|IABS|I2F|I2FP|F2I|"
                     r"FLO|POPC|BREV)(\.[A-Z0-9_.]+)?\b")
"""SASS instructions of the integer pipes (per-thread ALU and IMAD; the uniform datapath's
U* instructions, loads, branches and warp votes apart)."""


def sass_counts(device: torch.device, out_dir: Path) -> dict:
    """The scan kernel's SASS (dual keys, the default launch shape) and its integer
    instructions, those in the longest loop (the tile loop) apart."""
    tables = screen.scan_tables("sidak", 0.1, 64)
    dev = kernel.DeviceTables(tables, device)
    contexts, tokens, offsets = keyscan.pack_positions([np.arange(64)], 4, skip_padded=False)
    columns, toks, offs = _device_inputs(contexts, tokens, offsets, device)
    keys = torch.zeros(2, dtype=torch.int64, device=device)
    kernel.scan_stats(keys, keys, columns, toks, offs, 4, dev)
    compiled = None
    for cache in kernel._keyscan_kernel.device_caches.values():
        for entry in cache[0].values():
            compiled = entry
    if compiled is None or "cubin" not in compiled.asm:
        return {"error": "no compiled kernel found"}
    cubin = out_dir / "keyscan.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    try:
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"cuobjdump: {exc}"}
    finally:
        cubin.unlink(missing_ok=True)
    (out_dir / "keyscan-sass.txt").write_text(sass)
    lines = [line for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    address = lambda line: int(re.search(r"/\*([0-9a-f]{4,})\*/", line).group(1), 16)  # noqa: E731
    # Loops end in a backward branch (BRA to a lower address); the tile loop is the longest
    # innermost one (the key loop around it holds it).
    loops = []
    for line in lines:
        target = re.search(r"BRA\s+0x([0-9a-f]+)", line)
        if target and int(target.group(1), 16) < address(line):
            loops.append((int(target.group(1), 16), address(line)))
    innermost = [(a, b) for a, b in loops if not any(a <= c and d <= b and (c, d) != (a, b) for c, d in loops)]
    best = max(innermost, key=lambda loop: loop[1] - loop[0], default=(0, 0))
    body = [line for line in lines if best[0] <= address(line) <= best[1]]
    def count(rows):
        integer = sum(1 for r in rows if INTEGER.search(r))
        wide = sum(1 for r in rows if "IMAD.WIDE" in r)
        return {"instructions": len(rows), "integer": integer, "imad_wide": wide}
    return {"kernel": count(lines), "tile_loop": count(body), "tile_loop_span": [hex(best[0]), hex(best[1])],
            "elements_per_thread_per_iteration": 256 // (4 * 32), "shape": "dual keys, 4 keys a program, tile 256, 4 warps"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (Triton's interpreter on a CPU)")
    parser.add_argument("--texts", type=int, default=4096)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-parity", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    device = torch.device("cpu" if interpret else "cuda")
    rng = np.random.default_rng(20261204)
    result: dict = {"command": "python3 bench/keyscan_gpu.py " + " ".join(sys.argv[1:]),
                    "torch": torch.__version__, "triton": triton.__version__,
                    "device": "interpreter" if interpret else torch.cuda.get_device_name()}
    if not interpret:
        props = torch.cuda.get_device_properties(0)
        result["multiprocessors"] = props.multi_processor_count
    started = time.perf_counter()
    if not args.skip_parity:
        rows = parity(device, args.smoke, rng)
        result["parity"] = {"cases": len(rows), "all_bit_exact": all(r["bit_exact"] for r in rows), "rows": rows,
                            "seconds": round(time.perf_counter() - started, 1)}
        print("parity:", result["parity"]["cases"], "cases, all bit-exact:", result["parity"]["all_bit_exact"],
              flush=True)
        (args.out / "keyscan-gpu.json").write_text(json.dumps(result, indent=1) + "\n")
    if not args.smoke and not interpret:
        shapes = [(4, 256, 4), (8, 256, 4), (4, 512, 8), (8, 512, 4), (16, 256, 4), (4, 128, 4), (2, 1024, 8)]
        result["throughput"] = throughput(device, args.texts, args.keys, args.tokens, shapes, args.repeats, rng)
        (args.out / "keyscan-gpu.json").write_text(json.dumps(result, indent=1) + "\n")
        for name, fn in (("philox_peak", lambda: philox_peak(device, args.repeats)),
                         ("sass", lambda: sass_counts(device, args.out))):
            try:
                result[name] = fn()
            except Exception as exc:  # noqa: BLE001 - the throughput figures stand without it
                result[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        clock_ghz = 1.98  # the SM clock read under load on these machines (KINDS.md, 1980 MHz)
        peak = result.get("multiprocessors", 132) * 64 * clock_ghz * 1e9
        best = {dual: max((r for r in result["throughput"] if r["dual"] == dual and "ms" in r),
                          key=lambda r: r["key_tokens_per_s"], default=None) for dual in (False, True)}
        result["best"] = {("dual" if k else "single"): v for k, v in best.items()}
        result["integer_peak_ops_per_s"] = peak
        result["philox_per_key_token"] = {"single": 2, "dual": 4}
        # The fraction of the integer rate: the dual kernel's tile loop's integer instructions
        # per key.token (SASS, per thread per iteration / tokens a thread takes per iteration,
        # which an unrolled loop doubles: counted from its float conversions, one per token
        # and stream) x its best measured rate / the peak. IMAD.WIDE counts once here,
        # though it may take two issue slots.
        loop = result.get("sass", {}).get("tile_loop")
        if loop and best.get(True):
            sass_text = (args.out / "keyscan-sass.txt").read_text()
            span = [int(x, 16) for x in result["sass"]["tile_loop_span"]]
            body = [line for line in sass_text.splitlines() if re.search(r"/\*([0-9a-f]{4,})\*/", line)
                    and span[0] <= int(re.search(r"/\*([0-9a-f]{4,})\*/", line).group(1), 16) <= span[1]]
            tokens_per_iteration = max(1, sum("I2F" in line for line in body) // 2)
            per_key_token = loop["integer"] / tokens_per_iteration
            rate = best[True]["key_tokens_per_s"]
            result["integer_fraction_dual"] = {"integer_instructions_per_key_token": per_key_token,
                                               "tokens_per_thread_per_iteration": tokens_per_iteration,
                                               "achieved_integer_ops_per_s": per_key_token * rate,
                                               "fraction_of_peak": per_key_token * rate / peak}
        if result.get("philox_peak", {}).get("philox_per_s"):
            ceiling = result["philox_peak"]["philox_per_s"]
            result["fraction_of_philox_ceiling"] = {
                name: row["key_tokens_per_s"] * result["philox_per_key_token"][name] / ceiling
                for name, row in result["best"].items() if row}
        result["seconds"] = round(time.perf_counter() - started, 1)
        (args.out / "keyscan-gpu.json").write_text(json.dumps(result, indent=1) + "\n")
        for name, row in result["best"].items():
            if row:
                print(f"{name}: {row['key_tokens_per_s'] / 1e9:.1f} G key.tokens/s (K/program {row['keys_per_program']},"
                      f" block {row['block']}, warps {row['warps']})")
        print("philox peak:", result["philox_peak"], "sass:", result["sass"])
    return 0 if result.get("parity", {}).get("all_bit_exact", True) else 1


if __name__ == "__main__":
    sys.exit(main())
