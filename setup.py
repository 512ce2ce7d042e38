"""The two compiled parts of storm; everything else is in pyproject.toml.

- mpihook's PMPI library, which storm-nm preloads into MPI ranks. It is declared as an extension module
  only so that pip builds and installs it with the package: Python never imports it and it uses no
  Python API.
- The coscheduling simulator's node model (tools/sim/cosched: MODEL_MODULES below), compiled with mypyc:
  its event loop runs millions of events per simulated workload, about six times faster compiled. The
  sources stay the plain, typed Python they are; storm.tools.sim.cosched loads them instead, with a
  warning, wherever the compiled modules are missing or older than the sources.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from mypyc.build import mypycify
from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
MODEL = ROOT / "tools" / "sim" / "cosched"
# Compiled together, in the order their sources load in (each after what it imports): the package's
# check reads both from compiled.json.
MODEL_MODULES = ("program", "records", "local", "slices", "shortcut", "node")


def hook() -> Extension:
    return Extension(
        "storm.mpihook._hook",
        sources=["mpihook/hook.c", "mpihook/p2p.c", "mpihook/coll.c"],
        depends=["mpihook/hook.h", "mpihook/mpich_abi.h", "mpihook/record.h"],
        extra_compile_args=["-O2", "-fvisibility=default", "-Wall", "-Wextra"],
        libraries=["dl", "rt"],  # dlopen and shm_open: in libc itself since glibc 2.34, harmless there
    )


def node_model() -> list[Extension]:
    """mypyc's extension modules for the node model. mypy, under mypyc, names modules by their place under a
    package root, and storm.tools is tools/ here: it is shown the installed layout through symlinks under
    build/, as tests/test_static.py shows it to mypy. The sources' hashes go next to them, for the check at
    import (storm.tools.sim.cosched)."""
    tree = ROOT / "build" / "mypyc-tree"
    (tree / "storm").mkdir(parents=True, exist_ok=True)
    for package in ("mm", "nm", "mpihook", "tools"):
        link = tree / "storm" / package
        if not link.is_symlink():
            link.symlink_to(ROOT / package)
    os.environ["MYPYPATH"] = str(tree)
    paths = [str(tree / "storm" / "tools" / "sim" / "cosched" / f"{name}.py") for name in MODEL_MODULES]
    extensions = mypycify(
        ["--config-file", str(ROOT / "pyproject.toml"), "--explicit-package-bases", *paths],
        group_name="storm.tools.sim.cosched.model",
        target_dir=str(ROOT / "build" / "mypyc"),
    )
    hashes = {name: hashlib.sha256((MODEL / f"{name}.py").read_bytes()).hexdigest() for name in MODEL_MODULES}
    (MODEL / "compiled.json").write_text(json.dumps({"sha256": hashes}, indent=1) + "\n")
    return extensions


setup(ext_modules=[hook(), *node_model()])
