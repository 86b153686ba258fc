"""``python -m bench.sampler_kernels``: the command line (see the package docstring)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from bench.sampler_kernels.hmac_kernels import section_hmac_keyscan, section_hmac_verify
from bench.sampler_kernels.harness import (BANDWIDTH, QUICK_BUDGET_S, QUICK_PYTEST_K, REFERENCE_TIMED, REPO, Run, S,
                                           copy_previous, load_previous, table)
from bench.sampler_kernels.sampler import (headline, section_bounded, section_compare_b256, section_dense, section_pruning,
                                           section_pruning_sweep, section_sampler, section_sweep, section_temperature)
from bench.sampler_kernels.sections import (section_dedup, section_dedup_parity, section_device, section_error_bound,
                                            section_pytest, section_speculative, section_warm_up)
from bench.sampler_kernels.vllm_draft import section_hmac_sampler, section_vllm_draft, section_vllm_temperature
from bench.sampler_kernels.vllm_generate import section_vllm_generate
from bench.sampler_kernels.vllm_side import prepare_vllm, section_vllm


def _package_doc() -> str:
    import bench.sampler_kernels as package

    return package.__doc__ or ""


def main() -> int:
    parser = argparse.ArgumentParser(description=_package_doc().split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--skip-pytest", action="store_true", help="benchmark only (bit_exact_vs_reference stays undecided: null)")
    parser.add_argument("--quick", action="store_true",
                        help="fit one short call: sampler parity tests only, headline grid, B=256 comparison, "
                             "verify and dedup; sweeps and warm-up copied from the previous run as 'not re-run'")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU + Triton interpreter, tiny sizes: checks this script runs (set TRITON_INTERPRET=1)")
    parser.add_argument("--vllm-from", type=Path, default=None,
                        help="folder with vLLM's watermark kernel files (see --prepare-vllm-from): time them "
                             "beside ours")
    parser.add_argument("--prepare-vllm-from", type=Path, default=None,
                        help="copy the kernel files out of an installed vLLM (its site-packages folder) into "
                             "--vllm-from, then exit")
    parser.add_argument("--budget", type=float, default=None, help="seconds this run may take (default 335)")
    parser.add_argument("--only", default=None,
                        help="comma-separated sections to run (e.g. vllm,sampler_headline,pytest): a short call")
    options = parser.parse_args()
    if options.prepare_vllm_from is not None:
        prepare_vllm(options.prepare_vllm_from, options.vllm_from)
        print(f"copied vLLM's kernel files into {options.vllm_from}")
        return 0
    options.out.mkdir(parents=True, exist_ok=True)
    previous = load_previous()
    run = Run(options.out)
    if options.budget is not None:
        run.budget_s = options.budget
    if options.quick:
        run.budget_s = QUICK_BUDGET_S
        REFERENCE_TIMED.clear()
    run.results["quick"] = bool(options.quick)
    if options.smoke:
        S.device, S.vocab, S.smoke, S.big, S.small = torch.device("cpu"), 4099, True, 3, 1
        S.grid, S.spec_batch, S.spec_k, S.histories = (2,), 4, 2, (16, 64)
        options.skip_pytest = True
    elif not torch.cuda.is_available():
        run.results["errors"].append({"section": "start", "error": "no CUDA device"})
        run.save()
        print("no CUDA device: nothing measured")
        return 1

    run.section("device", lambda: section_device(run))
    if "copy_bandwidth" in run.results:
        BANDWIDTH[0] = run.results["copy_bandwidth"]["GBps"] * 1e9
    fp32, bf16 = torch.float32, torch.bfloat16
    sections = {
        "pytest": (lambda: section_pytest(run), 100),
        "approximation_error": (lambda: section_error_bound(run), 0),
        "sampler_headline": (lambda: section_sampler(run, (S.big, S.small), (fp32,), ("normal", "zipf"),
                                                     ("single", "dual"), "sampler", budget_each=0), 0),
        "vllm": (lambda: section_vllm(run, options.vllm_from), 20),
        "vllm_draft": (lambda: section_vllm_draft(run, options.vllm_from), 10),
        "vllm_temperature": (lambda: section_vllm_temperature(run, options.vllm_from), 5),
        "hmac_sampler": (lambda: section_hmac_sampler(run), 10),
        "hmac_verify": (lambda: section_hmac_verify(run), 8),
        "hmac_keyscan": (lambda: section_hmac_keyscan(run), 10),
        "vllm_generate": (lambda: section_vllm_generate(run, options.vllm_from), 10),
        "pruning_sweep": (lambda: section_pruning_sweep(run), 20),
        "bounded": (lambda: section_bounded(run), 20),
        "sampler_bf16_b256_b1": (lambda: section_sampler(run, (S.big, S.small), (bf16,), ("normal", "zipf"),
                                                         ("single", "dual"), "sampler"), 10),
        "sampler_grid": (lambda: section_sampler(run, S.grid, (fp32, bf16), ("normal", "zipf"), ("single", "dual"),
                                                 "sampler", budget_each=3), 20),
        "speculative": (lambda: section_speculative(run), 10),
        "dedup": (lambda: section_dedup(run), 15),
        "warm_up": (lambda: section_warm_up(run), 10),
    }
    if options.only:
        for name in options.only.split(","):
            fn, needs = sections[name]
            run.section(name, fn, needs_s=needs)
            if name == "sampler_headline":
                headline(run)
    elif options.quick:
        # Parity tests of the changed kernels first, then every timed configuration is also
        # checked against the reference in this process.
        if not options.skip_pytest:
            run.section("pytest", lambda: section_pytest(run, QUICK_PYTEST_K), needs_s=100)
        run.section("approximation_error", lambda: section_error_bound(run))
        run.section("sampler_headline", lambda: section_sampler(run, (S.big, S.small), (fp32,), ("normal", "zipf"),
                                                                ("single", "dual"), "sampler", budget_each=0))
        headline(run)
        run.section("compare_b256", lambda: section_compare_b256(run), needs_s=15)
        run.section("speculative", lambda: section_speculative(run), needs_s=10)
        run.section("sampler_bf16_b256_b1", lambda: section_sampler(run, (S.big, S.small), (bf16,),
                                                                    ("normal", "zipf"), ("single", "dual"),
                                                                    "sampler"), needs_s=10)
        run.section("sampler_grid", lambda: section_sampler(run, S.grid, (fp32, bf16), ("normal", "zipf"),
                                                            ("single", "dual"), "sampler", budget_each=3),
                    needs_s=20)
        run.section("dedup", lambda: section_dedup(run), needs_s=15)
        run.section("dedup_parity", lambda: section_dedup_parity(run), needs_s=10)
        run.section("pruning", lambda: section_pruning(run), needs_s=8)
        run.section("temperature", lambda: section_temperature(run), needs_s=10)
        copy_previous(run, previous, ("warm_up", "sweep_b1_fp32_normal_single", "sweep_b256_fp32_normal_single",
                            "temperature_0p7", "dedup", "speculative_b64_k4", "pruning_potential"))
    else:
        # The headline figures first (they compile one variant), then the parity tests.
        run.section("approximation_error", lambda: section_error_bound(run))
        run.section("sampler_headline", lambda: section_sampler(run, (S.big, S.small), (fp32,), ("normal", "zipf"),
                                                                ("single", "dual"), "sampler", budget_each=0))
        headline(run)
        if not options.skip_pytest:
            run.section("pytest", lambda: section_pytest(run), needs_s=100)
        run.section("sampler_grid", lambda: section_sampler(run, S.grid, (fp32, bf16), ("normal", "zipf"),
                                                            ("single", "dual"), "sampler"), needs_s=30)
        run.section("sampler_bf16_b256_b1", lambda: section_sampler(run, (S.big, S.small), (bf16,),
                                                                    ("normal", "zipf"), ("single", "dual"),
                                                                    "sampler"), needs_s=20)
        run.section("speculative", lambda: section_speculative(run), needs_s=20)
        run.section("dedup", lambda: section_dedup(run), needs_s=20)
        run.section("dedup_parity", lambda: section_dedup_parity(run), needs_s=30)
        run.section("pruning", lambda: section_pruning(run), needs_s=15)
        run.section("dense_only", lambda: section_dense(run), needs_s=20)
        run.section("temperature", lambda: section_temperature(run), needs_s=20)
        run.section("warm_up", lambda: section_warm_up(run), needs_s=15)
        run.section("sweep", lambda: section_sweep(run), needs_s=30)
        if options.vllm_from is not None:
            run.section("vllm", lambda: section_vllm(run, options.vllm_from), needs_s=20)

    headline(run)
    checked = [row for key in ("sampler", "temperature_0p7", "speculative_b64_k4", "dense_only_fp32_single",
                               "sweep_b256_fp32_single_quick", "pruning_sweep_b256_fp32_single",
                               "bounded_b256_fp32", "bounded_other")
               if isinstance(run.results.get(key), list) for row in run.results[key]]
    sampler_exact = [row.get("bit_exact") for row in checked if "bit_exact" in row]
    bound_ok = run.results.get("approximation_error", {}).get("within_bounds") is True
    run.results["parity_in_bench"] = {"configs_checked": len(sampler_exact), "all_exact": all(sampler_exact),
                                      "approximation_error_within_bounds": bound_ok,
                                      "dedup": run.results.get("dedup_parity_in_bench", False)}
    # The verdict needs the parity test suite: a call that skipped it (--only without pytest,
    # --skip-pytest) has not decided it, and says so instead of recording false, which read
    # as "not bit-exact" (the in-bench checks of such a run are in parity_in_bench).
    if "parity_pytest" in run.results:
        run.results["bit_exact_vs_reference"] = bool(
            run.results["parity_pytest"].get("passed") and sampler_exact and all(sampler_exact) and bound_ok)
    else:
        run.results["bit_exact_vs_reference"] = None
        run.results["bit_exact_vs_reference_note"] = (
            "not decided in this call: the pytest parity section did not run; parity_in_bench holds the checks "
            "of every configuration timed here")
    run.save()
    summary = table(run.results)
    (options.out / "sampler-h200.txt").write_text(summary + "\n")
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
