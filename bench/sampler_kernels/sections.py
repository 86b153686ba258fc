"""The other sections: device and copy bandwidth, the GPU parity tests, the stage-1
error bound, speculative verification, dedup and the warm-up registry."""

from __future__ import annotations

import math
import platform
import subprocess
import sys
import time

import torch

from bench.sampler_kernels.harness import (BANDWIDTH, L2_BYTES, REPO, Run, S, TIMING, copy_bandwidth, eager_time_us,
                                           free, graph_time_us, sync)


def section_device(run: Run) -> None:
    import triton

    info = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "cuda": torch.version.cuda, "smoke": S.smoke}
    if S.device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, multiprocessors=props.multi_processor_count,
                    memory_GiB=round(props.total_memory / 2**30, 1))
    run.results["device"] = info
    run.results["timing"] = TIMING
    run.results["copy_bandwidth"] = copy_bandwidth()


def section_pytest(run: Run, select: str | None = None) -> None:
    log = run.out / "pytest-gpu.log"
    junit = run.out / "pytest-gpu.xml"
    timeout = max(60.0, min(240.0, run.left() - 75)) if select is None else max(60.0, min(130.0, run.left() - 90))
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/watermark/kernels", "-p", "no:cacheprovider",
           f"--junitxml={junit}"]
    if select is not None:
        cmd += ["-k", select]
    import importlib.util

    if importlib.util.find_spec("xdist") is not None:
        # Compiling the tested variants dominates: eight workers compile in parallel (the
        # registry's request-time-compile test must also pass under -n 8).
        cmd += ["-n", "8"]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as error:
        output = (error.stdout or b"").decode() if isinstance(error.stdout, bytes) else (error.stdout or "")
        output += f"\nTIMEOUT after {timeout:.0f} s"
        code = -1
    log.write_text(output)
    summary = {"returncode": code, "seconds": round(time.perf_counter() - t, 1), "log": log.name,
               "command": " ".join(cmd[1:]), "subset": select is not None}
    try:
        import xml.etree.ElementTree as ET

        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        for field in ("tests", "failures", "errors", "skipped"):
            summary[field] = int(suite.get(field, 0))
        summary["failed"] = [case.get("name") for case in suite.iter("testcase")
                             if case.find("failure") is not None or case.find("error") is not None][:20]
    except Exception as error:  # noqa: BLE001
        summary["junit_error"] = repr(error)
    summary["tail"] = output[-1500:]
    summary["passed"] = bool(code == 0 and summary.get("failures", 1) == 0 and summary.get("errors", 1) == 0
                             and summary.get("tests", 0) > summary.get("skipped", 0))
    run.results["parity_pytest"] = summary


def section_error_bound(run: Run) -> None:
    from watermark.kernels import error_bound

    measured = error_bound.measure_approximation_error(S.device)
    measured["window_is_4x_bound"] = True
    run.results["approximation_error"] = measured


def section_speculative(run: Run) -> None:
    from tests.watermark.kernels import parity
    from watermark.kernels import speculative as kernels

    rows = run.results.setdefault("speculative_b64_k4", [])
    batch, k, vocab, dev = S.spec_batch, S.spec_k, S.vocab, S.device
    for dtype in (torch.float32, torch.bfloat16):
        gen = torch.Generator(device=dev).manual_seed(11)
        bytes_read = 2 * batch * vocab * torch.tensor([], dtype=dtype).element_size()
        n_sets = max(2, min(8, math.ceil(3 * L2_BYTES / (batch * (2 * k + 1) * vocab * 4))))
        sets = []
        for _ in range(n_sets):
            target_logits = torch.randn(batch, k + 1, vocab, device=dev, generator=gen) * 2
            p = torch.softmax(target_logits, -1)
            q = torch.softmax(target_logits[:, :k] + 0.7 * torch.randn(batch, k, vocab, device=dev, generator=gen), -1)
            x = torch.stack([torch.multinomial(q[:, j], 1, generator=gen)[:, 0] for j in range(k)], -1)
            sets.append((p.to(dtype), q.to(dtype), x))
        cpu_gen = torch.Generator().manual_seed(3)
        args = dict(key_b=parity.random_keys(cpu_gen, batch), key_coin=parity.random_keys(cpu_gen, batch),
                    keyed_coin=torch.rand(batch, generator=cpu_gen) < 0.5,
                    contexts=torch.randint(0, 129_000, (batch, k + 1, 16), generator=cpu_gen),
                    widths=torch.full((batch,), 4, dtype=torch.int32),
                    watermark=torch.ones(batch, k + 1, dtype=torch.bool), greedy=torch.zeros(batch, dtype=torch.bool),
                    stream_keys=parity.random_keys(cpu_gen, batch),
                    positions=torch.randint(0, 4096, (batch,), generator=cpu_gen))
        args = {name: value.to(dev) for name, value in args.items()}
        p, q, x = sets[0]
        got = kernels.verify(p, q, x, **args)
        want = parity.reference_verify(p, q, x, args)
        row = {"dtype": str(dtype).replace("torch.", ""), "batch": batch, "k": k,
               "bit_exact": bool(torch.equal(got.tokens, want.tokens) and torch.equal(got.routes, want.routes)
                                 and torch.equal(got.num_accepted, want.num_accepted)),
               "mean_accepted": float(want.num_accepted.float().mean())}
        row["us"] = graph_time_us([(lambda s=s: kernels.verify(s[0], s[1], s[2], **args)) for s in sets])
        row["read_floor_us"] = bytes_read / BANDWIDTH[0] * 1e6
        row["floor_fraction"] = row["read_floor_us"] / row["us"]
        row["reference_us"] = eager_time_us(lambda: parity.reference_verify(p, q, x, args), rep_ms=100)
        row["speedup_vs_reference"] = row["reference_us"] / row["us"]
        rows.append(row)
        del sets
        free()
        run.save()


def section_dedup(run: Run) -> None:
    from watermark.kernels.dedup import GpuDeduper

    rows = run.results.setdefault("dedup", [])
    dev = S.device
    for batch in (S.big, S.small):
        for history in S.histories:
            if run.left() < 15:
                return
            gen = torch.Generator(device=dev).manual_seed(history)
            dd = GpuDeduper(batch, history + 4096, dev)
            for slot in range(batch):
                dd.open(slot, width=4, scope="single_turn", max_history=None)
            slots = torch.arange(batch, device=dev, dtype=torch.int32)
            t = time.perf_counter()
            dd.append(slots, torch.randint(0, 129_000, (batch, history), device=dev, generator=gen))
            sync()
            fill_s = time.perf_counter() - t
            ones = torch.ones(batch, dtype=torch.int32, device=dev)
            tokens = [torch.randint(0, 129_000, (batch, 1), device=dev, generator=gen) for _ in range(8)]
            drafts = torch.randint(0, 129_000, (batch, 4), device=dev, generator=gen)
            step = graph_time_us([(lambda tok=tok: (dd.append(slots, tok, ones), dd.repeated(slots)))
                                  for tok in tokens], target_s=0.1)
            query = graph_time_us([lambda: dd.repeated(slots)], target_s=0.05)
            block = graph_time_us([lambda: dd.repeated(slots, drafts)], target_s=0.05)
            rows.append({"batch": batch, "history": history, "step_us": step, "query_us": query,
                         "block_k4_query_us": block, "fill_s": round(fill_s, 3),
                         "overflow": int(dd.overflow.sum())})
            del dd
            free()
            run.save()


def section_dedup_parity(run: Run) -> None:
    from tests.watermark.kernels import parity

    parity.check_dedup(1234, S.device, requests=8 if S.smoke else 32, steps=30 if S.smoke else 300, k=4)
    run.results["dedup_parity_in_bench"] = True


def section_warm_up(run: Run) -> None:
    from watermark.kernels import registry

    report = registry.warm_up(S.device)
    run.results["warm_up"] = {"seconds_in_this_process": round(report.seconds, 2),
                              "specialisations": len(report.specialisations), "compiled": report.compiled,
                              "note": "compiled kernels come from Triton's disk cache after the pytest run"}
