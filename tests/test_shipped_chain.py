"""The shipped loop, as a user runs it (docs/prefect.md): `quipu deploy` of
deploy/prefect.yaml as shipped against a real Prefect server (the session's), a process worker on
the shipped pool (`make worker`), two batches dropped into the watched folder: Spanish and
Portuguese news only (the regional team's own batches: no English, which the shipped blend names),
then es/pt/en with a copy of a document the first batch curated; the `watch` deployment's look (its
deployed config, run in this process to save a worker process start). Both curate runs keep the news
(the es/pt/en config, not the demo's English thresholds), the second removes the copy against the
index of the first, the watcher marks each batch seen once its run completed, and the training run
starts from the first batch without English and continues from the second, tokenizing only the new
version. (tests/test_chain.py runs the same chain on a lean config of its own; its two-batch run
moved here: one chain run proves both.)

No shipped config is edited: only paths (the watched folder, the outputs), the watcher's settle
time and the training run's size go through `quipu deploy --set`, the documented way to adapt a
deployment."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import quipu_main
from tests.ops_helpers import Worker, deployment_runs, wait_run_final

pytestmark = pytest.mark.slow

# A training run of seconds: the chain is under test, not the model.
TINY_TRAIN = ["train.max_steps=4", "train.batch_size=2", "train.micro_batch=2", "data.seq_len=32",
              "data.eval_docs_per_source=1", "data.continual.steps=3", "model.dim=32", "model.n_layers=1",
              "model.n_heads=2", "model.n_kv_heads=1", "model.max_seq_len=64", "eval.every=100", "eval.rows=2",
              "eval.sample_tokens=0", "checkpoint.every=2", "schedule.warmup_steps=1"]
SOURCES = {"es": "es_nltk_cess_esp_news.jsonl", "pt": "pt_fakebr_news.jsonl", "en": "en_nltk_abc_news.jsonl"}


def _drop(shared_data: Path, folder: Path, name: str, start: int, n: int, langs: tuple[str, ...],
          extra: tuple[dict, ...] = ()) -> Path:
    """A batch of n documents per language of `langs` (and `extra` rows), appearing whole (renamed
    from a dot file, as a finished download would)."""
    lines = [ln for lang in langs for ln in (shared_data / "text" / SOURCES[lang]).read_text().splitlines()[start:start + n]]
    lines += [json.dumps(row) for row in extra]
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.part"
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(folder / name)
    return folder / name


def test_shipped_deployments_curate_and_train_two_batches(prefect_server, shared_data, tmp_path, monkeypatch, capsys):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.events.worker import EventsWorker

    from quipu.catalog import registry
    from quipu.flows.watch import WatchConfig, watch

    # a new user's catalog: the session's holds other tests' `crawl` datasets, and the shipped watcher
    # and blend name that dataset (the deploy, the worker and the watcher here all read QUIPU_HOME)
    monkeypatch.setenv("QUIPU_HOME", str(tmp_path / "quipu-home"))
    raw, train_dir = tmp_path / "raw", tmp_path / "train"
    overrides = [f"watch.locations=[{raw}]", f"watch.output_root={tmp_path / 'incremental'}", "watch.settle_s=1",
                 f"curate.output={tmp_path / 'curate'}", f"tokenize-train.output={train_dir}",
                 *(f"tokenize-train.{item}" for item in TINY_TRAIN)]
    # `quipu deploy` in this process (its output is what is checked, not an interpreter start): it
    # validates every deployment against its flow's config model and runs `prefect deploy`
    assert quipu_main("deploy", *(a for o in overrides for a in ("--set", o))) == 0
    out = capsys.readouterr().out
    # quiet: one line per deployment, the next steps, none of Prefect's own hints
    assert all(f"\n  {name} " in out for name in ("watch", "curate", "quality-train", "ppl-distill", "tokenize-train"))
    assert "next:" in out and "make worker" in out and "prefect worker start" not in out
    assert len(out.splitlines()) <= 14, out
    assert "quipu.dataset.crawl" in out          # training listens to the dataset its blend names only

    EventsWorker.drain_all(timeout=30)     # a test with its own server may have bound this process's events client
    worker = Worker("quipu-process", prefect_server, tmp_path / "worker.log",
                    env={"PREFECT_RUNNER_POLL_FREQUENCY": "1", "PREFECT_LOGGING_LEVEL": "INFO"})   # as `make worker`
    try:
        with get_client(sync_client=True) as client:
            automations = {a.name for a in client.read_automations()}
            watch_config = client.read_deployment_by_name("watch/watch").parameters["config"]
        assert {"curate-new-files", "train-on-new-version"} <= automations
        assert watch_config["locations"] == [str(raw)] and watch_config["dataset"] == "crawl"
        for n, (start, count, langs) in enumerate(((0, 10, ("es", "pt")), (40, 6, ("es", "pt", "en"))), 1):
            copy = ()
            if n == 2:   # a copy (another id and URL) of a document the first batch curated
                first = registry.dataset_versions("crawl")[0]["shards"][0]["path"]
                copy = ({"id": "copied-from-batch-1", "url": "https://mirror.example.org/copy",
                         "text": pq.read_table(first).to_pylist()[0]["text"]},)
            dropped = time.time()
            _drop(shared_data, raw, f"batch-{n}.jsonl", start, count, langs, copy)
            # the `watch` deployment's look, in this process (a worker run costs a process start):
            # its config as deployed
            sent = watch(WatchConfig.model_validate(watch_config))
            assert sent["new"] == 1 and sent["dataset"] == "crawl" and sent["paths"] == [str(raw / f"batch-{n}.jsonl")], sent
            curate_run = wait_run_final("curate/curate", n, tmp_path / "worker.log", timeout=480)
            assert curate_run.state.is_completed(), curate_run.state
            assert curate_run.name.startswith(f"curate-crawl-v{n}-"), curate_run.name
            curated = registry.dataset_versions("crawl")[n - 1]
            kept = sum(sh["rows"] for sh in curated["shards"])
            assert kept >= 0.9 * count * len(langs), (n, kept)   # news prose: kept by the es/pt/en thresholds
            train_run = wait_run_final("tokenize-train/tokenize-train", n, tmp_path / "worker.log", timeout=480)
            assert train_run.state.is_completed(), (train_run.state, (tmp_path / "worker.log").read_text()[-3000:])
            assert train_run.parameters["new_version"] == {"dataset": "crawl", "version": n}
            assert re.fullmatch(rf"train-train-crawl-v{n}-\d{{8}}-\d{{6}}", train_run.name), train_run.name
            print(f"batch {n}: drop -> training completed {time.time() - dropped:.0f} s")
            # the watcher marks the batch seen once its curate run completed (this look, or the watch
            # deployment's scheduled one on the worker), and announces nothing new
            again = watch(WatchConfig.model_validate(watch_config))
            assert again["new"] == 0 and again["unchanged"] == n and not again["pending"], again
            assert registry.files_seen(str(raw))[str(raw / f"batch-{n}.jsonl")]["run_id"] == str(curate_run.id)
        # a domain error in a deployment's run: one ERROR line naming the path and the working
        # directory, the run Failed with it, no traceback
        run_deployment("curate/curate", parameters={"config": {"input": [str(tmp_path / "missing")]}}, timeout=0)
        failed = wait_run_final("curate/curate", 3, tmp_path / "worker.log", timeout=120)
        assert failed.state.is_failed() and "input not found" in failed.state.message, failed.state
        assert "relative paths are read from" in failed.state.message
    finally:
        worker.stop()

    versions = registry.dataset_versions("crawl")
    assert [v["version"] for v in versions] == [1, 2]
    dedup = registry.get_reports(versions[1]["run_id"])["dedup"]
    assert dedup["removed_docs"] == 1, dedup["removed_by_reason"]      # the copy, against the index of batch 1
    v2_ids = {r["id"] for s in versions[1]["shards"] for r in pq.read_table(s["path"], columns=["id"]).to_pylist()}
    assert "copied-from-batch-1" not in v2_ids and v2_ids
    history = json.loads((train_dir / "continual.json").read_text())
    assert [h["from_step"] for h in history] == [0, 4]
    assert history[0]["versions"] == {"crawl": [1]} and history[1]["versions"] == {"crawl": [1, 2]}
    prepared = json.loads((train_dir / "prepared.json").read_text())
    assert {(s["version"], s["path"]) for s in prepared["curated_shards"]} == {
        (v["version"], s["path"]) for v in versions for s in v["shards"]}
    assert sum(s["reused"] for s in prepared["curated_shards"]) == len(versions[0]["shards"])  # v1 not tokenized again
    cfg_after = json.loads((train_dir / "train_config.json").read_text())
    assert [p["start_step"] for p in cfg_after["data"]["phases"]][-1] == 4
    steps = [json.loads(x)["step"] for x in (train_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [4, 7]                        # logged steps: 4, then 3 more from the checkpoint at 4
    assert [r.state.type.value for r in deployment_runs("curate/curate")] == ["COMPLETED", "COMPLETED", "FAILED"]
    # the worker's terminal shows each progress line once (the run's log; not a second raw copy)
    log = (tmp_path / "worker.log").read_text()
    assert log.count(" - blend:\n") == 2 and log.count("tokens per word:") == 2, log[-3000:]
    # SmolLM2's tokenizer is fixed: fertility measured on every blend language the data holds (es/pt
    # about 2.1-2.2, en 1.3); the first batch has no English, and the blend trains without it
    assert len(re.findall(r"tokens per word: es \d\.\d\d, pt \d\.\d\d", log)) == 1
    assert len(re.findall(r"tokens per word: en \d\.\d\d, es \d\.\d\d, pt \d\.\d\d", log)) == 1
    assert log.count("[lang=en]': fewer than 2 documents in this data, trained without it") == 1
    assert "does not fit" not in log
    # what the runs printed; after worker.stop()'s SIGINT, Prefect's own shutdown may log its websocket
    # heartbeat timing out on a busy server (a Prefect traceback, not a run's)
    runs_log = log.split("Received SIGINT. Sending SIGINT to the process worker")[0]
    assert "Traceback" not in runs_log, runs_log[runs_log.index("Traceback") - 2000:][:4000]
