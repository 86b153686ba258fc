#!/usr/bin/env python3
"""Build the training corpus for Hallmark's bundled tiny models.

The corpus is the Python standard library's own documentation, rendered with
``pydoc.render_doc(module, renderer=pydoc.plaintext)``: text that exists on every machine
with CPython, so anyone can rebuild it without a download.

Recipe (deterministic for a given CPython build):

* modules: ``sorted(sys.stdlib_module_names)``, minus private names (leading ``_``), minus
  ``SKIP`` (modules with side effects on import: ``antigravity`` opens a browser, ``this``
  prints, ``idlelib``/``tkinter``/``turtle``/``turtledemo`` need a display, ``readline``
  touches the terminal, ``lib2to3`` writes grammar pickles, ``test`` is CPython's test
  suite), minus modules that fail to import on this platform (``msvcrt``, ``winreg``...).
* each module's rendering is one document. Sections whose content depends on the machine
  rather than on the library are dropped: ``DATA`` (module-level values: ``os.environ``,
  ``sys.path``, library versions, ...) and ``FILE`` (the install path). Memory addresses
  (``at 0x7f...``) are scrubbed, and so are reprs of ``os.environ`` used as default values
  (``cgi.parse(environ=os.environ)``), and of ``sys.executable``/``sys.prefix``
  (``platform.architecture(executable=sys.executable)``). The rendering runs in a child process with a fixed,
  minimal environment and ``PYTHONHASHSEED=0`` (the script re-executes itself), so set
  reprs have a fixed order and nothing of the caller's environment reaches the text.
* split 98/2 by document: documents are ordered by SHA-256 of the module name and taken
  into the validation split, in that order, until it holds >= 2% of the bytes (documents
  larger than 1.5% of the corpus are never put in validation).

Outputs (``--out``, default ``var/corpus``; ``var/`` is git-ignored):
  train.jsonl, val.jsonl   one JSON object per line: {"module": name, "text": doc}
  manifest.json            python version, module lists, byte counts, sha256 of both files

Pydoc output differs between CPython versions, so build the corpus once (on the 3.11
development machine) and carry the folder to the training machine.

Usage:  python scripts/models/build_corpus.py [--out var/corpus]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import io
import json
import os
import platform
import pydoc
import re
import subprocess
import sys
import warnings

SKIP = {
    "antigravity",  # opens a web browser on import
    "this",  # prints the Zen of Python on import
    "idlelib",  # GUI (tkinter)
    "tkinter",  # GUI, needs a display for parts of it
    "turtle",  # GUI (tkinter)
    "turtledemo",  # GUI (tkinter)
    "readline",  # changes terminal state on import
    "lib2to3",  # writes grammar pickle caches next to itself on import
    "test",  # CPython's regression test package
    "ensurepip",  # bundles wheels; nothing to document, may probe the network config
}

DROP_SECTIONS = {"DATA", "FILE"}
SECTION_RE = re.compile(r"^[A-Z][A-Z ]*[A-Z]$")
ADDR_RE = re.compile(r" at 0x[0-9a-fA-F]+")
ENVIRON_RE = re.compile(r"environ\(\{[^}]*\}\)")
CHILD_FLAG = "HALLMARK_CORPUS_CHILD"
CHILD_ENV = {CHILD_FLAG: "1", "PYTHONHASHSEED": "0", "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "PATH": os.defpath}
VAL_FRACTION = 0.02
VAL_MAX_DOC_FRACTION = 0.015


def candidate_modules() -> list[str]:
    return sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in SKIP)


def clean(text: str) -> str:
    """Drop machine-dependent sections and scrub memory addresses."""
    out, keep = [], True
    for line in text.splitlines():
        if SECTION_RE.match(line):
            keep = line not in DROP_SECTIONS
        if keep:
            out.append(line.rstrip())
    text = "\n".join(out).strip() + "\n"
    text = ENVIRON_RE.sub("os.environ", text)
    for value, name in ((sys.executable, "sys.executable"), (sys.prefix, "sys.prefix"), (sys.base_prefix, "sys.base_prefix")):
        text = text.replace(repr(value), name)
    return ADDR_RE.sub("", text)


def render(name: str) -> str | None:
    sink = io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            warnings.simplefilter("ignore")
            module = importlib.import_module(name)
            return clean(pydoc.render_doc(module, renderer=pydoc.plaintext))
    except BaseException:  # noqa: BLE001 - any failure (ImportError, SystemExit...) means "skip"
        return None


def split(docs: dict[str, str]) -> tuple[list[str], list[str]]:
    total = sum(len(t.encode()) for t in docs.values())
    order = sorted(docs, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    val, val_bytes = [], 0
    for name in order:
        if val_bytes >= VAL_FRACTION * total:
            break
        size = len(docs[name].encode())
        if size > VAL_MAX_DOC_FRACTION * total:
            continue
        val.append(name)
        val_bytes += size
    train = [n for n in sorted(docs) if n not in set(val)]
    return train, sorted(val)


def write_jsonl(path: str, docs: dict[str, str], names: list[str]) -> str:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for n in names:
            f.write(json.dumps({"module": n, "text": docs[n]}, ensure_ascii=False) + "\n")
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="var/corpus", help="output folder (default: var/corpus)")
    args = ap.parse_args()

    # Render in a child with a fixed, minimal environment: set/frozenset reprs in signatures
    # depend on string hashing, and some defaults are `os.environ` itself (cgi.parse...).
    if os.environ.get(CHILD_FLAG) != "1":
        sys.exit(subprocess.call([sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env=CHILD_ENV))

    names = candidate_modules()
    docs: dict[str, str] = {}
    failed: list[str] = []
    for name in names:
        text = render(name)
        if text is None:
            failed.append(name)
        else:
            docs[name] = text
    train, val = split(docs)

    os.makedirs(args.out, exist_ok=True)
    sha_train = write_jsonl(os.path.join(args.out, "train.jsonl"), docs, train)
    sha_val = write_jsonl(os.path.join(args.out, "val.jsonl"), docs, val)
    nbytes = {n: len(docs[n].encode()) for n in docs}
    manifest = {
        "recipe": "pydoc.render_doc(module, renderer=pydoc.plaintext) over sorted(sys.stdlib_module_names); "
        "sections DATA and FILE dropped; ' at 0x...', os.environ and sys.executable/prefix reprs scrubbed; "
        "rendered in a child with a minimal environment and PYTHONHASHSEED=0",
        "python": sys.version,
        "implementation": platform.python_implementation(),
        "skipped_by_rule": sorted(SKIP),
        "failed_to_import": failed,
        "n_documents": len(docs),
        "train_modules": train,
        "val_modules": val,
        "bytes_total": sum(nbytes.values()),
        "bytes_train": sum(nbytes[n] for n in train),
        "bytes_val": sum(nbytes[n] for n in val),
        "sha256": {"train.jsonl": sha_train, "val.jsonl": sha_val},
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(
        f"corpus: {len(docs)} modules ({len(failed)} failed to import: {', '.join(failed) or '-'}); "
        f"{manifest['bytes_total'] / 1e6:.2f} MB total, train {len(train)} docs / {manifest['bytes_train'] / 1e6:.2f} MB, "
        f"val {len(val)} docs / {manifest['bytes_val'] / 1e6:.3f} MB -> {args.out}"
    )
    print(f"sha256 train.jsonl {sha_train}\nsha256 val.jsonl   {sha_val}")


if __name__ == "__main__":
    main()
