"""storm.toml and the daemons' command-line flags."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest

from storm.mm import config as c
from storm.mm.config import ClusterConfig, ConfigError, MMConfig, NMConfig, StormConfig, load
from storm.mm.protocol import FcsParameters


@pytest.fixture(autouse=True)
def no_system_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """from_arguments falls back to /etc/storm/storm.toml: never let the machine's own file in."""
    monkeypatch.setattr(c, "DEFAULT_CONFIG", tmp_path / "absent" / "storm.toml")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "storm.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    config = load(None)
    assert config == StormConfig()
    assert config.cluster == ClusterConfig(name="storm", policy="batch")
    assert config.mm.node_timeout == 10.0 and config.mm.mpl == 1 and config.mm.sync == "FULL"
    assert config.mm.node_endpoint == "tcp://*:6817" and config.mm.kill_timeout == 60.0
    assert config.nm.cpus == [] and config.nm.pes == 0 and config.nm.mm == "tcp://localhost:6817"


def test_file_with_all_sections(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [cluster]
        name = "lab"
        policy = "gang"
        [mm]
        state_dir = "/srv/storm"
        node_timeout = 3      # an integer where a float is declared
        mpl = 2
        default_time_limit = 1.5
        [nm]
        name = "n07"
        pes = 4
        cpus = [4, 5, 6, 7]
        kill_grace = 0.5
        """,
    )
    config = load(path)
    assert config.cluster == ClusterConfig(name="lab", policy="gang")
    assert config.mm == MMConfig(state_dir="/srv/storm", node_timeout=3.0, mpl=2, default_time_limit=1.5)
    assert type(config.mm.node_timeout) is float
    assert config.nm == NMConfig(name="n07", pes=4, cpus=[4, 5, 6, 7], kill_grace=0.5)


def test_empty_file_is_the_defaults(tmp_path: Path) -> None:
    assert load(write(tmp_path, "")) == StormConfig()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[scheduler]\nx = 1\n", "unknown section(s) scheduler"),
        ("[mm]\nnode_timeot = 5\n", "mm: unknown setting(s) node_timeot; known: "),
        ("[nm]\npes = 'four'\n", "nm.pes: expected int, got 'four'"),
        ("[nm]\npes = 1.5\n", "nm.pes: expected int, got 1.5"),
        ("[nm]\npes = true\n", "nm.pes: expected int, got True"),
        ("[mm]\nnode_timeout = false\n", "mm.node_timeout: expected float, got False"),
        ("[cluster]\nname = 5\n", "cluster.name: expected str, got 5"),
        ("[nm]\ncpus = 3\n", "nm.cpus: expected list, got 3"),
        ("[nm]\ncpus = [1, 'x']\n", "nm.cpus: expected int, got 'x'"),
        ("mm = []\n", "[mm] must be a table"),
        ("nm = [[1, 2]]\n", "[nm] must be a table"),
    ],
)
def test_file_errors_name_the_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, text))
    assert expected in str(info.value)


@pytest.mark.parametrize("text", ["mm = 5\n", "cluster = 'x'\n", "nm = [1, 2]\n"])
def test_a_section_that_is_a_scalar_is_a_config_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="must be a table"):
        load(write(tmp_path, text))


def test_unknown_setting_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(write(tmp_path, "[cluster]\npolcy = 'batch'\n"))
    assert str(info.value) == "cluster: unknown setting(s) polcy; known: name, policy"


def test_bad_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[mm]\nnode_timeout = = 5\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert "line 2" in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match="no such configuration file") as info:
        load(path)
    assert str(path) in str(info.value)


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path, '[cluster]\npolicy = "gang"\n[mm]\nnode_timeout = 3.0\nmpl = 2\n[nm]\ncpus = [1]\n'
    )
    config = load(path, {"mm": {"node_timeout": "7.5"}, "nm": {"cpus": "0,1"}})
    assert config.mm.node_timeout == 7.5
    assert config.mm.mpl == 2  # from the file, not overridden
    assert config.nm.cpus == [0, 1]
    with pytest.raises(ConfigError, match="mm: unknown setting"):
        load(path, {"mm": {"bogus": "1"}})


@pytest.mark.parametrize(
    ("hint", "text", "value"),
    [
        (int, "42", 42),
        (int, "-3", -3),
        (float, "2.5", 2.5),
        (float, "10", 10.0),
        (bool, "yes", True),
        (bool, "On", True),
        (bool, "1", True),
        (bool, "false", False),
        (bool, "OFF", False),
        (bool, "0", False),
        (list[int], "0,1", [0, 1]),
        (list[int], " 2, 3 4,,", [2, 3, 4]),
        (list[int], "", []),
        (list[str], "a,b", ["a", "b"]),
        (list[float], "1,2.5", [1.0, 2.5]),
        (str, "x,y", "x,y"),
    ],
)
def test_string_coercion(hint: object, text: str, value: object) -> None:
    result = c._coerce(text, hint, "s.k")
    assert result == value
    assert type(result) is type(value)


@pytest.mark.parametrize(
    ("hint", "value"),
    [(int, "4.0"), (int, "x"), (float, "ten"), (bool, "maybe"), (bool, 1), (list[int], "1,a"), (str, 3)],
)
def test_coercion_errors_name_the_key(hint: object, value: object) -> None:
    with pytest.raises(ConfigError, match=r"^s\.k: expected "):
        c._coerce(value, hint, "s.k")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"cluster": {"policy": "lottery"}}, "cluster.policy: 'lottery' is not one of batch, gang, sb, fcs"),
        ({"fcs": {"cs_thresh": 2.0}}, "fcs: need 0 < f_thresh <= cs_thresh < dc_thresh"),
        ({"fcs": {"f_thresh": 0.003}}, "fcs: need 0 < f_thresh <= cs_thresh < dc_thresh"),
        ({"fcs": {"cslots_min": 0}}, "fcs: cslots_min and tslots_max must be >= 1"),
        ({"fcs": {"spin_us": -1}}, "fcs: spin must be in [0, 1] second"),
        ({"mm": {"mpl": 0}}, "mm.mpl must be at least 1"),
        ({"mm": {"backfill": "EASY"}}, "mm.backfill: 'EASY' is not one of easy, conservative, none"),
        ({"mm": {"node_timeout": 0}}, "mm.node_timeout and mm.kill_timeout must be positive"),
        ({"mm": {"node_timeout": "-1"}}, "mm.node_timeout and mm.kill_timeout must be positive"),
        ({"nm": {"pes": -1}}, "nm.pes, nm.kill_grace and nm.shell_idle must not be negative"),
        ({"nm": {"kill_grace": -0.5}}, "nm.pes, nm.kill_grace and nm.shell_idle must not be negative"),
    ],
)
def test_validation(overrides: dict[str, dict[str, object]], expected: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(expected)):
        load(None, overrides)


def test_fcs_section_reaches_the_parameters_the_nodes_get(tmp_path: Path) -> None:
    text = '[cluster]\npolicy = "fcs"\n[fcs]\nspin_us = 50\ncslots_min = 5\ncs_thresh = 0.004\n'
    text += "tslots_max = 100\n"
    params = load(write(tmp_path, text)).fcs_parameters()
    assert (params.spin, params.cslots_min, params.cs_thresh, params.tslots_max) == (50e-6, 5, 0.004, 100)
    assert params.f_thresh == pytest.approx(0.85 * 0.004)  # the paper's default, scaled with CS_thresh
    assert params.dc_thresh == 1.0
    assert load(None).fcs_parameters() == FcsParameters()  # the defaults are Table 2's


@pytest.mark.parametrize("text", ["nan", "-nan"])
def test_nan_node_timeout_is_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        load(None, {"mm": {"node_timeout": text}})


def parse(sections: tuple[str, ...], argv: list[str]) -> StormConfig:
    parser = argparse.ArgumentParser()
    c.add_arguments(parser, sections)
    return c.from_arguments(parser.parse_args(argv))


def test_mm_flags() -> None:
    config = parse(
        ("cluster", "mm"),
        [
            "--node-timeout",
            "5",
            "--mpl",
            "3",
            "--state-dir",
            "/x",
            "--cluster-name",
            "c2",
            "--policy",
            "gang",
        ],
    )
    assert config.mm == MMConfig(node_timeout=5.0, mpl=3, state_dir="/x")
    # --name always means a node's name; the cluster's is --cluster-name for both daemons.
    assert config.cluster.name == "c2"
    assert config.nm == NMConfig()
    assert parse(("cluster", "mm"), []) == StormConfig()


def test_mm_flags_reject_nm_settings(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(("cluster", "mm"), ["--cpus", "1"])
    assert "unrecognized arguments: --cpus" in capsys.readouterr().err


def test_nm_flags() -> None:
    config = parse(
        ("cluster", "nm"),
        ["--cluster-name", "lab", "--name", "n7", "--cpus", "2,3", "--pes", "2", "--mm", "tcp://h:1"],
    )
    assert config.cluster.name == "lab"
    assert config.nm == NMConfig(name="n7", cpus=[2, 3], pes=2, mm="tcp://h:1")
    assert config.node_name() == "n7"
    assert config.node_cpus() == [2, 3]


def test_flags_override_the_config_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[cluster]\nname = 'file'\n[nm]\nname = 'fromfile'\nkill_grace = 9\n")
    config = parse(("cluster", "nm"), ["--config", str(path), "--kill-grace", "1"])
    assert (config.cluster.name, config.nm.name, config.nm.kill_grace) == ("file", "fromfile", 1.0)


def test_flag_values_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"^mm\.node_timeout: expected float, got 'soon'"):
        parse(("cluster", "mm"), ["--node-timeout", "soon"])
    with pytest.raises(ConfigError, match=r"mm\.mpl must be at least 1"):
        parse(("cluster", "mm"), ["--mpl", "0"])


def test_default_config_file_is_read_when_present(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = write(tmp_path, '[cluster]\npolicy = "gang"\n[mm]\nmpl = 4\n')
    monkeypatch.setattr(c, "DEFAULT_CONFIG", path)
    assert parse(("cluster", "mm"), []).mm.mpl == 4
    assert parse(("cluster", "mm"), ["--mpl", "2"]).mm.mpl == 2


def test_node_cpus() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    assert StormConfig(nm=NMConfig(cpus=[5, 1])).node_cpus() == [5, 1]
    assert StormConfig().node_cpus() == allowed  # one PE per allowed CPU
    assert StormConfig(nm=NMConfig(pes=1)).node_cpus() == allowed[:1]
    # More PEs than CPUs wrap around.
    wrapped = StormConfig(nm=NMConfig(pes=len(allowed) + 2)).node_cpus()
    assert wrapped == [*allowed, allowed[0], allowed[1 % len(allowed)]]
    assert StormConfig(nm=NMConfig(cpus=[3], pes=8)).node_cpus() == [3]  # explicit cpus win


def test_node_name_defaults_to_the_short_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(c.socket, "gethostname", lambda: "node12.cluster.example")
    assert StormConfig().node_name() == "node12"


def test_infinite_values_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^mm\.kill_timeout: expected float, got 'inf'"):
        load(None, {"mm": {"kill_timeout": "inf"}})


def test_batch_refuses_a_multiprogramming_level() -> None:
    with pytest.raises(ConfigError, match=r"mm\.mpl must be 1"):
        load(None, {"mm": {"mpl": "2"}})
    assert load(None, {"mm": {"mpl": "2"}, "cluster": {"policy": "gang"}}).mm.mpl == 2


def test_the_example_configuration_names_every_setting_with_its_default() -> None:
    """systemd/storm.toml is what operators copy: it must load, and show every setting (some commented)."""
    path = Path(__file__).parent.parent / "systemd" / "storm.toml"
    text = path.read_text()
    loaded = load(path)
    for section, defaults in (("mm", MMConfig()), ("nm", NMConfig()), ("fcs", c.FcsConfig())):
        for name in defaults.__dataclass_fields__:
            assert f"\n{name} = " in text or f"\n# {name} = " in text, f"[{section}] {name} is not shown"
    # Where the example differs from the built-in defaults, it is on purpose (a cluster, not a laptop).
    assert loaded.fcs == c.FcsConfig() and loaded.mm.slice == MMConfig().slice
    assert (loaded.cluster.name, loaded.nm.mm) == ("cluster", "tcp://mm-host:6817")


def test_background_nice_reaches_the_nodes_parameters(tmp_path: Path) -> None:
    assert load(write(tmp_path, "[fcs]\nbackground_nice = 5\n")).fcs_parameters().background_nice == 5
    with pytest.raises(ConfigError, match=r"^fcs: .*background_nice"):
        load(write(tmp_path, "[fcs]\nbackground_nice = 20\n"))


def test_a_bad_f_priority_is_a_config_error_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^fcs: .*f_priority"):
        load(write(tmp_path, '[fcs]\nf_priority = "sometimes"\n'))


def test_backfill_mode_from_the_file_and_the_command_line(tmp_path: Path) -> None:
    assert load(None).mm.backfill == "easy"
    path = write(tmp_path, '[mm]\nbackfill = "conservative"\n')
    assert load(path).mm.backfill == "conservative"
    assert load(path, {"mm": {"backfill": "none"}}).mm.backfill == "none"


def test_moldable_sizing_qos_and_preemption_from_the_file_and_the_command_line(tmp_path: Path) -> None:
    defaults = load(None).mm
    assert (defaults.moldable, defaults.preemption, defaults.preemption_rules()) == ("rtc-ad", "off", None)
    assert defaults.qos_priority("") == defaults.qos_priority("normal") == 0
    assert defaults.qos_priority("high") is None
    path = write(
        tmp_path,
        '[mm]\nmoldable = "subset"\nqos = { high = 10, scavenger = -5 }\n'
        'qos_users = { high = ["alice", "1001"] }\n'
        'preemption = "suspend"\npreempt_min_run = 0.5\npreempt_max_jobs = 3\n',
    )
    mm = load(path).mm
    assert (mm.moldable, mm.qos_priority("high"), mm.qos_priority("scavenger"), mm.qos_priority("")) == (
        "subset", 10, -5, 0,
    )  # fmt: skip
    rules = mm.preemption_rules()
    assert rules is not None and (rules.min_run_s, rules.max_processes) == (0.5, 3)
    flags = load(
        None, {"mm": {"qos": "high=10 low=-1", "qos_users": "high=alice,bob", "preemption": "suspend"}}
    )
    assert flags.mm.qos == {"high": 10, "low": -1} and flags.mm.qos_users == {"high": ["alice", "bob"]}


@pytest.mark.parametrize(
    ("mm", "expected"),
    [
        ({"moldable": "greedy"}, "mm.moldable: 'greedy' is not one of rtc-ad, subset"),
        ({"preemption": "requeue"}, "mm.preemption: 'requeue' is not one of off, suspend"),
        ({"preempt_min_run": -1}, "mm.preempt_min_run must be >= 0 seconds and mm.preempt_max_jobs >= 1"),
        ({"preempt_max_jobs": 0}, "mm.preempt_min_run must be >= 0 seconds and mm.preempt_max_jobs >= 1"),
        ({"qos": {"a b": 1}}, "mm.qos: 'a b' is not a QOS name (letters, digits, - and _)"),
        ({"qos_users": {"gold": ["alice"]}}, "mm.qos_users: no QOS gold in mm.qos"),
        (
            {"preemption": "suspend", "topology": "torus 2x1x1", "coordinates": {"a": [0, 0, 0]}},
            "mm.preemption: not on a torus (mm.topology)",
        ),
    ],
)
def test_bad_moldable_qos_and_preemption_settings_are_named(mm: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(expected)):
        load(None, {"mm": mm})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("9464", "'9464' is not HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464, or *:9464 for every interface;"),
        ("http://127.0.0.1:9464", "'http://127.0.0.1:9464' is not HOST:PORT"),
        ("127.0.0.1:", "is not HOST:PORT"),
        (":9464", "is not HOST:PORT"),
        ("::1:9464", "'::1:9464' is not HOST:PORT"),
        ("127.0.0.1:99999", "'127.0.0.1:99999': port 99999 is not in 0-65535"),
        ("127.0.0.1:-1", "is not HOST:PORT"),
        ("localhost:9464/metrics", "is not HOST:PORT"),
    ],
)
def test_a_bad_metrics_endpoint_is_refused_saying_what_is_expected(value: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(None, {"mm": {"metrics_endpoint": value}})
    assert str(info.value).startswith("mm.metrics_endpoint: ") and expected in str(info.value)


def test_the_metrics_endpoint_is_off_by_default_and_takes_hosts_ports_and_ipv6(tmp_path: Path) -> None:
    assert load(None).mm.metrics_endpoint == ""
    for value, address in (
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("*:0", ("", 0)),
        ("[::1]:9464", ("::1", 9464)),
        ("mm-host.example:9100", ("mm-host.example", 9100)),
    ):
        config = load(write(tmp_path, f'[mm]\nmetrics_endpoint = "{value}"\n'))
        assert c.metrics_address(config.mm.metrics_endpoint) == address
    with pytest.raises(ConfigError, match=r"^mm\.metrics_endpoint: expected str, got 9464$"):
        load(write(tmp_path, "[mm]\nmetrics_endpoint = 9464\n"))
