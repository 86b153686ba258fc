"""Start-up of the ``hallmark`` command: wall and CPU time of whole processes.

    .venv/bin/python -m bench.cli_startup [--runs 9] [--json] [-- ARGS...]

Builds a real SQLite store in a temp dir the way an operator does (``hallmark db upgrade``,
``tenants create``, ``keys create`` and ``keys rotate``: two tenants, four keys each), then runs the
command (default ``keys list``, and ``--help``) ``--runs`` times, each in a fresh process
after one warm-up run, and prints min and median of wall time and of CPU time (user +
system, from the child's rusage). On a shared machine the minimum is the figure to
compare; ``python -X importtime`` tells where a process spends it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The console script beside this interpreter (what an operator runs), on this checkout's code.
_SCRIPT = Path(sys.executable).with_name("hallmark")
HALLMARK = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "service.cli"]


def _run(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s: user + system) of one process running ``hallmark args``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(HALLMARK + args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"hallmark {' '.join(args)} failed: {done.stderr.strip()}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _store(tmp: Path, env: dict[str, str]) -> None:
    from keys.kek import generate_kek_file

    generate_kek_file(tmp / "kek.key")
    env.update(HALLMARK_DATABASE_URL=f"sqlite:///{tmp / 'hallmark.db'}", HALLMARK_KEK_FILE=str(tmp / "kek.key"))
    _run(["db", "upgrade"], env)
    for tenant in ("acme", "globex"):
        _run(["tenants", "create", tenant], env)
        for algorithm in ("gumbel", "dual_key_gumbel"):
            _run(["keys", "create", "--tenant", tenant, "--algorithm", algorithm], env)
            _run(["keys", "rotate", "--tenant", tenant], env)


def measure(args: list[str], runs: int, env: dict[str, str]) -> dict[str, object]:
    _run(args, env)  # warm-up: page cache, and .pyc where they are written
    walls, cpus = zip(*(_run(args, env) for _ in range(runs)))
    return {"command": "hallmark " + " ".join(args), "runs": runs,
            "wall_min_s": round(min(walls), 3), "wall_median_s": round(statistics.median(walls), 3),
            "cpu_min_s": round(min(cpus), 3), "cpu_median_s": round(statistics.median(cpus), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--json", action="store_true", help="One JSON document instead of lines.")
    parser.add_argument("command", nargs="*", help="hallmark's arguments (default: keys list, then --help)")
    options = parser.parse_args()
    env = {name: value for name, value in os.environ.items() if not name.startswith("HALLMARK_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                      env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="hallmark-startup-") as tmp:
        _store(Path(tmp), env)
        commands = [options.command] if options.command else [["keys", "list"], ["--help"]]
        results = [measure(command, options.runs, env) for command in commands]
    if options.json:
        print(json.dumps(results, indent=2))
        return
    for result in results:
        print(f"{result['command']}: wall min {result['wall_min_s']:.3f} s, median {result['wall_median_s']:.3f} s; "
              f"CPU min {result['cpu_min_s']:.3f} s, median {result['cpu_median_s']:.3f} s ({result['runs']} runs)")


if __name__ == "__main__":
    main()
