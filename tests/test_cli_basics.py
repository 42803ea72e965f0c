"""Small CLI and file-mode behaviour other tools and teammates depend on."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from quipu.catalog.files import UMASK, default_mode, write_json_atomic
from tests.conftest import _CLI_ENV, ROOT, quipu_main


def cli(capsys, *args: str) -> subprocess.CompletedProcess:
    """`quipu ARGS` in this process, its exit code and output as a subprocess' would be."""
    capsys.readouterr()
    code = quipu_main(*args)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["quipu", *args], code, out, err)


def test_version_flag(capsys, monkeypatch):
    from quipu.flows.cli import main
    for name in _CLI_ENV:               # main sets them for its flows; monkeypatch restores them
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as e:     # argparse's version action: print, then exit 0 (no Prefect server)
        main(["--version"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and out.startswith("quipu ") and out.split()[1][0].isdigit()


def test_atomic_writes_get_the_umask_mode_not_a_private_one(tmp_path):
    write_json_atomic(tmp_path / "a.json", {"x": 1})
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == default_mode() == 0o666 & ~UMASK
    # a run under umask 002 (a shared group folder) gives group-writable files, in a fresh process
    code = ("import os, stat, sys; from quipu.catalog.files import write_json_atomic; "
            "write_json_atomic(sys.argv[1], {}); print(oct(stat.S_IMODE(os.stat(sys.argv[1]).st_mode)))")
    p = subprocess.run(["sh", "-c", f'umask 002 && exec "{sys.executable}" -c "{code}" {tmp_path / "b.json"}'],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert p.stdout.strip() == "0o664", p.stderr


# ---- discoverable configs ------------------------------------------------------------------------

def test_config_show_lists_every_key_from_the_model(capsys):
    from quipu.flows.config import config_keys
    from quipu.flows.curate import CurateConfig
    p = cli(capsys, "config", "show", "curate")     # in process: the listing is the subject, not the interpreter
    assert p.returncode == 0, p.stderr
    rows = {r["key"]: r for r in config_keys(CurateConfig)}
    assert rows["dedup.threshold"]["default"] == 0.8 and rows["dedup.threshold"]["type"] == "float"
    assert "heuristics.gopher_quality.enabled" in rows and "runner.kind" in rows
    listed = [line.split()[0] for line in p.stdout.splitlines() if line and not line.startswith(" ")]
    assert listed == list(rows)            # every key, in model order, nothing hand-maintained
    assert "Jaccard similarity of a near duplicate" in p.stdout


def test_config_defaults_are_a_valid_config(tmp_path, capsys):
    import yaml
    from quipu.flows.config import load_config
    from quipu.trainer.train import TrainConfig
    p = cli(capsys, "config", "show", "curate", "--defaults")
    assert p.returncode == 0, p.stderr
    from quipu.flows.curate import CurateConfig
    # every key written out at its default (an empty file would also load as the defaults)
    assert yaml.safe_load(p.stdout) == CurateConfig().model_dump(mode="json")
    (tmp_path / "c.yaml").write_text(p.stdout)
    assert load_config(CurateConfig, tmp_path / "c.yaml").model_dump() == CurateConfig().model_dump()
    assert "data.phases[].sources[].dataset" in cli(capsys, "config", "show", "train", "--brief").stdout
    assert TrainConfig.model_fields["data"].is_required()


def test_unknown_keys_suggest_the_closest_valid_one():
    from quipu.flows.config import ConfigError, load_config
    from quipu.flows.curate import CurateConfig
    from quipu.trainer.train import TrainConfig
    try:
        load_config(CurateConfig, data={"dedup": {"treshold": 0.7}, "dedupe": {}})
    except ConfigError as e:
        assert "dedup.treshold: unknown key; did you mean 'dedup.threshold'?" in str(e)
        assert "dedupe: unknown key; did you mean 'dedup'?" in str(e)
    else:
        raise AssertionError("unknown keys accepted")
    try:
        load_config(TrainConfig, data={"data": {"phases": [{"name": "a", "sources": [{"datset": "x"}]}]}})
    except ConfigError as e:
        assert "did you mean 'data.phases.0.sources.0.dataset'?" in str(e)
    else:
        raise AssertionError("unknown key in a list of sections accepted")


def test_max_steps_scales_warmup_and_phase_starts(tmp_path, capsys):
    from quipu.flows.train_cli import steps_scaled
    cfg = tmp_path / "t.yaml"
    cfg.write_text("schedule: {warmup_steps: 20}\ntrain: {max_steps: 200}\n"
                   "data: {phases: [{name: a, sources: [{dataset: x}]}, {name: b, start_step: 150, sources: [{dataset: y}]}]}\n")
    over = steps_scaled(str(cfg), [], 5)
    assert over[:2] == ["train.max_steps=5", "schedule.warmup_steps=0"] or over[:2] == ["train.max_steps=5", "schedule.warmup_steps=1"]
    assert '"start_step": 4' in over[2]
    assert "schedule.warmup_steps 20 ->" in capsys.readouterr().out
    assert steps_scaled(str(cfg), ["schedule.warmup_steps=3"], 5)[:2] == ["train.max_steps=5", f"data.phases={over[2].split('=', 1)[1]}"]


# ---- failing early, before Prefect starts --------------------------------------------------------

def test_curate_refuses_bad_outputs_and_inputs_before_any_work(tmp_path):
    (tmp_path / "a.docx").write_text("not an input\n")
    (tmp_path / "b.csv").write_text("x,y\n")
    (tmp_path / "docs.jsonl").write_text('{"id": "1", "text": "hello"}\n')
    (tmp_path / "taken").write_text("a file")
    # a Prefect API nobody answers on: a check that ran after Prefect started would fail differently
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    p = subprocess.run([sys.executable, "-m", "quipu.flows.cli", "curate", "configs/curate/demo.yaml",
                        "--input", str(tmp_path / "*.docx"), "--input", str(tmp_path / "*.csv"),
                        "--output", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 2 and "no supported input files: 2 matched (a.docx, b.csv)" in p.stderr, p.stderr
    p = subprocess.run([sys.executable, "-m", "quipu.flows.cli", "curate", "configs/curate/demo.yaml",
                        "--input", str(tmp_path / "docs.jsonl"), "--output", str(tmp_path / "taken")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 2 and "is a file, not a folder" in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1    # one line, no traceback
    assert not (tmp_path / "out").exists()


def test_a_run_that_curates_nothing_exits_non_zero_unless_allowed(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "junk.jsonl").write_text('{"id": "1"}\nnot json\n')
    # in process: the exit code and the CLI's own line (printed by main, not logged by Prefect)
    p = cli(capsys, "curate", "configs/curate/demo.yaml", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"))
    assert p.returncode == 3 and "curated 0 documents" in p.stderr and "--allow-empty" in p.stderr, p.stderr[-2000:]
    assert quipu_main("curate", "configs/curate/demo.yaml", "--input", str(tmp_path / "in"),
                      "--output", str(tmp_path / "out"), "--allow-empty") == 0
