"""End to end through the `storm` command exactly as the README tells a new user to use it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import JOB_TIMEOUT

pytestmark = pytest.mark.slow

JOB_KEYS = {
    "id", "name", "user", "state", "ranks", "nodes",
    "submit_time", "start_time", "end_time", "exit_code", "reason",
}  # fmt: skip


def storm(local_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STORM_MM"}
    env["STORM_LOCAL_DIR"] = str(local_dir)
    return subprocess.run(
        [sys.executable, "-m", "storm.tools.cli", *args], env=env, cwd=cwd,
        capture_output=True, text=True, timeout=JOB_TIMEOUT, check=False,
    )  # fmt: skip


def test_local_up_submit_inspect_down(tmp_path: Path) -> None:
    local, work = tmp_path / "local", tmp_path / "work"
    work.mkdir()
    up = storm(local, work, "local", "up", "--nodes", "2", "--detach")
    assert up.returncode == 0, up.stderr
    try:
        assert "2 node(s) x 1 PE(s)" in up.stdout
        nodes = json.loads(storm(local, work, "nodes", "--json").stdout)
        assert [(n["name"], n["state"], n["pes"]) for n in nodes] == [("node0", "UP", 1), ("node1", "UP", 1)]

        run = storm(local, work, "submit", "-n", "2", "--name", "demo", "--wait", "--", *hello())
        assert run.returncode == 0, run.stderr
        job_id = int(run.stdout)
        assert "hello: OK" in (work / f"storm-{job_id}.out").read_text()

        shown = json.loads(storm(local, work, "show", str(job_id), "--json").stdout)
        assert set(shown) >= JOB_KEYS
        assert (shown["id"], shown["name"], shown["state"], shown["exit_code"]) == (
            job_id,
            "demo",
            "COMPLETED",
            0,
        )
        assert shown["nodes"] == ["node0", "node1"] and shown["ranks"] == 2
        assert shown["submit_time"] <= shown["start_time"] <= shown["end_time"]

        assert json.loads(storm(local, work, "queue", "--json").stdout) == []  # nothing active
        everything = json.loads(storm(local, work, "queue", "--all", "--json").stdout)
        assert [j["id"] for j in everything] == [job_id]
        table = storm(local, work, "queue", "--all").stdout.splitlines()
        assert table[0].split()[:4] == ["JOBID", "NAME", "USER", "STATE"]
        assert table[1].split()[:4] == [str(job_id), "demo", "root", "COMPLETED"]

        again = storm(local, work, "local", "up", "--detach")
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        down = storm(local, work, "local", "down")
    assert down.returncode == 0, down.stderr
    gone = storm(local, work, "nodes")
    assert gone.returncode == 1 and "no storm-mm listens" in gone.stderr


def hello() -> list[str]:
    return [sys.executable, "-m", "storm.tools.apps.hello"]


def test_local_up_in_the_foreground_stops_on_ctrl_c(tmp_path: Path) -> None:
    local = tmp_path / "local"
    env = {k: v for k, v in os.environ.items() if k != "STORM_MM"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "storm.tools.cli", "local", "up", "--dir", str(local), "--nodes", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("storm local cluster up: 1 node(s)")
        nodes = json.loads(storm(local, tmp_path, "nodes", "--json").stdout)
        assert [n["state"] for n in nodes] == ["UP"]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=JOB_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "storm local cluster stopped" in out
    assert storm(local, tmp_path, "nodes").returncode == 1
