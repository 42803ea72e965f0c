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
        raise KeyError("bug\x1b[2J")
    monkeypatch.setattr(curate_cli, "cmd_report", bug)
    # issue 32: a bug is one line too (exit 1), its traceback in the log file; --verbose shows it
    assert cli.main(["report", "/nowhere"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("quipu: KeyError: ") and "quipu.log" in err and "\x1b" not in err
    with pytest.raises(KeyError):
        cli.main(["--verbose", "report", "/nowhere"])


# ---- PII precision (issue 32): ordinary numbers are not PII --------------------------------------

# Sentences from real text (../shared/data/text) and the reports, each with an ordinary number
# of a shape the pii stage used to replace: a list header or clock time read as IPv6, a range of
# grouped thousands read as a phone, a figure followed by a one-letter word read as a DNI.
ORDINARY_IN_REAL_TEXT = [
    "Pedro Lobo\nDecember 31:: the final day for filing was extended by the court.",          # issue 32: `31::` -> <IP>
    "The session started at 10:30:00 and ended at 12:45:10:: minutes later.",
    "Juan 3:16:: porque de tal manera amó Dios al mundo.",
    "Los precios oscilan entre 3.000-5.000 euros por metro cuadrado.",                          # issue 32: -> <PHONE>
    "nos autos elencados na peça acusatória de fls. (2.003-2.060) e ratificada",              # pt_fakebr_news
    "behandeling op 500 - 1000 dollar (22.000 - 44.000 frank) per persoon",                   # nl_nltk_conll2002_news
    "La ciudad tiene 1.234.567 habitantes y un presupuesto de 12.500-15.000 millones.",
    "Foram 10.200.000 e mais de 86.700.000-89.090.000 y más votos.",                          # DNI-shaped + 'y'/'e'
    "rock band ac::dc and the cafe:: were closed",
]


@pytest.mark.parametrize("text", ORDINARY_IN_REAL_TEXT)
def test_pii_leaves_times_verses_ranges_and_figures_alone(text):
    from quipu.tasks.pii import PiiConfig, PiiRedaction
    stage = PiiRedaction(PiiConfig())
    for lang in ("en", "es", "pt"):
        assert stage.find(text, lang, None, {}) == [], (lang, text)


def test_pii_still_finds_real_addresses_phones_and_ids():
    from quipu.tasks.pii import PiiConfig, PiiRedaction, ip_spans
    for addr in ("2001:db8::1", "fe80::1", "2001:db8:85a3:0:0:8a2e:370:7334", "2a03:2880:f003:c07:face:b00c::2", "2001:db8::"):
        assert ip_spans(f"server at {addr} today", public_only=False), addr
    stage = PiiRedaction(PiiConfig())
    text = ("Contacto: 2a00:1450:4001:80b::200e, teléfono 91 346 73 03, DNI 12345678Z, "
            "e 12.345.678-Z; call (212) 555-0134 or 415-533-5427.")
    kinds = sorted(k for _, _, k in stage.find(text, "es", None, {}))
    assert kinds == ["id", "id", "ip", "phone", "phone", "phone"], kinds


def test_pii_precision_and_recall_on_real_text(shared_data):
    """bench/pii_precision.py's measurement, smaller: real en/es/pt documents with random ordinary
    numbers (none may be replaced) and planted PII (recall >= 0.98)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import cleaning_stages
    import pii_precision
    cleaning_stages.SHARED = shared_data
    rows = cleaning_stages.shared_text_rows()
    from quipu.tasks import pii
    r = pii_precision.measure(pii, rows, docs_per_lang=300, seed=5)
    assert r["recall"] >= 0.98, r
    assert r["ordinary_numbers_touched"] == {}, r["ordinary_numbers_touched"]
    # what is altered at all is real contact data already in those documents
    assert r["clean_altered"] == r["altered_without_the_planted_numbers"], r
    assert r["clean_altered_rate"] <= 0.01, r


# ---- issue 32: models are checked against what quipu recorded when it wrote them -----------------

def test_a_model_changed_after_quipu_wrote_it_is_refused_naming_the_file(tmp_path):
    from quipu.catalog import registry
    from quipu.catalog.registry import ModelFileChanged
    from quipu.scoring.resolver import resolve_model
    model = tmp_path / "kenlm" / "model.arpa"
    model.parent.mkdir()
    model.write_bytes(b"\\data\\\nngram 1=3\n" * 100)
    student = tmp_path / "student"
    student.mkdir()
    (student / "model.safetensors").write_bytes(b"x" * 4096)
    (student / "config.json").write_text('{"layers": 2}')
    registry.register_model("lm-32", "kenlm", str(model))
    registry.register_model("student-32", "wayra", str(student))
    assert resolve_model("kenlm", "lm-32", "perplexity.kenlm") == str(model)        # as written: fine
    assert resolve_model("wayra", str(student), "perplexity.student") == str(student)
    data = model.read_bytes()
    model.write_bytes(data[:-1] + b"!")                                                # one byte changed
    with pytest.raises(ModelFileChanged, match=rf"model file {model} is not the file quipu wrote"):
        resolve_model("kenlm", "lm-32", "perplexity.kenlm")
    (student / "model.safetensors").write_bytes(b"x" * 100)                             # cut short
    with pytest.raises(ModelFileChanged, match=r"model.safetensors has 100 bytes, 4,096 when quipu wrote it"):
        resolve_model("wayra", str(student), "perplexity.student")
    other = tmp_path / "elsewhere.arpa"                                                  # not quipu's: not checked here
    other.write_bytes(b"anything")
    assert resolve_model("kenlm", str(other), "perplexity.kenlm") == str(other)
