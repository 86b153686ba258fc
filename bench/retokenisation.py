"""Detection of generated text as text: what re-tokenising costs (issue 30, item 1);
writes bench/results/retokenisation-<source>.json.

    nice -n 10 .venv/bin/python -m bench.retokenisation bundled [--texts 48 --tokens 100]
    nice -n 10 .venv/bin/python -m bench.retokenisation vllm      # bench/results/vllm-diverse-batch.json's texts

A model may emit a segmentation that its tokenizer's ``encode`` never produces (merged
newline + indent, another split of a word); the text re-encodes differently, and each
changed token costs its own score and those of the w tokens whose contexts hold it. For each
generation, log10 p (default config, its own key) of:

* ``ids``: its token ids (what a ledger exact copy is scored on);
* ``text_forms_before``: its decoded text's forms as main scored them before issue 30's
  changes (as sent, whitespace-collapsed, spaces kept: every distinct one, canonically
  encoded, Bonferroni over the forms);
* ``text_forms``: detector.forms.text_forms's forms (the collapsed one only where a space
  between two words was widened, forms.SPACED_WORDS);
* ``text_forms_runs_merged``: those and the text as sent re-segmented where the model writes
  whitespace runs whole (detector.segmentation.merge_space_runs), one more form only where
  that differs from the encoding: what the service scores now (service.detection);
* ``text_canonical``: the text's canonical encoding alone; ``text_canonical_runs_merged``:
  the re-segmentation in its place (no further test);

unedited; with 10 % of the ids substituted before decoding (an edited copy; a random token
can merge with its neighbours when re-encoded, which no text form can undo); with 10 %
substituted by tokens that re-encode as themselves beside their neighbours (``substituted
10% text-stable``: the edit re-tokenises nothing, so what is lost is the model's own
tokenisation); and at 25- and 50-token prefixes. TPR at 1e-6 and 1e-3, and every text's
log10 p (``log10_p``). The unmatched tokens are classified: whitespace (the token or its
re-encoding is a run of whitespace, merged newline + indent) or within-word (another split
of a word).

* ``bundled``: the local engine on CPU (bundled target + draft, as the service runs it),
  T = 0.7 and 1.0, deterministic `gumbel` and keyed-coin `dual_key_gumbel` keys.
* ``vllm``: the token ids vLLM's CPU build emitted through Hallmark's plugin (bundled dense
  draft model, T = 1), from ``bench.vllm_diverse_batch``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import time

import numpy as np

from bench.diversity import PROMPTS, RESULTS, _meta, _seed, engine_generate

WS = set("ĠĊĉč")  # byte-level BPE's space, newline, tab, carriage return


def _is_ws(token: str) -> bool:
    return bool(token) and all(c in WS for c in token)


def _unmatched(tokenizer, ids: list[int], encoded: list[int]) -> dict:
    a = [tokenizer.id_to_token(t) for t in ids]
    b = [tokenizer.id_to_token(t) for t in encoded]
    out = {"whitespace": 0, "within_word": 0}
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op != "equal":
            ws = any(_is_ws(t) for t in a[i1:i2] + b[j1:j2])
            out["whitespace" if ws else "within_word"] += i2 - i1
    return out


def _stable_substitution(ids: list[int], rate: float, rng, tokenizer) -> list[int]:
    """``rate`` of the ids substituted (positions drawn as bench.robustness.attack draws them),
    each by the first of up to 50 random tokens that re-encodes as itself between its
    neighbours (the original kept where none does)."""
    out = list(ids)
    vocab = tokenizer.get_vocab_size()
    for i in np.flatnonzero(rng.random(len(out)) < rate):
        window = out[max(0, i - 1):i + 2]
        at = min(i, 1)
        for _ in range(50):
            token = int(rng.integers(0, vocab))
            trial = window[:at] + [token] + window[at + 1:]
            if tokenizer.encode(tokenizer.decode(trial, skip_special_tokens=True), add_special_tokens=False).ids == trial:
                out[i] = token
                break
    return out


def _forms_before(text: str) -> list[str]:
    """The texts main scored before issue 30's changes: as sent, collapsed and spaces kept,
    every distinct one (detector.forms.text_forms without SPACED_WORDS)."""
    from detector.normalize import normalize_forms

    both = normalize_forms(text)
    out = [text]
    for candidate in (both.collapsed.text, both.spaces_kept.text):
        if candidate not in out:
            out.append(candidate)
    return out


class _Backend:
    """What service.generation_ids.segmentation_table reads of a transformers tokenizer."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer


CONDITIONS = ("unedited", "substituted 10%", "substituted 10% text-stable", "prefix 50", "prefix 25")


def evaluate(items: list[dict], tokenizer) -> dict:
    """items: {"key", "tokens"}; the scores per condition (see the module docstring)."""
    from bench.robustness import attack
    from detector.detect import DetectorConfig, detect
    from detector.forms import detect_forms, text_forms
    from detector.result import Candidate, salted_candidates
    from detector.segmentation import merge_space_runs
    from service.generation_ids import segmentation_table

    config = DetectorConfig()
    vocab = tokenizer.get_vocab_size()
    table = segmentation_table(_Backend(tokenizer))

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    out = {}
    for condition in CONDITIONS:
        rng = np.random.default_rng(_seed("retok", condition))
        scores = {"ids": [], "text_forms_before": [], "text_forms": [], "text_canonical": [],
                  "text_forms_runs_merged": [], "text_canonical_runs_merged": []}
        retokenised = runs_merged = 0
        differing = {"encode": 0, "runs_merged": 0, "closer": 0, "farther": 0}  # where the form differs
        unmatched = {"whitespace": 0, "within_word": 0}
        for item in items:
            ids = list(item["tokens"])
            if condition.startswith("prefix"):
                ids = ids[:int(condition.split()[1])]
            elif condition == "substituted 10% text-stable":
                ids = _stable_substitution(ids, 0.1, rng, tokenizer)
            elif condition.startswith("substituted"):
                ids = attack(ids, "substitution", 0.1, rng, vocab)
            candidates = salted_candidates([Candidate.inline(item["key"])])
            text = tokenizer.decode(ids, skip_special_tokens=True)
            canonical = tokenizer.encode(text, add_special_tokens=False).ids
            forms, _ = text_forms(text)
            encoded = [encode(f.text) for f in forms]
            before = [encode(t) for t in _forms_before(text)]
            merged = merge_space_runs(text, canonical, table, encode) if table is not None else None
            resegmented = list(merged.token_ids) if merged is not None else canonical
            runs_merged += merged is not None
            if merged is not None:  # tokens differing from the model's ids, encode's and the form's
                was, now = (sum(_unmatched(tokenizer, ids, x).values()) for x in (canonical, resegmented))
                differing["encode"] += was
                differing["runs_merged"] += now
                differing["closer"] += now < was
                differing["farther"] += now > was
            with_merged = [encoded[0], resegmented, *encoded[1:]] if merged is not None else encoded
            scores["ids"].append(detect(ids, candidates, config).log10_p_value)
            scores["text_canonical"].append(detect(canonical, candidates, config).log10_p_value if canonical else 0.0)
            scores["text_forms"].append(detect_forms(encoded, candidates, config)[0].log10_p_value if canonical else 0.0)
            scores["text_forms_before"].append(
                detect_forms(before, candidates, config)[0].log10_p_value if canonical else 0.0)
            scores["text_forms_runs_merged"].append(
                detect_forms(with_merged, candidates, config)[0].log10_p_value if canonical else 0.0)
            scores["text_canonical_runs_merged"].append(
                detect(resegmented, candidates, config).log10_p_value if canonical else 0.0)
            if canonical != ids:
                retokenised += 1
                for k, v in _unmatched(tokenizer, ids, canonical).items():
                    unmatched[k] += v
        row = {"texts": len(items), "retokenised_differently": retokenised, "runs_merged_differs": runs_merged,
               "runs_merged_unmatched": differing,
               "unmatched_tokens": unmatched,
               "tokens": int(sum(min(len(i["tokens"]), int(condition.split()[1])) if condition.startswith("prefix")
                                 else len(i["tokens"]) for i in items))}
        for name, values in scores.items():
            v = np.array(values)
            row[name] = {"tpr_1e-6": float(np.mean(v <= -6)), "tpr_1e-3": float(np.mean(v <= -3)),
                         "median_log10_p": round(float(np.median(v)), 2)}
        ids6 = row["ids"]["tpr_1e-6"]
        row["tpr_1e-6_lost_as_text"] = round(ids6 - row["text_forms"]["tpr_1e-6"], 4)
        row["tpr_1e-3_lost_as_text"] = round(row["ids"]["tpr_1e-3"] - row["text_forms"]["tpr_1e-3"], 4)
        for name in ("text_forms_before", "text_forms_runs_merged", "text_canonical_runs_merged"):
            for level in ("1e-6", "1e-3"):
                row[f"tpr_{level}_lost_{name}"] = round(row["ids"][f"tpr_{level}"] - row[name][f"tpr_{level}"], 4)
        row["log10_p"] = {name: [round(float(x), 3) for x in values] for name, values in scores.items()}
        out[condition] = row
        print(condition, row, flush=True)
    return out


def _generate_cached(jobs: list[dict], tokens: int, temperature: float) -> list[dict]:
    """engine_generate's token ids, kept under var/ (keyed by the jobs' seeds) so that a
    re-evaluation of the same texts does not regenerate them; the keys are the jobs' own."""
    import hashlib
    from pathlib import Path

    tag = hashlib.sha256(repr((tokens, temperature, [j["seed"] for j in jobs])).encode()).hexdigest()[:16]
    path = Path(__file__).resolve().parent.parent / "var" / f"retok-bundled-{tag}.json"
    if path.exists():
        cached = json.loads(path.read_text())
        return [{**job, "tokens": ids} for job, ids in zip(jobs, cached)]
    done = engine_generate(jobs, tokens, temperature)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps([d["tokens"] for d in done]))
    return done


def run_bundled(texts: int, tokens: int, first: int = 0) -> dict:
    from tokenizers import Tokenizer

    from service.model_paths import resolve_model_path
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    tokenizer = Tokenizer.from_file(str(resolve_model_path("bundled")) + "/tokenizer.json")
    out = {}
    for temperature in (0.7, 1.0):
        jobs = []
        for i in range(first, first + texts):
            algorithm = "gumbel" if i % 2 == 0 else "dual_key_gumbel"
            spec = WatermarkSpec(algorithm=algorithm, coin="keyed" if algorithm != "gumbel" else "ordinary")
            jobs.append({"prompt": PROMPTS[i % len(PROMPTS)], "seed": _seed("retok-bench", temperature, i),
                         "key": WatermarkKey(_seed("retok-bench-key", i) | (1 << 40), spec)})
        t0 = time.perf_counter()
        done = _generate_cached(jobs, tokens, temperature)
        out[f"T={temperature}"] = {"generation_s": round(time.perf_counter() - t0, 1),
                                   **evaluate([d for d in done if d["tokens"]], tokenizer)}
    return {"source": "bundled target + draft (local engine, CPU)", "tokens": tokens, "first": first, "rows": out}


def run_vllm() -> dict:
    from tokenizers import Tokenizer

    from bench.vllm_diverse_batch import RESULTS_NAME, bench_keys
    from service.model_paths import BUNDLED_DRAFT, resolve_model_path

    source = json.loads((RESULTS / RESULTS_NAME).read_text())
    keys = bench_keys()
    tokenizer = Tokenizer.from_file(str(resolve_model_path(BUNDLED_DRAFT)) + "/tokenizer.json")
    items = [{"key": keys[r["scheme"]] if r["salt"] is None else keys[r["scheme"]].with_salt(r["salt"]),
              "tokens": r["token_ids"]} for r in source["rows"] if r["token_ids"]]
    return {"source": f"vLLM CPU + plugin, bundled dense draft, T = 1 ({source['meta']['command']})",
            "rows": {"T=1.0": evaluate(items, tokenizer)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", choices=["bundled", "vllm"])
    parser.add_argument("--texts", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--first", type=int, default=0,
                        help="bundled: the first text's index (a further, disjoint batch of seeds; written to "
                             "retokenisation-bundled-from<first>.json)")
    args = parser.parse_args()
    meta = _meta(args.source)
    meta["command"] = meta["command"].replace("bench.diversity ", "bench.retokenisation ")
    payload = run_bundled(args.texts, args.tokens, args.first) if args.source == "bundled" else run_vllm()
    path = RESULTS / f"retokenisation-{args.source}{f'-from{args.first}' if args.first else ''}.json"
    path.write_text(json.dumps({"meta": meta, **payload}, indent=1) + "\n")
    print("wrote", path, flush=True)


if __name__ == "__main__":
    main()
