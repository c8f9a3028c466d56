"""No silent skips in CI (tests/skip_policy.py): every skip is recorded; under CI one that is not on the
allow-list fails the run (exit 1) and the summary names it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import skip_policy

_SKIPS = pytest.StashKey[list[tuple[str, str]]]()
_CONFIG: list[pytest.Config] = []  # the session's config: reports do not carry it


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_SKIPS] = []
    _CONFIG.append(config)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`-m "not docker"` (the unit/integration run in the test image, which has no Docker SDK) does not walk
    tests/docker: every test there is marked docker, and its conftest would skip the folder for want of the
    SDK. Everywhere else a missing SDK is a skip that CI refuses."""
    if collection_path == Path(__file__).parent / "docker" and config.getoption("markexpr") == "not docker":
        return True
    return None


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    message = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return message.removeprefix("Skipped: ")


def _record(report: pytest.CollectReport | pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):  # an xfail reports as skipped too
        _CONFIG[-1].stash[_SKIPS].append((report.nodeid, _reason(report)))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _record(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _record(report)


def _refused(config: pytest.Config) -> list[tuple[str, str]]:
    return [(n, r) for n, r in config.stash[_SKIPS] if skip_policy.allowed(n, r) is None]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    quiet = exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    if skip_policy.strict() and _refused(session.config) and quiet:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    skips = config.stash[_SKIPS]
    if not skips:
        return
    write = terminalreporter.write_line
    strict = skip_policy.strict()
    terminalreporter.section("skips (tests/skip_policy.py)", sep="-")
    for nodeid, reason in skips:
        entry = skip_policy.allowed(nodeid, reason)
        if entry is not None:
            write(f"allowed: {nodeid}: {reason} [{entry.why}]")
        else:
            write(f"{'REFUSED' if strict else 'skipped'}: {nodeid}: {reason}")
    refused = _refused(config)
    if strict and refused:
        write(
            f"{len(refused)} skip(s) not on the allow-list in tests/skip_policy.py: under CI (CI=true or "
            f"{skip_policy.STRICT_ENV}=1) they fail the run; install what they need or allow-list them with a reason",
            red=True,
            bold=True,
        )
