"""The watcher and the curate trigger on a real `prefect server` and process worker started here
(the curate deployment with the trigger of deploy/prefect.yaml, a lean config): a file copied into
the watched directory is announced by `watch`, and an incremental curate run over only that file
starts and completes (event triggers have broken silently across Prefect upgrades before); files
whose triggered curate run is killed are announced again, and the retried run marks them seen.

The module starts its own server, so that nothing the rest of the suite left behind (the session
server's backlog of earlier runs' events, the process's events client) stands between the event
and the trigger: in CI the session-server version missed its wait twice while passing alone.

The two-batch chain (files dropped → `watch` → `quipu.data.arrived` → curate, dedup against the
earlier version → `quipu.curate.completed` → tokenize-train, twice, the second continuing from the
first's checkpoint) runs once, on the shipped deployments: tests/test_shipped_chain.py."""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import uuid
from pathlib import Path

import pytest

from tests.ops_helpers import (PrefectServer, Worker, deploy_file, deployment_runs, light_curate_config, small_jsonl,
                               wait_until)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chain(tmp_path_factory, shared_data):
    """Server, the curate deployment (with its trigger) and a worker, for the module."""
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
    prefect_file = deploy_file(base / "prefect.yaml", curate_cfg, pool, ["curate"])
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.url}):
            assert deploy(prefect_file, ["curate"]) == 0
            worker = Worker(pool, server.url, base / "worker.log", env={"PREFECT_RUNNER_POLL_FREQUENCY": "1"})
            try:
                yield {"server": server, "base": base, "dataset": dataset, "worker": worker, "pool": pool}
            finally:
                worker.stop()
                EventsWorker.drain_all(timeout=30)
    finally:
        server.stop()
        if old_url is not None:
            os.environ["PREFECT_API_URL"] = old_url


def _runs(deployment: str) -> list:
    return deployment_runs(deployment)


def _jsonl(shared_data: Path, name: str, start: int, n: int) -> list[dict]:
    lines = (shared_data / "text" / name).read_text().splitlines()[start:start + n]
    return [json.loads(x) for x in lines]


def _drop(folder: Path, name: str, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.part"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(folder / name)       # appears whole, as a finished download would
    return folder / name


def test_copied_file_triggers_incremental_curate(chain, shared_data, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from quipu.flows.watch import WatchConfig, mark_seen, scan, watch

    pool = chain["pool"]
    raw = tmp_path / "raw"
    old = small_jsonl(shared_data, raw / "old.jsonl", "en_nltk_abc_news.jsonl", 20)
    cfg = WatchConfig(locations=[str(raw)], settle_s=0.5, output_root=str(tmp_path / "runs"))
    mark_seen(scan(cfg), "curated-before")          # old.jsonl was curated by an earlier run

    # the module's worker (fixture `chain`) runs the deployment
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("curate/curate")
        assert dep.work_pool_name == pool
        before = {r.id for r in client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))}

        # A new crawl file is copied in; the watcher announces only it.
        new = tmp_path / "incoming.jsonl"
        small_jsonl(shared_data, new, "es_gutenberg_quijote.jsonl", 15)
        shutil.copy(new, raw / "new.jsonl")
        sent = watch(cfg)
        assert sent["new"] == 1 and sent["paths"] == [str(raw / "new.jsonl")]
        occurred = dt.datetime.fromisoformat(sent["occurred"])

        def triggered_run():
            runs = [r for r in client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id]))) if r.id not in before]
            return runs[0] if runs else None
        try:
            run = wait_until(triggered_run, 120, "a curate run created by the trigger")
        except TimeoutError as e:
            raise TimeoutError(f"{e}\nserver log:\n{chain['server'].log_path.read_text()[-4000:]}") from None
        assert run.parameters["config"]["input"] == [str(raw / "new.jsonl")]   # a list, not a JSON string
        assert run.parameters["config"]["output"] == sent["output"]

        def started():
            r = client.read_flow_run(run.id)
            return r if r.start_time else None
        run = wait_until(started, 120, "the triggered run starting on the worker")
        print(f"event -> run start: {(run.start_time - occurred).total_seconds():.1f} s")

        def finished():
            r = client.read_flow_run(run.id)
            return r if r.state and r.state.is_final() else None
        run = wait_until(finished, 120, "the triggered run finishing")
        assert run.state.is_completed(), (run.state, (chain["base"] / "worker.log").read_text()[-3000:])

    summary = json.loads((tmp_path / "runs" / sent["output"].rsplit("/", 1)[-1] / "run.json").read_text())
    assert summary["inputs"] == [str(raw / "new.jsonl")]        # incremental: the old file is not curated again
    assert summary["curated"]["rows"] > 0
    assert summary["records_read"] == 15
    assert old.exists()
    # The watcher has recorded the file: a second look announces nothing.
    assert watch(cfg)["new"] == 0


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
