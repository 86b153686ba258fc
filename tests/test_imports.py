"""The import graph points one way (DESIGN.md, "Layout"), has no cycle, and the torch-free
paths stay torch-free.

The graph is built from the source with ``ast``: every ``import`` and ``from ... import``
of a Hallmark module, function-level (lazy) imports included, since a lazy import is
still a dependency. Run ``python -m tests.test_imports`` to print any cycle.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("watermark", "detector", "keys", "ledger", "service", "migrations")

# Which packages each package may import (besides itself).
ALLOWED = {
    "watermark": set(),
    "detector": {"watermark"},
    "keys": {"watermark"},
    # The ledger and its transparency log build on the key store; the key store never imports
    # them (KEK rotation asks them through keys.kek_rotation.KekDependant, passed in).
    "ledger": {"keys", "watermark"},
    "service": {"keys", "ledger", "detector", "watermark"},
    "migrations": {"keys"},
}
# keys and ledger -> watermark: the spec, the key conventions and the validation-error
# formatter only (never samplers, tensors, kernels).
KEYS_MAY_USE = ("watermark.spec", "watermark.key", "watermark.prf", "watermark.prf.base",
                "watermark.validation")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the Hallmark modules it imports (a package's ``__init__`` counts as the package)."""
    known = modules()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps.update(filter(None, (resolve(alias.name) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = module.split(".") if is_package else module.split(".")[:-1]
                    parts = parts[:len(parts) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    target = full if full in known else resolve(base)
                    if target:
                        deps.add(target)
        deps.discard(module)
        graph[module] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle():
    assert cycles(import_graph()) == []


def test_dependencies_point_one_way():
    wrong = []
    for module, deps in import_graph().items():
        top = module.split(".")[0]
        for dep in deps:
            other = dep.split(".")[0]
            if other != top and other not in ALLOWED[top]:
                wrong.append(f"{module} -> {dep}")
            if top in ("keys", "ledger") and other == "watermark" and dep not in KEYS_MAY_USE:
                wrong.append(f"{module} -> {dep} ({top} uses the spec and key types only)")
    assert wrong == []


def test_the_key_store_never_imports_the_ledger():
    """Issue 32: the ledger and the log left keys/ for their own package; the three calls that
    would point back up (KEK rotation re-wrapping the signing and log keys, the store loading
    the log key) now ask the ledger through what the caller passes in. Lazy imports count."""
    graph = import_graph()
    assert any(m.startswith("ledger.log.") for m in graph) and "ledger.sealed" in graph
    back = sorted(f"{module} -> {dep}" for module, deps in graph.items() if module.split(".")[0] == "keys"
                  for dep in deps if dep.split(".")[0] == "ledger")
    assert back == []
    # Loading the key store (its rotation included) loads no ledger module either.
    loaded = _loaded_after("import keys.db, keys.kek_rotation, keys.material, keys.lifecycle, keys.key_states")
    assert not {m for m in loaded if m == "ledger" or m.startswith("ledger.")}


def test_detector_never_imports_torch_in_its_source():
    for module, path in modules().items():
        torch_free = ("detector", "watermark.prf", "watermark.prf.base", "watermark.prf.versions",
                      "watermark.prf.philox", "watermark.spec", "watermark.key", "watermark.dedup")
        if module in torch_free or module.startswith("detector."):
            names = {alias.name.split(".")[0] for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                     if isinstance(node, (ast.Import, ast.ImportFrom))
                     for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])}
            assert "torch" not in names and "triton" not in names, module


def _loaded_after(code: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return set(out.stdout.strip().splitlines()[-1].split())


def test_detection_and_the_cli_load_no_torch():
    """`import detector` (and a detection), `hallmark --help` and the store commands'
    modules run without torch: it takes seconds to import and none of them needs tensors."""
    detection = _loaded_after(
        "from detector.detect import detect\nfrom detector.result import Candidate\n"
        "from watermark.key import WatermarkKey\n"
        "detect(list(range(64)), [Candidate.inline(WatermarkKey(7))])")
    assert "torch" not in detection and "triton" not in detection
    cli_help = _loaded_after(
        "import sys\nfrom service.cli import main\nsys.argv = ['hallmark', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass")
    assert "torch" not in cli_help and "sqlalchemy" not in cli_help and "numpy" not in cli_help
    store_commands = _loaded_after("import service.cli, keys.lifecycle, keys.db, keys.tokens, keys.audit")
    assert "torch" not in store_commands and "alembic" not in store_commands


if __name__ == "__main__":
    found = cycles(import_graph())
    print("\n".join(" -> ".join(c) for c in found) or "no import cycle")
