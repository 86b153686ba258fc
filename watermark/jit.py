"""numba on demand: compiled functions with an on-disk cache where one can be written.

numba costs about 0.3 s to import, so nothing here imports it at module import: a module
that has compiled loops keeps their plain-Python sources and asks :func:`compile_all`
for the compiled versions the first time it needs them. numba's cache is tried in its
own order (``NUMBA_CACHE_DIR``, the package's ``__pycache__``, the user's cache
directory); where none is writable the functions compile once per process instead of
failing (tested).
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable


@functools.cache
def numba_module():
    """numba, or None where it is not installed."""
    try:
        import numba
    except ImportError:  # pragma: no cover - exercised where numba is missing
        return None
    return numba


@functools.cache
def cache_writable() -> bool:
    """Whether numba can write its on-disk cache here (a probe function, never called)."""
    numba = numba_module()
    if numba is None:  # pragma: no cover
        return False

    def probe(x):  # pragma: no cover - never run
        return x

    try:
        numba.njit(cache=True)(probe)
    except RuntimeError:  # no cache locator found a writable directory
        return False
    return True


def compile_all(functions: dict[str, Callable[..., Any]], inline: tuple[str, ...] = (),
                helpers: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The compiled versions of ``functions`` (name -> plain function), or None without
    numba. Each function's globals get the compiled versions of the others under the same
    names, and ``helpers`` (name -> functions compiled elsewhere), so they call each other
    compiled; ``inline`` names helpers inlined into their callers."""
    numba = numba_module()
    if numba is None:  # pragma: no cover
        return None
    cache = cache_writable()
    compiled: dict[str, Any] = {}
    for name, fn in functions.items():
        options = {"inline": "always"} if name in inline else {}
        compiled[name] = numba.njit(cache=cache, nogil=True, **options)(fn)
    for fn in functions.values():
        fn.__globals__.update(helpers or {})
        fn.__globals__.update(compiled)
    return compiled


def loaded() -> bool:
    """Whether this process has loaded numba already (then compiled paths cost nothing more
    to start; a one-off detection that has not stays on numpy rather than pay ~0.3 s)."""
    return (numba_module.cache_info().currsize > 0 or "numba" in sys.modules) and numba_module() is not None


def load() -> bool:
    """Load numba now (a batch or a server that will detect many times); whether it is there."""
    return numba_module() is not None


LOAD_AFTER_WORK = 4_000_000
"""Work (PRF evaluations, or the like) a process does on numpy before it loads numba by
itself: about what numpy's PRF does in the 0.3 s numba takes to load."""
_work_done = [0]


def worth_loading(work: int) -> bool:
    """Whether to take the compiled path for a piece of ``work``: yes once numba is loaded;
    otherwise once this process's work (this piece included) passes LOAD_AFTER_WORK, when
    numba is loaded now. So a one-off detection never pays for numba, and a process that
    keeps detecting pays for it once, early."""
    if loaded():
        return True
    _work_done[0] += max(0, int(work))
    return _work_done[0] >= LOAD_AFTER_WORK and load()
