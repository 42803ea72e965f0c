"""JSON Lines (plain, .gz, .zst): one record per line, read in bounded chunks; gzip members and zstd
frames decompressed by us, a bounded amount at a time, resynchronising after damage (see the
package docstring, quipu.tasks.reading, for what costs what). A plain file is sliced at line
boundaries (`slices`)."""
from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from typing import Iterator

import fsspec

from quipu.catalog.files import read_blocks
from quipu.tasks.reading.files import FileSlice, local_path
from quipu.tasks.reading.records import (CHUNK, TOO_LARGE_PREFIX_BYTES, Quarantined, RawRecord, ReadLimits, ReadStats,
                                         cannot_open, escape_snippet, find_magic, metadata_of, stable_id, str_or_none,
                                         tell_end, zeros_to_end)

SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".json.gz", ".ndjson")
PLAIN_SUFFIXES = (".jsonl", ".ndjson")     # sliced at line boundaries; a compressed file is read whole


def read_file(path: str, stats: ReadStats, limits: ReadLimits, size: int | None,
              part: FileSlice | None) -> Iterator[RawRecord | Quarantined]:
    return read_jsonl(path, limits, size, part)


def slices(path: str, size: int, part_bytes: int) -> list[FileSlice] | None:
    """A plain JSONL file's parts; None for a compressed one (finding a line inside it means
    decompressing up to it)."""
    return _jsonl_slices(path, size, part_bytes) if path.lower().endswith(PLAIN_SUFFIXES) else None


def _jsonl_slices(path: str, size: int, part_bytes: int) -> list[FileSlice]:
    """Cuts just after the first newline at or past every `part_bytes`, and the lines before each
    (one pass over the file counting newlines: bytes.count runs at memory speed)."""
    cuts: list[tuple[int, int]] = [(0, 0)]       # (byte offset, lines before it)
    pos = lines = 0
    target = part_bytes
    with open(local_path(path), "rb") as fh:
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
                         payload=raw.decode("utf-8", "replace"), reject="too_large", size=line.size)
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
    rid = str_or_none(obj.get("id"))
    if rid is not None and len(rid) > 1000:
        return Quarantined(path, where, f"field 'id' is {len(rid):,} characters long (at most 1,000)", escape_snippet(raw))
    if not isinstance(text, str):
        reason = "missing field 'text'" if text is None else f"field 'text' is a {type(text).__name__}, expected a string"
        return Quarantined(path, where, reason, escape_snippet(raw), rid)
    try:
        return RawRecord(
            id=rid or stable_id(path, where), source=path, offset=where, payload=text,
            url=str_or_none(obj.get("url")), date=str_or_none(obj.get("date")),
            content_type=str_or_none(obj.get("content_type")), metadata=metadata_of(obj))
    except ValueError as e:  # str() of a field that cannot be converted (a huge integer)
        return Quarantined(path, where, f"unconvertible field value: {str(e)[:150]}", escape_snippet(raw), rid)
