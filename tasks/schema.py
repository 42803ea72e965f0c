"""The document table every stage reads and writes.

Base columns come from extraction; each stage appends its signal columns (lang, lang_score,
quality_score, ppl_*, ...). Reader fields we do not model are kept as one JSON string column
`metadata`, because per-document key sets differ between sources and a parquet file needs one schema.
"""
from __future__ import annotations

import pyarrow as pa

BASE_FIELDS = [
    pa.field("id", pa.string(), nullable=False),
    pa.field("text", pa.string(), nullable=False),
    pa.field("source", pa.string()),         # the input file the record came from
    pa.field("url", pa.string()),
    pa.field("date", pa.string()),           # WARC-Date when there is one
    pa.field("content_type", pa.string()),
    pa.field("metadata", pa.string()),       # JSON object of all other input fields
]
BASE_SCHEMA = pa.schema(BASE_FIELDS)

REASON = pa.field("reason", pa.string(), nullable=False)
STAGE = pa.field("stage", pa.string(), nullable=False)      # which stage removed the row
TEXT_BYTES = pa.field("text_bytes", pa.int64())            # extract: size of a too-large record (its text is cut)

QUARANTINE_SCHEMA = pa.schema([
    pa.field("source", pa.string()),
    pa.field("record", pa.string()),         # where in the file: line number, byte offset, record id
    pa.field("id", pa.string()),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("snippet", pa.string()),        # the start of the unreadable bytes, escaped
])


def with_reason(table: pa.Table, reasons: list[str]) -> pa.Table:
    return table.append_column(REASON, pa.array(reasons, pa.string()))


def set_column(table: pa.Table, field: pa.Field, values) -> pa.Table:
    """Add or replace a column (a rerun of a stage over its own output must not duplicate it)."""
    arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values, field.type)
    idx = table.schema.get_field_index(field.name)
    if idx >= 0:
        return table.set_column(idx, field, arr)
    return table.append_column(field, arr)


def removed_schema(stage_columns: list[pa.Field]) -> pa.Schema:
    """The one schema of every `<stage>/removed/*.parquet` of a run, so that
    `pl.scan_parquet("OUT/*/removed/*.parquet")` reads them all as one table: the base columns, the
    removing `stage` and its `reason`, then every column any stage adds (null where it did not run)."""
    return pa.schema([*BASE_FIELDS, STAGE, REASON, TEXT_BYTES, *stage_columns])


def conform(table: pa.Table, schema: pa.Schema, stage: str) -> pa.Table:
    """`table` (a stage's removed rows) in `schema`: `stage` filled in, absent columns null. A column
    the schema does not know is an error: a stage must declare what it adds (`Stage.columns`)."""
    unknown = [c for c in table.column_names if c not in schema.names]
    if unknown:
        raise ValueError(f"stage {stage}: removed rows carry undeclared columns {unknown} (add them to the stage's `columns`)")
    n = table.num_rows
    arrays = []
    for f in schema:
        if f.name == STAGE.name:
            arrays.append(pa.array([stage] * n, pa.string()))
        elif f.name in table.column_names:
            arrays.append(table.column(f.name).cast(f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)
