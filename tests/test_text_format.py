"""Plain .txt files, the format added as the worked example of "Adding a format" (docs/architecture.md):
one module (quipu.tasks.reading.text) and one row of the format table. A file is one document;
undecodable bytes, a huge file and an empty file are quarantined or removed with their reason, and
the accounts add up (records read = documents + quarantined)."""
from __future__ import annotations

import codecs

import pyarrow.parquet as pq
import pytest

from quipu.tasks.extract import ExtractConfig, extract_file
from quipu.tasks.reading import FOLDER_SUFFIXES, ReadLimits, ReadStats, expand_inputs, read, reader_kind

TEXT = "En un lugar de la Mancha, de cuyo nombre no quiero acordarme, no ha mucho tiempo que vivía un hidalgo.\n\n" * 3


def test_a_text_file_is_one_document_in_its_encoding(tmp_path):
    plain, bom, utf16 = tmp_path / "quijote.txt", tmp_path / "bom.TXT", tmp_path / "utf16.txt"
    plain.write_text(TEXT, encoding="utf-8")
    bom.write_bytes(codecs.BOM_UTF8 + TEXT.encode())
    utf16.write_bytes(TEXT.encode("utf-16"))       # a byte-order mark first
    for path in (plain, bom, utf16):
        assert reader_kind(str(path)) == "text"
        (rec,) = list(read(str(path), ReadStats()))
        assert (rec.kind, rec.payload, rec.text, rec.offset, rec.content_type) == ("text", TEXT, TEXT, "file", "text/plain")
    r = extract_file(str(plain), tmp_path / "run", ExtractConfig(min_chars=1))
    assert (r.records_read, r.input_docs, r.kept_docs, r.quarantined) == (1, 1, 1, 0)
    (row,) = pq.read_table(r.kept_shards[0].path).to_pylist()
    assert row["text"] == TEXT and row["source"] == str(plain)


def test_hostile_text_files_cost_their_file_only_with_a_reason(tmp_path):
    latin1, empty, blank, huge = (tmp_path / n for n in ("latin1.txt", "empty.txt", "blank.txt", "huge.txt"))
    latin1.write_bytes("Año de gracia, São Paulo".encode("latin-1"))
    empty.write_bytes(b"")
    blank.write_text(" \n\t\n")
    huge.write_text(TEXT * 200)
    cfg = ExtractConfig(min_chars=1, max_record_bytes=10_000)
    (q,) = list(read(str(latin1), ReadStats()))
    assert (q.record, q.reason) == ("file", "invalid UTF-8: bad byte at position 1 of the file (convert it to UTF-8)")
    assert "\\xf1" in q.snippet
    got = {p.name: extract_file(str(p), tmp_path / "run", cfg) for p in (latin1, empty, blank, huge)}
    for r in got.values():
        assert r.records_read == r.input_docs + r.quarantined == 1 and r.input_docs == r.kept_docs + r.removed_docs
    assert got["latin1.txt"].quarantine_by_reason == {"invalid UTF-8": 1}
    assert got["empty.txt"].quarantine_by_reason == {"empty file (0 bytes)": 1}
    assert got["blank.txt"].removed_by_reason == {"extract:empty": 1}
    assert got["huge.txt"].removed_by_reason == {"extract:too_large": 1}
    (row,) = pq.read_table(got["huge.txt"].removed.path).to_pylist()
    assert row["text_bytes"] == huge.stat().st_size and TEXT.startswith(row["text"][:100])
    # a huge file is never held whole: the reader reads max_record_bytes + 1 of it
    (rec,) = list(read(str(huge), ReadStats(), ReadLimits(max_record_bytes=1000)))
    assert rec.reject == "too_large" and rec.size == huge.stat().st_size and len(rec.payload) <= 10_000


def test_a_folder_takes_text_files_in_only_by_name_or_glob(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "README.txt").write_text("How this folder was made.\n")
    (tmp_path / "data" / "a.jsonl").write_text('{"text": "x"}\n')
    assert ".txt" not in FOLDER_SUFFIXES
    assert [p.rsplit("/", 1)[1] for p in expand_inputs([str(tmp_path / "data")])] == ["a.jsonl"]
    assert [p.rsplit("/", 1)[1] for p in expand_inputs([str(tmp_path / "data" / "*.txt")])] == ["README.txt"]
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "quijote.txt").write_text(TEXT)
    with pytest.raises(FileNotFoundError, match=r"input not found: .*books \(a folder with no .*books/\*\.txt\)"):
        expand_inputs([str(tmp_path / "books")])
