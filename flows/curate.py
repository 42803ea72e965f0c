"""The `curate` flow: extract → the stages of quipu.tasks.pipeline → curated parquet shards.

Every stage runs through `driver.run_stage` with its per-shard phases as Prefect tasks mapped over
shards (the UI shows stage-by-stage progress); tasks take and return shard paths with hashes,
never documents. A stage's results are summed into `OUT/<stage>/report.json`, checked
(`input = kept + removed`), shown as artifacts and recorded in the catalog.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from prefect import flow, get_run_logger, task, unmapped
from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from quipu.catalog import registry
from quipu.catalog.files import write_json_atomic
from quipu.catalog.names import check_name, name_from
from quipu.catalog.ownership import claim, identity, output_lock
from quipu.flows.dataset_card import write_dataset_card
from quipu.flows.html_report import publish_charts
from quipu.flows.progress import StageProgress, say
from quipu.flows.reports import RunProgress, publish_artifacts
from quipu.flows.runners import RunnerConfig, flow_run_id, make_task_runner, runner_matches
from quipu.tasks import driver
from quipu.tasks.driver import StageRef, aggregate, write_report
from quipu.tasks.extract import ExtractConfig, ExtractResult, extract_file
from quipu.tasks.output import OutputConfig, write_curated
from quipu.tasks.pipeline import STAGES
from quipu.tasks.readers import expand_inputs
from quipu.tasks.stage import QUIPU_VERSION, RunContext, Shard, ShardResult


class CurateSettings(BaseModel):
    """What a curate run is besides its stages: inputs, output, dataset name, parallelism."""
    model_config = ConfigDict(extra="forbid")
    input: list[str] = Field(default_factory=list, description="paths, globs or fsspec URLs (.warc[.gz], .jsonl[.gz|.zst], .parquet)")
    output: str = Field("runs/curate", description="run directory")
    dataset: str | None = Field(None, description="catalog name of the curated dataset (default: the output directory's name); also names the dedup index")
    workers: int = Field(2, ge=1, le=256, description="parallel shard tasks (threads)")
    artifact_prefix: str = Field("curate", pattern=r"^[a-z0-9-]+$", description="prefix of the Prefect artifact keys")
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description="where shard tasks run: threads, or Dask (LocalCluster or a scheduler address)")
    extract: ExtractConfig = Field(default_factory=ExtractConfig)

    @field_validator("dataset")
    @classmethod
    def _safe_dataset(cls, v):
        return None if v is None else check_name(v, "dataset name")

    @field_validator("input", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v

    @field_validator("extract")
    @classmethod
    def _extract_on(cls, v: ExtractConfig):
        if not v.enabled:
            raise ValueError("the extract stage reads the inputs and cannot be switched off")
        return v

    def context(self, run_id: str | None = None) -> RunContext:
        """The run as its stages see it: the output folder, the dataset (naming the dedup index)."""
        return RunContext(run_dir=str(Path(self.output).resolve()), dataset=self.dataset, run_id=run_id)

    def stage_ref(self, name: str, run_id: str | None = None) -> StageRef:
        return StageRef(name, getattr(self, name), self.context(run_id))


# One block per stage of the pipeline definition, named as the stage, then the curated output.
CurateConfig = create_model(
    "CurateConfig", __base__=CurateSettings, __doc__="One block per stage, named as the stage; every block has `enabled`.",
    **{s.name: (s.Config, Field(default_factory=s.Config)) for s in STAGES},
    curated=(OutputConfig, Field(default_factory=OutputConfig)))


def enabled_stages(config: CurateSettings) -> list[str]:
    return [s.name for s in STAGES if getattr(config, s.name).enabled]


def preflight(config: CurateSettings) -> None:
    """Load what the enabled stages need (e.g. a model file) so that a missing or corrupt one fails
    with a message naming it before any document is read."""
    for name in enabled_stages(config):
        config.stage_ref(name).build().check()


# ---- Prefect tasks: the phases of the stage contract (quipu.tasks.driver), mapped over shards ----

@task(name="extract", task_run_name="extract-{path}", retries=1, retry_delay_seconds=1)
def extract_task(path: str, run_dir: str, cfg: ExtractConfig) -> ExtractResult:
    return extract_file(path, run_dir, cfg)


@task(name="stage-scan", task_run_name="{ref.name}-scan-{shard.name}", retries=1, retry_delay_seconds=1)
def scan_task(ref: StageRef, shard: Shard) -> driver.Scan:
    return driver.scan_shard(ref, shard)


@task(name="stage-plan", task_run_name="{ref.name}-plan", retries=0)
def plan_task(ref: StageRef, scans: list[driver.Scan] | None):
    return driver.plan_stage(ref, scans)


@task(name="stage-plan-part", task_run_name="{ref.name}-plan-{partition[p]}", retries=1, retry_delay_seconds=1)
def plan_part_task(ref: StageRef, scans: list[driver.Scan] | None, partition):
    return driver.plan_part(ref, scans, partition)


@task(name="stage-combine", task_run_name="{ref.name}-combine", retries=0)
def combine_task(ref: StageRef, scans: list[driver.Scan] | None, partials: list):
    return driver.combine_stage(ref, scans, partials)


@task(name="stage-process", task_run_name="{ref.name}-{shard.name}", retries=1, retry_delay_seconds=1)
def process_task(ref: StageRef, shard: Shard, plan) -> ShardResult:
    return driver.process_one(ref, shard, plan)


@task(name="stage-commit", task_run_name="{ref.name}-commit", retries=0)
def commit_task(ref: StageRef, scans: list[driver.Scan] | None, plan):
    return driver.commit_stage(ref, scans, plan)


@task(name="write-curated", retries=1, retry_delay_seconds=1)
def write_curated_task(shards: list[Shard], out_dir: str, cfg: OutputConfig) -> list[Shard]:
    return write_curated(shards, out_dir, cfg)


class PrefectPhases:
    """`driver.run_stage`'s per-shard phases as Prefect tasks (the UI shows them shard by shard)."""

    def scan(self, ref: StageRef, shards: list[Shard]) -> list[driver.Scan]:
        return collect(scan_task.map(ref=unmapped(ref), shard=shards))

    def plan(self, ref: StageRef, scans):
        parts = driver.plan_partitions(ref, scans)   # cheap: what to split the plan into
        if parts is None:
            return plan_task(ref, scans)
        partials = collect(plan_part_task.map(ref=unmapped(ref), scans=unmapped(scans), partition=parts))
        return combine_task(ref, scans, partials)

    def process(self, ref: StageRef, shards: list[Shard], plan, progress=None) -> list[ShardResult]:
        return collect(process_task.map(ref=unmapped(ref), shard=shards, plan=unmapped(plan)), progress)

    def commit(self, ref: StageRef, scans, plan):
        return commit_task(ref, scans, plan)


def collect(futures, progress: Callable[[object], object] | None = None) -> list:
    """Results in input order; `progress(result)` after each (terminal and UI progress)."""
    results = []
    for f in futures:
        results.append(f.result())
        if progress is not None:
            progress(results[-1])
    return results


class Progress:
    """One curate run's progress: the UI's progress artifact and the terminal's lines, per stage."""

    def __init__(self, prefix: str, stages: list[str]):
        self.artifact = RunProgress(prefix, stages)
        self.stage: StageProgress | None = None

    def start(self, name: str, shards: int, docs: int | None) -> Callable[[object], None]:
        self.artifact.update(name, 0.0)
        self.stage = StageProgress(name, shards, docs)

        def on_result(r) -> None:   # a ShardResult, or an ExtractResult for extract
            self.stage.advance(r.input_docs, r.skipped)
            self.artifact.update(name, self.stage.done_shards / max(1, shards))
        return on_result

    def finish(self, report: dict) -> None:
        self.stage.finish(report["kept_docs"], report["removed_docs"], report["seconds"])


def aggregate_extract(results: list[ExtractResult]) -> dict:
    report = aggregate("extract", results)
    report["records_read"] = sum(r.records_read for r in results)
    report["quarantined"] = sum(r.quarantined for r in results)
    q: dict[str, int] = {}
    for r in results:
        for k, n in r.quarantine_by_reason.items():
            q[k] = q.get(k, 0) + n
    report["quarantine_by_reason"] = dict(sorted(q.items(), key=lambda kv: -kv[1]))
    report["files"] = [{"source": r.source, "records_read": r.records_read, "documents": r.input_docs,
                        "kept": r.kept_docs, "quarantined": r.quarantined, "skipped_records": r.skipped_records}
                       for r in results]
    if report["input_docs"] + report["quarantined"] != report["records_read"]:
        raise AssertionError("extract: documents + quarantined != records read")
    return report


# What does not change a run's output, so a rerun that changes it still resumes the same run.
NOT_IDENTITY = ("workers", "runner", "artifact_prefix")


def owned_entries() -> list[str]:
    """What a curate run writes into its output folder, and so what `--overwrite` clears."""
    return ["extract", *(s.name for s in STAGES), "curated", ".curated.json", "quarantine", "run.json", "README.md"]


@flow(name="curate", log_prints=True, persist_result=False)
def curate(config: CurateConfig, overwrite: bool = False) -> dict:
    from prefect.context import FlowRunContext
    ctx = FlowRunContext.get()
    if ctx is not None and not runner_matches(config.runner, ctx.task_runner):
        # A deployment run whose form asks for another task runner: run on it, as a subflow.
        return curate.with_options(task_runner=make_task_runner(config.runner, config.workers))(config, overwrite)
    log = get_run_logger()
    t_start = time.perf_counter()
    run_dir = Path(config.output).resolve()
    files = expand_inputs(config.input)
    cfg_json = config.model_dump(mode="json")
    with output_lock(run_dir):   # one run at a time per output folder, for the whole run
        stale = claim(run_dir, identity(files, cfg_json, NOT_IDENTITY), owned_entries(), overwrite)
        if stale:
            log.info("removed %d temporary files left by an interrupted run", stale)
        # holding the lock, any run still `running` into this output is a killed one
        registry.mark_stale_runs_crashed("curate", output=str(run_dir))
        run_id = registry.start_run("curate", cfg_json, str(run_dir), flow_run_id())
        try:
            summary = _curate(config, run_dir, files, run_id, log)
        except BaseException:
            registry.finish_run(run_id, "failed")
            raise
        summary["seconds"] = round(time.perf_counter() - t_start, 2)
        write_json_atomic(config.context().summary, summary)
        registry.finish_run(run_id, "completed", {k: v for k, v in summary.items() if k != "config"})
    from quipu.flows.events import curate_completed
    summary["event"] = curate_completed(summary, log)   # quipu.curate.completed: the trigger that trains on it
    return summary


def _curate(config: CurateSettings, run_dir: Path, files: list[str], run_id: str, log) -> dict:
    rd = str(run_dir)
    reports: dict[str, dict] = {}

    preflight(config)  # a missing or corrupt model fails here, before extract reads anything
    stages = enabled_stages(config)
    progress = Progress(config.artifact_prefix, ["extract", *stages, "curated"])
    say(f"curating {len(files)} input files into {rd}: extract, {', '.join(stages)}")
    on_file = progress.start("extract", len(files), None)
    results = collect(extract_task.map(files, run_dir=unmapped(rd), cfg=unmapped(config.extract)), on_file)
    report = aggregate_extract(results)
    progress.finish(report)
    reports["extract"] = report
    write_report(rd, "extract", report)
    shards = [s for r in results for s in r.kept_shards]
    log.info("extract: %d records read, %d documents, %d kept, %d quarantined",
             report["records_read"], report["input_docs"], report["kept_docs"], report["quarantined"])

    for name in stages:
        prev_kept = sum(s.rows for s in shards)
        todo = [s for s in shards if s.rows > 0]
        stage_results, report = driver.run_stage(config.stage_ref(name, run_id), todo, PrefectPhases(),
                                                 progress.start(name, len(todo), prev_kept))
        progress.finish(report)
        if report["input_docs"] != prev_kept:
            raise AssertionError(f"{name}: read {report['input_docs']} documents, previous stage kept {prev_kept}")
        reports[name] = report
        write_report(rd, name, report)
        shards = [r.kept for r in stage_results]
        log.info("%s: %d in, %d kept, %d removed", name, report["input_docs"], report["kept_docs"], report["removed_docs"])

    progress.artifact.update("curated", 0.0)
    curated = write_curated_task(shards, str(config.context().curated), config.curated)
    progress.artifact.done()
    summary = {
        "run_id": run_id, "output": rd, "inputs": files,
        "records_read": reports["extract"]["records_read"], "quarantined": reports["extract"]["quarantined"],
        "quarantine_by_reason": reports["extract"]["quarantine_by_reason"],
        "stages": [{"name": name, "input_docs": r["input_docs"], "kept_docs": r["kept_docs"],
                    "removed_docs": r["removed_docs"], "removed_by_reason": r["removed_by_reason"],
                    "edits": {k: n for k, n in r["stats"].get("edits", {}).items() if n},
                    "seconds": r["seconds"], "reused_shards": r.get("reused_shards", 0)} for name, r in reports.items()],
        "curated": {"rows": sum(p.rows for p in curated), "shards": [p.path for p in curated]},
        "config": config.model_dump(mode="json"),
    }
    write_dataset_card(summary, run_dir, config.dataset or name_from(run_dir.name), config.curated.license,
                       QUIPU_VERSION)
    _register(config, run_dir, run_id, files, reports, curated, results_extract=reports["extract"])
    publish_artifacts(summary, reports, config.artifact_prefix)
    publish_charts(summary, reports, config.artifact_prefix)
    return summary


def _register(config: CurateConfig, run_dir: Path, run_id: str, files: list[str], reports: dict,
              curated: list[Shard], results_extract: dict) -> None:
    for name, report in reports.items():
        registry.save_report(run_id, name, report)
    name = config.dataset or name_from(run_dir.name)
    ds_id = registry.register_dataset(
        name, "curated", str(config.context().curated), run_id,
        [{"path": p.path, "rows": p.rows, "bytes": p.bytes, "sha256": p.sha256} for p in curated],
        info={"stages": list(reports)})
    qdir = config.context().quarantine
    if qdir.exists():
        import pyarrow.parquet as pq
        from quipu.catalog.files import sha256_file
        qshards = [{"path": str(p), "rows": pq.ParquetFile(p).metadata.num_rows, "bytes": p.stat().st_size,
                    "sha256": sha256_file(p)} for p in sorted(qdir.glob("*.parquet"))]
        registry.register_dataset(f"{name}/quarantine", "quarantine", str(qdir), run_id, qshards)
    registry.record_lineage(run_id, "input", [{"path": f["source"]} for f in results_extract["files"]])
    registry.record_lineage(run_id, "output", [{"path": str(config.context().curated), "dataset_id": ds_id}])
