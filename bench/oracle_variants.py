"""Issue 31's second-round attacks on the detection oracle, for bench/oracle_attack.py.

Each attack is a way of asking the same question (one tier's answer about the attacker's
current text) that tried to get more answers than the probe guard allows:

* ``plain``: the text as it is (round one's attack; with the tenant tier this is the
  rounded-p ratchet);
* ``padding``: the text plus 1.5 x its length of fresh random vocabulary words each query;
* ``interleaving``: 12 tokens of the text, 4 of fresh junk, and so on;
* ``splitting``: each query one half of the text (alternating), padded to the public minimum;
* ``splitting_padded``: the same with 400 junk tokens (padding past the probe bar's cap: issue
  31, fifth round, bench.guard_replay);
* ``interleaving_fine``: 6 tokens of the text, 4 of fresh junk, and so on (a third of the
  text's windows reach the detector: fewer than the bar's cap of 100);
* ``fresh_edits``: strip only: each query the generation with a fresh random 30 % of its
  tokens changed (distinct variants, none an edit of another), until one is not a basis;
* ``flushing``: on a probe-guard refusal, 520 junk checks, then the query again;
* ``many_tokens``: each query through the next of three tokens of one tenant (tenant tiers);
* ``admin_token``: the tenant's own admin token (`tokens issue --tenant T --admin`);
* ``many_addresses``: each query from a new address in a new /24 (public; a Sybil with many
  networks: since the third round every public caller shares one family space);
* ``xff``: a new ``X-Forwarded-For`` per query (public; no proxy is trusted by default).
"""

from __future__ import annotations

import itertools
import random
import time

import httpx

from bench.oracle_attack import answer_of

ADAPTIVE = ("splitting_padded", "interleaving_fine", "fresh_edits")
ATTACKS = ("plain", "padding", "interleaving", "splitting", "flushing", "many_tokens", "admin_token",
           "many_addresses", "xff") + ADAPTIVE
APPLIES = {"public": ("plain", "padding", "interleaving", "splitting", "flushing", "many_addresses", "xff") + ADAPTIVE,
           "tenant": ("plain", "padding", "interleaving", "splitting", "flushing", "many_tokens", "admin_token")
           + ADAPTIVE,
           "expert": ("plain",)}
FRESH_SHARE = 0.30


class VariantOracle:
    """An Oracle (bench.oracle_attack) whose queries are sent the attack's way."""

    def __init__(self, url: str, tier: str, tokens: list[str], attack: str, editor, rng: random.Random,
                 addresses) -> None:
        self.url, self.tier, self.tokens, self.attack = url, tier, tokens, attack
        self.editor, self.rng, self.addresses = editor, rng, addresses
        self.queries = 0
        self._token = itertools.cycle(tokens) if tokens else None
        self._half = 0
        self._client = self._new_client(next(addresses) if tier == "public" else None)

    def _new_client(self, address: str | None) -> httpx.Client:
        transport = httpx.HTTPTransport(local_address=address) if address else None
        return httpx.Client(base_url=self.url, timeout=120, transport=transport)

    def _junk(self, n: int) -> str:
        return self.editor.text([self.editor.other(0) for _ in range(n)])

    def _shape(self, text: str) -> str:
        ids = self.editor.tok(text, add_special_tokens=False)["input_ids"]
        if self.attack == "padding":
            return text + self._junk(int(1.5 * len(ids)))
        if self.attack in ("interleaving", "interleaving_fine"):
            keep = 12 if self.attack == "interleaving" else 6
            out: list[int] = []
            for i in range(0, len(ids), keep):
                out += ids[i:i + keep] + [self.editor.other(0) for _ in range(4)]
            return self.editor.text(out)
        if self.attack in ("splitting", "splitting_padded"):
            self._half ^= 1
            half = ids[: len(ids) // 2] if self._half else ids[len(ids) // 2:]
            return self.editor.text(half) + self._junk(110 if self.attack == "splitting" else 400)
        return text

    def _post(self, text: str) -> httpx.Response:
        headers = {}
        if self.attack == "many_addresses":
            self._client.close()
            self._client = self._new_client(next(self.addresses))
        if self.attack == "xff":
            headers["X-Forwarded-For"] = f"{self.rng.randrange(1, 223)}.{self.rng.randrange(256)}.0.1"
        if self.tier == "public":
            return self._client.post("/v1/public/detect", json={"text": text}, headers=headers)
        headers["Authorization"] = f"Bearer {next(self._token)}"
        return self._client.post("/v1/detect", json={"text": text}, headers=headers)

    def _send(self, text: str) -> httpx.Response:
        r = self._post(text)
        while r.status_code == 429 and r.json()["error"]["code"] == "rate_limited":
            time.sleep(float(r.headers.get("Retry-After", "1")))
            r = self._post(text)
        return r

    def ask(self, text: str) -> dict:
        self.queries += 1
        r = self._send(self._shape(text))
        if r.status_code == 429 and self.attack == "flushing" and r.json()["error"]["code"] == "probe_guard":
            for _ in range(520):
                self._send(self._junk(8))
            r = self._send(self._shape(text))
        answer = answer_of(r, self.tier)
        return answer if answer["refused"] else {**answer, "scores": None}  # these attacks climb the signal alone

    def close(self) -> None:
        self._client.close()



def _count_refusal(refused: dict, result: dict) -> None:
    """Tally an attempt's refusal (its error code) in ``refused``."""
    if result["refused"]:
        refused[result["refused"]] = refused.get(result["refused"], 0) + 1

def strip_fresh(oracle, editor, ids: list[int], max_rounds: int, share: float = FRESH_SHARE) -> dict:
    """Each query the original with a fresh random ``share`` of its tokens changed, until one
    answer says neither the watermark nor the ledger is a basis (or a refusal)."""
    original = list(ids)
    trial = list(ids)
    answer = {"refused": None, "watermarked": True, "ledger": True}
    for _ in range(max_rounds):
        trial = list(original)
        for p in editor.rng.sample(range(len(trial)), round(share * len(trial))):
            trial[p] = editor.other(trial[p])
        answer = oracle.ask(editor.text(trial))
        if answer.get("refused") or (not answer["watermarked"] and not answer["ledger"]):
            break
    done = not answer.get("refused") and not answer["watermarked"] and not answer["ledger"]
    return {"success": done, "queries": oracle.queries, "refused": answer.get("refused"),
            "changed": sum(a != b for a, b in zip(trial, original)), "tokens": len(original), "final_ids": trial}


def verified(truth, editor, ids_or_text, *, watermarked: bool) -> bool:
    """What the expert tier (ground truth, not the attacker's view) says of the final text."""
    text = ids_or_text if isinstance(ids_or_text, str) else editor.text(ids_or_text)
    answer = truth.ask(text)
    if watermarked:
        return bool(answer.get("watermarked"))
    return not answer.get("watermarked") and not answer.get("ledger")


def run_round2(url: str, tokens: dict[str, str], editor, humans: list[str], generations: list[list[int]],
               truth, *, attempts: int, max_rounds: int, blind: dict, spoof, strip,
               only: set[str] | None = None) -> dict:
    """One table per tier: each attack's spoof and blind-strip outcomes, judged by the expert
    tier (ground truth), with the no-access baseline beside each strip figure."""
    rng = editor.rng
    addresses = (f"127.{a}.{b}.2" for a in range(1, 250) for b in range(250))
    tables: dict = {}
    texts = iter(humans)
    strips = iter(generations)
    for tier, attacks in APPLIES.items():
        table = {}
        for attack in attacks:
            if only is not None and attack not in only:
                continue
            if tier == "tenant":
                chosen = {"many_tokens": [tokens["tenant"], tokens["tenant2"], tokens["tenant3"]],
                          "admin_token": [tokens["tenant_admin"]]}.get(attack, [tokens["tenant"]])
            elif tier == "expert":
                chosen = [tokens["expert"]]
            else:
                chosen = []
            spoofed, stripped, changed, queries, strip_queries, refused = 0, 0, [], [], [], {}
            for _ in range(attempts):
                if attack != "fresh_edits":  # a strip strategy only (its spoof would be plain's)
                    oracle = VariantOracle(url, tier, chosen, attack, editor, rng, addresses)
                    result = spoof(oracle, editor, next(texts), max_rounds)
                    oracle.close()
                    queries.append(result["queries"])
                    _count_refusal(refused, result)
                    if verified(truth, editor, result["final_ids"], watermarked=True):
                        spoofed += 1
                oracle = VariantOracle(url, tier, chosen, attack, editor, rng, addresses)
                if attack == "fresh_edits":
                    result = strip_fresh(oracle, editor, next(strips), max_rounds)
                else:
                    result = strip(oracle, editor, next(strips), max_rounds, with_evidence=False)
                oracle.close()
                strip_queries.append(result["queries"])
                _count_refusal(refused, result)
                if verified(truth, editor, result["final_ids"], watermarked=False):
                    stripped += 1
                    changed.append(round(result["changed"] / result["tokens"], 3))
            table[attack] = {"spoof": f"{spoofed}/{attempts}" if queries else "-", "strip": f"{stripped}/{attempts}",
                             "strip_changed_shares": sorted(changed),
                             "blind_baseline_share_90pct": blind.get("changed_share_to_strip_90pct"),
                             "median_queries": sorted(queries)[len(queries) // 2] if queries else None,
                             "strip_queries": strip_queries, "refused": refused}
            print(tier, attack, table[attack], flush=True)
        tables[tier] = table
    return tables
