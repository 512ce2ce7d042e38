"""Lint, format and type checks as tests, so that the one test command checks everything CI checks."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mm", "nm", "mpihook", "tools")


def tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return path


def test_ruff_lint() -> None:
    result = subprocess.run(
        [tool("ruff"), "check", "."], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format() -> None:
    result = subprocess.run(
        [tool("ruff"), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy(tmp_path: Path) -> None:
    """Type-check the installed layout (storm.mm is mm/, ...) through a tree of symlinks.

    mypy cannot follow the import hook of an editable install, so it is shown the same layout directly.
    """
    tree = tmp_path / "storm"
    tree.mkdir()
    for package in PACKAGES:
        (tree / package).symlink_to(ROOT / package)
    args = [
        tool("mypy"),
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    for package in PACKAGES:
        args += ["-p", f"storm.{package}"]
    result = subprocess.run(
        args, cwd=tmp_path, env={"MYPYPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
