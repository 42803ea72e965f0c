"""PDF text extraction: quipu's PDF path against the raw library calls, in one run: token F1
against known text and pages/s.

Sides, on the same pages:
- `pypdfium2`: `PdfTextPage.get_text_range()` per page (what quipu builds on; the anchor);
- `pypdf`: `PageObject.extract_text()`; `pdfminer.six`: `high_level.extract_text()` (optional: the
  `bench` extra, `pip install -e '.[bench]'`; a side that is missing is reported as such);
- `quipu`: `tasks.reading.pdf.read_pdf` with `ocr: never` on text-layer PDFs (child process, line boxes,
  XY-cut reading order, running headers and page numbers removed, paragraphs, de-hyphenation), and
  with `ocr: auto` on image-only PDFs (Tesseract).

Corpora:
- `made`: PDFs made from known es/pt/en prose (quipu.synthetic.pdfs: one and two columns, running
  headers, page numbers, hyphenation), born-digital; the same as image-only scans (`made-scan`,
  OCR: fewer, it is slow);
- `shared`: ../shared/data/pdf files that come with an `*.expected.txt` (other tools' renderings,
  Markdown or layout-padded: the F1 is against them as they are);
- `speed`: the first `--speed-pages` pages of every born-digital PDF in ../shared/data/pdf: pages/s.

F1 is bag-of-words over lower-cased word tokens, per document, averaged. pages/s is wall time;
pages per CPU-second counts the CPU of every process a side uses (quipu's parent, its PDF child and
Tesseract), the per-core figure, which a loaded machine does not distort as it does wall time.

    .venv/bin/python bench/pdf_extraction.py [--scan-docs 3] [--speed-pages 10] [--shared DIR] [--append bench/RESULTS.md]
"""
from __future__ import annotations

import argparse
import io
import logging
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED_PDF = ROOT.parent / "shared" / "data" / "pdf"
SKIP_SPEED = ("password", "empty", "ocr_test", "usb__acta", "ufpb__ata")    # encrypted, empty, scans


def side_pypdfium2(data: bytes | str, max_pages: int) -> tuple[str, int]:
    import pypdfium2 as pdfium
    doc = pdfium.PdfDocument(data)
    texts = []
    n = min(len(doc), max_pages)
    for i in range(n):
        page = doc[i]
        tp = page.get_textpage()
        texts.append(tp.get_text_range())
        tp.close()
        page.close()
    doc.close()
    return "\n".join(texts), n


def _stream(data: bytes | str):
    return open(data, "rb") if isinstance(data, str) else io.BytesIO(data)


def side_pypdf(data: bytes | str, max_pages: int) -> tuple[str, int]:
    import pypdf
    reader = pypdf.PdfReader(_stream(data))
    pages = reader.pages[:max_pages]
    return "\n".join(p.extract_text() or "" for p in pages), len(pages)


def side_pdfminer(data: bytes | str, max_pages: int) -> tuple[str, int]:
    from pdfminer.high_level import extract_text
    from pdfminer.pdfpage import PDFPage
    with _stream(data) as fh:
        n = min(max_pages, sum(1 for _ in PDFPage.get_pages(fh)))
    with _stream(data) as fh:
        return extract_text(fh, page_numbers=list(range(n))), n


def side_quipu(data: bytes | str, max_pages: int, ocr: str = "never") -> tuple[str, int]:
    from quipu.tasks.reading.pdf import PdfConfig, read_pdf
    got = read_pdf(data, PdfConfig(ocr=ocr, max_pages=max_pages))
    return got.text, min(got.metadata.get("pdf_pages", 0), max_pages)


SIDES = {"pypdfium2": side_pypdfium2, "pypdf": side_pypdf, "pdfminer.six": side_pdfminer, "quipu": side_quipu}


def available(name: str) -> bool:
    mod = {"pypdf": "pypdf", "pdfminer.six": "pdfminer"}.get(name)
    if mod is None:
        return True
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


def made_corpus(scan_docs: int) -> tuple[list, list]:
    from quipu.synthetic.pdfs import make_pdf, prose
    born, scans = [], []
    for lang in ("es", "pt", "en"):
        paras = prose(lang, 24, seed=21)
        for columns in (1, 2):
            for seed in (5, 6):
                m = make_pdf(paras, lang, columns=columns, seed=seed, title="Informe" if seed == 6 else None)
                born.append((f"{lang}-{columns}col-s{seed}", m.data, m.text, m.header))
    for k, (lang, columns) in enumerate([("pt", 2), ("es", 1), ("en", 2), ("es", 2), ("pt", 1), ("en", 1)][:scan_docs]):
        m = make_pdf(prose(lang, 24, seed=22)[:5], lang, columns=columns, seed=7 + k, image_only=True)
        scans.append((f"{lang}-{columns}col-scan", m.data, m.text, m.header))
    return born, scans


def shared_corpus() -> list:
    out = []
    for exp in sorted(SHARED_PDF.glob("*.expected.txt")):
        pdf = exp.with_name(exp.name.replace(".expected.txt", ".pdf"))
        out.append((pdf.stem, pdf.read_bytes(), exp.read_text(encoding="utf-8"), None))
    return out


def evaluate(docs: list, sides: list[str], max_pages: int = 10_000, ocr: str = "never") -> dict:
    from quipu.synthetic.pdfs import token_f1
    from quipu.tasks.reading.pdf_layout import is_page_number
    res = {}
    for side in sides:
        f1s, pages, seconds, headers_left, numbers_left = [], 0, 0.0, 0, 0
        cpu0 = cpu_seconds()
        for name, data, known, header in docs:
            t0 = time.perf_counter()
            try:
                text, n = (side_quipu(data, max_pages, ocr) if side == "quipu" else SIDES[side](data, max_pages))
            except Exception as e:  # a library that fails on a file scores 0 on it
                logging.warning("%s failed: %s", side, e)
                text, n = "", 0
            seconds += time.perf_counter() - t0
            pages += n
            if known is not None:
                f1s.append(token_f1(text, known))
                logging.info("%s %s: F1 %.4f", side, name, f1s[-1])
            if header is not None:
                headers_left += header in text
                numbers_left += any(is_page_number(l) for l in text.splitlines() if l.strip())
        cpu = cpu_seconds() - cpu0
        res[side] = {"f1": sum(f1s) / len(f1s) if f1s else None, "pages": pages, "seconds": seconds,
                     "pages_per_s": pages / seconds if seconds else 0.0, "pages_per_cpu_s": pages / cpu if cpu > 0 else 0.0, "headers_left": headers_left,
                     "docs_with_page_numbers_left": numbers_left}
    return res


def cpu_seconds() -> float:
    """CPU seconds of this process and of quipu's PDF child process (and Tesseract, once it has
    exited), so that a side's cost is counted whichever process does the work: pages per CPU-second
    is the per-core figure, and it holds on a loaded machine where wall time does not."""
    import psutil
    from quipu.tasks.reading import pdf
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    worker = getattr(pdf._local, "pdf_worker", None)
    if worker is not None and worker.alive():
        c = psutil.Process(worker.proc.pid).cpu_times()
        total += c.user + c.system + c.children_user + c.children_system   # Tesseract runs under it
    return total


def speed_corpus(max_pages: int) -> list:
    """Paths, not bytes: quipu reads a local file where it lies (its child process opens it), and
    so do the libraries."""
    return [(p.stem, str(p), None, None) for p in sorted(SHARED_PDF.glob("*.pdf"))
            if not any(s in p.name for s in SKIP_SPEED)]


def table(title: str, res: dict, anchor: str = "pypdfium2") -> list[str]:
    base = res.get(anchor, {}).get("pages_per_s") or 0
    cpu_base = res.get(anchor, {}).get("pages_per_cpu_s") or 0
    lines = [f"**{title}**", "", "| side | token F1 | pages | pages/s (wall) | vs pypdfium2 | pages per CPU-second | vs pypdfium2 | running headers left | docs with a page-number line left |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for side, r in res.items():
        f1 = f"{r['f1']:.4f}" if r["f1"] is not None else "-"
        ratio = f"{r['pages_per_s'] / base:.2f}x" if base else "-"
        cpu_ratio = f"{r['pages_per_cpu_s'] / cpu_base:.2f}x" if cpu_base else "-"
        lines.append(f"| {side} | {f1} | {r['pages']} | {r['pages_per_s']:.3g} | {ratio} | {r['pages_per_cpu_s']:.3g} | {cpu_ratio} | {r['headers_left']} | {r['docs_with_page_numbers_left']} |")
    return lines + [""]


def main() -> None:
    global SHARED_PDF
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scan-docs", type=int, default=3, help="image-only PDFs to OCR (each ~1 page, seconds each)")
    ap.add_argument("--speed-pages", type=int, default=10, help="pages read of each shared PDF for pages/s")
    ap.add_argument("--append", type=Path, help="append the tables to this markdown file")
    ap.add_argument("--shared", type=Path, default=SHARED_PDF, help="the shared PDFs (default ../shared/data/pdf)")
    args = ap.parse_args()
    SHARED_PDF = args.shared
    logging.basicConfig(level=logging.ERROR)
    sides = [s for s in SIDES if available(s)]
    missing = [s for s in SIDES if s not in sides]
    load = os.getloadavg()
    t_start = time.time()
    out = [f"## PDF extraction (`bench/pdf_extraction.py`), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
           f"Command: `.venv/bin/python bench/pdf_extraction.py --scan-docs {args.scan_docs} --speed-pages {args.speed_pages}`; "
           f"machine load at start {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min, 2 cores shared with other agents)."
           + (f" Not installed, so not run: {', '.join(missing)}." if missing else ""), ""]
    side_quipu(b"%PDF-1.4", 1)        # start quipu's PDF child process outside the timings
    born, scans = made_corpus(args.scan_docs)
    out += table(f"Made from known text, born-digital: {len(born)} PDFs (es/pt/en, 1 and 2 columns, running headers, page numbers, hyphenation)",
                 evaluate(born, sides))
    if SHARED_PDF.is_dir():
        out += table("../shared/data/pdf files with an expected text (other tools' renderings: Markdown, layout-padded)",
                     evaluate([d for d in shared_corpus() if "ocr_test" not in d[0]], sides))
        # pypdf and pdfminer.six read at 1-30 pages/s (their pages/s on the tables above): the speed
        # corpus is the anchor and quipu only, so the run stays short
        speed = evaluate(speed_corpus(args.speed_pages), ["pypdfium2", "quipu"], max_pages=args.speed_pages)
        out += table(f"Speed: the first {args.speed_pages} pages of every born-digital ../shared/data/pdf file", speed)
        if speed["quipu"]["pages_per_cpu_s"] and speed["pypdfium2"]["pages_per_cpu_s"]:
            out.append(f"quipu text-layer pages per CPU-second (per core) vs raw pypdfium2: "
                       f"**{speed['quipu']['pages_per_cpu_s'] / speed['pypdfium2']['pages_per_cpu_s']:.2f}x** (target >= 0.5x); "
                       f"wall time {speed['quipu']['pages_per_s'] / speed['pypdfium2']['pages_per_s']:.2f}x (two processes handing pages over on a loaded machine)")
            out.append("")
    else:
        out.append(f"(../shared/data/pdf not found at {SHARED_PDF}: shared and speed corpora skipped)\n")
    if scans:
        res = evaluate(scans, ["pypdfium2", "quipu"], ocr="auto")
        out += table(f"Made from known text, image-only (scans, OCR at 300 dpi, Tesseract {tesseract_version()}): {len(scans)} PDFs", res)
    out.append(f"Whole run: {time.time() - t_start:.0f} s.")
    text = "\n".join(out)
    print(text)
    if args.append:
        with open(args.append, "a", encoding="utf-8") as fh:
            fh.write("\n" + text + "\n")


def tesseract_version() -> str:
    import subprocess
    try:
        out = subprocess.run(["tesseract", "--version"], capture_output=True, text=True, timeout=30).stdout
        m = re.search(r"tesseract\s+(\S+)", out)
        return m.group(1) if m else "?"
    except (OSError, subprocess.SubprocessError):
        return "not installed"


if __name__ == "__main__":
    main()
