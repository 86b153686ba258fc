"""The probe guard's bar replayed offline: legitimate public checks and adaptive oracle attacks,
each through the same family placement under several bars (issue 31, fifth round).

    .venv/bin/python -m bench.guard_replay [--texts 4] [--rounds 30] [--out FILE]

No gateway: each query is tokenised as the gateway tokenises a text (the bundled tokenizer;
an attacker's ids decoded to text and encoded again), sketched by ``probe.sketch_of_forms``,
compared by ``probe.related`` with the design's bar, and placed as ``probe.guard`` places it
(every family it is related to; refused if one holds ``per_day`` queries; else recorded in
the largest; an exact repeat answered without counting). Designs:

* ``quarter``: a quarter of the smaller query's windows, at most 100 (round four's bar);
* ``half``: half of them, at most 100 (this round's);
* ``flat32`` / ``flat100``: 32 or 100 windows whatever the sizes (the min-share rule kept);
* ``core``: tried, not adopted: a family of two or more queries is matched by containing half
  of its *core* (the windows at least two of its queries hold: fresh junk never repeats, so
  padding is not in it), a one-query family by the half bar;
* ``exposure9``: tried, not adopted: the half bar, and a query refused when 32 of its windows
  were each in 9 answered queries of the window (whatever their families).

Legitimate use: bench.legit_use's 150 public texts (50 addresses x 3, one family space).
Attacks, each on ``--texts`` licence chunks of >= 205 tokens in a fresh space, counted as the
queries answered before the first refusal (at most ``--rounds``):

* shapes: ``plain``; ``padding`` (1.5x fresh junk after); ``interleave12/4`` and
  ``interleave6/4`` (that many tokens of the text, then of fresh junk; 6/4 leaves the detector
  2 windows of every 6 tokens, a third of the text's windows); ``split`` (halves alternating,
  110 junk tokens: bench.oracle_variants' splitting); ``split_padded`` (the same with 400 junk
  tokens); ``thirds`` (thirds in turn, 400 junk tokens);
* edits: ``strip5`` (5 % of tokens more each round, cumulative), ``spoof`` (5 fresh token
  changes to the base text each query), ``strip15`` (15 % a round), ``fresh30`` (each query
  the base text with a fresh random 30 % of its tokens changed: many distinct variants).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

from service.access import probe

DESIGNS = {
    "quarter": {"absolute": 32, "density": 0.25, "cap": 400},
    "half": {"absolute": 32, "density": 0.5, "cap": 200},
    "flat32": {"absolute": 32, "density": 0.0, "cap": 0},
    "flat100": {"absolute": 100, "density": 0.0, "cap": 0},
}
SHAPES = ("plain", "padding", "interleave12/4", "interleave6/4", "split", "split_padded", "thirds")
EDITS = {"strip5": 0.05, "spoof": 0.0, "strip15": 0.15, "fresh30": 0.30}
SECRET = b"guard-replay".ljust(64, b"\0")


class Space:
    """One family space as ``probe.guard`` keeps it, in memory (no store)."""

    def __init__(self, design: dict, per_day: int = 3, min_share: float = 0.5) -> None:
        self.design, self.per_day, self.min_share = design, per_day, min_share
        self.rows: list[tuple[str, probe.Sketch]] = []
        self.counts: dict[str, int] = defaultdict(int)

    def _place(self, query: probe.Sketch, matched: set[str]) -> bool:
        """Refused if a matched family is spent; else the query joins the fullest matched family
        (or starts one), as probe.guard places it."""
        if any(self.counts[f] >= self.per_day for f in matched):
            return False
        family = max(matched, key=lambda f: (self.counts[f], f)) if matched else f"f{len(self.rows)}"
        self.rows.append((family, query))
        self.counts[family] += 1
        return True

    def ask(self, query: probe.Sketch) -> bool:
        matched: set[str] = set()
        for family, other in self.rows:
            if probe.same_query(query, other):
                return True
            if family not in matched and probe.related(query, other, self.min_share, **self.design):
                matched.add(family)
        return self._place(query, matched)


class CoreSpace(Space):
    def _core(self, family: str) -> set[int]:
        seen: dict[int, int] = defaultdict(int)
        for f, sketch in self.rows:
            if f == family:
                for h in sketch.hashes:
                    seen[h] += 1
        return {h for h, n in seen.items() if n >= 2}

    def ask(self, query: probe.Sketch) -> bool:
        members: dict[str, list[probe.Sketch]] = defaultdict(list)
        for family, other in self.rows:
            if probe.same_query(query, other):
                return True
            members[family].append(other)
        matched = set()
        for family, sketches in members.items():
            if len(sketches) == 1:
                if probe.related(query, sketches[0], self.min_share, **self.design):
                    matched.add(family)
            else:
                core = self._core(family)
                if len(query.hashes & core) >= max(32, 0.5 * len(core)):
                    matched.add(family)
        return self._place(query, matched)


class ExposureSpace(Space):
    def __init__(self, design: dict, exposures: int = 9, bar: int = 32) -> None:
        super().__init__(design)
        self.seen: dict[int, int] = defaultdict(int)
        self.exposures, self.bar = exposures, bar

    def ask(self, query: probe.Sketch) -> bool:
        if any(probe.same_query(query, other) for _, other in self.rows):
            return True
        if sum(1 for h in query.hashes if self.seen[h] >= self.exposures) >= self.bar:
            return False
        if not super().ask(query):
            return False
        for h in query.hashes:
            self.seen[h] += 1
        return True


SPACES = {"core": (CoreSpace, DESIGNS["half"]), "exposure9": (ExposureSpace, DESIGNS["half"])}


def _space(name: str) -> Space:
    kind, design = SPACES.get(name, (Space, DESIGNS.get(name)))
    return kind(design)


def _sketch(ids: list[int]) -> probe.Sketch:
    return probe.sketch_of_forms(SECRET, [ids])


def legit(name: str, texts: list[list[int]]) -> list[int]:
    """The indices of bench.legit_use's public texts the guard refuses, in its order."""
    space = _space(name)
    return [i for i, ids in enumerate(texts) if not space.ask(_sketch(ids))]


class Attacker:
    def __init__(self, tokenizer, words: list[int], rng: random.Random) -> None:
        self.tok, self.words, self.rng = tokenizer, words, rng

    def junk(self, n: int) -> list[int]:
        return [self.rng.choice(self.words) for _ in range(n)]

    def sent(self, ids: list[int]) -> list[int]:
        """What the gateway sketches: the attacker's ids as text, tokenised again."""
        return self.tok(self.tok.decode(ids), add_special_tokens=False)["input_ids"]

    def shape(self, kind: str, ids: list[int], turn: int) -> list[int]:
        if kind == "plain":
            return ids
        if kind == "padding":
            return ids + self.junk(int(1.5 * len(ids)))
        if kind.startswith("interleave"):
            keep, junk = map(int, kind[len("interleave"):].split("/"))
            out: list[int] = []
            for i in range(0, len(ids), keep):
                out += ids[i:i + keep] + self.junk(junk)
            return out
        if kind in ("split", "split_padded"):
            half = ids[: len(ids) // 2] if turn % 2 == 0 else ids[len(ids) // 2:]
            return half + self.junk(110 if kind == "split" else 400)
        if kind == "thirds":
            n = len(ids) // 3
            return ids[(turn % 3) * n:(turn % 3 + 1) * n] + self.junk(400)
        raise ValueError(kind)

    def run(self, space: Space, base: list[int], kind: str, edit: str, rounds: int) -> int:
        """Queries answered before the first refusal (at most ``rounds``)."""
        ids = list(base)
        for turn in range(rounds):
            if turn and edit in ("strip5", "strip15"):
                for p in self.rng.sample(range(len(ids)), max(1, round(EDITS[edit] * len(ids)))):
                    ids[p] = self.rng.choice(self.words)
                query = ids
            elif turn and edit in ("spoof", "fresh30"):
                query = list(base)
                for p in self.rng.sample(range(len(query)), 5 if edit == "spoof" else round(0.3 * len(query))):
                    query[p] = self.rng.choice(self.words)
            else:
                query = ids
            if not space.ask(_sketch(self.sent(self.shape(kind, query, turn)))):
                return turn
        return rounds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--texts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--designs", default=",".join([*DESIGNS, *SPACES]))
    parser.add_argument("--out", type=Path, default=Path("bench/results/guard-replay.json"))
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from bench.legit_use import _distinct_texts
    from bench.oracle_attack import human_texts
    from service.model_paths import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(os.environ.get("HALLMARK_TEST_MODEL", "bundled")))
    started = time.time()
    humans = _distinct_texts(tokenizer, 150)
    random.Random(31).shuffle(humans)  # bench.legit_use's order
    public = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in humans]
    bases = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in human_texts(tokenizer, args.texts)]
    vocab = tokenizer.get_vocab()
    words = [i for t, i in vocab.items() if t.startswith("Ġ") and t[1:].isalpha() and len(t) > 3]
    results: dict = {"legit_refused": {}, "attacks": {}}
    for name in args.designs.split(","):
        refused = legit(name, public)
        results["legit_refused"][name] = {"answered": f"{len(public) - len(refused)}/{len(public)}", "refused": refused}
        print(name, "legit", results["legit_refused"][name], flush=True)
        attacker = Attacker(tokenizer, words, random.Random(args.seed))
        table = {}
        for kind in SHAPES:
            for edit in EDITS:
                table[f"{kind} {edit}"] = [attacker.run(_space(name), base, kind, edit, args.rounds) for base in bases]
        results["attacks"][name] = table
        print(name, json.dumps(table), flush=True)
    results.update({"rounds": args.rounds, "texts": args.texts, "seed": args.seed,
                    "command": " ".join([".venv/bin/python -m bench.guard_replay", *sys.argv[1:]]),
                    "seconds": round(time.time() - started, 1), "load_average_at_end": os.getloadavg()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
