"""Operating quipu from Prefect, fast parts: the watcher's file logic, the deployment file and its
resolution, run diffs, progress and summary artifacts' content, task-runner settings."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import yaml

from quipu.flows.config import ConfigError
from quipu.flows.curate_config import from_form
from quipu.flows.deploy import DEFAULT_FILE, deep_merge, resolve
from quipu.flows.reports import RunProgress, diff_runs, summary_markdown
from quipu.flows.runners import RunnerConfig, make_task_runner, runner_matches
from quipu.flows.watch import WatchConfig, is_candidate, mark_seen, ready_files, scan

ROOT = Path(__file__).resolve().parents[1]


def _cfg(tmp_path: Path, **kw) -> WatchConfig:
    # Each test watches its own tmp dir: the catalog (files_seen) is shared by the test session.
    return WatchConfig(**{"locations": [str(tmp_path / "raw")], "settle_s": 0, "output_root": str(tmp_path / "runs"), **kw})


def _write(p: Path, text: str = '{"id": "a", "text": "hello"}\n') -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


# ---- watcher ----------------------------------------------------------------------------------

def test_watch_new_then_seen_then_changed(tmp_path):
    cfg = _cfg(tmp_path)
    a = _write(tmp_path / "raw" / "a.jsonl")
    _write(tmp_path / "raw" / "sub" / "b.jsonl.gz", "x")
    _write(tmp_path / "raw" / "notes.txt")              # not an input format
    first = scan(cfg)
    assert sorted(first.paths) == sorted([str(a), str(tmp_path / "raw" / "sub" / "b.jsonl.gz")])
    mark_seen(first, "run-1")
    again = scan(cfg)
    assert again.paths == [] and again.unchanged == 2
    _write(a, '{"id": "a", "text": "hello again"}\n')    # changed size
    changed = scan(cfg)
    assert changed.paths == [str(a)]
    _write(tmp_path / "raw" / "c.warc.gz", "y")
    assert str(tmp_path / "raw" / "c.warc.gz") in scan(cfg).paths


def test_watch_skips_file_still_being_written(tmp_path):
    cfg = _cfg(tmp_path, settle_s=0.01)
    growing = _write(tmp_path / "raw" / "growing.jsonl")
    done = _write(tmp_path / "raw" / "done.jsonl")

    def writer_appends(_seconds):   # the second look sees a bigger file
        with open(growing, "a") as fh:
            fh.write('{"id": "b", "text": "more"}\n')

    result = scan(cfg, sleep=writer_appends)
    assert result.paths == [str(done)]
    assert result.unsettled == [str(growing)]
    mark_seen(result, None)
    assert scan(cfg).paths == [str(growing)]           # settled now: picked up on the next look


def test_watch_marker_files_and_partial_names(tmp_path):
    cfg = _cfg(tmp_path, marker_suffix=".done")
    a = _write(tmp_path / "raw" / "a.jsonl")
    _write(tmp_path / "raw" / "b.jsonl")
    _write(tmp_path / "raw" / "a.jsonl.done", "")
    result = scan(cfg)
    assert result.paths == [str(a)] and result.unsettled == [str(tmp_path / "raw" / "b.jsonl")]
    for name in (".a.jsonl.x7Fq", "c.jsonl.part", "c.jsonl.tmp", "c.warc.gz.crdownload"):
        assert not is_candidate(str(tmp_path / name), cfg), name


def test_announced_files_wait_for_their_curate_run(tmp_path, monkeypatch):
    """Announced files are pending, not seen: a completed run marks them seen; a failed one puts
    them back (announced again, attempts counted) until `max_attempts`. (The Prefect lookup of the
    run's state is replaced here; tests/test_chain.py kills a real run on a real server.)"""
    import quipu.flows.watch as watch_mod
    from quipu.catalog import registry
    cfg = _cfg(tmp_path, max_attempts=2)
    a = _write(tmp_path / "raw" / "a.jsonl")
    states = {}
    monkeypatch.setattr(watch_mod, "curate_run_state", lambda output, since: states.get(output, (None, None)))

    first = scan(cfg)
    watch_mod.mark_pending(first, "event-1", "/runs/inc-1")
    assert scan(cfg).paths == [] and scan(cfg).pending == 1          # not announced twice while its run goes on
    assert watch_mod.settle_pending(cfg) == {"seen": 0, "retry": 0, "waiting": 1, "gave_up": 0}
    states["/runs/inc-1"] = ("CRASHED", "run-1")
    assert watch_mod.settle_pending(cfg)["retry"] == 1
    again = scan(cfg)
    assert again.paths == [str(a)]                                   # the crashed run's file comes back
    watch_mod.mark_pending(again, "event-2", "/runs/inc-2")
    assert registry.files_pending(str(tmp_path / "raw"))[0]["attempts"] == 2
    states["/runs/inc-2"] = ("FAILED", "run-2")
    assert watch_mod.settle_pending(cfg)["gave_up"] == 1             # max_attempts: left until the file changes
    assert scan(cfg).paths == []
    _write(a, '{"id": "a", "text": "fixed"}\n')
    fixed = scan(cfg)
    assert fixed.paths == [str(a)]
    watch_mod.mark_pending(fixed, "event-3", "/runs/inc-3")
    assert registry.files_pending(str(tmp_path / "raw"))[0]["attempts"] == 1
    states["/runs/inc-3"] = ("COMPLETED", "run-3")
    assert watch_mod.settle_pending(cfg)["seen"] == 1
    assert registry.files_seen(str(tmp_path / "raw"))[str(a)]["run_id"] == "run-3"
    assert registry.files_pending(str(tmp_path / "raw")) == [] and scan(cfg).unchanged == 1


def test_ready_files_needs_same_size_and_mtime():
    cfg = WatchConfig()
    first = {"/d/a.jsonl": (10, 1.0), "/d/b.jsonl": (10, 1.0)}
    second = {"/d/a.jsonl": (10, 1.0), "/d/b.jsonl": (10, 2.0), "/d/c.jsonl": (5, 3.0)}
    assert ready_files(first, second, cfg) == (["/d/a.jsonl"], ["/d/b.jsonl", "/d/c.jsonl"])


def test_watch_checksum_ignores_touch(tmp_path):
    cfg = _cfg(tmp_path, checksum=True)
    a = _write(tmp_path / "raw" / "a.jsonl")
    mark_seen(scan(cfg), None)
    os.utime(a, (a.stat().st_atime + 100, a.stat().st_mtime + 100))   # touched, same bytes
    assert scan(cfg).paths == []


def test_watch_max_files_defers_the_rest(tmp_path):
    cfg = _cfg(tmp_path, max_files=2)
    for i in range(3):
        _write(tmp_path / "raw" / f"f{i}.jsonl")
    first = scan(cfg)
    assert len(first.paths) == 2 and first.deferred == 1
    mark_seen(first, None)
    assert len(scan(cfg).paths) == 1


def test_watch_config_errors_name_the_key():
    from quipu.flows.config import load_config
    with pytest.raises(ConfigError, match="locations"):
        load_config(WatchConfig, None, data={"locations": []})
    with pytest.raises(ConfigError, match="settle_s"):
        load_config(WatchConfig, None, data={"settle_s": -1})
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(WatchConfig, None, data={"paths": ["x"]})


def test_shipped_watch_config_is_valid():
    from quipu.flows.config import load_config
    cfg = load_config(WatchConfig, ROOT / "configs" / "watch" / "default.yaml")
    assert cfg.locations == ["data/raw"]


# ---- deployment file --------------------------------------------------------------------------

def test_prefect_yaml_declares_every_flow_pool_schedules_and_trigger():
    spec = yaml.safe_load(DEFAULT_FILE.read_text())
    deps = {d["name"]: d for d in spec["deployments"]}
    assert set(deps) == {"curate", "quality-train", "ppl-distill", "tokenize-train", "watch"}
    assert deps["curate"]["entrypoint"] == "flows/curate.py:curate"
    assert deps["watch"]["entrypoint"] == "flows/watch.py:watch"
    for d in deps.values():
        assert d["work_pool"]["name"] == "quipu-process" and d["work_pool"]["type"] == "process"
        assert d.get("schedules"), d["name"]
    for heavy in ("curate", "quality-train", "ppl-distill", "tokenize-train"):
        assert all(s["active"] is False for s in deps[heavy]["schedules"]), heavy
    assert deps["watch"]["schedules"][0]["active"] is True
    (trigger,) = deps["curate"]["triggers"]
    assert trigger["expect"] == ["quipu.data.arrived"]
    # exactly the template, no `| tojson` (double-encodes, and the run is silently not created)
    assert trigger["parameters"]["config"]["input"] == "{{ event.payload.paths }}"
    assert trigger["parameters"]["config"]["dataset"] == "{{ event.payload.dataset }}"
    (train_trigger,) = deps["tokenize-train"]["triggers"]
    assert train_trigger["expect"] == ["quipu.curate.completed"]
    assert train_trigger["parameters"]["new_version"] == {"dataset": "{{ event.payload.dataset }}",
                                                          "version": "{{ event.payload.version }}"}
    assert deps["tokenize-train"]["concurrency_limit"]["limit"] == 1
    def strings(node):
        if isinstance(node, dict):
            return [x for v in node.values() for x in strings(v)]
        if isinstance(node, list):
            return [x for v in node for x in strings(v)]
        return [node] if isinstance(node, str) else []
    assert not [t for t in strings(spec["deployments"]) if "tojson" in t]


def test_resolve_fills_configs_validates_and_skips_missing_flows(tmp_path):
    resolved, kept, skipped = resolve(yaml.safe_load(DEFAULT_FILE.read_text()), ROOT)
    assert {"curate", "watch"} <= set(kept)
    assert "quipu" not in resolved and "{{ $QUIPU_ROOT }}" not in yaml.safe_dump(resolved)
    assert resolved["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(ROOT)
    shipped = yaml.safe_load((ROOT / "configs/curate/default.yaml").read_text())   # the es/pt/en config
    deps = {d["name"]: d for d in resolved["deployments"]}
    # curate's form names its file (read where the run executes), the YAML's values on top
    cfg = deps["curate"]["parameters"]["config"]
    assert cfg == {"config_file": "configs/curate/default.yaml", "input": ["data/raw"], "output": "runs/curate",
                   "artifact_prefix": "curate"}
    full = from_form(cfg, ROOT)
    assert full.langid.languages == shipped["langid"]["languages"] and full.output == "runs/curate"
    tcfg = deps["curate"]["triggers"][0]["parameters"]["config"]
    assert tcfg["input"] == "{{ event.payload.paths }}" and tcfg["config_file"] == "configs/curate/default.yaml"
    for name in ("quality-train", "ppl-distill", "tokenize-train"):
        entry = {d["name"]: d for d in yaml.safe_load(DEFAULT_FILE.read_text())["deployments"]}[name]["entrypoint"]
        assert (name in kept) == (ROOT / entry.split(":")[0]).is_file()
        assert (name in kept) != any(m.startswith(name + ":") for m in skipped)


def test_resolve_rejects_a_bad_config_before_deploying(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("langid:\n  min_score: 7\n")
    spec = yaml.safe_load(DEFAULT_FILE.read_text())
    spec["quipu"]["configs"]["curate"] = str(bad)
    with pytest.raises(ConfigError, match="langid.min_score"):
        resolve(spec, ROOT, ["curate"])
    with pytest.raises(ConfigError, match="no deployment named nope"):
        resolve(yaml.safe_load(DEFAULT_FILE.read_text()), ROOT, ["nope"])


def test_deploy_dry_run_validates_every_deployment(tmp_path, capsys):
    """Every deployment points at a config that exists, and its parameters fit its flow."""
    from quipu.flows.deploy import deploy
    spec = yaml.safe_load(DEFAULT_FILE.read_text())
    assert all((ROOT / path).is_file() for path in spec["quipu"]["configs"].values())
    assert deploy(DEFAULT_FILE, dry_run=True) == 0
    out = capsys.readouterr().out
    assert [ln.split()[0] for ln in out.splitlines()[1:]] == ["watch", "curate", "quality-train", "ppl-distill",
                                                               "tokenize-train"]     # one line each
    resolved, kept, skipped = resolve(spec, ROOT)
    assert skipped == [] and len(kept) == 5
    deps = {d["name"]: d for d in resolved["deployments"]}
    assert deps["tokenize-train"]["parameters"]["config"]["data"]["continual"]["policy"] == "append"


@pytest.mark.parametrize("problem, message", [
    ("missing", r"deployment tokenize-train: config file .*nope.yaml not found"),
    ("bad-yaml", r"deployment tokenize-train: .*bad.yaml.* not valid YAML"),
    ("bad-key", r"deployment tokenize-train \(.*bad.yaml\): .*train.max_steps"),
    ("bad-param", r"deployment tokenize-train \(.*bad.yaml\): parameter resume: Input should be a valid boolean"),
])
def test_deploy_dry_run_names_the_file_of_a_bad_config(tmp_path, problem, message):
    from quipu.flows.deploy import deploy
    spec = yaml.safe_load(DEFAULT_FILE.read_text())
    bad = tmp_path / "bad.yaml"
    good = yaml.safe_load((ROOT / spec["quipu"]["configs"]["tokenize-train"]).read_text())
    if problem == "missing":
        spec["quipu"]["configs"]["tokenize-train"] = str(tmp_path / "nope.yaml")
    else:
        bad.write_text({"bad-yaml": "train: [unclosed\n",
                        "bad-key": yaml.safe_dump({**good, "train": {"max_steps": -3}}),
                        "bad-param": yaml.safe_dump(good)}[problem])
        spec["quipu"]["configs"]["tokenize-train"] = str(bad)
    if problem == "bad-param":
        dep = next(d for d in spec["deployments"] if d["name"] == "tokenize-train")
        dep["parameters"]["resume"] = {"not": "a bool"}
    path = tmp_path / "prefect.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match=message):
        deploy(path, dry_run=True)


def test_deep_merge():
    assert deep_merge({"a": {"b": 1, "c": 2}, "d": 1}, {"a": {"c": 3}, "e": 4}) == {"a": {"b": 1, "c": 3}, "d": 1, "e": 4}


# ---- reports ----------------------------------------------------------------------------------

def _run(out: str, kept_h: int, reasons: dict) -> dict:
    return {"run_id": out, "output": f"/r/{out}", "records_read": 100, "quarantined": 0,
            "curated": {"rows": kept_h, "shards": ["x"]},
            "stages": [{"name": "extract", "input_docs": 100, "kept_docs": 90, "removed_docs": 10,
                        "removed_by_reason": {"extract:no_text": 10}, "seconds": 1.0},
                       {"name": "heuristics", "input_docs": 90, "kept_docs": kept_h, "removed_docs": 90 - kept_h,
                        "removed_by_reason": reasons, "seconds": 2.0}]}


def test_diff_runs_stage_by_stage():
    a = _run("a", 60, {"c4:lorem": 10, "gopher:short": 20})
    b = _run("b", 45, {"c4:lorem": 10, "gopher:short": 35})
    text = diff_runs(a, b)
    lines = {ln.split()[0]: ln.split() for ln in text.splitlines() if ln and ln.split()[0] in ("extract", "heuristics")}
    assert lines["extract"][1:] == ["100", "100", "90", "90", "90.0", "90.0", "+0.0"]
    assert lines["heuristics"][1:] == ["90", "90", "60", "45", "66.7", "50.0", "-16.7"]
    assert "gopher:short" in text and "20 → 35" in text.replace("  ", " ").replace("  ", " ")
    assert "c4:lorem" not in text        # unchanged reasons are not listed


def test_summary_markdown_links_every_report():
    md = summary_markdown(_run("a", 60, {}), ["extract", "heuristics"])
    assert "`/r/a/extract/report.json`" in md and "`/r/a/heuristics/report.json`" in md
    assert "file://" not in md and "**60**" in md       # a file:// link does not open from the UI
    assert "- dataset: **a**" in md                      # no dataset in the config: the output folder's name
    # with the UI pages of the run's other artifacts: each stage's row and each other title
    pages = {"heuristics": "http://ui/artifacts/artifact/1", "charts": "http://ui/artifacts/artifact/2"}
    md = summary_markdown(_run("a", 60, {}), ["extract", "heuristics"], pages)
    assert "| heuristics | 90 | 60 | 30 | [artifact](http://ui/artifacts/artifact/1) |" in md
    assert "- charts: [charts](http://ui/artifacts/artifact/2)" in md and "| extract | 100 | 90 | 10 | `/r/a/extract/" in md


def test_reports_show_what_was_kept_per_language(tmp_path):
    """`quipu report`, the summary artifact and --html: per language the decisions and a sample of
    kept documents with the scores that let them through."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from quipu.flows.html_report import render
    from quipu.flows.reports import format_funnel
    shard = tmp_path / "part-00000.parquet"
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(8)], "lang": ["es", "pt"] * 4,
                             "text": [f"texto número {i} | con barra" for i in range(8)],
                             "lang_score": [0.91 + i / 100 for i in range(8)], "quality_score": [0.5] * 8}), shard)
    run = _run("a", 60, {"c4:too_few_sentences": 30})
    run["curated"]["shards"] = [str(shard)]
    run["stages"][1]["by_language"] = {"es": {"kept": 4, "removed": 20, "by_reason": {"c4:too_few_sentences": 20}},
                                       "pt": {"kept": 4, "removed": 10, "by_reason": {"c4:too_few_sentences": 10}}}
    text = format_funnel(run)
    assert "kept, per language" in text and "es   d0  [lang_score=0.91 quality_score=0.5]  texto número 0" in text
    assert "pt   d5  [lang_score=0.96" in text and " d6 " not in text      # three per language
    md = summary_markdown(run, ["extract", "heuristics"])
    assert "| heuristics | es | 4 | 20 | c4:too_few_sentences (20) |" in md
    assert "| pt | `d1` | lang_score=0.92 quality_score=0.5 | texto número 1 \\| con barra |" in md
    from quipu.flows.reports import stage_markdown
    stage = stage_markdown({"stage": "heuristics", "input_docs": 90, "kept_docs": 60, "removed_docs": 30,
                            "stats": {"by_language": run["stages"][1]["by_language"], "rules": 3}})
    assert "| es | 4 | 20 | c4:too_few_sentences (20) |" in stage and '"by_language"' not in stage   # a table, not JSON
    page = render(run, {}, tmp_path)
    assert "Kept, per language" in page and "Decisions per language" in page and "d3" in page


def test_progress_without_a_run_context_only_computes():
    p = RunProgress("curate", ["extract", "langid", "curated"])
    assert p.artifact_id is None
    assert p.update("extract", 0.5) == pytest.approx(16.7)
    assert p.update("langid", 1.0) == pytest.approx(66.7)


# ---- task runners -----------------------------------------------------------------------------

def test_runner_config_and_factory():
    from prefect.task_runners import ThreadPoolTaskRunner
    from prefect_dask import DaskTaskRunner

    threads = make_task_runner(RunnerConfig(), 3)
    assert isinstance(threads, ThreadPoolTaskRunner) and runner_matches(RunnerConfig(), threads)
    dask_cfg = RunnerConfig(kind="dask", address="tcp://127.0.0.1:8786")
    dask_runner = make_task_runner(dask_cfg, 2)
    assert isinstance(dask_runner, DaskTaskRunner) and runner_matches(dask_cfg, dask_runner)
    assert not runner_matches(dask_cfg, threads)
    with pytest.raises(ValueError, match="kind: dask"):
        RunnerConfig(address="tcp://x:1")


def test_curate_config_has_runner_block():
    from quipu.flows.curate import CurateConfig
    assert CurateConfig().runner.kind == "threads"
    assert CurateConfig.model_validate({"runner": {"kind": "dask", "dask_workers": 2}}).runner.dask_workers == 2
