"""The coscheduling simulator's model of the nodes: parallel programs on time-shared PEs (issue 15).

- program.py: what a job runs (iterations of computation, I/O and a communication step);
- node.py: the event-driven model the simulator uses, told from outside what each process may do
  (records.py its records, slices.py its round-robin slices, local.py ClusterSchedSim's local scheduler
  and dynamic coscheduling, shortcut.py its walk of a job alone on its PEs);
- stepped.py: a fixed-step reference of the same model, slow and plain, that the tests hold node.py to.

The first six are compiled with mypyc when the package is built (setup.py), which runs the model about six
times faster. compiled.json, written by the build, names them in the order they load in, with the sha256
of each source compiled. The compiled modules are used only if every one of them was built from the
sources that are here now; otherwise the sources themselves are loaded, all of them (compiled and pure
modules cannot be mixed: compiled ones call each other directly), with a warning when the build is stale.
STORM_SIM_PURE=1 asks for the sources (a debugger, a profiler, a patched module). ``COMPILED`` says which.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import warnings
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _stale_or_missing(build: dict[str, dict[str, str]]) -> str | None:
    """Why the compiled modules cannot be used (None: they can). O(size of the sources)."""
    for name, digest in build["sha256"].items():
        if not any((_HERE / f"{name}{suffix}").exists() for suffix in EXTENSION_SUFFIXES):
            return f"{name} was not compiled"
        if hashlib.sha256((_HERE / f"{name}.py").read_bytes()).hexdigest() != digest:
            return f"{name}.py changed since it was compiled"
    return None


def _load_sources(names: list[str]) -> None:
    """Load the modules from their sources, before anything imports them (each after what it imports)."""
    for name in names:
        full = f"{__name__}.{name}"
        spec = importlib.util.spec_from_file_location(full, _HERE / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        setattr(sys.modules[__name__], name, module)


def _choose() -> bool:
    try:
        build = json.loads((_HERE / "compiled.json").read_text())
    except FileNotFoundError:
        return False  # never built here (a source tree on sys.path): only the sources exist
    names = list(build["sha256"])
    if os.environ.get("STORM_SIM_PURE", "") not in ("", "0"):
        _load_sources(names)
        return False
    why = _stale_or_missing(build)
    if why is None:
        return True
    warnings.warn(
        f"storm's compiled node model is stale ({why}): running its Python sources, about six times slower; "
        "`pip install -e .` compiles them again",
        stacklevel=2,
    )
    _load_sources(names)
    return False


COMPILED = _choose()
