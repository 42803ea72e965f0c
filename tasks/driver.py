"""Running stages: the shard runner and the phase order, with no Prefect.

Stages run in segments (`segments`): a global stage (one that scans every shard first: lines,
dedup, quality top_fraction, perplexity buckets) starts a new segment, and the per-document
stages after it run in the same pass over each shard. `process_segment_shard` streams one shard
through a segment's stages in batches, writes each stage's `removed/` and the segment's last
`kept/` (every stage's with `keep_intermediate`) under temporary names, counts, checks
`input = kept + removed` per stage, and leaves one done-marker per stage whose fingerprint lets a
rerun skip the shard (a stage declaring a `scan_result` / `partition_result` type gets such markers
for its scans and plan partitions too, under `_shards/scans/` and `_shards/partitions/`). `run_segment` runs every phase of the contract in order; its `phases`
argument decides where the per-shard work runs: `InProcess` (tests, benchmarks, notebooks) or the
curate flow's Prefect tasks, which call the same functions below. `run_stage` runs one stage
alone (its kept rows written).

A stage is named by a `StageRef` (its class, config and run context): small and picklable, so a
task on another process or machine builds its own stage object (models are cached per process).
The driver knows no stage list: what runs is what it is given (quipu.tasks.pipeline lists the
curate pipeline's stages and the removed-rows schema they share, `RunContext.removed_schema`).
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
from quipu.tasks.stage import PhaseResult

EXAMPLES_PER_REASON = 3


@dataclass(frozen=True)
class StageRef:
    """A stage by class, config and run: what tasks pass each other instead of a stage object (the
    class pickles by its import path)."""
    stage: type[Stage]
    config: StageConfig
    context: RunContext

    @property
    def name(self) -> str:
        return self.stage.name

    def build(self) -> Stage:
        return self.stage(self.config, self.context)


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


def count_languages(out: Outcome, into: dict) -> None:
    """Per document language (once langid has run): documents kept, and removed by reason, into
    `into["by_language"]` ({lang: {"kept": n, "removed": n, "by_reason": {reason: n}}})."""
    if "lang" not in out.kept.column_names and "lang" not in out.removed.column_names:
        return
    by_lang = into.setdefault("by_language", {})
    for lang in out.kept.column("lang").to_pylist() if "lang" in out.kept.column_names else []:
        slot = by_lang.setdefault(lang or "und", {"kept": 0, "removed": 0, "by_reason": {}})
        slot["kept"] += 1
    if "lang" in out.removed.column_names and out.removed.num_rows:
        for lang, reason in zip(out.removed.column("lang").to_pylist(), out.removed.column("reason").to_pylist()):
            slot = by_lang.setdefault(lang or "und", {"kept": 0, "removed": 0, "by_reason": {}})
            slot["removed"] += 1
            slot["by_reason"][reason] = slot["by_reason"].get(reason, 0) + 1


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


# ---- segments: consecutive stages run in one pass per shard ---------------------------------

@dataclass(frozen=True)
class Segment:
    """Stages that run in one pass over each shard: at most one global stage (one that scans every
    shard before processing any), first, then the per-document stages after it. Only the last
    stage's kept rows are written (every stage's with `keep_intermediate`); every stage still
    writes its removed rows, its done-marker and its report."""
    refs: tuple[StageRef, ...]
    keep_intermediate: bool = False

    @property
    def name(self) -> str:
        return "+".join(r.name for r in self.refs)

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.refs]

    @property
    def head(self) -> StageRef:
        return self.refs[0]


def segments(refs: list[StageRef], fuse: bool = True, keep_intermediate: bool = False) -> list[Segment]:
    """The pipeline cut into segments: a new one at every global stage (`needs_scan`), or one per
    stage when `fuse` is off (every stage then writes its kept rows, as `keep_intermediate`)."""
    out: list[list[StageRef]] = []
    for ref in refs:
        if not fuse or not out or ref.build().needs_scan():
            out.append([ref])
        else:
            out[-1].append(ref)
    return [Segment(tuple(group), keep_intermediate or not fuse) for group in out]


def shard_fingerprint(stage: Stage, input_sha: str, shard_plan: Any) -> str:
    return sha256_json({"stage": stage.name, "input": input_sha, **_stage_identity(stage, shard_plan)})


def _stage_identity(stage: Stage, shard_plan: Any) -> dict:
    return {"code": stage.code_version(), "config": stage.config.model_dump(mode="json"), **stage.fingerprint(shard_plan)}


def segment_fingerprint(stages: list[Stage], input_sha: str, shard_plans: list, keep_intermediate: bool) -> str:
    """What a shard's results in a segment depend on: its input, and each stage's code, config and
    plan. A segment of one stage has the stage's own shard fingerprint."""
    if len(stages) == 1:
        return shard_fingerprint(stages[0], input_sha, shard_plans[0])
    return sha256_json({"input": input_sha, "keep_intermediate": keep_intermediate,
                        "stages": [{"stage": st.name, **_stage_identity(st, p)} for st, p in zip(stages, shard_plans)]})


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


class Tally:
    """What a stage counts on one shard (extract: on one work unit) while it runs: documents read
    and kept, text sizes in and out, removals by reason with examples, its stats and its time."""

    def __init__(self):
        self.counts: dict[str, int] = {}
        self.examples: dict[str, list[dict]] = {}
        self.stats: dict[str, Any] = {}
        self.n_in = self.n_kept = self.bytes_in = self.chars_in = self.bytes_out = self.chars_out = 0
        self.seconds = 0.0

    def count_removed(self, removed: pa.Table) -> None:
        count_reasons(removed, self.counts, self.examples)

    def counted(self) -> dict[str, Any]:
        """The counts as fields of the shard's `ShardResult`."""
        return dict(input_docs=self.n_in, kept_docs=self.n_kept, removed_by_reason=self.counts, examples=self.examples,
                    stats=self.stats, bytes_in=self.bytes_in, bytes_out=self.bytes_out, chars_in=self.chars_in,
                    chars_out=self.chars_out, seconds=round(self.seconds, 3))


class _StageTally(Tally):
    """One stage's outputs and counts on one shard while the segment's pass runs."""

    def __init__(self, stage: Stage, shard: Shard, write_kept: bool):
        super().__init__()
        layout = stage.layout
        self.stage = stage
        self.kept_w = ShardWriter(layout.kept / f"{shard.name}.parquet") if write_kept else None
        self.removed_w = ShardWriter(layout.removed / f"{shard.name}.parquet",
                                     stage.context.removed_rows_schema(stage.columns))

    def run(self, batch: pa.Table, shard_plan: Any) -> pa.Table:
        """The stage over one batch: its removed rows written, its kept rows returned."""
        t0 = time.perf_counter()
        out = self.stage.process(batch, shard_plan)
        _check_outcome(self.stage.name, batch, out)
        self.n_in += batch.num_rows
        self.n_kept += out.kept.num_rows
        b, c = text_sizes(batch); self.bytes_in += b; self.chars_in += c
        b, c = text_sizes(out.kept); self.bytes_out += b; self.chars_out += c
        if self.kept_w is not None:
            self.kept_w.write(out.kept)
        self.removed_w.write(conform(out.removed, self.removed_w.schema, self.stage.name))
        self.count_removed(out.removed)
        merge_counts(self.stats, out.stats)
        count_languages(out, self.stats)
        self.seconds += time.perf_counter() - t0
        return out.kept

    def needs_schema(self) -> bool:
        return self.kept_w is not None and not self.kept_w.opened

    def write_empty(self, empty: pa.Table, shard_plan: Any) -> pa.Table:
        """Give a kept writer that saw no batch the stage's output schema (an empty shard is still a file)."""
        out = self.stage.process(empty, shard_plan)
        if self.needs_schema():
            self.kept_w.write(out.kept)
        return out.kept

    def result(self, shard: Shard, fp: str) -> ShardResult:
        kept = self.kept_w.close() if self.kept_w is not None else None
        removed = self.removed_w.close()
        if self.n_in != self.n_kept + removed.rows or (kept is not None and kept.rows != self.n_kept):
            raise AssertionError(f"{self.stage.name}/{shard.name}: input {self.n_in} != kept {self.n_kept} + removed {removed.rows}")
        return ShardResult(stage=self.stage.name, shard=shard.name, fingerprint=fp, input=shard, kept=kept,
                           removed=removed, removed_docs=removed.rows, **self.counted())

    def abort(self) -> None:
        for w in (self.kept_w, self.removed_w):
            if w is not None:
                w.abort()


def process_segment_shard(stages: list[Stage], shard: Shard, shard_plans: list,
                          keep_intermediate: bool = False) -> list[ShardResult]:
    """One shard through every stage of a segment in one pass: each batch read once, fed through
    the stages in order, each stage's removed rows written as they fall out. Returns one result
    per stage (each also stored as the stage's done-marker); a rerun reuses them only together."""
    fp = segment_fingerprint(stages, shard.sha256, shard_plans, keep_intermediate)
    markers = [st.layout.markers / f"{shard.name}.json" for st in stages]
    done = [load_done(m, fp) for m in markers]
    if all(d is not None for d in done):
        return done

    t0 = time.perf_counter()
    last = len(stages) - 1
    tallies = [_StageTally(st, shard, keep_intermediate or i == last) for i, st in enumerate(stages)]
    try:
        pf = pq.ParquetFile(shard.path)
        for rb in pf.iter_batches(batch_size=stages[0].config.batch_rows):
            batch = pa.Table.from_batches([rb])
            for tally, shard_plan in zip(tallies, shard_plans):
                if batch.num_rows == 0 and tally is not tallies[0]:
                    break       # nothing of this batch is left for the later stages
                batch = tally.run(batch, shard_plan)
        if any(t.needs_schema() for t in tallies):  # an empty shard, or one a stage emptied
            empty = pf.schema_arrow.empty_table()
            for tally, shard_plan in zip(tallies, shard_plans):
                empty = tally.write_empty(empty, shard_plan)
        results = [tally.result(shard, fp) for tally in tallies]
    except BaseException:
        for tally in tallies:
            tally.abort()
        raise
    for i in range(1, len(results)):
        if results[i].input_docs != results[i - 1].kept_docs:
            raise AssertionError(f"{results[i].stage}/{shard.name}: read {results[i].input_docs} documents, "
                                 f"{results[i - 1].stage} kept {results[i - 1].kept_docs}")
    # reading the input is the first stage's time; the rest of the pass is spread as measured
    results[0].seconds = round(results[0].seconds + (time.perf_counter() - t0) - sum(r.seconds for r in results), 3)
    for marker, result in zip(markers, results):
        write_json_atomic(marker, result.model_dump(mode="json", exclude={"skipped"}))
    return results


def _check_outcome(stage: str, batch: pa.Table, out: Outcome) -> None:
    if out.kept.num_rows + out.removed.num_rows != batch.num_rows:
        raise AssertionError(f"stage {stage}: {batch.num_rows} in, {out.kept.num_rows} kept + "
                             f"{out.removed.num_rows} removed")
    if out.removed.num_rows and "reason" not in out.removed.column_names:
        raise AssertionError(f"stage {stage}: removed rows without a reason")


# ---- the phases, as functions of a StageRef / Segment (what the flow's tasks call) ------------

def kept_phase(marker: Path, fp: str, model: type[PhaseResult], compute: Callable[[], PhaseResult]) -> PhaseResult:
    """A scan's or plan partition's result, reused from its done-marker when `fp` matches and its
    files are intact, else computed and stored as the marker (for stages that declare the type)."""
    done = load_done(marker, fp, model)
    if done is not None:
        return done
    result = compute().model_copy(update={"fingerprint": fp})
    write_json_atomic(marker, result.model_dump(mode="json", exclude={"skipped"}))
    return result


def scan_shard(ref: StageRef, shard: Shard) -> Scan:
    t0 = time.perf_counter()
    stage = ref.build()
    if stage.scan_result is None:
        value = stage.scan(shard)
    else:
        value = kept_phase(stage.layout.markers / "scans" / f"{shard.name}.json", stage.scan_fingerprint(shard),
                           stage.scan_result, lambda: stage.scan(shard))
    return Scan(shard.name, value, round(time.perf_counter() - t0, 3))


def plan_stage(ref: StageRef, scans: list[Scan] | None) -> Any:
    return ref.build().plan([s.value for s in scans] if scans is not None else None)


def plan_partitions(ref: StageRef, scans: list[Scan] | None) -> list | None:
    return ref.build().plan_partitions([s.value for s in scans] if scans is not None else None)


def plan_part(ref: StageRef, scans: list[Scan] | None, partition: Any) -> Any:
    stage = ref.build()
    values = [s.value for s in scans] if scans is not None else None
    if stage.partition_result is None:
        return stage.plan_partition(values, partition)
    fp = stage.partition_fingerprint(partition)   # names the marker: a partition has no name of its own
    return kept_phase(stage.layout.markers / "partitions" / f"{fp[:16]}.json", fp, stage.partition_result,
                      lambda: stage.plan_partition(values, partition))


def combine_stage(ref: StageRef, scans: list[Scan] | None, partials: list) -> Any:
    return ref.build().combine([s.value for s in scans] if scans is not None else None, partials)


def process_one(segment: Segment, shard: Shard, plans: list) -> list[ShardResult]:
    """One shard through a segment, in whatever process the task runs in (stages built here)."""
    stages = [ref.build() for ref in segment.refs]
    shard_plans = [st.plan_for(shard, p) for st, p in zip(stages, plans)]
    return process_segment_shard(stages, shard, shard_plans, segment.keep_intermediate)


def commit_stage(ref: StageRef, scans: list[Scan] | None, plan: Any) -> Any:
    return ref.build().commit([s.value for s in scans] if scans is not None else None, plan)


class Progress:
    """The one hook for progress displays: `start` when a segment's (or extract's) shards are
    handed out (its stages, shards and documents), `shard_done` once per stage and shard as soon as
    the shard is done (its stage, shard, documents in/kept/removed; `skipped`: reused from an
    earlier run), `finish` with each stage's report. Does nothing here."""

    def start(self, stages: list[str], shards: int, docs: int | None = None) -> None:
        pass

    def finish(self, stage: str, report: dict) -> None:
        pass

    def shard_done(self, result: ShardResult) -> None:
        pass


NO_PROGRESS = Progress()


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

    def process(self, segment: Segment, shards: list[Shard], plans: list,
                progress: Progress = NO_PROGRESS) -> list[list[ShardResult]]:
        def one(shard: Shard) -> list[ShardResult]:
            results = process_one(segment, shard, plans)
            for r in results:
                progress.shard_done(r)
            return results
        return self.map_fn(one, shards)

    def commit(self, ref: StageRef, scans: list[Scan] | None, plan: Any) -> Any:
        return commit_stage(ref, scans, plan)


@dataclass
class SegmentRun:
    """What running a segment gives: per stage its shard results and report, and the segment's output."""
    results: dict[str, list[ShardResult]]
    reports: dict[str, dict]
    outputs: list[Shard]


def run_segment(segment: Segment, shards: list[Shard], phases=None, progress: Progress = NO_PROGRESS,
                docs: int | None = None) -> SegmentRun:
    """Every phase of a segment's stages over `shards`, in order: the head's scan and plan, the
    fused pass per shard, each stage's commit, then each stage's report."""
    phases = phases or InProcess()
    stages = [ref.build() for ref in segment.refs]
    for st in stages:
        st.check()
    head = stages[0]
    scans = phases.scan(segment.head, shards) if head.needs_scan() else None
    t0 = time.perf_counter()
    plans = [phases.plan(segment.head, scans)] + [st.plan(None) for st in stages[1:]]
    plan_s = time.perf_counter() - t0
    progress.start(segment.names, len(shards), docs)
    per_shard = phases.process(segment, shards, plans, progress)
    results = {st.name: [r[i] for r in per_shard] for i, st in enumerate(stages)}
    reports = {}
    from quipu.tasks.domain_stats import StageDomains
    domains = StageDomains([s.path for s in shards])   # the segment's input once, then each stage's removed rows
    for i, (ref, st) in enumerate(zip(segment.refs, stages)):
        t0 = time.perf_counter()
        stage_scans = scans if i == 0 else None
        committed = phases.commit(ref, stage_scans, plans[i])
        report = aggregate(st.name, results[st.name])
        report["domains"] = domains.after(results[st.name])   # top sites and TLDs kept and removed
        # The stage's time: its shards' processing and scans (each summed over shards), plan and commit.
        extra = (sum(s.seconds for s in scans) if scans else 0.0) + plan_s if i == 0 else 0.0
        report["seconds"] = round(report["seconds"] + extra + time.perf_counter() - t0, 3)
        # a scanning stage always gets a list (empty for a run of no documents), others None
        report["stats"] = st.finalize(report["stats"], [s.value for s in stage_scans] if stage_scans is not None else None,
                                      plans[i], committed)
        reports[st.name] = report
    return SegmentRun(results, reports, [r[-1].kept for r in per_shard])


def run_stage(ref: StageRef, shards: list[Shard], phases=None,
              progress: Progress = NO_PROGRESS) -> tuple[list[ShardResult], dict]:
    """Every phase of one stage over `shards` (its kept rows written); returns the shard results and the report."""
    run = run_segment(Segment((ref,), keep_intermediate=True), shards, phases, progress)
    return run.results[ref.name], run.reports[ref.name]


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


def run_pipeline(refs: list[StageRef], shards: list[Shard], phases=None, fuse: bool = True,
                 keep_intermediate: bool = False, progress: Progress = NO_PROGRESS,
                 on_stage: Callable[[str, dict], object] | None = None) -> tuple[dict[str, dict], list[Shard]]:
    """Stages in pipeline order over `shards`, segment by segment: each stage's report written
    (`<stage>/report.json`) and checked against the stage before it; returns the reports and the
    last stage's kept shards."""
    reports: dict[str, dict] = {}
    prev_kept = sum(s.rows for s in shards)
    for segment in segments(refs, fuse, keep_intermediate):
        run = run_segment(segment, [s for s in shards if s.rows > 0], phases, progress, prev_kept)
        for ref in segment.refs:
            report = run.reports[ref.name]
            progress.finish(ref.name, report)
            if report["input_docs"] != prev_kept:
                raise AssertionError(f"{ref.name}: read {report['input_docs']} documents, the stage before kept {prev_kept}")
            prev_kept = report["kept_docs"]
            write_report(ref.context.run_dir, ref.name, report)
            reports[ref.name] = report
            if on_stage is not None:
                on_stage(ref.name, report)
        shards = run.outputs
    return reports, shards


def release_work_files(context: RunContext, stages: list[str], keep_intermediate: bool = False,
                       keep_work_files: bool = False) -> dict:
    """What a finished run no longer needs: every stage's `kept/` copies (the curated shards hold the
    result) and the global stages' work folders (signatures, counts, plans). Returns what was freed."""
    import shutil
    freed = {"files": 0, "bytes": 0}
    for name in stages:
        layout = context.layout(name)
        dirs = ([] if keep_intermediate else [layout.kept]) + ([] if keep_work_files else layout.work_dirs())
        for d in dirs:
            if not d.is_dir():
                continue
            for f in d.rglob("*"):
                if f.is_file():
                    freed["files"] += 1
                    freed["bytes"] += f.stat().st_size
            shutil.rmtree(d)
    return freed
