"""What a key-aware re-segmentation of one word (detector.resegment) recovers of the TPR that
scoring the bundled model's texts as text loses (issue 30, item 1); writes
bench/results/retokenisation-repair.json.

    nice -n 15 .venv/bin/python -m bench.retokenisation_repair [--texts 288 --tokens 100]

Reads the texts ``bench.retokenisation bundled`` generated (its cache under var/, the same
seeds: run that first) and its JSON's per-text log10 p (``ids``; ``text_forms_runs_merged``,
what the service scores), re-applies its conditions (same seeds), and for each text whose
forms' p could change a verdict at 1e-6 or 1e-3 once weighted (forms p > 10^-6.3) scores the
repair family (its N forms of the text as sent, or of the runs-merged form where that differs).
Per eps: the combined p (detector.resegment.combined_log10_p; texts not scored keep
p_forms / (1 - eps), a valid upper bound) and TPR lost against the ids; plus an oracle bound:
the repair family's cost log10(N / eps) paid on the ids' own p (what a repair that found the
model's segmentation exactly, in one word, could reach).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from bench.diversity import RESULTS, _meta, _seed
from bench.retokenisation import CONDITIONS, _Backend, _generate_cached, _stable_substitution
from bench.diversity import PROMPTS

EPS = (0.05, 0.1, 0.2)
SCORED_ABOVE = -6.3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=288)
    parser.add_argument("--tokens", type=int, default=100)
    args = parser.parse_args()
    from tokenizers import Tokenizer

    from bench.robustness import attack
    from detector.detect import DetectorConfig
    from detector.resegment import combined_log10_p, repair_log10_p
    from detector.result import Candidate, salted_candidates
    from detector.segmentation import merge_space_runs
    from service.generation_ids import segmentation_table
    from service.model_paths import resolve_model_path
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    meta = _meta("repair")
    meta["command"] = meta["command"].replace("bench.diversity ", "bench.retokenisation_repair ").replace("nice -n 10", "nice -n 15")
    source = json.loads((RESULTS / "retokenisation-bundled.json").read_text())
    tokenizer = Tokenizer.from_file(str(resolve_model_path("bundled")) + "/tokenizer.json")
    table = segmentation_table(_Backend(tokenizer))
    vocab = tokenizer.get_vocab_size()
    config = DetectorConfig()

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    out = {}
    for temperature in (0.7, 1.0):
        jobs = []
        for i in range(args.texts):
            algorithm = "gumbel" if i % 2 == 0 else "dual_key_gumbel"
            spec = WatermarkSpec(algorithm=algorithm, coin="keyed" if algorithm != "gumbel" else "ordinary")
            jobs.append({"prompt": PROMPTS[i % len(PROMPTS)], "seed": _seed("retok-bench", temperature, i),
                         "key": WatermarkKey(_seed("retok-bench-key", i) | (1 << 40), spec)})
        items = [d for d in _generate_cached(jobs, args.tokens, temperature) if d["tokens"]]
        rows = {}
        for condition in CONDITIONS:
            recorded = source["rows"][f"T={temperature}"][condition]["log10_p"]
            ids_p, forms_p = np.array(recorded["ids"]), np.array(recorded["text_forms_runs_merged"])
            rng = np.random.default_rng(_seed("retok", condition))
            repair_p = np.zeros(len(items))
            n_forms = np.zeros(len(items), dtype=int)
            scored = 0
            t0 = time.process_time()
            for index, item in enumerate(items):
                ids = list(item["tokens"])
                if condition.startswith("prefix"):
                    ids = ids[:int(condition.split()[1])]
                elif condition == "substituted 10% text-stable":
                    ids = _stable_substitution(ids, 0.1, rng, tokenizer)
                elif condition.startswith("substituted"):
                    ids = attack(ids, "substitution", 0.1, rng, vocab)
                text = tokenizer.decode(ids, skip_special_tokens=True)
                canonical = encode(text)
                if not canonical:
                    continue
                merged = merge_space_runs(text, canonical, table, encode)
                base = list(merged.token_ids) if merged is not None else canonical
                if forms_p[index] <= SCORED_ABOVE:
                    n_forms[index] = -1  # not scored
                    continue
                scored += 1
                candidates = salted_candidates([Candidate.inline(item["key"])])
                repair_p[index], n_forms[index], _ = repair_log10_p(base, candidates, config, table)
            cpu = time.process_time() - t0
            row = {"texts": len(items), "repair_scored": scored, "repair_cpu_s": round(cpu, 2),
                   "median_family_size": float(np.median(n_forms[n_forms >= 0])) if scored else None,
                   "ids_tpr_1e-6": float(np.mean(ids_p <= -6)), "ids_tpr_1e-3": float(np.mean(ids_p <= -3)),
                   "forms_lost_1e-6": round(float(np.mean(ids_p <= -6) - np.mean(forms_p <= -6)), 4),
                   "forms_lost_1e-3": round(float(np.mean(ids_p <= -3) - np.mean(forms_p <= -3)), 4)}
            for eps in EPS:
                combined = np.array([
                    combined_log10_p(f, r, eps) if n >= 0 else min(0.0, f - math.log10(1 - eps))
                    for f, r, n in zip(forms_p, repair_p, n_forms)])
                for level in (-6, -3):
                    lost = float(np.mean(ids_p <= level) - np.mean(combined <= level))
                    row[f"eps_{eps}_lost_1e{level}"] = round(lost, 4)
                    row[f"eps_{eps}_ids_only_1e{level}"] = int(np.sum((ids_p <= level) & (combined > level)))
                    row[f"eps_{eps}_text_only_1e{level}"] = int(np.sum((ids_p > level) & (combined <= level)))
                row[f"eps_{eps}_log10_p"] = [round(float(x), 3) for x in combined]
            row["repair_log10_p"] = [round(float(x), 3) for x in repair_p]
            row["repair_family_size"] = [int(x) for x in n_forms]
            rows[condition] = row
            print(temperature, condition, {k: v for k, v in row.items() if not isinstance(v, list)}, flush=True)
        out[f"T={temperature}"] = rows
    path = RESULTS / "retokenisation-repair.json"
    path.write_text(json.dumps({"meta": meta, "source": source["meta"]["command"], "rows": out}, indent=1) + "\n")
    print("wrote", path, flush=True)


if __name__ == "__main__":
    main()
