"""What one probe-guard placement costs as a family space fills (issue 31, third round: the
public tier is one family space, so at the global public budget a day holds ~16,000 checks).

    .venv/bin/python -m bench.guard_cost [--rows 1000,4000,16000] [--repeats 7] [--out FILE]

A fresh SQLite store (the tests' provisioning); the space is filled with rows of random
300-token queries spread over the last 24 hours, then a new random query is placed
``--repeats`` times per size (each in its own transaction, as the gate does): the median CPU
ms of a placement, its sketch excluded. The first placement after filling reads the space
whole (it is not counted: a process does that once).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from keys.db import open_store
from keys.models import ProbeQuery
from service.access import probe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", default="1000,4000,16000")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from tests.service import gateway as gw

    rng = random.Random(1)
    secret = rng.randbytes(32)

    def query() -> probe.Sketch:
        return probe.sketch_of_forms(secret, [[rng.randrange(50_000) for _ in range(300)]])

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        store_settings, _ = gw.provision(Path(tmp), None)
        store = open_store(store_settings, require_kek=True)
        total = 0
        for target in (int(n) for n in args.rows.split(",")):
            while total < target:
                with store.transaction() as session:
                    for _ in range(min(500, target - total)):
                        session.add(ProbeQuery(id=f"r{total}", principal="public", family=f"r{total}",
                                               created=time.time() - rng.uniform(60, 86_000), hashes=query().pack()))
                        total += 1
            times = []
            for i in range(args.repeats + 1):
                sketch = query()
                started = time.process_time()
                with store.transaction() as session:
                    probe.guard(session, principal="public", query=sketch, per_day=3, min_share=0.5)
                if i:
                    times.append((time.process_time() - started) * 1000)
                total += 1
            results[target] = round(statistics.median(times), 2)
            print(target, "rows: placement CPU ms (median)", results[target], flush=True)
        store.close()
    out = {"placement_cpu_ms_by_rows": results, "command": " ".join([".venv/bin/python -m bench.guard_cost",
                                                                      *sys.argv[1:]]),
           "load_average_at_end": os.getloadavg(), "note": "shared 2-core box"}
    print(json.dumps(out, indent=2))
    if args.out:
        args.out.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
