"""Input readers, chosen by extension: WARC/ARC, JSONL (plain, .gz, .zst), parquet and PDF, on local
paths, globs or any fsspec URL.

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

Large files are read in parts (`FileSlice`, planned by `plan_slices`) so that one file does not
make one task: plain JSONL at line boundaries (the line count before each cut is counted once, so
ids and `line N` positions are those of the whole file), parquet by row groups. Compressed JSONL
and WARC/ARC files are read whole: finding a record boundary inside them means decompressing up to
it.

A PDF file is one record: a document whose pages stage extract reads (quipu.tasks.pdf); a local file
is read where it lies, a remote one is fetched whole (up to `max_record_bytes`, else removed as
`extract:too_large`).

A "record" in `records read` is therefore: a JSONL line, a WARC/ARC record, a parquet row, or one
unreadable range/file reported as a single quarantined record.

We read with warcio rather than datatrove's WarcReader: datatrove's reader drops records it cannot
classify (libmagic) and aborts on a truncated member without saying how much it lost, and our
accounting standard needs every record counted.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import fsspec

from quipu.catalog.errors import UserError
from quipu.catalog.files import read_blocks
from quipu.tasks.records import (CHUNK, KNOWN_FIELDS, TOO_LARGE_PREFIX_BYTES, Quarantined, RawRecord, ReadLimits,
                                 ReadStats, cannot_open, escape_snippet, find_magic, stable_id, tell_end, zeros_to_end)
from quipu.tasks.pdf import PDF_SUFFIXES
from quipu.tasks.warc import read_warc

WARC_SUFFIXES = (".warc", ".warc.gz", ".arc", ".arc.gz", ".warc.wet.gz", ".wet.gz")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED = WARC_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES + PDF_SUFFIXES


def reader_kind(path: str) -> str | None:
    p = path.lower()
    if p.endswith(WARC_SUFFIXES):
        return "warc"
    if p.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if p.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if p.endswith(PDF_SUFFIXES):
        return "pdf"
    return None


def _local(path: str) -> str | None:
    """The local file system path of `path`, or None for a remote URL."""
    if path.startswith("file://"):
        return path[len("file://"):]
    return None if "://" in path else path


local_path = _local     # the name other modules use

def expand_inputs(patterns: list[str]) -> list[str]:
    """Expand globs (local or fsspec) to a sorted, de-duplicated list of files.

    Local entries that are not regular files (FIFOs, dangling links) are listed too: the reader
    quarantines them with a reason instead of their vanishing from the counts. Raises
    FileNotFoundError naming the first pattern that matches nothing.
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
        if not matched and not any(ch in pattern for ch in "*?["):
            if fs.isdir(pattern):
                if is_local:  # os.walk lists FIFOs and dangling links, and never follows links into loops
                    matched = sorted(os.path.join(d, f) for d, _, fs_ in os.walk(pattern) for f in fs_
                                     if reader_kind(f))
                else:
                    matched = sorted(p for p in fs.find(pattern) if reader_kind(p))
        if not matched:
            raise FileNotFoundError(f"input not found: {pattern}")
        for p in matched:
            files.append(str(Path(p)) if is_local else fs.unstrip_protocol(p))
    return sorted(dict.fromkeys(files))


def source_name(path: str) -> str:
    """The path as recorded (quarantine `source`, reports, catalog): itself, or for a name whose
    bytes are not UTF-8 (the OS gives them as surrogate escapes) the bytes shown as `\\xNN`."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return os.fsencode(path).decode("utf-8", "backslashreplace")


def file_problem(path: str) -> str | None:
    """Why a local path must not be opened (not a regular file), or None.
    Never blocks: a FIFO is only stat'ed, not opened."""
    local = _local(path)
    if local is None:
        return None
    try:
        st = os.stat(local)
    except FileNotFoundError:
        return ("dangling symbolic link: its target does not exist" if os.path.islink(local)
                else "file not found (removed while the run was starting?)")
    except OSError as e:
        return f"cannot read file: {type(e).__name__}: {e}"
    if stat.S_ISREG(st.st_mode):
        return None
    kind = ("named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode) else "character device" if stat.S_ISCHR(st.st_mode)
            else "block device" if stat.S_ISBLK(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode)
            else "directory" if stat.S_ISDIR(st.st_mode) else "special file")
    return f"not a regular file ({kind}): not opened"


def file_size(path: str) -> int | None:
    """Bytes of a local or fsspec file, or None when it cannot be stat'ed (never opens it)."""
    try:
        local = _local(path)
        if local is not None:
            return os.stat(local).st_size
        fs, _, (p,) = fsspec.get_fs_token_paths(path)
        return fs.size(p)
    except Exception:
        return None


@dataclass(frozen=True)
class FileSlice:
    """Part of one large input file, read as a work unit of its own: plain JSONL bytes
    [start, end) that begin after `before` lines, parquet row groups [start, end) that begin
    after `before` rows, or a long PDF's pages [start, end) of `before` (its page count; planned by
    quipu.tasks.pdf_ranges). `first_byte`/`last_byte` bound the bytes it reads (what its hash covers)."""
    path: str
    kind: str            # "jsonl" | "parquet" | "pdf"
    start: int
    end: int
    before: int
    first_byte: int
    last_byte: int

    def describe(self) -> str:
        if self.kind == "pdf":
            return f"pages {self.start + 1}-{self.end}"
        what = "bytes" if self.kind == "jsonl" else "row groups"
        return f"{what} {self.start}-{self.end - 1}"


def plan_slices(path: str, part_bytes: int) -> list[FileSlice] | None:
    """The parts of a local plain-JSONL or parquet file of at least twice `part_bytes`, each about
    `part_bytes` (the last up to 1.5x); None for a file read whole (smaller, compressed, WARC/ARC,
    remote, or unreadable: its reader reports why)."""
    local = _local(path)
    size = file_size(path)
    if local is None or size is None or size < 2 * part_bytes or file_problem(path):
        return None
    low = path.lower()
    try:
        if low.endswith((".jsonl", ".ndjson")):
            slices = _jsonl_slices(path, size, part_bytes)
        elif low.endswith(PARQUET_SUFFIXES):
            slices = _parquet_slices(path, part_bytes)
        else:
            return None
    except (OSError, ValueError):
        return None
    return slices if slices and len(slices) > 1 else None


def _jsonl_slices(path: str, size: int, part_bytes: int) -> list[FileSlice]:
    """Cuts just after the first newline at or past every `part_bytes`, and the lines before each
    (one pass over the file counting newlines: bytes.count runs at memory speed)."""
    cuts: list[tuple[int, int]] = [(0, 0)]       # (byte offset, lines before it)
    pos = lines = 0
    target = part_bytes
    with open(_local(path), "rb") as fh:
        while block := fh.read(1 << 24):
            while target < pos + len(block) and size - target >= part_bytes // 2:
                i = block.find(b"\n", max(0, target - pos))
                if i < 0:
                    break       # the line runs on into the next block: cut there
                cut = pos + i + 1
                if size - cut < part_bytes // 2:
                    target = size      # the rest joins the last part
                    break
                cuts.append((cut, lines + block.count(b"\n", 0, i + 1)))
                target = cut + part_bytes
            lines += block.count(b"\n")
            pos += len(block)
    ends = [c for c, _ in cuts[1:]] + [size]
    return [FileSlice(path, "jsonl", c, e, before, c, e) for (c, before), e in zip(cuts, ends)]


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
    meta = pq.ParquetFile(_local(path)).metadata
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


def read(path: str, stats: ReadStats, limits: ReadLimits = ReadLimits(),
         part: FileSlice | None = None) -> Iterator[RawRecord | Quarantined]:
    """Every record of one file (or of one part of it), then a quarantine entry for anything the
    file's time budget cut."""
    problem = file_problem(path)
    if problem:
        yield Quarantined(source_name(path), "file", problem)
        return
    kind = reader_kind(path)
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
    if kind == "warc":
        items = read_warc(path, stats, limits)
    elif kind == "jsonl":
        items = read_jsonl(path, limits, size, part)
    elif kind == "parquet":
        items = read_parquet(path, limits=limits, part=part)
    elif kind == "pdf":
        items = read_pdf_file(path, limits, size)
    else:
        yield Quarantined(source_name(path), "file", f"unsupported file type (expected one of {', '.join(SUPPORTED)})")
        return
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


# ---- compressed streams -----------------------------------------------------------------------

@dataclass
class _Damage:
    """Bytes of a stream that could not be decompressed (or were not read); `stop` ends the file."""
    reason: str
    stop: bool = False


def _members(fh, magic: bytes, new_decoder, feed, errors, what: str) -> Iterator[bytes | _Damage]:
    """Decompressed chunks of concatenated members (gzip members, zstd frames), bounded in size by
    `feed(decoder, data) -> (output, input bytes consumed)`. Bytes that are no member, a corrupt
    member and a member cut by the end of the file are reported as damage; reading resumes at the
    next member header after where the damaged part starts."""
    pos = 0            # file offset of data[0]
    data = b""         # compressed bytes read from the file and not yet consumed
    dec = None
    member_start = 0
    damage: tuple[int, str] | None = None    # (where the damaged part starts, why): resync first

    while True:
        if damage is not None:
            after, why = damage
            damage = None
            nxt = find_magic(fh, after + 1, magic)
            end = nxt - 1 if nxt is not None else tell_end(fh) - 1
            tail = f"; reading resumed at byte {nxt}" if nxt is not None else "; nothing readable after it"
            yield _Damage(f"{why} (bytes {after}-{end}){tail}")
            if nxt is None:
                return
            fh.seek(nxt)
            pos, data, dec = nxt, b"", None
        if not data:
            data = fh.read(CHUNK)
            if not data:
                if dec is None:
                    return
                if what == "gzip":   # zlib may hold the last output when the input ended at the output cap
                    try:
                        tail = dec.flush()
                    except zlib.error:
                        tail = b""
                    if tail:
                        yield tail
                if dec.eof:
                    return
                # the file ended inside a member: cut short, or a damaged member whose compressed
                # stream ran on through the members after it. Those may still be whole: look again.
                damage = (member_start, f"file truncated inside the {what} member that starts at byte {member_start}")
                continue
        if dec is None:
            if len(data) < len(magic):
                data += fh.read(CHUNK)
            if not data.startswith(magic):
                if zeros_to_end(fh, pos):
                    return
                damage = (pos, f"bytes that are not {what} data")
                continue
            dec, member_start = new_decoder(), pos
        try:
            out, used = feed(dec, data)
        except errors as e:
            damage = (member_start, f"corrupt {what} member at byte {member_start}: {e}")
            continue
        pos += used
        data = data[used:]
        if out:
            yield out
        if dec.eof:
            rest = dec.unused_data
            pos -= len(rest)
            data = rest + data
            dec = None


def _feed_gzip(dec, data: bytes) -> tuple[bytes, int]:
    out = dec.decompress(data, CHUNK)
    return out, len(data) - len(dec.unconsumed_tail)


def _gzip_chunks(fh) -> Iterator[bytes | _Damage]:
    """gzip members, CHUNK bytes of output at a time (zlib's max_length)."""
    return _members(fh, b"\x1f\x8b\x08", lambda: zlib.decompressobj(31), _feed_gzip, zlib.error, "gzip")


def _feed_zstd(dec, data: bytes) -> tuple[bytes, int]:
    # zstandard's decompressobj has no output cap: compressed bytes go in 512 at a time (a zstd block
    # expands to at most 128 KiB, so one call yields a few MB at most, even from a bomb)
    piece = data[:512]
    return dec.decompress(piece), len(piece)


def _zstd_chunks(fh) -> Iterator[bytes | _Damage]:
    """zstd frames. zstandard's stream reader ends a truncated file silently: we say so."""
    import zstandard
    dctx = zstandard.ZstdDecompressor()
    return _members(fh, b"\x28\xb5\x2f\xfd", dctx.decompressobj, _feed_zstd, zstandard.ZstdError, "zstd")


def _plain_chunks(fh, end: int | None = None) -> Iterator[bytes]:
    """The file's bytes from where `fh` stands, up to byte `end` when given."""
    return read_blocks(fh, CHUNK, end)


def _capped(chunks: Iterator[bytes | _Damage], compressed_size: int | None, limits: ReadLimits) -> Iterator[bytes | _Damage]:
    """Stop a decompression bomb: past `min_expansion_bytes`, no more than `max_expansion` times the
    compressed size is decompressed."""
    cap = max(limits.min_expansion_bytes, int(limits.max_expansion * (compressed_size or 0)))
    total = 0
    for c in chunks:
        if isinstance(c, bytes):
            total += len(c)
            if total > cap:
                yield _Damage(f"decompression stopped after {cap:,} bytes: the file expands more than "
                              f"{limits.max_expansion:g}x (extract.max_expansion; a decompression bomb?)", stop=True)
                return
        yield c


# ---- JSONL ------------------------------------------------------------------------------------

@dataclass
class _Line:
    data: bytes            # the whole line, or its first bytes when `size` is set
    size: int | None = None


def _lines(chunks: Iterator[bytes | _Damage], max_bytes: int) -> Iterator[_Line | _Damage]:
    """Lines (without the newline) of a chunk stream; a line over `max_bytes` keeps only its first
    TOO_LARGE_PREFIX_BYTES and its size. Damage passes through and drops the partial line it cut."""
    parts: list[bytes] = []
    size = 0
    for c in chunks:
        if isinstance(c, _Damage):
            if size:
                c.reason += f" (a partial line of {size:,} bytes before it is part of this record)"
            parts, size = [], 0
            yield c
            if c.stop:
                return
            continue
        start = 0
        while True:
            nl = c.find(b"\n", start)
            piece = c[start:] if nl < 0 else c[start:nl]
            if size <= max_bytes:
                parts.append(piece)
            size += len(piece)
            if nl < 0:
                break
            yield _whole(parts, size, max_bytes)
            parts, size = [], 0
            start = nl + 1
    if size:
        yield _whole(parts, size, max_bytes)


def _whole(parts: list[bytes], size: int, max_bytes: int) -> _Line:
    data = b"".join(parts)
    if size > max_bytes:
        return _Line(data[:TOO_LARGE_PREFIX_BYTES], size)
    return _Line(data)


def _metadata(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in KNOWN_FIELDS}


def _str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)


_ID_IN_JSON = re.compile(rb'"id"\s*:\s*"((?:[^"\\]|\\.){1,200})"')


def _open_chunks(fh, path: str) -> Iterator[bytes | _Damage]:
    p = path.lower()
    if p.endswith(".zst"):
        return _zstd_chunks(fh)
    if p.endswith(".gz"):
        return _gzip_chunks(fh)
    return _plain_chunks(fh)


UTF8_BOM = b"\xef\xbb\xbf"


def read_jsonl(path: str, limits: ReadLimits = ReadLimits(), size: int | None = None,
               part: FileSlice | None = None) -> Iterator[RawRecord | Quarantined]:
    lineno = part.before if part else 0
    try:
        fh = fsspec.open(path, "rb").open()
        if part:
            fh.seek(part.start)
    except Exception as e:
        yield cannot_open(path, e)
        return
    with fh:
        chunks = _plain_chunks(fh, part.end) if part else _open_chunks(fh, path)
        for item in _lines(_capped(chunks, size, limits), limits.max_record_bytes):
            if isinstance(item, _Damage):
                yield Quarantined(path, f"after line {lineno}", f"unreadable bytes: {item.reason}")
                continue
            lineno += 1
            raw = item.data
            if not raw.strip():
                continue  # blank lines are not records
            yield _jsonl_record(path, lineno, item)


def _jsonl_record(path: str, lineno: int, line: _Line) -> RawRecord | Quarantined:
    where = f"line {lineno}"
    raw = line.data
    if lineno == 1:   # a byte-order mark before the first record (editors on Windows write one)
        raw = raw.removeprefix(UTF8_BOM)
    if line.size is not None:  # too large to hold: removed unparsed, its id taken from its first bytes
        m = _ID_IN_JSON.search(raw)
        rid = m.group(1).decode("utf-8", "replace") if m else None
        return RawRecord(id=rid or stable_id(path, where), source=path, offset=where,
                         text=raw.decode("utf-8", "replace"), reject="too_large", size=line.size)
    try:
        text_line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return Quarantined(path, where, f"invalid UTF-8: bad byte at position {e.start} of the line", escape_snippet(raw))
    try:
        obj = json.loads(text_line)
    except json.JSONDecodeError as e:
        return Quarantined(path, where, f"malformed JSON: {e.msg} (column {e.colno})", escape_snippet(raw))
    except RecursionError:
        return Quarantined(path, where, "malformed JSON: nested too deeply to parse", escape_snippet(raw))
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        return Quarantined(path, where, f"unparseable JSON value: {str(e)[:150]}", escape_snippet(raw))
    if not isinstance(obj, dict):
        return Quarantined(path, where, f"JSON line is a {type(obj).__name__}, expected an object", escape_snippet(raw))
    text = obj.get("text")
    rid = _str_or_none(obj.get("id"))
    if rid is not None and len(rid) > 1000:
        return Quarantined(path, where, f"field 'id' is {len(rid):,} characters long (at most 1,000)", escape_snippet(raw))
    if not isinstance(text, str):
        reason = "missing field 'text'" if text is None else f"field 'text' is a {type(text).__name__}, expected a string"
        return Quarantined(path, where, reason, escape_snippet(raw), rid)
    try:
        return RawRecord(
            id=rid or stable_id(path, where), source=path, offset=where, text=text,
            url=_str_or_none(obj.get("url")), date=_str_or_none(obj.get("date")),
            content_type=_str_or_none(obj.get("content_type")), metadata=_metadata(obj))
    except ValueError as e:  # str() of a field that cannot be converted (a huge integer)
        return Quarantined(path, where, f"unconvertible field value: {str(e)[:150]}", escape_snippet(raw), rid)


# ---- PDF --------------------------------------------------------------------------------------

def read_pdf_file(path: str, limits: ReadLimits = ReadLimits(), size: int | None = None) -> Iterator[RawRecord | Quarantined]:
    """One PDF file as one record; its pages are read by stage extract (quipu.tasks.pdf)."""
    base = dict(id=stable_id(path, "file"), source=path, offset="file", content_type="application/pdf")
    local = _local(path)
    if local is not None:
        yield RawRecord(**base, pdf=local)
        return
    if size is not None and size > limits.max_record_bytes:
        yield RawRecord(**base, text="", reject="too_large", size=size)
        return
    try:
        with fsspec.open(path, "rb") as fh:
            data = fh.read(limits.max_record_bytes + 1)
    except Exception as e:
        yield cannot_open(path, e)
        return
    if len(data) > limits.max_record_bytes:
        yield RawRecord(**base, text="", reject="too_large", size=size or len(data))
        return
    yield RawRecord(**base, pdf=data)


# ---- parquet ----------------------------------------------------------------------------------

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
    rid = _str_or_none(obj.get("id"))
    if text is None:
        return Quarantined(path, where, "null 'text'", "", rid)
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            return Quarantined(path, where, f"'text' is not valid UTF-8: bad byte at position {e.start}",
                               escape_snippet(text), rid)
    base = dict(id=rid or stable_id(path, where), source=path, offset=where,
                url=_str_or_none(obj.get("url")), date=_str_or_none(obj.get("date")),
                content_type=_str_or_none(obj.get("content_type")), metadata=_metadata(obj))
    if len(text) > limits.max_record_bytes:  # characters >= bytes / 4: only clearly oversized rows
        return RawRecord(**base, text=text[:TOO_LARGE_PREFIX_BYTES], reject="too_large",
                         size=len(text.encode("utf-8", "surrogatepass")))
    return RawRecord(**base, text=text)
