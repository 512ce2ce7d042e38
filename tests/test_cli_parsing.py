"""The storm CLI's pure helpers and argument handling: nothing here talks to a machine manager."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from pathlib import Path

import pytest

from storm.mm import protocol as p
from storm.mm.slurm_style import format_duration
from storm.tools import cli, cli_arrays, cli_local
from storm.tools.cli import (
    UsageError,
    check_command,
    parse_time_limit,
    prepare_outputs,
)
from storm.tools.views import ranks_text, state_text, table


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5", 300),
        (" 5 ", 300),
        ("1:30", 90),
        ("0:45", 45),
        ("1:00:00", 3600),
        ("0:0:1", 1),
        ("2-0", 2 * 86400),
        ("2-1:30", 2 * 86400 + 3600 + 30 * 60),
        ("1-0:0:5", 86400 + 5),
        ("0-1", 3600),
        ("30s", 30),
        ("5m", 300),
        ("1.5h", 5400),
        ("2h", 7200),
        ("1d", 86400),
        ("0.5s", 0.5),
    ],
)
def test_parse_time_limit(text: str, seconds: float) -> None:
    result = parse_time_limit(text)
    assert result == seconds and type(result) is float


BAD_LIMITS = ["", "  ", "abc", "0", "0:00", "0-0", "-5", "1:2:3:4", "5x", "1.5", "m5", "1h30m"]


@pytest.mark.parametrize("text", BAD_LIMITS)
def test_parse_time_limit_rejects(text: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_time_limit(text)
    assert "time limit" in str(info.value)


@pytest.mark.parametrize("text", ["0s", "0m", "0.0h"])
def test_parse_time_limit_rejects_zero_with_a_unit(text: str) -> None:
    with pytest.raises(UsageError, match="must be positive"):
        parse_time_limit(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0, "0:00:00"),
        (59.4, "0:00:59"),
        (59.6, "0:01:00"),
        (3661, "1:01:01"),
        (86399, "23:59:59"),
        (86400, "1-00:00:00"),
        (2 * 86400 + 3 * 3600 + 4 * 60 + 5, "2-03:04:05"),
        (-3, "0:00:00"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_duration_reads_back_as_the_same_limit() -> None:
    for seconds in (90.0, 3600.0, 86400.0 + 5, 3 * 86400 + 7200 + 180 + 1):
        assert parse_time_limit(format_duration(seconds)) == seconds


def test_table() -> None:
    text = table(("ID", "NAME", "X"), [(1, "alpha", None), (1234, "b", "")])
    assert text.splitlines() == [
        "ID    NAME   X",
        "1     alpha  None",
        "1234  b",  # trailing blanks are stripped
    ]
    assert table(("A", "BB"), []) == "A  BB"


# ---------------------------------------------------------------------------------------------- commands


def make_file(path: Path, mode: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def test_check_command_absolute_paths(tmp_path: Path) -> None:
    tool = make_file(tmp_path / "tool", 0o755)
    check_command([str(tool)], {}, "/")
    with pytest.raises(UsageError, match=f"^{re.escape(str(tmp_path))}/missing: no such file$"):
        check_command([str(tmp_path / "missing")], {}, "/")
    with pytest.raises(UsageError, match="no such file"):
        check_command([str(tmp_path)], {}, "/")  # a directory is not a program
    plain = make_file(tmp_path / "data", 0o644)
    with pytest.raises(UsageError, match=f"^{re.escape(str(plain))}: not executable$"):
        check_command([str(plain)], {}, "/")


def test_check_command_relative_path_against_cwd(tmp_path: Path) -> None:
    make_file(tmp_path / "bin" / "run", 0o700)
    check_command(["bin/run"], {}, str(tmp_path))
    check_command(["./bin/run"], {}, str(tmp_path))
    with pytest.raises(UsageError, match=r"^bin/run: no such file$"):
        check_command(["bin/run"], {}, "/")


def test_check_command_searches_the_given_path(tmp_path: Path) -> None:
    make_file(tmp_path / "bin" / "mytool", 0o755)
    make_file(tmp_path / "other" / "noexec", 0o644)
    path = f"{tmp_path / 'other'}{os.pathsep}{tmp_path / 'bin'}"
    check_command(["mytool", "--flag"], {"PATH": path}, "/")
    with pytest.raises(UsageError, match=r"^mytool: command not found in PATH$"):
        check_command(["mytool"], {"PATH": str(tmp_path / "other")}, "/")
    with pytest.raises(UsageError, match="command not found"):
        check_command(["noexec"], {"PATH": path}, "/")
    with pytest.raises(UsageError, match="command not found"):
        check_command(["mytool"], {"PATH": ""}, str(tmp_path / "bin"))


# ---------------------------------------------------------------------------------------------- outputs


def test_prepare_outputs_makes_the_path_absolute_and_truncates(tmp_path: Path) -> None:
    old = tmp_path / "out.txt"
    old.write_text("previous run\n")
    assert prepare_outputs("out.txt", 4, str(tmp_path), "alice", "job") == str(old)
    assert old.read_text() == ""
    absolute = tmp_path / "sub" / "abs.txt"
    absolute.parent.mkdir()
    assert prepare_outputs(str(absolute), 1, "/", "alice", "job") == str(absolute)
    assert absolute.exists()


def test_prepare_outputs_per_rank_files(tmp_path: Path) -> None:
    (tmp_path / "r1.log").write_text("old")
    assert prepare_outputs("r%t.log", 3, str(tmp_path), "alice", "job") == str(tmp_path / "r%t.log")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r0.log", "r1.log", "r2.log"]
    assert (tmp_path / "r1.log").read_text() == ""


@pytest.mark.parametrize("pattern", ["storm-%j.out", "out-%N.txt", "%j.%t"])
def test_prepare_outputs_leaves_unknown_names_to_the_job(tmp_path: Path, pattern: str) -> None:
    assert prepare_outputs(pattern, 2, str(tmp_path), "alice", "job") == str(tmp_path / pattern)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("pattern", "name"), [("out-%u.txt", "out-alice.txt"), ("out-%x.txt", "out-job.txt")]
)
def test_prepare_outputs_names_files_for_the_user_and_job(tmp_path: Path, pattern: str, name: str) -> None:
    (tmp_path / name).write_text("old")
    prepare_outputs(pattern, 1, str(tmp_path), "alice", "job")
    assert [p.name for p in tmp_path.iterdir()] == [name]
    assert (tmp_path / name).read_text() == ""


def test_prepare_outputs_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError, match=f"^output directory {tmp_path}/nope does not exist$"):
        prepare_outputs("nope/out", 1, str(tmp_path), "alice", "job")
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=f"^output directory {tmp_path}/file is not a directory$"):
        prepare_outputs(str(tmp_path / "file" / "out"), 1, "/", "alice", "job")
    (tmp_path / "adir").mkdir()
    with pytest.raises(UsageError, match=f"^cannot write output file {tmp_path}/adir: Is a directory$"):
        prepare_outputs("adir", 1, str(tmp_path), "alice", "job")
    # Tests run as root, for whom every directory is writable: pretend otherwise.
    monkeypatch.setattr(cli.os, "access", lambda path, mode: False)
    with pytest.raises(UsageError, match=f"^output directory {tmp_path} is not writable$"):
        prepare_outputs("out", 1, str(tmp_path), "alice", "job")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- parser


def test_parser_submit() -> None:
    argv = ["submit", "-n", "4", "-t", "5m", "-J", "x", "-W", "--", "prog", "-n", "1"]
    args = cli.build_parser().parse_args(argv)
    assert (args.cmd, args.ranks, args.time, args.name, args.wait) == ("submit", "4", "5m", "x", True)
    assert args.command == ["--", "prog", "-n", "1"]  # the command's own options stay its own


def test_storm_run_takes_every_submit_option_but_wait_and_its_own_label() -> None:
    parser = cli.build_parser()
    submit = parser.parse_args(["submit", "-n", "1", "--", "true"])
    run = parser.parse_args(["run", "-n", "2", "-l", "--", "prog", "--label"])
    assert set(vars(run)) - set(vars(submit)) == {"label"}
    assert set(vars(submit)) - set(vars(run)) == {"wait"}
    assert (run.cmd, run.ranks, run.label, run.command) == ("run", "2", True, ["--", "prog", "--label"])


def test_storm_run_refuses_what_submit_refuses_before_contacting_the_mm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["run", "-n", "0", "--", "true"]) == 2
    assert capsys.readouterr().err == "storm run: -n 0: a job needs at least 1 rank\n"
    assert cli.main(["run", "-n", "1"]) == 2
    assert "storm run: a command is required: storm run -n RANKS -- COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["submit", "--", "true"], "the following arguments are required: -n/--ranks"),
        (["run", "--", "true"], "the following arguments are required: -n/--ranks"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required: COMMAND"),
        (["show"], "the following arguments are required: JOBID"),
        (["cancel", "x"], "argument JOBID: 'x' is not a job id: give 123, or 123_7 for task 7 of array 123"),
        (["show", "12_x"], "argument JOBID: '12_x': the task after '_' must be a task id (123_7)"),
        (["local", "sideways"], "invalid choice: 'sideways'"),
    ],
)
def test_parser_usage_errors(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.build_parser().parse_args(argv)
    assert info.value.code == 2
    assert expected in capsys.readouterr().err


def test_main_refuses_zero_ranks_before_contacting_the_mm(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["submit", "-n", "0", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err == "storm submit: -n 0: a job needs at least 1 rank\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4", (4, 0)), ("4-16", (4, 16)), (" 2 - 8 ", (2, 8)), ("4-4", (4, 0)), ("1-1000", (1, 1000))],
)
def test_ranks_are_a_number_or_slurms_range_for_a_moldable_job(text: str, expected: tuple[int, int]) -> None:
    assert cli.parse_ranks(text) == expected


@pytest.mark.parametrize(
    ("ranks", "error"),
    [
        ("16-4", "-n 16-4: the minimum (16) is larger than the maximum (4)"),
        ("0-3", "-n 0-3: a job needs at least 1 rank"),
        ("two", "-n two: give a number of ranks (4) or a range MIN-MAX (4-16)"),
        ("4-", "-n 4-: give a number of ranks (4) or a range MIN-MAX (4-16)"),
        ("4-x", "-n 4-x: give a number of ranks (4) or a range MIN-MAX (4-16)"),
        ("2.5", "-n 2.5: give a number of ranks (4) or a range MIN-MAX (4-16)"),
        ("99999999999", "-n 99999999999: too many ranks"),
    ],
)
def test_a_bad_rank_count_or_range_is_a_usage_error_before_contacting_the_mm(
    ranks: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["submit", "-n", ranks, "--", "true"]) == 2
    assert capsys.readouterr().err == f"storm submit: {error}\n"


@pytest.mark.parametrize("argv", [["submit", "-n", "1"], ["submit", "-n", "1", "--"]])
def test_main_refuses_a_missing_command(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert "storm submit: a command is required" in capsys.readouterr().err


def test_main_refuses_a_command_that_cannot_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["submit", "-n", "1", "--", "no-such-program-here"]) == 2
    assert capsys.readouterr().err == "storm submit: no-such-program-here: command not found in PATH\n"
    assert cli.main(["submit", "-n", "1", "-t", "soon", "--", "/bin/sh"]) == 2
    assert "invalid time limit 'soon'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing was created for a refused job


def test_storm_sim_offers_every_action_the_simulator_has() -> None:
    """tools/cli.py names them without importing the simulator: the two lists must agree."""
    from storm.tools.cli import SIM_ACTIONS
    from storm.tools.sim.cli import build_parser as sim_parser

    parser = sim_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(SIM_ACTIONS) == set(sub.choices) - {"point"}  # point: one job of a submitted sweep


def test_local_up_on_a_torus_takes_its_node_count_from_the_torus() -> None:
    parsed = cli.build_parser().parse_args(["local", "up", "--topology", "torus:2x2x2"])
    assert cli_local.local_topology(parsed) == (8, (2, 2, 2))
    parsed = cli.build_parser().parse_args(["local", "up"])
    assert cli_local.local_topology(parsed) == (2, None)
    parsed = cli.build_parser().parse_args(["local", "up", "--topology", "torus:2x2x2", "--nodes", "4"])
    with pytest.raises(UsageError, match="torus:2x2x2 has 8 nodes, not --nodes 4"):
        cli_local.local_topology(parsed)
    parsed = cli.build_parser().parse_args(["local", "up", "--topology", "mesh 2x2"])
    with pytest.raises(UsageError, match=r"--topology: .*neither 'flat' nor 'torus XxYxZ'"):
        cli_local.local_topology(parsed)


def test_a_local_torus_writes_each_nodes_place(tmp_path: Path) -> None:
    from storm.mm.config import load
    from storm.tools.local_cluster import LocalCluster

    cluster = LocalCluster(dir=tmp_path, nodes=8, topology=(2, 2, 2), keys=False)
    cluster.write_config()
    config = load(cluster.config_path)
    assert config.mm.topology == "torus 2x2x2"
    assert config.mm.coordinates["node5"] == [1, 0, 1]
    layout = config.mm.torus_layout()
    assert layout is not None and layout.names[5] == "node5"


def test_queue_and_show_give_a_moldable_jobs_range_then_its_size_and_say_suspended() -> None:
    job = p.JobInfo(
        id=3, name="m", user="alice", uid=1000, state="PENDING", ranks=2, nodes=(), submit_time=1.0,
        start_time=None, end_time=None, exit_code=None, reason="", time_limit=None, argv=("x",), cwd="/",
        output="", error="", min_ranks=2, max_ranks=16,
    )  # fmt: skip
    assert (ranks_text(job), state_text(job)) == ("2-16", "PENDING")
    placed = dataclasses.replace(job, state="RUNNING", ranks=8, start_time=2.0)
    assert (ranks_text(placed), state_text(placed)) == ("8 (2-16)", "RUNNING")
    assert state_text(dataclasses.replace(placed, suspended_by=4)) == "SUSPENDED"
    assert ranks_text(dataclasses.replace(job, min_ranks=0, max_ranks=0, ranks=4)) == "4"


def test_local_up_takes_mm_settings_in_toml_and_checks_them_first() -> None:
    pairs = ["preemption=suspend", "qos={normal=0,high=10}", "preempt_min_run=5", "backfill=none"]
    assert cli_local.mm_settings(pairs) == {
        "preemption": "suspend", "qos": {"normal": 0, "high": 10}, "preempt_min_run": 5, "backfill": "none",
    }  # fmt: skip
    assert cli_local.mm_settings(["mpl=3"], "gang") == {"mpl": 3}
    for pair, error in (
        ("preemption=maybe", "--set: mm.preemption: 'maybe' is not one of off, suspend"),
        ("mpl=3", "--set: cluster.policy batch runs one job per PE: mm.mpl must be 1"),
        ("nokey", "--set nokey: give KEY=VALUE, an [mm] setting"),
        ("frob=1", "--set: mm: unknown setting(s) frob"),
    ):
        with pytest.raises(cli.UsageError, match="^" + re.escape(error)):
            cli_local.mm_settings([pair])


# ----------------------------------------------------------------------------------- arrays, dependencies


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--array", "0-x"], "--array 0-x: '0-x' is not a task id (N), a range (N-M) or a stepped range"),
        (["--array", "5-1%2"], "--array 5-1%2: the range 5-1 ends before it starts"),
        (["-a", "0-9%0"], "--array 0-9%0: %0 would run no task"),
        (["--dependency", "afterok"], "--dependency afterok: afterok needs a job id (afterok:123)"),
        (["-d", "afterok:1,after:2?afterany:3"], "use ',' (all must hold) or '?' (any one), not both"),
        (["-d", "singleton"], "singleton, aftercorr and +time are not supported"),
    ],
)
def test_submit_refuses_a_bad_array_or_dependency_before_anything(
    options: list[str],
    says: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    status = cli.main(["--mm", "ipc:///nonexistent", "submit", "-n", "1", *options, "--", "true"])
    assert status == 2  # a usage error: storm-mm was never asked
    assert says in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no output file made either


def test_submit_sends_the_canonical_array_and_dependency() -> None:
    args = cli.build_parser().parse_args(
        ["submit", "-n", "1", "-a", "5-7,1-4%3", "-d", "afterok:4,afterok:5_2", "--", "x"]
    )
    assert cli_arrays.submit_fields(args) == {"array": "1-7%3", "dependency": "afterok:4:5_2"}


def test_output_names_with_array_ids_are_left_to_the_tasks(tmp_path: Path) -> None:
    for pattern in ("o-%A_%a.out", "o-%a.out"):
        assert prepare_outputs(pattern, 1, str(tmp_path), "alice", "job") == str(tmp_path / pattern)
    assert list(tmp_path.iterdir()) == []  # not truncated now: each task makes its own


def info(
    job_id: int, state: str = "PENDING", reason: str = "", task: int | None = None, **kw: object
) -> p.JobInfo:
    return p.JobInfo(
        id=job_id, name="a", user="alice", uid=1000, state=state, ranks=1, nodes=(), submit_time=1.0,
        start_time=None, end_time=None, exit_code=None, reason=reason, time_limit=None, argv=("x",), cwd="/",
        output="", error="", array_id=None if task is None else 10, array_task=task,
        array="" if task is None else "0-99%10",
        **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_queue_folds_an_arrays_pending_tasks_by_reason_and_shows_running_tasks_one_per_line() -> None:
    jobs = [
        info(5, "RUNNING"),
        *(info(10 + t, "RUNNING", task=t) for t in range(3)),
        info(13, reason="Resources", task=3),
        info(14, reason="Resources", task=4),
        *(info(10 + t, reason="JobArrayTaskLimit", task=t) for t in range(5, 100)),
        info(200, reason="Dependency"),
    ]
    lines = [(name, count) for name, _job, count in cli_arrays.folded(jobs)]
    assert lines == [
        ("5", 1), ("10_0", 1), ("10_1", 1), ("10_2", 1), ("10_[3-4%10]", 2), ("10_[5-99%10]", 95), ("200", 1),
    ]  # fmt: skip
    lone = cli_arrays.folded([info(13, reason="Resources", task=3)])
    assert [(name, count) for name, _job, count in lone] == [("10_3", 1)]


@pytest.mark.parametrize(
    ("refs", "ids", "tasks"),
    [
        (["12", "13_4", "14_[0-2:2]"], (12,), ((13, 4), (14, 0), (14, 2))),
        (["7"], (7,), ()),
    ],
)
def test_job_references(refs: list[str], ids: tuple[int, ...], tasks: tuple[tuple[int, int], ...]) -> None:
    got_ids, got_tasks = cli_arrays.references(refs)
    assert got_ids == ids and [(t.array_id, t.task) for t in got_tasks] == list(tasks)


@pytest.mark.parametrize(
    ("argv", "word"),
    [
        (["queue"], "queue"),
        (["--mm", "ipc:///x", "show", "3"], "show"),
        (["--mm=ipc:///x", "submit", "-n", "1", "--", "true"], "submit"),
        (["--help"], ""),
        ([], ""),
    ],
)
def test_command_word(argv: list[str], word: str) -> None:
    assert cli.command_word(argv) == word


def test_a_parser_built_for_one_command_parses_it_as_the_whole_parser_does() -> None:
    argv = ["--mm", "ipc:///x", "submit", "-n", "2", "--array", "0-3%2", "-d", "afterok:7", "--", "true"]
    whole, one = cli.build_parser().parse_args(argv), cli.build_parser("submit").parse_args(argv)
    assert vars(whole) == vars(one) and one.func is cli.cmd_submit
    for command in cli.GROUPS:  # every command is built by its group
        assert command in cli.build_parser(command)._subparsers._group_actions[0].choices  # type: ignore[union-attr]


def test_a_malformed_endpoint_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--mm", "x", "queue"]) == 1
    assert "cannot connect to 'x'" in capsys.readouterr().err
