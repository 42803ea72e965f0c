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


def in_deployment_run() -> bool:
    """Whether this is a deployment's flow run (on a worker), not a flow called in-process (the CLI)."""
    try:
        from prefect.context import FlowRunContext
        ctx = FlowRunContext.get()
    except Exception:
        return False
    return bool(ctx and ctx.flow_run and ctx.flow_run.deployment_id)


def failed_run(error: Exception):
    """A domain error (`UserError`: a missing input, a config the data does not fit) in a
    deployment's run: one ERROR line with the fix in the run's log, and the run ends Failed with it
    as the state message, no traceback. Called in-process (the CLI) the error goes on up, to the
    CLI's one-line handler."""
    if isinstance(error, FileNotFoundError):   # an input or model path: say where relative paths start
        from pathlib import Path
        from quipu.catalog.errors import UserError
        error = UserError(f"{error} (relative paths are read from {Path.cwd()})")
    if not in_deployment_run():
        raise error
    import logging

    from prefect import get_run_logger
    from prefect.states import Failed
    get_run_logger().error("%s", error)
    _REPORTED.add(str(error))
    if not any(isinstance(f, _ReportedFailure) for f in logging.getLogger("prefect.flow_runs").filters):
        logging.getLogger("prefect.flow_runs").addFilter(_ReportedFailure())
    return Failed(message=str(error))


_REPORTED: set[str] = set()


class _ReportedFailure:
    """Prefect's engine re-raises a Failed state's message once the run is over and logs it with a
    traceback of its own internals ("Engine execution exited with unexpected exception"). For a
    failure `failed_run` already reported in one line that record says nothing new: drop it."""

    def filter(self, record) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and any(message in str(exc) for message in _REPORTED))


def checkout_warning(flow_file: str) -> str | None:
    """A warning when a deployment runs flow files of another checkout than the installed package's
    (QUIPU_ROOT pointing elsewhere): the flow code and the stages it imports may not match."""
    from pathlib import Path
    here = Path(flow_file).resolve().parents[1]
    installed = Path(__file__).resolve().parents[1]
    if here == installed:
        return None
    return (f"flow file {flow_file} is from {here}, but the installed quipu package is {installed}: "
            f"install the project in {here} (make install) or deploy with QUIPU_ROOT={installed}")

