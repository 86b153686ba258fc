"""vLLM's own watermark kernels (0.32 or 0.34) beside ours: copy them out of an installed vLLM
or an unzipped wheel, load them from that folder, and time both in the same harness on the
same logits.

0.34's ``gumbel.py`` imports ``draft_logits_row`` from ``spec_decode/draft_logits.py``, a
module that pulls in vLLM's distributed state; :func:`prepare_vllm` writes that one function
(taken from the file by its syntax tree) into a module of its own, so the copy still loads
with torch and Triton only. 0.34 also adds the fused draft sampler
(``draft_philox_gumbel_sample``): :mod:`bench.sampler_kernels.vllm_draft` compares it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from bench.sampler_kernels.harness import Run, S, free, graph_time_us, make_logits, sets_for


VLLM_FILES = ("v1/worker/gpu/sample/watermark.py", "v1/worker/gpu/sample/gumbel.py",
              "v1/watermarking/prfs/base.py", "v1/watermarking/prfs/philox.py")
OPTIONAL_FILES = ("v1/sample/logits_processor/interface.py",  # 0.32
                  "v1/worker/gpu/sample/logits_processor/interface.py")  # 0.34


DRAFT_LOGITS = "v1/worker/gpu/spec_decode/draft_logits.py"


def _function_module(source: str, name: str) -> str:
    """A module holding only the function ``name`` of ``source`` (decorators included), after
    the Triton imports it needs."""
    import ast

    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            body = "\n".join(source.splitlines()[first - 1:node.end_lineno])
            return f"from vllm.triton_utils import tl, triton  # noqa: F401\n\n\n{body}\n"
    raise ValueError(f"{name} not found")


def prepare_vllm(site: Path, dest: Path) -> None:
    """Copy vLLM's watermark kernel files out of an installed vLLM (``site``: the folder that
    holds the ``vllm`` package, or the package itself) into ``dest`` as a minimal package."""
    import shutil

    package = site if (site / "v1").is_dir() else site / "vllm"
    for rel in VLLM_FILES + tuple(rel for rel in OPTIONAL_FILES if (package / rel).exists()):
        target = dest / "vllm" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(package / rel, target)
    draft = package / DRAFT_LOGITS
    if draft.exists():  # vLLM >= 0.34
        target = dest / "vllm" / DRAFT_LOGITS
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_function_module(draft.read_text(), "draft_logits_row"))
    for folder in [dest / "vllm", *(p for p in (dest / "vllm").rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    (dest / "vllm" / "triton_utils.py").write_text(
        "import triton\nimport triton.language as tl\n\nHAS_TRITON = True\n")
    version = "unknown"
    for meta in site.glob("vllm*.dist-info/METADATA"):
        for line in meta.read_text().splitlines():
            if line.startswith("Version:"):
                version = line.split(":", 1)[1].strip()
    (dest / "VERSION").write_text(version + "\n")


def load_vllm(dest: Path):
    """vLLM's ``philox_gumbel_sample`` from the copied files (``dest`` first on sys.path)."""
    import importlib

    sys.path.insert(0, str(dest))
    module = importlib.import_module("vllm.v1.worker.gpu.sample.watermark")
    if not str(Path(module.__file__).resolve()).startswith(str(dest.resolve())):
        raise RuntimeError(f"imported vLLM from {module.__file__}, not from {dest}")
    return module


VLLM_GRID = ((1, "normal", "single"), (1, "normal", "dual"), (8, "normal", "single"), (32, "normal", "single"),
             (256, "normal", "single"), (256, "normal", "dual"), (256, "zipf", "single"), (256, "zipf", "dual"),
             (512, "normal", "single"))


def section_vllm(run: Run, dest: Path) -> None:
    """Single key: one launch each (vLLM's key is one int for the batch, ours per row and
    equal here); dual key: vLLM needs two launches (key A, key B) and a select by route,
    ours one. Same logits sets, same harness; tokens compared on the first set."""
    from watermark import prf
    from watermark.kernels import gumbel as kernels

    module = load_vllm(dest)
    out = run.results.setdefault("vllm_side_by_side", {"source": str(dest), "rows": []})
    version = dest / "VERSION"
    out["vllm_version"] = version.read_text().strip() if version.exists() else "unknown"
    rows = out["rows"]
    grid = VLLM_GRID if not S.smoke else ((1, "normal", "single"), (3, "zipf", "dual"))
    for batch, dist, mode in grid:
        if run.left() < 6:
            run.results["errors"].append({"section": "vllm", "error": "budget: configurations skipped"})
            return
        gen = torch.Generator(device=S.device).manual_seed(1000 + batch)
        bytes_per_set = batch * S.vocab * 4
        logits_sets = [make_logits(batch, dist, torch.float32, gen) for _ in range(sets_for(bytes_per_set))]
        key_a, key_b = 0x0123456789ABCDEF, 0x0FEDCBA987654321
        contexts = torch.randint(0, 129_000, (batch, 4), device=S.device, generator=gen)
        args = dict(temperature=torch.ones(batch, device=S.device),
                    key_a=torch.full((batch,), prf.to_signed64(key_a), device=S.device),
                    key_b=torch.full((batch,), prf.to_signed64(key_b), device=S.device),
                    alpha=torch.full((batch,), 0.5 if mode == "dual" else 0.0, device=S.device),
                    contexts=contexts, widths=torch.full((batch,), 4, dtype=torch.int32, device=S.device),
                    watermark=torch.ones(batch, dtype=torch.bool, device=S.device),
                    stream_keys=torch.randint(-2**62, 2**62, (batch,), device=S.device, generator=gen),
                    positions=torch.randint(0, 4096, (batch,), device=S.device, generator=gen))
        ours = kernels.gumbel_sample(logits_sets[0], **args)
        use_b = ours.routes == 3  # the rows our routing coin sent to key B

        def theirs(logits, use_b=use_b):
            a = module.philox_gumbel_sample(logits, contexts, key_a)
            if mode == "single":
                return a
            return torch.where(use_b, module.philox_gumbel_sample(logits, contexts, key_b), a)

        got = theirs(logits_sets[0])
        row = {"batch": batch, "dist": dist, "mode": mode, "input_sets": len(logits_sets),
               "token_agreement": float((got == ours.tokens).float().mean())}
        row["hallmark_us"] = graph_time_us([(lambda x=x: kernels.gumbel_sample(x, **args))
                                            for x in logits_sets])
        row["vllm_us"] = graph_time_us([(lambda x=x: theirs(x)) for x in logits_sets])
        row["vllm_over_hallmark"] = row["vllm_us"] / row["hallmark_us"]
        rows.append(row)
        del logits_sets
        free()
        run.save()
    out["all_tokens_agree"] = all(r["token_agreement"] == 1.0 for r in rows)
