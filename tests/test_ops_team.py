"""The team topology of deploy/compose.yaml with the services started directly (no Docker engine):
Prefect server on Postgres (pg_trgm) with basic auth, Redis, a process worker running a deployment."""
from __future__ import annotations

import urllib.error
import urllib.request
import uuid

import pytest
import yaml

from tests.conftest import missing_install, require_binary
from tests.ops_helpers import ROOT, Postgres, PrefectServer, Redis, Worker, http_status, wait_until

AUTH = "quipu:s3cret-test"


def test_compose_file_declares_the_team_services():
    spec = yaml.safe_load((ROOT / "deploy/compose.yaml").read_text())
    services = spec["services"]
    assert {"postgres", "redis", "server", "worker"} <= set(services)
    assert "postgresql+asyncpg://" in services["server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert "PREFECT_SERVER_API_AUTH_STRING" in services["server"]["environment"]
    assert "PREFECT_API_AUTH_STRING" in services["worker"]["environment"]
    assert "pg_trgm" in (ROOT / "deploy/postgres-init.sql").read_text()
    assert "quipu-process" in services["worker"]["command"]


def test_compose_file_requires_secrets_binds_locally_and_installs_nothing_at_start():
    """Issue 13: no default passwords, Redis with a password, ports on 127.0.0.1 unless configured,
    a worker image with pinned dependencies instead of installing at every start."""
    text = (ROOT / "deploy/compose.yaml").read_text()
    spec = yaml.safe_load(text)
    services = spec["services"]
    for var in ("POSTGRES_PASSWORD", "REDIS_PASSWORD", "QUIPU_AUTH"):
        assert f"${{{var}:-" not in text, f"{var} has a default"
        assert f"${{{var}:?" in text, f"{var} is not required"
    assert "--requirepass" in " ".join(services["redis"]["command"])
    for name, svc in services.items():
        for port in svc.get("ports", []):
            host = port.rsplit(":", 2)[0]
            assert host.startswith("${") and host.endswith(":-127.0.0.1}"), f"{name} publishes {port} beyond 127.0.0.1"
    worker = services["worker"]
    assert "build" in worker and "pip install" not in " ".join(worker["command"])
    assert not any(v.split(":")[0] == ".." and not v.endswith(":ro") for v in worker.get("volumes", [])), \
        "the repository is mounted writable into the worker"
    dockerfile = (ROOT / worker["build"]["dockerfile"]).read_text()
    reqs = [ln for ln in (ROOT / "deploy/requirements-worker.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    assert "requirements-worker.txt" in dockerfile and "torch==2.13.0" in dockerfile
    assert reqs and all("==" in ln for ln in reqs), "unpinned worker dependency"
    assert any(ln.startswith("prefect==3.8.8") for ln in reqs)


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    reason = Postgres.unavailable()
    if reason:
        missing_install(reason)
    require_binary("redis-server", install="apt-get install redis-server")
    tmp = tmp_path_factory.mktemp("team")
    pg = Postgres().start()
    redis = server = None
    try:
        redis = Redis(tmp)
        server = PrefectServer(tmp / "prefect-home", env={
            "PREFECT_API_DATABASE_CONNECTION_URL": pg.prefect_url,
            "PREFECT_SERVER_API_AUTH_STRING": AUTH}).start()
        yield {"pg": pg, "redis": redis, "server": server, "tmp": tmp}
    finally:
        if server:
            server.stop()
        if redis:
            redis.stop()
        pg.stop()


@pytest.mark.slow
def test_basic_auth_refuses_unauthenticated_requests(team):
    import base64
    api = team["server"].url
    assert http_status(api + "/health") == 200                       # health stays open
    req = urllib.request.Request(api + "/flows/filter", data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)
    assert refused.value.code == 401
    wrong = base64.b64encode(b"quipu:wrong").decode()
    req.add_header("Authorization", f"Basic {wrong}")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)
    assert refused.value.code == 401
    req.add_header("Authorization", "Basic " + base64.b64encode(AUTH.encode()).decode())
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 200


@pytest.mark.slow
def test_worker_runs_a_deployment_on_the_postgres_server(team, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    server, pg = team["server"], team["pg"]
    assert pg.psql("SELECT extname FROM pg_extension WHERE extname = 'pg_trgm'", db="prefect") == "pg_trgm"
    assert int(pg.psql("SELECT count(*) FROM information_schema.tables WHERE table_name = 'flow_run'", db="prefect")) == 1
    import redis                                    # the team's Redis answers and stores (not a URL's spelling)
    client = redis.Redis.from_url(team["redis"].url, socket_timeout=5)
    assert client.ping() and client.set("quipu:team-check", "1") and client.get("quipu:team-check") == b"1"
    client.delete("quipu:team-check")
    pool = f"team-{uuid.uuid4().hex[:6]}"
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.jsonl").write_text('{"id": "a", "text": "hello"}\n')
    env = {"PREFECT_API_AUTH_STRING": AUTH, "QUIPU_HOME": str(tmp_path / "quipu-home")}
    with temporary_settings(updates={PREFECT_API_URL: server.url, PREFECT_API_AUTH_STRING: AUTH}):
        from quipu.flows.watch import watch
        with get_client(sync_client=True) as client:
            from prefect.client.schemas.actions import WorkPoolCreate
            client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
        dep_id = watch.from_source(str(ROOT), "flows/watch.py:watch").deploy(
            name="team-watch", work_pool_name=pool,
            parameters={"config": {"locations": [str(raw)], "settle_s": 0, "output_root": str(tmp_path / "runs")}},
            print_next_steps=False)
        worker = Worker(pool, server.url, tmp_path / "worker.log", env=env)
        try:
            with get_client(sync_client=True) as client:
                run = client.create_flow_run_from_deployment(dep_id)
                final = wait_until(lambda: (r := client.read_flow_run(run.id)).state.is_final() and r, 120,
                                   "the worker finishing the run")
                assert final.state.is_completed(), (tmp_path / "worker.log").read_text()[-3000:]
        finally:
            worker.stop()
    # The flow ran in the worker's environment: its catalog recorded the file it announced (pending
    # until a curate run takes it: there is no curate deployment here).
    import sqlite3
    with sqlite3.connect(tmp_path / "quipu-home" / "catalog.db") as db:
        assert db.execute("SELECT path FROM files_pending").fetchall() == [(str(raw / "a.jsonl"),)]
