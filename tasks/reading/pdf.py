"""PDF documents for stage `extract`: born-digital text with pdfium, scanned pages with Tesseract.

One PDF is one document. Each page is read in a child process (`child_worker.ChildWorker`) under a
memory limit (`max_memory_mb`, RLIMIT_AS) and a time limit per page (`page_timeout_s`, CPU seconds of
the child and its Tesseract, so that what is kept does not depend on the machine's load; a child
that uses no CPU and never answers is ended by `child_worker.wall_backstop`): pdfium is
native code, and a hostile PDF (recursive object streams, a decompression bomb, a page that makes
the parser loop) must cost at most its page, never the run. A page that times out or kills the
child is counted (`pdf:page_timeout`, `pdf:page_error`) and reading goes on with the next page in a
fresh child.

Per page:
- its text layer is read with pypdfium2 as positioned lines (pdfium's own line breaks, a box from the
  first and last character of each; a line that spans a wide gap is split at it);
- a page whose text layer is unusable — none, garbage (mostly non-letters, or unmapped glyphs), or
  words in no language we know (`text_layer_problem`) — is rendered with pypdfium2 and read by
  Tesseract when `ocr` is `auto` (`always`: every page), else dropped as `pdf:needs_ocr`. A page
  with neither text nor any object on it is empty, not dropped;
- Tesseract runs as a subprocess (`tesseract stdin stdout ... tsv`): its TSV gives each word's box
  and confidence, so OCR lines go through the same layout as text-layer lines, and the document
  carries its mean word confidence. We call the binary rather than pytesseract, which wraps the
  same binary through temporary files and adds nothing we need; a missing binary is one warning
  line, and its pages are dropped as `pdf:ocr_unavailable`.

The document's text is then made by `pdf_layout.document_text` (reading order, running headers
and page numbers removed, paragraphs, de-hyphenation). A document that gives no text is removed
with the reason its pages were dropped for (or `pdf:encrypted`, `pdf:unreadable`, `pdf:no_text`).
Every page dropped, from a kept document or a removed one, is listed (`PdfRead.lost_pages`):
extract writes a row for it to extract/removed, beside the documents.
"""
from __future__ import annotations

import io
import logging
import math
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from quipu.tasks.child_worker import ChildWorker, die_with_parent, run_limited
from quipu.tasks.languages import by_tesseract
from quipu.tasks.reading.pdf_layout import Line, Page, document_text

log = logging.getLogger(__name__)

PDF_SUFFIXES = (".pdf",)
PDF_MIMES = ("application/pdf", "application/x-pdf", "application/acrobat", "applications/vnd.pdf", "text/pdf")


class PdfConfig(BaseModel):
    """`extract.pdf`: how PDF documents are read."""
    model_config = ConfigDict(extra="forbid", validate_default=True)
    ocr: Literal["auto", "never", "always"] = Field(
        "auto", description="auto: OCR pages without a usable text layer; never: drop them (pdf:needs_ocr); always: OCR every page")
    ocr_languages: list[str] = Field(["spa", "por", "eng"], min_length=1,
                                     description="Tesseract language codes, tried together (spa+por+eng)")
    ocr_dpi: int = Field(300, ge=72, le=600, description="resolution pages are rendered at for OCR")
    max_ocr_megapixels: float = Field(40.0, gt=0, description="a page rendered for OCR is scaled down to at most this many pixels (a huge page is no memory bomb)")
    page_timeout_s: float = Field(60.0, gt=0, le=3600, description="one page (text layer or OCR) costing the reader process and its Tesseract more CPU seconds than this is dropped (pdf:page_timeout); CPU, not wall clock, so that what is kept does not depend on the machine's load (wall clock where there is no /proc, not Linux); a reader that uses no CPU and does not answer (a deadlock) is ended after 20x this (at least 120 s more) of wall clock")
    doc_timeout_s: float = Field(1800.0, gt=0, le=86400, description="the document's budget of CPU seconds (as page_timeout_s): pages still unread once the reader has spent this much on the document are dropped (pdf:time_budget), layout then gets what is left (at least page_timeout_s); a long PDF read in page ranges shares it among them by page count")
    max_pages: int = Field(2000, gt=0, description="pages after this many are not read (pdf:over_max_pages)")
    pages_per_unit: int = Field(200, ge=0, description="a local PDF with more pages is read as work units of this many pages each, joined into one document (quipu.tasks.reading.pdf_ranges); 0: never split")
    max_memory_mb: int = Field(2048, ge=256, description="address-space limit of the process that parses PDFs (a page exceeding it is pdf:page_error)")
    min_page_chars: int = Field(20, ge=1, description="a text layer with fewer non-space characters counts as none")
    min_letter_ratio: float = Field(0.5, ge=0, le=1, description="a text layer with a smaller share of letters and digits among its non-space characters is garbage")


# ---- is a text layer usable? ------------------------------------------------------------------

_WORD = re.compile(r"[^\W\d_]+")
_SPACE = re.compile(r"[\s\x02\xad\ufffe]+")
_NOT_ALNUM = re.compile(r"[\W_]+")
_ODD = re.compile(r"[\ufffd\ue000-\uf8ff\x00-\x1f]")
_UNPRONOUNCEABLE = re.compile(r"[bcdfghjklmnpqrstvwxz]{5,}|^[^aeiouyáéíóúâêôãõàü]+$", re.I)


@lru_cache(maxsize=16)
def _function_words(ocr_languages: tuple[str, ...]) -> frozenset[str]:
    """The commonest words of the OCR languages (Tesseract codes; the language table's entries)."""
    entries = (by_tesseract(code) for code in ocr_languages)
    return frozenset(w for entry in entries if entry is not None for w in entry.ocr_function_words.split())


def text_layer_problem(text: str, cfg: PdfConfig) -> str | None:
    """Why a page's text layer cannot be used: 'none', 'garbage', 'language'; None when it can."""
    chars = _SPACE.sub("", text)
    if len(chars) < cfg.min_page_chars:
        return "none"
    alnum = len(_NOT_ALNUM.sub("", chars))       # digits count: a page of figures is a table, not garbage
    odd = len(_ODD.findall(chars))
    if alnum < cfg.min_letter_ratio * len(chars) or odd > 0.1 * len(chars):
        return "garbage"
    known = _function_words(tuple(cfg.ocr_languages))
    words = [w.lower() for w in _WORD.findall(text)]
    if known and len(words) >= 30 and sum(w in known for w in words) < 0.02 * len(words):
        odd_words = sum(bool(_UNPRONOUNCEABLE.search(w)) for w in words if len(w) > 1) / len(words)
        if odd_words > 0.3:   # words, but in no language of ours: a font without its mapping
            return "language"
    return None


# ---- the child process: pdfium and Tesseract --------------------------------------------------

def _serve(conn, max_memory_mb: int) -> None:   # runs in the child
    import pypdfium2  # noqa: F401  (imported before the memory limit: its library is mapped once)
    _limit_memory(max_memory_mb)
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg[0] == "count":       # the planner asks how many pages a long PDF has
            conn.send(_page_count(msg[1]))
            continue
        if msg[0] == "layout":      # the pages read: to one document, under this process's limits
            conn.send(_lay_out(*msg[1:]))
            continue
        _, source, start, cfg = msg
        _read_pages(conn, source, start, cfg)


def _page_count(source: bytes | str) -> tuple:
    import pypdfium2 as pdfium
    try:
        doc = pdfium.PdfDocument(source)
    except (pdfium.PdfiumError, MemoryError) as e:   # encrypted, damaged: read whole, as any PDF
        return ("error", str(e)[:200])
    try:
        return ("count", len(doc))
    finally:
        doc.close()


def _lay_out(info: dict, results: dict[int, dict], cfg: dict) -> tuple:
    try:
        return ("document", document(info, results, PdfConfig.model_validate(cfg)))
    except MemoryError:
        return ("error", "out of memory laying out the pages")
    except Exception as e:  # a layout bug on one document costs that document
        return ("error", f"{type(e).__name__}: {e}"[:200])


def ocr_language(text: str, languages: list[str]) -> str | None:
    """The one configured language whose commonest words clearly dominate `text`, or None."""
    words = [w.lower() for w in _WORD.findall(text)]
    hits = sorted(((sum(w in _function_words((lang,)) for w in words), lang) for lang in languages), reverse=True)
    if not hits or hits[0][0] < 5 or (len(hits) > 1 and hits[0][0] < 1.4 * hits[1][0]):
        return None
    return hits[0][1]


def _limit_memory(mb: int) -> None:
    try:
        import resource
        limit = mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):   # not on this platform: the time limits still hold
        pass


def _read_pages(conn, source: bytes | str, start: int, cfg: dict) -> None:
    import pypdfium2 as pdfium
    repaired = False
    try:
        doc = pdfium.PdfDocument(source)
    except pdfium.PdfiumError as e:
        encrypted = "password" in str(e).lower()
        fixed = None if encrypted else with_trailer(source)
        try:
            doc = pdfium.PdfDocument(fixed) if fixed else None
            repaired = doc is not None
        except (pdfium.PdfiumError, MemoryError):
            doc = None
        if doc is None:
            conn.send(("error", "pdf:encrypted" if encrypted else "pdf:unreadable", str(e)[:200]))
            return
    except MemoryError:
        conn.send(("error", "pdf:unreadable", "out of memory opening the document"))
        return
    cfg = {**cfg, "repaired": repaired, "config": PdfConfig.model_validate(cfg["pdf"])}
    try:
        meta = {}
        try:
            meta = doc.get_metadata_dict(skip_empty=True)
        except Exception:  # a broken info dictionary is no reason to lose the text
            pass
        conn.send(("info", {"pages": len(doc), "producer": meta.get("Producer"), "title": meta.get("Title"),
                            "repaired": repaired}))
        state: dict = {}      # what one page teaches the next: the language OCR reads best in
        batch: list[tuple[int, dict]] = []
        sent = time.monotonic()
        for i in range(start, min(len(doc), cfg["max_pages"])):
            t0 = time.perf_counter()
            try:
                result = _read_page(doc, i, cfg, state)
            except MemoryError:
                result = {"status": "dropped", "reason": "pdf:page_error", "detail": "out of memory"}
            except Exception as e:  # pdfium refuses the page: that page is lost, not the rest
                result = {"status": "dropped", "reason": "pdf:page_error", "detail": f"{type(e).__name__}: {e}"[:200]}
            result["seconds"] = time.perf_counter() - t0
            batch.append((i, result))
            # fast pages go back in batches (one hand-over between the processes per BATCH_S, not
            # per page); `batch` off: page by page, to find the page that hung or crashed
            if not cfg["batch"] or time.monotonic() - sent >= BATCH_S:
                conn.send(("pages", batch))
                batch, sent = [], time.monotonic()
        conn.send(("pages", batch, "done"))
    finally:
        doc.close()


BATCH_S = 0.05
MAX_PAGE_LINES = 5000       # a dense page of small print has ~150 lines, a table ~1,000
_CATALOG = re.compile(rb"(\d+)\s+(\d+)\s+obj\s*<<(?:(?!endobj).){0,4000}?/Type\s*/Catalog", re.S)
MAX_REPAIR_BYTES = 256 << 20


def with_trailer(source: bytes | str) -> bytes | None:
    """A truncated PDF (its cross-reference table and trailer cut off, the commonest damage of a
    failed download) with a trailer that names its catalog appended, so that pdfium rebuilds the
    cross-references by scanning the objects and reads the pages whose objects survived. None when
    no catalog object is found."""
    if isinstance(source, str):
        try:
            if os.path.getsize(source) > MAX_REPAIR_BYTES:
                return None
            with open(source, "rb") as fh:
                source = fh.read()
        except OSError:
            return None
    cat = _CATALOG.search(source)
    if cat is None:
        return None
    end = source.rfind(b"endobj")
    xref = source.rfind(b"xref", end if end >= 0 else 0)
    body = source[:xref] if xref > 0 else source
    return body + b"\ntrailer\n<< /Root %s %s R >>\n%%%%EOF\n" % (cat.group(1), cat.group(2))


def _read_page(doc, i: int, cfg: dict, state: dict) -> dict:
    import pypdfium2.raw as raw
    page = doc[i]
    try:
        width, height = page.get_size()
        textpage = page.get_textpage()
        try:
            lines = text_lines(textpage, width, height, page.get_rotation())
        finally:
            textpage.close()
        text = " ".join(l.text for l in lines)
        pcfg = cfg["config"]
        problem = text_layer_problem(text, pcfg)
        if problem is None and _mostly_picture(page, width, height, len(text)):
            problem = "none"     # a scan with a few words of text layer (a stamp, a digital header)
        base = {"width": width, "height": height}
        if len(lines) > MAX_PAGE_LINES:    # no page of prose or tables: its layout would cost the run
            return {**base, "status": "dropped", "reason": "pdf:page_too_dense",
                    "detail": f"{len(lines)} text lines (at most {MAX_PAGE_LINES} are laid out)"}
        if problem is None and pcfg.ocr != "always":
            return {**base, "status": "text", "lines": [_pack(l) for l in lines]}
        if problem == "none" and not text.strip() and raw.FPDFPage_CountObjects(page.raw) == 0:
            if cfg["repaired"]:     # a page of a cut file whose content did not survive
                return {**base, "status": "dropped", "reason": "pdf:page_damaged", "detail": "no content left"}
            return {**base, "status": "empty", "lines": []}
        if pcfg.ocr == "never":
            return {**base, "status": "dropped", "reason": "pdf:needs_ocr", "detail": f"text layer: {problem}"}
        if not cfg["tesseract"]:
            return {**base, "status": "dropped", "reason": "pdf:ocr_unavailable", "detail": "tesseract not installed"}
        try:
            ocr_lines, words, conf = _ocr_in_language(page, width, height, pcfg, cfg, state)
        except (subprocess.SubprocessError, OSError) as e:
            return {**base, "status": "dropped", "reason": "pdf:ocr_failed", "detail": f"{type(e).__name__}: {e}"[:200]}
        return {**base, "status": "ocr", "lines": [_pack(l) for l in ocr_lines], "words": words, "confidence": conf}
    finally:
        page.close()


def _ocr_in_language(page, width: float, height: float, pcfg: PdfConfig, cfg: dict, state: dict):
    """OCR with every configured language until a page shows which one the document is in; from
    then on with that one alone: faster, and no Spanish 'á' read where Portuguese has 'ã' (the page
    that told is read again when its language was not the first one tried)."""
    languages = [state["language"]] if state.get("language") else cfg["languages"]
    result = ocr_page(page, width, height, pcfg, cfg["tesseract"], languages)
    if "language" not in state and len(languages) > 1:
        lang = ocr_language(" ".join(l.text for l in result[0]), languages)
        if lang is not None:
            state["language"] = lang
            if lang != languages[0]:
                result = ocr_page(page, width, height, pcfg, cfg["tesseract"], [lang])
    return result


def _pack(line: Line) -> tuple:
    return (line.x0, line.x1, line.top, line.bottom, line.text)


def _mostly_picture(page, width: float, height: float, chars: int) -> bool:
    """A page with little text whose pictures cover most of it."""
    if chars >= 400:
        return False
    import ctypes

    import pypdfium2.raw as raw
    covered = 0.0
    l, b, r, t = (ctypes.c_float() for _ in range(4))
    for k in range(min(raw.FPDFPage_CountObjects(page.raw), 200)):
        obj = raw.FPDFPage_GetObject(page.raw, k)
        if raw.FPDFPageObj_GetType(obj) not in (raw.FPDF_PAGEOBJ_IMAGE, raw.FPDF_PAGEOBJ_FORM):
            continue
        if raw.FPDFPageObj_GetBounds(obj, *(ctypes.byref(v) for v in (l, b, r, t))):
            covered += max(0.0, min(r.value, width) - max(l.value, 0)) * max(0.0, min(t.value, height) - max(b.value, 0))
    return covered > 0.5 * width * height


_LINE = re.compile(r"[^\r\n]+")


def text_lines(textpage, width: float, height: float, rotation: int = 0) -> list[Line]:
    """The text layer as positioned lines, in the page's displayed orientation (`width` x `height`
    as shown, `rotation` its /Rotate): pdfium's lines, each boxed by its first and last character
    (two native calls a line, not one a character); a line much wider than its characters (pieces of
    a row far apart, a table's cells) or that runs onto another row is split where it jumps."""
    import ctypes

    import pypdfium2.raw as raw
    n = textpage.count_chars()
    if n <= 0:
        return []
    text = textpage.get_text_range(0, n)
    # pdfium may leave characters out of the text (or add some): then a text offset is mapped to
    # its character index for the boxes
    mapped = len(text) != n
    rect = raw.FS_RECTF()
    ref = ctypes.byref(rect)
    tp = textpage.raw

    # pdfium's boxes are in unrotated user space (y up): to (x0, x1, top, bottom) as displayed
    w0, h0 = (height, width) if rotation in (90, 270) else (width, height)
    turn = {0: lambda l, r, b, t: (l, r, h0 - t, h0 - b), 90: lambda l, r, b, t: (b, t, l, r),
            180: lambda l, r, b, t: (w0 - r, w0 - l, b, t), 270: lambda l, r, b, t: (h0 - t, h0 - b, w0 - r, w0 - l)}
    shown = turn.get(rotation, turn[0])

    def box(i: int) -> tuple[float, float, float, float] | None:
        if mapped:
            i = raw.FPDFText_GetCharIndexFromTextIndex(tp, i)
        if i < 0 or not raw.FPDFText_GetLooseCharBox(tp, i, ref):
            return None
        return shown(rect.left, rect.right, rect.bottom, rect.top)

    out: list[Line] = []
    for m in _LINE.finditer(text):
        a, b = m.start(), m.end() - 1
        while a <= b and (text[a].isspace() or text[a] in GENERATED):
            a += 1
        while b >= a and (text[b].isspace() or text[b] in GENERATED):
            b -= 1
        if a > b:
            continue
        first, last = box(a), box(b)
        if first is None or last is None:
            out.extend(_split_line(text, a, b, m.end() - 1, box))
            continue
        top, bottom = min(first[2], last[2]), max(first[3], last[3])
        size = max(first[3] - first[2], last[3] - last[2])
        one_row = max(first[2], last[2]) < min(first[3], last[3])
        if not one_row or max(first[1], last[1]) - first[0] > 1.2 * (b - a + 1) * 0.6 * size + 3 * size:
            out.extend(_split_line(text, a, b, m.end() - 1, box))
        else:
            out.append(Line(first[0], max(first[1], last[1]), top, bottom, text[a:m.end()].rstrip()))
    return out


GENERATED = "\x02\ufffe\xad"


_WORD_RUN = re.compile(r"[^\s\x02\ufffe\xad]+")


def _split_line(text: str, a: int, b: int, end: int, box) -> list[Line]:
    """One pdfium "line" that is several: cut between words where the next word is far to the
    right, back to the left, or on another row (pdfium runs a line on past a hyphen, into the next
    column). Words are boxed by their first and last character."""
    pieces: list[list[tuple[int, tuple]]] = []
    cur: list[tuple[int, tuple]] = []
    for m in _WORD_RUN.finditer(text, a, b + 1):
        first, last = box(m.start()), box(m.end() - 1)
        if first is None or last is None:
            continue
        bx = (first[0], max(first[1], last[1]), min(first[2], last[2]), max(first[3], last[3]))
        if cur:
            p = cur[-1][1]
            size = max(p[3] - p[2], bx[3] - bx[2], 1.0)
            mid = (bx[2] + bx[3]) / 2
            if bx[0] - p[1] > max(2.0 * size, 6.0) or bx[0] < p[0] - size or not p[2] <= mid <= p[3]:
                pieces.append(cur)
                cur = []
        cur.append((m.start(), bx))
    if cur:
        pieces.append(cur)
    out = []
    for k, p in enumerate(pieces):
        i0 = p[0][0]
        i1 = (pieces[k + 1][0][0] - 1) if k + 1 < len(pieces) else end     # keeps a trailing hyphen
        out.append(Line(min(bx[0] for _, bx in p), max(bx[1] for _, bx in p), min(bx[2] for _, bx in p),
                        max(bx[3] for _, bx in p), " ".join(text[i0:i1 + 1].split())))
    return out


def ocr_page(page, width: float, height: float, cfg: PdfConfig, tesseract: str,
             languages: list[str]) -> tuple[list[Line], int, float | None]:
    """(lines, words, mean word confidence) of a page rendered and read by Tesseract."""
    scale = cfg.ocr_dpi / 72
    if width * height * scale * scale > cfg.max_ocr_megapixels * 1e6:
        scale = math.sqrt(cfg.max_ocr_megapixels * 1e6 / (width * height))
    image = page.render(scale=scale, grayscale=True).to_pil().convert("L")
    buf = io.BytesIO()
    image.save(buf, format="PPM")       # uncompressed: no time spent on PNG either side
    del image
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}   # one core per page: the workers parallelise
    # its CPU, not its wall clock, is limited (as the page's): OCR under load keeps the same pages
    proc = run_limited([tesseract, "stdin", "stdout", "-l", "+".join(languages), "--psm", "3",
                        "--dpi", str(round(72 * scale)), "tsv"], buf.getvalue(), 0.9 * cfg.page_timeout_s,
                       env=env, preexec_fn=die_with_parent)
    if proc.returncode != 0:
        raise subprocess.SubprocessError(f"tesseract exited {proc.returncode}: "
                                         f"{proc.stderr.decode('utf-8', 'replace').strip()[-200:]}")
    return parse_tsv(proc.stdout.decode("utf-8", "replace"), scale)


def parse_tsv(tsv: str, scale: float) -> tuple[list[Line], int, float | None]:
    """Tesseract's TSV as lines (pixels back to points), the word count and the character-weighted
    mean word confidence."""
    groups: dict[tuple, list[tuple]] = {}
    for row in tsv.splitlines()[1:]:
        f = row.split("\t")
        if len(f) < 12 or f[0] != "5" or not f[11].strip():
            continue
        try:
            left, top, w, h, conf = int(f[6]), int(f[7]), int(f[8]), int(f[9]), float(f[10])
        except ValueError:
            continue
        groups.setdefault((f[1], f[2], f[3], f[4]), []).append((left, top, left + w, top + h, conf, f[11].strip()))
    lines, words, weight, total = [], 0, 0, 0.0
    for ws in groups.values():
        text = " ".join(w[5] for w in ws)
        if not any(c.isalnum() for c in text):
            continue          # rules, specks and borders read as punctuation
        lines.append(Line(min(w[0] for w in ws) / scale, max(w[2] for w in ws) / scale,
                          min(w[1] for w in ws) / scale, max(w[3] for w in ws) / scale, text))
        for w in ws:
            if w[4] >= 0:
                words += 1
                weight += len(w[5])
                total += w[4] * len(w[5])
    return lines, words, (round(total / weight, 2) if weight else None)


# ---- the parent: one document --------------------------------------------------------------------

@lru_cache(maxsize=8)
def tesseract_setup(languages: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]]:
    """(the tesseract binary or None, the configured languages it has), warning once about what is
    missing."""
    exe = shutil.which("tesseract")
    if exe is None:
        log.warning("extract.pdf: tesseract not found: pages without a usable text layer are removed as "
                    "pdf:ocr_unavailable (install Debian's tesseract-ocr tesseract-ocr-spa tesseract-ocr-por "
                    "tesseract-ocr-eng, or `make install`)")
        return None, ()
    try:
        out = subprocess.run([exe, "--list-langs"], capture_output=True, timeout=30, check=False)
        have = set(out.stdout.decode("utf-8", "replace").split()[1:]) | set(out.stderr.decode("utf-8", "replace").split())
    except (subprocess.SubprocessError, OSError):
        have = set(languages)
    usable = tuple(l for l in languages if l in have)
    if unknown := [l for l in languages if by_tesseract(l) is None]:
        log.warning("extract.pdf: the language table (quipu.tasks.languages) has no entry with Tesseract code %s: "
                    "OCR reads it, but its words count neither for a text layer's language check nor for choosing "
                    "the OCR language of a document (docs/languages.md, 'Adding a language')", ", ".join(unknown))
    if len(usable) < len(languages):
        missing = [l for l in languages if l not in have]
        log.warning("extract.pdf: tesseract has no language data for %s (install tesseract-ocr-%s)%s", ", ".join(missing),
                    missing[0], "" if usable else ": pages without a usable text layer are removed as pdf:ocr_unavailable")
    return (exe if usable else None), usable


@dataclass
class PdfRead:
    """What one PDF gave: its text, the reason it is removed (None: kept), its metadata fields and
    page counts for the stage report."""
    text: str
    reason: str | None
    metadata: dict
    stats: dict = field(default_factory=dict)
    # each page, or run of pages, dropped: (first page, last page (from 1), reason, detail or None)
    lost_pages: list[tuple[int, int, str, str | None]] = field(default_factory=list)


_local = threading.local()


def _worker(max_memory_mb: int) -> ChildWorker:
    w = getattr(_local, "pdf_worker", None)
    if w is None or w.args != (max_memory_mb,):
        if w is not None:
            w.stop()
        w = _local.pdf_worker = ChildWorker(_serve, (max_memory_mb,), "PDF reader")
    return w


def reader_cpu(cfg: PdfConfig) -> float:
    """CPU seconds this thread's PDF child(ren) have spent on answers so far: the clock the time
    budgets count by (`doc_timeout_s`)."""
    return _worker(cfg.max_memory_mb).cpu_total


def read_pdf(source: bytes | str, cfg: PdfConfig) -> PdfRead:
    """Read one PDF (its bytes, or a local path) page by page in the child process, restarting it
    past a page that hangs or kills it; see the module docstring."""
    spent = reader_cpu(cfg)
    info, results, error = read_pages(source, cfg, budget_s=cfg.doc_timeout_s)
    if info is None:
        return unread(*error)
    return lay_out(info, results, cfg, cfg.doc_timeout_s - (reader_cpu(cfg) - spent))


def lay_out(info: dict, results: dict[int, dict], cfg: PdfConfig, seconds_left: float) -> PdfRead:
    """The document made of its pages' results (`document`) in the child process, under its memory
    limit and the document's time budget left (at least `page_timeout_s`): a page layout that the
    reading order or header search handles badly costs its document, never the run. A layout that
    fails drops every page (`pdf:time_budget`, `pdf:layout_error`)."""
    worker = _worker(cfg.max_memory_mb)
    seconds = max(seconds_left, cfg.page_timeout_s)
    worker.send(("layout", info, results, cfg.model_dump()))
    msg = worker.receive(seconds)
    if msg[0] == "document":
        return msg[1]
    reason, detail = (("pdf:time_budget", f"layout took over {seconds:.0f} s") if msg[0] == "timeout" else
                      ("pdf:layout_error", msg[1] if msg[0] == "error" else "the layout process crashed"))
    return document(info, {i: {"status": "dropped", "reason": reason, "detail": detail} for i in results}, cfg)


def unread(reason: str, detail: str) -> PdfRead:
    """A PDF that could not be opened at all: removed with `reason`."""
    return PdfRead("", reason, {"pdf_error": detail}, {"documents": 1, "documents_unread": {reason: 1}})


def page_count(source: bytes | str, cfg: PdfConfig) -> int | None:
    """How many pages a PDF has, asked of the child process under its limits (a hostile file costs
    at most `page_timeout_s`); None when pdfium cannot open it as it is."""
    worker = _worker(cfg.max_memory_mb)
    worker.send(("count", source))
    msg = worker.receive(cfg.page_timeout_s + 10)
    return msg[1] if msg[0] == "count" else None


def read_pages(source: bytes | str, cfg: PdfConfig, first: int = 0, end: int | None = None,
               budget_s: float | None = None) -> tuple[dict | None, dict[int, dict], tuple[str, str] | None]:
    """(the document's info, each page's result by index, None), pages `first` to `end` (0-based,
    end excluded; at most `max_pages`) read in the child process, restarting it past a page that
    hangs or kills it; (None, {}, (reason, detail)) when the file cannot be opened. Pages still
    unread after `budget_s` (default `doc_timeout_s`) are dropped (`pdf:time_budget`)."""
    stop = min(cfg.max_pages, end if end is not None else cfg.max_pages)
    exe, languages = tesseract_setup(tuple(cfg.ocr_languages)) if cfg.ocr != "never" else (None, ())
    job = {"pdf": cfg.model_dump(), "max_pages": stop, "tesseract": exe, "languages": list(languages)}
    worker = _worker(cfg.max_memory_mb)
    budget = cfg.doc_timeout_s if budget_s is None else budget_s
    spent = worker.cpu_total       # the budget counts the CPU the reader spends on this document
    results: dict[int, dict] = {}
    info: dict | None = None
    start, batch = first, True
    while True:
        worker.send(("read", source, start, {**job, "batch": batch}))
        msg = worker.receive(cfg.page_timeout_s + 10)
        if msg[0] in ("timeout", "died", "error"):
            reason = msg[1] if msg[0] == "error" else "pdf:unreadable"
            detail = msg[2] if msg[0] == "error" else f"the parser {'timed out' if msg[0] == 'timeout' else 'crashed'} opening it"
            if info is None:
                return None, {}, (reason, detail)
            results.update({i: {"status": "dropped", "reason": "pdf:page_error"} for i in range(start, _last(info, stop))})
            break
        info = msg[1]
        last = _last(info, stop)
        i, finished = start, False
        while True:
            left = budget - (worker.cpu_total - spent)
            if left <= 0:
                worker.stop()
                results.update({k: {"status": "dropped", "reason": "pdf:time_budget"} for k in range(i, last)})
                finished = True
                break
            msg = worker.receive(min(cfg.page_timeout_s, left))
            if msg[0] == "pages":
                for k, result in msg[1]:
                    results[k] = result
                    i = k + 1
                if len(msg) > 2:
                    finished = True
                    break
                continue
            if batch:
                # some page from i on hung or killed the child (stopped now): read again from i
                # page by page, which finds it
                batch = False
                break
            reason = "pdf:page_timeout" if msg[0] == "timeout" and left > cfg.page_timeout_s else \
                "pdf:time_budget" if msg[0] == "timeout" else "pdf:page_error"
            results[i] = {"status": "dropped", "reason": reason}
            i += 1
            batch = True
            break
        if finished or i >= last:
            break
        start = i
    return info, results, None


def _last(info: dict, stop: int) -> int:
    return min(info["pages"], stop)


def document(info: dict, results: dict[int, dict], cfg: PdfConfig) -> PdfRead:
    """The document's text, metadata and page counts from its pages' results."""
    pages, dropped, lost = [], {}, []
    n_text = n_ocr = n_empty = words = 0
    conf_total = 0.0
    for i in sorted(results):
        r = results[i]
        status = r["status"]
        if status == "dropped":
            dropped[r["reason"]] = dropped.get(r["reason"], 0) + 1
            lost.append((i + 1, i + 1, r["reason"], r.get("detail")))
            continue
        n_text += status == "text"
        n_ocr += status == "ocr"
        n_empty += status == "empty"
        if status == "ocr" and r.get("confidence") is not None:
            words += r["words"]
            conf_total += r["confidence"] * r["words"]
        pages.append(Page(r["width"], r["height"], [Line(*l) for l in r["lines"]]))
    if info["pages"] > cfg.max_pages:
        dropped["pdf:over_max_pages"] = info["pages"] - cfg.max_pages
        lost.append((cfg.max_pages + 1, info["pages"], "pdf:over_max_pages", None))   # one row, not one a page
    text, removed = document_text(pages)
    metadata = {"pdf_pages": info["pages"], "pdf_pages_text": n_text, "pdf_pages_ocr": n_ocr,
                "pdf_producer": info.get("producer"), "pdf_title": info.get("title"),
                "pdf_repaired": True if info.get("repaired") else None}
    if n_ocr:
        metadata["pdf_ocr_confidence"] = round(conf_total / words, 2) if words else None
    if dropped:
        metadata["pdf_pages_dropped"] = dict(sorted(dropped.items()))
    metadata = {k: v for k, v in metadata.items() if v is not None}
    stats = {"documents": 1, "documents_repaired": int(bool(info.get("repaired"))), "pages": info["pages"], "pages_text": n_text, "pages_ocr": n_ocr, "pages_empty": n_empty,
             "pages_dropped": dropped, "running_lines_removed": removed["running_lines"],
             "page_numbers_removed": removed["page_numbers"],
             "seconds_text": round(sum(r.get("seconds", 0) for r in results.values() if r["status"] == "text"), 3),
             "seconds_ocr": round(sum(r.get("seconds", 0) for r in results.values() if r["status"] == "ocr"), 3)}
    reason = None
    if not text.strip():
        reason = max(dropped, key=lambda k: (dropped[k], k)) if dropped else "pdf:no_text" if info["pages"] else "pdf:no_pages"
    return PdfRead(text, reason, metadata, stats, lost)
