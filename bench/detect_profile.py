"""Where one `/v1/detect` request of a ~200-token text spends its CPU: in process, through
`service.detection.detect` (what the route calls), after a warm-up.

    .venv/bin/python -m bench.detect_profile [--spec dual|diverse] [--repeats 200] [--profile]

A fresh SQLite store under a temp dir holds one tenant with one key: ``dual`` a
`dual_key_gumbel` key (deterministic, vLLM's mode), ``diverse`` the default new key (`gumbel`,
mode `diverse`: 16 salted candidates of one key id). The texts are this gateway's own
generations (so both ledger bases, exact copy and k-grams, do their full work), detected
with an expert token (no probe guard). Prints the median CPU ms per request and, with
``--profile``, cProfile's top functions by cumulative time.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from bench import detect_setup, edited, rows  # noqa: E402


STAGES = [  # (stage, module path suffix, function): cumulative cProfile time of each
    ("route (service.routes.detect._answer)", "service/routes/detect.py", "_answer"),
    ("  access gate: admission (service.access.gate._admit)", "service/access/gate.py", "_admit"),
    ("  access gate: settlement (service.access.gate._settle)", "service/access/gate.py", "_settle"),
    ("  access gate: answer shaping (service.access.shape.full_answer)", "service/access/shape.py", "full_answer"),
    ("request (service.detection.detect)", "service/detection.py", "detect"),
    ("tokenise the forms", "service/detection.py", "tokenize_with_offsets"),
    ("ledger look-up, all", "service/ledger_lookup.py", "look_up"),
    ("  exact copy (statement 1)", "ledger/read.py", "find_generations_by_output_hash"),
    ("  k-gram read (statement 2, with its HMACs)", "ledger/kgram_cache.py", "read_all"),
    ("    k-gram HMACs", "ledger/kgram_digests.py", "keyed_position_digests"),
    ("  facts (statement 3)", "ledger/read.py", "detection_facts"),
    ("  k-gram matching and log check", "ledger/kgrams.py", "find_matches"),
    ("  id recovery (exact copies)", "service/generation_ids.py", "recover"),
    ("detector over the forms", "detector/forms.py", "detect_forms"),
    ("  span search", "detector/spans.py", "locate"),
    ("ledger basis (shared-token tests)", "service/detection.py", "_ledger_basis"),
    ("report statement", "service/provenance.py", "report_statement"),
    ("report signature", "service/state.py", "sign"),
    ("report tlog-proofs", "service/ledger_log.py", "entry_proofs"),
    ("SQL statements executed (all)", "sqlalchemy/engine/base.py", "_execute_context"),
    ("response JSON (JSONResponse.render)", "starlette/responses.py", "render"),
    ("tier's report re-signed (service.access.shape.resign)", "service/access/shape.py", "resign"),
]


def stage_table(stats, requests: int) -> str:
    """Cumulative cProfile ms per request of each stage (:data:`STAGES`) and its share."""
    found = {}
    for (path, _, name), (_, _, _, cumulative, _) in stats.stats.items():
        for stage, suffix, function in STAGES:
            if name == function and path.endswith(suffix):
                found[stage] = found.get(stage, 0.0) + cumulative
    total = found.get(STAGES[0][0]) or found.get(STAGES[4][0]) or 1.0
    lines = ["| stage | ms/request (cProfile) | share |", "|---|---|---|"]
    for stage, _, _ in STAGES:
        if stage in found:
            lines.append(f"| {stage} | {found[stage] / requests * 1e3:.3f} | {found[stage] / total:.0%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", default="dual", choices=["dual", "diverse"])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--texts", type=int, default=4)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--distinct", action="store_true",
                        help="every request a distinct text (a generation with 3 words changed: bench.edited)")
    parser.add_argument("--top", type=int, default=45)
    parser.add_argument("--filter", default=None, help="also print the profile's lines matching this regex")
    parser.add_argument("--out", default=None, help="append a JSON line with the figures")
    parser.add_argument("--route", action="store_true",
                        help="time the route's body (service.routes.detect._answer: the gate and the response too)")
    parser.add_argument("--tier", default="expert", choices=["expert", "tenant", "public"],
                        help="with --route: the caller's tier (tenant: the tenant's token; public: no token, "
                             "a text of at least public_min_tokens; both re-sign the report, both sketch the text)")
    parser.add_argument("--statements", action="store_true", help="also print the SQL statements of one request")
    args = parser.parse_args()

    from fastapi.testclient import TestClient

    from bench.gateway import provision_store
    from keys.lifecycle import build_spec
    from keys.settings import StoreSettings
    from service import detection
    from service.app import create_app
    from service.auth import authenticate
    from service.schemas import DetectBody
    from watermark.spec import WatermarkSpec

    spec = WatermarkSpec(algorithm="dual_key_gumbel") if args.spec == "dual" else build_spec()

    with tempfile.TemporaryDirectory() as tmp:
        env, tokens = provision_store(Path(tmp), detect_setup.populate(spec))
        store_settings = StoreSettings(database_url=env["HALLMARK_DATABASE_URL"], kek_file=env["HALLMARK_KEK_FILE"])
        app = create_app(detect_setup.unthrottled_settings(), store_settings=store_settings)
        with TestClient(app) as client:
            services = app.state.services
            texts = detect_setup.generated_texts(client, tokens["tenant"], args.texts)
            identity = authenticate(services, f"Bearer {tokens['expert']}")
            bodies = [DetectBody(text=t) for t in texts]
            sample = [detection.detect(services, identity, b) for b in bodies]  # warm: compiles, caches
            rounds = max(1, args.repeats // len(bodies))
            fresh = iter([DetectBody(text=t) for t in edited.variants(texts, len(bodies) * rounds * 2 + 8)]
                         if args.distinct else [])
            if args.distinct:
                sample = [detection.detect(services, identity, next(fresh)) for _ in bodies]

            if args.statements:  # every statement one (warm) request sends, BEGIN/COMMIT left out
                from sqlalchemy import event

                seen: list[str] = []

                def count(conn, cursor, statement, parameters, context, executemany):
                    seen.append(statement)

                event.listen(services.store.engine, "before_cursor_execute", count)
                detection.detect(services, identity, next(fresh) if args.distinct else bodies[0])
                event.remove(services.store.engine, "before_cursor_execute", count)
                queries = [q for q in seen if q.split()[0].upper() not in ("BEGIN", "COMMIT", "ROLLBACK")]
                print(f"{len(queries)} statements:")
                for q in queries:
                    print("  ", " ".join(q.split())[:300])

            def run():
                for body in bodies:
                    detection.detect(services, identity, next(fresh) if args.distinct else body)

            if args.route:  # the route's body (the access gate, the core, the response) on this thread
                import asyncio

                from service.routes import detect as detect_route

                loop = asyncio.new_event_loop()

                caller = {"expert": identity, "public": None,
                          "tenant": authenticate(services, f"Bearer {tokens['tenant']}")}[args.tier]
                client_address = "192.0.2.7" if args.tier == "public" else None

                async def batch():
                    for body in bodies:
                        sent = next(fresh) if args.distinct else body
                        response = await detect_route._answer(services, caller, sent, client_address)
                        assert response.status_code == 200, response.body
                        assert response.headers["X-Hallmark-Access-Tier"] == args.tier

                def run():  # noqa: F811
                    loop.run_until_complete(batch())

            cpus = []
            for _ in range(max(1, args.repeats // len(bodies))):
                start = time.process_time()
                run()
                cpus.append((time.process_time() - start) / len(bodies))
            row = {"route": args.route, "tier": args.tier if args.route else "core", "spec": args.spec, "statements": len(queries) if args.statements else None,
                   "texts": len(bodies), "distinct": args.distinct, "cpu_ms_per_request_median": round(statistics.median(cpus) * 1e3, 3),
                   "tokens": [s["total_tokens"] for s in sample], "log10_p": [s["log10_p_value"] for s in sample],
                   "basis": [s["basis"] for s in sample], "scored": [s.get("scored_as") or s.get("normalization", {}).get("scored") for s in sample],
                   "load_average": os.getloadavg()}
            rows.emit(row, args.out)
            if args.profile:
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(max(1, args.repeats // len(bodies))):
                    run()
                profiler.disable()
                buffer = io.StringIO()
                stats = pstats.Stats(profiler, stream=buffer)
                stats.sort_stats("cumulative").print_stats(args.top)
                if args.filter:  # the same, restricted to the modules named
                    stats.sort_stats("cumulative").print_stats(args.filter, 60)
                print(buffer.getvalue())
                print(stage_table(stats, len(bodies) * max(1, args.repeats // len(bodies))))


if __name__ == "__main__":
    main()
