"""From positioned lines of PDF pages to running text: reading order, running headers and footers,
paragraphs, hyphenation. Pure Python over what `quipu.tasks.reading.pdf` reads (a text layer's lines or
OCR's lines, in PDF points from the page's top-left corner), so it is the same for born-digital
and scanned pages.

The steps, per document:
1. Running headers and footers: the rows of a page (lines side by side, across columns) in its top
   and bottom bands are candidates. A row whose text, digits masked, recurs in that band on at
   least `RUNNING_SHARE` of the pages (and on two or more) is a running header or footer; a row
   that is only a page number ("7", "- 7 -", "Página 7 de 20", "p. vii") or text with a page number
   after a separator ("Revista | 7") is dropped on any page, and so is a short row set in smaller
   type than the body (`SMALL_PRINT`): a one-page document's header, a citation line.
2. Reading order: recursive XY-cut. A block of lines is cut at the widest vertical gap (a gutter)
   when both sides read as prose columns (several lines, mostly filling their side), otherwise at
   its widest horizontal gap; the pieces are read left to right, top to bottom. A table's rows do
   not pass the prose test, so a table stays as rows: one text line per row, its cells in order.
3. Paragraphs: lines are joined into a paragraph unless a new one starts: a vertical gap clearly
   larger than the page's line pitch, a first line indented past the block's left edge, or a line
   after one that ends short with closing punctuation. A paragraph goes on across a column or page
   break. Paragraphs are separated by one blank line.
4. Hyphenation: a line that ends in a hyphen the PDF marks as generated (pdfium's U+0002, or a soft
   hyphen) is joined to the next without it; so is one that ends in a letter and '-' when the next
   line starts with a lower-case letter (a hyphenated word, not a dash). pdfium marks a compound's
   own hyphen at a line end the same way: the hyphen stays when the document writes that compound
   with a hyphen elsewhere and never as one word.
"""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field

RUNNING_SHARE = 0.4       # a row in the top/bottom band on this share of pages is running
BAND = 0.14               # top and bottom bands: this share of the page height
BAND_ROWS = 3             # rows looked at in each band
MIN_GUTTER_PT = 7.0
SMALL_PRINT = 0.92        # a band row set this much smaller than the body text is page furniture       # narrower vertical gaps are word spaces, not a gutter between columns

GENERATED_HYPHENS = "\x02\ufffe\xad"
_PAGE_NUMBER = re.compile(
    r"^[\W_]*(?:(?:page|p[áa]gina|p[áa]g|pag|pg|p|folha|fl|hoja|f)\.?\s*)?"
    r"(?:\d{1,4}|[ivxlcdm]{1,7})(?:\s*(?:of|de|do|da|/|\|)\s*\d{1,4})?[\W_]*$", re.I)
_DIGITS = re.compile(r"\d+")
# a header or footer that carries the page number after or before a separator: "Journal | 7"
# (OCR reads the bar as '/', '[', ']', '!', 'l' or 'I'); a dash or slash counts only between spaces
_SEPARATOR = r"(?:\s*[|·•\[\]!]\s*|\s[-–—/lI]\s)"
_NUMBERED_RUNNING = re.compile(rf"^\d{{1,4}}{_SEPARATOR}\S|\S{_SEPARATOR}\d{{1,4}}$")
_ROMAN = re.compile(r"\b[ivxlcdm]{1,7}\b", re.I)
_END_PUNCT = tuple('.!?:;…"»”)')
_NO_GENERATED = {ord(c): None for c in GENERATED_HYPHENS}


@dataclass
class Line:
    """A line of text on a page: its box in points from the top-left corner."""
    x0: float
    x1: float
    top: float
    bottom: float
    text: str
    cells: int = 1            # pieces it was joined from with a wide gap between (a table row)
    block_left: float = 0.0   # the extent of the block (column) it was read in
    block_right: float = 0.0
    page: int = 0

    @property
    def height(self) -> float:
        h = self.bottom - self.top
        return h if h > 1e-3 else 1e-3


@dataclass
class Page:
    width: float
    height: float
    lines: list[Line] = field(default_factory=list)


def is_page_number(text: str) -> bool:
    return bool(_PAGE_NUMBER.match(text.strip())) and any(c.isalnum() for c in text)


def _mask(text: str) -> str:
    return " ".join(_ROMAN.sub("#", _DIGITS.sub("#", text.lower())).split())


def rows(lines: list[Line]) -> list[list[Line]]:
    """Lines side by side (vertically overlapping), top to bottom; each row left to right."""
    out: list[list[Line]] = []
    top = bottom = 0.0
    for ln in sorted(lines, key=lambda l: (l.top, l.x0)):
        if out and top <= (ln.top + ln.bottom) / 2 <= bottom:
            out[-1].append(ln)
            bottom = max(bottom, ln.bottom)
            continue
        out.append([ln])
        top, bottom = ln.top, ln.bottom
    return [sorted(r, key=lambda l: l.x0) if len(r) > 1 else r for r in out]


def _band_rows(page: Page) -> list[tuple[str, list[Line]]]:
    """('top'|'bottom', row) for the first and last BAND_ROWS rows inside the page's bands."""
    rs = rows(page.lines)
    band = BAND * page.height
    out = [("top", r) for r in rs[:BAND_ROWS] if max(l.bottom for l in r) <= band]
    out += [("bottom", r) for r in rs[-BAND_ROWS:] if min(l.top for l in r) >= page.height - band
            and ("top", r) not in out]
    return out


def remove_running(pages: list[Page]) -> dict[str, int]:
    """Drop running headers, footers and page numbers from `pages` in place; counts of what went."""
    counts = {"running_lines": 0, "page_numbers": 0}
    band_rows = [_band_rows(p) for p in pages]
    seen: dict[tuple[str, str], set[int]] = {}
    for i, brs in enumerate(band_rows):
        for zone, row in brs:
            seen.setdefault((zone, _mask(" ".join(l.text for l in row))), set()).add(i)
    need = max(2, math.ceil(RUNNING_SHARE * len(pages)))
    heights = [l.height for p in pages for l in p.lines]
    body = statistics.median(heights) if heights else 0.0
    for page, brs in zip(pages, band_rows):
        drop: set[int] = set()
        for zone, row in brs:
            text = " ".join(l.text for l in row)
            if is_page_number(text) or (_NUMBERED_RUNNING.search(text.strip()) and len(text.split()) <= 12):
                counts["page_numbers"] += 1
            elif len(seen[(zone, _mask(text))]) >= need:
                counts["running_lines"] += 1
            elif max(l.height for l in row) < SMALL_PRINT * body and len(text.split()) <= 12 \
                    and len(page.lines) > len(row) + 3:
                # small print at the page's edge, found on one page only (a one-page document's
                # running header, a journal's citation line): boilerplate like the running ones
                counts["running_lines"] += 1
            else:
                # a page number beside running text in the same row ("Journal | 7" split in pieces)
                pieces = [l for l in row if is_page_number(l.text)]
                if pieces and len(seen.get((zone, _mask(" ".join(l.text for l in row if l not in pieces))), ())) >= need:
                    counts["running_lines"] += 1
                else:
                    continue
            drop.update(id(l) for l in row)
        page.lines = [l for l in page.lines if id(l) not in drop]
    return counts


# ---- reading order ----------------------------------------------------------------------------

def _gaps(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The gaps between the union of `intervals`, as (start, end)."""
    out = []
    intervals = sorted(intervals)
    end = intervals[0][1] if intervals else 0.0
    for a, b in intervals:
        if a > end:
            out.append((end, a))
        if b > end:
            end = b
    return out


def _prose_side(lines: list[Line]) -> bool:
    if len(lines) < 3:
        return False
    left, right = min(l.x0 for l in lines), max(l.x1 for l in lines)
    width = max(1.0, right - left)
    return statistics.median(l.x1 - l.x0 for l in lines) >= 0.55 * width and width >= 60


def xy_cut(lines: list[Line], extent: tuple[float, float] | None = None) -> list[tuple[list[Line], tuple[float, float]]]:
    """Blocks of lines in reading order (see the module docstring), each with the left and right
    edge of the column it is in (set by the last vertical cut: a paragraph's indent and short last
    line are measured against the column, not against the paragraph itself)."""
    if not lines:
        return []
    if extent is None:
        extent = (min(l.x0 for l in lines), max(l.x1 for l in lines))
    if len(lines) < 6:      # too few lines for two prose columns of three: the rows as they come
        return [(lines, extent)]
    height = statistics.median(l.height for l in lines)
    vgaps = [g for g in _gaps([(l.x0, l.x1) for l in lines]) if g[1] - g[0] >= max(MIN_GUTTER_PT, 0.8 * height)]
    for g in sorted(vgaps, key=lambda g: g[0] - g[1]):
        cut = (g[0] + g[1]) / 2
        left = [l for l in lines if l.x1 <= cut]
        right = [l for l in lines if l.x0 >= cut]
        if _prose_side(left) and _prose_side(right):
            return xy_cut(left, None) + xy_cut(right, None)
    hgaps = [g for g in _gaps([(l.top, l.bottom) for l in lines]) if g[1] - g[0] >= 0.3 * height]
    if hgaps:
        g = max(hgaps, key=lambda g: (g[1] - g[0], -g[0]))
        cut = (g[0] + g[1]) / 2
        return (xy_cut([l for l in lines if l.bottom <= cut], extent)
                + xy_cut([l for l in lines if l.top >= cut], extent))
    return [(lines, extent)]


def _block_lines(block: list[Line], extent: tuple[float, float], page_no: int) -> list[Line]:
    """A block's rows as single lines (pieces side by side joined, wide gaps counted as cells)."""
    left, right = extent
    out = []
    for row in rows(block):
        cells = 1
        for a, b in zip(row, row[1:]):
            if b.x0 - a.x1 > 1.5 * max(a.height, b.height):
                cells += 1
        out.append(Line(row[0].x0, max(l.x1 for l in row), min(l.top for l in row), max(l.bottom for l in row),
                        " ".join(l.text for l in row), cells, left, right, page_no))
    return out


def reading_order(pages: list[Page]) -> list[Line]:
    """Every line of every page, in reading order, with its block's extent."""
    out: list[Line] = []
    for n, page in enumerate(pages):
        for block, extent in xy_cut(page.lines):
            out.extend(_block_lines(block, extent, n))
    return out


# ---- paragraphs -------------------------------------------------------------------------------

def _pitches(lines: list[Line]) -> dict[int, float]:
    """The usual distance from one line's top to the next's in a column, per page."""
    per_page: dict[int, list[float]] = {}
    for a, b in zip(lines, lines[1:]):
        if a.page == b.page and b.top > a.top and abs(a.block_left - b.block_left) < 2:
            per_page.setdefault(a.page, []).append(b.top - a.top)
    return {p: statistics.median(v) for p, v in per_page.items()}


def _new_paragraph(prev: Line, line: Line, pitch: float | None) -> bool:
    if prev.cells > 1 or line.cells > 1:       # table rows stay lines of their own
        return True
    size = max(prev.height, line.height)
    same_column = prev.page == line.page and line.top > prev.top and line.x0 < prev.x1 and line.x1 > prev.x0
    if same_column:
        gap = line.top - prev.top
        if gap > 1.3 * (pitch or 1.2 * size) + 0.5:
            return True
    indent = line.x0 - line.block_left
    if indent >= max(4.0, 0.6 * size) and indent < 0.3 * (line.block_right - line.block_left) \
            and prev.x0 - prev.block_left < 0.5 * indent:
        return True
    short = prev.x1 < prev.block_right - max(0.12 * (prev.block_right - prev.block_left), 2 * size)
    return short and prev.text.rstrip().endswith(_END_PUNCT)


BREAK = "\x00"     # where a word was joined across a line-end hyphen, until the document decides


def _join(para: str, line: str) -> str:
    if para.endswith(tuple(GENERATED_HYPHENS)):
        return para.rstrip(GENERATED_HYPHENS) + BREAK + line
    if len(para) >= 2 and para[-1] == "-" and para[-2].isalpha() and line[:1].islower():
        return para[:-1] + BREAK + line
    return f"{para} {line}"


_BROKEN = re.compile(r"(\w*)\x00(\w*)")
_HYPHENATED = re.compile(r"\w+(?:-\w+)+")


def _unbreak(paras: list[str]) -> list[str]:
    """A word broken at a line end is joined ("imple-" "mented": "implemented") unless the document
    writes it with a hyphen elsewhere and never without ("open-" "domain": "open-domain")."""
    text = "\n".join(paras)
    if BREAK not in text:
        return paras
    plain = set(re.findall(r"\w+", text.replace(BREAK, " ").lower()))
    hyphenated = {w.lower() for w in _HYPHENATED.findall(text.replace(BREAK, " "))}

    def fix(m: re.Match) -> str:
        a, b = m.group(1), m.group(2)
        keep = f"{a}-{b}".lower() in hyphenated and f"{a}{b}".lower() not in plain
        return f"{a}-{b}" if keep else a + b
    return [_BROKEN.sub(fix, p) if BREAK in p else p for p in paras]


def paragraphs(lines: list[Line]) -> list[str]:
    pitches = _pitches(lines)
    out: list[str] = []
    prev: Line | None = None
    for line in lines:
        text = " ".join(line.text.split())
        if not text:
            continue
        if prev is None or _new_paragraph(prev, line, pitches.get(line.page)):
            out.append(text)
        else:
            out[-1] = _join(out[-1], text)
        prev = line
    return _unbreak([p.translate(_NO_GENERATED) for p in out])


def document_text(pages: list[Page]) -> tuple[str, dict[str, int]]:
    """The running text of a document's pages, and counts of the running lines dropped."""
    counts = remove_running(pages)
    return "\n\n".join(paragraphs(reading_order(pages))), counts
