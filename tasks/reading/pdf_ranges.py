"""The pdf format's partitions: a very long PDF read as several work units of
`extract.pdf.pages_per_unit` pages, combined into one document, as a global stage's plan is
partitioned and combined under the stage contract (quipu.tasks.stage: `plan_partitions`,
`plan_partition` with a kept `PhaseResult`, `combine`). The format table (quipu.tasks.reading.formats)
names the three functions: `plan_unit` (partition), `read_range` (a partition's result, kept as a
done-marker by `driver.kept_phase`), `join_ranges` (combine: what the pdf extractor reads instead of
the file).

Planning (`plan_unit`): a local PDF of at least `pages_per_unit` x `MIN_BYTES_PER_PAGE` bytes has
its page count asked of the PDF child process (`pdf.page_count`: under the reader's memory limit
and a time limit, so a hostile file costs the planner at most `page_timeout_s` and is then read
whole); with more pages than `pages_per_unit` (up to `max_pages`) it becomes units of one page range
each (`FileSlice`, kind "pdf": pages [start, end) of `before`). Smaller files are never
opened to plan: a PDF of fewer bytes than that is text-layer pages, which read at hundreds of
pages/s; the pages that make a PDF long to read (scans for OCR) carry images, so bytes. A PDF that
pdfium cannot open as it is (encrypted, truncated), a remote one, or one under the limit is one
unit, as before.

Reading (`read_range`): a range unit reads its pages as `pdf.read_pages` reads a whole PDF (same
child process, limits, drops) and writes their raw results (each page's positioned lines, status,
OCR words and confidence) to `extract/_pdf_pages/<unit key>.json` (a work folder: deleted when the run completes, unless
`keep_work_files`); it makes no document.

Joining (`join_ranges`): once every range is read, the PDF's unit is extracted as an unsplit one
would be, with its pages taken from the parts instead of the child: `pdf.document` lays out ALL the
pages together, so running headers, footers and page numbers are found across the whole document,
paragraphs and hyphenated words run on across range boundaries, and the text, metadata, page counts,
OCR confidence and dropped-page rows are those of the unsplit document, byte for byte. The time
budget is the document's (CPU seconds of the PDF child): each range reads under its share of
`doc_timeout_s` (by page count), and the join lays out under what the ranges left of it (at least
`page_timeout_s`), in the child process as an unsplit read does. What is per range, not per
document: the OCR language a document's first OCR'd page teaches the next pages (each range learns
it again; with one `ocr_languages` entry, or born-digital pages, nothing differs).

A PDF that changed between planning and joining (another file under its name, pages added or cut:
its ranges' bytes differ from each other or from the file's, or pages are in no range) cannot be
joined: `FileChanged`, which extract quarantines with its reason; the run goes on.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from quipu.catalog.files import sha256_file, write_bytes_atomic
from quipu.tasks.driver import kept_phase
from quipu.tasks.reading import pdf
from quipu.tasks.reading.files import FileSlice, file_problem, file_size, local_path, source_name
from quipu.tasks.reading.pdf import PDF_SUFFIXES, PdfConfig, PdfRead
from quipu.tasks.stage import PhaseResult, Shard, StageLayout

class FileChanged(Exception):
    """A PDF whose page ranges were read from different versions of the file."""


MIN_BYTES_PER_PAGE = 1024       # a PDF smaller than pages_per_unit pages of this many bytes is read whole
PARTS_DIR = "_pdf_pages"


def plan_unit(unit: list, cfg: PdfConfig) -> list[list]:
    """The work units `unit` is read in: itself, or when it is one long local PDF, its page
    ranges (see the module docstring)."""
    if cfg.pages_per_unit == 0 or len(unit) != 1 or not isinstance(unit[0], str):
        return [unit]
    path = unit[0]
    local = local_path(path)
    if local is None or not path.lower().endswith(PDF_SUFFIXES) or file_problem(path):
        return [unit]
    size = file_size(path)
    if size is None or size < cfg.pages_per_unit * MIN_BYTES_PER_PAGE:
        return [unit]
    pages = pdf.page_count(local, cfg)
    if pages is None or min(pages, cfg.max_pages) <= cfg.pages_per_unit:
        return [unit]
    stop = min(pages, cfg.max_pages)
    return [[FileSlice(path, "pdf", a, min(a + cfg.pages_per_unit, stop), pages, 0, size)]
            for a in range(0, stop, cfg.pages_per_unit)]


def is_range(items: list) -> bool:
    return len(items) == 1 and isinstance(items[0], FileSlice) and items[0].kind == "pdf"


class PdfPagesPart(PhaseResult):
    """A range's outcome, the partition's result: its pages' raw results (`pages`), not yet a
    document (the PDF's unit makes it: `join_ranges`); kept as its done-marker
    (`extract/_shards/<unit key>.json`)."""
    shard: str                  # the range unit's key
    source: str
    first_page: int             # from 1
    last_page: int
    input_sha256: str = ""      # the whole file's when the range was read ("": not known)
    cpu_seconds: float = 0.0    # what the PDF child spent reading it: of the document's budget
    pages: Shard                # the JSON file of the pages' results (rows: pages in it)

    def outputs(self) -> list[Shard]:
        return [self.pages]


def read_range(part: FileSlice, layout: StageLayout, key: str, fp: str, cfg: PdfConfig) -> PdfPagesPart:
    """Read one range unit's pages into `extract/_pdf_pages/<key>.json` (reused when done)."""
    return kept_phase(layout.markers / f"{key}.json", fp, PdfPagesPart, lambda: _read_range(part, layout, key, cfg))


def _read_range(part: FileSlice, layout: StageLayout, key: str, cfg: PdfConfig) -> PdfPagesPart:
    t0 = time.perf_counter()
    local = local_path(part.path)
    share = (part.end - part.start) / max(1, min(part.before, cfg.max_pages))   # of the document's budget
    spent = pdf.reader_cpu(cfg)
    info, results, error = pdf.read_pages(local, cfg, part.start, part.end, budget_s=cfg.doc_timeout_s * share)
    spent = pdf.reader_cpu(cfg) - spent
    path = layout.scratch(PARTS_DIR) / f"{key}.json"    # a work folder: deleted when the run completes
    body = {"first": part.start, "end": part.end, "info": info, "error": error,
            "results": [[i, results[i]] for i in sorted(results)]}
    write_bytes_atomic(path, json.dumps(body, separators=(",", ":")).encode())
    return PdfPagesPart(shard=key, source=source_name(part.path), first_page=part.start + 1,
                        last_page=part.end, seconds=time.perf_counter() - t0, input_sha256=_file_sha(local), cpu_seconds=spent,
                        pages=Shard(name=key, path=str(path), sha256=sha256_file(path), rows=len(results),
                                    bytes=path.stat().st_size))


def _file_sha(path: str) -> str:
    try:
        return sha256_file(path)
    except OSError:
        return ""


def join_ranges(parts: list[PdfPagesPart], cfg: PdfConfig, source: str | None = None) -> PdfRead:
    """The one document of a PDF read in ranges, from its parts in page order, as `pdf.read_pdf`
    makes it from the whole file. A range whose reader could not open the file drops its pages
    (`pdf:page_error`, with the reason); when none could, the document is unread, as unsplit.
    Raises `FileChanged` when the ranges were read from different versions of the file or from
    another than `source` (a local path) is now."""
    shas = {p.input_sha256 for p in parts} | ({_file_sha(source)} if isinstance(source, str) else set())
    if len(shas - {""}) > 1:
        raise FileChanged(f"pdf changed while read: {parts[0].source} changed while its page ranges were read")
    info, results, errors = None, {}, []
    for part in sorted(parts, key=lambda p: p.first_page):
        body = json.loads(Path(part.pages.path).read_text())
        if body["info"] is None:
            errors.append(tuple(body["error"]))
            results.update({i: {"status": "dropped", "reason": "pdf:page_error", "detail": " ".join(body["error"])[:200]}
                            for i in range(body["first"], body["end"])})
            continue
        info = info or body["info"]
        results.update({i: r for i, r in body["results"]})
    if info is None:
        return pdf.unread(*errors[0])
    missing = set(range(min(info["pages"], cfg.max_pages))) - set(results)
    if missing or len({p.last_page for p in parts}) != len(parts):
        raise FileChanged(f"pdf changed while read: {parts[0].source} has pages {sorted(missing)[:5]} in no range read "
                          "(it changed after its ranges were planned)")
    left = cfg.doc_timeout_s - sum(p.cpu_seconds for p in parts)     # CPU, as the budget counts
    return pdf.lay_out(info, results, cfg, left)
