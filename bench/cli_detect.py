"""The detection command line's speed: `hallmark detect --jsonl` throughput, the first
detection of a fresh process, and a text detection with the bundled tokenizer.

    .venv/bin/python -m bench.cli_detect [--texts 600] [--tokens 2000] [--rounds 3]
                                         [--out bench/results/cli-detect.json]

Every figure comes from fresh processes of the real command (`python -m service.cli`,
this checkout), pinned to one core with ``taskset`` where it exists, rounds alternated:

* ``jsonl``: single-key detection of random-token texts (``--tokens`` each), spans on (the
  default). The marginal rate, tokens / (time of N texts - time of N/6 texts), is the
  per-core throughput once the process runs (start-up, imports and loading numba cancel
  out); the whole command's rate is given too. Wall and CPU time (user + system of the
  child) both, since CPU time is what other work on a shared machine disturbs least.
* ``first_detection``: in a fresh process, imports done, the time of the first ``detect``
  call on a 1,000-token text (unwatermarked; and an edited watermarked one whose Tr-GoF
  exact tail runs), with numba's on-disk cache empty (cold: a new NUMBA_CACHE_DIR) and
  filled (warm); whether numba was loaded by then; and the cost of loading the compiled
  paths themselves (``watermark.jit.load`` + the first compiled detection), cold and warm.
* ``commands``: whole-command wall times of ``detect --token-ids-file`` and ``detect
  --text-file --tokenizer bundled``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PIN = ["taskset", "-c", "0"] if shutil.which("taskset") else []


def _run(args: list[str], env: dict, stdin=None) -> tuple[float, float, str]:
    """(wall s, CPU s of the child, stdout) of one fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(PIN + [sys.executable] + args, cwd=REPO, env=env, capture_output=True, text=True,
                          stdin=stdin)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"{args} failed: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout


def _jsonl(path: Path, texts: int, tokens: int, seed: int) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    with open(path, "w") as handle:
        for _ in range(texts):
            handle.write(json.dumps({"token_ids": rng.integers(0, 32000, tokens).tolist(),
                                     "key": {"secret": 0x5EED_1234_ABCD_0042}}) + "\n")


FIRST = r"""
import json, sys, time
import numpy as np
from detector.detect import detect
from detector.result import Candidate
from watermark.key import WatermarkKey
kind = sys.argv[1]
tokens = json.load(open(sys.argv[2]))
candidates = [Candidate.inline(WatermarkKey(int(sys.argv[3])))]
start = time.perf_counter()
result = detect(tokens, candidates)
first = time.perf_counter() - start
out = {"first_detect_ms": first * 1e3, "numba_loaded": "numba" in sys.modules, "log10_p": result.log10_p_value}
if kind == "compiled":
    from watermark import jit
    start = time.perf_counter()
    jit.load()
    detect(tokens, candidates)
    out["load_and_first_compiled_ms"] = (time.perf_counter() - start) * 1e3
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=600)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/results/cli-detect.json")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    work = Path(tempfile.mkdtemp(prefix="cli-detect-"))
    result: dict = {"command": "python -m bench.cli_detect " + " ".join(sys.argv[1:]), "pinned": " ".join(PIN),
                    "python": platform.python_version(), "load_average_at_start": os.getloadavg()}
    try:
        small, large = max(1, args.texts // 6), args.texts
        _jsonl(work / "small.jsonl", small, args.tokens, 1)
        _jsonl(work / "large.jsonl", large, args.tokens, 2)
        command = ["-m", "service.cli", "detect", "--jsonl"]
        _run(command + [str(work / "small.jsonl")], env)  # numba's cache filled, files in the page cache
        rows = []
        for _ in range(args.rounds):
            ws, cs, _ = _run(command + [str(work / "small.jsonl")], env)
            wl, cl, out = _run(command + [str(work / "large.jsonl")], env)
            assert out.count("\n") == large
            rows.append({"small_wall_s": ws, "large_wall_s": wl, "small_cpu_s": cs, "large_cpu_s": cl})
        tokens = (large - small) * args.tokens
        result["jsonl"] = {
            "texts": [small, large], "tokens_per_text": args.tokens, "rounds": rows,
            "marginal_tokens_per_s_wall": tokens / statistics.median(r["large_wall_s"] - r["small_wall_s"] for r in rows),
            "marginal_tokens_per_s_cpu": tokens / statistics.median(r["large_cpu_s"] - r["small_cpu_s"] for r in rows),
            "whole_command_tokens_per_s_wall": large * args.tokens / statistics.median(r["large_wall_s"] for r in rows),
        }
        print(json.dumps(result["jsonl"]), flush=True)

        import numpy as np

        from tests.synthetic import generate
        from watermark.key import WatermarkKey

        secret = 0x5EED_1234_ABCD_0042
        marked, _ = generate(WatermarkKey(secret), 1000, seed=3, scale=1.5)
        rng = np.random.default_rng(4)
        edited = [int(rng.integers(0, 2000)) if rng.random() < 0.45 else t for t in marked]
        texts = {"null": rng.integers(0, 32000, 1000).tolist(), "edited": edited}
        for name, tokens_ in texts.items():
            (work / f"{name}.json").write_text(json.dumps(tokens_))
        first = {}
        for cache in ("cold", "warm"):
            cache_dir = work / "numba-cache"
            if cache == "cold":
                shutil.rmtree(cache_dir, ignore_errors=True)
            env_cache = {**env, "NUMBA_CACHE_DIR": str(cache_dir)}
            # (numba's cache also goes to the package's __pycache__ when NUMBA_CACHE_DIR is
            # unset; a set NUMBA_CACHE_DIR is used first, so an empty one is a cold start)
            for name in texts:
                samples = [json.loads(_run(["-c", FIRST, "plain", str(work / f"{name}.json"), str(secret)],
                                           env_cache)[2]) for _ in range(args.rounds)]
                first[f"{name}_{cache}"] = {"first_detect_ms": statistics.median(s["first_detect_ms"] for s in samples),
                                            "numba_loaded": samples[0]["numba_loaded"]}
            compiled = json.loads(_run(["-c", FIRST, "compiled", str(work / "edited.json"), str(secret)], env_cache)[2])
            first[f"compiled_paths_{cache}"] = {"load_and_first_compiled_detect_ms":
                                                compiled["load_and_first_compiled_ms"]}
        result["first_detection"] = first
        print(json.dumps(first), flush=True)

        (work / "key").write_text(str(secret))
        (work / "text.txt").write_text("The quick brown fox jumps over the lazy dog. " * 20)
        commands = {"detect --token-ids-file": ["-m", "service.cli", "detect", "--token-ids-file",
                                                str(work / "null.json"), "--key-file", str(work / "key")],
                    "detect --text-file --tokenizer bundled": ["-m", "service.cli", "detect", "--text-file",
                                                               str(work / "text.txt"), "--tokenizer", "bundled",
                                                               "--key-file", str(work / "key")]}
        result["commands"] = {}
        for name, argv in commands.items():
            _run(argv, env)
            walls = [_run(argv, env)[0] for _ in range(args.rounds)]
            result["commands"][name] = {"wall_s": statistics.median(walls)}
        print(json.dumps(result["commands"]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["load_average_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
