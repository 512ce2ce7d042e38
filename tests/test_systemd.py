"""The systemd units are valid and the MM's is well sandboxed (systemd is not PID 1 here: offline checks)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "systemd"
ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")


def installed_copy(unit: str, tmp_path: Path) -> Path:
    """The unit as an operator installs it, with ExecStart pointing at this environment's scripts."""
    text = (UNITS / unit).read_text().replace("/opt/storm/bin", str(Path(sys.executable).parent))
    path = tmp_path / unit
    path.write_text(text)
    return path


@pytest.mark.parametrize("unit", ["storm-mm.service", "storm-nm.service"])
def test_unit_verifies(unit: str, tmp_path: Path) -> None:
    assert ANALYZE is not None
    result = subprocess.run(
        [ANALYZE, "verify", "--man=no", str(installed_copy(unit, tmp_path))],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


def exposure(unit: Path) -> float:
    assert ANALYZE is not None
    result = subprocess.run(
        [ANALYZE, "security", "--offline=true", str(unit)], capture_output=True, text=True, check=False
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    return float(match[1])


def test_mm_is_sandboxed_and_nm_keeps_jobs_on_stop(tmp_path: Path) -> None:
    mm = exposure(installed_copy("storm-mm.service", tmp_path))
    assert mm < 4.0, f"storm-mm.service exposure {mm}: the MM runs no jobs and should stay tightly sandboxed"
    settings = {
        line.split("=", 1)[0]
        for line in (UNITS / "storm-nm.service").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    }
    assert "KillMode" in settings
    # Sandboxing the NM would sandbox every job it starts.
    assert not settings & {"ProtectHome", "PrivateTmp", "PrivateUsers", "ProtectControlGroups"}
