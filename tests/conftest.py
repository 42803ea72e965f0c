"""Test session set-up: private QUIPU_HOME / PREFECT_HOME / TMPDIR, one Prefect server for the
whole session (started on first use), and the `shared_data` fixture that skips with a reason on a
clone without ../shared.

Under CI=true nothing passes unseen: a missing ../shared/data stops the session before any test,
and any skip but a `gpu` test's (no CUDA device) is reported as a failure.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# ../shared/data beside the clone; QUIPU_SHARED_DATA points elsewhere (a git worktree one level deeper)
SHARED_DATA = Path(os.environ.get("QUIPU_SHARED_DATA") or ROOT.parent / "shared" / "data")
_SESSION_TMP = Path(tempfile.mkdtemp(prefix="quipu-tests-"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Before anything imports prefect: every test session gets its own homes and one API address.
_PORT = _free_port()
os.environ["QUIPU_HOME"] = str(_SESSION_TMP / "quipu-home")
# one cache for the run, whatever QUIPU_HOME a test sets: the blocklist's hashes, SmolLM2's tokenizer
# and de-quantized weights are built once (seconds to tens of CPU-seconds each). xdist workers inherit
# the controller's environment, so both use its folder (every entry is renamed into place whole: two
# workers building one entry both succeed), and the controller's session end removes it.
os.environ.setdefault("QUIPU_TESTS_CACHE", str(_SESSION_TMP / "quipu-cache"))
os.environ["QUIPU_CACHE"] = os.environ["QUIPU_TESTS_CACHE"]
os.environ["PREFECT_HOME"] = str(_SESSION_TMP / "prefect-home")
os.environ["PREFECT_API_URL"] = f"http://127.0.0.1:{_PORT}/api"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "120"
os.environ["PREFECT_LOGGING_LEVEL"] = "WARNING"
os.environ["PREFECT_UI_ENABLED"] = "false"
os.environ["TMPDIR"] = str(_SESSION_TMP / "tmp")
os.environ.pop("QUIPU_CATALOG_URL", None)
(_SESSION_TMP / "tmp").mkdir(parents=True, exist_ok=True)
tempfile.tempdir = os.environ["TMPDIR"]

_server: subprocess.Popen | None = None


def start_prefect_server() -> str:
    """Start (once) a Prefect server on 127.0.0.1 for this session; returns its API URL."""
    global _server
    url = os.environ["PREFECT_API_URL"]
    if _server is None:
        log = open(_SESSION_TMP / "prefect-server.log", "wb")
        _server = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(_PORT)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PREFECT_API_URL": ""})
        deadline = time.time() + 180
        while time.time() < deadline:
            if _server.poll() is not None:
                raise RuntimeError("prefect server exited: " + (_SESSION_TMP / "prefect-server.log").read_text()[-2000:])
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.5)
        else:
            raise RuntimeError("prefect server did not become healthy in 180 s")
    return url


@pytest.fixture(scope="session")
def prefect_server() -> str:
    return start_prefect_server()


def pytest_sessionfinish(session, exitstatus):
    if _server is not None:
        _server.terminate()
        try:
            _server.wait(20)
        except subprocess.TimeoutExpired:
            _server.kill()
    if "tests.ranks" in sys.modules:       # its fork server's socket lives under _SESSION_TMP
        sys.modules["tests.ranks"].stop_fork_server()
    shutil.rmtree(_SESSION_TMP, ignore_errors=True)


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_sessionstart(session):
    if under_ci() and not SHARED_DATA.is_dir():
        pytest.exit(f"CI=true: ../shared/data (the real test data, {SHARED_DATA}) is missing; about a fifth of "
                    "the suite needs it. Put it beside the clone or set QUIPU_SHARED_DATA.", returncode=3)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true a skip is a failure, except a `gpu` test's: CI machines have no CUDA device."""
    report = (yield).get_result()
    if report.skipped and under_ci() and not hasattr(report, "wasxfail") and item.get_closest_marker("gpu") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true: a skip fails the run (only gpu tests may skip): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A whole module skipped (a module-level skip or importorskip) fails under CI=true too."""
    report = (yield).get_result()
    if report.skipped and under_ci():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true: a skipped module fails the run: {reason}"


# Seconds per test file (setup + call + teardown of its tests on a 2-worker run; see tests/README.md),
# the order in which `make test` hands files to its workers: longest first, so that the short files
# fill the end and both workers finish together. `--durations=N` prints a run's own table to paste
# into tests/file_seconds.json.
FILE_SECONDS = json.loads((ROOT / "tests" / "file_seconds.json").read_text())


def expected_seconds(path: str, n_slow: int) -> float:
    """A file's measured seconds; a file not yet measured: a guess from its `slow` tests."""
    return FILE_SECONDS.get(path, 20 + 60 * n_slow)


# Fuzz tests draw from FUZZ_SEED: new each run (they print it), QUIPU_FUZZ_SEED=N replays one run's draw.
# The suite's fixed samples use their own constant seeds.
FUZZ_SEED = int(os.environ.get("QUIPU_FUZZ_SEED") or time.time_ns() % 2**32)


def pytest_collection_modifyitems(config, items):
    """`fuzz` tests (thousands of examples from a new seed) run under `make fuzz` (QUIPU_FUZZ=1)
    only; the suite runs their fixed, smaller sample. The longest files (FILE_SECONDS) run first:
    `make test` hands whole files to its workers in this order (pytest-xdist, --dist loadfile with
    --no-loadscope-reorder, which would otherwise order files by their number of tests), and the
    long ones started first leave the short ones to fill the end rather than one long file running
    alone at the end."""
    if os.environ.get("QUIPU_FUZZ") != "1":
        fuzz = [item for item in items if item.get_closest_marker("fuzz") is not None]
        if fuzz:
            config.hook.pytest_deselected(items=fuzz)
            items[:] = [item for item in items if item.get_closest_marker("fuzz") is None]
    slow: dict[str, int] = {}
    for item in items:
        slow[item.nodeid.split("::")[0]] = slow.get(item.nodeid.split("::")[0], 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -expected_seconds(item.nodeid.split("::")[0], slow[item.nodeid.split("::")[0]]))   # stable


_file_seconds: dict[str, float] = {}
_worker_seconds: dict[str, list[float]] = {}   # worker -> [seconds of tests, seconds since the start at its last report]
_started = time.time()


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration
    worker = getattr(getattr(report, "node", None), "gateway", None)
    busy = _worker_seconds.setdefault(worker.id if worker else "main", [0.0, 0.0])
    busy[0] += report.duration
    busy[1] = time.time() - _started


def pytest_terminal_summary(terminalreporter, config):
    """With --durations: the seconds per test file (the table FILE_SECONDS reads) and each worker's
    seconds of tests and its last report, to see whether the workers ended together."""
    if config.option.durations is None or not _file_seconds:
        return
    terminalreporter.write_sep("=", "seconds per test file (tests/file_seconds.json)")
    table = {k: round(v) for k, v in sorted(_file_seconds.items(), key=lambda kv: -kv[1])}
    terminalreporter.write_line(json.dumps(table, indent=0))
    for worker, (busy, last) in sorted(_worker_seconds.items()):
        terminalreporter.write_line(f"{worker}: {busy:.0f} s of tests, last report at {last:.0f} s")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs ../shared/data (real public test data beside the repository); not found at {SHARED_DATA}")
    return SHARED_DATA


def missing_install(reason: str) -> None:
    """A tool the test needs is not on this machine: a skip with the reason for a user, but a failure
    under CI=true, where .ci/run installs every such tool (a broken install step must not turn
    tests into green skips)."""
    if under_ci():
        pytest.fail(f"CI=true and .ci/run should have installed it: {reason}", pytrace=False)
    pytest.skip(reason)


def require_binary(*names: str, install: str) -> str:
    """The path of the first of `names` on PATH, else `missing_install` (skip, or fail under CI)."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    missing_install(f"needs {' or '.join(names)} ({install}; .ci/run installs it)")


def run_quipu(*args: str, timeout: float = 600, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the `quipu` CLI in a subprocess against the session's Prefect server."""
    start_prefect_server()
    return subprocess.run([sys.executable, "-m", "quipu.flows.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd or ROOT)


# what the CLI sets in its process's environment for the flows it runs (progress.py): a CLI call in the
# test process must not hand its --quiet/--verbose or logging config to the tests after it
_CLI_ENV = ("QUIPU_VERBOSITY", "PREFECT_LOGGING_SETTINGS_PATH")


def quipu_main(*args: str) -> int:
    """The `quipu` CLI in this process (where the command line itself is not what a test checks: no
    interpreter start and Prefect import per call), from the repository root, against the session's
    Prefect server; its output goes to pytest's capture (`capsys`). The environment variables the CLI
    sets for its flows are restored afterwards."""
    from quipu.flows.cli import main
    start_prefect_server()
    cwd = os.getcwd()
    saved = {k: os.environ.get(k) for k in _CLI_ENV}
    os.chdir(ROOT)
    try:
        return main(list(args))
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
