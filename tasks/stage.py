"""The stage contract: what every stage after extract implements, the shard it reads, the typed
result it returns, and where in the run folder it writes.

A stage (datatrove's `PipelineStep` in spirit) is a small class with one job and a reason for every
removal. The driver (`quipu.tasks.driver`, in process; the curate flow, with Prefect tasks) runs
its phases in this order:

    check()                      load models, indexes: fail before any document is read
    scan(shard)      per shard   optional (`needs_scan`: a global stage): signatures, scores
    plan(scans)      once        optional: dedup clusters, per-language cut-offs
      or, partitioned (`plan_partitions(scans)` returns a list):
      plan_partition(scans, part)   per partition, in parallel (e.g. a hash range of dedup's buckets)
      combine(scans, partials)      once, cheap: the plan from the partitions' results
    plan_for(shard, plan)        the part of the plan one shard needs (default: the plan)
    process(batch, shard_plan)   per batch of a shard: kept / removed with reasons, stats
    commit(scans, plan)          once, after every shard's output is written (e.g. the dedup index)
    finalize(stats, ...)         stage-wide figures of the report (top-k examples, means, cut-offs)

Consecutive stages without a scan run fused (`driver.Segment`): one pass per shard feeds each
batch through a global stage's process and the per-document stages after it, writing each stage's
removed rows and done-marker but only the segment's last kept rows (every stage's with
`keep_intermediate`). A stage's `process` therefore sees batches of any size, even a few rows:
its decisions must not depend on how a shard is cut into batches.

`fingerprint(shard_plan)` says what, besides the input shard, the code and the config, a finished
shard depends on (model files, cut-offs, decisions): a rerun reuses a shard only if it matches.
Phases hand each other typed results (`LinePlan`; dedup's `Signatures`, `VerifiedPairs`, `DedupPlan`).
A stage whose scans or plan partitions cost much names their `PhaseResult` type (`scan_result`,
`partition_result`) and fingerprint: the driver keeps each as a done-marker, as it keeps shards.
A filter that scores every document with a model and keeps by threshold or top fraction per
language subclasses `ScoreFilter` (quipu.tasks.score_filter).
"""
from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from quipu.catalog.files import atomic_path, sha256_file, with_path
from quipu.tasks.schema import removed_schema, with_reason

QUIPU_VERSION = "0.1.0"
PARQUET_OPTIONS = dict(compression="zstd", compression_level=3, write_statistics=True)
SNIPPET_CHARS = 240


class StageConfig(BaseModel):
    """Base of every stage's config block: unknown keys are errors, every stage can be switched off."""
    model_config = ConfigDict(extra="forbid", validate_default=True)
    enabled: bool = True
    batch_rows: int = Field(2000, gt=0, description="documents per batch read from a shard")


class Shard(BaseModel):
    """What tasks pass each other: a path and its content hash, never the documents."""
    name: str
    path: str
    sha256: str
    rows: int
    bytes: int = 0


class ShardResult(BaseModel):
    """One stage's outcome on one shard; also its done-marker (`<stage>/_shards/<shard>.json`)."""
    stage: str
    shard: str
    fingerprint: str
    input: Shard
    kept: Shard | None        # None: the stage ran fused and its kept rows went on unwritten
    removed: Shard
    input_docs: int
    kept_docs: int
    removed_docs: int
    removed_by_reason: dict[str, int] = Field(default_factory=dict)
    examples: dict[str, list[dict]] = Field(default_factory=dict)
    stats: dict[str, Any] = Field(default_factory=dict)
    bytes_in: int = 0
    bytes_out: int = 0
    chars_in: int = 0
    chars_out: int = 0
    seconds: float = 0.0
    skipped: bool = False     # reused from an earlier run (not stored in the marker)

    def outputs(self) -> list[Shard]:
        return [s for s in (self.kept, self.removed) if s is not None]


@dataclass(frozen=True)
class RunContext:
    """What a stage knows of the run it is part of, passed explicitly (never through a global)."""
    run_dir: str                    # absolute path of the run folder
    dataset: str | None = None      # catalog name of the curated dataset: names the dedup index
    run_id: str | None = None       # catalog run id (e.g. benchmark versions are recorded under it)
    # the one schema of every stage's removed/ rows in this run (the pipeline's: every column any of
    # its stages adds); None: a stage run on its own writes its own columns
    removed_schema: pa.Schema | None = None

    def removed_rows_schema(self, columns: tuple[pa.Field, ...] = ()) -> pa.Schema:
        """The schema a stage adding `columns` writes its removed rows in, in this run."""
        return self.removed_schema if self.removed_schema is not None else removed_schema(list(columns))

    def layout(self, stage: str) -> "StageLayout":
        return StageLayout(Path(self.run_dir) / stage)

    # the run-level entries of the run folder (a stage's own: `layout(stage)`)
    @property
    def curated(self) -> Path:
        return Path(self.run_dir) / "curated"

    @property
    def quarantine(self) -> Path:
        return Path(self.run_dir) / "quarantine"

    @property
    def summary(self) -> Path:
        return Path(self.run_dir) / "run.json"


DETACHED = RunContext(run_dir="")   # a stage used on batches only (unit tests, notebooks)


@dataclass(frozen=True)
class StageLayout:
    """Where one stage writes in the run folder (the one place this is computed)."""
    root: Path

    @property
    def kept(self) -> Path:
        return self.root / "kept"

    @property
    def removed(self) -> Path:
        return self.root / "removed"

    @property
    def markers(self) -> Path:
        return self.root / "_shards"

    @property
    def report(self) -> Path:
        return self.root / "report.json"

    def scratch(self, name: str) -> Path:
        """A folder for a global stage's work files (signatures, plans, scores). Name it with a
        leading `_`: the run deletes such folders when it completes (unless `keep_work_files`)."""
        return self.root / name

    def work_dirs(self) -> list[Path]:
        """The stage's work folders: `_*` beside `_shards` and any folder inside `_shards`; never
        the done-markers, `removed/` or the report."""
        if not self.root.is_dir():
            return []
        dirs = [p for p in self.root.iterdir() if p.is_dir() and p.name.startswith("_") and p != self.markers]
        if self.markers.is_dir():
            dirs += [p for p in self.markers.iterdir() if p.is_dir()]
        return sorted(dirs)


class StoredFile(BaseModel):
    """A file a phase wrote, with its content hash: a rerun reuses the phase only if it is intact."""
    path: str
    sha256: str


class PhaseResult(BaseModel):
    """The typed result of a scan or a plan partition that is worth keeping across a kill (dedup's
    signatures and verified pairs): the driver stores it as a done-marker, as it does a shard's
    `ShardResult`, and reuses it when its fingerprint matches and every file it names is intact."""
    fingerprint: str = ""      # set by the driver: what the result depends on
    files: dict[str, StoredFile] = Field(default_factory=dict)
    seconds: float = 0.0
    skipped: bool = False      # reused from an earlier run (not stored in the marker)

    def outputs(self) -> list[StoredFile]:
        return list(self.files.values())


@dataclass
class Outcome:
    kept: pa.Table
    removed: pa.Table            # the kept schema plus `reason` (and stage-specific columns)
    # stage-specific counters, summed across shards; a stage that edits text counts its edits under
    # stats["edits"] ({what: count}), which the run summary and the funnel show beside removals
    stats: dict = field(default_factory=dict)


class Stage:
    """One stage after extract. Subclasses set `name` and `Config` and implement `process`."""
    name: ClassVar[str]
    Config: ClassVar[type[StageConfig]]
    # every column the stage adds to its rows (kept or removed): declared, so that all removed/
    # shards of a run share one schema (`RunContext.removed_schema`)
    columns: ClassVar[tuple[pa.Field, ...]] = ()

    def __init__(self, config: StageConfig, context: RunContext | None = None):
        self.config = config
        self.context = context or DETACHED

    @property
    def layout(self) -> "StageLayout":
        if self.context is DETACHED:
            raise RuntimeError(f"stage {self.name} runs detached from a run (no run folder): give it a RunContext")
        return self.context.layout(self.name)

    def check(self) -> None:
        """Load what the stage needs; raise an error naming the missing or corrupt file."""

    def needs_scan(self) -> bool:
        return False

    def scan(self, shard: Shard) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    # A stage whose scan or plan partitions cost much gives their `PhaseResult` type here and their
    # fingerprint below: the driver then keeps each one as a done-marker and a rerun reuses it.
    scan_result: ClassVar[type[PhaseResult] | None] = None
    partition_result: ClassVar[type[PhaseResult] | None] = None

    def scan_fingerprint(self, shard: Shard) -> str:  # pragma: no cover - interface
        """What a shard's scan depends on (with `scan_result` set)."""
        raise NotImplementedError

    def partition_fingerprint(self, partition: Any) -> str:  # pragma: no cover - interface
        """What a plan partition's result depends on (with `partition_result` set)."""
        raise NotImplementedError

    def plan(self, scans: list | None) -> Any:
        return None

    def plan_partitions(self, scans: list | None) -> list | None:
        """A partitioned plan: small picklable descriptions of the parts `plan_partition` plans
        independently (in parallel tasks) before `combine`; None: one `plan` call."""
        return None

    def plan_partition(self, scans: list | None, partition: Any) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def combine(self, scans: list | None, partials: list) -> Any:  # pragma: no cover - interface
        raise NotImplementedError

    def plan_for(self, shard: Shard, plan: Any) -> Any:
        return plan

    def process(self, batch: pa.Table, shard_plan: Any = None) -> Outcome:  # pragma: no cover - interface
        raise NotImplementedError

    def fingerprint(self, shard_plan: Any) -> dict:
        return {}

    def commit(self, scans: list | None, plan: Any) -> Any:
        return None

    def finalize(self, stats: dict, scans: list | None, plan: Any, committed: Any) -> dict:
        return stats

    def code_version(self) -> str:
        """The quipu version plus a hash of the module source: a code change invalidates old shards."""
        return module_version(inspect.getmodule(type(self)))


def module_version(*modules) -> str:
    src = "".join(inspect.getsource(m) for m in modules)
    return f"{QUIPU_VERSION}+{hashlib.sha256(src.encode()).hexdigest()[:12]}"


# ---- writing ----------------------------------------------------------------------------------

class ShardWriter:
    """Streams record batches into one parquet file under a temporary name; `close()` renames it."""

    def __init__(self, path: Path, schema: pa.Schema | None = None):
        self.path = Path(path)
        self.schema = schema
        self.rows = 0
        self._ctx = atomic_path(self.path)
        self._tmp = self._ctx.__enter__()
        self._writer: pq.ParquetWriter | None = None

    @property
    def opened(self) -> bool:
        """Whether a first batch (even an empty one) gave the file its schema."""
        return self._writer is not None

    def write(self, table: pa.Table) -> None:
        try:
            self._write(table)
        except OSError as e:   # disk full: name the shard (pyarrow's error does not)
            raise with_path(e, self.path) from e

    def _write(self, table: pa.Table) -> None:
        if self._writer is None:
            self.schema = self.schema or table.schema
            self._writer = pq.ParquetWriter(self._tmp, self.schema, **PARQUET_OPTIONS)
        if table.num_rows == 0:
            return
        if table.schema != self.schema:
            table = table.select(self.schema.names).cast(self.schema)
        self._writer.write_table(table)
        self.rows += table.num_rows

    def close(self) -> Shard:
        if self._writer is None:  # nothing written: an empty file with the given schema
            if self.schema is None:
                raise ValueError(f"no schema for empty shard {self.path}")
            self._writer = pq.ParquetWriter(self._tmp, self.schema, **PARQUET_OPTIONS)
        try:
            self._writer.close()
        except OSError as e:   # the last flush on a full disk: name the shard
            raise with_path(e, self.path) from e
        self._ctx.__exit__(None, None, None)
        return Shard(name=self.path.stem, path=str(self.path), sha256=sha256_file(self.path),
                     rows=self.rows, bytes=self.path.stat().st_size)

    def abort(self) -> None:
        """Drop the temporary file; never raises (it runs while another error propagates)."""
        try:
            if self._writer is not None:
                self._writer.close()
        except Exception:
            pass  # e.g. the disk is full: closing cannot flush, the file is deleted anyway
        try:
            self._ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)
        except Exception:
            pass


def write_table(path: Path, table: pa.Table) -> Shard:
    w = ShardWriter(path, table.schema)
    w.write(table)
    return w.close()


def split_by_mask(batch: pa.Table, keep: list[bool], reasons: list[str | None]) -> tuple[pa.Table, pa.Table]:
    """Kept rows, and removed rows with their reason column, from a per-row decision."""
    mask = pa.array(keep, pa.bool_())
    kept = batch.filter(mask)
    removed = batch.filter(pc.invert(mask))
    removed_reasons = [r for k, r in zip(keep, reasons) if not k]
    return kept, with_reason(removed, removed_reasons)


def snippet(text: str | None, n: int = SNIPPET_CHARS) -> str:
    """The start of a text on one line: what reports show of a document."""
    text = (text or "").strip().replace("\n", " ")
    return text if len(text) <= n else text[:n] + "…"


def langs_of(batch: pa.Table, unknown: str = "und") -> list[str]:
    """Each document's `lang` (from langid), or `unknown` when langid did not run."""
    if "lang" not in batch.column_names:
        return [unknown] * batch.num_rows
    return [lang or unknown for lang in batch.column("lang").to_pylist()]
