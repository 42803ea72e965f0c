"""New data to a trained model without a human, on a real `prefect server` and process worker
started here: files dropped into a watched folder → `watch` → `quipu.data.arrived` → curate (a new
version of the dataset, dedup against the earlier ones) → `quipu.curate.completed` →
tokenize-train, twice; the second training run continues from the first's checkpoint with both
versions. And the watcher's promise: files whose curate run is killed are announced again.

Lean on purpose (tiny model, a few steps, a few dozen documents): the chain, not the training,
is under test."""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.ops_helpers import (PrefectServer, Worker, deploy_file, deployment_runs, light_curate_config, wait_run_final,
                               wait_until)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chain(tmp_path_factory, shared_data):
    """Server, deployments (curate, tokenize-train with their triggers) and a worker, for the module."""
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from quipu.flows.deploy import deploy
    from quipu.trainer.tokenize import reference_tokenizer

    base = tmp_path_factory.mktemp("chain")
    reference_tokenizer()    # cache SmolLM2's tokenizer.json once (curate counts tokens with it)
    server = PrefectServer(base / "prefect-home").start()
    old_url = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = server.url
    EventsWorker.drain_all(timeout=30)
    dataset = f"chain-{uuid.uuid4().hex[:6]}"
    pool = f"chain-{uuid.uuid4().hex[:6]}"
    curate_cfg = light_curate_config(base / "curate.yaml")
    cfg = yaml.safe_load(curate_cfg.read_text())
    cfg["dedup"] = {"enabled": True}            # the cross-batch duplicate goes against the index
    curate_cfg.write_text(yaml.safe_dump(cfg))
    train_cfg = base / "train.yaml"
    train_cfg.write_text(yaml.safe_dump({
        "output": str(base / "train-run"),
        "tokenizer": {"vocab_size": 300, "train_docs": 500},
        "data": {"seq_len": 32, "eval_docs_per_source": 2, "workers": 1,
                 "phases": [{"name": "general", "sources": [{"dataset": dataset, "weight": 1.0}]}],
                 "continual": {"policy": "append", "steps": 3}},
        "model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "max_seq_len": 64},
        "schedule": {"kind": "constant", "warmup_steps": 1},
        "train": {"max_steps": 4, "batch_size": 2, "micro_batch": 2, "threads": 1},
        "eval": {"every": 100, "rows": 2, "sample_tokens": 0},
        "checkpoint": {"every": 2, "keep_last": 1}}))
    prefect_file = deploy_file(base / "prefect.yaml", curate_cfg, pool, ["curate", "tokenize-train"],
                               configs={"tokenize-train": str(train_cfg)})
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.url}):
            assert deploy(prefect_file, ["curate", "tokenize-train"]) == 0
            worker = Worker(pool, server.url, base / "worker.log", env={"PREFECT_RUNNER_POLL_FREQUENCY": "1"})
            try:
                yield {"server": server, "base": base, "dataset": dataset, "run": base / "train-run", "worker": worker}
            finally:
                worker.stop()
                EventsWorker.drain_all(timeout=30)
    finally:
        server.stop()
        if old_url is not None:
            os.environ["PREFECT_API_URL"] = old_url


def _runs(deployment: str) -> list:
    return deployment_runs(deployment)


def _wait_final(deployment: str, n: int, chain: dict, timeout: float = 150):
    return wait_run_final(deployment, n, chain["base"] / "worker.log", timeout)


def _jsonl(shared_data: Path, name: str, start: int, n: int) -> list[dict]:
    lines = (shared_data / "text" / name).read_text().splitlines()[start:start + n]
    return [json.loads(x) for x in lines]


def _drop(folder: Path, name: str, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.part"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(folder / name)       # appears whole, as a finished download would
    return folder / name


def test_two_batches_curate_and_train_without_a_human(chain, shared_data):
    from quipu.catalog import registry
    from quipu.flows.watch import WatchConfig, watch

    raw = chain["base"] / "raw"
    cfg = WatchConfig(locations=[str(raw)], settle_s=0.2, output_root=str(chain["base"] / "inc"), dataset=chain["dataset"])
    first = _jsonl(shared_data, "en_nltk_abc_news.jsonl", 0, 30)
    second = _jsonl(shared_data, "en_nltk_abc_news.jsonl", 30, 20)
    latencies = []

    for n, rows in ((1, first), (2, second)):
        if n == 2:   # plus a copy (another id and URL) of a document that batch 1 curated
            kept = pq.read_table(registry.dataset_versions(chain["dataset"])[0]["shards"][0]["path"]).to_pylist()[0]
            rows = rows + [{"id": "copied-from-batch-1", "url": "https://mirror.example.org/copy", "text": kept["text"]}]
        dropped = time.time()
        _drop(raw, f"batch-{n}.jsonl", rows)
        sent = watch(cfg)                                  # the watch deployment's schedule, by hand
        assert sent["new"] == 1 and sent["paths"] == [str(raw / f"batch-{n}.jsonl")]
        curate_run = _wait_final("curate/curate", n, chain)
        assert curate_run.state.is_completed(), curate_run.state
        train_run = _wait_final("tokenize-train/tokenize-train", n, chain, timeout=180)
        assert train_run.state.is_completed(), (train_run.state, (chain["base"] / "worker.log").read_text()[-3000:])
        assert train_run.parameters["new_version"] == {"dataset": chain["dataset"], "version": n}   # typed, not a string
        history = json.loads((chain["run"] / "continual.json").read_text())
        started = dt.datetime.fromisoformat(history[n - 1]["started"]).timestamp()
        latencies.append(started - dropped)
        print(f"batch {n}: file drop -> training start {started - dropped:.1f} s")
        # the watcher marks the batch seen once its curate run completed, and announces nothing new
        again = watch(cfg)
        assert again["new"] == 0 and again["settled"]["seen"] == 1
        seen = registry.files_seen(str(raw))
        assert seen[str(raw / f"batch-{n}.jsonl")]["run_id"] == str(curate_run.id)

    versions = registry.dataset_versions(chain["dataset"])
    assert [v["version"] for v in versions] == [1, 2]
    dedup = registry.get_reports(versions[1]["run_id"])["dedup"]
    assert dedup["removed_docs"] == 1, dedup["removed_by_reason"]      # the copy, against the index of batch 1
    v2_ids = {r["id"] for s in versions[1]["shards"] for r in pq.read_table(s["path"], columns=["id"]).to_pylist()}
    assert "copied-from-batch-1" not in v2_ids and v2_ids
    assert json.loads(versions[1]["info"])["tokens"] > 0

    first_run, second_run = history
    assert first_run["from_step"] == 0 and first_run["versions"] == {chain["dataset"]: [1]}
    assert second_run["from_step"] == 4 and second_run["versions"] == {chain["dataset"]: [1, 2]}
    prepared = json.loads((chain["run"] / "prepared.json").read_text())
    read = {(s["version"], s["path"]) for s in prepared["curated_shards"]}
    assert read == {(v["version"], s["path"]) for v in versions for s in v["shards"]}
    assert sum(s["reused"] for s in prepared["curated_shards"]) == len(versions[0]["shards"])  # v1 not tokenized again
    steps = [json.loads(x)["step"] for x in (chain["run"] / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 8))               # 4 steps, then 3 more from the checkpoint at step 4
    cfg_after = json.loads((chain["run"] / "train_config.json").read_text())
    assert [p["start_step"] for p in cfg_after["data"]["phases"]] == [None, 4]


def test_killed_curate_run_files_are_announced_again(chain, shared_data):
    from prefect.client.orchestration import get_client

    from quipu.catalog import registry
    from quipu.flows.watch import WatchConfig, watch

    raw = chain["base"] / "raw-kill"
    cfg = WatchConfig(locations=[str(raw)], settle_s=0.2, output_root=str(chain["base"] / "inc-kill"),
                      dataset=f"{chain['dataset']}-other")
    path = _drop(raw, "batch.jsonl", _jsonl(shared_data, "en_nltk_abc_news.jsonl", 60, 10))
    before = {r.id for r in _runs("curate/curate")}
    first = watch(cfg)
    assert first["paths"] == [str(path)]

    def started():
        runs = [r for r in _runs("curate/curate") if r.id not in before]
        return runs[0] if runs and runs[0].infrastructure_pid else None
    run = wait_until(started, 120, "the triggered curate run's process", every=0.2)
    os.kill(int(str(run.infrastructure_pid).rsplit(":", 1)[-1]), signal.SIGKILL)

    def final():
        with get_client(sync_client=True) as client:
            r = client.read_flow_run(run.id)
        return r if r.state and r.state.is_final() else None
    killed = wait_until(final, 60, "the killed run reported", every=0.5)
    assert not killed.state.is_completed(), killed.state

    again = watch(cfg)                                   # the next look: retry, a new event and run
    assert again["settled"]["retry"] == 1 and again["paths"] == [str(path)] and again["output"] != first["output"]
    assert str(path) not in registry.files_seen(str(raw))
    retried = wait_until(lambda: next((r for r in _runs("curate/curate") if r.id not in before | {run.id}
                                       and r.state and r.state.is_final()), None), 150, "the retried run finishing", every=1)
    assert retried.state.is_completed(), retried.state
    assert watch(cfg)["settled"]["seen"] == 1
    assert registry.files_seen(str(raw))[str(path)]["run_id"] == str(retried.id)
    pending = registry.files_pending(str(raw))
    assert pending == []
