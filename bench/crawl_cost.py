r"""The crawl cost model measured on WARC input: every stage of configs/curate/default.yaml over a
WARC of N pages built from the shared pages, and over the shared PDFs (issue 40, scope 5).

The WARC (built once per size, deterministic, `--data DIR`): page i is one of the 285 shared HTML
pages (the 100 annotated articles of web/constructed and the 185 text/html responses of the real
WARC/ARC files in web/), taken in turn, under its own URL. So that dedup does not collapse
copies of the same page, the text of its `<p>` elements is replaced by document i of
bench/million_docs.py's corpus (real en/es/pt/... paragraphs of ../shared/data/text, recombined;
12 % planted near and exact copies): its 2-6 paragraphs fill the page's first `<p>` elements, the
page's other `<p>` elements are emptied. Everything else (head, navigation, scripts, listings,
footers) is the page's own, so extraction does the same work; a page with fewer than two `<p>`
elements keeps its own text (a crawl's repeated boilerplate pages: dedup removes those copies).
Files of `--file-pages` records each, per-record gzip, warcio's writer.

Each run is one curate flow over the files with the shipped config as it is (`keep_intermediate`
on to measure each stage's disk, `dedup.index_dir` in the work folder), 2 workers, in a child
process (bench/million_docs.py's `run_child`: timing lock, CPU of the process tree, peak RSS).
Per stage: task seconds, its share of the run's CPU seconds (the run's CPU split by task time:
the machine is shared), the peak summed RSS while it ran (the window from the previous stage's
end to its own; fused stages share one window), and the bytes its folder holds.

The PDF run: the same over every PDF of ../shared/data/pdf with `extract.pdf.ocr=never` (text
layers only: a page without a usable one is dropped as `pdf:needs_ocr`; OCR's cost per page is
bench/pdf_extraction.py's), costs per page of those PDFs.

    .venv/bin/python bench/crawl_cost.py --data /tmp/quipu-crawl --pages 1000,100000 [--pdf]
        [--file-pages 10000] [--out bench/crawl_results.json]

bench/cost_model.py --crawl bench/crawl_results.json projects a crawl of 10^8 pages from it.
"""
from __future__ import annotations

import argparse
import html
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import million_docs  # noqa: E402

WEB = ROOT.parent / "shared" / "data" / "web"
PDF = ROOT.parent / "shared" / "data" / "pdf"
CONFIG = ROOT / "configs" / "curate" / "default.yaml"
ANNOTATED = WEB / "constructed" / "article-extraction-benchmark-shared.warc.gz"
PARAGRAPH = re.compile(rb"(<p\b[^>]*>)(.*?)(</p\s*>)", re.I | re.S)


def shared_pages() -> list[tuple[str, bytes, str]]:
    """(url, html bytes, content type) of every shared HTML response, annotated pages first."""
    from quipu.tasks.reading import ReadStats, read, reader_kind
    files = [ANNOTATED] + sorted(f for f in WEB.iterdir() if f.is_file() and reader_kind(str(f)) == "warc")
    pages = []
    for f in files:
        for r in read(str(f), ReadStats()):
            body = r.payload if getattr(r, "kind", None) == "html" else None     # a Quarantined record has no kind
            if body:
                pages.append((r.url, body if isinstance(body, bytes) else body.encode("utf-8"), r.content_type or "text/html"))
    return pages


def paragraph_split(page: bytes) -> list[bytes] | None:
    """`page` cut around its <p> elements ([before, open, body, close, between, ...]), or None when
    it has fewer than two: computed once per shared page (the regex costs ~30 ms on a large page)."""
    parts = PARAGRAPH.split(page)
    return parts if (len(parts) - 1) // 4 >= 2 else None


def varied(page: bytes, parts: list[bytes] | None, text: str) -> bytes:
    """`page` with its <p> elements holding `text`'s paragraphs (the rest emptied); unchanged when
    it has fewer than two <p> elements (`parts` from paragraph_split)."""
    if parts is None:
        return page
    paras = [html.escape(p).encode("utf-8") for p in text.split("\n\n") if p.strip()]
    out = parts[:]
    for j, k in enumerate(range(2, len(parts), 4)):   # [before, open, body, close, between, open, body, ...]
        out[k] = paras[j] if j < len(paras) else b""
    return b"".join(out)


def gzip6(plain):
    """warcio's per-record gzip writer class `plain`, at zlib's default level 6 (warcio uses 9, which
    costs ~3x the CPU on HTML and makes building 10^5 pages longer than curating them; Common Crawl's
    files are written at the default level)."""
    import zlib

    def make(out):
        w = plain(out)
        w.compressor = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS + 16)
        return w
    return make


def write_crawl_file(path: Path, first: int, last: int, n: int) -> None:
    """Pages first..last-1 of an n-page crawl as one WARC file (atomic: written to .tmp, renamed)."""
    import warcio.warcwriter as warcwriter
    from warcio.statusandheaders import StatusAndHeaders
    plain = warcwriter.GzippingWrapper
    warcwriter.GzippingWrapper = gzip6(plain)
    try:
        pages, corpus = shared_pages(), million_docs.Corpus(n)
        splits = [paragraph_split(body) for _, body, _ in pages]
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            w = warcwriter.WARCWriter(fh, gzip=True)
            for i in range(first, last):
                url, body, ctype = pages[i % len(pages)]
                body = varied(body, splits[i % len(pages)], corpus.text(i))
                http = StatusAndHeaders("200 OK", [("Content-Type", ctype), ("Content-Length", str(len(body)))],
                                        protocol="HTTP/1.1")
                w.write_record(w.create_warc_record(f"{url}#{i}", "response", payload=io.BytesIO(body), length=len(body),
                                                    http_headers=http, warc_headers_dict={"WARC-Date": "2020-01-01T00:00:00Z"}))
        tmp.rename(path)
    finally:
        warcwriter.GzippingWrapper = plain
    print(f"  wrote {path.name} ({path.stat().st_size / 1e6:,.0f} MB)", flush=True)


def build_crawl(data: Path, n: int, file_pages: int) -> list[Path]:
    """WARC files of n varied pages (see the module docstring), built in parallel (one process per
    file, as many as cores); files already written are kept: page i is the same in a crawl of any
    size, so crawls of several sizes share their files."""
    from concurrent.futures import ProcessPoolExecutor
    data.mkdir(parents=True, exist_ok=True)
    files = [data / f"crawl-{f0:07d}-{min(f0 + file_pages, n):07d}.warc.gz" for f0 in range(0, n, file_pages)]
    todo = [(f, f0, min(f0 + file_pages, n)) for f, f0 in zip(files, range(0, n, file_pages)) if not f.exists()]
    with ProcessPoolExecutor(max(1, min(len(todo), os.cpu_count() or 1))) as pool:
        for fut in [pool.submit(write_crawl_file, f, a, b, n) for f, a, b in todo]:
            fut.result()
    return files


def pdf_pages(files: list[Path]) -> int:
    import pypdfium2 as pdfium
    total = 0
    for f in files:
        try:
            total += len(pdfium.PdfDocument(str(f)))
        except Exception:      # encrypted or broken: extract quarantines it, no pages counted
            pass
    return total


def stage_rows(res: dict, unit: str) -> list[str]:
    n = res["n"]
    task_s = sum(v["seconds"] for v in res["stages"].values()) or 1e-9
    rows = []
    for name, v in res["stages"].items():
        cpu = res["cpu_seconds"] * v["seconds"] / task_s
        peak = v.get("tree_peak_rss")
        rows.append(f"| {name} | {v['input_docs']:,} | {v['kept_docs']:,} | {v['seconds']:,.1f} | {cpu:,.1f} | "
                    f"{cpu / n * 1e3:,.2f} | {million_docs.mib(peak) if peak else 'fused'} | "
                    f"{million_docs.mib(v.get('disk_bytes', 0))} |")
    return [f"| stage | {unit}s / docs in | kept | task s | CPU s (share) | CPU ms per {unit} | peak RSS MiB (tree, its window) | disk MiB |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"] + rows


def report(out: dict) -> str:
    lines = [f"Command: `{out['command']}`; machine {out['cores']} cores; `uptime` at the end: `{out['uptime']}`", ""]
    for r in out["rows"]:
        unit = "page"
        lines += [f"**{r['what']}**: {r['n']:,} {unit}s ({r['input_bytes'] / 1e6:,.0f} MB of input), wall {r['seconds']:,.1f} s, "
                  f"CPU {r['cpu_seconds']:,.1f} s ({r['n'] / r['cpu_seconds']:,.1f} {unit}s per core-second; reaped children "
                  f"only {r.get('cpu_rusage', float('nan')):,.1f} s, every descendant sampled {r.get('cpu_sampled', float('nan')):,.1f} s), peak RSS "
                  f"{million_docs.mib(r['peak_rss'])} MiB (process) / {million_docs.mib(r['tree_peak_rss'])} MiB (tree), "
                  f"disk {million_docs.mib(r['disk_bytes'])} MiB, curated rows {r['curated_rows']:,}; load before/after "
                  f"{r['load_before']:.1f} / {r['load_after']:.1f}", ""] + stage_rows(r, unit) + [""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "quipu-crawl")
    ap.add_argument("--pages", default="1000,100000", help="WARC sizes (comma list); each is its own run")
    ap.add_argument("--file-pages", type=int, default=10_000)
    ap.add_argument("--pdf", action="store_true", help="also the run over the shared PDFs")
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "crawl_results.json")
    args = ap.parse_args()
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "900")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_API_REQUEST_TIMEOUT", "600")     # a shared, loaded machine answers slowly
    work = Path(tempfile.mkdtemp(prefix="run-", dir=args.data.mkdir(parents=True, exist_ok=True) or args.data))
    os.environ["QUIPU_HOME"] = str(work / "quipu-home")
    os.environ["PREFECT_HOME"] = str(work / "prefect-home")
    out = {"command": "python bench/crawl_cost.py " + " ".join(sys.argv[1:]), "cores": os.cpu_count(),
           "config": str(args.config.relative_to(ROOT)), "rows": []}
    if args.out.exists():         # rows of earlier runs of other sizes stay (one size per run is fine)
        out["rows"] = [r for r in json.loads(args.out.read_text())["rows"]]

    def record(what: str, n: int, files: list[Path], res: dict) -> None:
        res.pop("removed", None)
        res.pop("removed_by_stage", None)
        res.update(what=what, n=n, input_bytes=sum(f.stat().st_size for f in files),
                   at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        out["rows"] = [r for r in out["rows"] if (r["what"], r["n"]) != (what, n)] + [res]
        out["uptime"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        args.out.write_text(json.dumps(out, indent=1, default=str))
        print(report({**out, "rows": [res]}), flush=True)

    if args.pdf:
        files = sorted(PDF.glob("*.pdf"))
        res = million_docs.run_child("curate", {"work": str(work / "pdf"), "files": [str(f) for f in files],
                                                "config": str(args.config), "set": ["extract.pdf.ocr=never"]})
        record("PDF (every shared PDF)", pdf_pages(files), files, res)
    for n in [int(x) for x in args.pages.split(",") if x]:
        t0 = time.perf_counter()
        files = build_crawl(args.data / "pages", n, args.file_pages)
        print(f"{n:,} pages ready in {time.perf_counter() - t0:.0f} s; load {os.getloadavg()}", flush=True)
        res = million_docs.run_child("curate", {"work": str(work / f"crawl-{n}"), "files": [str(f) for f in files],
                                                "config": str(args.config)})
        record("WARC (shared pages, varied)", n, files, res)


if __name__ == "__main__":
    main()
