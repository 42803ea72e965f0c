"""Parquet: any string-like `text` column, read batch by batch per row group (a bad row, batch or
row group is one quarantined record; see the package docstring, quipu.tasks.reading). A large
file is sliced by row groups (`slices`)."""
from __future__ import annotations

import os
from typing import Iterator

import fsspec

from quipu.tasks.reading.files import FileSlice, local_path
from quipu.tasks.reading.records import (TOO_LARGE_PREFIX_BYTES, Quarantined, RawRecord, ReadLimits, ReadStats,
                                         escape_snippet, metadata_of, stable_id, str_or_none)

SUFFIXES = (".parquet",)


def read_file(path: str, stats: ReadStats, limits: ReadLimits, size: int | None,
              part: FileSlice | None) -> Iterator[RawRecord | Quarantined]:
    return read_parquet(path, limits=limits, part=part)


def slices(path: str, size: int, part_bytes: int) -> list[FileSlice] | None:
    return _parquet_slices(path, part_bytes)


BATCH_BYTES = 32 << 20                # decoded bytes of a parquet batch (rows: at most the reader's batch_rows)
MAX_PARQUET_FOOTER_BYTES = 64 << 20   # real footers are KBs to a few MB; pyarrow reads the declared size whole


def parquet_footer_problem(path: str) -> str | None:
    """Why a parquet file's footer must not be read (a declared length beyond the file or the
    cap: a sparse file can declare 4 GB that pyarrow would allocate), or None; reads 8 bytes."""
    try:
        with fsspec.open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size < 12:
                return f"not a parquet file: {size} bytes"
            fh.seek(size - 8)
            tail = fh.read(8)
    except OSError as e:
        return f"cannot read file: {type(e).__name__}: {e.strerror or e}"
    if tail[4:] != b"PAR1":
        return "not a parquet file: no PAR1 magic at the end (truncated, or another format)"
    declared = int.from_bytes(tail[:4], "little")
    if declared > size - 12:
        return f"corrupt parquet footer: it declares {declared:,} bytes, the file has {size:,}"
    if declared > MAX_PARQUET_FOOTER_BYTES:
        return (f"parquet footer of {declared:,} bytes is over the {MAX_PARQUET_FOOTER_BYTES >> 20} MiB read cap "
                "(metadata that large is not a data file written by a normal tool)")
    return None


def _parquet_slices(path: str, part_bytes: int) -> list[FileSlice] | None:
    import pyarrow.parquet as pq
    if parquet_footer_problem(path):
        return None   # read_parquet quarantines it with the reason
    meta = pq.ParquetFile(local_path(path)).metadata
    groups = []        # (first byte, last byte + 1, rows) per row group
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        cols = [rg.column(c) for c in range(rg.num_columns)]
        starts = [c.dictionary_page_offset if c.has_dictionary_page and c.dictionary_page_offset else c.data_page_offset
                  for c in cols]
        groups.append((min(starts), max(st + c.total_compressed_size for st, c in zip(starts, cols)), rg.num_rows))
    out, g0, rows = [], 0, 0
    for g in range(len(groups) + 1):
        size = groups[g - 1][1] - groups[g0][0] if g > g0 else 0
        rest = groups[-1][1] - groups[g - 1][1] if g > g0 else 0
        if g == len(groups) or (size >= part_bytes and rest >= part_bytes // 2):
            if g > g0:
                out.append(FileSlice(path, "parquet", g0, g, rows, groups[g0][0], groups[g - 1][1]))
                rows += sum(n for _, _, n in groups[g0:g])
                g0 = g
    return out



def _text_array(arr, pa):
    """The `text` column as a string or binary array, whatever string-like type it was written as."""
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return arr
    if t == pa.string_view():
        return arr.cast(pa.large_string())
    if t == pa.binary_view():
        return arr.cast(pa.large_binary())
    raise TypeError(f"column 'text' is {t}")


def _values(arr, pa, text: bool = False) -> list:
    """A column's values as Python objects. A dictionary-encoded column's entries are made once and
    shared by the rows that use them: 200 rows of one 40 MB entry cost 40 MB, not 8 GB (the reader
    keeps such columns encoded: `read_dictionary`)."""
    if pa.types.is_dictionary(arr.type):
        entries = (_text_array(arr.dictionary, pa) if text else arr.dictionary).to_pylist()
        return [None if i is None else entries[i] for i in arr.indices.to_pylist()]
    return (_text_array(arr, pa) if text else arr).to_pylist()


def _batch_rows(pf, rg: int, batch_rows: int) -> int:
    """Rows per batch of row group `rg`: at most `batch_rows`, and about `BATCH_BYTES` of decoded
    (uncompressed) data, from the row group's metadata."""
    md = pf.metadata.row_group(rg)
    per_row = sum(md.column(i).total_uncompressed_size for i in range(md.num_columns)) / max(1, md.num_rows)
    return int(max(1, min(batch_rows, BATCH_BYTES // max(1, per_row))))


def _is_text_type(t, pa) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or t in (pa.string_view(), pa.binary_view()))


def read_parquet(path: str, batch_rows: int = 1000, limits: ReadLimits = ReadLimits(),
                 part: FileSlice | None = None) -> Iterator[RawRecord | Quarantined]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    problem = parquet_footer_problem(path)
    if problem:
        yield Quarantined(path, "file", problem)
        return
    try:
        fh = fsspec.open(path, "rb").open()
        schema = pq.ParquetFile(fh).schema_arrow
        strings = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                   or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
        pf = pq.ParquetFile(fh, read_dictionary=strings)      # dictionary-encoded columns stay encoded
    except Exception as e:  # corrupt footer, truncated file, not parquet at all
        yield Quarantined(path, "file", f"unreadable parquet: {type(e).__name__}: {str(e)[:200]}")
        return
    with fh:
        if "text" not in schema.names:
            yield Quarantined(path, "file", f"parquet has no column 'text' (columns: {', '.join(schema.names)})")
            return
        ttype = schema.field("text").type
        if not _is_text_type(ttype, pa):
            yield Quarantined(path, "file", f"parquet column 'text' is {ttype}, expected string")
            return
        row = part.before if part else 0
        for rg in range(part.start, part.end) if part else range(pf.num_row_groups):
            rg_rows = pf.metadata.row_group(rg).num_rows
            rg_end = row + rg_rows
            try:
                for rb in pf.iter_batches(batch_size=_batch_rows(pf, rg, batch_rows), row_groups=[rg]):
                    try:
                        texts = _values(rb.column(rb.schema.get_field_index("text")), pa, text=True)
                        others = rb.drop_columns(["text"])
                        columns = {name: _values(others.column(name), pa) for name in others.schema.names}
                        objs = [dict(zip(columns, row)) for row in zip(*columns.values())] if columns else [{} for _ in texts]
                    except Exception as e:
                        yield Quarantined(path, f"row {row}", f"undecodable rows {row}-{row + rb.num_rows - 1}: "
                                                              f"{type(e).__name__}: {str(e)[:200]}")
                        row += rb.num_rows
                        continue
                    for obj, text in zip(objs, texts):
                        yield _parquet_record(path, row, obj, text, limits)
                        row += 1
            except Exception as e:  # a corrupt page or row group: the rest of it is one record
                if row < rg_end:
                    yield Quarantined(path, f"row {row}", f"unreadable row group {rg} (rows {row}-{rg_end - 1}): "
                                                          f"{type(e).__name__}: {str(e)[:200]}")
                row = rg_end


def _parquet_record(path: str, row: int, obj: dict, text, limits: ReadLimits) -> RawRecord | Quarantined:
    where = f"row {row}"
    rid = str_or_none(obj.get("id"))
    if text is None:
        return Quarantined(path, where, "null 'text'", "", rid)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            return Quarantined(path, where, f"'text' is not valid UTF-8: bad byte at position {e.start}",
                               escape_snippet(text), rid)
    base = dict(id=rid or stable_id(path, where), source=path, offset=where,
                url=str_or_none(obj.get("url")), date=str_or_none(obj.get("date")),
                content_type=str_or_none(obj.get("content_type")), metadata=metadata_of(obj))
    if len(text) > limits.max_record_bytes:  # characters >= bytes / 4: only clearly oversized rows
        return RawRecord(**base, payload=text[:TOO_LARGE_PREFIX_BYTES], reject="too_large",
                         size=len(text.encode("utf-8", "surrogatepass")))
    return RawRecord(**base, payload=text)
