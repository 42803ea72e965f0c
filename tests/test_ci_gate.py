"""Under CI=true nothing passes unseen: a skip fails the run (a `gpu` test's excepted), and a
missing ../shared/data stops the session before any test (tests/conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT

PROBE = '''
import pytest

def test_a_tool_is_missing():
    pytest.skip("no such tool")

@pytest.mark.gpu
def test_needs_cuda():
    pytest.skip("no CUDA device")

def test_passes():
    pass
'''


def _pytest(path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                           "-p", "tests.conftest", "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_under_ci_a_skip_fails_but_a_gpu_skip_and_skips_outside_ci_do_not(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    ci = _pytest(probe, CI="true")
    assert ci.returncode == 1, ci.stdout[-2000:]
    assert "1 failed, 1 passed, 1 skipped" in ci.stdout, ci.stdout[-2000:]
    assert "FAILED" in ci.stdout and "test_a_tool_is_missing - CI=true: a skip fails the run" in ci.stdout
    local = _pytest(probe, CI="")
    assert local.returncode == 0 and "1 passed, 2 skipped" in local.stdout, local.stdout[-2000:]


def test_under_ci_missing_shared_data_stops_the_session_loudly(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("def test_passes():\n    pass\n")
    r = _pytest(probe, CI="true", QUIPU_SHARED_DATA=str(tmp_path / "no-shared"))
    assert r.returncode != 0 and "CI=true: ../shared/data" in r.stdout + r.stderr and "is missing" in r.stdout + r.stderr
    assert _pytest(probe, CI="", QUIPU_SHARED_DATA=str(tmp_path / "no-shared")).returncode == 0
