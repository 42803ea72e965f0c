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
from pydantic import BaseModel, ConfigDict, Field, field_validator

from catalog import registry
from catalog.files import remove_stale_temporaries, write_json_atomic
from flows.reports import publish_artifacts
from tasks.extract import ExtractConfig, extract_task
from tasks.heuristics import HeuristicsConfig, heuristics_task
from tasks.langid import LangIdConfig, langid_task
from tasks.output import OutputConfig, write_curated_task
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
    extract: ExtractConfig = ExtractConfig()
    langid: LangIdConfig = LangIdConfig()
    heuristics: HeuristicsConfig = HeuristicsConfig()
    curated: OutputConfig = OutputConfig()

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


@dataclass
class StageSpec:
    """A stage after extract: its config block's name and how to run it over the shards."""
    name: str
    task: object = None
    runner: Callable[[list[Shard], str, object], list[dict]] | None = None

    def run(self, shards: list[Shard], run_dir: str, cfg) -> list[dict]:
        if self.runner is not None:
            return self.runner(shards, run_dir, cfg)
        futures = self.task.map(shards, run_dir=unmapped(run_dir), cfg=unmapped(cfg))
        return [f.result() for f in futures]


STAGES: list[StageSpec] = [
    StageSpec("langid", langid_task),
    StageSpec("heuristics", heuristics_task),
]


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


@flow(name="curate", log_prints=True, persist_result=False)
def curate(config: CurateConfig) -> dict:
    log = get_run_logger()
    t_start = time.perf_counter()
    run_dir = Path(config.output).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    stale = remove_stale_temporaries(run_dir)
    if stale:
        log.info("removed %d temporary files left by an interrupted run", stale)
    files = expand_inputs(config.input)
    cfg_json = config.model_dump(mode="json")
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

    results = [f.result() for f in extract_task.map(files, run_dir=unmapped(rd), cfg=unmapped(config.extract))]
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
        results = spec.run([s for s in shards if s.rows > 0], rd, stage_cfg)
        report = aggregate(spec.name, results)
        if report["input_docs"] != prev_kept:
            raise AssertionError(f"{spec.name}: read {report['input_docs']} documents, previous stage kept {prev_kept}")
        reports[spec.name] = report
        write_report(run_dir, spec.name, report)
        shards = [Shard(**r["kept"]) for r in results]
        log.info("%s: %d in, %d kept, %d removed", spec.name, report["input_docs"], report["kept_docs"], report["removed_docs"])

    curated = write_curated_task(shards, str(run_dir / "curated"), config.curated)
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
    name = config.dataset or run_dir.name
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
