"""PDFs made from known text, for the demo corpus, the PDF tests and bench/pdf_extraction.py.

`make_pdf` lays prose out the way journals, gazettes and theses do, with everything that makes PDF
text extraction hard: one or two columns, a running header (and, on a second line, a title that
carries the page number), a page number in one of the usual formats at the foot, words hyphenated
at line ends, paragraphs marked by an indent or by a gap. It returns the PDF's bytes and the text a
perfect extractor would give (paragraphs separated by one blank line, words whole), so token F1
against it measures an extractor. `image_only` renders each page to a picture (pypdfium2) and
makes a PDF of the pictures alone: a scanned document with no text layer, for OCR.

Deterministic: the same arguments give the same bytes (reportlab's invariant mode: no dates, no
random document ids).
"""
from __future__ import annotations

import io
import random
from dataclasses import dataclass

PAGE_W, PAGE_H = 595.0, 842.0       # A4 in points
MARGIN = 64.0
GUTTER = 26.0
FONT, FONT_SIZE, LEADING = "Times-Roman", 10.5, 13.0

# running headers and footers per language: {n} is the page number, {total} the page count
HEADERS = {
    "es": ("Boletín de Estudios Regionales", "Revista de Ciencias Sociales, vol. 12"),
    "pt": ("Cadernos de Pesquisa Regional", "Revista Brasileira de Estudos, v. 7"),
    "en": ("Journal of Regional Studies", "Proceedings of the Annual Meeting, vol. 3"),
}
FOOTERS = {"es": ("{n}", "Página {n} de {total}", "- {n} -", "Pág. {n}"),
           "pt": ("{n}", "Página {n} de {total}", "- {n} -", "p. {n}"),
           "en": ("{n}", "Page {n} of {total}", "- {n} -", "{n} / {total}")}


@dataclass(frozen=True)
class MadePdf:
    data: bytes
    text: str            # the known text: paragraphs, one blank line between them
    pages: int
    header: str          # the running header's text (must not survive extraction)


def _encodable(text: str) -> str:
    """The standard Type 1 fonts carry WinAnsi (cp1252) only."""
    return text.encode("cp1252", "ignore").decode("cp1252")


def _hyphen_split(word: str, room: float, width) -> tuple[str, str] | None:
    """The longest head of `word` that fits `room` with a hyphen, cut after a vowel with at least
    three letters on each side (syllable-like, as a typesetter would), or None."""
    vowels = set("aeiouáéíóúâêôãõàüAEIOU")
    for cut in range(len(word) - 3, 2, -1):
        head = word[:cut]
        if head[-1] in vowels and word[cut].isalpha() and head.isalpha() and width(head + "-") <= room:
            return head + "-", word[cut:]
    return None


def _lines(paragraph: str, col_w: float, indent: float, width) -> list[tuple[str, float]]:
    """(line, x offset) of one paragraph, greedily filled, hyphenating long words that do not fit."""
    words = paragraph.split()
    lines: list[tuple[str, float]] = []
    cur: list[str] = []
    x0 = indent
    while words:
        w = words.pop(0)
        trial = " ".join(cur + [w])
        if width(trial) <= col_w - x0:
            cur.append(w)
            continue
        room = col_w - x0 - width(" ".join(cur + [""])) if cur else col_w - x0
        split = _hyphen_split(w, room, width) if len(w) >= 7 else None
        if split:
            cur.append(split[0])
            words.insert(0, split[1])
        elif not cur:           # a single word wider than the column: set it anyway
            cur.append(w)
        else:
            words.insert(0, w)
        lines.append((" ".join(cur), x0))
        cur, x0 = [], 0.0
    if cur:
        lines.append((" ".join(cur), x0))
    return lines


def make_pdf(paragraphs: list[str], lang: str = "en", columns: int = 1, seed: int = 0,
             image_only: bool = False, image_dpi: int = 200, title: str | None = None) -> MadePdf:
    """A PDF of `paragraphs` (see the module docstring); `seed` picks the header, footer and
    paragraph style."""
    from reportlab.pdfbase.pdfmetrics import stringWidth
    from reportlab.pdfgen import canvas
    from reportlab import rl_config

    rl_config.invariant = 1
    rng = random.Random(seed)
    paragraphs = [" ".join(_encodable(p).split()) for p in paragraphs]
    paragraphs = [p for p in paragraphs if p]
    header = HEADERS[lang][rng.randrange(len(HEADERS[lang]))]
    footer = FOOTERS[lang][rng.randrange(len(FOOTERS[lang]))]
    header_has_page = rng.random() < 0.5     # "Journal ... | 3" at the top instead of a footer
    indent_paragraphs = rng.random() < 0.5   # else a gap between paragraphs
    width = lambda s: stringWidth(s, FONT, FONT_SIZE)     # noqa: E731
    col_w = (PAGE_W - 2 * MARGIN - (columns - 1) * GUTTER) / columns
    top, bottom = PAGE_H - MARGIN - 18, MARGIN + 10

    # lay out: a list of pages, each a list of (x, y, text)
    pages: list[list[tuple[float, float, str]]] = [[]]
    col, y = 0, top
    if title:
        pages[0].append((MARGIN, y, "\x00" + title))
        y -= 2.2 * LEADING
    body_top = y
    for p in paragraphs:
        lines = _lines(p, col_w, 14.0 if indent_paragraphs else 0.0, width)
        for line, dx in lines:
            if y < bottom:
                col += 1
                if col >= columns:
                    pages.append([])
                    col, body_top = 0, top
                y = body_top
            pages[-1].append((MARGIN + col * (col_w + GUTTER) + dx, y, line))
            y -= LEADING
        if not indent_paragraphs:
            y -= 0.6 * LEADING
    total = len(pages)

    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=(PAGE_W, PAGE_H), pageCompression=1)
    c.setTitle(title or header)
    c.setProducer("quipu.demo.pdfs (reportlab)")
    for n, items in enumerate(pages, 1):
        c.setFont("Times-Italic", 9)
        running = f"{header}  |  {n}" if header_has_page else header
        c.drawString(MARGIN, PAGE_H - MARGIN + 14, running)
        c.line(MARGIN, PAGE_H - MARGIN + 10, PAGE_W - MARGIN, PAGE_H - MARGIN + 10)
        if not header_has_page:
            c.setFont("Times-Roman", 9)
            c.drawCentredString(PAGE_W / 2, MARGIN - 24, footer.format(n=n, total=total))
        for x, yy, text in items:
            if text.startswith("\x00"):
                c.setFont("Times-Bold", 15)
                c.drawString(x, yy, text[1:])
            else:
                c.setFont(FONT, FONT_SIZE)
                c.drawString(x, yy, text)
        c.showPage()
    c.save()
    data = buf.getvalue()
    known = "\n\n".join(([title] if title else []) + paragraphs)
    if image_only:
        data = _image_only(data, image_dpi)
    return MadePdf(data, known, total, header)


def _image_only(pdf: bytes, dpi: int) -> bytes:
    """Each page of `pdf` as a greyscale picture in a PDF with no text layer (a scan)."""
    import pypdfium2 as pdfium
    from reportlab.lib.utils import ImageReader
    from reportlab.pdfgen import canvas

    doc = pdfium.PdfDocument(pdf)
    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=(PAGE_W, PAGE_H), pageCompression=1)
    c.setProducer("quipu.demo.pdfs scan (reportlab)")
    try:
        for i in range(len(doc)):
            img = doc[i].render(scale=dpi / 72, grayscale=True).to_pil().convert("L")
            png = io.BytesIO()
            img.save(png, format="PNG", optimize=False)
            png.seek(0)
            c.drawImage(ImageReader(png), 0, 0, PAGE_W, PAGE_H)
            c.showPage()
    finally:
        doc.close()
    c.save()
    return buf.getvalue()


def prose(lang: str, n_paragraphs: int, seed: int = 0, min_words: int = 40) -> list[str]:
    """Paragraphs of real prose in `lang` from the demo's sources (Python's reference for English,
    Django's and Apprise's translation catalogues for Spanish and Portuguese), picked by `seed`."""
    from quipu.synthetic import sources
    arts = sources.python_reference_articles() if lang == "en" else sources.catalogue_articles(lang)
    paras = sorted({b.text for a in arts for b in a.blocks
                    if b.tag == "p" and len(b.text.split()) >= min_words and "`" not in b.text})
    rng = random.Random(seed)
    return rng.sample(paras, min(n_paragraphs, len(paras)))


def token_f1(predicted: str, expected: str) -> float:
    """Bag-of-words F1 of `predicted` against `expected` (lower-cased word tokens)."""
    import re
    from collections import Counter
    p = Counter(re.findall(r"\w+", predicted.lower()))
    e = Counter(re.findall(r"\w+", expected.lower()))
    common = sum((p & e).values())
    if not common:
        return 0.0
    precision, recall = common / sum(p.values()), common / sum(e.values())
    return 2 * precision * recall / (precision + recall)
