"""WARC and ARC files (warcio), record by record, resynchronising after damage: see the module
docstring of quipu.tasks.reading for what costs what."""
from __future__ import annotations

import hashlib
import re
import zlib
from typing import Iterator

import fsspec
# at import, in the main thread: two threads importing warcio for the first time at once (curate's
# workers on two WARC units) race in its `six.moves` imports ("'six' is not a package")
from warcio.archiveiterator import ArchiveIterator
from warcio.bufferedreaders import DecompressingBufferedReader
from warcio.recordloader import ARC2WARCHeadersParser

from quipu.tasks.reading.files import FileSlice
from quipu.tasks.reading.pdf import PDF_MIMES
from quipu.tasks.reading.records import (CHUNK, TOO_LARGE_PREFIX_BYTES, Quarantined, RawRecord, ReadLimits, ReadStats,
                                         blank_from, cannot_open, escape_snippet, find_magic, stable_id)

SUFFIXES = (".warc", ".warc.gz", ".arc", ".arc.gz", ".warc.wet.gz", ".wet.gz")


_UUID = re.compile(r"<?urn:uuid:([0-9a-fA-F-]+)>?")
# where a record may start in an uncompressed file: a WARC version line, or an ARC header line
# (url ip-address 14-digit-date mime length)
_RECORD_START = re.compile(rb"\n(WARC/\d\.\d+\r?\n|\S+ \d{1,3}(?:\.\d{1,3}){3} \d{14} \S+ \d+\r?\n)")
_GZIP_MAGIC = b"\x1f\x8b\x08"


WARC_TYPES = ("warcinfo", "response", "resource", "request", "metadata", "revisit", "conversion", "continuation")


class HeaderLineTooLong(ValueError):
    pass


def _capped_reader_class():
    """warcio's buffered reader with a cap on `readline`: warcio reads header lines with it, and
    without a cap a header line of gigabytes is held whole."""
    class CappedReader(DecompressingBufferedReader):
        line_cap = 1 << 20

        def readline(self, length=None):
            limit = self.line_cap + 1 if length is None or length < 0 else min(length, self.line_cap + 1)
            parts, n = [], 0
            while n < limit:   # warcio's readline(length) may stop short of `length` without a newline
                piece = super().readline(limit - n)
                if not piece:
                    break
                parts.append(piece)
                n += len(piece)
                if piece.endswith(b"\n"):
                    break
            line = b"".join(parts)
            if len(line) > self.line_cap and not line.endswith(b"\n"):
                raise HeaderLineTooLong(f"a header line longer than {self.line_cap:,} bytes (extract.max_header_bytes)")
            return line

    return CappedReader


class _ArcHeadersWithoutRandomId(ARC2WARCHeadersParser):
    """warcio's ARC-to-WARC headers, less the WARC-Record-ID it makes up for each ARC record (a fresh
    uuid4 on every read: ARC has no record ids). Without it `_warc_id` names the record by file and
    offset, so an ARC file gives the same ids, and the same output bytes, on every run."""

    def _get_protocol_and_headers(self, headerline, parts):
        protocol, headers = super()._get_protocol_and_headers(headerline, parts)
        return protocol, [(name, value) for name, value in headers if name != "WARC-Record-ID"]


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


def _next_record_start(fh, after: int, gzipped: bool = False) -> int | None:
    """The offset of the first record header after byte `after`: a gzip member whose first bytes
    decompress to a WARC/ARC header, or a header line right after a newline, whichever comes first
    (a damaged gzip header can make a compressed file look plain, and the reverse)."""
    found = [x for x in (_next_gzip_record(fh, after), _next_plain_record(fh, after)) if x is not None]
    return min(found) if found else None


def _next_gzip_record(fh, after: int) -> int | None:
    pos = after + 1
    while (cand := find_magic(fh, pos, _GZIP_MAGIC)) is not None:
        fh.seek(cand)
        try:
            head = zlib.decompressobj(31).decompress(fh.read(64 << 10), 256)
        except zlib.error:
            head = b""
        if head.startswith(b"WARC/") or _RECORD_START.match(b"\n" + head):
            return cand
        pos = cand + 1
    return None


def _next_plain_record(fh, after: int) -> int | None:
    # a record starts right after a newline: scanning from `after` itself lets a newline there count
    fh.seek(after)
    pos, tail = after, b""
    while block := fh.read(CHUNK):
        data = tail + block
        for m in _RECORD_START.finditer(data):
            start = pos - len(tail) + m.start(1)
            if start > after and (m.end() < len(data) or len(block) < CHUNK):
                return start
        tail = data[-4096:]
        pos += len(block)
    return None


def read_file(path: str, stats: ReadStats, limits: ReadLimits, size: int | None,
              part: FileSlice | None) -> Iterator[RawRecord | Quarantined]:
    """A WARC/ARC file is read whole: finding a record boundary inside it means decompressing up to it."""
    return read_warc(path, stats, limits)


def read_warc(path: str, stats: ReadStats, limits: ReadLimits = ReadLimits()) -> Iterator[RawRecord | Quarantined]:
    """Records of a WARC/ARC file; after damage, reading resumes at the next record header."""
    try:
        fh = fsspec.open(path, "rb").open()
        gzipped = fh.read(2) == b"\x1f\x8b"
        fh.seek(0)
    except Exception as e:
        yield cannot_open(path, e)
        return
    with fh:
        start: int | None = 0
        first = True
        seen = 0
        while start is not None:
            try:
                nxt = yield from _read_warc_from(fh, path, start, stats, limits, gzipped, first)
                # every restart is further into the file than the last: a file cannot loop
                start = nxt if nxt is None or nxt > start else _next_record_start(fh, start, gzipped)
            except _NonChunkedGzip as e:
                # the whole file is one gzip stream (`gzip file.warc`): valid, only not seekable per
                # record. Read it again decompressed, as a plain WARC, past the records already read.
                seen = e.records
                break
            first = False
        else:
            return
        import gzip
        fh.seek(0)
        with gzip.GzipFile(fileobj=fh) as plain:
            start, first = 0, True
            while start is not None:
                start = yield from _read_warc_from(plain, path, start, stats, limits, False, first, skip=seen)
                first, seen = False, 0


class _NonChunkedGzip(Exception):
    def __init__(self, records: int):
        self.records = records


def _read_warc_from(fh, path: str, start: int, stats: ReadStats, limits: ReadLimits, gzipped: bool,
                    first: bool, skip: int = 0):
    """Read records from byte `start` until the end (returns None) or until damage (returns where the
    next record header is, after quarantining the damaged range)."""
    fh.seek(start)
    it = ArchiveIterator(fh, arc2warc=True, check_digests=True)
    it.loader.arc_parser = _ArcHeadersWithoutRandomId()
    reader_cls = _capped_reader_class()
    reader_cls.line_cap = limits.max_header_bytes
    it.reader = reader_cls(it.fh)            # before the first read: warcio builds records on it lazily
    it.INC_RECORD = ""                       # warcio prints a warning to stderr; we report it instead
    rec_start = start
    prev_start: int | None = None
    n = 0
    try:
        for record in it:
            n += 1
            rec_start = it.offset
            if n <= skip:   # already read before the file turned out to be one gzip stream
                it.read_to_end()
                continue
            item, damaged = _warc_item(it, record, path, stats, limits, rec_start)
            if item is not None:
                yield item
            if damaged == "tail":   # bytes after this (whole) record are no record header
                nxt = _next_record_start(fh, rec_start, gzipped)
                resumed = f"; reading resumed at offset {nxt}" if nxt is not None else ""
                yield Quarantined(path, f"after offset {rec_start}",
                                  f"unreadable bytes after the record at offset {rec_start} (a line longer than "
                                  f"{limits.max_header_bytes:,} bytes where the next record header belongs){resumed}")
                return nxt
            if damaged == "junk" and prev_start is not None:
                # no record starts here: the record before ran past its end and may hide whole ones
                nxt = _next_record_start(fh, prev_start, gzipped)
                return nxt if nxt != rec_start else _next_record_start(fh, rec_start, gzipped)
            if damaged:  # its block ran past the data (a wrong Content-Length): later records may be inside it
                return _next_record_start(fh, rec_start, gzipped)
            prev_start = rec_start
        # warcio ends quietly on a corrupt gzip member (it prints the zlib error and reads on as if
        # the file ended): reading that stops before the end of the file is damage, never the end
        stop = it.offset
        if blank_from(fh, stop):
            return None
        nxt = _next_record_start(fh, rec_start if n else start, gzipped)
        nxt = nxt if nxt is None or nxt > start else _next_record_start(fh, stop, gzipped)
        resumed = f"; reading resumed at offset {nxt}" if nxt is not None else ""
        yield Quarantined(path, f"offset {stop}", f"unreadable bytes {stop}-{nxt - 1 if nxt is not None and nxt > stop else 'end'}: "
                                                  f"the archive could not be read past offset {stop} (corrupt compressed data?){resumed}")
        return nxt
    except Exception as e:
        if gzipped and "non-chunked gzip" in str(e):
            raise _NonChunkedGzip(n) from None
        after_record = n > 0 and it.member_info is not None   # the record after a parsed one failed
        at = it.offset if n == 0 or after_record else rec_start
        # When the record after a parsed one fails, what failed may have started inside that record
        # (a Content-Length too large by less than a record takes the next one's head) or warcio may
        # have read past good gzip members (it reads a member it cannot decompress as plain text):
        # look for the next header right after the parsed record's start, so nothing whole is lost.
        nxt = _next_record_start(fh, rec_start if after_record else at, gzipped)
        if nxt == at:   # the record at `at` has a header but cannot be parsed: it is the damaged one
            nxt = _next_record_start(fh, at, gzipped)
        if first and n == 0 and nxt is None:
            what = "not a readable WARC/ARC file"
        elif nxt is not None and nxt < at:
            what = (f"the record at offset {rec_start} ran into the next record (a wrong Content-Length?); "
                    f"it may be damaged, and no record starts at offset {at}")
        else:
            what = f"unreadable bytes {at}-{nxt - 1 if nxt is not None else 'end'}"
        resumed = f"; reading resumed at offset {nxt}" if nxt is not None else ""
        yield Quarantined(path, f"offset {at}" if at or not first else "file",
                          f"{what}: {type(e).__name__}: {str(e).strip()[:200]}{resumed}")
        return nxt


def _warc_item(it, record, path: str, stats: ReadStats, limits: ReadLimits, rec_start: int):
    """(RawRecord | Quarantined | None, damage) for one parsed record; damage is False, True (the
    record's block ran past the data) or "junk" (what warcio parsed is no record at all)."""
    rtype = record.rec_type
    if record.length is None:
        length = record.rec_headers.get_header("Content-Length")
        # without a length warcio reads to the end of the file as this one record: every record
        # after it would vanish inside it. Not read; reading resumes at the next header.
        return Quarantined(path, f"offset {rec_start}", f"WARC record without a valid Content-Length "
                                                        f"({length!r}): not read", "", _warc_id(record, path, rec_start)), "junk"
    if rtype not in WARC_TYPES:   # warcio parsed something that is no record (e.g. bytes before a gzip member)
        offset = it.get_record_offset()
        return Quarantined(path, f"offset {offset}", f"not a WARC/ARC record (type {rtype!r}): bytes "
                                                     f"{offset}-{offset + it.get_record_length() - 1} skipped"), "junk"
    if rtype not in ("response", "resource", "conversion"):
        stats.skip(rtype)
        return None, _skip_rest(it) or _truncated(record)
    url = record.rec_headers.get_header("WARC-Target-URI")
    url = url.strip("<>") if url else None
    date = record.rec_headers.get_header("WARC-Date")
    if rtype == "response":
        if record.http_headers is None:
            if not _other_protocol(url):
                # an HTTP capture whose status line and headers could not be parsed, a response
                # naming no target, or one whose target is damaged (`xhttps://…`: a byte before an
                # ARC header line): malformed, never silently skipped
                offset = it.get_record_offset()
                why = ("HTTP response without a parseable status line and headers"
                       if url and url.lower().startswith(("http:", "https:")) else
                       "malformed response record: no WARC-Target-URI and no parseable HTTP headers" if not url else
                       f"malformed response record: target {url[:80]!r} has no known URI scheme")
                return Quarantined(path, f"offset {offset}", why, "", _warc_id(record, path, offset)), _truncated(record)
            stats.skip("response-non-http")  # a response that is not HTTP (dns:, ftp:)
            return None, _skip_rest(it) or _truncated(record)
        ctype = record.http_headers.get_header("Content-Type")
    else:
        ctype = record.rec_headers.get_header("Content-Type")
    try:
        # read the payload before asking for the offset: warcio's offset call consumes the record
        payload = record.content_stream().read(limits.max_record_bytes + 1)
        error = None
    except Exception as e:
        payload, error = b"", e
    tail = False
    try:
        offset = it.get_record_offset()
    except HeaderLineTooLong:
        # warcio reads the line after the record to skip blank lines: a line too long to be a
        # header there is damage after this record, not in it. The record is whole.
        offset, tail = rec_start, "tail"
    where = f"offset {offset}"
    rid = _warc_id(record, path, offset)
    if error is None and len(payload) <= limits.max_record_bytes:
        error = _record_damage(record)
    if error is not None:
        msg = error if isinstance(error, str) else f"unreadable WARC payload: {type(error).__name__}: {str(error)[:200]}"
        return Quarantined(path, where, msg, escape_snippet(payload), rid), tail or _truncated(record)
    base = dict(id=rid, source=path, offset=where, url=url, date=date, content_type=ctype,
                metadata={"warc_type": rtype})
    if len(payload) > limits.max_record_bytes:
        return RawRecord(**base, payload=payload[:TOO_LARGE_PREFIX_BYTES].decode("utf-8", "replace"),
                         reject="payload_too_large", size=record.length), tail or _truncated(record)
    mime = _mime(ctype)
    if rtype == "conversion" or mime == "text/plain":
        return RawRecord(**base, payload=payload.decode("utf-8", "replace")), tail
    if mime in ("text/html", "application/xhtml+xml") or (not mime and payload.lstrip()[:1] == b"<"):
        return RawRecord(**base, payload=payload, kind="html"), tail
    if mime in PDF_MIMES or (mime in ("", "application/octet-stream", "binary/octet-stream") and payload[:1024].lstrip().startswith(b"%PDF-")):
        return RawRecord(**base, payload=payload, kind="pdf"), tail
    return RawRecord(**base, reject=f"not_html:{mime or 'unknown'}"), tail


# A URI scheme (RFC 3986). Responses of another scheme than HTTP are captures of other protocols
# (dns:, ftp:, chrome-extension:), not documents: counted and skipped. A "scheme" that is not one, or
# that only ends in http(s) (`xhttps`), is a damaged HTTP target: the record is quarantined.
_URI_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")


def _other_protocol(url: str | None) -> bool:
    scheme = url.split(":", 1)[0].lower() if url and ":" in url else ""
    return bool(_URI_SCHEME.fullmatch(scheme)) and not scheme.endswith(("http", "https"))


def _skip_rest(it) -> str | bool:
    """Read past a record that is not a document; "tail" when a line too long to be a header
    follows it (warcio reads that line to skip blank lines), else False."""
    try:
        it.read_to_end()
        return False
    except HeaderLineTooLong:
        return "tail"


def _truncated(record) -> bool:
    """The record's block ended before its Content-Length: it may have swallowed later records."""
    return (getattr(record.raw_stream, "limit", 0) or 0) > 0
