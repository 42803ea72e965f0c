r"""HTML extraction: quipu's extract stage, trafilatura, resiliparse and a union, on the same pages
in one run: pages per core-second, token F1 against human annotation, kept tokens.

Page sets (all HTML responses, read with quipu's WARC reader):
- `annotated`: ../shared/data/web/constructed (100 real news/blog pages, scrapinghub's
  article-extraction-benchmark, with the annotated article body): token F1 (bag of words, as
  tests/test_extract.py). The guard's rules were chosen on the first 50 of these (sorted by URL):
  F1 is printed for both halves, and the second half plus the other sets are the held-out evidence.
- `crawl`: every text/html response of the real WARC/ARC test files in ../shared/data/web (185
  pages of other crawls, no annotation): kept tokens, agreement with trafilatura.
- `demo-<lang>`: the demo's pages (real en/es/pt text wrapped in cookie banner, nav, sidebar and
  footer: synthetic/corpus.py) with the article text as truth: F1, and how many pages leak boilerplate.

Extractors, each called in this process on the decoded page (CPU seconds, `time.process_time`):
- `trafilatura-precision` (the anchor): `trafilatura.extract(html, url=url, favor_precision=True)`;
- `trafilatura`: the stage's `html_extractor: trafilatura` (fallback extractors, no comments);
- `resiliparse`: `extract_plain_text(main_content=True)`, defaults otherwise;
- `quipu-fast`: the stage's default path (tasks/reading/html_text.py: resiliparse + guard -> trafilatura);
- `union`: quipu-fast and trafilatura both run; the one with more prose words is kept.
Then the extract stage itself (1 worker: the child process extracts, the parent reads the WARC and
writes parquet) over the annotated WARC, wall-clock, in both modes, against the anchor's wall-clock
on the same pages. Rounds alternate; the best round of each counts (the machine is shared).

Last, with `--warc-pages N`: a WARC of N response records made from the shared pages above
(each page repeated under its own URL, per-record gzip, warcio's writer) read by the stage in both
modes: pages per core-second of the whole stage (this process + its extraction child: CPU time),
the input to bench/cost_model.py's WARC projection.

With `--cold`, only this: each arm in a fresh process per round, as a one-off check runs it (the
anchor process imports trafilatura and decodes the pages before its clock starts; the stage's clock
starts at the call, so the child's start and the stage's first imports count), on the annotated
pages, the same cycled to 500 and the crawl pages, round 1 shown apart.

    .venv/bin/python bench/extract_throughput.py [--rounds 2] [--warc-pages 5000]
    .venv/bin/python bench/extract_throughput.py --cold --rounds 5
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
WEB = ROOT.parent / "shared" / "data" / "web"
from quipu.tasks.reading.html_text import prose_words  # noqa: E402

ANNOTATED = WEB / "constructed" / "article-extraction-benchmark-shared"


def token_f1(pred: str | None, gold: str) -> float:
    from quipu.synthetic.pdfs import token_f1 as f1     # bag of words, as tests/test_extract.py
    return f1(pred or "", gold)


def html_pages(path: Path) -> list[tuple[str, bytes | str]]:
    from quipu.tasks.extract import html_for_parser
    from quipu.tasks.reading import ReadStats, read
    return [(r.url, html_for_parser(r.payload, r.content_type)) for r in read(str(path), ReadStats())
            if getattr(r, "kind", None) == "html" and r.payload]


def page_sets() -> dict[str, tuple[list, dict | None]]:
    gold = {j["url"]: j["articleBody"] for j in map(json.loads, open(f"{ANNOTATED}.ground_truth.jsonl"))}
    sets = {"annotated": (html_pages(Path(f"{ANNOTATED}.warc.gz")), gold)}
    from quipu.tasks.reading import reader_kind
    sets["crawl"] = ([p for f in sorted(WEB.iterdir()) if f.is_file() and reader_kind(str(f)) == "warc" for p in html_pages(f)], None)
    sets.update(demo_sets())
    return sets


def demo_sets() -> dict[str, tuple[list, dict]]:
    import random

    from quipu.synthetic.corpus import SEED, DocumentPlan, PageRenderer
    docs = [d for d in DocumentPlan(1.0, SEED).build() if d.channel == "warc" and d.kind == "article"]
    renderer = PageRenderer(random.Random(SEED))
    out: dict[str, tuple[list, dict]] = {}
    for i, d in enumerate(docs):
        url = f"https://{d.site.name.lower().replace(' ', '')}.example{d.path}#{i}"
        pages, gold = out.setdefault(f"demo-{d.lang}", ([], {}))
        pages.append((url, renderer.render(d, docs[max(0, i - 3):i]).decode()))
        gold[url] = d.plain()
    return out


def extractors() -> dict:
    import trafilatura
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    from quipu.tasks.reading import html_text
    from quipu.tasks.extract import ExtractConfig
    cfg = ExtractConfig()
    opts = dict(include_comments=cfg.include_comments, include_tables=cfg.include_tables,
                favor_precision=cfg.favor_precision, favor_recall=cfg.favor_recall)

    def fast(h, u):
        return html_text.main_text(h, u, "fast", opts, cfg.fast_min_prose)[0]

    def union(h, u):
        a, b = fast(h, u), html_text.trafilatura_text(h, u, opts, fast=False)
        return max((a or "", b or ""), key=lambda t: html_text.prose_words(t)[0])

    return {
        "trafilatura-precision": lambda h, u: trafilatura.extract(h, url=u, favor_precision=True),
        "trafilatura": lambda h, u: html_text.main_text(h, u, "trafilatura", opts, 0)[0],
        "resiliparse": lambda h, u: extract_plain_text(HTMLTree.parse(html_text._decoded(h)), main_content=True),
        "quipu-fast": fast,
        "union": union,
    }


def run_extractors(sets: dict, rounds: int) -> dict:
    fns = extractors()
    results: dict = {}
    for name, (pages, gold) in sets.items():
        for ex, fn in fns.items():
            best, out = None, None
            for _ in range(rounds):
                t0 = time.process_time()
                got = {u: fn(h, u) for u, h in pages}
                dt = time.process_time() - t0
                best, out = (dt, got) if best is None or dt < best else (best, out)
            results[(name, ex)] = {"pages": len(pages), "cpu_s": best, "out": out}
    return results


def leaks(text: str | None) -> bool:
    """Boilerplate of the demo's pages (cookie banner, nav, footer) in the text."""
    from quipu.synthetic.corpus import BOILERPLATE
    t = text or ""
    return any(bp["cookie"] in t or bp["legal"][1] in t for bp in BOILERPLATE.values())


def table(sets: dict, results: dict) -> list[str]:
    lines = ["| pages | n | extractor | pages / core-s | x anchor | token F1 | F1 x anchor | F1 first / second half | words kept | prose words kept | demo pages leaking boilerplate |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, (pages, gold) in sets.items():
        anchor = results[(name, "trafilatura-precision")]
        a_rate = anchor["pages"] / anchor["cpu_s"]
        a_f1 = sum(token_f1(anchor["out"][u], g) for u, g in gold.items()) / len(gold) if gold else None
        for ex in extractors():
            r = results[(name, ex)]
            rate = r["pages"] / r["cpu_s"]
            f1 = sum(token_f1(r["out"][u], g) for u, g in gold.items()) / len(gold) if gold else None
            halves = ""
            if name == "annotated":
                us = sorted(gold)
                halves = " / ".join(f"{sum(token_f1(r['out'][u], gold[u]) for u in part) / len(part):.4f}" for part in (us[:50], us[50:]))
            words = sum(len((t or "").split()) for t in r["out"].values())
            prose = sum(prose_words(t or "")[0] for t in r["out"].values())
            leak = sum(leaks(t) for t in r["out"].values()) if name.startswith("demo") else ""
            lines.append(f"| {name} | {r['pages']} | {ex} | {rate:,.1f} | {rate / a_rate:.2f} | "
                         f"{'' if f1 is None else f'{f1:.4f}'} | {'' if f1 is None else f'{f1 / a_f1:.3f}'} | {halves} | "
                         f"{words:,} | {prose:,} | {leak} |")
    return lines


def _cpu_seconds() -> float:
    """CPU of this process and its reaped children (the extraction child is reaped by `stop`)."""
    import resource
    return sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))


def stage_vs_anchor(rounds: int) -> list[str]:
    """The extract stage (1 worker) over the annotated WARC, wall-clock and CPU (this process + its
    extraction child), against the anchor's over the same pages (decoded as the stage does),
    alternating. The first round of the stage is also shown apart: it pays this process's first
    imports (warcio, ftfy, pandas via pyarrow), as a fresh `quipu` run does."""
    import trafilatura

    from quipu.tasks import extract
    pages = html_pages(Path(f"{ANNOTATED}.warc.gz"))
    best: dict[str, tuple[float, float]] = {}
    first: dict[str, tuple[float, float]] = {}
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), _cpu_seconds()
        for u, h in pages:
            trafilatura.extract(h, url=u, favor_precision=True)
        got = {"anchor": (time.perf_counter() - t0, _cpu_seconds() - c0)}
        for mode in ("fast", "trafilatura"):
            with tempfile.TemporaryDirectory() as tmp:
                t0, c0 = time.perf_counter(), _cpu_seconds()      # child start-up included: a fresh worker each round
                extract.extract_file(f"{ANNOTATED}.warc.gz", tmp, extract.ExtractConfig(html_extractor=mode))
                extract._extractor().stop()
                extract._local.extractor = None
                got[mode] = (time.perf_counter() - t0, _cpu_seconds() - c0)
        for key, v in got.items():
            first.setdefault(key, v)
            best[key] = min(best.get(key, v), v)
    n = len(pages)
    rows = []
    for what, key in (("trafilatura.extract(favor_precision=True), in process (anchor)", "anchor"),
                      ("extract stage, html_extractor: fast (default)", "fast"),
                      ("extract stage, html_extractor: trafilatura", "trafilatura")):
        (w, c), (w1, c1) = best[key], first[key]
        rows.append(f"| {what} | {n} | {w:.2f} | {n / w:.1f} | {best['anchor'][0] / w:.2f} | {c:.2f} | {best['anchor'][1] / c:.2f} | "
                    f"{w1:.2f} ({first['anchor'][0] / w1:.2f}x) |")
    return rows


def crawl_files() -> list[Path]:
    from quipu.tasks.reading import reader_kind
    return sorted(f for f in WEB.iterdir() if f.is_file() and reader_kind(str(f)) == "warc")


def build_warc(path: Path, n: int, files: list[Path] | None = None) -> int:
    """A WARC of `n` HTML responses cycling through the HTML pages of `files` (default: the shared
    pages, annotated + crawl), each under its own URL. Returns its size in bytes."""
    import io

    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    from quipu.tasks.reading import ReadStats, read
    files = files or [Path(f"{ANNOTATED}.warc.gz")] + crawl_files()
    pages = [(r.url, r.payload, r.content_type or "text/html") for f in files for r in read(str(f), ReadStats())
             if getattr(r, "kind", None) == "html" and r.payload]
    with open(path, "wb") as fh:
        w = WARCWriter(fh, gzip=True)
        for i in range(n):
            url, body, ctype = pages[i % len(pages)]
            http = StatusAndHeaders("200 OK", [("Content-Type", ctype), ("Content-Length", str(len(body)))], protocol="HTTP/1.1")
            w.write_record(w.create_warc_record(f"{url}#{i}", "response", payload=io.BytesIO(body), length=len(body),
                                                http_headers=http, warc_headers_dict={"WARC-Date": "2020-01-01T00:00:00Z"}))
    return path.stat().st_size


def stage_on_warc(n: int) -> list[str]:
    """The extract stage over an n-page WARC in both modes: wall, and CPU of this process plus the
    extraction child (reaped before it is read)."""
    import resource

    from quipu.tasks import extract
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        warc = Path(tmp) / "pages.warc.gz"
        size = build_warc(warc, n)
        for mode in ("fast", "trafilatura"):
            out = Path(tmp) / mode
            r0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
            res = extract.extract_file(str(warc), out, extract.ExtractConfig(html_extractor=mode))
            extract._extractor().stop()
            extract._local.extractor = None
            wall = time.perf_counter() - t0
            r1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = sum(getattr(b, f) - getattr(a, f) for a, b in ((r0, r1), (c0, c1)) for f in ("ru_utime", "ru_stime"))
            rows.append(f"| {mode} | {n:,} ({size / 1e6:,.0f} MB) | {res.kept_docs:,} | {wall:.1f} | {cpu:.1f} | {n / cpu:,.1f} | "
                        f"{res.stats.get('html_extractor', {})} |")
    return ["| html_extractor | pages (WARC size) | kept | wall s | CPU s (stage + child) | pages per core-second | path taken |",
            "|---|---|---|---|---|---|---|"] + rows


def cold_child(arm: str, warc: str) -> None:
    """One cold measurement in this fresh process, printed as JSON: `anchor` imports trafilatura and
    decodes the pages first, then times trafilatura.extract(favor_precision=True) over them;
    `stage` imports quipu's extract stage first, then times extract_file from the call to its
    output (child start-up included, the child's CPU counted once it is reaped)."""
    if arm == "anchor":
        import trafilatura
        pages = html_pages(Path(warc))
        t0, c0 = time.perf_counter(), _cpu_seconds()
        for u, h in pages:
            trafilatura.extract(h, url=u, favor_precision=True)
    else:
        from quipu.tasks import extract
        tmp = tempfile.mkdtemp()
        t0, c0 = time.perf_counter(), _cpu_seconds()
        res = extract.extract_file(warc, tmp, extract.ExtractConfig())
        extract._extractor().stop()
    print(json.dumps({"wall": time.perf_counter() - t0, "cpu": _cpu_seconds() - c0,
                      **({} if arm == "anchor" else {"paths": res.stats.get("html_extractor", {})})}))


def cold_rows(rounds: int) -> list[str]:
    """Each arm in a fresh process per round (as a one-off check runs it), alternating anchor and
    stage, over: the 100 annotated pages, the same cycled to 500 (under new URLs), and the crawl
    pages (every HTML response of the shared WARC/ARC files, in one WARC)."""
    import statistics
    import subprocess
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        warcs = {"annotated": Path(f"{ANNOTATED}.warc.gz"), "annotated x5": Path(tmp) / "a500.warc.gz",
                 "crawl": Path(tmp) / "crawl.warc.gz"}
        build_warc(warcs["annotated x5"], 500, [warcs["annotated"]])
        crawl = html_pages_raw(crawl_files())
        build_warc(warcs["crawl"], crawl, crawl_files())
        for name, warc in warcs.items():
            got: dict[str, list[dict]] = {"anchor": [], "stage": []}
            for _ in range(rounds):
                for arm in got:
                    run = subprocess.run([sys.executable, __file__, "--cold-child", arm, str(warc)], capture_output=True, text=True)
                    if run.returncode:
                        sys.exit(f"{arm} on {name} failed:\n{run.stderr[-3000:]}")
                    got[arm].append(json.loads(run.stdout.strip().splitlines()[-1]))
            n = len(html_pages(warc))
            a, st = got["anchor"], got["stage"]
            ratio = [x["wall"] / y["wall"] for x, y in zip(a, st)]
            cpu_ratio = [x["cpu"] / y["cpu"] for x, y in zip(a, st)]
            rows.append(f"| {name} | {n} | {a[0]['wall']:.2f} / {a[0]['cpu']:.2f} | {st[0]['wall']:.2f} / {st[0]['cpu']:.2f} | "
                        f"{ratio[0]:.2f}x / {cpu_ratio[0]:.2f}x | {statistics.median(ratio):.2f}x / {statistics.median(cpu_ratio):.2f}x | "
                        f"{min(ratio):.2f}-{max(ratio):.2f}x / {min(cpu_ratio):.2f}-{max(cpu_ratio):.2f}x | {st[0]['paths']} |")
    return ["| pages | n | anchor, round 1: wall s / CPU s | stage, round 1: wall s / CPU s | round 1 x anchor: wall / CPU | "
            f"median of {rounds} rounds: wall / CPU | range: wall / CPU | stage's paths |", "|---|---|---|---|---|---|---|---|"] + rows


def html_pages_raw(files: list[Path]) -> int:
    """How many HTML pages `files` hold (build_warc's count for one pass over them)."""
    from quipu.tasks.reading import ReadStats, read
    return sum(1 for f in files for r in read(str(f), ReadStats()) if getattr(r, "kind", None) == "html" and r.payload)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warc-pages", type=int, default=0, help="also run the stage over a WARC of this many pages")
    ap.add_argument("--skip-extractors", action="store_true", help="only the stage rows")
    ap.add_argument("--cold", action="store_true", help="only the cold rows: each arm in a fresh process per round")
    ap.add_argument("--cold-child", nargs=2, metavar=("ARM", "WARC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.cold_child:
        return cold_child(*args.cold_child)
    if not WEB.is_dir():
        sys.exit(f"needs the shared real data at {WEB}")
    print(f"load before: {os.getloadavg()}", flush=True)
    if args.cold:
        print("\n".join(cold_rows(args.rounds)) + f"\nload after: {os.getloadavg()}")
        return
    if not args.skip_extractors:
        sets = page_sets()
        results = run_extractors(sets, args.rounds)
        print("\n".join(table(sets, results)), flush=True)
    print("\n| extract stage, 1 worker | pages | best wall s | pages/s | x anchor (wall) | CPU s (stage + child) | x anchor (CPU) | first round wall s (x anchor's first) |\n|---|---|---|---|---|---|---|---|")
    print("\n".join(stage_vs_anchor(args.rounds)), flush=True)
    if args.warc_pages:
        print(f"\nload: {os.getloadavg()}\n" + "\n".join(stage_on_warc(args.warc_pages)))
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
