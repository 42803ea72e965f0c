"""Reading input files: `read` picks a file's reader from the format table (quipu.tasks.reading.formats,
by file name ending: WARC/ARC, JSONL (plain, .gz, .zst), parquet, PDF, plain text and Markdown), on
local paths, globs or any fsspec URL; `expand_inputs` lists the files of the inputs given;
`plan_slices` splits a large file into work units with its format's slicer.

Each reader yields `RawRecord`s (a document, possibly still HTML) and `Quarantined` entries (a
record or a file part that could not be read, with a reason a user can act on). Nothing is skipped
silently: WARC records that are not documents (requests, warcinfo, revisits, metadata) are counted
by type in `ReadStats.skipped`.

Hostile input costs at most the record it is in. Every reader isolates records and resynchronises
after damage, and holds a bounded amount of memory whatever the input (`ReadLimits`):
- JSONL: a bad line is one quarantined record and reading goes on with the next line. Lines are
  split in bounded chunks: a line over `max_record_bytes` is never held whole (it becomes a removed
  `extract:too_large` document carrying the line's first bytes and its size). gzip members and zstd
  frames are decompressed by us, a bounded amount at a time: corrupt compressed bytes are one
  quarantined record ("unreadable bytes ...", the partial line they cut included) and reading
  resumes at the next gzip member / zstd frame; decompression that expands beyond `max_expansion`
  times the file's size (a bomb) stops with one quarantined record.
- WARC/ARC: warcio parses each record, reading through a line cap (`max_header_bytes`: warcio's own
  readline has none). When a record cannot be parsed, or its block runs past the end of the data
  (a wrong Content-Length that would swallow the records after it), the damaged range is one
  quarantined record and reading resumes at the next record header found after it (a gzip member
  that decompresses to a WARC/ARC header, or a `WARC/1.x` / ARC header line).
- parquet: any string-like `text` column (string, large_string, string_view, dictionary of strings,
  binary holding UTF-8) is read batch by batch per row group; a row that is null or not UTF-8 is one
  quarantined record; a batch or row group that cannot be decoded is one quarantined record for its
  rows (`row N`, the range in the reason).
- Any file: a path that is not a regular file (FIFO, device, socket, dangling symbolic link) is one
  quarantined record and is never opened; a file that cannot be opened at all is one quarantined
  record; a file whose reading runs past `max_file_seconds` stops with one quarantined record for
  what was not read.

Large files are read in parts (`FileSlice`, planned by `plan_slices` with the format's slicer) so that one file does not
make one task: plain JSONL at line boundaries (the line count before each cut is counted once, so
ids and `line N` positions are those of the whole file), parquet by row groups. Compressed JSONL
and WARC/ARC files are read whole: finding a record boundary inside them means decompressing up to
it.

A PDF file is one record: a document whose pages stage extract reads (quipu.tasks.reading.pdf_file).
A .txt or .md file is one document (quipu.tasks.reading.text).

A "record" in `records read` is therefore: a JSONL line, a WARC/ARC record, a parquet row, or one
unreadable range/file reported as a single quarantined record (a text file or a PDF: the file).

We read with warcio rather than datatrove's WarcReader: datatrove's reader drops records it cannot
classify (libmagic) and aborts on a truncated member without saying how much it lost, and our
accounting standard needs every record counted.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Iterator

import fsspec

from quipu.catalog.errors import UserError
from quipu.tasks.reading.files import FileSlice, file_problem, file_size, local_path, source_name
from quipu.tasks.reading.formats import FOLDER_SUFFIXES, SUPPORTED, format_of
from quipu.tasks.reading.records import Quarantined, RawRecord, ReadLimits, ReadStats


_FOLDER_NOTE = (f" (a folder with no {', '.join(FOLDER_SUFFIXES)} file in it; other inputs are read when named or "
                "matched by a glob, e.g. {}/*.txt)")


def expand_inputs(patterns: list[str]) -> list[str]:
    """Expand globs (local or fsspec) to a sorted, de-duplicated list of files.

    A folder takes in the files of the formats read in folders (`FOLDER_SUFFIXES`: not .txt, which
    a data folder holds as its README or LICENSE). Local entries that are not regular files (FIFOs,
    dangling links) are listed too: the reader quarantines them with a reason instead of their
    vanishing from the counts. Raises FileNotFoundError naming the first pattern that matches nothing.
    """
    files: list[str] = []
    for pattern in patterns:
        try:
            fs, _, paths = fsspec.get_fs_token_paths(pattern)
        except ImportError as e:   # s3://, gs://, ... without the fsspec backend installed
            raise UserError(f"input {pattern}: {e.msg or e}".rstrip(".") + "; install it or copy the files locally") from None
        except (ValueError, OSError) as e:   # an unknown protocol, bad credentials, an unreachable host
            raise UserError(f"input {pattern}: cannot be listed ({type(e).__name__}: {e})") from None
        is_local = fs.protocol in ("file", ("file", "local")) or "file" in getattr(fs, "protocol", ())
        if is_local:
            matched = [p for p in paths if os.path.lexists(p) and not os.path.isdir(p)]
        else:
            matched = [p for p in paths if fs.isfile(p)]
        folder = not matched and not any(ch in pattern for ch in "*?[") and fs.isdir(pattern)
        if folder:
            if is_local:  # os.walk lists FIFOs and dangling links, and never follows links into loops
                matched = sorted(os.path.join(d, f) for d, _, fs_ in os.walk(pattern) for f in fs_
                                 if f.lower().endswith(FOLDER_SUFFIXES))
            else:
                matched = sorted(p for p in fs.find(pattern) if p.lower().endswith(FOLDER_SUFFIXES))
        if not matched:
            raise FileNotFoundError(f"input not found: {pattern}" + (_FOLDER_NOTE.format(pattern.rstrip("/")) if folder else ""))
        for p in matched:
            files.append(str(Path(p)) if is_local else fs.unstrip_protocol(p))
    return sorted(dict.fromkeys(files))


def plan_slices(path: str, part_bytes: int) -> list[FileSlice] | None:
    """The parts of a local file of at least twice `part_bytes` whose format has a slicer (plain
    JSONL, parquet), each about `part_bytes` (the last up to 1.5x); None for a file read whole
    (smaller, compressed, WARC/ARC, remote, or unreadable: its reader reports why)."""
    size = file_size(path)
    fmt = format_of(path)
    if local_path(path) is None or size is None or size < 2 * part_bytes or fmt is None or fmt.slicer is None or file_problem(path):
        return None
    try:
        slices = fmt.slicer(path, size, part_bytes)
    except (OSError, ValueError):
        return None
    return slices if slices and len(slices) > 1 else None


def read(path: str, stats: ReadStats, limits: ReadLimits = ReadLimits(),
         part: FileSlice | None = None) -> Iterator[RawRecord | Quarantined]:
    """Every record of one file (or of one part of it), then a quarantine entry for anything the
    file's time budget cut."""
    problem = file_problem(path)
    if problem:
        yield Quarantined(source_name(path), "file", problem)
        return
    fmt = format_of(path)
    size = file_size(path)
    if size == 0:  # most often a failed download or copy: say so rather than read nothing
        try:   # ... unless it cannot be read at all, or is a /proc-like file whose size says nothing
            with fsspec.open(path, "rb") as fh:
                has_bytes = bool(fh.read(1))
        except OSError as e:
            yield Quarantined(source_name(path), "file", f"cannot read file: {type(e).__name__}: {e.strerror or e}")
            return
        if not has_bytes:
            yield Quarantined(source_name(path), "file", "empty file (0 bytes)")
            return
    if fmt is None:
        yield Quarantined(source_name(path), "file", f"unsupported file type (expected one of {', '.join(SUPPORTED)})")
        return
    items = fmt.read(path, stats, limits, size, part)
    name = source_name(path)
    if name != path:   # a name whose bytes are not UTF-8: opened by its bytes, recorded escaped
        items = (dataclasses.replace(it, source=name) for it in items)
    deadline = time.monotonic() + limits.max_file_seconds
    last = "file"
    while True:
        try:
            item = next(items)
        except StopIteration:
            break
        except OSError as e:   # EACCES, EIO, a file removed or cut while read: this file stops here, the run goes on
            where = "file" if last == "file" else f"after {last}"
            yield Quarantined(name, where, f"cannot read file: {type(e).__name__}: {e.strerror or e}")
            return
        last = item.offset if isinstance(item, RawRecord) else item.record
        yield item
        if time.monotonic() > deadline:
            items.close()
            where = f"after {last}" if last.startswith("line ") else last
            yield Quarantined(name, where,
                              f"time budget exceeded: reading stopped after {limits.max_file_seconds:g} s "
                              f"(extract.max_file_seconds); the rest of the {'file' if part is None else f'part ({part.describe()})'} was not read")
            return

