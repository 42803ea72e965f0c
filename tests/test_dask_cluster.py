"""Distributed: the curate flow on a real Dask cluster (a `dask scheduler` and two `dask worker`
processes started here, as on several machines) writes the same curated bytes as the thread
runner, with dedup's plan partitions running on the workers."""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT
from tests.ops_helpers import light_curate_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dask_cluster(tmp_path):
    """`dask scheduler` + two `dask worker` processes on 127.0.0.1, each with this session's
    environment (PREFECT_API_URL, QUIPU_HOME, TMPDIR): what every machine of a cluster needs."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}   # stage tasks may start children
    logs = tmp_path / "dask-logs"
    logs.mkdir()
    procs = [subprocess.Popen([os.path.join(bin_dir, "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], cwd=ROOT, env=env, stdout=open(logs / "scheduler.log", "wb"),
                              stderr=subprocess.STDOUT)]
    for i in range(2):
        procs.append(subprocess.Popen([os.path.join(bin_dir, "dask"), "worker", address, "--nthreads", "1",
                                       "--host", "127.0.0.1", "--no-dashboard", "--name", f"w{i}",
                                       "--local-directory", str(tmp_path / f"w{i}")],
                                      cwd=ROOT, env=env, stdout=open(logs / f"worker{i}.log", "wb"),
                                      stderr=subprocess.STDOUT))
    from distributed import Client
    try:
        deadline = time.time() + 120
        while True:
            try:
                with Client(address, timeout=10) as client:
                    client.wait_for_workers(2, timeout=max(1, deadline - time.time()))
                    pids = set(client.run(os.getpid).values())
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(1)
        yield address, pids
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()


def _docs(shared_data, n: int) -> list[dict]:
    rows = []
    for name in ("en_nltk_abc_news.jsonl", "es_nltk_cess_esp_news.jsonl"):
        with open(shared_data / "text" / name) as fh:
            rows += [json.loads(line) for _, line in zip(range(n), fh)]
    rng = random.Random(3)
    copies = []
    for d in rows[: n // 2]:
        words = d["text"].split()
        words[rng.randrange(len(words))] = "cambiado"
        copies.append({"id": d["id"] + "#near", "text": " ".join(words)})
        copies.append({"id": d["id"] + "#exact", "text": d["text"]})
    return [{"id": r["id"], "text": r["text"]} for r in rows] + copies


@pytest.mark.slow
def test_curate_on_dask_cluster_matches_threads(prefect_server, shared_data, tmp_path, dask_cluster):
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig
    from quipu.flows.curate_cli import run_curate
    address, worker_pids = dask_cluster
    inp = tmp_path / "in"
    inp.mkdir()
    rows = _docs(shared_data, 40)
    for k in range(3):   # three files: extract tasks in parallel too
        (inp / f"part-{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[k::3]))
    cfg_file = light_curate_config(tmp_path / "curate.yaml")
    outputs = {}
    for kind in ("threads", "dask"):
        over = [f"input=[{inp}]", f"output={tmp_path / kind}", "extract.shard_mb=0.05", "dedup.enabled=true",
                "dedup.partitions=4", "dedup.backend=none", "heuristics.enabled=false", "workers=2",
                "keep_intermediate=true", "keep_work_files=true"]   # dedup/kept and the plan markers stay
        if kind == "dask":
            over += ["runner.kind=dask", f"runner.address={address}"]
        assert run_curate(load_config(CurateConfig, cfg_file, over)) == 0
        outputs[kind] = {str(p.relative_to(tmp_path / kind)): p.read_bytes()
                         for sub in ("curated", "dedup/kept", "dedup/removed")
                         for p in sorted((tmp_path / kind / sub).glob("*.parquet"))}
    report = json.loads((tmp_path / "dask" / "dedup" / "report.json").read_text())
    assert report["removed_by_reason"]["exact_dup"] >= 15 and report["removed_by_reason"]["near_dup"] >= 15
    assert len([k for k in outputs["threads"] if k.startswith("dedup/kept")]) >= 2
    assert outputs["threads"] == outputs["dask"]
    ran_in = [json.loads(p.read_text())["ran_in"]["pid"]
              for p in sorted((tmp_path / "dask" / "dedup" / "_shards" / "partitions").glob("*.json"))]
    assert len(ran_in) == 4 and set(ran_in) <= worker_pids and os.getpid() not in ran_in
