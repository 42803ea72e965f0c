"""The `curate` flow: extract → langid → heuristics → … → curated parquet shards.

Every stage is a Prefect task mapped over shards (the UI shows stage-by-stage progress); tasks
take and return shard paths with hashes, never documents. A stage's results are summed into
`OUT/<stage>/report.json`, checked (`input = kept + removed`), shown as artifacts and recorded in
the catalog. New stages are added to `STAGES`, in pipeline order.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from prefect import flow, get_run_logger, unmapped
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from catalog import registry
from catalog.files import write_json_atomic
from catalog.names import check_name, name_from
from catalog.ownership import claim, identity, output_lock
from flows.reports import RunProgress, publish_artifacts
from flows.runners import RunnerConfig, make_task_runner, runner_matches
from tasks.decontam import DecontamConfig, check_decontam, run_decontam
from tasks.dedup import DedupConfig, check_dedup
from tasks.dedup_tasks import run_dedup_stage
from tasks.extract import ExtractConfig, extract_task
from tasks.heuristics import HeuristicsConfig, heuristics_task
from tasks.langid import LangIdConfig, langid_task
from tasks.output import OutputConfig, write_curated_task
from tasks.perplexity import PerplexityConfig, check_perplexity, run_perplexity
from tasks.quality import QualityConfig, check_quality, run_quality
from tasks.readers import expand_inputs
from tasks.stage import Shard, aggregate, write_report


class CurateConfig(BaseModel):
    """One block per stage, named as the stage; every block has `enabled`."""
    model_config = ConfigDict(extra="forbid")
    input: list[str] = Field(default_factory=list, description="paths, globs or fsspec URLs (.warc[.gz], .jsonl[.gz|.zst], .parquet)")
    output: str = Field("runs/curate", description="run directory")
    dataset: str | None = Field(None, description="catalog name of the curated dataset (default: the output directory's name)")
    workers: int = Field(2, ge=1, le=256, description="parallel shard tasks (threads)")
    artifact_prefix: str = Field("curate", pattern=r"^[a-z0-9-]+$", description="prefix of the Prefect artifact keys")
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description="where shard tasks run: threads, or Dask (LocalCluster or a scheduler address)")
    extract: ExtractConfig = ExtractConfig()
    langid: LangIdConfig = LangIdConfig()
    heuristics: HeuristicsConfig = HeuristicsConfig()
    quality: QualityConfig = QualityConfig()
    dedup: DedupConfig = DedupConfig()
    decontam: DecontamConfig = DecontamConfig()
    perplexity: PerplexityConfig = PerplexityConfig()
    curated: OutputConfig = OutputConfig()

    @field_validator("dataset")
    @classmethod
    def _safe_dataset(cls, v):
        return None if v is None else check_name(v, "dataset name")

    @field_validator("input", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _dedup_index_name(self):
        # the dedup index is per dataset: runs into other output folders share it by naming the dataset
        self.dedup._default_index = self.dataset
        return self

    @field_validator("extract")
    @classmethod
    def _extract_on(cls, v: ExtractConfig):
        if not v.enabled:
            raise ValueError("the extract stage reads the inputs and cannot be switched off")
        return v


@dataclass
class StageSpec:
    """A stage after extract: its config block's name and how to run it over the shards."""
    name: str
    task: object = None
    runner: Callable[[list[Shard], str, object], list[dict]] | None = None
    check: Callable[[object], object] | None = None   # loads models etc. before any document is read

    def run(self, shards: list[Shard], run_dir: str, cfg, progress: Callable[[float], object] | None = None) -> list[dict]:
        if self.runner is not None:
            return self.runner(shards, run_dir, cfg)
        return collect(self.task.map(shards, run_dir=unmapped(run_dir), cfg=unmapped(cfg)), progress)


def collect(futures, progress: Callable[[float], object] | None = None) -> list[dict]:
    """Results in input order; `progress(fraction done)` after each (the UI's progress artifact)."""
    results = []
    for i, f in enumerate(futures, 1):
        results.append(f.result())
        if progress is not None:
            progress(i / len(futures))
    return results


STAGES: list[StageSpec] = [
    StageSpec("langid", langid_task),
    StageSpec("heuristics", heuristics_task),
    StageSpec("quality", runner=run_quality, check=check_quality),
    StageSpec("dedup", runner=run_dedup_stage, check=check_dedup),   # global: signatures, plan, split, commit
    StageSpec("decontam", runner=run_decontam, check=check_decontam),
    StageSpec("perplexity", runner=run_perplexity, check=check_perplexity),   # last: scores what is kept
]


def preflight(config: CurateConfig) -> None:
    """Load what the enabled stages need (e.g. a model file) so that a missing or corrupt one fails
    with a message naming it before any document is read."""
    for spec in STAGES:
        if spec.check is not None and getattr(config, spec.name).enabled:
            spec.check(getattr(config, spec.name))


def aggregate_extract(results: list[dict]) -> dict:
    report = aggregate("extract", results)
    report["records_read"] = sum(r["records_read"] for r in results)
    report["quarantined"] = sum(r["quarantined"] for r in results)
    q: dict[str, int] = {}
    for r in results:
        for k, n in r["quarantine_by_reason"].items():
            q[k] = q.get(k, 0) + n
    report["quarantine_by_reason"] = dict(sorted(q.items(), key=lambda kv: -kv[1]))
    report["files"] = [{"source": r["source"], "records_read": r["records_read"], "documents": r["input_docs"],
                        "kept": r["kept_docs"], "quarantined": r["quarantined"], "skipped_records": r["skipped_records"]}
                       for r in results]
    if report["input_docs"] + report["quarantined"] != report["records_read"]:
        raise AssertionError("extract: documents + quarantined != records read")
    return report


def _flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run
        return str(flow_run.id) if flow_run.id else None
    except Exception:
        return None


# What does not change a run's output, so a rerun that changes it still resumes the same run.
NOT_IDENTITY = ("workers", "runner", "artifact_prefix")


def owned_entries() -> list[str]:
    """What a curate run writes into its output folder, and so what `--overwrite` clears."""
    return ["extract", *(s.name for s in STAGES), "curated", "quarantine", "run.json"]


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
        run_id = registry.start_run("curate", cfg_json, str(run_dir), _flow_run_id())
        try:
            summary = _curate(config, run_dir, files, run_id, log)
        except BaseException:
            registry.finish_run(run_id, "failed")
            raise
        summary["seconds"] = round(time.perf_counter() - t_start, 2)
        write_json_atomic(run_dir / "run.json", summary)
        registry.finish_run(run_id, "completed", {k: v for k, v in summary.items() if k != "config"})
    return summary


def _curate(config: CurateConfig, run_dir: Path, files: list[str], run_id: str, log) -> dict:
    rd = str(run_dir)
    reports: dict[str, dict] = {}

    preflight(config)  # a missing or corrupt model fails here, before extract reads anything
    progress = RunProgress(config.artifact_prefix, ["extract"] + [s.name for s in STAGES if getattr(config, s.name).enabled] + ["curated"])
    results = collect(extract_task.map(files, run_dir=unmapped(rd), cfg=unmapped(config.extract)),
                      lambda f: progress.update("extract", f))
    report = aggregate_extract(results)
    reports["extract"] = report
    write_report(run_dir, "extract", report)
    shards = [Shard(**s) for r in results for s in r["kept_shards"]]
    log.info("extract: %d records read, %d documents, %d kept, %d quarantined",
             report["records_read"], report["input_docs"], report["kept_docs"], report["quarantined"])

    for spec in STAGES:
        stage_cfg = getattr(config, spec.name)
        if not stage_cfg.enabled:
            continue
        prev_kept = sum(s.rows for s in shards)
        progress.update(spec.name, 0.0)
        results = spec.run([s for s in shards if s.rows > 0], rd, stage_cfg, lambda f, n=spec.name: progress.update(n, f))
        report = aggregate(spec.name, results)
        if report["input_docs"] != prev_kept:
            raise AssertionError(f"{spec.name}: read {report['input_docs']} documents, previous stage kept {prev_kept}")
        reports[spec.name] = report
        write_report(run_dir, spec.name, report)
        shards = [Shard(**r["kept"]) for r in results]
        log.info("%s: %d in, %d kept, %d removed", spec.name, report["input_docs"], report["kept_docs"], report["removed_docs"])

    progress.update("curated", 0.0)
    curated = write_curated_task(shards, str(run_dir / "curated"), config.curated)
    progress.done()
    summary = {
        "run_id": run_id, "output": rd, "inputs": files,
        "records_read": reports["extract"]["records_read"], "quarantined": reports["extract"]["quarantined"],
        "quarantine_by_reason": reports["extract"]["quarantine_by_reason"],
        "stages": [{"name": name, "input_docs": r["input_docs"], "kept_docs": r["kept_docs"],
                    "removed_docs": r["removed_docs"], "removed_by_reason": r["removed_by_reason"],
                    "seconds": r["seconds"]} for name, r in reports.items()],
        "curated": {"rows": sum(p.rows for p in curated), "shards": [p.path for p in curated]},
        "config": config.model_dump(mode="json"),
    }
    _register(config, run_dir, run_id, files, reports, curated, results_extract=reports["extract"])
    publish_artifacts(summary, reports, config.artifact_prefix)
    return summary


def _register(config: CurateConfig, run_dir: Path, run_id: str, files: list[str], reports: dict,
              curated: list[Shard], results_extract: dict) -> None:
    for name, report in reports.items():
        registry.save_report(run_id, name, report)
    name = config.dataset or name_from(run_dir.name)
    ds_id = registry.register_dataset(
        name, "curated", str(run_dir / "curated"), run_id,
        [{"path": p.path, "rows": p.rows, "bytes": p.bytes, "sha256": p.sha256} for p in curated],
        info={"stages": list(reports)})
    qdir = run_dir / "quarantine"
    if qdir.exists():
        import pyarrow.parquet as pq
        from catalog.files import sha256_file
        qshards = [{"path": str(p), "rows": pq.ParquetFile(p).metadata.num_rows, "bytes": p.stat().st_size,
                    "sha256": sha256_file(p)} for p in sorted(qdir.glob("*.parquet"))]
        registry.register_dataset(f"{name}/quarantine", "quarantine", str(qdir), run_id, qshards)
    registry.record_lineage(run_id, "input", [{"path": f["source"]} for f in results_extract["files"]])
    registry.record_lineage(run_id, "output", [{"path": str(run_dir / "curated"), "dataset_id": ds_id}])
