"""What a `storm` command loads when it starts, so that it stays fast (issue 18): the commands that ask
storm-mm one thing import no asyncio, no CURVE keys and no job model, build the message classes from
compiled code kept in __pycache__, and run without Python's cyclic collector. Imports, not timings:
``storm bench cli`` measures those."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import zmq

from storm.mm import protocol as p
from storm.tools import bench_cli
from storm.tools.client import Client
from storm.tools.command import short
from storm.tools.local_cluster import LocalCluster

# Each costs a short command time for nothing it does: pyzmq takes longer to import than the rest of the
# command (a local MM is reached with tools/zmtp.py); asyncio (with ssl, subprocess, concurrent.futures)
# came with zmq's monitor; keys and config read files only a remote MM needs; the job model brings the
# torus; local_cluster and storm.nm are the daemons' side.
FORBIDDEN = (
    "zmq", "asyncio", "ssl", "matplotlib", "numpy", "tomllib",
    "storm.mm.keys", "storm.mm.config", "storm.mm.jobs", "storm.mm.torus", "storm.mm.store",
    "storm.tools.local_cluster", "storm.nm",
)  # fmt: skip

# The `storm` script's main, with what the process imported and how it left the collector written at exit.
CHILD = """
import atexit, gc, json, os, sys

def report():
    from storm.mm import cached_dataclass
    methods = [m for name, m in cached_dataclass._COMPILED.items() if name.startswith("storm.mm.protocol")]
    with open(os.environ["STARTUP_REPORT"], "w") as file:
        json.dump({
            "modules": sorted(sys.modules),
            "collector": gc.isenabled(),
            "frozen": gc.get_freeze_count(),
            "compiled_now": any(m.compiled > 0 for m in methods) if methods else None,
        }, file)

atexit.register(report)
sys.argv = ["storm", *sys.argv[1:]]
from storm.tools.command import main
main()
"""

JOB = p.JobInfo(
    id=7, name="demo", user="someone", uid=1000, state="RUNNING", ranks=1, nodes=("node0",),
    submit_time=1.0, start_time=2.0, end_time=None, exit_code=None, reason="", time_limit=None,
    argv=("true",), cwd="/", output="/storm-7.out", error="",
)  # fmt: skip


def answer(request: p.Message) -> p.Message:
    """A storm-mm that knows one job."""
    assert isinstance(request, p.Request)
    match request:
        case p.SubmitJob():
            return p.JobSubmitted(req=request.req, job_id=7)
        case p.ListJobs():
            return p.JobList(req=request.req, jobs=(JOB,))
        case p.GetSpawns():
            return p.SpawnsView(req=request.req, job_id=request.job_id)
    raise AssertionError(f"unexpected request {request.op}")


def run_storm(
    tmp_path: Path, args: list[str], requests: int, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    """Run ``storm ARGS`` (in ``env``, default this one) against a stand-in storm-mm that answers
    ``requests`` requests."""
    endpoint = f"ipc://{tmp_path}/mm.sock"
    router = zmq.Context.instance().socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(endpoint)
    report = tmp_path / "report.json"
    child_env = {**(os.environ if env is None else env), "STORM_MM": endpoint, "STARTUP_REPORT": str(report)}
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, *args], env=child_env, cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for _ in range(requests):
            assert router.poll(30_000), "the command sent nothing"
            peer, body = router.recv_multipart()
            router.send_multipart([peer, p.encode(answer(p.decode(body)))])
        out, err = child.communicate(timeout=30)
    finally:
        router.close()
    done = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    assert done.returncode == 0, err
    return done, json.loads(report.read_text())


@pytest.mark.parametrize(
    ("args", "requests", "shown", "later"),
    [
        (["submit", "-n", "1", "--", "true"], 1, "7", set()),
        (["queue"], 1, "demo", set()),
        (["show", "7"], 2, "JobId: 7", set()),
    ],
)
def test_a_short_command_imports_only_what_it_needs(
    tmp_path: Path, args: list[str], requests: int, shown: str, later: set[str]
) -> None:
    done, report = run_storm(tmp_path, args, requests)
    assert shown in done.stdout
    modules = report["modules"]
    assert isinstance(modules, list)
    loaded = [m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert loaded == []
    # Of the protocol's modules imported on demand (mm/protocol/__init__.py), only those its messages need.
    assert {m.rsplit(".", 1)[1] for m in modules if m.startswith("storm.mm.protocol.")} == {
        "records",
        "client",
        *later,
    }
    assert "storm.mm.protocol" in modules and "storm.tools.zmtp" in modules  # it did talk to storm-mm
    # The collector stayed off, and what existed at the end was frozen, not walked at exit.
    assert report["collector"] is False
    assert isinstance(report["frozen"], int) and report["frozen"] > 10_000


def test_the_message_classes_come_from_compiled_code_kept_between_runs(tmp_path: Path) -> None:
    """The first run compiles the methods dataclasses writes and keeps them; the next compiles none."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pycache")  # an empty cache of its own
    first = run_storm(tmp_path, ["queue"], 1, env)[1]
    again = run_storm(tmp_path, ["queue"], 1, env)[1]
    assert (first["compiled_now"], again["compiled_now"]) == (True, False)
    kept = (tmp_path / "pycache").rglob("*.dataclasses")
    assert [f for f in kept if f.parent.name == "protocol"]  # one per module of mm/protocol/ that has classes


@pytest.mark.parametrize(
    ("argv", "quick"),
    [
        (["submit", "-n", "1", "--", "true"], True),
        (["--mm", "ipc:///x", "queue"], True),
        (["--mm=ipc:///x", "show", "1"], True),
        (["--mm", "watch", "queue"], True),  # "watch" is the endpoint
        (["watch"], False),
        (["local", "up"], False),
        (["bench", "cli"], False),
        (["--help"], False),
        (["--m", "ipc:///x", "queue"], False),  # an abbreviation argparse takes: not recognised, not short
        ([], False),
    ],
)
def test_only_commands_that_ask_one_thing_run_without_the_collector(argv: list[str], quick: bool) -> None:
    assert short(argv) is quick


LAZY = """
import json, sys
import msgpack
from storm.mm import protocol as p
before = sorted(m for m in sys.modules if m.startswith("storm.mm.protocol."))
checks = {"before": before}
try:
    p.dataclass  # node.py imports it, but it is not the protocol's
    checks["dataclass"] = "found"
except AttributeError:
    checks["dataclass"] = "missing"
checks["decoded"] = p.decode(msgpack.packb({"op": "ack", "job_id": 3, "what": "job_node_done"})).op
checks["after_decode"] = sorted(m for m in sys.modules if m.startswith("storm.mm.protocol."))
checks["ops"] = len(p.registered_ops())
from storm.mm.protocol import ShellDone, node
checks["same"] = p.LaunchJob is node.LaunchJob and ShellDone.op == "shell_done"
print(json.dumps(checks))
"""


def test_the_protocol_imports_the_modules_of_other_links_when_first_needed() -> None:
    """A message of a module not imported yet still decodes, its names are still the package's, and every
    op is still listed; nothing a module merely imported becomes the package's."""
    done = subprocess.run(
        [sys.executable, "-c", LAZY], capture_output=True, text=True, check=True, timeout=30
    )
    checks = json.loads(done.stdout)
    assert checks["before"] == ["storm.mm.protocol.client", "storm.mm.protocol.records"]
    assert checks["dataclass"] == "missing"
    assert checks["decoded"] == "ack"
    assert {m.rsplit(".", 1)[1] for m in checks["after_decode"]} == {"records", "client", *p.LATER}
    assert checks["ops"] == len(p.registered_ops())  # (this process has every module: all ops)
    assert checks["same"] is True


# ---------------------------------------------------------------------------------------------------------
# cached_dataclass.dataclass: its cache, on a module of a test's own

MODULE = """
from __future__ import annotations
from storm.mm.cached_dataclass import dataclass

@dataclass(frozen=True, kw_only=True)
class Point:
    x: int
    y: int = 0
{extra}
"""

PROBE = """
import dataclasses, json, sys
sys.path.insert(0, sys.argv[1])
import points
from storm.mm import cached_dataclass
p = points.Point(x=1, **json.loads(sys.argv[2]))
try:
    p.x = 2
    frozen = False
except dataclasses.FrozenInstanceError:
    frozen = True
print(json.dumps({
    "repr": repr(p), "equal": p == points.Point(x=1, **json.loads(sys.argv[2])), "hash": hash(p) == hash(p),
    "frozen": frozen, "compiled_now": cached_dataclass._COMPILED["points"].compiled > 0,
}))
"""


def probe(directory: Path, extra: str = "", fields: str = "{}", **env: str) -> dict[str, object]:
    environment = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    }
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(directory), fields], env={**environment, **env},
        capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.fixture
def points(tmp_path: Path) -> Callable[[str], Path]:
    def write(extra: str = "") -> Path:
        (tmp_path / "points.py").write_text(MODULE.format(extra=extra))
        return tmp_path / "__pycache__" / f"points.{sys.implementation.cache_tag}.dataclasses"

    return write


def test_a_class_is_compiled_once_and_again_when_it_changes(
    tmp_path: Path, points: Callable[[str], Path]
) -> None:
    cache = points("")
    same = {"repr": "Point(x=1, y=0)", "equal": True, "hash": True, "frozen": True}
    assert probe(tmp_path) == {**same, "compiled_now": True}
    assert cache.exists()
    assert probe(tmp_path) == {**same, "compiled_now": False}
    points("    z: str = ''")  # another field: other methods, compiled, and the class has the field
    assert probe(tmp_path, fields='{"z": "a"}') == {
        **same,
        "repr": "Point(x=1, y=0, z='a')",
        "compiled_now": True,
    }
    assert probe(tmp_path, fields='{"z": "a"}')["compiled_now"] is False


def test_a_damaged_cache_is_ignored_and_replaced(tmp_path: Path, points: Callable[[str], Path]) -> None:
    cache = points("")
    cache.parent.mkdir()
    cache.write_bytes(b"\xe3not marshal at all")
    assert probe(tmp_path)["compiled_now"] is True
    assert probe(tmp_path)["compiled_now"] is False


def test_no_cache_is_written_where_bytecode_is_not(tmp_path: Path, points: Callable[[str], Path]) -> None:
    cache = points("")
    assert probe(tmp_path, PYTHONDONTWRITEBYTECODE="1")["frozen"] is True
    assert not cache.exists()


# ---------------------------------------------------------------------------------------------------------
# storm bench cli


def test_import_report_keeps_only_top_level_imports() -> None:
    report = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       100 |        100 |   typing\n"
        "import time:       200 |        500 | zmq\n"
        "import time:        50 |        900 | storm.tools.cli\n"
    )
    assert bench_cli.top_imports(report) == [("zmq", 500), ("storm.tools.cli", 900)]


@pytest.mark.slow
def test_measure_cli_times_every_command_and_both_loops(cluster: LocalCluster) -> None:
    """What storm bench scale calls: against a running cluster, one run of each command and loops of 2."""
    result = bench_cli.measure_cli(cluster.dir, repeats=1, loop=2)
    commands = result["storm"]["commands"]
    assert set(commands) == set(bench_cli.COMMANDS)
    for name in bench_cli.GOAL_COMMANDS:
        figures = commands[name]
        assert figures["wall_ms"]["runs"] == 1 and figures["wall_ms"]["median"] > figures["mm_ms"] > 0
        assert isinstance(figures["goal_met"], bool) and figures["imports_ms"] > 0
    assert result["storm"]["held"] is True
    assert result["storm"]["loop_held"]["count"] == result["storm"]["loop"]["count"] == 2
    with Client(cluster.endpoint) as client:  # the blocker and the held jobs are gone; the last 2 may run
        assert len(client.jobs()) <= 2 and "bench-cli-hold" not in {j.name for j in client.jobs()}
