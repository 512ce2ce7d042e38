"""mpi4py's own test suite as a test of storm (issue 12): what passes under mpiexec must pass as a storm job.

A subset of the suite's modules (all of it takes minutes per run; ``storm bench mpi4py`` runs everything)
chosen for what a resource manager and mpihook can break: collectives on intra- and intercommunicators,
blocking and nonblocking, which mpihook times; point to point with probes and matched receives; topologies
(neighbourhood collectives); one-sided communication; threads; dynamic processes (spawn, ports and published
names go through storm's PMI server); ULFM's agreement against barriers. Each runs under batch, gang and fcs
(MPL 2, two jobs at a time so that gang and FCS really time-share them) at 2 ranks (2 node managers x 1 PE)
and 4 ranks (2 x 2: ranks share node managers and span them), against the same modules under ``mpiexec``
(measured once per session). Every test that passed or was skipped under mpiexec and failed, errored or
never ran under storm fails the test, and so does every module that hung (past its time limit) or crashed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from storm.tools import mpi4py_compare as compare
from storm.tools import mpi4py_suite as suite
from storm.tools.mpi4py_suite import Suite, SuiteRun, SuiteUnavailable

pytestmark = pytest.mark.slow

# By their time under mpiexec on 2 cores (2 ranks / 4 ranks, seconds): all of them about ... s.
MODULES = {
    2: [
        "test_cco_buf_inter", "test_cco_obj_inter", "test_cco_nb_buf", "test_cco_obj", "test_cco_ngh_obj",
        "test_comm_topo", "test_comm_inter", "test_p2p_obj", "test_p2p_obj_matched", "test_threads",
        "test_spawn", "test_dynproc", "test_ulfm", "test_rma",
    ],
    4: [
        "test_cco_buf_inter", "test_cco_obj_inter", "test_cco_obj", "test_comm_topo", "test_p2p_obj",
        "test_dynproc", "test_ulfm",
    ],
}  # fmt: skip
MPL = 2
MPIEXEC_LIMIT = 120.0  # a module the baseline does not finish in this long is a problem of the machine
FACTOR = 3.0  # a module's time limit under storm: this many times its mpiexec time, ...
MIN_LIMIT = 15.0  # ... and at least this long


@pytest.fixture(scope="session")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    try:
        source = suite.suite_source()
    except SuiteUnavailable as exc:
        pytest.skip(str(exc))
    return Suite(source, tmp_path_factory.mktemp("mpi4py"))


@pytest.fixture(scope="session")
def baseline(runner: Suite) -> Callable[[int], SuiteRun]:
    """The modules under mpiexec, run at the first test that needs them and kept for the session."""
    runs: dict[int, SuiteRun] = {}

    def get(ranks: int) -> SuiteRun:
        if ranks not in runs:
            runs[ranks] = runner.mpiexec(MODULES[ranks], ranks, MPIEXEC_LIMIT)
        return runs[ranks]

    return get


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("policy", ["batch", "gang", "fcs"])
def test_mpi4py_suite(
    policy: str, ranks: int, runner: Suite, baseline: Callable[[int], SuiteRun], tmp_path: Path
) -> None:
    base = baseline(ranks)
    broken = {m: r.note for m, r in base.modules.items() if r.status != "ok"}
    assert not broken, f"the mpiexec baseline itself hung or crashed: {broken}"
    limits = suite.storm_limits(base, FACTOR, MIN_LIMIT, MPIEXEC_LIMIT)
    in_flight = 1 if policy == "batch" else MPL
    with suite.storm_cluster(tmp_path / "cluster", policy, ranks, mpl=MPL) as cluster, cluster.client() as c:
        run = runner.storm(c, policy, MODULES[ranks], ranks, limits, in_flight=in_flight)
    regressions = compare.regressions(base, run)
    hangs = compare.new_hangs(base, run)
    assert not regressions and not hangs, (
        f"{len(regressions)} regressions, {len(hangs)} modules hung or crashed under storm {policy} with "
        f"{ranks} ranks:\n" + compare.report(base, run, texts=True)
    )
