"""A long PDF read whole (one work unit: the anchor) and in page ranges (`extract.pdf.pages_per_unit`)
on the same data in one run: wall time of extract, serially and on `--workers` threads (each with
its own PDF child process, as the curate flow's task runner), the planner's page-count probe, and
the join; the document must come out the same bytes both ways.

The PDF is made from known text (quipu.synthetic.pdfs: running headers, page numbers, hyphenation),
its 4 pages repeated to `--pages` pages: text layer only (`ocr: never`), or with `--scan` as
image-only pages read by OCR (`ocr_languages: [spa]`: one language, so that each range's OCR is the
whole document's; OCR pages cost ~800x a text-layer page, so the split matters most there).

    .venv/bin/python bench/pdf_ranges.py [--pages 400] [--per-unit 100] [--workers 2] [--scan] [--append bench/RESULTS.md]
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def long_pdf(pages: int, scan: bool) -> bytes:
    import pypdfium2 as pdfium

    from quipu.synthetic.pdfs import make_pdf, prose
    made = make_pdf(prose("es", 84, seed=5), "es", seed=1, image_only=scan)
    src, doc = pdfium.PdfDocument(made.data), pdfium.PdfDocument.new()
    while len(doc) < pages:
        doc.import_pages(src, list(range(min(len(src), pages - len(doc)))))
    buf = io.BytesIO()
    doc.save(buf)
    return buf.getvalue()


def timed_extract(path: str, run_dir: str, pdf_cfg, workers: int) -> tuple[float, float, str]:
    """(seconds of extract, seconds of its map over units, the document's text)."""
    import pyarrow.parquet as pq

    from quipu.tasks.extract import ExtractConfig, extract_work, run_extract
    from quipu.tasks.stage import RunContext
    cfg = ExtractConfig(pdf=pdf_cfg)
    mapped = [0.0]

    def map_units(units, run, cfg, on_result):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            out = list(pool.map(lambda u: extract_work(u, run.run_dir, cfg, run.removed_schema), units))
        mapped[0] = time.perf_counter() - t0
        return out

    t0 = time.perf_counter()
    (result,), _ = run_extract([[path]], RunContext(run_dir), cfg, map_units)
    seconds = time.perf_counter() - t0
    return seconds, mapped[0], pq.read_table(result.kept_shards[0].path).column("text")[0].as_py()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=400)
    ap.add_argument("--per-unit", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scan", action="store_true", help="image-only pages, read by OCR")
    ap.add_argument("--append", help="append the table to this Markdown file")
    args = ap.parse_args()
    from quipu.tasks.reading.pdf import PdfConfig, page_count
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "long.pdf")
        Path(path).write_bytes(long_pdf(args.pages, args.scan))
        cfg = PdfConfig(pages_per_unit=args.per_unit)
        t0 = time.perf_counter()
        assert page_count(path, cfg) == args.pages
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(20):
            page_count(path, cfg)
        warm = (time.perf_counter() - t0) / 20
        rows, texts = [], {}
        for name, per_unit, workers in (("whole (anchor)", 0, 1), ("ranges", args.per_unit, 1),
                                        ("ranges", args.per_unit, args.workers)):
            pdf_cfg = PdfConfig(ocr="auto" if args.scan else "never", ocr_languages=["spa"], pages_per_unit=per_unit)
            seconds, mapped, texts[(per_unit, workers)] = timed_extract(path, os.path.join(tmp, f"run{per_unit}-{workers}"),
                                                                        pdf_cfg, workers)
            rows.append((name, per_unit, workers, seconds, seconds - mapped))
        same = len(set(texts.values())) == 1
    load = os.getloadavg()
    lines = [f"## Long PDF in page ranges (`bench/pdf_ranges.py --pages {args.pages} --per-unit {args.per_unit} "
             f"--workers {args.workers}{' --scan' if args.scan else ''}`), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"{args.pages} {'image-only pages read by OCR (`ocr_languages: [spa]`)' if args.scan else 'text-layer pages (`ocr: never`)'}; load average {load[0]:.1f} on {os.cpu_count()} cores. "
             f"Page-count probe in the PDF child: {cold * 1000:.0f} ms cold (child start), {warm * 1000:.1f} ms warm. "
             f"Same document text split and whole: **{same}**.", "",
             "| read as | pages per unit | threads | extract wall s | of which join s | vs anchor |", "|---|---:|---:|---:|---:|---:|"]
    base = rows[0][3]
    for name, per_unit, workers, seconds, join in rows:
        lines.append(f"| {name} | {per_unit or args.pages} | {workers} | {seconds:.2f} | "
                     f"{join:.2f} | {base / seconds:.2f}x |" if per_unit else
                     f"| {name} | {args.pages} | 1 | {seconds:.2f} | - | 1.00x |")
    print("\n".join(lines))
    if args.append:
        with open(args.append, "a") as fh:
            fh.write("\n" + "\n".join(lines) + "\n")
    if not same:
        sys.exit("the document differs split and whole")


if __name__ == "__main__":
    main()
