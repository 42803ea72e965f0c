"""Input readers, chosen by extension: WARC/ARC, JSONL (plain, .gz, .zst) and parquet, on local
paths, globs or any fsspec URL.

Each reader yields `RawRecord`s (a document, possibly still HTML) and `Quarantined` entries (a
record or a file part that could not be read, with a reason a user can act on). Nothing is skipped
silently: WARC records that are not documents (requests, warcinfo, revisits, metadata) are counted
by type in `ReadStats.skipped`.

We read with warcio rather than datatrove's WarcReader: datatrove's reader drops records it cannot
classify (libmagic) and aborts on a truncated member without saying how much it lost, and our
accounting standard needs every record counted.
"""
from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import fsspec

WARC_SUFFIXES = (".warc", ".warc.gz", ".arc", ".arc.gz", ".warc.wet.gz", ".wet.gz")
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".ndjson")
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED = WARC_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES
SNIPPET_BYTES = 200
KNOWN_FIELDS = ("id", "text", "url", "date", "content_type")


@dataclass
class RawRecord:
    id: str
    source: str
    offset: str                       # where in the file (line number, byte offset)
    text: str | None = None           # plain-text documents
    html: bytes | None = None         # HTML payloads still to extract
    url: str | None = None
    date: str | None = None
    content_type: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    reject: str | None = None         # a document we read but know we will not keep (e.g. not_html)


@dataclass
class Quarantined:
    source: str
    record: str
    reason: str
    snippet: str = ""
    id: str | None = None


@dataclass
class ReadStats:
    skipped: dict[str, int] = field(default_factory=dict)   # non-document records by WARC type

    def skip(self, kind: str) -> None:
        self.skipped[kind] = self.skipped.get(kind, 0) + 1


def reader_kind(path: str) -> str | None:
    p = path.lower()
    if p.endswith(WARC_SUFFIXES):
        return "warc"
    if p.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if p.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return None


def expand_inputs(patterns: list[str]) -> list[str]:
    """Expand globs (local or fsspec) to a sorted, de-duplicated list of files.

    Raises FileNotFoundError naming the first pattern that matches nothing.
    """
    files: list[str] = []
    for pattern in patterns:
        fs, _, paths = fsspec.get_fs_token_paths(pattern)
        is_local = fs.protocol in ("file", ("file", "local")) or "file" in getattr(fs, "protocol", ())
        matched = [p for p in paths if fs.isfile(p)]
        if not matched and not any(ch in pattern for ch in "*?["):
            if fs.isdir(pattern):
                matched = sorted(p for p in fs.find(pattern) if reader_kind(p))
        if not matched:
            raise FileNotFoundError(f"input not found: {pattern}")
        for p in matched:
            files.append(str(Path(p)) if is_local else fs.unstrip_protocol(p))
    return sorted(dict.fromkeys(files))


def stable_id(source: str, offset: str) -> str:
    """An id for records that bring none: file name + position, stable across machines."""
    return hashlib.sha1(f"{Path(source).name}:{offset}".encode()).hexdigest()[:20]


def escape_snippet(raw: bytes | str) -> str:
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "backslashreplace")
    return raw[:SNIPPET_BYTES].decode("utf-8", "backslashreplace")


def _size(path: str) -> int | None:
    try:
        fs, _, (p,) = fsspec.get_fs_token_paths(path)
        return fs.size(p)
    except Exception:
        return None


def read(path: str, stats: ReadStats) -> Iterator[RawRecord | Quarantined]:
    kind = reader_kind(path)
    if _size(path) == 0:  # most often a failed download or copy: say so rather than read nothing
        yield Quarantined(path, "file", "empty file (0 bytes)")
    elif kind == "warc":
        yield from read_warc(path, stats)
    elif kind == "jsonl":
        yield from read_jsonl(path)
    elif kind == "parquet":
        yield from read_parquet(path)
    else:
        yield Quarantined(path, "file", f"unsupported file type (expected one of {', '.join(SUPPORTED)})")


# ---- JSONL ------------------------------------------------------------------------------------

def _metadata(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in KNOWN_FIELDS}


def _str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)


def _zstd_lines(fh, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Lines of a zstd stream (one or more frames). zstandard's stream reader ends a truncated
    file silently, so we decompress frame by frame and raise EOFError on an unfinished frame."""
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    pending = b""
    started = False
    while block := fh.read(chunk):
        while block:
            started = True
            try:
                out = dobj.decompress(block)
            except zstandard.ZstdError as e:  # not zstd, or corrupt: the reader's "unreadable file" path
                raise ValueError(f"corrupt zstd data: {e}") from None
            block = b""
            if dobj.eof:  # a frame ended: what follows is the next frame
                block, dobj, started = dobj.unused_data, dctx.decompressobj(), False
            if out:
                pending += out
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line + b"\n"
    if started:
        raise EOFError("zstd stream ended inside a frame (file truncated)")
    if pending:
        yield pending


def _open_lines(path: str):
    """(file handle, line iterator) for a plain, gzip or zstd JSONL file."""
    if path.lower().endswith(".zst"):
        fh = fsspec.open(path, "rb").open()
        return fh, _zstd_lines(fh)
    fh = fsspec.open(path, "rb", compression="infer").open()
    return fh, iter(fh)


def read_jsonl(path: str) -> Iterator[RawRecord | Quarantined]:
    lineno = 0
    try:
        fh, lines = _open_lines(path)
        with fh:
            for lineno, raw in enumerate(lines, 1):
                if not raw.strip():
                    continue  # blank lines are not records
                where = f"line {lineno}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    yield Quarantined(path, where, f"invalid UTF-8: bad byte at position {e.start} of the line", escape_snippet(raw))
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    yield Quarantined(path, where, f"malformed JSON: {e.msg} (column {e.colno})", escape_snippet(raw))
                    continue
                if not isinstance(obj, dict):
                    yield Quarantined(path, where, f"JSON line is a {type(obj).__name__}, expected an object",
                                      escape_snippet(raw))
                    continue
                text = obj.get("text")
                rid = _str_or_none(obj.get("id"))
                if not isinstance(text, str):
                    reason = "missing field 'text'" if text is None else f"field 'text' is a {type(text).__name__}, expected a string"
                    yield Quarantined(path, where, reason, escape_snippet(raw), rid)
                    continue
                yield RawRecord(
                    id=rid or stable_id(path, where), source=path, offset=where, text=text,
                    url=_str_or_none(obj.get("url")), date=_str_or_none(obj.get("date")),
                    content_type=_str_or_none(obj.get("content_type")), metadata=_metadata(obj))
    except (EOFError, OSError, ValueError) as e:  # truncated gzip/zstd, unreadable file
        yield Quarantined(path, f"after line {lineno}", f"file truncated or unreadable: {type(e).__name__}: {e}")


# ---- parquet ----------------------------------------------------------------------------------

def read_parquet(path: str, batch_rows: int = 1000) -> Iterator[RawRecord | Quarantined]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with fsspec.open(path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            schema = pf.schema_arrow
            if "text" not in schema.names:
                yield Quarantined(path, "file", f"parquet has no column 'text' (columns: {', '.join(schema.names)})")
                return
            ttype = schema.field("text").type
            if not (pa.types.is_string(ttype) or pa.types.is_large_string(ttype)):
                yield Quarantined(path, "file", f"parquet column 'text' is {ttype}, expected string")
                return
            row = 0
            for rb in pf.iter_batches(batch_size=batch_rows):
                for obj in rb.to_pylist():
                    where = f"row {row}"
                    row += 1
                    text = obj.get("text")
                    rid = _str_or_none(obj.get("id"))
                    if text is None:
                        yield Quarantined(path, where, "null 'text'", "", rid)
                        continue
                    yield RawRecord(
                        id=rid or stable_id(path, where), source=path, offset=where, text=text,
                        url=_str_or_none(obj.get("url")), date=_str_or_none(obj.get("date")),
                        content_type=_str_or_none(obj.get("content_type")), metadata=_metadata(obj))
    except Exception as e:  # corrupt footer, truncated file, not parquet at all
        yield Quarantined(path, "file", f"unreadable parquet: {type(e).__name__}: {e}")


# ---- WARC / ARC -------------------------------------------------------------------------------

_UUID = re.compile(r"<?urn:uuid:([0-9a-fA-F-]+)>?")


def _warc_id(record, source: str, offset: int) -> str:
    rid = record.rec_headers.get_header("WARC-Record-ID")
    if rid:
        m = _UUID.fullmatch(rid.strip())
        return m.group(1).lower() if m else hashlib.sha1(rid.encode()).hexdigest()[:20]
    return stable_id(source, f"offset {offset}")


def _mime(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def _record_damage(record) -> str | None:
    """Why a fully read record is not whole (cut short, digest mismatch), or None.

    warcio yields a record clipped by a truncated file silently: what is left of its declared
    length tells us. Its digest checker catches records whose bytes were altered or cut inside.
    """
    left = getattr(record.raw_stream, "limit", 0) or 0
    if left > 0:
        return f"record truncated: {record.length - left} of {record.length} bytes present"
    # Only the block digest (over the whole record) counts: producers disagree on what the payload
    # digest covers (ClueWeb09 stores the block digest there), so a payload mismatch alone is no damage.
    checker = getattr(record, "digest_checker", None)
    problems = [p for p in (checker.problems if checker is not None else []) if p.startswith("block digest")]
    if problems:
        return "block digest mismatch (record corrupt or cut short): " + "; ".join(problems)[:200]
    return None


def read_warc(path: str, stats: ReadStats, max_payload_bytes: int = 50 << 20) -> Iterator[RawRecord | Quarantined]:
    from warcio.archiveiterator import ArchiveIterator
    from warcio.exceptions import ArchiveLoadFailed

    offset = 0
    n = 0
    try:
        with fsspec.open(path, "rb") as fh:
            # check_digests: a record whose bytes do not match its WARC block digest is corrupt or
            # cut short; we quarantine it rather than curate half a page
            it = ArchiveIterator(fh, arc2warc=True, check_digests=True)
            for record in it:
                n += 1
                rtype = record.rec_type
                if rtype not in ("response", "resource", "conversion"):
                    stats.skip(rtype or "unknown")
                    continue
                url = record.rec_headers.get_header("WARC-Target-URI")
                url = url.strip("<>") if url else None
                date = record.rec_headers.get_header("WARC-Date")
                if rtype == "response":
                    if record.http_headers is None:
                        if not url or url.lower().startswith(("http:", "https:")):
                            # an HTTP capture whose status line and headers could not be parsed, or a
                            # response naming no target at all (malformed: e.g. garbage headers)
                            offset = it.get_record_offset()
                            why = ("HTTP response without a parseable status line and headers" if url else
                                   "malformed response record: no WARC-Target-URI and no parseable HTTP headers")
                            yield Quarantined(path, f"offset {offset}", why, "", _warc_id(record, path, offset))
                        else:  # a response that is not HTTP (dns:, ftp:)
                            stats.skip("response-non-http")
                        continue
                    ctype = record.http_headers.get_header("Content-Type")
                else:
                    ctype = record.rec_headers.get_header("Content-Type")
                try:
                    # read the payload before asking for the offset: warcio's offset call consumes the record
                    payload = record.content_stream().read(max_payload_bytes + 1)
                    error = None
                except Exception as e:
                    payload, error = b"", e
                offset = it.get_record_offset()
                where = f"offset {offset}"
                rid = _warc_id(record, path, offset)
                if error is None and len(payload) <= max_payload_bytes:
                    error = _record_damage(record)
                if error is not None:
                    msg = error if isinstance(error, str) else f"unreadable WARC payload: {type(error).__name__}: {error}"
                    yield Quarantined(path, where, msg, escape_snippet(payload), rid)
                    continue
                base = dict(id=rid, source=path, offset=where, url=url, date=date, content_type=ctype,
                            metadata={"warc_type": rtype})
                if len(payload) > max_payload_bytes:
                    yield RawRecord(**base, text="", reject="payload_too_large")
                    continue
                mime = _mime(ctype)
                if rtype == "conversion" or mime == "text/plain":
                    yield RawRecord(**base, text=payload.decode("utf-8", "replace"))
                elif mime in ("text/html", "application/xhtml+xml") or (not mime and payload.lstrip()[:1] == b"<"):
                    yield RawRecord(**base, html=payload)
                else:
                    yield RawRecord(**base, text="", reject=f"not_html:{mime or 'unknown'}")
    except (ArchiveLoadFailed, EOFError, OSError, ValueError, TypeError) as e:
        where = f"offset {offset}" if n else "file"
        what = "truncated or corrupt archive" if n else "not a readable WARC/ARC file"
        yield Quarantined(path, where, f"{what} after {n} records: {type(e).__name__}: {str(e)[:200]}")
