"""Issue 13, safe loading and names: a crafted checkpoint never runs code, names never escape their
folder, Redis commits take an atomic lock."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from quipu.catalog.names import InvalidName, check_name, name_from
from tests.conftest import ROOT


class _Payload:
    """What an attacker puts in a shared run folder: unpickling it creates a marker file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _malicious_checkpoint(run_dir: Path, marker: Path) -> Path:
    path = run_dir / "checkpoints" / "step-0000100.pt"
    path.parent.mkdir(parents=True)
    torch.save({"model": {}, "model_config": {}, "evil": _Payload(str(marker))}, path)
    return path


def test_crafted_checkpoint_is_refused_and_never_runs(tmp_path):
    from quipu.trainer.checkpoint import UnsafeCheckpoint, load_checkpoint
    marker = tmp_path / "pwned"
    path = _malicious_checkpoint(tmp_path / "run", marker)
    with pytest.raises(UnsafeCheckpoint, match="refusing to load .*step-0000100.pt"):
        load_checkpoint(path)
    assert not marker.exists()


def test_quipu_export_refuses_a_crafted_checkpoint_in_one_line(tmp_path):
    marker = tmp_path / "pwned"
    _malicious_checkpoint(tmp_path / "run", marker)
    p = subprocess.run([sys.executable, "-m", "quipu.flows.cli", "export", str(tmp_path / "run"), "--hf", str(tmp_path / "hf")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "PREFECT_API_URL": ""})
    assert p.returncode == 2, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and p.stderr.strip().startswith("quipu: refusing to load")
    assert len(p.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_own_checkpoints_round_trip_with_rng_state(tmp_path):
    """Our own checkpoints load under weights_only=True and restore every RNG exactly."""
    import random

    import numpy as np

    from quipu.trainer.checkpoint import load_checkpoint, save_checkpoint, set_rng_state
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    random.gauss(0, 1), np.random.standard_normal()          # cached gaussians are state too
    path = save_checkpoint(tmp_path, 7, {"model": {"w": torch.ones(2)}, "trainer": {"lr_scale": 1.0}}, keep_last=2)
    expected = (random.random(), np.random.random(), torch.rand(1).item(), random.gauss(0, 1), np.random.standard_normal())
    ck = load_checkpoint(path)
    set_rng_state(ck["rng"])
    assert (random.random(), np.random.random(), torch.rand(1).item(), random.gauss(0, 1), np.random.standard_normal()) == expected
    assert ck["step"] == 7 and torch.equal(ck["model"]["w"], torch.ones(2))


@pytest.mark.parametrize("name", ["..", ".", "a/b", "/etc", "", "-rf", ".hidden", "a" * 200, "a..b", "x\x00y"])
def test_unsafe_names_are_refused(name):
    with pytest.raises(InvalidName, match="not a safe name"):
        check_name(name, "dataset name")


def test_safe_names_and_names_made_from_folders():
    for ok in ("cc-main", "cc_2026.10", "A1"):
        assert check_name(ok) == ok
    for text in ("..", "my run", ".hidden", "a/b", ""):
        check_name(name_from(text))


@pytest.mark.parametrize("key,value", [("dataset", ".."), ("dataset", "a/b"), ("dedup.index", ".."),
                                       ("dedup.index", "/abs"), ("dataset", "")])
def test_config_names_are_refused_naming_the_key(key, value):
    from quipu.flows.config import ConfigError, load_config
    from quipu.flows.curate import CurateConfig
    with pytest.raises(ConfigError) as e:
        load_config(CurateConfig, str(ROOT / "configs/curate/demo.yaml"), [f"{key}={value!r}" if value else f"{key}=''"])
    assert key in str(e.value) and "safe name" in str(e.value)


def test_dedup_index_never_lands_in_quipu_home_itself(tmp_path, monkeypatch):
    from quipu.tasks.dedup import DedupConfig, index_location
    from quipu.tasks.stage import RunContext
    monkeypatch.setenv("QUIPU_HOME", str(tmp_path / "home"))
    cfg = DedupConfig()
    with pytest.raises(InvalidName):     # what `--set dataset=..` did before the check
        index_location(cfg, RunContext(str(tmp_path / "run"), dataset=".."))
    for run in (tmp_path / "..", tmp_path / ".hidden", tmp_path / "my run"):
        loc = index_location(cfg, RunContext(str(run.resolve())))
        assert loc.parent == tmp_path / "home" / "dedup" and not loc.name.startswith(".")


def test_redis_commit_lock_is_redis_py_lock_and_refuses_when_held(tmp_path):
    from tests.conftest import require_binary
    require_binary("redis-server", install="apt-get install redis-server")
    import redis

    from quipu.tasks.dedup_index import ConcurrentCommit, commit_lock
    from tests.ops_helpers import Redis
    server = Redis(tmp_path)
    try:
        r = redis.Redis(host="127.0.0.1", port=server.port)
        with commit_lock(r, "t:commit-lock", ttl=30, wait_s=5) as lock:
            assert isinstance(lock, redis.lock.Lock) and lock.owned()
            with pytest.raises(ConcurrentCommit, match="held by another run"):
                with commit_lock(r, "t:commit-lock", ttl=30, wait_s=0.5):
                    pass
        # the heartbeat renews the lock (every ttl/3): watched on the server, past the lock's lifetime.
        # A 3 s lifetime tolerates a 2 s stall of this process (1 s flaked under load); what is
        # checked is the renewals themselves, not only that the key is still there after a sleep.
        import time
        with commit_lock(r, "t:beat", ttl=3, wait_s=5) as lock:
            start, last, renewals = time.monotonic(), r.pttl("t:beat"), 0
            while time.monotonic() - start < 3.5 or renewals < 2:
                assert time.monotonic() - start < 30, f"{renewals} renewals in 30 s"
                time.sleep(0.05)
                ttl_ms = r.pttl("t:beat")
                assert ttl_ms > 0, "the lock expired while its holder ran"
                renewals += ttl_ms > last + 100
                last = ttl_ms
            assert lock.owned()
        assert r.get("t:beat") is None
        with commit_lock(r, "t:commit-lock", ttl=30, wait_s=5) as lock:
            r.set("t:commit-lock", "someone-else")     # our lock expired and another run took it
            assert not lock.owned()
        assert r.get("t:commit-lock") == b"someone-else"   # release never deletes another run's lock
    finally:
        server.stop()


def test_domain_errors_map_to_one_line_exit_codes(capsys, monkeypatch):
    """Errors the detecting code already worded reach the user as one `quipu: ...` line."""
    import quipu.flows.cli as cli
    from quipu.flows import curate_cli
    from quipu.catalog.ownership import OutputInUse
    from quipu.tasks.dedup_index import ConcurrentCommit
    for exc, code in ((ConcurrentCommit("the dedup index /x changed while this run was planning: rerun"), 1),
                      (OutputInUse("/out is in use by another run (pid 1 on h since t)"), 2)):
        def boom(args, exc=exc):
            raise exc
        monkeypatch.setattr(curate_cli, "cmd_report", boom)
        assert cli.main(["report", "/nowhere"]) == code
        err = capsys.readouterr().err
        assert err.strip() == f"quipu: {exc}" and "Traceback" not in err

    def bug(args):
        raise KeyError("bug")
    monkeypatch.setattr(curate_cli, "cmd_report", bug)
    with pytest.raises(KeyError):     # a bug is not a user error: it keeps its traceback
        cli.main(["report", "/nowhere"])
