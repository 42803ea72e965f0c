"""Services for the operating tests, started directly (no Docker): Prefect servers, workers,
a throwaway Postgres cluster, Redis, headless chromium driven over the DevTools protocol."""
from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PG_BIN = sorted(Path("/usr/lib/postgresql").glob("*/bin"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout: float, what: str, every: float = 0.5):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as e:  # not up yet
            last = e
        time.sleep(every)
    raise TimeoutError(f"{what} not reached in {timeout:.0f} s (last error: {last})")


def http_status(url: str, headers: dict | None = None) -> int:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def stop(proc: subprocess.Popen | None, timeout: float = 20) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class PrefectServer:
    """`prefect server start` on 127.0.0.1 with its own PREFECT_HOME (own SQLite unless a DB URL is given)."""

    def __init__(self, home: Path, ui: bool = False, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.home = home
        self.log_path = home / "server.log"
        home.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_API_URL": "",
                    "PREFECT_UI_ENABLED": "true" if ui else "false", "PREFECT_UI_API_URL": self.url,
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> "PrefectServer":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT, env=self.env)

        def healthy():
            if self.proc.poll() is not None:
                raise RuntimeError("server exited:\n" + self.log_path.read_text()[-3000:])
            return http_status(self.url + "/health") == 200
        wait_until(healthy, timeout, "prefect server health")
        return self

    def stop(self) -> None:
        stop(self.proc)


# What an in-process `quipu` call of an earlier test leaves in os.environ (flows/cli.py,
# flows/progress.py): a worker's runs would echo every line, or log to the console at WARNING only.
CLI_ENVIRON = ("QUIPU_VERBOSITY", "PREFECT_LOGGING_SETTINGS_PATH")


def _worker_environ() -> dict:
    """This process's environment as `make worker` would have it: without what the CLI set."""
    return {k: v for k, v in os.environ.items() if k not in CLI_ENVIRON}


class Worker:
    """A process worker; started with SIGINT restored (a background process inherits it ignored)."""

    def __init__(self, pool: str, api_url: str, log_path: Path, env: dict | None = None):
        self.log_path = log_path
        self.proc = subprocess.Popen(
            ["env", "--default-signal=INT", sys.executable, "-m", "prefect", "worker", "start",
             "--pool", pool, "--type", "process"],
            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, cwd=ROOT,
            env={**_worker_environ(), "PREFECT_API_URL": api_url, "PREFECT_WORKER_QUERY_SECONDS": "1",
                 "PREFECT_WORKER_PREFETCH_SECONDS": "5", **(env or {})})

    def stop(self) -> None:
        stop(self.proc)


class Postgres:
    """A throwaway Postgres cluster in a temp dir on a free port (as the `postgres` user when root)."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="quipu-pg-", dir="/tmp"))
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.bin = PG_BIN[-1]

    @staticmethod
    def unavailable() -> str | None:
        if not PG_BIN:
            return "Postgres server binaries not installed (apt-get install postgresql; .ci/run does)"
        if os.geteuid() == 0 and shutil.which("runuser") is None:
            return "running as root without runuser: initdb refuses root"
        if os.geteuid() == 0:
            try:
                import pwd
                pwd.getpwnam("postgres")
            except KeyError:
                return "running as root and no `postgres` user to run the cluster as"
        return None

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, cwd=self.dir)

    def start(self) -> "Postgres":
        data = self.dir / "data"
        self._run(str(self.bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self._run(str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "pg.log"), "-w", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start")
        self.psql("CREATE DATABASE prefect")
        self.psql("CREATE EXTENSION IF NOT EXISTS pg_trgm", db="prefect")
        return self

    def psql(self, sql: str, db: str = "postgres") -> str:
        out = subprocess.run([*self.as_user, str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port),
                              "-U", "postgres", "-d", db, "-tAc", sql], check=True, capture_output=True, text=True)
        return out.stdout.strip()

    @property
    def prefect_url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/prefect"

    def stop(self) -> None:
        subprocess.run([*self.as_user, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "stop"],
                       capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


class Redis:
    def __init__(self, workdir: Path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis
        wait_until(lambda: redis.Redis.from_url(self.url).ping(), 20, "redis ping")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def deployment_runs(deployment: str) -> list:
    """Flow runs of a deployment ("flow/deployment"), oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(deployment)
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))
    return sorted(runs, key=lambda r: r.created)


def wait_run_final(deployment: str, n: int, worker_log: Path, timeout: float = 150):
    """The n-th run of a deployment (oldest first), once it has finished; the worker's log on a timeout."""
    def done():
        runs = deployment_runs(deployment)
        if len(runs) >= n and runs[n - 1].state and runs[n - 1].state.is_final():
            return runs[n - 1]
        return None
    try:
        return wait_until(done, timeout, f"{deployment} run {n} finishing", every=1)
    except TimeoutError as e:
        raise TimeoutError(f"{e}\nworker log:\n{worker_log.read_text()[-4000:]}") from None


# ---- data and configs -------------------------------------------------------------------------

def small_jsonl(shared_data: Path, dest: Path, source: str, n: int, skip: int = 0) -> Path:
    lines = (shared_data / "text" / source).read_text().splitlines()[skip:skip + n]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(lines) + "\n")
    return dest


def light_curate_config(dest: Path, **extra) -> Path:
    """The demo config with only the cheap stages (extract, langid, heuristics) on."""
    from quipu.tasks.pipeline import STAGES
    cfg = yaml.safe_load((ROOT / "configs/curate/demo.yaml").read_text())
    for spec in STAGES:
        if spec.name not in ("langid", "heuristics"):
            cfg.setdefault(spec.name, {})["enabled"] = False
    cfg["workers"] = 1
    cfg.update(extra)
    dest.write_text(yaml.safe_dump(cfg))
    return dest


def deploy_file(dest: Path, curate_config: Path, pool: str, names: list[str], configs: dict | None = None) -> Path:
    """deploy/prefect.yaml with its triggers as they are, but a test pool, test configs, no schedules."""
    spec = yaml.safe_load((ROOT / "deploy/prefect.yaml").read_text())
    spec["quipu"]["configs"]["curate"] = str(curate_config)
    spec["quipu"]["configs"].update(configs or {})
    spec["deployments"] = [d for d in spec["deployments"] if d["name"] in names]
    for d in spec["deployments"]:
        d["work_pool"] = {**d["work_pool"], "name": pool}
        d.pop("schedules", None)
    dest.write_text(yaml.safe_dump(spec, sort_keys=False))
    return dest


# ---- chromium over the DevTools protocol ------------------------------------------------------

class Chromium:
    """Headless Debian chromium; `open(url)` gives a page to evaluate JavaScript in."""

    FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--window-size=1400,1000"]

    def __init__(self, workdir: Path):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if exe is None:
            raise FileNotFoundError("chromium")
        self.port = free_port()
        self.proc = subprocess.Popen([exe, *self.FLAGS, f"--user-data-dir={workdir / 'profile'}",
                                      f"--remote-debugging-port={self.port}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=open(workdir / "chromium.log", "wb"))
        wait_until(lambda: http_status(f"http://127.0.0.1:{self.port}/json/version") == 200, 60, "chromium devtools")

    def open(self, url: str) -> "Page":
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?{url}", method="PUT")
        with urllib.request.urlopen(req, timeout=10) as r:
            target = json.loads(r.read())
        return Page(target["webSocketDebuggerUrl"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Page:
    def __init__(self, ws_url: str):
        from websockets.sync.client import connect
        self.ws = connect(ws_url, max_size=64 << 20, open_timeout=20)
        self.next_id = 0

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def eval(self, js: str):
        return self.call("Runtime.evaluate", expression=js, returnByValue=True)["result"].get("value")

    def text(self) -> str:
        return self.eval("document.body ? document.body.innerText : ''") or ""

    def wait_for_text(self, needles: list[str], timeout: float = 60) -> str:
        def has_all():
            t = self.text()
            return t if all(n in t for n in needles) else None
        return wait_until(has_all, timeout, f"page text containing {needles}")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        self.ws.close()
