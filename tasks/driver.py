"""Running a stage: the shard runner and the phase order, with no Prefect.

`process_shard` streams one shard through `stage.process` in batches, writes `kept/` and `removed/`
under temporary names, counts, checks `input = kept + removed`, and leaves a done-marker whose
fingerprint lets a rerun skip the shard. `run_stage` runs every phase of the contract in order;
its `phases` argument decides where the per-shard work runs: `InProcess` (tests, benchmarks,
notebooks) or the curate flow's Prefect tasks, which call the same functions below.

A stage is named by a `StageRef` (name, config, run context): small and picklable, so a task on
another process or machine builds its own stage object (models are cached per process).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from quipu.catalog.files import read_json, sha256_file, sha256_json, write_json_atomic
from quipu.tasks.schema import conform
from quipu.tasks.stage import Outcome, RunContext, Shard, ShardResult, ShardWriter, Stage, StageConfig, snippet

EXAMPLES_PER_REASON = 3


@dataclass(frozen=True)
class StageRef:
    """A stage by name, config and run: what tasks pass each other instead of a stage object."""
    name: str
    config: StageConfig
    context: RunContext

    def build(self) -> Stage:
        from quipu.tasks.pipeline import stage_class
        return stage_class(self.name)(self.config, self.context)


@dataclass
class Scan:
    """A stage's scan of one shard, with the time it took (the stage's time includes it)."""
    shard: str
    value: Any
    seconds: float


# ---- counting ---------------------------------------------------------------------------------

def text_sizes(table: pa.Table) -> tuple[int, int]:
    """(UTF-8 bytes, characters) of the `text` column."""
    if table.num_rows == 0:
        return 0, 0
    text = table.column("text")
    return int(pc.sum(pc.binary_length(text)).as_py() or 0), int(pc.sum(pc.utf8_length(text)).as_py() or 0)


def count_reasons(removed: pa.Table, counts: dict[str, int], examples: dict[str, list[dict]]) -> None:
    if removed.num_rows == 0:
        return
    reasons = removed.column("reason").to_pylist()
    ids = removed.column("id").to_pylist()
    texts = removed.column("text")
    for i, reason in enumerate(reasons):
        counts[reason] = counts.get(reason, 0) + 1
        ex = examples.setdefault(reason, [])
        if len(ex) < EXAMPLES_PER_REASON:
            ex.append({"id": ids[i], "snippet": snippet(texts[i].as_py())})


def merge_counts(into: dict, other: dict) -> dict:
    """Sum numbers and merge nested dicts; lists are concatenated (used for stage-specific stats)."""
    for k, v in other.items():
        if isinstance(v, dict):
            merge_counts(into.setdefault(k, {}), v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            into[k] = into.get(k, 0) + v
        elif isinstance(v, list):
            into[k] = list(into.get(k, [])) + v
        else:
            into[k] = v
    return into


# ---- one shard --------------------------------------------------------------------------------

def shard_fingerprint(stage: Stage, input_sha: str, shard_plan: Any) -> str:
    return sha256_json({"stage": stage.name, "input": input_sha, "code": stage.code_version(),
                        "config": stage.config.model_dump(mode="json"), **stage.fingerprint(shard_plan)})


def load_done(marker: Path, fp: str, model: type = ShardResult):
    """The stored result (a `model`: ShardResult, ExtractResult) of a finished shard or file, marked
    as reused, if its fingerprint is `fp` and every output it names is intact; else None."""
    if not marker.exists():
        return None
    try:
        done = model.model_validate(read_json(marker))
    except Exception:
        return None
    if done.fingerprint != fp:
        return None
    if not all(Path(o.path).exists() and sha256_file(o.path) == o.sha256 for o in done.outputs()):
        return None
    return done.model_copy(update={"skipped": True})


def process_shard(stage: Stage, shard: Shard, shard_plan: Any = None) -> ShardResult:
    """Run `stage` over one shard; returns the shard's result (also stored as its done-marker)."""
    layout = stage.layout
    marker = layout.markers / f"{shard.name}.json"
    fp = shard_fingerprint(stage, shard.sha256, shard_plan)
    done = load_done(marker, fp)
    if done is not None:
        return done

    t0 = time.perf_counter()
    kept_w = ShardWriter(layout.kept / f"{shard.name}.parquet")
    from quipu.tasks.pipeline import REMOVED_SCHEMA
    removed_w = ShardWriter(layout.removed / f"{shard.name}.parquet", REMOVED_SCHEMA)
    counts: dict[str, int] = {}
    examples: dict[str, list[dict]] = {}
    stats: dict[str, Any] = {}
    n_in = bytes_in = chars_in = bytes_out = chars_out = 0
    try:
        pf = pq.ParquetFile(shard.path)
        empty = True
        for rb in pf.iter_batches(batch_size=stage.config.batch_rows):
            batch = pa.Table.from_batches([rb])
            empty = False
            out = stage.process(batch, shard_plan)
            _check_outcome(stage.name, batch, out)
            n_in += batch.num_rows
            b, c = text_sizes(batch); bytes_in += b; chars_in += c
            b, c = text_sizes(out.kept); bytes_out += b; chars_out += c
            kept_w.write(out.kept)
            removed_w.write(conform(out.removed, REMOVED_SCHEMA, stage.name))
            count_reasons(out.removed, counts, examples)
            merge_counts(stats, out.stats)
        if empty:  # an empty shard still yields (empty) outputs with the stage's schema
            out = stage.process(pf.schema_arrow.empty_table(), shard_plan)
            kept_w.write(out.kept)
        kept = kept_w.close()
        removed = removed_w.close()
    except BaseException:
        kept_w.abort()
        removed_w.abort()
        raise
    if n_in != kept.rows + removed.rows:
        raise AssertionError(f"{stage.name}/{shard.name}: input {n_in} != kept {kept.rows} + removed {removed.rows}")
    result = ShardResult(stage=stage.name, shard=shard.name, fingerprint=fp, input=shard, kept=kept,
                         removed=removed, input_docs=n_in, kept_docs=kept.rows, removed_docs=removed.rows,
                         removed_by_reason=counts, examples=examples, stats=stats, bytes_in=bytes_in,
                         bytes_out=bytes_out, chars_in=chars_in, chars_out=chars_out,
                         seconds=round(time.perf_counter() - t0, 3))
    write_json_atomic(marker, result.model_dump(mode="json", exclude={"skipped"}))
    return result


def _check_outcome(stage: str, batch: pa.Table, out: Outcome) -> None:
    if out.kept.num_rows + out.removed.num_rows != batch.num_rows:
        raise AssertionError(f"stage {stage}: {batch.num_rows} in, {out.kept.num_rows} kept + "
                             f"{out.removed.num_rows} removed")
    if out.removed.num_rows and "reason" not in out.removed.column_names:
        raise AssertionError(f"stage {stage}: removed rows without a reason")


# ---- the phases, as functions of a StageRef (what the flow's tasks call) ----------------------

def scan_shard(ref: StageRef, shard: Shard) -> Scan:
    t0 = time.perf_counter()
    value = ref.build().scan(shard)
    return Scan(shard.name, value, round(time.perf_counter() - t0, 3))


def plan_stage(ref: StageRef, scans: list[Scan] | None) -> Any:
    return ref.build().plan([s.value for s in scans] if scans is not None else None)


def plan_partitions(ref: StageRef, scans: list[Scan] | None) -> list | None:
    return ref.build().plan_partitions([s.value for s in scans] if scans is not None else None)


def plan_part(ref: StageRef, scans: list[Scan] | None, partition: Any) -> Any:
    return ref.build().plan_partition([s.value for s in scans] if scans is not None else None, partition)


def combine_stage(ref: StageRef, scans: list[Scan] | None, partials: list) -> Any:
    return ref.build().combine([s.value for s in scans] if scans is not None else None, partials)


def process_one(ref: StageRef, shard: Shard, plan: Any) -> ShardResult:
    stage = ref.build()
    return process_shard(stage, shard, stage.plan_for(shard, plan))


def commit_stage(ref: StageRef, scans: list[Scan] | None, plan: Any) -> dict | None:
    return ref.build().commit([s.value for s in scans] if scans is not None else None, plan)


class InProcess:
    """Runs the per-shard phases one after another in this process (`map_fn` may parallelise)."""

    def __init__(self, map_fn: Callable[[Callable, list], list] | None = None):
        self.map_fn = map_fn or (lambda fn, items: [fn(x) for x in items])

    def scan(self, ref: StageRef, shards: list[Shard]) -> list[Scan]:
        return self.map_fn(lambda s: scan_shard(ref, s), shards)

    def plan(self, ref: StageRef, scans: list[Scan] | None) -> Any:
        parts = plan_partitions(ref, scans)
        if parts is None:
            return plan_stage(ref, scans)
        return combine_stage(ref, scans, self.map_fn(lambda p: plan_part(ref, scans, p), parts))

    def process(self, ref: StageRef, shards: list[Shard], plan: Any,
                progress: Callable[[ShardResult], object] | None = None) -> list[ShardResult]:
        results = self.map_fn(lambda s: process_one(ref, s, plan), shards)
        for r in results if progress is not None else []:
            progress(r)
        return results

    def commit(self, ref: StageRef, scans: list[Scan] | None, plan: Any) -> dict | None:
        return commit_stage(ref, scans, plan)


def run_stage(ref: StageRef, shards: list[Shard], phases=None,
              progress: Callable[[ShardResult], object] | None = None) -> tuple[list[ShardResult], dict]:
    """Every phase of one stage over `shards`, in order; returns the shard results and the report.
    `progress(result)` is called as each shard's processing is collected (the progress display)."""
    phases = phases or InProcess()
    stage = ref.build()
    stage.check()
    scans = phases.scan(ref, shards) if stage.needs_scan() else None
    t0 = time.perf_counter()
    plan = phases.plan(ref, scans)
    plan_s = time.perf_counter() - t0
    results = phases.process(ref, shards, plan, progress)
    t0 = time.perf_counter()
    committed = phases.commit(ref, scans, plan)
    commit_s = time.perf_counter() - t0
    report = aggregate(stage.name, results)
    from quipu.tasks.domain_stats import domain_report
    report["domains"] = domain_report([s.path for s in shards], results)   # top sites and TLDs kept and removed
    # The stage's time: its shards' processing and scans (each summed over shards), plan and commit.
    scan_s = sum(s.seconds for s in scans) if scans else 0.0
    report["seconds"] = round(report["seconds"] + scan_s + plan_s + commit_s, 3)
    # a scanning stage always gets a list (empty for a run of no documents), others None
    report["stats"] = stage.finalize(report["stats"], [s.value for s in scans] if scans is not None else None,
                                     plan, committed)
    return results, report


# ---- the stage report -------------------------------------------------------------------------

def aggregate(stage: str, results: list[ShardResult]) -> dict:
    """Sum per-shard results into the stage report (shards in the given, deterministic order)."""
    report: dict[str, Any] = {"stage": stage, "input_docs": 0, "kept_docs": 0, "removed_docs": 0,
                              "bytes_in": 0, "bytes_out": 0, "chars_in": 0, "chars_out": 0,
                              "seconds": 0.0, "removed_by_reason": {}, "examples": {}, "stats": {},
                              "shards": []}
    report["reused_shards"] = 0
    for r in results:
        for k in ("input_docs", "kept_docs", "removed_docs", "bytes_in", "bytes_out", "chars_in", "chars_out"):
            report[k] += getattr(r, k)
        # a shard reused from an earlier run cost nothing now: its stored seconds are not this run's
        report["seconds"] += 0.0 if r.skipped else r.seconds
        report["reused_shards"] += int(r.skipped)
        for reason, n in r.removed_by_reason.items():
            report["removed_by_reason"][reason] = report["removed_by_reason"].get(reason, 0) + n
        for reason, ex in r.examples.items():
            slot = report["examples"].setdefault(reason, [])
            slot.extend(ex[: max(0, EXAMPLES_PER_REASON - len(slot))])
        merge_counts(report["stats"], r.stats)
        report["shards"].append({"name": r.shard, "input_docs": r.input_docs, "kept_docs": r.kept_docs,
                                 "removed_docs": r.removed_docs, "skipped": r.skipped})
    report["seconds"] = round(report["seconds"], 3)
    report["removed_by_reason"] = dict(sorted(report["removed_by_reason"].items(), key=lambda kv: (-kv[1], kv[0])))
    if report["input_docs"] != report["kept_docs"] + report["removed_docs"]:
        raise AssertionError(f"stage {stage}: input {report['input_docs']} != kept {report['kept_docs']} "
                             f"+ removed {report['removed_docs']}")
    return report


def write_report(run_dir: str, stage: str, report: dict) -> None:
    write_json_atomic(RunContext(run_dir).layout(stage).report, report)


def run_local(name: str, config: StageConfig, shards: list[Shard], run_dir: str | Path,
              dataset: str | None = None, map_fn: Callable | None = None) -> tuple[list[ShardResult], dict]:
    """One stage of the pipeline over `shards`, in this process: tests, benchmarks, notebooks."""
    ref = StageRef(name, config, RunContext(str(Path(run_dir).resolve()), dataset))
    return run_stage(ref, shards, InProcess(map_fn))
