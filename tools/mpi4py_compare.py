"""mpi4py's test suite under storm against the same suite under mpiexec (tools/mpi4py_suite.py runs
both): the tests that did worse under storm, and the modules that hung or crashed only there."""

from __future__ import annotations

from dataclasses import dataclass

from storm.tools.mpi4py_suite import GOOD, ModuleRun, SuiteRun


@dataclass(frozen=True)
class Regression:
    """A test that passed (or was skipped) under mpiexec and did worse under storm."""

    module: str
    test: str
    baseline: str
    outcome: str
    text: str = ""


def regressions(baseline: SuiteRun, run: SuiteRun) -> list[Regression]:
    """Every test of ``run``'s modules that ``baseline`` passed or skipped and ``run`` did not; a module
    whose run never reported a test (it hung or crashed before) makes all of them "missing"."""
    found = []
    for module, ours in run.modules.items():
        theirs = baseline.modules.get(module)
        if theirs is None:
            continue
        for test, before in theirs.tests.items():
            outcome = ours.tests.get(test, "missing")
            if before in GOOD and outcome not in GOOD:
                found.append(Regression(module, test, before, outcome, ours.texts.get(test, "")))
    return found


def new_hangs(baseline: SuiteRun, run: SuiteRun) -> list[ModuleRun]:
    """Modules that hung or crashed under storm but not under mpiexec."""
    return [
        m
        for name, m in run.modules.items()
        if m.status != "ok" and name in baseline.modules and baseline.modules[name].status == "ok"
    ]


def report(baseline: SuiteRun, run: SuiteRun, texts: bool = False) -> str:
    """What went wrong under ``run``, grouped by module: a hung or crashed module's place first, then each
    regressed test; the tests it never reached are counted, not listed."""
    lines = []
    found = regressions(baseline, run)
    for module, ours in run.modules.items():
        if ours.status != "ok":
            first = ours.note.splitlines()[0] if ours.note else ""
            lines.append(
                f"{run.launcher} n={run.ranks}: {module} {ours.status.upper()} ({first}) in {ours.where()}"
            )
        listed = [r for r in found if r.module == module and r.outcome != "missing"]
        missing = [r for r in found if r.module == module and r.outcome == "missing"]
        for r in listed:
            lines.append(f"{run.launcher} n={run.ranks}: {r.test} {r.outcome} (mpiexec: {r.baseline})")
            if texts and r.text:
                lines.extend("    " + line for line in r.text.strip().splitlines()[-6:])
        if missing:
            lines.append(f"{run.launcher} n={run.ranks}: {module}: {len(missing)} more tests never ran")
    return "\n".join(lines)
