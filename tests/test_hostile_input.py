"""Issue 13's reproductions, one test each: hostile input costs at most the record it is in, never
the run, never the documents after it, and never unbounded memory.

Every file is built here (small, or streamed to disk for the bombs); memory is measured in a child
process (`ru_maxrss`) so that the test process's own allocations do not blur the figure.
"""
from __future__ import annotations

import builtins
import functools
import gzip
import io
import json
import os
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from quipu.tasks.extract import TOO_LARGE_CHARS, ExtractConfig, extract_file
from quipu.tasks.pipeline import REMOVED_SCHEMA
from quipu.tasks.reading import ReadLimits, ReadStats, expand_inputs, read
from tests.conftest import ROOT

TEXT = ("The river rose slowly through the night, and by morning the old bridge was under water. "
        "Families in the lower town carried what they could to the church on the hill. ")
RSS_BOUND_MB = 600   # a child that imports pyarrow, warcio and the readers starts at ~150 MB


def jline(i: int, text: str = TEXT) -> bytes:
    return json.dumps({"id": f"doc-{i}", "text": text}).encode() + b"\n"


def page(i: int) -> bytes:
    return f"<html><body><article><h1>Page {i}</h1><p>{TEXT * 3}</p></article></body></html>".encode()


def warc_record(url: str | None, payload: bytes, rid: int, content_length: int | None = None,
                rtype: str = "response") -> bytes:
    """One uncompressed WARC response record, written by hand so that it can lie."""
    http = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n" + payload
    headers = [b"WARC/1.0", b"WARC-Type: " + rtype.encode(),
               f"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-{rid:012d}>".encode(),
               b"WARC-Date: 2026-01-01T00:00:00Z"]
    if url:
        headers.append(b"WARC-Target-URI: " + url.encode())
    headers += [b"Content-Type: application/http; msgtype=response",
                f"Content-Length: {content_length if content_length is not None else len(http)}".encode()]
    return b"\r\n".join(headers) + b"\r\n\r\n" + http + b"\r\n\r\n"


def records(items) -> tuple[list, list]:
    docs = [i for i in items if type(i).__name__ == "RawRecord"]
    quarantined = [i for i in items if type(i).__name__ == "Quarantined"]
    return docs, quarantined


def check_accounting(result: dict, written: int | None = None) -> None:
    """Counted in the parquet files the extraction wrote, not in its own counters (it checks those by
    raising): kept + removed + quarantined rows = the records it read = `written`, the records the test
    put in the file."""
    def rows(shard: dict | None) -> int:
        return pq.ParquetFile(shard["path"]).metadata.num_rows if shard and Path(shard["path"]).is_file() else 0
    on_disk = sum(rows(s) for s in result["kept_shards"]) + rows(result["removed"]) + rows(result["quarantine"])
    assert on_disk == result["records_read"], (on_disk, result["records_read"])
    assert rows(result["quarantine"]) == result["quarantined"]
    if written is not None:
        assert result["records_read"] == written, (result["records_read"], written)


def run_child(code: str, timeout: int = 240) -> dict:
    """Run `code` in a fresh interpreter (repo root on the path); it prints one JSON line last."""
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork+exec, so a child of a large pytest
    # process would report the parent's size; VmHWM belongs to the child's own address space
    wrapped = ("import json, re, sys\nsys.path.insert(0, %r)\n" % str(ROOT) + code +
               "\nhwm = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
               "\nprint(json.dumps({**out, 'rss_mb': hwm / 1024}))")
    p = subprocess.run([sys.executable, "-c", wrapped], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- whole run lost on one record or file -----------------------------------------------------

def test_warc_last_record_truncated_without_target_uri(tmp_path):
    """An interrupted crawler's last record: no WARC-Target-URI, cut short. warcio raised
    AttributeError ('NoneType' has no 'startswith') and the whole file, then the run, failed."""
    data = warc_record("https://example.org/0", page(0), 0) + warc_record("https://example.org/1", page(1), 1)
    last = warc_record(None, page(2), 2)
    path = tmp_path / "interrupted.warc"
    path.write_bytes(data + last[: len(last) // 2])
    result = extract_file(str(path), tmp_path / "out", ExtractConfig()).model_dump()
    check_accounting(result, written=3)
    assert result["kept_docs"] == 2 and result["quarantined"] == 1


def test_warc_record_without_target_uri_in_the_middle_costs_only_itself(tmp_path):
    data = (warc_record("https://example.org/0", page(0), 0) + warc_record(None, page(1), 1)
            + warc_record("https://example.org/2", page(2), 2))
    path = tmp_path / "no-uri.warc"
    path.write_bytes(data)
    docs, quarantined = records(list(read(str(path), ReadStats())))
    assert [d.url for d in docs] == ["https://example.org/0", "https://example.org/2"]
    assert len(quarantined) == 1 and quarantined[0].record.startswith("offset ")


def test_deeply_nested_json_line_is_one_quarantined_record(tmp_path):
    path = tmp_path / "nested.jsonl"
    path.write_bytes(jline(0) + b"[" * 1000 + b"]" * 1000 + b"\n" + b'{"text": ' + b"[" * 100_000 + b"\n" + jline(3))
    result = extract_file(str(path), tmp_path / "out", ExtractConfig()).model_dump()
    check_accounting(result, written=4)
    assert (result["records_read"], result["input_docs"], result["quarantined"]) == (4, 2, 2)
    reasons = pq.read_table(result["quarantine"]["path"]).column("reason").to_pylist()
    assert any("nested too deeply" in r for r in reasons), reasons


def test_dangling_symlink_and_fifo_are_quarantined_not_opened(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "good.jsonl").write_bytes(jline(0) + jline(1))
    os.symlink(folder / "gone.jsonl", folder / "dangling.jsonl")
    os.mkfifo(folder / "pipe.jsonl")
    files = expand_inputs([str(folder)])
    assert sorted(Path(f).name for f in files) == ["dangling.jsonl", "good.jsonl", "pipe.jsonl"]
    assert sorted(Path(f).name for f in expand_inputs([str(folder / "*.jsonl")])) == sorted(Path(f).name for f in files)

    results: dict[str, dict] = {}

    def work():  # a FIFO opened for reading blocks until a writer comes: this must never happen
        for f in files:
            results[Path(f).name] = extract_file(f, tmp_path / "out", ExtractConfig()).model_dump()

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "reading the input folder hung (a FIFO was opened?)"
    assert results["good.jsonl"]["kept_docs"] == 2
    for name, why in (("dangling.jsonl", "dangling symbolic link"), ("pipe.jsonl", "named pipe (FIFO)")):
        r = results[name]
        check_accounting(r, written=1)
        assert (r["records_read"], r["quarantined"]) == (1, 1)
        assert why in pq.read_table(r["quarantine"]["path"]).column("reason")[0].as_py()


# ---- documents silently lost ------------------------------------------------------------------

def test_huge_integer_costs_one_line_not_the_rest_of_the_file(tmp_path):
    """A 5,000-digit integer made json.loads raise ValueError, taken for truncation: a 20-line file
    reported 5 records and the 15 good lines after it were never read."""
    lines = [jline(i) for i in range(20)]
    lines[4] = b'{"id": "big", "text": "x", "n": ' + b"9" * 5000 + b"}\n"
    path = tmp_path / "bigint.jsonl"
    path.write_bytes(b"".join(lines))
    result = extract_file(str(path), tmp_path / "out", ExtractConfig()).model_dump()
    check_accounting(result, written=20)
    assert (result["records_read"], result["input_docs"], result["quarantined"]) == (20, 19, 1)
    q = pq.read_table(result["quarantine"]["path"]).to_pylist()
    assert q[0]["record"] == "line 5"


@pytest.mark.parametrize("kind", ["dictionary", "string_view", "large_string", "binary"])
def test_parquet_text_of_any_string_type_is_read(tmp_path, kind):
    texts = [TEXT + str(i) for i in range(6)]
    ids = [f"p{i}" for i in range(6)]
    if kind == "dictionary":   # what pandas writes for a categorical column
        col = pa.array(texts).dictionary_encode()
    elif kind == "string_view":
        col = pa.array(texts, pa.string_view())
    elif kind == "large_string":
        col = pa.array(texts, pa.large_string())
    else:   # UTF-8 in a binary column, one row not UTF-8
        col = pa.array([t.encode() for t in texts[:5]] + [b"caf\xe9 \xff"], pa.binary())
    path = tmp_path / f"{kind}.parquet"
    pq.write_table(pa.table({"id": ids, "text": col}), path, row_group_size=4)
    result = extract_file(str(path), tmp_path / "out", ExtractConfig()).model_dump()
    check_accounting(result, written=6)
    assert result["records_read"] == 6
    if kind == "binary":
        assert (result["input_docs"], result["quarantined"]) == (5, 1)
        q = pq.read_table(result["quarantine"]["path"]).to_pylist()[0]
        assert q["record"] == "row 5" and "not valid UTF-8" in q["reason"]
    else:
        assert result["input_docs"] == 6
        kept = pq.read_table(result["kept_shards"][0]["path"])
        assert kept.column("text").to_pylist() == texts


def test_warc_record_with_huge_content_length_does_not_swallow_the_next(tmp_path):
    good = warc_record("https://example.org/0", page(0), 0)
    liar = warc_record("https://example.org/1", page(1), 1, content_length=10**12)
    after = warc_record("https://example.org/2", page(2), 2) + warc_record("https://example.org/3", page(3), 3)
    path = tmp_path / "liar.warc"
    path.write_bytes(good + liar + after)
    docs, quarantined = records(list(read(str(path), ReadStats())))
    assert [d.url for d in docs] == ["https://example.org/0", "https://example.org/2", "https://example.org/3"]
    assert len(quarantined) == 1 and "record truncated" in quarantined[0].reason


def test_gzip_warc_with_garbage_between_members_resyncs(tmp_path):
    members = [gzip.compress(warc_record(f"https://example.org/{i}", page(i), i), mtime=0) for i in range(4)]
    path = tmp_path / "garbage.warc.gz"
    path.write_bytes(members[0] + members[1] + b"\x00garbage\xff" * 50 + members[2] + members[3][:10] + b"XXXX" + members[3][14:])
    docs, quarantined = records(list(read(str(path), ReadStats())))
    assert [d.url for d in docs][:3] == ["https://example.org/0", "https://example.org/1", "https://example.org/2"]
    assert len(docs) + len(quarantined) >= 4 and quarantined


def test_corrupt_gzip_member_in_jsonl_costs_only_that_member(tmp_path):
    members = [gzip.compress(b"".join(jline(10 * m + i) for i in range(10)), mtime=0) for m in range(3)]
    bad = bytearray(members[1])
    bad[len(bad) // 2: len(bad) // 2 + 8] = b"\xff" * 8
    path = tmp_path / "members.jsonl.gz"
    path.write_bytes(members[0] + bytes(bad) + members[2])
    docs, quarantined = records(list(read(str(path), ReadStats())))
    ids = [d.id for d in docs]
    assert ids[:10] == [f"doc-{i}" for i in range(10)] and ids[-10:] == [f"doc-{i}" for i in range(20, 30)]
    assert quarantined and all(q.record.startswith("after line") for q in quarantined)


# ---- unbounded memory -------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _gzip_member_of_zeros() -> bytes:
    """One gzip member of 1 GiB of zeros (about 1 MB), once per process. Deflating the whole GiB cost
    ~7 CPU-seconds; after a full flush the compressor starts afresh, so 16 MiB of zeros deflates to the
    same bytes every time: one such block 63 times, a last one that ends the stream, and the header
    and trailer (CRC-32 and size of the GiB) written here: ~0.8 CPU-seconds."""
    block = b"\x00" * (16 << 20)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)           # raw deflate: header and trailer below
    full = comp.compress(block) + comp.flush(zlib.Z_FULL_FLUSH)
    last = comp.compress(block) + comp.flush(zlib.Z_FINISH)
    crc = 0
    for _ in range(64):
        crc = zlib.crc32(block, crc)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"        # gzip, deflate, no name, mtime 0
    return header + full * 63 + last + struct.pack("<II", crc, (64 * len(block)) & 0xFFFFFFFF)


def _gzip_of_zeros(path: Path, gib: int) -> None:
    """`gib` GiB of zeros with no newline, as gzip members of 1 GiB each (about 1 MB per member)."""
    with open(path, "wb") as fh:
        for _ in range(gib):
            fh.write(_gzip_member_of_zeros())


def test_gzip_bomb_stops_with_bounded_memory(tmp_path):
    path = tmp_path / "bomb.jsonl.gz"
    _gzip_of_zeros(path, 3)   # ~3 MB expanding to 3 GiB, no newline
    out = run_child(f"""
from quipu.tasks.extract import ExtractConfig, extract_file
from quipu.tasks.pipeline import REMOVED_SCHEMA
r = extract_file({str(path)!r}, {str(tmp_path / 'out')!r}, ExtractConfig(), REMOVED_SCHEMA).model_dump()
out = {{k: r[k] for k in ('records_read', 'input_docs', 'quarantined', 'quarantine_by_reason')}}
""")
    assert out["rss_mb"] < RSS_BOUND_MB, out
    assert out["records_read"] == out["input_docs"] + out["quarantined"]
    assert out["quarantined"] >= 1


def test_zstd_bomb_stops_with_bounded_memory(tmp_path):
    path = tmp_path / "bomb.jsonl.zst"
    cctx = zstandard.ZstdCompressor(level=3)   # zeros: 32 kB at level 3 as at 19, in a quarter of the time
    with open(path, "wb") as fh, cctx.stream_writer(fh) as w:
        block = b"\x00" * (16 << 20)
        for _ in range(64):      # 1 GiB of zeros, no newline
            w.write(block)
    assert path.stat().st_size < 2 << 20
    out = run_child(f"""
from quipu.tasks.reading import read, ReadStats
items = list(read({str(path)!r}, ReadStats()))
out = {{'n': len(items), 'reasons': [getattr(i, 'reason', None) for i in items], 'types': [type(i).__name__ for i in items]}}
""")
    assert out["rss_mb"] < RSS_BOUND_MB, out
    assert out["types"] == ["Quarantined"] and "decompression stopped" in out["reasons"][0], out


def test_gigantic_warc_header_line_is_bounded_and_reading_resumes(tmp_path):
    """A WARC whose HTTP header line is 300 MB (warcio's readline has no cap: it held it whole)."""
    path = tmp_path / "header.warc"
    huge = 300 << 20
    with open(path, "wb") as fh:
        fh.write(warc_record("https://example.org/0", page(0), 0))
        http_len = len(b"HTTP/1.1 200 OK\r\nX-Junk: ") + huge + len(b"\r\n\r\n")
        fh.write(b"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: https://example.org/1\r\n"
                 b"Content-Type: application/http; msgtype=response\r\n" + f"Content-Length: {http_len}\r\n\r\n".encode())
        fh.write(b"HTTP/1.1 200 OK\r\nX-Junk: ")
        chunk = b"a" * (1 << 20)
        for _ in range(huge >> 20):
            fh.write(chunk)
        fh.write(b"\r\n\r\n\r\n\r\n")
        fh.write(warc_record("https://example.org/2", page(2), 2))
    out = run_child(f"""
from quipu.tasks.reading import read, ReadStats
items = list(read({str(path)!r}, ReadStats()))
out = {{'urls': [getattr(i, 'url', None) for i in items], 'types': [type(i).__name__ for i in items]}}
""")
    assert out["rss_mb"] < RSS_BOUND_MB, out
    assert out["types"] == ["RawRecord", "Quarantined", "RawRecord"], out
    assert out["urls"][0] == "https://example.org/0" and out["urls"][2] == "https://example.org/2"


def test_removed_large_documents_keep_only_a_prefix(tmp_path):
    """Ten 20 MB documents removed as too large held their full text until 500 accumulated (1.6 GB);
    a line over max_record_bytes is never held whole."""
    path = tmp_path / "large.jsonl"
    big = "word " * (4 << 20)    # 20 MB of text per line
    with open(path, "w") as fh:
        for i in range(10):
            fh.write(json.dumps({"id": f"big-{i}", "text": big}) + "\n")
        fh.write(json.dumps({"id": "huge", "text": big * 4}) + "\n")   # 80 MB: over max_record_bytes
        fh.write(json.dumps({"id": "ok", "text": TEXT}) + "\n")
    out = run_child(f"""
from quipu.tasks.extract import ExtractConfig, extract_file
from quipu.tasks.pipeline import REMOVED_SCHEMA
r = extract_file({str(path)!r}, {str(tmp_path / 'out')!r}, ExtractConfig(), REMOVED_SCHEMA).model_dump()
out = {{'removed': r['removed']['path'], 'kept': r['kept_docs'], 'by_reason': r['removed_by_reason'], 'read': r['records_read']}}
""")
    assert out["rss_mb"] < RSS_BOUND_MB, out
    assert out["read"] == 12 and out["kept"] == 1 and out["by_reason"] == {"extract:too_large": 11}
    removed = pq.read_table(out["removed"])
    assert removed.schema.equals(REMOVED_SCHEMA)
    rows = {r["id"]: r for r in removed.to_pylist()}
    assert set(rows) == {f"big-{i}" for i in range(10)} | {"huge"}
    assert all(len(r["text"]) <= TOO_LARGE_CHARS for r in rows.values())
    assert rows["big-0"]["text_bytes"] == len(big) and rows["huge"]["text_bytes"] > 80_000_000


def test_file_time_budget_stops_one_file_with_a_reason(tmp_path):
    path = tmp_path / "slow.jsonl"
    path.write_bytes(b"".join(jline(i) for i in range(5000)))
    items = list(read(str(path), ReadStats(), ReadLimits(max_file_seconds=1e-9)))
    docs, quarantined = records(items)
    assert len(docs) >= 1 and len(quarantined) == 1
    assert quarantined[0].reason.startswith("time budget exceeded") and quarantined[0].record.startswith("after line")


# ---- the hostile files of every format, for the end-to-end run (tests/test_fault_suite.py) ------

def build_hostile_corpus(d: Path) -> dict[str, dict]:
    """One file per reproduction above (bombs included), in `d`; returns what each must give in
    the fault suite's terms: `records` read, `quarantine` reasons (substrings)."""
    d.mkdir(parents=True, exist_ok=True)
    exp: dict[str, dict] = {}
    _gzip_of_zeros(d / "bomb.jsonl.gz", 1)                       # 1 MB -> 1 GiB of zeros, no newline
    exp["bomb.jsonl.gz"] = {"records": 1, "quarantine": ["decompression stopped"]}
    with open(d / "bomb.jsonl.zst", "wb") as fh, zstandard.ZstdCompressor(level=3).stream_writer(fh) as w:
        for _ in range(64):
            w.write(b"\x00" * (16 << 20))
    exp["bomb.jsonl.zst"] = {"records": 1, "quarantine": ["decompression stopped"]}
    with open(d / "header-line.warc", "wb") as fh:              # a 64 MB HTTP header line, then a good record
        http_len = len(b"HTTP/1.1 200 OK\r\nX-Junk: ") + (64 << 20) + 4
        fh.write(b"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: https://example.org/h0\r\n"
                 b"Content-Type: application/http; msgtype=response\r\n" + f"Content-Length: {http_len}\r\n\r\n".encode()
                 + b"HTTP/1.1 200 OK\r\nX-Junk: ")
        for _ in range(64):
            fh.write(b"a" * (1 << 20))
        fh.write(b"\r\n\r\n\r\n\r\n" + warc_record("https://example.org/h1", page(1), 1))
    exp["header-line.warc"] = {"records": 2, "quarantine": ["HeaderLineTooLong"]}
    lines = [jline(i) for i in range(20)]
    lines[3] = b"[" * 1000 + b"]" * 1000 + b"\n"
    lines[4] = b'{"id": "big", "text": "x", "n": ' + b"9" * 5000 + b"}\n"
    (d / "nested-and-huge-int.jsonl").write_bytes(b"".join(lines))
    exp["nested-and-huge-int.jsonl"] = {"records": 20, "quarantine_at": {"line 4": "nested too deeply",
                                                                        "line 5": "unparseable JSON value"}}
    texts = [TEXT + f" Row {i}." for i in range(5)]
    pq.write_table(pa.table({"id": [f"dict-{i}" for i in range(5)], "text": pa.array(texts).dictionary_encode()}),
                   d / "dictionary-text.parquet")
    pq.write_table(pa.table({"id": [f"view-{i}" for i in range(5)], "text": pa.array(texts, pa.string_view())}),
                   d / "string-view-text.parquet")
    exp["dictionary-text.parquet"] = exp["string-view-text.parquet"] = {"records": 5}
    last = warc_record(None, page(2), 2)
    (d / "interrupted.warc").write_bytes(warc_record("https://example.org/i0", page(0), 0) + last[: len(last) // 2])
    exp["interrupted.warc"] = {"records": 2}
    (d / "liar.warc").write_bytes(warc_record("https://example.org/l0", page(0), 0)
                                  + warc_record("https://example.org/l1", page(1), 1, content_length=10**12)
                                  + warc_record("https://example.org/l2", page(2), 2))
    exp["liar.warc"] = {"records": 3, "quarantine": ["record truncated"]}
    os.mkfifo(d / "pipe.jsonl")
    os.symlink(d / "gone.jsonl", d / "dangling.jsonl")
    exp["pipe.jsonl"] = {"records": 1, "quarantine_at": {"file": "named pipe (FIFO)"}}
    exp["dangling.jsonl"] = {"records": 1, "quarantine_at": {"file": "dangling symbolic link"}}
    return exp


# ---- issue 32: per-file isolation to the end ------------------------------------------------------

def deny_open(monkeypatch, path: Path) -> None:
    """`open(path)` fails with EACCES, as it does for a mode-000 file when not root: root opens any
    file, and CI runs as root."""
    real = builtins.open

    def guarded(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and os.fspath(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real(file, *args, **kwargs)
    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)


def test_unreadable_file_and_non_utf8_name_cost_only_themselves(tmp_path, monkeypatch):
    """A file that exists but cannot be opened (mode 000; as root, `open` refusing it) failed the
    run in sha256_file; a name with non-UTF-8 bytes failed it in unit_key. Now the first is one
    quarantine row naming the file and the error, the second is read by its bytes and recorded
    with the bytes escaped; the unit's other file is read."""
    from quipu.tasks.extract import extract_unit
    folder = tmp_path / "in"
    folder.mkdir()
    good = folder / "good.jsonl"
    good.write_bytes(b"".join(jline(i) for i in range(3)))
    odd = os.fsdecode(bytes(folder) + b"/odd-\xff\xfe-name.jsonl")
    Path(odd).write_bytes(b"".join(jline(i) for i in range(10, 12)))
    locked = folder / "locked.jsonl"
    locked.write_bytes(jline(99))
    locked.chmod(0)
    if os.geteuid() == 0:
        deny_open(monkeypatch, locked)
    files = expand_inputs([str(folder)])
    assert odd in files
    result = extract_unit(files, tmp_path / "out", ExtractConfig()).model_dump()
    check_accounting(result)
    by_source = {f["source"]: f for f in result["files"]}
    escaped = str(folder) + "/odd-\\xff\\xfe-name.jsonl"
    assert by_source[escaped]["documents"] == 2 and by_source[str(good)]["documents"] == 3
    assert by_source[str(locked)]["quarantined"] == 1
    q = pq.read_table(tmp_path / "out" / "quarantine").to_pylist()
    assert [(r["source"], r["record"]) for r in q] == [(str(locked), "file")]
    assert q[0]["reason"].startswith("cannot open file: PermissionError"), q[0]["reason"]
    kept = pq.read_table(tmp_path / "out" / "extract").column("source").to_pylist()
    assert escaped in kept   # the name is stored escaped: valid UTF-8 everywhere


# ---- issue 32: memory from declared sizes ---------------------------------------------------------

@pytest.mark.parametrize("declared_gb", [1])   # 4 GB: the same check, and 4 GB of zeros to hash
def test_sparse_parquet_declaring_a_huge_footer_is_refused_unread(tmp_path, declared_gb):
    """A sparse file: PAR1, a hole, then a footer length of 1 or 4 GB and PAR1. pyarrow allocated
    the declared footer whole (4 GB footer: 4.7 GB RSS). Now the 8 tail bytes are checked first:
    one quarantine row, memory flat, the run goes on (the same file goes through pack_inputs,
    which would plan row-group slices for a file this size)."""
    path = tmp_path / "sparse.parquet"
    declared = min(declared_gb << 30, (1 << 32) - 1)
    with open(path, "wb") as fh:
        fh.write(b"PAR1")
        fh.seek(declared + 4)
        fh.write(declared.to_bytes(4, "little") + b"PAR1")
    out = run_child(f"""
from quipu.tasks.extract import ExtractConfig, extract_unit, pack_inputs
units = pack_inputs([{str(path)!r}], 64 << 20)
r = extract_unit(units[0], {str(tmp_path / 'out')!r}, ExtractConfig()).model_dump()
out = {{k: r[k] for k in ('records_read', 'input_docs', 'quarantined', 'quarantine_by_reason')}}
""")
    assert out["rss_mb"] < RSS_BOUND_MB, out
    assert out["records_read"] == 1 and out["quarantined"] == 1, out
    reason = next(iter(out["quarantine_by_reason"]))
    assert "parquet footer" in reason and "cap" in reason, reason


def _alias_bomb(levels: int = 9) -> str:
    lines = ["a0: &a0 [es, pt, en, es, pt, en, es, pt, en, es]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels + 1)]
    return "x-anchors:\n" + "".join(f"  {line}\n" for line in lines) + f"langid:\n  languages: *a{levels}\n"


def test_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    """A 600-byte YAML whose aliases expand to 10^10 values inside langid.languages: > 4 GB in 57 s
    with no message (validating and formatting the expanded value). Now refused at once, one line;
    an ordinary config with a few aliases still loads."""
    import time
    from quipu.flows.config import ConfigError, load_config
    from quipu.flows.curate import CurateConfig
    path = tmp_path / "bomb.yaml"
    path.write_text(_alias_bomb())
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb.yaml: its YAML aliases expand to more than 100,000 values"):
        load_config(CurateConfig, path)
    with pytest.raises(ConfigError, match=r"--set langid.languages: its YAML aliases expand"):
        load_config(CurateConfig, None, ["langid.languages=" + "{a: &a [x,x,x,x,x,x,x,x,x,x], b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], "
                                         "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], "
                                         "e: [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]}"])
    assert time.perf_counter() - t0 < 5
    ok = tmp_path / "ok.yaml"
    ok.write_text("langid:\n  languages: &langs [es, pt, en]\n")
    assert load_config(CurateConfig, ok).langid.languages == ["es", "pt", "en"]


def test_config_error_formats_a_large_value_from_a_bounded_prefix(tmp_path):
    """Under the alias limit a value can still be large (here a 20,000-entry mapping where a list
    of language codes is expected): the message shows a bounded prefix of it, in at most 11 lines."""
    from quipu.flows.config import ConfigError, load_config
    from quipu.flows.curate import CurateConfig
    path = tmp_path / "big.yaml"
    path.write_text("langid:\n  languages: {" + ", ".join(f"k{i}: [{i}, {i}]" for i in range(20_000)) + "}\n")
    with pytest.raises(ConfigError) as e:
        load_config(CurateConfig, path)
    lines = str(e.value).splitlines()
    assert "langid.languages" in lines[0] and max(map(len, lines)) < 400 and len(lines) <= 11, lines
    path.write_text("langid:\n  languages: [" + ", ".join(["[1, 2]"] * 2_000) + "]\n")   # 2,000 errors
    with pytest.raises(ConfigError) as e:
        load_config(CurateConfig, path)
    lines = str(e.value).splitlines()
    assert len(lines) == 11 and lines[-1].endswith("... and 1,990 more errors"), lines[-2:]


# ---- issue 32: hostile model files ---------------------------------------------------------------

@pytest.fixture(scope="module")
def small_quality_model(tmp_path_factory) -> Path:
    """A tiny fastText classifier trained here on the probe texts (0.3 s)."""
    import random
    from quipu.scoring.model_files import PROBE
    from quipu.trainer.classifier_train import FastTextParams, train_model
    d = tmp_path_factory.mktemp("ftmodel")
    rng = random.Random(0)
    with open(d / "train.txt", "w") as f:
        for _ in range(200):
            f.write("__label__hq " + rng.choice(PROBE[:4]).lower() + "\n")
            f.write("__label__lq " + rng.choice(PROBE[4:]).lower() + "\n")
    train_model(str(d / "train.txt"), FastTextParams(dim=16, bucket=2000, epoch=5, lr=0.1, wordNgrams=1, minCount=1),
                1, str(d / "q.bin"))
    return d / "q.bin"


def _layout(path: Path) -> dict:
    """Offsets of a dense supervised fastText file: header ints, input matrix shape, its weights."""
    import struct
    data = path.read_bytes()
    n_entries = struct.unpack_from("<i", data, 64)[0]   # after magic, version, 12 int args, a double
    pos = 92
    for _ in range(n_entries):
        pos = data.index(b"\0", pos) + 1 + 9
    return {"input_mn": pos + 1, "input_data": pos + 17, "size": len(data)}


def test_fasttext_model_with_a_changed_header_integer_or_cut_short_is_refused_in_one_line(tmp_path, small_quality_model):
    """A fastText header with one integer changed aborted the process (`free(): invalid next
    size`) mid-run; a truncated one loaded and scored everything ~0.5. Now the layout is checked
    against the file before the native loader sees it: one error naming the file."""
    import struct
    from quipu.scoring.model_files import fasttext_problem
    from quipu.scoring.fasttext_classifier import ClassifierModelError, load_classifier
    data = small_quality_model.read_bytes()
    assert fasttext_problem(str(small_quality_model)) is None
    from quipu.tasks.langid import default_model_path
    assert fasttext_problem(default_model_path()) is None          # the shipped, quantized LID model
    cases = {"dim": (8, 4000), "bucket": (40, 200_000), "nwords": (68, 10_000), "input rows": (_layout(small_quality_model)["input_mn"], 10 ** 6)}
    for name, (offset, value) in cases.items():
        bad = bytearray(data)
        struct.pack_into("<q" if name == "input rows" else "<i", bad, offset, value)
        path = tmp_path / f"{name.replace(' ', '_')}.bin"
        path.write_bytes(bytes(bad))
        with pytest.raises(ClassifierModelError, match=f"{path}: ") as e:
            load_classifier(str(path), "hq")
        assert "\n" not in str(e.value), name
    cut = tmp_path / "cut.bin"
    cut.write_bytes(data[: len(data) * 6 // 10])
    with pytest.raises(ClassifierModelError, match=f"{cut}: truncated"):
        load_classifier(str(cut), "hq")


def test_quality_model_with_constant_scores_fails_the_precheck(tmp_path, small_quality_model):
    """A consistent file whose weights say nothing (here the input vectors zeroed: every text gets
    the same score) would keep or remove everything alike; the probe set catches it."""
    from quipu.scoring.fasttext_classifier import ClassifierModelError, load_classifier
    lay = _layout(small_quality_model)
    data = bytearray(small_quality_model.read_bytes())
    m, n = struct_unpack_qq(data, lay["input_mn"])
    data[lay["input_data"]: lay["input_data"] + m * n * 4] = bytes(m * n * 4)
    flat = tmp_path / "flat.bin"
    flat.write_bytes(bytes(data))
    with pytest.raises(ClassifierModelError, match=f"classifier model {flat} gives every probe text the same score"):
        load_classifier(str(flat), "hq")
    assert load_classifier(str(small_quality_model), "hq").score(["a fine sentence."])   # the real one loads


def struct_unpack_qq(data, offset):
    import struct
    return struct.unpack_from("<qq", data, offset)


def test_a_loader_crash_is_one_line_naming_the_file(tmp_path, monkeypatch, small_quality_model):
    """Whatever the layout check misses and the native loader dies on is a crash of the child, not
    of quipu: one line naming the file and the signal."""
    import quipu.scoring.model_files as mf
    monkeypatch.setattr(mf, "fasttext_problem", lambda path: None)
    bad = tmp_path / "abort.bin"
    bad.write_bytes(small_quality_model.read_bytes())
    monkeypatch.setattr(mf.sys, "executable", str(tmp_path / "python"))
    (tmp_path / "python").write_text("#!/bin/sh\nkill -ABRT $$\n")
    (tmp_path / "python").chmod(0o755)
    with pytest.raises(mf.ModelFileError, match=rf"fastText model {bad} crashed the fastText loader \(SIGABRT\)"):
        mf.check_fasttext(str(bad), "__label__hq")


@pytest.mark.slow   # ~25 s: a child that imports torch and transformers
def test_student_config_declaring_the_largest_arch_beside_tiny_weights_allocates_nothing(tmp_path):
    """A student whose config.json declares the largest allowed architecture next to a tiny
    model.safetensors took > 5 GB in the pre-check (the model was built before the weights were
    compared). Now the header's shapes are compared with the arch built on the meta device first:
    one StudentError naming the file, memory flat."""
    out = run_child(f"""
import json
from pathlib import Path
from safetensors.torch import save_file
from quipu.scoring.wayra import CONFIG_FILE, FORMAT, TOKENIZER_FILE, WEIGHTS_FILE, StudentError, WayraArch, WayraModel, WayraStudent
d = Path({str(tmp_path / 'student')!r}); d.mkdir()
tiny = WayraArch(vocab_size=320, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=48)
save_file(WayraModel(tiny).state_dict(), str(d / WEIGHTS_FILE))
big = {{**tiny.model_dump(), "vocab_size": 65536, "d_model": 2048, "n_layers": 24, "n_heads": 32, "d_ff": 8192, "max_len": 4096}}
(d / CONFIG_FILE).write_text(json.dumps({{"format": FORMAT, "arch": big, "label_mean": 0.0, "label_std": 1.0}}))
(d / TOKENIZER_FILE).write_text("{{}}")
try:
    WayraStudent.load(d)
    out = {{"error": None}}
except StudentError as e:
    out = {{"error": str(e)}}
""")
    assert out["rss_mb"] < RSS_BOUND_MB, out
    assert out["error"] and "does not match its config's arch" in out["error"] and "model.safetensors" in out["error"], out


def test_kenlm_model_is_first_loaded_in_a_child(tmp_path):
    """KenLM files get the same first load in a child process: a file it cannot read is one line
    naming it (a file it would abort on costs the child, not the run: as in the fastText test)."""
    from quipu.scoring.model_files import ModelFileError, check_kenlm
    arpa = tmp_path / "tiny.arpa"
    arpa.write_text("\\data\\\nngram 1=4\nngram 2=2\n\n\\1-grams:\n-1.0\t<unk>\t0\n-99\t<s>\t-0.3\n-0.5\t</s>\t0\n"
                    "-0.6\tword\t-0.2\n\n\\2-grams:\n-0.2\t<s> word\n-0.3\tword </s>\n\n\\end\\\n")
    check_kenlm(str(arpa))
    cut = tmp_path / "cut.arpa"
    cut.write_text(arpa.read_text()[:40])
    with pytest.raises(ModelFileError, match=rf"KenLM model {cut} cannot be loaded: "):
        check_kenlm(str(cut))


def test_an_os_error_while_reading_costs_the_rest_of_that_file_only(tmp_path, monkeypatch):
    """EIO, a file cut or made unreadable while read: the records before it stay, the rest of the
    file is one quarantine row naming the error (the run goes on)."""
    import quipu.tasks.reading.jsonl as readers
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"".join(jline(i) for i in range(3)))
    real = readers.read_jsonl

    def failing(*args, **kwargs):
        items = real(*args, **kwargs)
        yield next(items)
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(readers, "read_jsonl", failing)
    docs, quarantined = records(list(read(str(path), ReadStats())))
    assert len(docs) == 1 and len(quarantined) == 1
    assert quarantined[0].record == "after line 1" and quarantined[0].reason == "cannot read file: OSError: Input/output error"
