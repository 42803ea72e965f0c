"""The final step: the last stage's kept shards rewritten as `curated/part-NNNNN.parquet` of about
`shard_mb` each, in pipeline order (or curriculum order when a sort column is given).

Parts are written under temporary names and renamed; parts left from an earlier, different run
into the same directory are removed afterwards. A done-marker (fingerprint of the input shard
hashes and the output config) lets a rerun skip the rewrite.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from quipu.catalog.files import read_json, sha256_file, sha256_json, write_json_atomic
from quipu.tasks.stage import Shard, ShardWriter
from quipu.tasks.urls import with_url_columns


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shard_mb: float = Field(128.0, gt=0, description="target size of one curated shard (text bytes)")
    batch_rows: int = Field(2000, gt=0)
    sort_by: str | None = Field(None, description="write in ascending order of this column within each source (curriculum), e.g. ppl_wayra")
    license: str | None = Field(None, description="licence field of the dataset card OUT/README.md (a Hub licence id, e.g. cc-by-4.0); null: other")


def unify_schema(shards: list[Shard]) -> pa.Schema | None:
    schemas = [pq.read_schema(s.path) for s in shards]
    if not schemas:
        return None
    return pa.unify_schemas(schemas, promote_options="permissive")


def _batches(shards: list[Shard], schema: pa.Schema, cfg: OutputConfig):
    if cfg.sort_by is None:
        for s in shards:
            for rb in pq.ParquetFile(s.path).iter_batches(batch_size=cfg.batch_rows):
                t = pa.Table.from_batches([rb])
                for name in schema.names:  # columns a stage added to some shards only
                    if name not in t.column_names:
                        t = t.append_column(schema.field(name), pa.nulls(t.num_rows, schema.field(name).type))
                yield t.select(schema.names).cast(schema)
        return
    # curriculum: ascending sort column within each source, sources in first-seen order
    table = pa.concat_tables([pq.read_table(s.path).select(schema.names).cast(schema) for s in shards])
    if cfg.sort_by not in table.column_names:
        raise ValueError(f"output.sort_by: column '{cfg.sort_by}' is not in the curated data "
                         f"(columns: {', '.join(table.column_names)})")
    sources = table.column("source").to_pylist()
    first_seen = {s: i for i, s in reversed(list(enumerate(sources)))}
    order_key = pa.array([first_seen[s] for s in sources], pa.int64())
    table = table.append_column("__src", order_key).append_column("__pos", pa.array(range(table.num_rows), pa.int64()))
    idx = pc.sort_indices(table, sort_keys=[("__src", "ascending"), (cfg.sort_by, "ascending"), ("__pos", "ascending")])
    table = table.take(idx).drop_columns(["__src", "__pos"])
    for i in range(0, table.num_rows, cfg.batch_rows):
        yield table.slice(i, cfg.batch_rows)


def curated_marker(out_dir: Path) -> Path:
    """The curated parts' reuse marker (fingerprint and part hashes). It sits beside the folder, not
    in it: `pl.read_parquet("OUT/curated/")` and `load_dataset("parquet", data_dir=...)` read every
    file of the folder."""
    return out_dir.with_name(f".{out_dir.name}.json")


def write_curated(shards: list[Shard], out_dir: str | Path, cfg: OutputConfig) -> list[Shard]:
    out_dir = Path(out_dir)
    marker = curated_marker(out_dir)
    (out_dir / "_curated.json").unlink(missing_ok=True)     # where older versions kept it
    fp = sha256_json({"inputs": [s.sha256 for s in shards], "config": cfg.model_dump(mode="json")})
    if marker.exists():
        done = read_json(marker)
        parts = [Shard(**p) for p in done.get("parts", [])]
        if done.get("fingerprint") == fp and all(Path(p.path).exists() and sha256_file(p.path) == p.sha256 for p in parts):
            return parts
    schema = unify_schema(shards)
    parts: list[Shard] = []
    if schema is not None:
        target = int(cfg.shard_mb * 1e6)
        writer: ShardWriter | None = None
        size = 0
        for batch in _batches(shards, schema, cfg):
            if batch.num_rows == 0:
                continue
            batch = with_url_columns(batch)   # `domain`, `tld`: a blend's `where` can weight by site
            if writer is None:
                writer = ShardWriter(out_dir / f"part-{len(parts):05d}.parquet", batch.schema)
            writer.write(batch)
            size += int(pc.sum(pc.binary_length(batch.column("text"))).as_py() or 0)
            if size >= target:
                parts.append(writer.close())
                writer, size = None, 0
        if writer is not None:
            parts.append(writer.close())
    keep = {Path(p.path).name for p in parts}
    for old in out_dir.glob("part-*.parquet"):
        if old.name not in keep:
            old.unlink()
    write_json_atomic(marker, {"fingerprint": fp, "parts": [p.model_dump() for p in parts]})
    return parts
