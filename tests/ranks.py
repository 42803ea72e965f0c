"""The ranks of a torchrun job without torchrun's launcher and without a Python start per rank: real
processes (gloo between them), forked from a server process that imported torch and the trainer
once, each given the environment torchrun gives a rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT ...) and
running what `torchrun -m quipu.flows.train_dist` runs (`quipu.flows.train_dist.main`) or a test's
own function. A rank started by `python -m` imports torch and the trainer again: seconds of CPU per
rank, most of a tiny run's cost. (tests/test_trainer.py runs torchrun itself.)"""
from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from tests.ops_helpers import ROOT, free_port

# what every rank imports before its first step: imported once, in the fork server
PRELOAD = ["torch", "torch.distributed", "torch.distributed.checkpoint", "torch.distributed.fsdp", "numpy",
           "pyarrow.parquet", "quipu.flows.train_dist", "quipu.flows.config", "quipu.trainer.train",
           "quipu.trainer.prepare", "tests.ranks"]
_context: multiprocessing.context.BaseContext | None = None


def fork_context() -> multiprocessing.context.BaseContext:
    """The session's fork server context, its preload set (the server starts on the first use)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def train_dist_main(argv: list[str]) -> int:
    from quipu.flows.train_dist import main
    return main(argv)


def _rank(env: dict, out: str, err: str, target: Callable[[list[str]], int], argv: list[str]) -> None:
    os.environ.clear()
    os.environ.update(env)
    os.chdir(ROOT)
    for fd, path in ((1, out), (2, err)):     # the rank's output, as a started process's would be
        with open(path, "w") as fh:
            os.dup2(fh.fileno(), fd)
    import torch
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))   # read by OpenMP at the server's torch import
    sys.exit(target(argv))


def launch(n: int, argv: list[str], logs: Path, target: Callable[[list[str]], int] = train_dist_main,
           timeout: float = 300) -> subprocess.CompletedProcess:
    """n ranks of `target(argv)` (default: quipu.flows.train_dist's main); a rank that fails ends the
    others (as torchrun does). Returns the ranks' outputs joined and the first failing exit code
    (negative: the signal that ended it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "GROUP_RANK": "0"}
    paths = [(logs / f"rank-{r}.out", logs / f"rank-{r}.err") for r in range(n)]
    ctx = fork_context()
    procs = [ctx.Process(target=_rank, args=({**env, "RANK": str(r), "LOCAL_RANK": str(r)}, str(o), str(e), target,
                                             list(argv))) for r, (o, e) in enumerate(paths)]
    for p in procs:
        p.start()
    deadline = time.time() + timeout
    try:
        while any(p.exitcode is None for p in procs):
            if any(p.exitcode not in (None, 0) for p in procs) or time.time() > deadline:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.exitcode is None:
                p.kill()
            p.join()
    out = "".join(o.read_text() for o, _ in paths)
    err = "".join(e.read_text() for _, e in paths)
    rc = next((p.exitcode for p in procs if p.exitcode != 0), 0)
    return subprocess.CompletedProcess(["train_dist", *argv], rc, out, err)


def config_file(cfg: dict, folder: Path) -> Path:
    """The training config as a file in `folder` (JSON is YAML), named after its output."""
    path = folder / f"cfg-{abs(hash(cfg['output']))}.json"
    path.write_text(json.dumps(cfg))
    return path


def launch_ranks(n: int, cfg: dict, tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node n -m quipu.flows.train_dist CFG ARGS`, its ranks started by `launch`."""
    return launch(n, [str(config_file(cfg, tmp_path)), *args], tmp_path, timeout=timeout)


def stop_fork_server() -> None:
    """At the session's end: the fork server stopped, and the folder of its socket (under the
    session's TMPDIR, removed next) removed now rather than by multiprocessing at exit, when it is gone."""
    if _context is None:
        return
    from multiprocessing import forkserver, util
    forkserver._forkserver._stop()
    for finalizer in list(util._finalizer_registry.values()):
        if finalizer._callback is util._remove_temp_dir:
            finalizer()
