"""bench.detect_floor's ledger_sql piece alone: the SQL one warm detection of a distinct text
sends (captured from service.detection.detect), replayed with sqlite3 alone.

    PYTHONPATH=<tree> nice -n 5 .venv/bin/python bench/results/detect-kgram-index/floor_sql.py
"""
import json

from bench import detect_floor

_, out = detect_floor.in_process(4, 1000)
print("FLOOR", json.dumps({k: out[k] for k in ("ledger_sql_sqlite3_ms", "ledger_sql_statements",
                                                "ledger_sql_statement_kinds")}))
