"""What a key-aware re-segmentation of one word (detector.resegment) recovers of the TPR that
scoring generated texts as text loses (issue 30, item 1), and what it does to null text.

    nice -n 15 .venv/bin/python -m bench.retokenisation_repair [bundled] [--texts 288 --tokens 100]
    nice -n 15 .venv/bin/python -m bench.retokenisation_repair vllm
    nice -n 15 .venv/bin/python -m bench.retokenisation_repair null [--texts 288 --keys-per-text 4]

``bundled``/``vllm``: reads the texts ``bench.retokenisation`` scored (bundled: its generation
cache under var/, the same seeds: run that first; vllm: bench/results/vllm-diverse-batch.json)
and its JSON's per-text log10 p (``ids``; ``text_forms_runs_merged``, what the service scores),
re-applies its conditions (same draws), and for each text whose forms' p could change a
verdict at 1e-6 or 1e-3 once weighted (forms p > 10^-6.3) scores the repair family (the N
one-word forms of the text as sent, or of its runs-merged form where that differs). Per eps:
the combined p (detector.resegment.combined_log10_p; texts not scored keep p_forms / (1 - eps),
a valid upper bound) and the TPR lost against the ids; writes
bench/results/retokenisation-repair[-vllm].json. ``null``: the bundled texts under keys that
did not write them, every text scored in full: counts at 1e-2 and 1e-3 against their
expectation (retokenisation-repair-null.json).
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
UP_TO = 1e-5
"""Also eps 0.05 with the repair's share growing only up to this level
(detector.resegment.combined_log10_p's ``up_to``)."""
SCORED_ABOVE = -6.3


def _items_bundled(texts: int, tokens: int, temperature: float, first: int = 0) -> list[dict]:
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    jobs = []
    for i in range(first, first + texts):
        algorithm = "gumbel" if i % 2 == 0 else "dual_key_gumbel"
        spec = WatermarkSpec(algorithm=algorithm, coin="keyed" if algorithm != "gumbel" else "ordinary")
        jobs.append({"prompt": PROMPTS[i % len(PROMPTS)], "seed": _seed("retok-bench", temperature, i),
                     "key": WatermarkKey(_seed("retok-bench-key", i) | (1 << 40), spec)})
    return [d for d in _generate_cached(jobs, tokens, temperature) if d["tokens"]]


def _items_vllm() -> list[dict]:
    from bench.vllm_diverse_batch import RESULTS_NAME, bench_keys

    source = json.loads((RESULTS / RESULTS_NAME).read_text())
    keys = bench_keys()
    return [{"key": keys[r["scheme"]] if r["salt"] is None else keys[r["scheme"]].with_salt(r["salt"]),
             "tokens": r["token_ids"]} for r in source["rows"] if r["token_ids"]]


def _texts(items: list[dict], condition: str, tokenizer, vocab: int):
    """(item, ids) per item under ``condition``, with bench.retokenisation.evaluate's draws."""
    from bench.robustness import attack

    rng = np.random.default_rng(_seed("retok", condition))
    for item in items:
        ids = list(item["tokens"])
        if condition.startswith("prefix"):
            ids = ids[:int(condition.split()[1])]
        elif condition == "substituted 10% text-stable":
            ids = _stable_substitution(ids, 0.1, rng, tokenizer)
        elif condition.startswith("substituted"):
            ids = attack(ids, "substitution", 0.1, rng, vocab)
        yield item, ids


def evaluate(items: list[dict], recorded_rows: dict, tokenizer, table, rates: dict | None,
             incremental: bool = False) -> dict:
    from detector.detect import DetectorConfig
    from detector.resegment import combined_log10_p, repair_log10_p, repair_sum_log10_p
    from detector.result import Candidate, salted_candidates
    from detector.segmentation import merge_space_runs

    config = DetectorConfig()
    vocab = tokenizer.get_vocab_size()

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    rows = {}
    for condition in CONDITIONS:
        recorded = recorded_rows[condition]["log10_p"]
        ids_p, forms_p = np.array(recorded["ids"]), np.array(recorded["text_forms_runs_merged"])
        repair_p = np.zeros(len(items))
        n_forms = np.zeros(len(items), dtype=int)
        scored = 0
        t0 = time.process_time()
        for index, (item, ids) in enumerate(_texts(items, condition, tokenizer, vocab)):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            canonical = encode(text)
            if not canonical or forms_p[index] <= SCORED_ABOVE:
                n_forms[index] = -1  # not scored
                continue
            merged = merge_space_runs(text, canonical, table, encode)
            base = list(merged.token_ids) if merged is not None else canonical
            scored += 1
            candidates = salted_candidates([Candidate.inline(item["key"])])
            if incremental:
                assert len(candidates) == 1
                repair_p[index], n_forms[index], _ = repair_sum_log10_p(base, candidates[0].key, table)
            else:
                repair_p[index], n_forms[index], _ = repair_log10_p(base, candidates, config, table, rates)
        cpu = time.process_time() - t0
        row = {"texts": len(items), "repair_scored": scored, "repair_cpu_s": round(cpu, 2),
               "median_family_size": float(np.median(n_forms[n_forms >= 0])) if scored else None,
               "ids_tpr_1e-6": float(np.mean(ids_p <= -6)), "ids_tpr_1e-3": float(np.mean(ids_p <= -3)),
               "forms_lost_1e-6": round(float(np.mean(ids_p <= -6) - np.mean(forms_p <= -6)), 4),
               "forms_lost_1e-3": round(float(np.mean(ids_p <= -3) - np.mean(forms_p <= -3)), 4)}
        for eps, up_to in [(e, None) for e in EPS] + [(0.05, UP_TO)]:
            name = f"eps_{eps}" + (f"_up_to_{up_to}" if up_to else "")
            # A text not scored: the repair taken as p = 1 (a valid upper bound on the combination).
            combined = np.array([combined_log10_p(f, r if n >= 0 else 0.0, eps, up_to)
                                 for f, r, n in zip(forms_p, repair_p, n_forms)])
            for level in (-6, -3):
                lost = float(np.mean(ids_p <= level) - np.mean(combined <= level))
                row[f"{name}_lost_1e{level}"] = round(lost, 4)
                row[f"{name}_ids_only_1e{level}"] = int(np.sum((ids_p <= level) & (combined > level)))
                row[f"{name}_text_only_1e{level}"] = int(np.sum((ids_p > level) & (combined <= level)))
            row[f"{name}_log10_p"] = [round(float(x), 3) for x in combined]
        row["repair_log10_p"] = [round(float(x), 3) for x in repair_p]
        row["repair_family_size"] = [int(x) for x in n_forms]
        rows[condition] = row
        print(condition, {k: v for k, v in row.items() if not isinstance(v, list)}, flush=True)
    return rows


def null(items: list[dict], tokenizer, table, keys_per_text: int, incremental: bool = False) -> dict:
    """The texts unedited under keys that did not write them (fresh deterministic keys, gumbel
    and keyed-coin dual in turn): the combined p (text forms as the service scores them, the
    repair at each eps) against its level; every text is scored in full (no screen)."""
    from detector.detect import DetectorConfig
    from detector.forms import detect_forms, text_forms, with_runs_merged
    from detector.resegment import combined_log10_p, repair_log10_p, repair_sum_log10_p
    from detector.result import Candidate
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    config = DetectorConfig()

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    forms_p, repair_p = [], []
    t0 = time.process_time()
    for index, item in enumerate(items):
        text = tokenizer.decode(item["tokens"], skip_special_tokens=True)
        variants, _ = text_forms(text)
        tokenised = [(encode(v.text), None) for v in variants]
        variants, tokenised = with_runs_merged(variants, tokenised, table, encode)
        if not tokenised[0][0]:
            continue
        base = tokenised[1][0] if len(variants) > 1 and variants[1].name == "as_sent_runs_merged" else tokenised[0][0]
        for j in range(keys_per_text):
            algorithm = "gumbel" if j % 2 == 0 else "dual_key_gumbel"
            spec = WatermarkSpec(algorithm=algorithm, coin="keyed" if algorithm != "gumbel" else "ordinary")
            candidates = [Candidate.inline(WatermarkKey(_seed("repair-null", index, j) | (1 << 41), spec))]
            forms_p.append(detect_forms([ids for ids, _ in tokenised], candidates, config)[0].log10_p_value)
            repair_p.append(repair_sum_log10_p(base, candidates[0].key, table)[0] if incremental
                            else repair_log10_p(base, candidates, config, table)[0])
    forms_p, repair_p = np.array(forms_p), np.array(repair_p)
    out = {"null_texts": len(forms_p), "cpu_s": round(time.process_time() - t0, 1)}
    for level in (1e-2, 1e-3):
        k = len(forms_p) * level
        out[f"expected_at_{level}"] = k
        out[f"forms_at_{level}"] = int(np.sum(forms_p <= math.log10(level)))
        for eps, up_to in [(e, None) for e in EPS] + [(0.05, UP_TO)]:
            name = f"eps_{eps}" + (f"_up_to_{up_to}" if up_to else "")
            combined = np.array([combined_log10_p(f, r, eps, up_to) for f, r in zip(forms_p, repair_p)])
            out[f"{name}_at_{level}"] = int(np.sum(combined <= math.log10(level)))
    out["min_log10_p_combined_eps_0.05"] = round(float(min(combined_log10_p(f, r, 0.05)
                                                           for f, r in zip(forms_p, repair_p))), 3)
    print("null", out, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", nargs="?", default="bundled", choices=["bundled", "vllm", "null"])
    parser.add_argument("--texts", type=int, default=288)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--keys-per-text", type=int, default=4, help="null: wrong keys per bundled text")
    parser.add_argument("--first", type=int, default=0,
                        help="bundled: the batch bench.retokenisation --first wrote "
                             "(retokenisation-bundled-from<first>.json)")
    parser.add_argument("--rates", default=None,
                        help="class rates, e.g. 'T=0.7:space=2.8,suffix=4.75,...;T=1.0:...' (cross-fitted: "
                             "each temperature's from the other's texts); default equal weights")
    parser.add_argument("--out", default=None)
    parser.add_argument("--incremental", action="store_true",
                        help="the repair's sum test only, computed incrementally (detector.resegment.sum_repairs)")
    args = parser.parse_args()
    from tokenizers import Tokenizer

    from service.generation_ids import segmentation_table
    from service.model_paths import BUNDLED_DRAFT, resolve_model_path

    rates = None
    if args.rates:
        rates = {part.split(":")[0]: {k: float(v) for k, v in (kv.split("=") for kv in part.split(":")[1].split(","))}
                 for part in args.rates.split(";")}
    meta = _meta("repair")
    meta["command"] = meta["command"].replace("bench.diversity ", "bench.retokenisation_repair ").replace(
        "nice -n 10", "nice -n 15")
    model = BUNDLED_DRAFT if args.source == "vllm" else "bundled"
    tokenizer = Tokenizer.from_file(str(resolve_model_path(model)) + "/tokenizer.json")
    table = segmentation_table(_Backend(tokenizer))
    out: dict = {"meta": meta, "rates": rates, "incremental": args.incremental}
    if args.source == "null":
        items = [item for t in (0.7, 1.0) for item in _items_bundled(args.texts, args.tokens, t)]
        out["null"] = null(items, tokenizer, table, args.keys_per_text, args.incremental)
    elif args.source == "vllm":
        source = json.loads((RESULTS / "retokenisation-vllm.json").read_text())
        out["source"] = source["meta"]["command"]
        out["rows"] = {"T=1.0": evaluate(_items_vllm(), source["rows"]["T=1.0"], tokenizer, table, None,
                                         args.incremental)}
    else:
        tag = f"-from{args.first}" if args.first else ""
        source = json.loads((RESULTS / f"retokenisation-bundled{tag}.json").read_text())
        out["source"] = source["meta"]["command"]
        out["rows"] = {}
        for temperature in (0.7, 1.0):
            print("T =", temperature, flush=True)
            out["rows"][f"T={temperature}"] = evaluate(
                _items_bundled(args.texts, args.tokens, temperature, args.first), source["rows"][f"T={temperature}"],
                tokenizer,
                table, None if rates is None else rates[f"T={temperature}"], args.incremental)
    name = args.out or ("retokenisation-repair" + ("" if args.source == "bundled" else f"-{args.source}")
                        + (f"-from{args.first}" if args.first and args.source == "bundled" else "")
                        + ("-incremental" if args.incremental else "") + ".json")
    path = RESULTS / name
    path.write_text(json.dumps(out, indent=1) + "\n")
    print("wrote", path, flush=True)


if __name__ == "__main__":
    main()
