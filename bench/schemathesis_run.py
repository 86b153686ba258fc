"""Schemathesis over every operation of a real gateway, every check enabled.

Starts a gateway (bundled models, a fresh SQLite store with two tenants, the test gateway of
``tests/service/gateway.py``) and runs ``st run --checks all`` against its /openapi.json,
authenticated as a tenant token. ``tests/service/test_openapi.py`` runs it with a small
budget; this module's command line runs it longer:

    python -m bench.schemathesis_run --max-examples 200 --out bench/results/schemathesis.md

The gateway runs with a small max_tokens cap (generation time, not coverage, bounds the
run) and detection limits disabled; everything else is the default configuration.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(max_examples: int, *, seed: int = 1, workers: int = 1, phases: str | None = None,
        extra: list[str] | None = None, timeout: float = 1800) -> tuple[int, str, float]:
    """(exit code, output, seconds) of one schemathesis run against a fresh gateway."""
    sys.path.insert(0, str(REPO))
    from tests.service import gateway as gw

    with tempfile.TemporaryDirectory() as tmp:
        # Prompts of any length the schema allows fit the model's context with this cap. Keys in
        # the `diverse` mode, the default for new keys: `n` > 1 is theirs (a deterministic key
        # answers 409 n_needs_diverse_key to a schema-valid `n`).
        server = gw.start(Path(tmp), draft_model=None, max_tokens_cap=4, default_max_tokens=4,
                          modes={"acme": "diverse", "globex": "diverse"})
        try:
            command = [str(Path(sys.executable).parent / "st"), "run", server.url + "/openapi.json",
                       "--checks", "all", "--max-examples", str(max_examples), "--seed", str(seed),
                       "--workers", str(workers), "-H", f"Authorization: Bearer {server.tokens['acme']}",
                       "--request-timeout", "60", "--no-color", *(extra or [])]
            if phases:
                command += ["--phases", phases]
            start = time.monotonic()
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=tmp,
                                  env={**os.environ, "SCHEMATHESIS_HOOKS": ""})
            return done.returncode, done.stdout + done.stderr, time.monotonic() - start
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    code, output, seconds = run(args.max_examples, seed=args.seed)
    print(output)
    if args.out:
        args.out.write_text(f"# Schemathesis, every check, every operation\n\n"
                            f"`python -m bench.schemathesis_run --max-examples {args.max_examples} --seed {args.seed}`"
                            f" — exit code {code}, {seconds:.0f} s (2-core machine shared with other work).\n\n"
                            f"```\n{output.strip()[-6000:]}\n```\n")
    sys.exit(code)


if __name__ == "__main__":
    main()
