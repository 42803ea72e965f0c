"""Fuzzed readers (issue 13): valid WARC (per-record gzip and plain), ARC, JSONL, JSONL.gz
(several members), JSONL.zst (several frames) and parquet files built from real documents, then
mutated at random: truncation at any byte, byte flips, inserted garbage, deleted and duplicated
byte ranges, wrong Content-Length, deleted/duplicated/oversized header lines, deep nesting, huge
numbers, other encodings, NUL bytes, oversized lines. Every mutated file goes through extraction
(`extract_file`, in process) and must:
- raise nothing (the run would exit 0);
- account for every record: documents + quarantined == records read, and the rows written
  (kept + removed, quarantine) equal those counts;
- read every record the mutation left whole, where the format can resynchronise (which records
  count as whole is stated per format in `undamaged`);
- leave no temporary file;
- stay within a bounded amount of memory (small limits make the oversized cases cheap: the caps
  are what is tested, the bombs themselves are in tests/test_hostile_input.py).

The suite runs a fixed sample (a fixed seed and no example database: the same examples on every
machine); the counts per format are printed. `make fuzz` runs many more examples from a new seed
each time, printed (QUIPU_FUZZ_SEED=N make fuzz replays one). Cases hypothesis found are kept below
as explicit regression examples.
"""
from __future__ import annotations

import gzip
import io
import json
import os
import random
import resource
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from quipu.tasks.extract import ExtractConfig, extract_file
from tests.conftest import FUZZ_SEED, SHARED_DATA
from tests.textgen import python_doc_paragraphs

SEED = 20261123
CI_EXAMPLES = 60           # per format, in the suite (CI): a fixed sample
FUZZ_EXAMPLES = 1500       # per format, under `make fuzz`
LIMITS = dict(max_record_bytes=64 << 10, max_header_bytes=4 << 10, timeout_s=30)
FORMATS = ["warc.gz", "warc", "arc", "jsonl", "jsonl.gz", "jsonl.zst", "parquet"]
COUNTS: dict[str, int] = {}


def _docs() -> list[tuple[str, str]]:
    """(id, text) of 12 real documents: the shared corpora when present, else Python's own docs."""
    texts: list[str] = []
    for name in ("en_ud_ewt_web.jsonl", "es_nltk_cess_esp_news.jsonl", "pt_fakebr_news.jsonl"):
        path = SHARED_DATA / "text" / name
        if path.exists():
            with open(path, encoding="utf-8") as fh:
                texts += [json.loads(line)["text"][:700] for _, line in zip(range(4), fh)]
    if len(texts) < 12:
        texts = python_doc_paragraphs()[:12]
    return [(f"doc-{i:02d}", t) for i, t in enumerate(texts[:12])]


DOCS = _docs()


@dataclass
class Built:
    """A valid file and where each record lies in it: ids[i] occupies bytes spans[i]."""
    data: bytes
    ids: list[str]
    spans: list[tuple[int, int]]
    footer: int | None = None      # parquet: where the metadata starts (damage there loses the file)
    header_lines: list[list[tuple[int, int]]] = field(default_factory=list)   # WARC: header line spans per record


# ---- building valid files ---------------------------------------------------------------------

def _warc_record(doc_id: str, text: str, i: int) -> tuple[bytes, list[tuple[int, int]]]:
    payload = text.encode("utf-8")
    headers = [b"WARC/1.0", b"WARC-Type: resource", f"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-{i:012d}>".encode(),
               f"WARC-Target-URI: https://example.org/{doc_id}".encode(), b"WARC-Date: 2026-01-01T00:00:00Z",
               b"Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(payload)}".encode()]
    lines, pos = [], 0
    for h in headers:
        lines.append((pos, pos + len(h) + 2))
        pos += len(h) + 2
    return b"\r\n".join(headers) + b"\r\n\r\n" + payload + b"\r\n\r\n", lines


def build(fmt: str) -> Built:
    ids, spans, out, header_lines = [], [], io.BytesIO(), []
    if fmt in ("warc", "warc.gz"):
        for i, (doc_id, text) in enumerate(DOCS):
            rec, lines = _warc_record(doc_id, text, i)
            start = out.tell()
            out.write(gzip.compress(rec, mtime=0) if fmt == "warc.gz" else rec)
            ids.append(doc_id), spans.append((start, out.tell()))
            header_lines.append([(start + a, start + b) for a, b in lines])
    elif fmt == "arc":
        body = b"1 0 quipu-fuzz\nURL IP-address Archive-date Content-type Archive-length\n"
        out.write(b"filedesc://fuzz.arc 0.0.0.0 20260101000000 text/plain %d\n" % len(body) + body + b"\n")
        for doc_id, text in DOCS:
            payload = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + text.encode()
            start = out.tell()
            out.write(f"https://example.org/{doc_id} 127.0.0.1 20260101000000 text/plain {len(payload)}\n".encode() + payload + b"\n")
            ids.append(doc_id), spans.append((start, out.tell()))
    elif fmt.startswith("jsonl"):
        lines = [json.dumps({"id": d, "text": t}, ensure_ascii=False).encode() + b"\n" for d, t in DOCS]
        group = 1 if fmt == "jsonl" else 2        # gzip members / zstd frames of two lines each
        for k in range(0, len(lines), group):
            chunk = b"".join(lines[k:k + group])
            start = out.tell()
            if fmt == "jsonl.gz":
                chunk = gzip.compress(chunk, mtime=0)
            elif fmt == "jsonl.zst":
                chunk = zstandard.ZstdCompressor(write_checksum=True).compress(chunk)
            out.write(chunk)
            for d, _ in DOCS[k:k + group]:
                ids.append(d), spans.append((start, out.tell()))
    elif fmt == "parquet":
        table = pa.table({"id": [d for d, _ in DOCS], "text": [t for _, t in DOCS]})
        pq.write_table(table, out, row_group_size=3, compression="zstd")
        md = pq.ParquetFile(io.BytesIO(out.getvalue())).metadata
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            cols = [rg.column(c) for c in range(rg.num_columns)]
            start = min(c.dictionary_page_offset or c.data_page_offset for c in cols)
            end = max((c.dictionary_page_offset or c.data_page_offset) + c.total_compressed_size for c in cols)
            for r in range(g * 3, g * 3 + rg.num_rows):
                ids.append(DOCS[r][0]), spans.append((start, end))
        return Built(out.getvalue(), ids, spans, footer=max(e for _, e in spans))
    return Built(out.getvalue(), ids, spans, header_lines=header_lines)


BUILT = {fmt: build(fmt) for fmt in FORMATS}


# ---- mutations: (new bytes, damaged byte ranges in the ORIGINAL file) ---------------------------

def mutate(fmt: str, b: Built, kind: str, draw) -> tuple[bytes, list[tuple[int, int]]]:
    data, n = b.data, len(b.data)
    pos = draw(st.integers(0, n - 1))
    if kind == "truncate":
        return data[:pos], [(pos, n)]
    if kind == "flip":
        k = draw(st.integers(1, 4))
        spots = sorted(draw(st.lists(st.integers(0, n - 1), min_size=k, max_size=k)))
        out = bytearray(data)
        for s in spots:
            out[s] ^= draw(st.integers(1, 255))
        return bytes(out), [(s, s + 1) for s in spots]
    if kind == "garbage":
        junk = draw(st.binary(min_size=1, max_size=300))
        return data[:pos] + junk + data[pos:], [(pos, pos)]
    if kind == "delete":
        end = min(n, pos + draw(st.integers(1, 400)))
        return data[:pos] + data[end:], [(pos, end)]
    if kind == "duplicate":
        end = min(n, pos + draw(st.integers(1, 400)))
        return data[:end] + data[pos:end] + data[end:], [(pos, end)]
    # record-level mutations: one record k
    k = draw(st.integers(0, len(b.ids) - 1))
    a, e = b.spans[k]
    if kind == "content_length":
        lines = b.header_lines[k]
        la, lb = lines[-1]                                   # the Content-Length line
        value = draw(st.sampled_from([b"0", b"1", b"-5", b"abc", b"99999999999", b"%d" % (e - a + 37), b"%d" % max(0, e - a - 120)]))
        return data[:la] + b"Content-Length: " + value + b"\r\n" + data[lb:], [(a, e)]
    if kind in ("drop_header", "dup_header", "long_header"):
        la, lb = draw(st.sampled_from(b.header_lines[k][1:]))
        line = data[la:lb]
        new = {"drop_header": b"", "dup_header": line + line,
               "long_header": b"X-Junk: " + b"a" * draw(st.integers(5000, 20000)) + b"\r\n" + line}[kind]
        return data[:la] + new + data[lb:], [(a, e)]
    if kind == "bad_line":                                  # JSONL: replace line k
        bad = draw(st.sampled_from([b"[" * 1000 + b"]" * 1000, b'{"id": "n", "n": ' + b"7" * 5000 + b"}",
                                    DOCS[k][1].encode("utf-16"), DOCS[k][1].encode("latin-1", "replace"),
                                    b"\x00" * 50 + b'{"id": "z"}', b'{"id": "big", "text": "' + b"x" * 70000 + b'"}',
                                    b"\xff\xfe garbage", b'{"text": 5}']))
        return data[:a] + bad + b"\n" + data[e:], [(a, e)]
    raise AssertionError(kind)


KINDS = {
    "warc.gz": ["truncate", "flip", "garbage", "delete", "duplicate"],
    "warc": ["truncate", "flip", "garbage", "delete", "duplicate", "content_length", "drop_header", "dup_header", "long_header"],
    "arc": ["truncate", "flip", "garbage", "delete", "duplicate"],
    "jsonl": ["truncate", "flip", "garbage", "delete", "duplicate", "bad_line"],
    "jsonl.gz": ["truncate", "flip", "garbage", "delete", "duplicate"],
    "jsonl.zst": ["truncate", "flip", "garbage", "delete", "duplicate"],
    "parquet": ["truncate", "flip", "garbage", "delete", "duplicate"],
}


def undamaged(fmt: str, b: Built, damage: list[tuple[int, int]], kind: str) -> set[str]:
    """The records a mutation left whole AND that the format can reach after the damage.

    - per-record gzip WARC, JSONL.gz, JSONL.zst: members/frames not touching the damage (each is
      its own unit; reading resumes at the next member/frame header).
    - plain WARC and ARC: records not touching the damage and not right after a touched record (a
      damaged length or header may take the start of the next record with it). ARC, two after: its
      header is a free-form text line, so a line of the damaged record's text can pass for one
      (warcio parses `What do you eat 2 ...` as a record) and the resync starts after that.
    - JSONL: lines not touching the damage or a neighbouring line (a damaged newline joins two).
    - parquet: nothing if the metadata at the end is touched (or the file truncated), else the row
      groups not touching the damage; after an insertion or deletion, only the row groups before it
      (the footer's byte offsets of everything after it are wrong).
    - truncation: the records wholly before the cut, in every format but parquet.
    """
    def touched(span, slack=0):
        a, e = span
        return any(x - slack < e and y + slack >= a if x != y else a - slack <= x <= e + slack for x, y in damage)

    if fmt == "parquet":
        if kind == "truncate" or any(y > b.footer or x >= b.footer for x, y in damage) or any(x < 4 for x, _ in damage):
            return set()
        if kind in ("garbage", "delete", "duplicate"):   # the footer's offsets after the change all moved
            return {i for i, (a, e) in zip(b.ids, b.spans) if e < damage[0][0]}
        return {i for i, s in zip(b.ids, b.spans) if not touched(s, slack=1)}
    hit = [touched(s, slack=1) for s in b.spans]
    keep = set()
    for i, (doc_id, s) in enumerate(zip(b.ids, b.spans)):
        if hit[i]:
            continue
        if fmt in ("warc", "arc", "jsonl") and i > 0 and hit[i - 1]:
            continue
        if fmt == "arc" and i > 1 and hit[i - 2]:
            continue
        if fmt == "jsonl" and i + 1 < len(hit) and hit[i + 1] and kind != "truncate":
            continue
        keep.add(doc_id)
    return keep


# ---- the property -----------------------------------------------------------------------------

def check(fmt: str, kind: str, data: bytes, damage, tmp: Path) -> None:
    b = BUILT[fmt]
    path = tmp / f"fuzz.{fmt}"
    path.write_bytes(data)
    run = tmp / "run"
    result = extract_file(str(path), run, ExtractConfig(**LIMITS)).model_dump()
    assert result["records_read"] == result["input_docs"] + result["quarantined"]
    assert result["input_docs"] == result["kept_docs"] + result["removed_docs"]
    written = [pq.read_table(s["path"], columns=["id"]) for s in result["kept_shards"] + [result["removed"]]]
    ids = [i for t in written for i in t.column("id").to_pylist()]
    assert len(ids) == result["input_docs"]
    if result["quarantine"]:
        assert pq.ParquetFile(result["quarantine"]["path"]).metadata.num_rows == result["quarantined"]
        reasons = pq.read_table(result["quarantine"]["path"], columns=["reason"]).column("reason").to_pylist()
        assert all(r and len(r) > 10 for r in reasons)
    else:
        assert result["quarantined"] == 0
    want = undamaged(fmt, b, damage, kind)
    # WARC/ARC documents are named by record id / position, JSONL and parquet by their `id`
    got = set(ids) if fmt in ("jsonl", "jsonl.gz", "jsonl.zst", "parquet") else {
        u.rsplit("/", 1)[-1] for t in [pq.read_table(s["path"], columns=["url"])
                                      for s in result["kept_shards"] + [result["removed"]]]
        for u in t.column("url").to_pylist() if u}
    missing = want - got
    assert not missing, f"{fmt}/{kind}: undamaged records not read: {sorted(missing)} (damage {damage}, result {result['quarantine_by_reason']})"
    assert not [p for p in run.rglob(".tmp-*")], "temporary files left"
    COUNTS[fmt] = COUNTS.get(fmt, 0) + 1


def _fuzz(fmt: str, data, tmp_path_factory):
    kind = data.draw(st.sampled_from(KINDS[fmt]), label="mutation")
    mutated, damage = mutate(fmt, BUILT[fmt], kind, data.draw)
    check(fmt, kind, mutated, damage, tmp_path_factory.mktemp("fuzz"))


FUZZ_SETTINGS = dict(deadline=None, database=None, print_blob=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                            HealthCheck.data_too_large])


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    line = (f"fuzzed readers: seed {SEED} (suite), {FUZZ_SEED} (make fuzz: QUIPU_FUZZ_SEED={FUZZ_SEED} replays it), "
            f"examples per format {dict(sorted(COUNTS.items()))}, "
            f"peak RSS grew {grown:.0f} MB")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)
    print(line)
    assert grown < 400, line


@pytest.mark.parametrize("fmt", FORMATS)
@seed(SEED)
@settings(max_examples=CI_EXAMPLES, **FUZZ_SETTINGS)
@given(data=st.data())
def test_fuzzed_file_is_read_and_accounted_for(fmt, data, tmp_path_factory):
    _fuzz(fmt, data, tmp_path_factory)


@pytest.mark.fuzz
@pytest.mark.parametrize("fmt", FORMATS)
@seed(FUZZ_SEED)
@settings(max_examples=FUZZ_EXAMPLES, **FUZZ_SETTINGS)
@given(data=st.data())
def test_fuzzed_file_is_read_and_accounted_for_many(fmt, data, tmp_path_factory):
    _fuzz(fmt, data, tmp_path_factory)


# ---- what hypothesis found, kept as regression cases --------------------------------------------

def _content_type_newline(b: Built) -> int:
    """The byte of record 0's header that ends its Content-Type line (the line before Content-Length)."""
    return b.header_lines[0][-2][1] - 1


FOUND = {
    # a newline before the first gzip member: warcio read the whole file as ONE record of type None,
    # counted as "skipped" — 11 documents lost without a quarantine row
    "newline-before-first-member": ("warc.gz", lambda d, b: (b"\n" + d, [(0, 0)]), "garbage"),
    # a NUL byte there: the file no longer looked gzipped and was "not a readable WARC/ARC file"
    "nul-before-first-member": ("warc.gz", lambda d, b: (b"\x00" + d, [(0, 0)]), "garbage"),
    # 300 bytes deleted from the start of member 1 on: warcio prints the zlib error and stops as if
    # the file had ended (found while the resync was being built: 10 later records lost, nothing
    # quarantined); the reader now checks where warcio stopped against the end of the file
    "deleted-inside-a-member": ("warc.gz", lambda d, b: (d[:b.spans[1][0] + 3] + d[b.spans[1][0] + 303:],
                                                         [(b.spans[1][0] + 3, b.spans[1][0] + 303)]), "delete"),
    # a piece of member 0 repeated after it: warcio read the next members as plain text until a
    # parse error far inside member 2; members 1 and 2 lost
    "repeated-piece-of-a-member": ("warc.gz", lambda d, b: (d[:b.spans[0][1]] + d[279:b.spans[0][1]] + d[b.spans[0][1]:],
                                                           [(279, b.spans[0][1])]), "duplicate"),
    # the newline before Content-Length flipped: no Content-Length, warcio read the rest of the file
    # as record 0's block, and the 11 records after it vanished inside a "document"
    "no-content-length": ("warc", lambda d, b: (d[:_content_type_newline(b)] + b"\x9f" + d[_content_type_newline(b) + 1:],
                                                [(_content_type_newline(b), _content_type_newline(b) + 1)]), "flip"),
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_cases_hypothesis_found(case, tmp_path):
    fmt, make, kind = FOUND[case]
    data, damage = make(BUILT[fmt].data, BUILT[fmt])
    check(fmt, kind, data, damage, tmp_path)


# ---- found by a wider fuzzer (BOM, re-encodings, long lines between records, damaged ARC URLs) ----

def _read(path: Path) -> tuple[list, list]:
    from quipu.tasks import reading as readers
    limits = readers.ReadLimits(**{k: v for k, v in LIMITS.items() if k != "timeout_s"})
    items = list(readers.read(str(path), readers.ReadStats(), limits))
    return ([i for i in items if isinstance(i, readers.RawRecord)], [i for i in items if isinstance(i, readers.Quarantined)])


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "jsonl.zst"])
def test_a_byte_order_mark_costs_no_record(fmt, tmp_path):
    """A UTF-8 BOM before the first line (what Windows editors write) used to make line 1 malformed JSON."""
    plain = b"\xef\xbb\xbf" + b"".join(json.dumps({"id": d, "text": t}).encode() + b"\n" for d, t in DOCS[:3])
    data = gzip.compress(plain, mtime=0) if fmt == "jsonl.gz" else zstandard.compress(plain) if fmt == "jsonl.zst" else plain
    path = tmp_path / f"bom.{fmt}"
    path.write_bytes(data)
    records, quarantined = _read(path)
    assert [r.id for r in records] == [d for d, _ in DOCS[:3]] and quarantined == []


@pytest.mark.parametrize("junk_len", [200, LIMITS["max_header_bytes"] + 1, 3 * LIMITS["max_header_bytes"]])
def test_a_long_junk_line_after_a_record_costs_only_the_junk(junk_len, tmp_path):
    """warcio reads the line after a record to skip blank lines: one longer than max_header_bytes
    used to make the whole record before it unreadable."""
    b = BUILT["warc"]
    k = 3
    junk = bytes(random.Random(junk_len).choice(b"abcdefgh") for _ in range(junk_len))
    path = tmp_path / "junk.warc"
    path.write_bytes(b.data[:b.spans[k][0]] + junk + b.data[b.spans[k][0]:])
    records, quarantined = _read(path)
    got = [r.url.rsplit("/", 1)[-1] for r in records]
    # record k's header line no longer starts a line: it may go (with a row); every other record is read
    assert set(got) >= set(b.ids) - {b.ids[k]}
    assert b.ids[k - 1] in got and len(quarantined) >= 1


def test_a_damaged_arc_url_is_quarantined_not_skipped(tmp_path):
    """A byte before an ARC header line (`xhttps://...`) made the record look like a capture of
    another protocol, skipped without a trace; real other protocols (dns:, chrome-extension:) are
    still counted and skipped."""
    from quipu.tasks.reading.warc import _other_protocol
    b = BUILT["arc"]
    k = 2
    path = tmp_path / "damaged.arc"
    path.write_bytes(b.data[:b.spans[k][0]] + b"x" + b.data[b.spans[k][0]:])
    records, quarantined = _read(path)
    assert b.ids[k] not in {r.url.rsplit("/", 1)[-1] for r in records if r.url}
    assert [q.reason for q in quarantined] == [f"malformed response record: target 'xhttps://example.org/{b.ids[k]}' has no known URI scheme"]
    assert len(records) == len(b.ids) - 1
    assert _other_protocol("dns:example.org") and _other_protocol("chrome-extension://abc/x.html")
    assert not any(_other_protocol(u) for u in ("xhttps://a.b/", "7https://a.b/", " https://a.b/", "\x00http://a", None))


# ---- PDF (issue 29): one file is one record, whatever the damage ---------------------------------

PDF_EXAMPLES = 40


def _pdf_built() -> Built:
    from quipu.synthetic.pdfs import make_pdf
    made = make_pdf([t for _, t in DOCS], "en", columns=2, seed=3)      # 2 pages: split by pages_per_unit 1
    return Built(made.data, ["pdf"], [(0, len(made.data))])


@seed(SEED)
@settings(max_examples=PDF_EXAMPLES, **FUZZ_SETTINGS)
@given(data=st.data())
def test_fuzzed_pdf_is_one_accounted_record(data, tmp_path_factory):
    """A mutated PDF (truncated, bytes flipped, garbage inserted, ranges deleted or duplicated)
    is read in the PDF child process: never an exception, exactly one record (a document kept or
    removed with an extract:pdf:* reason, or quarantined), the rows written match the counts. With
    pages_per_unit 1, the planner asks each mutant's page count and one it can open is read a page
    per unit, then joined: the same account."""
    from quipu.tasks.extract import run_extract
    from quipu.tasks.reading.pdf import PdfConfig
    from quipu.tasks.stage import RunContext
    built = BUILT.setdefault("pdf", _pdf_built())
    kind = data.draw(st.sampled_from(["truncate", "flip", "garbage", "delete", "duplicate"]), label="mutation")
    mutated, _ = mutate("pdf", built, kind, data.draw)
    run = tmp_path_factory.mktemp("fuzzpdf")
    path = run / "in.pdf"
    path.write_bytes(mutated)
    cfg = ExtractConfig(pdf=PdfConfig(ocr="never", page_timeout_s=20, pages_per_unit=1))
    (result,), _ = run_extract([[str(path)]], RunContext(str(run / "out")), cfg)
    result = result.model_dump()
    assert result["records_read"] == 1 == result["input_docs"] + result["quarantined"]
    kept = sum(pq.ParquetFile(s["path"]).metadata.num_rows for s in result["kept_shards"])
    removed = pq.read_table(result["removed"]["path"]).to_pylist()
    docs = [r for r in removed if "#page" not in r["id"]]     # the rest: rows of the pages it dropped
    assert kept + len(docs) == result["input_docs"] and len(removed) - len(docs) == result["removed_page_rows"]
    assert all(r["reason"].startswith("extract:") for r in docs), removed
    assert all(r["reason"].startswith("pdf:") for r in removed if r not in docs), removed
    pages = result["stats"].get("pdf", {})
    if "pages" in pages:       # every page read: from its text layer, empty or dropped, and each dropped one a row
        dropped = sum(pages["pages_dropped"].values())
        assert pages["pages"] == pages["pages_text"] + pages["pages_ocr"] + pages["pages_empty"] + dropped, pages
        spans = [json.loads(r["metadata"]) for r in removed if r not in docs]
        assert sum(m.get("pdf_page_last", m["pdf_page"]) - m["pdf_page"] + 1 for m in spans) == dropped
    assert not [p for p in run.rglob(".tmp-*")], "temporary files left"
    COUNTS["pdf"] = COUNTS.get("pdf", 0) + 1
