"""The plugin's Triton path (GPU deduper + fused sampler) against its CPU path, step by step.

Run as ``TRITON_INTERPRET=1 python -m tests.service.plugin_state_checks`` (the variable must
be set before the kernels are imported): both paths of PluginState serve the same requests
(single and dual key, context widths 1..5, every dedup scope, a top-k row, a temperature
row) on the same logits, the driver appending each drawn token to the output lists as vLLM
does and swapping two rows midway; every step's tokens must be identical.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from service.engines.vllm.plugin_state import PluginState, RequestSpec


def main(seed: int = 0) -> int:
    gen = torch.Generator().manual_seed(seed)
    specs = [
        RequestSpec(key_a=2**64 - 5, key_b=7, alpha=0.0, stream_key=11, width=1, scope="single_turn",
                    max_history=None, temperature=1.0, top_k=0, top_p=1.0),
        RequestSpec(key_a=123, key_b=2**63 + 9, alpha=0.5, stream_key=2**64 - 1, width=3, scope="all",
                    max_history=4, temperature=0.7, top_k=0, top_p=1.0),
        RequestSpec(key_a=99, key_b=99, alpha=0.0, stream_key=5, width=2, scope="none", max_history=None,
                    temperature=1.3, top_k=40, top_p=1.0),
        RequestSpec(key_a=2**40 + 1, key_b=3, alpha=1.0, stream_key=8, width=5, scope="single_turn",
                    max_history=2, temperature=1.0, top_k=0, top_p=1.0),
    ]
    vocab, steps = 300, 14
    states = {"cpu": PluginState(torch.device("cpu"), slots=2, capacity=64),
              "kernels": PluginState(torch.device("cpu"), slots=2, capacity=64, kernels=True)}
    outputs = {name: [[] for _ in specs] for name in states}
    for name, state in states.items():
        for row, spec in enumerate(specs):
            state.add(row, spec, [1, 2, row], outputs[name][row])
    gone: set[int] = set()
    for step in range(steps):
        base = torch.randn(len(specs), vocab, generator=gen) * 2
        base[:, :3] += 4.0  # a peaked vocabulary head: repeated contexts happen
        drawn = {}
        live = [row for row in range(len(specs)) if row not in gone]
        for name, state in states.items():
            logits = base.clone()
            state.step(logits)
            finite = torch.isfinite(logits)
            assert (finite[live].sum(1) == 1).all(), (name, step)
            for row in gone:  # a row that left the watermark's rows is not touched
                assert torch.equal(logits[row], base[row]), (name, step)
            drawn[name] = finite.to(torch.int8).argmax(1)
            for row, token in enumerate(drawn[name].tolist()):
                if row not in gone:
                    outputs[name][row].append(token)
        if not torch.equal(drawn["cpu"][live], drawn["kernels"][live]):
            print(f"FAIL step {step}: cpu {drawn['cpu'].tolist()} kernels {drawn['kernels'].tolist()}")
            return 1
        if step == steps - 4:  # row 1 leaves: the remaining rows are no longer 0..n-1
            gone.add(1)
            for state in states.values():
                state.remove(1)
        if step == steps // 2:
            for name, state in states.items():
                state.move(0, 2, swap=True)
                outputs[name][0], outputs[name][2] = outputs[name][2], outputs[name][0]
            specs[0], specs[2] = specs[2], specs[0]
    repeats = int(sum(np.asarray(states["cpu"].dedup.generated)))
    print(f"ok: {steps} steps, {len(specs)} rows, identical tokens (generated {repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
