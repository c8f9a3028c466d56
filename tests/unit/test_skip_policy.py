"""tests/conftest.py + tests/skip_policy.py: under CI a skip that is not allow-listed fails the run; outside CI
it stays a skip. Each case runs pytest in a subprocess on a generated test file with the hooks loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import skip_policy

REPO = Path(__file__).resolve().parents[2]
MISSING = "no_such_module_for_the_skip_policy_test"


def _pytest(tmp_path: Path, body: str, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(body)
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", skip_policy.STRICT_ENV, "PYTEST_ADDOPTS")}
    clean["PYTHONPATH"] = os.pathsep.join([str(REPO), clean.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest", "-q", "-rs"]
    return subprocess.run(
        [*cmd, "test_sample.py"],
        cwd=tmp_path,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


SKIPS = f"""
import pytest

def test_passes():
    pass

def test_needs_a_module():
    pytest.importorskip("{MISSING}")
"""


@pytest.mark.parametrize("switch", [{"CI": "true"}, {skip_policy.STRICT_ENV: "1"}], ids=["CI", "build.sh"])
def test_under_ci_a_skip_off_the_list_fails_the_run(tmp_path, switch):
    proc = _pytest(tmp_path, SKIPS, **switch)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"REFUSED: test_sample.py::test_needs_a_module: could not import '{MISSING}'" in proc.stdout
    assert "1 skip(s) not on the allow-list in tests/skip_policy.py" in proc.stdout


def test_outside_ci_a_skip_is_a_skip(tmp_path):
    proc = _pytest(tmp_path, SKIPS, CI="false")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"skipped: test_sample.py::test_needs_a_module: could not import '{MISSING}'" in proc.stdout


def test_a_skipped_module_counts_and_an_xfail_does_not(tmp_path):
    module_skip = f'import pytest\npytest.importorskip("{MISSING}")\n\ndef test_x():\n    pass\n'
    proc = _pytest(tmp_path, module_skip, CI="true")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"REFUSED: test_sample.py: could not import '{MISSING}'" in proc.stdout
    xfail = "import pytest\n\n@pytest.mark.xfail(strict=True)\ndef test_x():\n    assert False\n"
    proc = _pytest(tmp_path, xfail, CI="true")
    assert proc.returncode == 0 and "REFUSED" not in proc.stdout, proc.stdout + proc.stderr


def test_the_allow_list_matches_by_place_and_reason():
    v3 = "SageMaker Python SDK v3 (sagemaker>=3) is not installed"
    assert skip_policy.allowed("tests/docker/test_sdk_v3_local.py", v3) is not None
    assert skip_policy.allowed("tests/docker/test_sdk_v3_local.py::test_x[1-instance]", v3) is not None
    # the same place for another reason, or the same reason elsewhere, is not allowed
    assert skip_policy.allowed("tests/docker/test_sdk_v3_local.py", "no Docker engine is reachable") is None
    assert skip_policy.allowed("tests/docker/test_sdk_local.py", v3) is None
    assert skip_policy.allowed("tests/docker/test_sdk_v3_local.py.bak", v3) is None
    for entry in skip_policy.ALLOWED_SKIPS:
        assert entry.why.strip(), entry
