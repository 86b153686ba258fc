"""Oracle attacks on the detector through each access tier, over HTTP against a running gateway.

    .venv/bin/python -m bench.oracle_attack [--spoof-attempts 100] [--strip-texts 20] [--out FILE]

Starts `hallmark serve` (bundled model, fresh SQLite store, tenant acme with a dual key, the
DEFAULT budgets and probe guard) and runs the three attacks of issue 22 from their description:

* spoof: start from a >= 200-token human text (chunks of the licence texts under
  /usr/share/common-licenses) and make it read as watermarked. With per-token evidence (per
  round: at the start of each 5-token window whose scores are weak, propose another token;
  keep it only if the window's scores rose). Without evidence the attacker has one number or
  word per query (the tenant's rounded p, the public band): per round it proposes 5 random
  token changes and keeps them if that signal improved.
* strip with evidence: from a 200-token generation, per round replace the highest-scoring
  2.5 % of tokens, then (once the watermark is gone) break the 8-grams still shared with the
  ledger; until neither the watermark nor the ledger is a basis.
* strip blind: 5 % random token changes per round until neither basis remains.

Tiers: public (no token; every attempt from its own loopback address, i.e. an attacker with
many addresses, each with a fresh per-address budget), tenant (acme's token), tenant with the
``evidence`` scope, expert. An attempt ends on success, on a refusal (429: budget, probe guard)
or after --max-rounds queries. "No detector access": the same random edits, checked offline
with the expert token (ground truth, not the attacker's), gives the fraction of changed
tokens a blind attacker must apply to strip 90 % of texts.

Replacement tokens are drawn from the model's vocabulary (word tokens with a leading space);
"tokens changed" counts distinct positions the attacker replaced.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

from bench.gateway import cpu_gateway, provision_store
from keys.lifecycle import create_key
from keys.tenants import create_tenant
from keys.tokens import grant_scope, issue_token
from watermark.spec import WatermarkSpec

MODEL = os.environ.get("HALLMARK_TEST_MODEL", "bundled")
TIERS = ("public", "tenant", "tenant_evidence", "expert")


def _provision(tmp: Path) -> tuple[dict[str, str], dict[str, str]]:
    def populate(session, keyring) -> dict[str, str]:
        create_tenant(session, name="acme", actor="bench")
        create_key(session, keyring, tenant="acme", actor="bench", spec=WatermarkSpec(algorithm="dual_key_gumbel"))
        tokens = {"tenant": issue_token(session, tenant="acme", actor="bench").raw_token}
        issued = issue_token(session, tenant="acme", actor="bench")
        grant_scope(session, token_id=issued.info.token_id, scope="evidence", actor="bench")
        tokens["tenant_evidence"] = issued.raw_token
        tokens["expert"] = issue_token(session, tenant=None, expert=True, actor="bench").raw_token
        for extra in ("tenant2", "tenant3"):  # many tokens of one tenant (issue 31)
            tokens[extra] = issue_token(session, tenant="acme", actor="bench").raw_token
        tokens["tenant_admin"] = issue_token(session, tenant="acme", admin=True, actor="bench").raw_token
        return tokens

    return provision_store(tmp, populate)


def human_texts(tokenizer, n: int, min_tokens: int = 205) -> list[str]:
    words = []
    for path in sorted(Path("/usr/share/common-licenses").iterdir()):
        if path.is_file():
            words += path.read_text(errors="ignore").split()
    texts, i = [], 0
    while len(texts) < n and i < len(words):
        chunk = " ".join(words[i:i + 170])
        i += 170
        if len(tokenizer(chunk, add_special_tokens=False)["input_ids"]) >= min_tokens:
            texts.append(chunk)
    return texts


def answer_of(r: httpx.Response, tier: str) -> dict:
    """What an attacker learns from one detection answer: refused (the error code), or the
    verdict, whether the ledger vouched, a signal to climb (the band on the public tier, else
    -log10 p) and the per-token scores where the tier returns them."""
    if r.status_code == 429:
        return {"refused": r.json()["error"]["code"]}
    r.raise_for_status()
    d = r.json()
    if tier == "public":
        signal = {"none": 0, "moderate": 1, "strong": 2}[d["confidence"]]
        return {"refused": None, "watermarked": d["verdict"] == "watermarked", "ledger": "ledger" in d["basis"],
                "signal": signal, "scores": None}
    scores = None
    if d.get("evidence"):
        scores = [t["score"] if t["score"] is not None else 0.0 for t in d["evidence"]["tokens"]]
    return {"refused": None, "watermarked": d["watermarked"], "ledger": "ledger" in d["basis"],
            # Above its threshold the tenant tier shows only the band "p > threshold" (p fields null):
            # no gradient, the same signal for every such text.
            "signal": -float(d["log10_p_value"]) if d.get("log10_p_value") is not None else 0.0, "scores": scores}


class Oracle:
    """One tier's view of a detection: (refused, watermarked, ledger, signal, scores)."""

    def __init__(self, url: str, tier: str, token: str | None, address: str | None = None) -> None:
        self.tier = tier
        transport = httpx.HTTPTransport(local_address=address) if address else None
        self.client = httpx.Client(base_url=url, timeout=120, transport=transport,
                                   headers={"Authorization": f"Bearer {token}"} if token else {})
        self.queries = 0

    def ask(self, text: str) -> dict:
        self.queries += 1
        r = self._post(text)
        while r.status_code == 429 and r.json()["error"]["code"] == "rate_limited":
            # The per-request rate (600 a minute) only slows an attacker down: wait and go on.
            time.sleep(float(r.headers.get("Retry-After", "1")))
            r = self._post(text)
        return answer_of(r, self.tier)

    def _post(self, text: str) -> httpx.Response:
        if self.tier == "public":
            return self.client.post("/v1/public/detect", json={"text": text})
        return self.client.post("/v1/detect", json={"text": text, "evidence": self.tier != "tenant"})

    def close(self) -> None:
        self.client.close()


class Editor:
    def __init__(self, tokenizer, rng: random.Random) -> None:
        self.tok = tokenizer
        self.rng = rng
        vocab = tokenizer.get_vocab()
        self.words = [i for t, i in vocab.items() if t.startswith("Ġ") and t[1:].isalpha() and len(t) > 3]

    def text(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def other(self, token: int) -> int:
        while True:
            new = self.rng.choice(self.words)
            if new != token:
                return new


def spoof(oracle: Oracle, editor: Editor, text: str, max_rounds: int) -> dict:
    ids = editor.tok(text, add_special_tokens=False)["input_ids"]
    original = list(ids)
    answer = oracle.ask(editor.text(ids))
    for _ in range(max_rounds):
        if answer.get("refused"):
            break
        if answer["watermarked"]:
            break
        scores = answer["scores"]
        if scores is not None and len(scores) == len(ids):
            windows = [w for w in range(0, len(ids) - 5, 5) if sum(scores[w:w + 5]) < 5.0]
            trial = list(ids)
            for w in windows:
                trial[w] = editor.other(ids[w])
            new = oracle.ask(editor.text(trial))
            if new.get("refused"):
                answer = new
                break
            new_scores = new["scores"]
            if new_scores is None or len(new_scores) != len(trial):
                ids, answer = trial, new
                continue
            kept = list(ids)
            for w in windows:
                if sum(new_scores[w:w + 5]) > sum(scores[w:w + 5]):
                    kept[w] = trial[w]
            ids = kept
            answer = new if kept == trial else oracle.ask(editor.text(ids))
        else:
            trial = list(ids)
            for p in editor.rng.sample(range(len(ids)), 5):
                trial[p] = editor.other(ids[p])
            new = oracle.ask(editor.text(trial))
            if new.get("refused"):
                answer = new
                break
            if new["signal"] > answer["signal"] or new["watermarked"]:
                ids, answer = trial, new
    changed = sum(a != b for a, b in zip(ids, original))
    return {"success": bool(answer.get("watermarked")) and not answer.get("refused"), "queries": oracle.queries,
            "refused": answer.get("refused"), "changed": changed, "tokens": len(original), "final_ids": ids}


def strip(oracle: Oracle, editor: Editor, ids: list[int], max_rounds: int, *, with_evidence: bool) -> dict:
    original = list(ids)
    ids = list(ids)
    changed: set[int] = set()
    answer = oracle.ask(editor.text(ids))
    for _ in range(max_rounds):
        if answer.get("refused") or (not answer["watermarked"] and not answer["ledger"]):
            break
        scores = answer.get("scores")
        if with_evidence and scores is not None and len(scores) == len(ids) and answer["watermarked"]:
            top = sorted(range(len(ids)), key=lambda i: -scores[i])[:max(1, round(0.025 * len(ids)))]
        elif with_evidence and not answer["watermarked"]:
            top = []
        else:
            free = [i for i in range(len(ids)) if i not in changed] or list(range(len(ids)))
            top = editor.rng.sample(free, min(len(free), max(1, round(0.05 * len(ids)))))
        for p in top:
            ids[p] = editor.other(ids[p])
            changed.add(p)
        if with_evidence and not answer["watermarked"] and answer["ledger"]:
            run = 0
            for p in range(len(ids)):
                run = 0 if p in changed else run + 1
                if run >= 8:
                    ids[p] = editor.other(ids[p])
                    changed.add(p)
                    run = 0
        answer = oracle.ask(editor.text(ids))
    done = not answer.get("refused") and not answer["watermarked"] and not answer["ledger"]
    return {"success": done, "queries": oracle.queries, "refused": answer.get("refused"),
            "changed": sum(a != b for a, b in zip(ids, original)), "tokens": len(original), "final_ids": ids}


def blind_fraction(truth: Oracle, editor: Editor, ids: list[int], max_rounds: int) -> float | None:
    """Changed share at which random 5 % rounds first strip the text (checked with ground truth)."""
    result = strip(truth, editor, ids, max_rounds, with_evidence=False)
    return result["changed"] / result["tokens"] if result["success"] else None


def _summary(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["success"]]
    refused = {}
    for r in rows:
        if r["refused"]:
            refused[r["refused"]] = refused.get(r["refused"], 0) + 1
    fractions = [r["changed"] / r["tokens"] for r in ok]
    return {"attempts": len(rows), "successes": len(ok), "success_rate": round(len(ok) / max(1, len(rows)), 4),
            "refused": refused,
            "median_queries_success": statistics.median([r["queries"] for r in ok]) if ok else None,
            "median_changed_share_success": round(statistics.median(fractions), 4) if ok else None,
            "min_changed_share_success": round(min(fractions), 4) if ok else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spoof-attempts", type=int, default=100)
    parser.add_argument("--evidence-attempts", type=int, default=20)
    parser.add_argument("--strip-texts", type=int, default=20)
    parser.add_argument("--max-rounds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--out", type=Path, default=Path("bench/results/oracle-attack.json"))
    parser.add_argument("--round2", type=int, default=0, metavar="N",
                        help="issue 31's attacks instead (bench/oracle_variants.py), N attempts per tier and attack")
    parser.add_argument("--attacks", default=None,
                        help="with --round2: only these attacks (comma-separated names of bench/oracle_variants.py)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from service.model_paths import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(MODEL))
    rng = random.Random(args.seed)
    editor = Editor(tokenizer, rng)
    started = time.time()
    with cpu_gateway(_provision, MODEL) as (server, tokens):
        generator = httpx.Client(base_url=server.url, timeout=300,
                                 headers={"Authorization": f"Bearer {tokens['tenant']}"})
        generations = []
        seed = 0
        from bench.oracle_variants import APPLIES
        cells = sum(len(attacks) for attacks in APPLIES.values())
        # Disjoint sets: a tier's probe guard must not see another's texts.
        wanted = max(3 * args.strip_texts, args.strip_texts + (cells + 1) * args.round2)
        while len(generations) < wanted and seed < 5 * wanted:
            seed += 1
            out = generator.post("/v1/generate", json={"prompt": "Write about the history of the town",
                                                      "max_tokens": 210, "seed": seed, "temperature": 1.0}).json()
            if len(out["token_ids"]) >= 200:
                generations.append(out["token_ids"])
        k = args.strip_texts
        if args.round2:
            results = _round2(server.url, tokens, editor, tokenizer, generations, args)
            return _write(results, args, started)
        sets = {"a": generations[:k], "b": generations[k:2 * k], "c": generations[2 * k:3 * k]}
        humans = human_texts(tokenizer, args.spoof_attempts + args.evidence_attempts)
        results: dict = {"spoof": {}, "strip_evidence": {}, "strip_blind": {}}
        address = iter(f"127.0.{i // 250}.{i % 250 + 2}" for i in range(100_000))

        def oracle(tier: str) -> Oracle:
            if tier == "public":
                return Oracle(server.url, tier, None, next(address))
            return Oracle(server.url, tier, tokens[tier])

        # tenant and tenant_evidence are one principal (tenant acme): they get disjoint texts.
        spoof_texts = {"public": humans[:args.spoof_attempts], "tenant": humans[:args.spoof_attempts],
                       "tenant_evidence": humans[args.spoof_attempts:],
                       "expert": humans[:args.evidence_attempts]}
        for tier in TIERS:
            rows = []
            for text in spoof_texts[tier]:
                o = oracle(tier)
                rows.append(spoof(o, editor, text, args.max_rounds))
                o.close()
            results["spoof"][tier] = _summary(rows)
            print("spoof", tier, results["spoof"][tier], flush=True)
        strip_sets = {"public": (None, "a"), "tenant": (None, "a"), "tenant_evidence": ("b", "c"),
                      "expert": ("a", "a")}
        for tier in TIERS:
            evidence_set, blind_set = strip_sets[tier]
            if evidence_set:
                rows = []
                for ids in sets[evidence_set]:
                    o = oracle(tier)
                    rows.append(strip(o, editor, ids, args.max_rounds, with_evidence=True))
                    o.close()
                results["strip_evidence"][tier] = _summary(rows)
                print("strip_evidence", tier, results["strip_evidence"][tier], flush=True)
            rows = []
            for ids in sets[blind_set]:
                o = oracle(tier)
                rows.append(strip(o, editor, ids, args.max_rounds, with_evidence=False))
                o.close()
            results["strip_blind"][tier] = _summary(rows)
            print("strip_blind", tier, results["strip_blind"][tier], flush=True)
        generations = sets["a"]
        truth = Oracle(server.url, "expert", tokens["expert"])
        truth.ask = _unbounded(truth.ask)
        fractions = [blind_fraction(truth, editor, ids, 40) for ids in generations]
        stripped = sorted(f for f in fractions if f is not None)
        results["no_access"] = {
            "texts": len(generations), "stripped_within_40_rounds": len(stripped),
            "median_changed_share": round(statistics.median(stripped), 4) if stripped else None,
            "changed_share_to_strip_90pct": round(stripped[min(len(stripped) - 1, int(0.9 * len(stripped)))], 4)
            if stripped else None}
        print("no_access", results["no_access"], flush=True)
    _write(results, args, started)


def _round2(url, tokens, editor, tokenizer, generations, args) -> dict:
    from bench.oracle_variants import run_round2

    truth = Oracle(url, "expert", tokens["expert"])
    truth.ask = _unbounded(truth.ask)
    baseline_texts = generations[: args.strip_texts]
    fractions = sorted(f for f in (blind_fraction(truth, editor, ids, 40) for ids in baseline_texts) if f is not None)
    blind = {"texts": len(baseline_texts), "stripped_within_40_rounds": len(fractions),
             "changed_share_to_strip_90pct": round(fractions[min(len(fractions) - 1, int(0.9 * len(fractions)))], 4)
             if fractions else None}
    print("no_access", blind, flush=True)
    from bench.oracle_variants import APPLIES
    humans = human_texts(tokenizer, (sum(len(attacks) for attacks in APPLIES.values()) + 1) * args.round2)
    tables = run_round2(url, tokens, editor, humans, generations[args.strip_texts:], truth, attempts=args.round2,
                        max_rounds=args.max_rounds, blind=blind, spoof=spoof, strip=strip,
                        only=set(args.attacks.split(",")) if args.attacks else None)
    return {"no_access": blind, "round2": tables}


def _write(results: dict, args, started: float) -> None:
    results["settings"] = {"budgets": "defaults (service/settings.py)", "max_rounds": args.max_rounds,
                           "seed": args.seed, "model": MODEL}
    results["command"] = " ".join([".venv/bin/python -m bench.oracle_attack", *sys.argv[1:]])
    results["seconds"] = round(time.time() - started, 1)
    results["load_average_at_end"] = os.getloadavg()  # the machine is shared: timings are not the point here
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


def _unbounded(ask):
    return ask


if __name__ == "__main__":
    main()
