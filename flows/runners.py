"""Where curate's shard tasks run: threads (default) or Dask (`prefect-dask`) for many cores or machines.

- `kind: threads`: a thread pool of `workers` threads in the flow's process.
- `kind: dask` without `address`: a `distributed.LocalCluster` of `dask_workers` processes, started
  for the run and closed after it (start-up costs seconds: worth it for long runs only).
- `kind: dask` with `address` (`tcp://scheduler:8786`): an existing cluster, e.g. `dask scheduler`
  on one machine and `dask worker tcp://…` on several; every worker needs the project installed and
  must see the same paths (shared storage), since tasks pass shard paths, not data.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RunnerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["threads", "dask"] = Field("threads", description="task runner of the shard tasks")
    address: str | None = Field(None, description="dask: scheduler address of an existing cluster (tcp://host:8786)")
    dask_workers: int = Field(2, ge=1, le=1024, description="dask LocalCluster: worker processes")
    threads_per_worker: int = Field(1, ge=1, le=64, description="dask LocalCluster: threads per worker")

    @model_validator(mode="after")
    def _address_needs_dask(self):
        if self.address and self.kind != "dask":
            raise ValueError("address is a Dask scheduler address: set kind: dask as well")
        return self


def make_task_runner(runner: RunnerConfig, threads: int):
    """The Prefect task runner for `runner`; `threads` sizes the thread pool."""
    if runner.kind == "threads":
        from prefect.task_runners import ThreadPoolTaskRunner
        return ThreadPoolTaskRunner(max_workers=threads)
    import dask
    from prefect_dask import DaskTaskRunner

    # Stage tasks start helper processes (extraction runs in a child): Dask's default daemonic
    # worker processes may not have children.
    dask.config.set({"distributed.worker.daemon": False})
    if runner.address:
        return DaskTaskRunner(address=runner.address)
    return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                          cluster_kwargs={"n_workers": runner.dask_workers,
                                          "threads_per_worker": runner.threads_per_worker,
                                          "processes": True, "dashboard_address": None})


def runner_matches(runner: RunnerConfig, task_runner) -> bool:
    """Whether the running flow's task runner is the one `runner` asks for."""
    name = type(task_runner).__name__
    return (name == "DaskTaskRunner") == (runner.kind == "dask")


def flow_run_id() -> str | None:
    """The running Prefect flow run's id (recorded with the catalog run), or None outside one."""
    try:
        from prefect.runtime import flow_run
        return str(flow_run.id) if flow_run.id else None
    except Exception:
        return None
