"""Stage `extract`: read input files, turn HTML into main text (trafilatura), write raw shards.

One Prefect task per work unit: input files smaller than `pack_mb` are packed, in path order, into
units of about `pack_mb` bytes; a larger file is a unit of its own, and a plain JSONL or parquet
file of twice `pack_mb` or more is read in parts of about `pack_mb` (`reading.FileSlice`: at line
boundaries / by row groups, with the ids and positions of the whole file). So the number of tasks,
output files and markers follows the bytes read, not the number of files. Each unit yields document
shards of about `shard_mb` of text (`extract/kept/<unit-key>-<part>.parquet`), one removed shard,
and a quarantine file for what could not be read; its result accounts for every input file on its
own (records read = documents + quarantined, per file). HTML extraction runs in a child process so a page that makes the parser hang
or crash costs one document (`extract:timeout`), not the run. A PDF (a `.pdf` file, a unit of its
own, or a WARC/ARC `application/pdf` response) is read page by page in a child process of its own
(quipu.tasks.reading.pdf): text layer, OCR of scanned pages, running headers removed; its page counts go
to the report's `stats.pdf` and its fields (`pdf_pages`, ...) to the document's metadata.

Which reader reads a file, how a large one is sliced and how a long document is read in parts is
the format table's (quipu.tasks.reading.formats); what makes a record's payload text is the
extractor table here (`EXTRACTORS`, by the record's kind: text as it is, html, pdf).
"""
from __future__ import annotations

import json
import re
import threading
from collections import deque
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import pyarrow as pa
from pydantic import Field

from quipu.catalog.files import sha256_file, sha256_json, write_json_atomic
from quipu.tasks import extract_accounts, reading, text_repair
from quipu.tasks.child_worker import ChildWorker
from quipu.tasks.reading import html_text, pdf, pdf_ranges, records
from quipu.tasks.reading.pdf import PdfConfig
from quipu.tasks.driver import NO_PROGRESS, Progress, load_done, merge_counts, write_report
from quipu.tasks.extract_accounts import (STAGE, ExtractResult, FileAccount, UnitTally, aggregate_extract,
                                          page_row, reason_counts, write_quarantine)
from quipu.tasks.stage import PhaseResult, RunContext, StageConfig, module_version

import hashlib
import importlib
import os
import pkgutil
import sys
from dataclasses import dataclass, field

# Removed rows carry the document's size in bytes: a too-large document keeps only its first
# TOO_LARGE_CHARS characters in `text` (its full text is never held past the decision).
TOO_LARGE_CHARS = records.TOO_LARGE_PREFIX_BYTES
TOO_LARGE_REASONS = ("extract:too_large", "extract:payload_too_large", "extract:html_too_large")


class ExtractConfig(StageConfig):
    batch_rows: int = Field(500, gt=0, description="documents per batch written (HTML pages are large)")
    timeout_s: float = Field(10.0, gt=0, le=3600, description="per-document HTML extraction limit in CPU seconds of the extraction child (wall clock where there is no /proc, not Linux): a page costing more is removed (extract:timeout), whatever the machine's load; a child that uses no CPU and does not answer (a deadlock) is ended after 20x this (at least 120 s more) of wall clock")
    max_html_bytes: int = Field(5_000_000, gt=0, description="larger HTML payloads are removed unparsed")
    max_doc_bytes: int = Field(5_000_000, gt=0, description="larger documents are removed (extract:too_large)")
    min_chars: int = Field(1, ge=0, description="documents with fewer non-space characters are removed")
    max_control_char_ratio: float = Field(0.05, ge=0, le=1, description="binary junk: share of control/replacement characters above which a document is removed")
    shard_mb: float = Field(64.0, gt=0, description="target text size of one output shard")
    pack_mb: float = Field(64.0, gt=0, description="input files smaller than this are read together, in path order, in work units of about this many bytes (one task and one set of output shards per unit); a larger file is a unit of its own, and a plain JSONL or parquet file of twice this or more is read in parts of about this size (compressed JSONL and WARC/ARC files are read whole)")
    max_record_bytes: int = Field(50_000_000, gt=0, description="a JSONL line or WARC payload larger than this is never held in memory: removed as extract:too_large / extract:payload_too_large with its first bytes and its size (`text_bytes`)")
    max_header_bytes: int = Field(1 << 20, gt=0, description="a WARC/ARC/HTTP header line longer than this makes its record unreadable (quarantined; reading resumes at the next record)")
    max_expansion: float = Field(200.0, gt=1, description="decompression stops (one quarantined record) once a .gz/.zst file expands to more than this many times its size (and more than 256 MB): a decompression bomb")
    max_file_seconds: float = Field(3600.0, gt=0, le=7 * 86400, description="reading one input file (or one part of a large file) stops after this long; the rest of it is one quarantined record")
    pdf: PdfConfig = Field(default_factory=PdfConfig, description="PDF files and WARC/ARC PDF responses: text layer, OCR, limits (tasks/pdf.py)")
    fix_unicode: bool = Field(True, description="repair mojibake (ftfy) and normalise to NFC; counted in the report as unicode_repaired")
    html_extractor: Literal["fast", "trafilatura"] = Field("fast", description="fast: resiliparse's main content, with a guard that sends pages that are not mostly prose to trafilatura's fast mode (tasks/reading/html_text.py; measured 2-4x the wall-clock of trafilatura(favor_precision) on article pages at 0.98x its token F1, bench/RESULTS.md); trafilatura: trafilatura alone, with its fallback extractors")
    fast_min_prose: float = Field(0.85, ge=0, le=1, description="html_extractor fast: a page whose resiliparse text has a smaller share of its words in prose lines (8+ words, ending like a sentence) goes to trafilatura")
    include_comments: bool = Field(False, description="trafilatura: keep user comments")
    include_tables: bool = Field(True, description="trafilatura: keep tables")
    favor_precision: bool = Field(False, description="trafilatura: less boilerplate, less text")
    favor_recall: bool = Field(False, description="trafilatura: more text, more boilerplate")


# ---- HTML extraction in a child process, with a time limit --------------------------------------

class HtmlExtractor:
    """A long-lived HTML extraction worker process (tasks/reading/html_text.py, `child_worker.ChildWorker`);
    restarted after a timeout or a crash.

    Pages can be sent ahead (`submit`) so that the child extracts one page while this process
    reads, repairs and writes the one before (`extract_unit` sends each HTML page one record
    ahead): answers come back in the order pages were sent, and `result` takes them in that order.
    A page's time limit counts the CPU the child spends on it (`ChildWorker.receive`), so the pages
    kept do not depend on the machine's load or on how far ahead they were sent. After a timeout or
    a crash the pages sent behind the lost one go to the new worker."""

    def __init__(self):
        # the child imports html_text only (not this module: pyarrow, the PDF stack), so it starts fast
        self.worker = ChildWorker(html_text.serve, what="HTML extraction worker")
        self.pending: deque = deque()       # (record, message) sent and not yet answered, in order
        self.answers: dict[int, tuple] = {}  # id(record) -> (record, answer) taken ahead of its turn

    def prestart(self) -> None:
        """Launch the worker now, so that it starts while this process opens and reads its input."""
        if not self.worker.alive():
            self.worker.launch()

    def stop(self) -> None:
        self.worker.stop()
        self.pending.clear()
        self.answers.clear()

    def submit(self, record: Any, html: bytes | str, url: str | None, opts: dict, method: str = "trafilatura",
               min_prose: float = 0.0) -> None:
        msg = (html, url, method, opts, min_prose)
        self.pending.append((record, msg))
        self.worker.send(msg)

    def holds(self, record: Any) -> bool:
        """The record's page was submitted (its answer pending or already taken)."""
        return id(record) in self.answers or any(r is record for r, _ in self.pending)

    def _take(self, timeout_s: float) -> tuple:
        record, _ = self.pending[0]
        status, value = self.worker.receive(timeout_s)
        self.pending.popleft()
        if status in ("timeout", "died"):       # the worker was stopped: resend what was queued behind
            for _, msg in self.pending:
                self.worker.send(msg)
        return record, (status, value)

    def result(self, record: Any, timeout_s: float) -> tuple[str, str | None, str | None]:
        """(status, text or message, the path it took: html_text's names) for a submitted record.
        Status: 'ok' | 'empty' (no text) | 'timeout' | 'error'."""
        while id(record) not in self.answers:
            if not self.pending:
                raise KeyError("no page was submitted for this record")
            got, answer = self._take(timeout_s)
            self.answers[id(got)] = (got, answer)
        status, value = self.answers.pop(id(record))[1]
        if status == "died":
            return "error", "extractor process died", None
        if status != "ok":
            return status, value, None
        text, path = value
        return ("ok" if (text or "").strip() else "empty"), text, path

    def extract(self, html: bytes | str, url: str | None, opts: dict, timeout_s: float, method: str = "trafilatura",
                min_prose: float = 0.0) -> tuple[str, str | None, str | None]:
        """One page, sent and awaited: `result`'s answer."""
        key = object()
        self.submit(key, html, url, opts, method, min_prose)
        return self.result(key, timeout_s)


_local = threading.local()


def _extractor() -> HtmlExtractor:
    if getattr(_local, "extractor", None) is None:
        _local.extractor = HtmlExtractor()
    return _local.extractor


# ---- per-record logic -------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]")
_CHARSET = re.compile(r"charset\s*=\s*[\"']?([A-Za-z0-9_.:-]+)", re.I)


def html_for_parser(html: bytes, content_type: str | None) -> bytes | str:
    """The page decoded with the charset its HTTP header declares, else its bytes unchanged.

    trafilatura sees only the bytes: it honours a <meta> charset, otherwise it guesses, and reads
    e.g. a windows-1252 page as windows-1250 ('crème' -> 'crčme'). The HTTP header wins over
    <meta>, as in browsers; a charset that is unknown or does not fit the bytes is ignored.
    """
    m = _CHARSET.search(content_type or "")
    if m:
        try:
            return html.decode(m.group(1))
        except (LookupError, UnicodeDecodeError):
            pass
    return html


def control_char_ratio(text: str, sample: int = 100_000) -> float:
    head = text[:sample]
    return len(_CONTROL.findall(head)) / max(1, len(head))


def _needs_html(item: Any, cfg: ExtractConfig) -> bool:
    """The record is a page `decide` sends to the HTML extractor."""
    return (isinstance(item, reading.RawRecord) and not item.reject and item.kind == "html"
            and len(item.payload) <= cfg.max_html_bytes)


def submit_html(record: reading.RawRecord, cfg: ExtractConfig) -> None:
    opts = dict(include_comments=cfg.include_comments, include_tables=cfg.include_tables,
                favor_precision=cfg.favor_precision, favor_recall=cfg.favor_recall)
    _extractor().submit(record, html_for_parser(record.payload, record.content_type), record.url, opts,
                        cfg.html_extractor, cfg.fast_min_prose)


def html_sent_ahead(items: Iterator, cfg: ExtractConfig) -> Iterator:
    """`items`, each handed out after the next HTML page was sent to the extractor, so that the
    child extracts it while this process finishes the one before."""
    prev = None
    for item in items:
        if _needs_html(item, cfg):
            submit_html(item, cfg)
        if prev is not None:
            yield prev
        prev = item
    if prev is not None:
        yield prev


@dataclass
class UnitNotes:
    """What the extractors note across one unit's records, besides each record's decision."""
    pdf_stats: dict = field(default_factory=dict)       # a PDF's page counts (the report's stats.pdf)
    html_paths: dict = field(default_factory=dict)      # HTML pages by extraction path (html_text's names)
    lost_pages: list = field(default_factory=list)      # the record's dropped PDF pages: (first, last, why, detail)
    # a long document's unit: its format's `combine` over the parts' results, read instead of the file
    combine: Callable | None = None


def extract_text(record: reading.RawRecord, cfg: ExtractConfig, notes: UnitNotes) -> tuple[str, str | None]:
    return record.payload, None


def extract_html(record: reading.RawRecord, cfg: ExtractConfig, notes: UnitNotes) -> tuple[str, str | None]:
    """The page's main text, from the HTML extraction worker (the page may have been sent ahead)."""
    if len(record.payload) > cfg.max_html_bytes:
        return "", "extract:html_too_large"
    ex = _extractor()
    if not ex.holds(record):
        submit_html(record, cfg)
    status, value, path = ex.result(record, cfg.timeout_s)
    if path:
        notes.html_paths[path] = notes.html_paths.get(path, 0) + 1
    if status in ("timeout", "error", "empty"):
        return "", {"timeout": "extract:timeout", "error": "extract:parse_error", "empty": "extract:no_text"}[status]
    return value, None


def extract_pdf(record: reading.RawRecord, cfg: ExtractConfig, notes: UnitNotes) -> tuple[str, str | None]:
    """The PDF's text (quipu.tasks.reading.pdf); its page counts to the notes, its fields (pdf_pages,
    ...) to the record's metadata. A long PDF's unit combines its page ranges already read."""
    got = (notes.combine or pdf.read_pdf)(record.payload, cfg.pdf)
    record.metadata.update(got.metadata)
    merge_counts(notes.pdf_stats, got.stats)
    notes.lost_pages.extend(got.lost_pages)
    return got.text, (f"extract:{got.reason}" if got.reason else None)


# The extractor table: a record's kind -> what makes its payload a document's text, or a removal
# reason. A format whose records are text already needs no row of its own.
EXTRACTORS: dict[str, Callable[[reading.RawRecord, ExtractConfig, UnitNotes], tuple[str, str | None]]] = {
    "text": extract_text, "html": extract_html, "pdf": extract_pdf}


def decide(record: reading.RawRecord, cfg: ExtractConfig, notes: UnitNotes | None = None) -> tuple[str, str | None]:
    """(text, removal reason or None) for one record: its kind's extractor (`EXTRACTORS`), then the
    checks every document gets (size, emptiness, binary junk)."""
    if record.reject:
        return record.text or "", f"extract:{record.reject}"
    text, reason = EXTRACTORS[record.kind](record, cfg, notes or UnitNotes())
    if reason:
        return text, reason
    if len(text.encode("utf-8", "surrogatepass")) > cfg.max_doc_bytes:
        return text, "extract:too_large"
    if len(text.strip()) < max(1, cfg.min_chars):
        return text, "extract:empty"
    if control_char_ratio(text) > cfg.max_control_char_ratio:
        return text, "extract:binary_junk"
    return text, None


def _row(record: reading.RawRecord, text: str) -> dict[str, Any]:
    return {"id": record.id, "text": _clean_surrogates(text), "source": record.source, "url": record.url,
            "date": record.date, "content_type": record.content_type,
            "metadata": json.dumps(record.metadata, ensure_ascii=False, sort_keys=True, default=str)}


def _clean_surrogates(text: str) -> str:
    # lone surrogates (from JSON \ud800 escapes) cannot be written as UTF-8
    return text.encode("utf-8", "replace").decode("utf-8") if not text.isascii() else text


def file_key(path: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(path).name)[:60]
    return f"{stem}-{hashlib.sha1(os.fsencode(path)).hexdigest()[:8]}"


def code_version() -> str:
    """This module's, its accounts', text repair's and every module of the reader wing's."""
    wing = [importlib.import_module(f"{reading.__name__}.{m.name}") for m in sorted(pkgutil.iter_modules(reading.__path__))]
    return module_version(sys.modules[__name__], extract_accounts, text_repair, reading, *wing)


Input = str | reading.FileSlice        # a whole file, or part of a large one


def pack_inputs(paths: list[str], pack_bytes: int) -> list[list[Input]]:
    """Work units: consecutive files (in the given order) packed until they hold `pack_bytes`; a
    file at least that large is a unit of its own, or several when it can be read in parts
    (`reading.plan_slices`). A file whose size is unknown counts as large."""
    units: list[list[Input]] = []
    current: list[Input] = []
    size = 0
    for path in paths:
        n = reading.file_size(path)
        # a PDF is a unit of its own: its pages (OCR above all) are the work, not its bytes
        fmt = reading.format_of(path)
        large = n is None or n >= pack_bytes or (fmt is not None and fmt.own_unit)
        if current and (large or size + n > pack_bytes):
            units.append(current)
            current, size = [], 0
        if large:
            units.extend([[part] for part in reading.plan_slices(path, pack_bytes) or [path]])
            continue
        current.append(path)
        size += n
    if current:
        units.append(current)
    return units


def input_path(item: Input) -> str:
    return item.path if isinstance(item, reading.FileSlice) else item


PART_TAG = {"jsonl": "b", "parquet": "rg", "pdf": "p"}      # in a part's unit key: bytes, row groups, pages


def unit_key(items: list[Input]) -> str:
    """The name of a unit's outputs: the file's key (and its part), or the first file's key and
    the unit's size."""
    if len(items) == 1:
        item = items[0]
        if isinstance(item, reading.FileSlice):
            return f"{file_key(item.path)}-{PART_TAG[item.kind]}{item.start}"
        return file_key(item)
    digest = hashlib.sha1(b"\n".join(map(os.fsencode, items))).hexdigest()[:8]
    return f"{file_key(items[0])}-pack{len(items)}-{digest}"


def _prestart_html() -> None:
    """Launch the HTML child (`HtmlExtractor.prestart`) and, while it starts (its own process), import
    here what this process imports anyway later in the unit. On a fresh process's first unit that is
    ~0.7 s: pyarrow imports pandas (when installed) on its first conversion of Python rows, at the
    unit's first flush, and ftfy's tables at the first text repair. Paid there, both came after
    the child's last page (the flush) or stalled the pages sent ahead; here they overlap the
    child's own start-up (bench/RESULTS.md, "Issue 40, fifth pass"). Not in a thread: an import
    racing the reader's own (warcio's `six.moves` while pandas imports six) fails."""
    ex = _extractor()
    if ex.worker.alive():
        return
    ex.prestart()
    if "pandas" not in sys.modules:
        pa.array([None])           # pyarrow's pandas shim: imports pandas once, as Table.from_pylist would
        text_repair._triggers()


def extract_file(path: str, run_dir: str | Path, cfg: ExtractConfig,
                 removed_schema: pa.Schema | None = None) -> ExtractResult:
    """Extract one input file into kept shards, a removed shard and a quarantine file."""
    return extract_unit([path], run_dir, cfg, removed_schema)


def _input_sha(item: Input) -> str:
    if isinstance(item, reading.FileSlice):     # only the bytes the part reads
        return sha256_file(item.path, start=item.first_byte, end=item.last_byte)
    problem = reading.file_problem(item)   # a FIFO or dangling link is never opened, not even to hash it
    if problem:
        return sha256_json({"not_read": problem})
    try:
        return sha256_file(item) if "://" not in item else _remote_fingerprint(item)
    except OSError as e:   # unreadable (EACCES, EIO): the reader quarantines it with the reason; the unit goes on
        return sha256_json({"not_read": f"{type(e).__name__}: {e.strerror or e}"})


def _input_label(item: Input) -> str:
    return f"{item.path} [{item.describe()}]" if isinstance(item, reading.FileSlice) else item


def _unit_identity(items: list[Input], cfg: ExtractConfig) -> tuple[str, list[str], str]:
    """(unit key, each input's content hash, fingerprint) of a work unit."""
    shas = [_input_sha(p) for p in items]
    # pack_mb decides which files (or parts) form a unit, already named by `inputs`
    fp = sha256_json({"stage": STAGE, "inputs": [[_input_label(p), sha] for p, sha in zip(items, shas)], "code": code_version(),
                      "config": cfg.model_dump(mode="json", exclude={"pack_mb"})})
    return unit_key(items), shas, fp


def _partitioned(items: list[Input]) -> reading.Format | None:
    """The format whose long-document part `items` is (a long PDF's page range), or None."""
    fmt = reading.format_of(input_path(items[0]))
    return fmt if fmt is not None and fmt.pages is not None and fmt.pages.is_part(items) else None


def read_part(items: list[Input], run_dir: str | Path, cfg: ExtractConfig) -> PhaseResult:
    """One part of a long document (a long PDF's page range), read as its format's partition: a
    `PhaseResult` its document's unit combines (`run_extract`), kept as its done-marker."""
    pages = _partitioned(items).pages
    key, _, fp = _unit_identity(items, cfg)
    return pages.read(items[0], RunContext(str(run_dir)).layout(STAGE), key, fp, getattr(cfg, pages.config))


def extract_work(items: list[Input], run_dir: str | Path, cfg: ExtractConfig,
                 removed_schema: pa.Schema | None = None) -> ExtractResult | PhaseResult:
    """What one task of stage extract runs: a work unit (`extract_unit`), or a part of a long
    document (`read_part`), as a global stage's tasks run shards and plan partitions."""
    if _partitioned(items) is not None:
        return read_part(items, run_dir, cfg)
    return extract_unit(items, run_dir, cfg, removed_schema)


def extract_unit(items: list[Input], run_dir: str | Path, cfg: ExtractConfig, removed_schema: pa.Schema | None = None,
                 parts: list[PhaseResult] | None = None) -> ExtractResult:
    """Extract a work unit (input files, or one part of a large file, read in order) into kept
    shards, a removed shard and a quarantine file, with each file's own account; removed rows in
    `removed_schema` (the run's; None: extract's own). `parts`: the unit is one long document read
    in parts (`read_part`), combined here by its format instead of read from the file."""
    if any(reading.reader_kind(input_path(p)) == "warc" for p in items):
        _prestart_html()        # before hashing the inputs: the child starts meanwhile
    run = RunContext(str(run_dir), removed_schema=removed_schema)
    layout = run.layout(STAGE)
    key, shas, fp = _unit_identity(items, cfg)
    marker = layout.markers / f"{key}.json"
    if (done := load_done(marker, fp, ExtractResult)) is not None:
        return done

    t0 = time.perf_counter()
    notes = UnitNotes()
    if parts is not None:
        pages = reading.format_of(input_path(items[0])).pages
        notes.combine = lambda source, block: pages.combine(parts, block, source)
    quarantine_rows: list[dict] = []
    repaired: dict[str, int] = {}     # documents whose text fix_unicode changed, by kind
    skipped: dict[str, int] = {}
    files: list[FileAccount] = []
    out = UnitTally(layout, key, cfg.batch_rows, int(cfg.shard_mb * 1e6), run.removed_rows_schema())
    try:
        for unit_item, sha in zip(items, shas):
            files.append(_extract_file(unit_item, sha, cfg, notes, out, quarantine_rows, repaired))
            merge_counts(skipped, files[-1].skipped_records)
        removed = out.close()
        quarantine = write_quarantine(run.quarantine / f"{key}.parquet", quarantine_rows) if quarantine_rows else None
    except BaseException:
        out.abort()
        if _extractor().pending:      # pages sent ahead and never taken: their answers must not reach the next unit
            _extractor().stop()
        raise

    pdf_stats = notes.pdf_stats
    pdf_stats.update({"removed_page_rows": out.removed_page_rows} if pdf_stats else {})
    out.stats = {"skipped_records": skipped, "unicode_repaired": repaired, "html_extractor": notes.html_paths,
                 **({"pdf": pdf_stats} if pdf_stats else {}),
                 "edits": {{"mojibake": "mojibake repaired", "nfc": "NFC normalised"}[k]: n for k, n in repaired.items()}}
    out.seconds = time.perf_counter() - t0
    result = ExtractResult(
        stage=STAGE, shard=key, source=input_path(items[0]), fingerprint=fp,
        input_sha256=shas[0] if len(items) == 1 else sha256_json(shas), files=files,
        records_read=out.n_in + len(quarantine_rows), removed_docs=removed.rows - out.removed_page_rows,
        removed_page_rows=out.removed_page_rows, quarantined=len(quarantine_rows),
        quarantine_by_reason=reason_counts(quarantine_rows), skipped_records=skipped,
        kept_shards=out.kept_shards, removed=removed, quarantine=quarantine, **out.counted())
    if out.n_in != out.n_kept + result.removed_docs or sum(s.rows for s in out.kept_shards) != out.n_kept:
        raise AssertionError(f"extract/{key}: {out.n_in} documents != kept {out.n_kept} + removed {result.removed_docs}")
    write_json_atomic(marker, result.model_dump(mode="json", exclude={"skipped"}))
    return result


def _extract_file(unit_item: Input, sha: str, cfg: ExtractConfig, notes: UnitNotes, out: UnitTally,
                  quarantine_rows: list[dict], repaired: dict[str, int]) -> FileAccount:
    """One input file (or part) of a unit: its records decided and added to `out`, its unreadable
    ones to `quarantine_rows`; its own account."""
    path, part = input_path(unit_item), (unit_item if isinstance(unit_item, reading.FileSlice) else None)
    limits = reading.ReadLimits(max_record_bytes=cfg.max_record_bytes, max_header_bytes=cfg.max_header_bytes,
                                max_expansion=cfg.max_expansion, max_file_seconds=cfg.max_file_seconds)
    stats = reading.ReadStats()
    docs0, kept0, q0 = out.n_in, out.n_kept, len(quarantine_rows)
    for item in html_sent_ahead(reading.read(path, stats, limits, part), cfg):
        if isinstance(item, reading.Quarantined):
            quarantine_rows.append({"source": item.source, "record": item.record, "id": item.id,
                                    "reason": item.reason, "snippet": item.snippet})
            continue
        notes.lost_pages = []
        try:
            text, reason = decide(item, cfg, notes)
        except pdf_ranges.FileChanged as e:     # a long PDF replaced while read: not this run's to join
            quarantine_rows.append({"source": item.source, "record": item.offset, "id": item.id, "reason": str(e), "snippet": ""})
            continue
        if reason is None and cfg.fix_unicode:
            text, repair = text_repair.repair_unicode(text)
            if repair:
                repaired[repair] = repaired.get(repair, 0) + 1
        row = _row(item, text)
        nbytes = len(row["text"].encode())
        if reason in TOO_LARGE_REASONS:
            nbytes = item.size or nbytes if reason != "extract:html_too_large" else len(item.payload)
            row["text"] = row["text"][:TOO_LARGE_CHARS]
        out.add(row, reason, nbytes)
        for first, last, why, detail in notes.lost_pages:     # a PDF's dropped pages: rows, not documents
            out.add_page(page_row(row, first, last, why, detail))
    mine = quarantine_rows[q0:]
    return FileAccount(source=reading.source_name(path), part=part.describe() if part else None, input_sha256=sha,
                       records_read=out.n_in - docs0 + len(mine),
                       documents=out.n_in - docs0, kept=out.n_kept - kept0, quarantined=len(mine),
                       quarantine_by_reason=reason_counts(mine), skipped_records=stats.skipped)


def plan_work(unit: list[Input], cfg: ExtractConfig) -> list[list[Input]]:
    """The work units `unit` is read in: itself, or when it is one long document, its parts (its
    format's page planner: a long PDF's page ranges)."""
    fmt = reading.format_of(input_path(unit[0])) if len(unit) == 1 and isinstance(unit[0], str) else None
    if fmt is None or fmt.pages is None:
        return [unit]
    return fmt.pages.plan(unit, getattr(cfg, fmt.pages.config))


def run_extract(units: list[list[Input]], run: RunContext, cfg: ExtractConfig, map_units: Callable | None = None,
                progress: Progress = NO_PROGRESS) -> tuple[list[ExtractResult], dict]:
    """Extract over its work units as the driver runs a stage: `progress.start`, every unit
    (`map_units(work, run, cfg, on_result)`: the curate flow's one task per unit; by default here,
    in order) with `progress.shard_done` as each is done, then the stage report: summed, checked,
    `progress.finish` and written (`extract/report.json`). Returns the units' results and the report.
    A long document's unit is read as its parts (`plan_work`: partitions, mapped with the other
    units, `extract_work`), and its one document is then made here from their results, in the
    unit's place (`extract_unit` with `parts`: its format's combine; cheap, layout only)."""
    plan = [plan_work(unit, cfg) for unit in units]
    work = [w for p in plan for w in p]
    progress.start([STAGE], len(units))

    def shown(result: ExtractResult | PhaseResult) -> None:     # a part is no shard: its unit is shown once combined
        if isinstance(result, ExtractResult):
            progress.shard_done(result)
    done = iter((map_units or extract_units)(work, run, cfg, shown))
    results = []
    for unit, p in zip(units, plan):
        got = [next(done) for _ in p]
        if len(p) > 1:      # a long document: its parts combined into the unit's one document
            joined = extract_unit(unit, run.run_dir, cfg, run.removed_schema, parts=got)
            got = [joined.model_copy(update={"seconds": joined.seconds + sum(part.seconds for part in got)})]
            progress.shard_done(got[0])
        results.extend(got)
    report = aggregate_extract(results)
    progress.finish(STAGE, report)
    write_report(run.run_dir, STAGE, report)
    return results, report


def extract_units(units: list[list[Input]], run: RunContext, cfg: ExtractConfig,
                  on_result: Callable[[ExtractResult | PhaseResult], object]) -> list[ExtractResult | PhaseResult]:
    """Every unit (`extract_work`), one after another in this process."""
    results = []
    for unit in units:
        results.append(extract_work(unit, run.run_dir, cfg, run.removed_schema))
        on_result(results[-1])
    return results


def _remote_fingerprint(path: str) -> str:
    import fsspec
    fs, _, (p,) = fsspec.get_fs_token_paths(path)
    info = fs.info(p)
    return sha256_json({k: info.get(k) for k in ("size", "mtime", "ETag", "etag", "md5", "LastModified")})
