"""CPU time of the detection core alone: :func:`detector.forms.detect_forms` over two forms
of a ~200-token text (the text and the same text with one token dropped, as normalisation
leaves it), through :func:`detector.multikey.detect_many` as the service calls it.

    .venv/bin/python -m bench.detect_forms_cpu [--repeats 50] [--rounds 7] [--out FILE]

Cases: a dual key (one candidate) and a `diverse` gumbel key (its 16 salted candidates, as
a text the ledger does not name is tested), each on a watermarked, an edited (40 of 200
tokens replaced) and a human-like text. Figures: the median over ``--rounds`` of the mean
CPU ms (time.process_time) per call over ``--repeats`` calls. It imports only
detector.forms.detect_forms, detect_many and the key types, so the same file runs against
an older tree (PYTHONPATH=that tree) for a before/after comparison.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from bench import rows  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", default=None, help="append one JSON line with the figures")
    args = parser.parse_args()

    from detector.detect import DetectorConfig
    from detector.forms import detect_forms
    from detector.multikey import KeySet, detect_many
    from detector.result import Candidate, salted_candidates
    from tests.synthetic import generate, human_like
    from watermark import jit
    from watermark.key import WatermarkKey
    from watermark.spec import WatermarkSpec

    jit.load()
    dual = WatermarkKey(0xD0A1, WatermarkSpec(algorithm="dual_key_gumbel"))
    diverse = WatermarkKey(0xD17E, WatermarkSpec(mode="diverse"))
    cases = {}
    for name, key, candidates in (("dual", dual, [Candidate.inline(dual)]),
                                  ("diverse16", diverse, salted_candidates([Candidate.inline(diverse)]))):
        marked, _ = generate(key.with_salt(5) if key.spec.mode == "diverse" else key, 200, seed=1)
        edited = list(marked)
        rng = np.random.default_rng(0)
        for i in rng.choice(200, 40, replace=False):
            edited[int(i)] = int(rng.integers(1, 2000))
        for text_name, tokens in (("marked", marked), ("edited", edited), ("null", human_like(200, seed=3))):
            cases[f"{name}/{text_name}"] = ([tokens, tokens[:50] + tokens[51:]], KeySet.of(candidates))
    row = {"label": args.label, "cpu_ms_per_call": {}, "log10_p": {}}
    for name, (forms, keyset) in cases.items():
        result, _ = detect_forms(forms, keyset, DetectorConfig(), run=detect_many)  # warm
        row["log10_p"][name] = result.log10_p_value
        per_round = []
        for _ in range(args.rounds):
            start = time.process_time()
            for _ in range(args.repeats):
                detect_forms(forms, keyset, DetectorConfig(), run=detect_many)
            per_round.append((time.process_time() - start) / args.repeats * 1e3)
        row["cpu_ms_per_call"][name] = round(statistics.median(per_round), 4)
    row["load_average"] = os.getloadavg()
    rows.emit(row, args.out)


if __name__ == "__main__":
    main()
