"""What every shard-level stage shares: its config base, the shard it reads, and the runner that
applies a stage's pure batch logic to one shard and writes kept/removed shards atomically.

A stage is a small class (datatrove's `PipelineStep` in spirit): `process(batch) -> Outcome`, one
job, a reason for every removal. `process_shard` does the rest: streaming the shard in batches,
writing `kept/` and `removed/` under temporary names, counting, checking `input = kept + removed`,
and leaving a done-marker whose fingerprint (input hash, stage config hash, code version) lets a
rerun skip the shard.
"""
from __future__ import annotations

import hashlib
import inspect
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict

from catalog.files import atomic_path, read_json, sha256_file, sha256_json, write_json_atomic

QUIPU_VERSION = "0.1.0"
EXAMPLES_PER_REASON = 3
SNIPPET_CHARS = 240
PARQUET_OPTIONS = dict(compression="zstd", compression_level=3, write_statistics=True)


class StageConfig(BaseModel):
    """Base of every stage's config block: unknown keys are errors, every stage can be switched off."""
    model_config = ConfigDict(extra="forbid", validate_default=True)
    enabled: bool = True


class Shard(BaseModel):
    """What tasks pass each other: a path and its content hash, never the documents."""
    name: str
    path: str
    sha256: str
    rows: int
    bytes: int = 0


@dataclass
class Outcome:
    kept: pa.Table
    removed: pa.Table            # the kept schema plus `reason` (and stage-specific columns)
    stats: dict = field(default_factory=dict)   # stage-specific counters, summed across shards


class Stage:
    """One shard-level stage. Subclasses set `name`, take their config, implement `process`."""
    name: ClassVar[str]

    def __init__(self, config: StageConfig):
        self.config = config

    def process(self, batch: pa.Table) -> Outcome:  # pragma: no cover - interface
        raise NotImplementedError

    def code_version(self) -> str:
        """The quipu version plus a hash of the module source: a code change invalidates old shards."""
        src = inspect.getsource(inspect.getmodule(type(self)))
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

    def write(self, table: pa.Table) -> None:
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
        self._writer.close()
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


# ---- counting ---------------------------------------------------------------------------------

def text_sizes(table: pa.Table) -> tuple[int, int]:
    """(UTF-8 bytes, characters) of the `text` column."""
    if table.num_rows == 0:
        return 0, 0
    text = table.column("text")
    return int(pc.sum(pc.binary_length(text)).as_py() or 0), int(pc.sum(pc.utf8_length(text)).as_py() or 0)


def snippet(text: str | None, n: int = SNIPPET_CHARS) -> str:
    text = (text or "").strip().replace("\n", " ")
    return text if len(text) <= n else text[:n] + "…"


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


# ---- the shard runner -------------------------------------------------------------------------

def stage_dirs(run_dir: str | Path, stage: str) -> tuple[Path, Path, Path]:
    base = Path(run_dir) / stage
    return base / "kept", base / "removed", base / "_shards"


def fingerprint(stage: Stage, input_sha: str) -> str:
    return sha256_json({"stage": stage.name, "input": input_sha, "code": stage.code_version(),
                        "config": stage.config.model_dump(mode="json")})


def load_done(marker: Path, fp: str) -> dict | None:
    """The stored result of a finished shard if it matches `fp` and its outputs are intact."""
    if not marker.exists():
        return None
    try:
        done = read_json(marker)
    except Exception:
        return None
    if done.get("fingerprint") != fp:
        return None
    for key in ("kept", "removed"):
        out = done.get(key)
        if out and (not Path(out["path"]).exists() or sha256_file(out["path"]) != out["sha256"]):
            return None
    return done


def process_shard(stage: Stage, shard: Shard, run_dir: str | Path, batch_rows: int = 2000) -> dict:
    """Run `stage` over one shard; returns the shard's result (also stored as its done-marker)."""
    kept_dir, removed_dir, done_dir = stage_dirs(run_dir, stage.name)
    marker = done_dir / f"{shard.name}.json"
    fp = fingerprint(stage, shard.sha256)
    done = load_done(marker, fp)
    if done is not None:
        done["skipped"] = True
        return done

    t0 = time.perf_counter()
    kept_w = ShardWriter(kept_dir / f"{shard.name}.parquet")
    removed_w = ShardWriter(removed_dir / f"{shard.name}.parquet")
    counts: dict[str, int] = {}
    examples: dict[str, list[dict]] = {}
    stats: dict[str, Any] = {}
    n_in = bytes_in = chars_in = bytes_out = chars_out = 0
    try:
        pf = pq.ParquetFile(shard.path)
        batches = pf.iter_batches(batch_size=batch_rows)
        first = True
        for rb in batches:
            batch = pa.Table.from_batches([rb])
            first = False
            out = stage.process(batch)
            _check_outcome(stage.name, batch, out)
            n_in += batch.num_rows
            b, c = text_sizes(batch); bytes_in += b; chars_in += c
            b, c = text_sizes(out.kept); bytes_out += b; chars_out += c
            kept_w.write(out.kept)
            removed_w.write(out.removed)
            count_reasons(out.removed, counts, examples)
            merge_counts(stats, out.stats)
        if first:  # an empty shard still yields (empty) outputs with the stage's schema
            out = stage.process(pf.schema_arrow.empty_table())
            kept_w.write(out.kept)
            removed_w.write(out.removed)
        kept = kept_w.close()
        removed = removed_w.close()
    except BaseException:
        kept_w.abort()
        removed_w.abort()
        raise
    result = {
        "stage": stage.name, "shard": shard.name, "fingerprint": fp,
        "input": shard.model_dump(), "kept": kept.model_dump(), "removed": removed.model_dump(),
        "input_docs": n_in, "kept_docs": kept.rows, "removed_docs": removed.rows,
        "removed_by_reason": counts, "examples": examples, "stats": stats,
        "bytes_in": bytes_in, "bytes_out": bytes_out, "chars_in": chars_in, "chars_out": chars_out,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if result["input_docs"] != result["kept_docs"] + result["removed_docs"]:
        raise AssertionError(f"{stage.name}/{shard.name}: input {n_in} != kept {kept.rows} + removed {removed.rows}")
    write_json_atomic(marker, result)
    result["skipped"] = False
    return result


def _check_outcome(stage: str, batch: pa.Table, out: Outcome) -> None:
    if out.kept.num_rows + out.removed.num_rows != batch.num_rows:
        raise AssertionError(f"stage {stage}: {batch.num_rows} in, {out.kept.num_rows} kept + "
                             f"{out.removed.num_rows} removed")
    if out.removed.num_rows and "reason" not in out.removed.column_names:
        raise AssertionError(f"stage {stage}: removed rows without a reason")


def split_by_mask(batch: pa.Table, keep: list[bool], reasons: list[str | None]) -> tuple[pa.Table, pa.Table]:
    """Kept rows, and removed rows with their reason column, from a per-row decision."""
    mask = pa.array(keep, pa.bool_())
    kept = batch.filter(mask)
    removed = batch.filter(pc.invert(mask))
    removed_reasons = [r for k, r in zip(keep, reasons) if not k]
    from tasks.schema import with_reason
    return kept, with_reason(removed, removed_reasons)


# ---- stage reports ----------------------------------------------------------------------------

def aggregate(stage: str, results: list[dict]) -> dict:
    """Sum per-shard results into the stage report (shards in the given, deterministic order)."""
    report: dict[str, Any] = {"stage": stage, "input_docs": 0, "kept_docs": 0, "removed_docs": 0,
                              "bytes_in": 0, "bytes_out": 0, "chars_in": 0, "chars_out": 0,
                              "seconds": 0.0, "removed_by_reason": {}, "examples": {}, "stats": {},
                              "shards": []}
    for r in results:
        for k in ("input_docs", "kept_docs", "removed_docs", "bytes_in", "bytes_out", "chars_in", "chars_out"):
            report[k] += r.get(k, 0)
        report["seconds"] += r.get("seconds", 0.0)
        for reason, n in r.get("removed_by_reason", {}).items():
            report["removed_by_reason"][reason] = report["removed_by_reason"].get(reason, 0) + n
        for reason, ex in r.get("examples", {}).items():
            slot = report["examples"].setdefault(reason, [])
            slot.extend(ex[: max(0, EXAMPLES_PER_REASON - len(slot))])
        merge_counts(report["stats"], r.get("stats", {}))
        report["shards"].append({"name": r.get("shard"), "input_docs": r.get("input_docs", 0),
                                 "kept_docs": r.get("kept_docs", 0), "removed_docs": r.get("removed_docs", 0),
                                 "skipped": r.get("skipped", False)})
    report["seconds"] = round(report["seconds"], 3)
    report["removed_by_reason"] = dict(sorted(report["removed_by_reason"].items(), key=lambda kv: (-kv[1], kv[0])))
    if report["input_docs"] != report["kept_docs"] + report["removed_docs"]:
        raise AssertionError(f"stage {stage}: input {report['input_docs']} != kept {report['kept_docs']} "
                             f"+ removed {report['removed_docs']}")
    return report


def write_report(run_dir: str | Path, stage: str, report: dict) -> Path:
    path = Path(run_dir) / stage / "report.json"
    write_json_atomic(path, report)
    return path
