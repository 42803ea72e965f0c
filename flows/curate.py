"""The `curate` flow: extract → the stages of quipu.tasks.pipeline → curated parquet shards.

Extract runs one Prefect task per work unit (small input files packed together, see
`extract.pack_mb`); the stages run through `driver.run_pipeline`, segment by segment (consecutive
per-document stages fused into one pass per shard), with the per-shard phases as Prefect tasks
mapped over shards; tasks take and return shard paths with hashes, never documents. A stage's
results are summed into `OUT/<stage>/report.json`, checked (`input = kept + removed`), shown as
artifacts and recorded in the catalog. When the run completes, the intermediate `kept/` copies
and the global stages' work files are deleted (unless `keep_intermediate` / `keep_work_files`).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Callable

from prefect import flow, get_run_logger, task, unmapped
from pydantic import Field, WithJsonSchema

from quipu.catalog import registry
from quipu.catalog.errors import UserError
from quipu.catalog.files import read_json, sha256_file, write_json_atomic
from quipu.catalog.names import name_from
from quipu.catalog.ownership import claim, identity, output_lock, record_written
from quipu.flows.curate_config import (CurateConfig, CurateSettings, enabled_stages, form_schema,  # noqa: F401  (importers use this module)
                                       from_form)
from quipu.flows.dataset_card import write_dataset_card
from quipu.flows.html_report import publish_charts
from quipu.flows.progress import StageProgress, say
from quipu.flows.reports import RunProgress, publish_artifacts
from quipu.flows.run_names import curate_name
from quipu.flows.runners import checkout_warning, failed_run, flow_run_id, make_task_runner, runner_matches
from quipu.tasks import driver
from quipu.tasks.driver import StageRef, write_report
from quipu.tasks.extract import ExtractConfig, ExtractResult, Input, extract_work, input_path, pack_inputs, run_extract
from quipu.tasks.output import OutputConfig, curated_marker, write_curated
from quipu.tasks.pipeline import STAGES
from quipu.tasks import reading
from quipu.tasks.reading import expand_inputs
from quipu.tasks.stage import QUIPU_VERSION, PhaseResult, RunContext, Shard, ShardResult


def preflight(config: CurateSettings) -> None:
    """Load what the enabled stages need (e.g. a model file) so that a missing or corrupt one fails
    with a message naming it before any document is read."""
    for name in enabled_stages(config):
        config.stage_ref(name).build().check()


# ---- Prefect tasks: the phases of the stage contract (quipu.tasks.driver), mapped over shards ----

def _unit_run_name() -> str:
    from prefect.runtime import task_run
    items = task_run.parameters["items"]
    first = items[0]
    part = f"[{first.describe()}]" if not isinstance(first, str) else ""
    return f"extract-{Path(input_path(first)).name}{part}" + (f"+{len(items) - 1}" if len(items) > 1 else "")


@task(name="extract", task_run_name=_unit_run_name, retries=1, retry_delay_seconds=1)
def extract_task(items: list[Input], run: RunContext, cfg: ExtractConfig) -> ExtractResult | PhaseResult:
    """A work unit, or one part of a long document (a long PDF's page range: combined into the
    document by run_extract)."""
    return extract_work(items, run.run_dir, cfg, run.removed_schema)


@task(name="stage-scan", task_run_name="{ref.name}-scan-{shard.name}", retries=1, retry_delay_seconds=1)
def scan_task(ref: StageRef, shard: Shard) -> driver.Scan:
    return driver.scan_shard(ref, shard)


@task(name="stage-plan", task_run_name="{ref.name}-plan", retries=0)
def plan_task(ref: StageRef, scans: list[driver.Scan] | None):
    return driver.plan_stage(ref, scans)


@task(name="stage-plan-part", task_run_name="{ref.name}-plan-{partition.p}", retries=1, retry_delay_seconds=1)
def plan_part_task(ref: StageRef, scans: list[driver.Scan] | None, partition):
    return driver.plan_part(ref, scans, partition)


@task(name="stage-combine", task_run_name="{ref.name}-combine", retries=0)
def combine_task(ref: StageRef, scans: list[driver.Scan] | None, partials: list):
    return driver.combine_stage(ref, scans, partials)


@task(name="stage-process", task_run_name="{segment.name}-{shard.name}", retries=1, retry_delay_seconds=1)
def process_task(segment: driver.Segment, shard: Shard, plans: list) -> list[ShardResult]:
    return driver.process_one(segment, shard, plans)


@task(name="stage-commit", task_run_name="{ref.name}-commit", retries=0)
def commit_task(ref: StageRef, scans: list[driver.Scan] | None, plan):
    return driver.commit_stage(ref, scans, plan)


@task(name="write-curated", retries=1, retry_delay_seconds=1)
def write_curated_task(shards: list[Shard], out_dir: str, cfg: OutputConfig) -> list[Shard]:
    return write_curated(shards, out_dir, cfg)


class PrefectPhases:
    """`driver.run_segment`'s per-shard phases, and extract's units (`extract.run_extract`), as
    Prefect tasks (the UI shows them shard by shard)."""

    def extract(self, units: list[list[Input]], run: RunContext, cfg: ExtractConfig,
                on_result: Callable[[ExtractResult], object]) -> list[ExtractResult]:
        return collect(extract_task.map(units, run=unmapped(run), cfg=unmapped(cfg)), on_result)

    def scan(self, ref: StageRef, shards: list[Shard]) -> list[driver.Scan]:
        return collect(scan_task.map(ref=unmapped(ref), shard=shards))

    def plan(self, ref: StageRef, scans):
        parts = driver.plan_partitions(ref, scans)   # cheap: what to split the plan into
        if parts is None:
            return plan_task(ref, scans)
        partials = collect(plan_part_task.map(ref=unmapped(ref), scans=unmapped(scans), partition=parts))
        return combine_task(ref, scans, partials)

    def process(self, segment: driver.Segment, shards: list[Shard], plans: list,
                progress: driver.Progress = driver.NO_PROGRESS) -> list[list[ShardResult]]:
        futures = process_task.map(segment=unmapped(segment), shard=shards, plans=unmapped(plans))
        return collect(futures, lambda results: [progress.shard_done(r) for r in results])

    def commit(self, ref: StageRef, scans, plan):
        return commit_task(ref, scans, plan)


def collect(futures, on_result: Callable[[object], object] | None = None) -> list:
    """Results in input order; `on_result(result)` as each is collected."""
    results = []
    for f in futures:
        results.append(f.result())
        if on_result is not None:
            on_result(results[-1])
    return results


class CurateProgress(driver.Progress):
    """One curate run's progress: the UI's progress artifact and the terminal's lines. The driver
    calls `start` per segment of fused stages, `shard_done` per stage and shard (extract's units
    too), `finish` per stage: the one place a shard's completion is known. A segment shows one live
    bar (its stages finish each shard together, and rich keeps one live display at a time), then a
    line per stage."""

    def __init__(self, prefix: str, stages: list[str]):
        self.artifact = RunProgress(prefix, stages)
        self.stages: dict[str, StageProgress] = {}

    def start(self, stages: list[str], shards: int, docs: int | None = None) -> None:
        self.artifact.update(stages[0], 0.0)
        self.stages = {stages[0]: StageProgress(stages[0], shards, docs)}
        for name in stages[1:]:
            # counted, with no bar of its own: created for one shard (no live display), then told the total
            self.stages[name] = StageProgress(name, 1, None)
            self.stages[name].shards = shards

    def shard_done(self, result: ShardResult) -> None:
        stage = self.stages[result.stage]
        stage.advance(result.input_docs, result.skipped)
        self.artifact.update(result.stage, stage.done_shards / max(1, stage.shards))

    def finish(self, stage: str, report: dict) -> None:
        self.stages[stage].finish(report["kept_docs"], report["removed_docs"], report["seconds"])


# What does not change a run's output, so a rerun that changes it still resumes the same run.
NOT_IDENTITY = ("workers", "runner", "artifact_prefix")


def owned_entries() -> list[str]:
    """What a curate run writes into its output folder, and so what `--overwrite` clears."""
    return ["extract", *(s.name for s in STAGES), "curated", ".curated.json", "quarantine", "run.json", "README.md"]


# A CurateConfig from Python; from a deployment, its form (a dict: see curate_config.form_schema,
# the schema the UI draws), resolved in the run before any work.
CurateParameter = Annotated[CurateConfig | dict, Field(union_mode="left_to_right"), WithJsonSchema(form_schema())]


@flow(name="curate", flow_run_name=curate_name, log_prints=True, persist_result=False)
def curate(config: CurateParameter, overwrite: bool = False) -> dict:
    try:
        if not isinstance(config, CurateConfig):
            config = from_form(config)
        return _curate_flow(config, overwrite)
    except UserError as e:   # on a worker: one ERROR line with the fix, no traceback
        return failed_run(e)


def _curate_flow(config: CurateConfig, overwrite: bool) -> dict:
    from prefect.context import FlowRunContext
    ctx = FlowRunContext.get()
    if ctx is not None and not runner_matches(config.runner, ctx.task_runner):
        # A deployment run whose form asks for another task runner: run on it, as a subflow.
        return curate.with_options(task_runner=make_task_runner(config.runner, config.workers))(config, overwrite)
    log = get_run_logger()
    if warning := checkout_warning(__file__):
        log.warning(warning)
    t_start = time.perf_counter()
    run_dir = Path(config.output).resolve()
    if warning := shared_dataset_warning(config.dataset or name_from(run_dir.name)):
        log.warning(warning)
    if not config.input:
        raise UserError("no input: set config.input (paths, globs or URLs) in the run's form or the config")
    try:
        files = expand_inputs(config.input)
    except FileNotFoundError as e:
        raise UserError(f"{e} (relative paths are read from {Path.cwd()}): put the input files there, or set "
                        "config.input") from None
    cfg_json = config.model_dump(mode="json")
    with output_lock(run_dir):   # one run at a time per output folder, for the whole run
        stale = claim(run_dir, identity(files, cfg_json, NOT_IDENTITY), owned_entries(), overwrite)
        if stale:
            log.info("removed %d temporary files left by an interrupted run", stale)
        # holding the lock, any run still `running` into this output is a killed one
        registry.mark_stale_runs_crashed("curate", output=str(run_dir))
        run_id = registry.start_run("curate", cfg_json, str(run_dir), flow_run_id())
        try:
            summary = _finished(config, run_dir, run_id, log) or _curate(config, run_dir, files, run_id, log)
        except BaseException:
            registry.finish_run(run_id, "failed")
            raise
        summary["seconds"] = round(time.perf_counter() - t_start, 2)
        # run.json marks the run complete: from here on a rerun reuses it whole (see _finished),
        # so the intermediate copies and work files can go
        write_json_atomic(config.context().summary, summary)
        freed = driver.release_work_files(config.context(), ["extract", *enabled_stages(config)],
                                          config.keep_intermediate, config.keep_work_files)
        summary["disk"] = {**disk_footprint(config.context(), summary), "released": freed}
        write_json_atomic(config.context().summary, summary)
        record_written(run_dir, owned_entries())
        registry.finish_run(run_id, "completed", {k: v for k, v in summary.items() if k != "config"})
    from quipu.flows.events import curate_completed
    summary["event"] = curate_completed(summary, log)   # quipu.curate.completed: the trigger that trains on it
    return summary


def disk_footprint(context: RunContext, summary: dict) -> dict:
    """Bytes the finished run keeps on disk, by kind, and the input's size."""
    run_dir = Path(context.run_dir)
    kinds = {"curated": 0, "removed": 0, "quarantine": 0, "reports": 0, "intermediate": 0, "other": 0}
    for f in run_dir.rglob("*"):
        if not f.is_file():
            continue
        rel = f.relative_to(run_dir).parts
        kind = ("curated" if rel[0] == "curated" else "quarantine" if rel[0] == "quarantine"
                else "removed" if len(rel) > 1 and rel[1] == "removed"
                else "intermediate" if len(rel) > 1 and rel[1] == "kept"
                else "reports" if f.suffix == ".json" else "other")
        kinds[kind] += f.stat().st_size
    inputs = sum(reading.file_size(p) or 0 for p in summary["inputs"])
    total = sum(kinds.values())
    return {"bytes": kinds, "total_bytes": total, "input_bytes": inputs,
            "ratio_to_input": round(total / inputs, 3) if inputs else None}


def _finished(config: CurateSettings, run_dir: Path, run_id: str, log) -> dict | None:
    """A rerun of a completed run (same inputs and config: `claim` checked it) reuses it whole: its
    intermediate copies and work files are gone, so its stages are not run again; the curated
    shards and the reports must be intact. None when the run never completed."""
    context = config.context()
    if not context.summary.exists():
        return None
    summary = read_json(context.summary)
    marker = curated_marker(context.curated)
    parts = [Shard(**p) for p in read_json(marker).get("parts", [])] if marker.exists() else None
    missing = [str(marker)] if parts is None else \
        [p.path for p in parts if not (Path(p.path).exists() and sha256_file(p.path) == p.sha256)]
    reports = {}
    for st in summary.get("stages", []):
        path = context.layout(st["name"]).report
        if path.exists():
            reports[st["name"]] = read_json(path)
        else:
            missing.append(str(path))
    if missing:
        raise UserError(f"{run_dir} holds a finished run whose outputs are missing or changed ({missing[0]}"
                        f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}): pass --overwrite to redo it")
    for name, report in reports.items():   # nothing was redone: every shard is reused
        report["shards"] = [{**sh, "skipped": True} for sh in report["shards"]]
        report["reused_shards"] = len(report["shards"])
        write_report(str(run_dir), name, report)
    say(f"{run_dir}: the run is complete; reusing its {len(parts)} curated shards")
    summary = {**summary, "run_id": run_id,
               "stages": [{**st, "reused_shards": reports[st["name"]]["reused_shards"]} for st in summary["stages"]]}
    _register(config, run_dir, run_id, summary["inputs"], reports, parts, reports["extract"])
    publish(summary, reports, config.artifact_prefix)
    return summary


def publish(summary: dict, reports: dict, prefix: str) -> None:
    """The run's artifacts, the summary last (it links the others), and a log line naming it."""
    charts = publish_charts(summary, reports, prefix)
    get_run_logger().info("summary of the run: %s", publish_artifacts(summary, reports, prefix, {"charts": charts}))


def _curate(config: CurateSettings, run_dir: Path, files: list[str], run_id: str, log) -> dict:
    rd = str(run_dir)
    preflight(config)  # a missing or corrupt model fails here, before extract reads anything
    stages = enabled_stages(config)
    progress = CurateProgress(config.artifact_prefix, ["extract", *stages, "curated"])
    units = pack_inputs(files, int(config.extract.pack_mb * 1e6))
    say(f"curating {len(files)} input files ({len(units)} work units) into {rd}: extract, {', '.join(stages)}")
    results, report = run_extract(units, config.context(), config.extract, PrefectPhases().extract, progress)
    log.info("extract: %d records read from %d files in %d units, %d documents, %d kept, %d quarantined",
             report["records_read"], len(files), len(units), report["input_docs"], report["kept_docs"], report["quarantined"])

    stage_reports, shards = driver.run_pipeline(
        [config.stage_ref(name, run_id) for name in stages], [s for r in results for s in r.kept_shards],
        PrefectPhases(), config.fuse, config.keep_intermediate, progress)   # progress says each stage's line
    reports = {"extract": report, **stage_reports}

    progress.artifact.update("curated", 0.0)
    curated = write_curated_task(shards, str(config.context().curated), config.curated)
    progress.artifact.done()
    summary = {
        "run_id": run_id, "output": rd, "dataset": config.dataset or name_from(run_dir.name),
        "inputs": [reading.source_name(f) for f in files],
        "records_read": reports["extract"]["records_read"], "quarantined": reports["extract"]["quarantined"],
        "quarantine_by_reason": reports["extract"]["quarantine_by_reason"],
        "stages": [{"name": name, "input_docs": r["input_docs"], "kept_docs": r["kept_docs"],
                    "removed_docs": r["removed_docs"], "removed_by_reason": r["removed_by_reason"],
                    "edits": {k: n for k, n in r["stats"].get("edits", {}).items() if n},
                    "by_language": r["stats"].get("by_language", {}),
                    **({"pdf": r["stats"]["pdf"]} if r["stats"].get("pdf") else {}),
                    **({"tiers": r["stats"]["tiers"]} if r["stats"].get("tiers") else {}),
                    "seconds": r["seconds"], "reused_shards": r.get("reused_shards", 0)} for name, r in reports.items()],
        "curated": {"rows": sum(p.rows for p in curated), "shards": [p.path for p in curated]},
        "config": config.model_dump(mode="json"),
    }
    write_dataset_card(summary, run_dir, config.dataset or name_from(run_dir.name), config.curated.license,
                       QUIPU_VERSION)
    _register(config, run_dir, run_id, files, reports, curated, results_extract=reports["extract"])
    publish(summary, reports, config.artifact_prefix)
    return summary


CHECKOUT = Path(__file__).resolve().parents[1]    # the project checkout this code runs from


def shared_dataset_warning(name: str) -> str | None:
    """A warning when the catalog (QUIPU_HOME, by default one per user, not per checkout) holds
    versions of dataset `name` that another checkout curated: this run would add to them and
    deduplicate against them."""
    import json
    from quipu.catalog import db
    others = {}
    for v in registry.dataset_versions(name):
        info = v.get("info") or {}
        where = (json.loads(info) if isinstance(info, str) else info).get("checkout")
        if where and where != str(CHECKOUT):
            others.setdefault(where, []).append(str(v["version"]))
    if not others:
        return None
    held = "; ".join(f"v{', v'.join(vs)} from {where}" for where, vs in others.items())
    return (f"dataset {name!r} in the catalog {db.quipu_home()} holds versions another checkout curated ({held}): "
            "this run adds a version to it and deduplicates against them; to keep the checkouts apart set QUIPU_HOME "
            "per checkout, or name another dataset (config.dataset)")


def _register(config: CurateConfig, run_dir: Path, run_id: str, files: list[str], reports: dict,
              curated: list[Shard], results_extract: dict) -> None:
    for name, report in reports.items():
        registry.save_report(run_id, name, report)
    name = config.dataset or name_from(run_dir.name)
    ds_id = registry.register_dataset(
        name, "curated", str(config.context().curated), run_id,
        [{"path": p.path, "rows": p.rows, "bytes": p.bytes, "sha256": p.sha256} for p in curated],
        info={"stages": list(reports), "checkout": str(CHECKOUT)})
    qdir = config.context().quarantine
    if qdir.exists():
        import pyarrow.parquet as pq
        qshards = [{"path": str(p), "rows": pq.ParquetFile(p).metadata.num_rows, "bytes": p.stat().st_size,
                    "sha256": sha256_file(p)} for p in sorted(qdir.glob("*.parquet"))]
        registry.register_dataset(f"{name}/quarantine", "quarantine", str(qdir), run_id, qshards)
    else:   # nothing quarantined: an earlier run's quarantine here (cleared by --overwrite) is gone
        registry.forget_dataset_path(str(qdir), "quarantine")
    registry.record_lineage(run_id, "input", [{"path": p} for p in dict.fromkeys(f["source"] for f in results_extract["files"])])
    registry.record_lineage(run_id, "output", [{"path": str(config.context().curated), "dataset_id": ds_id}])
