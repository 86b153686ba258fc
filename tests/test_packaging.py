"""What a fresh install builds and installs (issue 25): no build warning, and `make run`'s
install includes the `openai` client that README's example imports."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_building_the_metadata_warns_of_nothing(tmp_path):
    """Item 14: every fresh install printed setuptools' "`project.license` as a TOML table is
    deprecated". Runs the PEP 517 metadata hook that pip runs, on this pyproject.toml, with
    every warning shown."""
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    if major < 77:
        pytest.skip(f"setuptools {setuptools.__version__} predates the SPDX license form this project needs")
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    # An isolated build (pip's default) must get a setuptools that reads the SPDX string.
    assert any(re.fullmatch(r"setuptools>=(\d+)", r) and int(r.split(">=")[1]) >= 77 for r in requires), requires
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "out").mkdir()
    run = subprocess.run([sys.executable, "-W", "always::Warning", "-c",
                          "import setuptools.build_meta as b; print(b.prepare_metadata_for_build_wheel('out'))"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "SetuptoolsDeprecationWarning" not in run.stderr and "SetuptoolsWarning" not in run.stderr, run.stderr
    metadata = (tmp_path / "out" / run.stdout.strip().splitlines()[-1] / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata


def _make_run_install_spec() -> str:
    """The `pip install -e SPEC` of the recipe that `make run` depends on."""
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^run: \$\(SERVE_STAMP\)", makefile, re.MULTILINE)
    recipe = makefile.split("$(SERVE_STAMP): ", 1)[1].split("\n\n", 1)[0]
    found = re.findall(r"pip install [^\n]*-e (\S+)", recipe)
    assert len(found) == 1, recipe
    return found[0].strip("'\"")


def test_make_run_installs_the_openai_client():
    """Item 2: README's Python example imports `openai`, which `make run`'s venv lacked
    (ModuleNotFoundError). The serve install names an extra that pins it."""
    spec = _make_run_install_spec()
    match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", spec)
    assert match, spec
    extras = (match.group(1) or "").split(",")
    optional = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned = [req for extra in extras if extra for req in optional.get(extra, [])]
    assert any(re.match(r"openai==", req) for req in pinned), (extras, pinned)


def test_an_editable_install_warns_of_nothing(tmp_path):
    """Issue 34, item 10: every `pip install -e .` (make run's, make test's) printed setuptools'
    "BuildBackendWarning: Editable installation ... Please be careful with folders in your
    working directory with the same name as your package". Runs the PEP 660 hook pip runs,
    on this pyproject.toml and the packages' top-level files, with every warning shown; the
    editable wheel must still make each package importable from the project's root."""
    import setuptools
    import zipfile

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} predates the SPDX license form this project needs")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tmp_path / name)
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in packages:
        package = tmp_path / pattern.rstrip("*")
        package.mkdir()
        (package / "__init__.py").write_text("")
    (tmp_path / "out").mkdir()
    # Every warning a build shows through pip (DeprecationWarnings of setuptools' own modules it does not).
    run = subprocess.run([sys.executable, "-W", "always::Warning", "-W", "ignore::DeprecationWarning", "-c",
                          "import setuptools.build_meta as b; print(b.build_editable('out'))"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "Warning" not in run.stderr and "InformationOnly" not in run.stderr, run.stderr
    wheel = zipfile.ZipFile(tmp_path / "out" / run.stdout.strip().splitlines()[-1])
    [pth] = [n for n in wheel.namelist() if n.endswith(".pth")]
    assert Path(wheel.read(pth).decode().strip()).resolve() == tmp_path.resolve()


def test_every_source_package_is_packaged():
    """Issue 32 moved the ledger and its transparency log out of keys/ into ledger/ and
    ledger/log/: a fresh install must package them, like every package the gateway imports
    (setuptools' find list; a package it misses imports from a checkout and fails installed)."""
    from setuptools import find_packages

    from tests.test_imports import PACKAGES

    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packaged = set(find_packages(where=str(REPO), include=find["include"]))
    sources = {".".join(path.parent.relative_to(REPO).parts) for top in PACKAGES
               for path in (REPO / top).rglob("__init__.py")}
    assert {"ledger", "ledger.log"} <= sources
    assert sources - packaged == set()
