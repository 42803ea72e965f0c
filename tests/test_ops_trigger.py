"""End to end against a real `prefect server`: `quipu deploy` registers curate with the trigger of
deploy/prefect.yaml, a process worker runs it, a file copied into the watched directory is
announced by the `watch` flow, and an incremental curate run over only that file starts and
completes. (Event triggers have broken silently across Prefect upgrades before.)

The test starts its own server, so that nothing the rest of the suite left behind (the session
server's backlog of earlier runs' events, the process's events client) stands between the event
and the trigger: in CI the session-server version missed its wait twice while passing alone."""
from __future__ import annotations

import datetime as dt
import json
import shutil
import time
import uuid

import pytest

from tests.ops_helpers import PrefectServer, Worker, deploy_file, light_curate_config, small_jsonl, wait_until


@pytest.fixture
def own_server(tmp_path, monkeypatch):
    from prefect.events.worker import EventsWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    server = PrefectServer(tmp_path / "prefect-home").start()
    monkeypatch.setenv("PREFECT_API_URL", server.url)      # `prefect deploy` runs as a subprocess
    # The process's events client is a singleton bound to the API URL it was created under: after an
    # earlier in-process flow run it would send this test's event to the session's server.
    EventsWorker.drain_all(timeout=30)
    try:
        with temporary_settings(updates={PREFECT_API_URL: server.url}):
            yield server
            EventsWorker.drain_all(timeout=30)
    finally:
        server.stop()


@pytest.mark.slow
def test_copied_file_triggers_incremental_curate(own_server, shared_data, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    from quipu.flows.deploy import deploy
    from quipu.flows.watch import WatchConfig, mark_seen, scan, watch

    pool = f"ops-e2e-{uuid.uuid4().hex[:6]}"
    raw = tmp_path / "raw"
    old = small_jsonl(shared_data, raw / "old.jsonl", "en_nltk_abc_news.jsonl", 20)
    cfg = WatchConfig(locations=[str(raw)], settle_s=0.5, output_root=str(tmp_path / "runs"))
    mark_seen(scan(cfg), "curated-before")          # old.jsonl was curated by an earlier run

    curate_cfg = light_curate_config(tmp_path / "curate.yaml")
    prefect_file = deploy_file(tmp_path / "prefect.yaml", curate_cfg, pool, ["curate"])
    assert deploy(prefect_file, ["curate"]) == 0       # `quipu deploy`, in-process (saves an interpreter start)

    worker = Worker(pool, own_server.url, tmp_path / "worker.log")
    try:
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
                raise TimeoutError(f"{e}\nserver log:\n{own_server.log_path.read_text()[-4000:]}") from None
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
            assert run.state.is_completed(), (run.state, (tmp_path / "worker.log").read_text()[-3000:])
    finally:
        worker.stop()

    summary = json.loads((tmp_path / "runs" / sent["output"].rsplit("/", 1)[-1] / "run.json").read_text())
    assert summary["inputs"] == [str(raw / "new.jsonl")]        # incremental: the old file is not curated again
    assert summary["curated"]["rows"] > 0
    assert summary["records_read"] == 15
    assert old.exists()
    # The watcher has recorded the file: a second look announces nothing.
    assert watch(cfg)["new"] == 0
