"""What the readers (the format modules of quipu.tasks.reading) yield, the limits they read under,
and the byte scans they resynchronise with after damage."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec

SNIPPET_BYTES = 200
KNOWN_FIELDS = ("id", "text", "url", "date", "content_type")
TOO_LARGE_PREFIX_BYTES = 10_000   # what a removed too-large record keeps of its bytes
CHUNK = 1 << 20


@dataclass(frozen=True)
class ReadLimits:
    """Per-record and per-file bounds on what reading may cost (see the module docstring)."""
    max_record_bytes: int = 50_000_000     # one JSONL line or WARC payload held in memory at most
    max_header_bytes: int = 1 << 20        # one WARC/ARC/HTTP header line
    max_expansion: float = 200.0           # decompressed bytes per compressed byte of the file ...
    min_expansion_bytes: int = 256 << 20   # ... checked only once this much has been decompressed
    max_file_seconds: float = 3600.0       # reading one file stops after this long


@dataclass
class RawRecord:
    """One document as read: its payload and what kind of content the payload is. "text" is a
    document already (a str); any other kind is bytes (or a local file's path) that stage extract
    turns into text with that kind's extractor (quipu.tasks.extract.EXTRACTORS: "html", "pdf")."""
    id: str
    source: str
    offset: str                       # where in the file (line number, byte offset)
    payload: str | bytes = ""
    kind: str = "text"
    url: str | None = None
    date: str | None = None
    content_type: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    reject: str | None = None         # a document we read but know we will not keep (e.g. not_html)
    size: int | None = None           # bytes of a record too large to hold (`payload` is only its start)

    @property
    def text(self) -> str | None:
        """The document's text, when it is one already (kind "text")."""
        return self.payload if self.kind == "text" else None


@dataclass
class Quarantined:
    source: str
    record: str
    reason: str
    snippet: str = ""
    id: str | None = None


def cannot_open(path: str, e: BaseException) -> Quarantined:
    """The quarantine row of a file no reader could open (gone, forbidden, a URL that fails)."""
    return Quarantined(path, "file", f"cannot open file: {type(e).__name__}: {str(e)[:200]}")


def read_whole(path: str, limits: ReadLimits) -> bytes | Quarantined:
    """The bytes of a file that is one record, at most `max_record_bytes` + 1 of them (more than
    the cap: the record is too large to hold), or the quarantine row of a file that cannot be opened."""
    try:
        with fsspec.open(path, "rb") as fh:
            return fh.read(limits.max_record_bytes + 1)
    except Exception as e:
        return cannot_open(path, e)


@dataclass
class ReadStats:
    skipped: dict[str, int] = field(default_factory=dict)   # non-document records by WARC type

    def skip(self, kind: str) -> None:
        self.skipped[kind] = self.skipped.get(kind, 0) + 1


def metadata_of(obj: dict) -> dict:
    """A record's fields other than the known ones: its metadata."""
    return {k: v for k, v in obj.items() if k not in KNOWN_FIELDS}


def str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)


def stable_id(source: str, offset: str) -> str:
    """An id for records that bring none: file name + position, stable across machines."""
    # surrogateescape: a name that is not UTF-8 (os.fsdecode's lone surrogates) hashes as its bytes
    return hashlib.sha1(f"{Path(source).name}:{offset}".encode("utf-8", "surrogateescape")).hexdigest()[:20]


def escape_snippet(raw: bytes | str) -> str:
    if isinstance(raw, str):
        raw = raw[:SNIPPET_BYTES].encode("utf-8", "backslashreplace")
    return raw[:SNIPPET_BYTES].decode("utf-8", "backslashreplace")


def find_magic(fh, start: int, magic: bytes) -> int | None:
    """Offset of the first `magic` at or after `start`, reading the file in bounded chunks."""
    fh.seek(start)
    pos, tail = start, b""
    while block := fh.read(CHUNK):
        data = tail + block
        i = data.find(magic)
        if i >= 0:
            return pos - len(tail) + i
        tail = data[-(len(magic) - 1):]
        pos += len(block)
    return None


def zeros_to_end(fh, pos: int) -> bool:
    """True when the file holds only NUL bytes from `pos` on: padding some tools write after the
    last gzip member or zstd frame, which is no data and no damage."""
    fh.seek(pos)
    while block := fh.read(CHUNK):
        if block.strip(b"\x00"):
            return False
    return True


def blank_from(fh, pos: int) -> bool:
    """True when nothing but whitespace and NUL padding follows `pos` (the end of a good file)."""
    fh.seek(pos)
    while block := fh.read(CHUNK):
        if block.strip(b"\x00\r\n\t "):
            return False
    return True


def tell_end(fh) -> int:
    fh.seek(0, os.SEEK_END)
    return fh.tell()


