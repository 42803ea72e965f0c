r"""Cost model: wall time, disk and peak memory of a curate run at 10M and 100M documents on N
worker cores, projected from the per-stage costs `bench/million_docs.py` measured (and the
perplexity student's throughput from bench/RESULTS.md). Everything it prints is a PROJECTION.

Model (each assumption is printed with the table):
- a per-document stage costs `core-seconds per document` measured here (the run's CPU seconds split
  over its stages by their share of task time, since the machine was shared); it runs on all N
  cores at once (shards and plan partitions are independent tasks: at 100M documents there are
  thousands of each), so its wall time is documents x cost / N;
- dedup's combine and commit are single tasks: their time grows with the documents (measured per
  document at the largest size, as CPU time: wall time x the share of a core the run got) and does
  not shrink with N;
- memory per worker is what one worker process held at the largest measured size (a shard, a plan
  partition: both bounded by configuration, not by the run); the combine's memory grows with the
  duplicates it decides (bytes per removed document, stated below);
- disk is the bytes written per document at the largest size (run folder + dedup index), times the
  documents; the input is not counted.

    .venv/bin/python bench/cost_model.py --measured bench/million_results.json   (written by bench/million_docs.py)
        [--cores 16,64,256] [--docs 10000000,100000000] [--ppl-docs-per-s 480 --ppl-cores 1]
        [--pdf-text-pages-per-s 268 --pdf-ocr-pages-per-s 0.33] [--append bench/RESULTS.md]
        [--html-pages-per-core-s 95 --html-kept-share 0.9] [--crawl bench/crawl_results.json]

With `--html-pages-per-core-s` (extract's pages per core-second on WARC input,
bench/extract_throughput.py --warc-pages) the same projection is made for a crawl: extract costs
that per page, and the later stages see the share of pages extraction keeps (`--html-kept-share`).
With `--crawl` (bench/crawl_cost.py's results) every stage's cost per page is the one measured on
WARC input instead.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

COMBINE_BYTES_PER_REMOVED = 400      # Python dict entries of the combine: group, decision, twin id (estimate)
GPU_EFFECTIVE_FLOPS = 100e12         # H100 bf16 at ~10% of peak for a 2-layer student: an assumption
# the shipped student (configs/ppl/smollm2-shared.yaml): 2 layers of d_model 256 and d_ff 1024, ~2.1M
# non-embedding parameters (embedding lookups cost no FLOPs), over the teacher's first 128 tokens
STUDENT_FLOP_PARAMS = 2.1e6
STUDENT_TOKENS = 128
TOKENIZER_TOKENS_PER_CORE_S = 290_000   # HF tokenizers encode_batch, ~580k tokens/s on 2 threads here
# extract's PDF path, per core (bench/pdf_extraction.py, bench/RESULTS.md "PDF extraction")
PDF_TEXT_PAGES_PER_CORE_S = 268.0
PDF_OCR_PAGES_PER_CORE_S = 0.33


def pdf_lines(text_pages_per_s: float, ocr_pages_per_s: float, cores: list[int]) -> list[str]:
    """Extract's PDF pages: each page costs 1 / pages-per-core-second; a PDF is a work unit of its
    own, and a long one units of `extract.pdf.pages_per_unit` pages (tasks/reading/pdf_ranges.py), so pages
    spread over all cores (a projection from bench/pdf_extraction.py's figures)."""
    out = [f"**PDF pages in extract** (projection; measured per core by `bench/pdf_extraction.py`: text layer "
           f"{text_pages_per_s:g} pages/s, OCR at 300 dpi {ocr_pages_per_s:g} pages/s)", "",
           "| pages | " + " | ".join(f"{n} cores" for n in cores) + " |", "|---|" + "---:|" * len(cores)]
    for what, rate in (("1M text-layer pages", text_pages_per_s), ("1M scanned pages (OCR)", ocr_pages_per_s)):
        out.append(f"| {what} | " + " | ".join(hours(1e6 / rate / n) for n in cores) + " |")
    return out + [""]


def per_doc_costs(measured: dict) -> dict:
    rows = measured["rows"]
    curate = max((r for r in rows if r["what"].startswith("curate (extract")), key=lambda r: r["n"])
    dedup = max((r for r in rows if r["what"] == "dedup stage alone"), key=lambda r: r["n"])
    full = next((r for r in rows if r["what"].startswith("curate, default stages")), None)
    out: dict[str, dict] = {}
    # extract + dedup: the curate run's CPU seconds split by the stages' task seconds
    task_s = sum(v["seconds"] for v in curate["stages"].values())
    for name, v in curate["stages"].items():
        out[name] = {"core_s_per_doc": curate["cpu_seconds"] * v["seconds"] / task_s / curate["n"],
                     "measured_at": curate["n"], "docs_in_share": v["input_docs"] / curate["n"]}
    # dedup's serial parts (combine, commit), from the dedup-alone run at its largest size: their
    # wall seconds times the share of a core the run got on the shared machine (its CPU / wall)
    ph = dedup["phases"]
    share = dedup["cpu_seconds"] / dedup["seconds"]
    out["dedup"]["serial_s_per_doc"] = (ph["combine"] + ph["commit"]) * share / dedup["n"]
    out["dedup"]["removed_share"] = (dedup["exact_dup"] + dedup["near_dup"]) / dedup["n"]
    # the other default stages, from the sample run (same split of its CPU seconds)
    if full:
        task_s = sum(v["seconds"] for v in full["stages"].values())
        for name, v in full["stages"].items():
            if name in out:
                continue
            out[name] = {"core_s_per_doc": full["cpu_seconds"] * v["seconds"] / task_s / max(v["input_docs"], 1),
                         "measured_at": full["n"], "docs_in_share": v["input_docs"] / full["n"]}
    return {"stages": out, "curate": curate, "dedup": dedup}


def project(costs: dict, docs: int, cores: int, ppl_core_s: float) -> dict:
    stages = {}
    for name, c in costs["stages"].items():
        n = docs * c["docs_in_share"]
        wall = n * c["core_s_per_doc"] / cores + n * c.get("serial_s_per_doc", 0.0)
        stages[name] = wall
    stages["perplexity (student, CPU)"] = docs * 0.6 * ppl_core_s / cores   # ~60% of documents reach it
    curate = costs["curate"]
    disk = docs * curate["disk_bytes"] / curate["n"]
    worker_mem = curate["peak_rss"]          # one process held extract + dedup of the largest run
    combine_mem = docs * costs["stages"]["dedup"]["removed_share"] * COMBINE_BYTES_PER_REMOVED
    bound = max(stages, key=stages.get)
    return {"stages": stages, "total": sum(stages.values()), "bound": bound, "disk": disk,
            "worker_mem": worker_mem, "combine_mem": combine_mem}


def warc_lines(costs: dict, pages_per_core_s: float, kept: float, cores: list[int], pages: int, ppl_core_s: float) -> list[str]:
    """The projection for a crawl of `pages` HTML pages: extract at the measured WARC rate, every
    later stage on the share of pages extraction keeps (as a share of its JSONL documents)."""
    import copy
    warc = copy.deepcopy(costs)
    for name, c in warc["stages"].items():
        c["docs_in_share"] *= kept
    warc["stages"]["extract"] = {"core_s_per_doc": 1 / pages_per_core_s, "docs_in_share": 1.0}
    projs = [project(warc, pages, n, ppl_core_s * kept) for n in cores]
    lines = [f"**A crawl: {pages:,} HTML pages from WARC** (projection): extract at {pages_per_core_s:,.1f} pages per "
             f"core-second (measured on WARC input, bench/extract_throughput.py), the later stages on the "
             f"{kept:.0%} of pages it keeps", "",
             "| stage | " + " | ".join(f"{n} cores" for n in cores) + " |", "|---|" + "---:|" * len(cores)]
    for name in projs[0]["stages"]:
        lines.append(f"| {name} | " + " | ".join(hours(p["stages"][name]) for p in projs) + " |")
    lines.append("| **total (stages one after another)** | " + " | ".join(f"**{hours(p['total'])}**" for p in projs) + " |")
    lines.append("| bounding stage (WARC input) | " + " | ".join(p["bound"] for p in projs) + " |")
    return lines + [""]


def crawl_lines(crawl: dict, costs: dict, cores: list[int], pages: int) -> list[str]:
    """The projection for a crawl of `pages` pages from the WARC run that bench/crawl_cost.py
    measured (its largest size): each stage of the shipped config at its measured core-seconds per
    input page, on all cores at once, plus dedup's serial combine + commit (per document reaching
    it, from the million-document run); and per PDF page from its PDF run."""
    warcs = [r for r in crawl["rows"] if r["what"].startswith("WARC")]
    # a run whose CPU counts only reaped children (before the sampled count) undercounts the extract
    # stage's long-lived HTML child: its memory, disk and wall time stand, its CPU is not projected
    counted = [r for r in warcs if "cpu_sampled" in r] or warcs
    warc = max(counted, key=lambda r: r["n"], default=None)
    serial = costs["stages"]["dedup"].get("serial_s_per_doc", 0.0)

    def per_page(row: dict) -> dict[str, tuple[float, float]]:
        task_s = sum(v["seconds"] for v in row["stages"].values()) or 1e-9
        return {name: (row["cpu_seconds"] * v["seconds"] / task_s / row["n"], v["input_docs"] / row["n"])
                for name, v in row["stages"].items()}

    return (warc_run_lines(warc, per_page, serial, cores, pages, crawl.get("config")) if warc else []) + \
        growth_lines(counted, per_page) + size_lines(warcs) + pdf_run_lines(crawl, per_page, cores)


def size_lines(warcs: list[dict]) -> list[str]:
    """Memory, disk and wall time at each WARC size measured (every run, whatever its CPU count)."""
    rows = sorted(warcs, key=lambda r: r["n"])
    if len(rows) < 2:
        return []
    return ["Memory, disk and wall clock at each size measured:", "",
            "| pages | peak RSS of the run's tree (GiB) | disk with every intermediate (MiB) | bytes per page | wall s | "
            "load (1 min) before / after |", "|---:|---:|---:|---:|---:|---|"] + \
        [f"| {r['n']:,} | {r['tree_peak_rss'] / 2**30:.2f} | {r['disk_bytes'] / 2**20:,.0f} | {r['disk_bytes'] / r['n']:,.0f} | "
         f"{r['seconds']:,.0f} | {r['load_before']:.1f} / {r['load_after']:.1f} |" for r in rows] + [""]


def growth_lines(warcs: list[dict], per_page) -> list[str]:
    """CPU ms per page of every stage at each WARC size measured: does the cost grow with size?"""
    rows = sorted(warcs, key=lambda r: r["n"])
    if len(rows) < 2:
        return []
    costs = [per_page(r) for r in rows]
    out = ["CPU ms per page at each size measured (each size its own run; growth = largest / smallest):", "",
           "| stage | " + " | ".join(f"{r['n']:,} pages" for r in rows) + " | growth |", "|---|" + "---:|" * (len(rows) + 1)]
    for name in costs[-1]:
        ms = [c.get(name, (0.0, 0.0))[0] * 1e3 for c in costs]
        growth = f"{ms[-1] / ms[0]:.2f}x" if ms[0] else "-"
        out.append(f"| {name} | " + " | ".join(f"{m:.2f}" for m in ms) + f" | {growth} |")
    tot = [sum(c for c, _ in cs.values()) * 1e3 for cs in costs]
    out.append("| **every stage** | " + " | ".join(f"**{t:.2f}**" for t in tot) + f" | **{tot[-1] / tot[0]:.2f}x** |")
    out.append("| peak RSS of the run's tree (GiB) | " + " | ".join(f"{r['tree_peak_rss'] / 2**30:.2f}" for r in rows) + " | |")
    out.append("| load (1 min) before / after | " + " | ".join(f"{r['load_before']:.1f} / {r['load_after']:.1f}" for r in rows)
               + " | |")
    return out + [""]


def warc_run_lines(warc: dict, per_page, serial: float, cores: list[int], pages: int, config: str | None) -> list[str]:

    out = [f"**A crawl of {pages:,} pages from WARC, every stage of {config or 'the shipped config'}** "
           f"(projection from `bench/crawl_cost.py` at {warc['n']:,} pages, {warc['at']}: the run's CPU seconds split "
           f"over its stages by task time; dedup's serial part {serial * 1e6:.1f} µs per document reaching it, from the "
           "million-document run)", "",
           "| stage | CPU ms per page | share of pages reaching it | " + " | ".join(f"{n} cores" for n in cores) + " |",
           "|---|---:|---:|" + "---:|" * len(cores)]
    totals = [0.0] * len(cores)
    for name, (cost, share) in per_page(warc).items():
        walls = [pages * cost / n + (pages * share * serial if name == "dedup" else 0.0) for n in cores]
        totals = [t + w for t, w in zip(totals, walls)]
        out.append(f"| {name} | {cost * 1e3:.2f} | {share:.0%} | " + " | ".join(hours(w) for w in walls) + " |")
    out.append("| **total (stages one after another)** | | | " + " | ".join(f"**{hours(t)}**" for t in totals) + " |")
    bound = max(per_page(warc).items(), key=lambda kv: kv[1][0])[0]
    out += ["", f"Bounding stage on WARC input: **{bound}**. Disk: {warc['disk_bytes'] / warc['n']:,.0f} bytes per page with "
            f"every stage's intermediate kept ({pages * warc['disk_bytes'] / warc['n'] / 1e12:,.2f} TB for {pages:,} pages; "
            f"without `keep_intermediate` only curated/ and removed/ stay). Peak memory of the run's process tree: "
            f"{warc['tree_peak_rss'] / 2**30:.2f} GiB at {warc['n']:,} pages.", ""]
    return out


def pdf_run_lines(crawl: dict, per_page, cores: list[int]) -> list[str]:
    out = []
    for row in (r for r in crawl["rows"] if r["what"].startswith("PDF")):
        costs_pdf = per_page(row)
        bound_pdf = max(costs_pdf.items(), key=lambda kv: kv[1][0])[0]
        total = sum(c for c, _ in costs_pdf.values())
        out += [f"PDF pages (text layers; `bench/crawl_cost.py --pdf`, {row['n']:,} pages of every shared PDF): "
                f"{total * 1e3:.1f} CPU ms per page over every stage ("
                + ", ".join(f"{k} {c * 1e3:.2f}" for k, (c, _) in costs_pdf.items())
                + f"), bounding stage **{bound_pdf}**; 10^6 text-layer pages: "
                + ", ".join(f"{hours(1e6 * total / n)} on {n} cores" for n in cores) + ". Fixed costs (Prefect, imports, "
                "model loads) are inside these figures at this size.", ""]
    return out


def hours(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:,.1f} h"
    return f"{s / 60:,.0f} min" if s >= 60 else f"{s:,.0f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured", type=Path, required=True, help="million-results.json of bench/million_docs.py")
    ap.add_argument("--cores", default="16,64,256")
    ap.add_argument("--docs", default="10000000,100000000")
    ap.add_argument("--ppl-docs-per-s", type=float, default=480.0, help="student docs/s on one machine (bench/RESULTS.md)")
    ap.add_argument("--ppl-cores", type=int, default=1, help="cores (threads) that rate was measured on")
    ap.add_argument("--pdf-text-pages-per-s", type=float, default=PDF_TEXT_PAGES_PER_CORE_S,
                    help="PDF pages per core-second read from the text layer (bench/pdf_extraction.py)")
    ap.add_argument("--pdf-ocr-pages-per-s", type=float, default=PDF_OCR_PAGES_PER_CORE_S,
                    help="PDF pages per core-second read by OCR at 300 dpi (bench/pdf_extraction.py)")
    ap.add_argument("--html-pages-per-core-s", type=float, help="extract on WARC input: pages per core-second")
    ap.add_argument("--html-kept-share", type=float, default=1.0, help="share of WARC pages that extraction keeps")
    ap.add_argument("--crawl", type=Path, help="crawl_results.json of bench/crawl_cost.py: the crawl projection from it")
    ap.add_argument("--append", type=Path)
    args = ap.parse_args()
    measured = json.loads(args.measured.read_text())
    costs = per_doc_costs(measured)
    ppl_core_s = args.ppl_cores / args.ppl_docs_per_s
    cores = [int(x) for x in args.cores.split(",")]
    sizes = [int(x) for x in args.docs.split(",")]
    lines = [f"## Cost model: 10M and 100M documents (`bench/cost_model.py`), PROJECTION, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"Command: `python bench/cost_model.py --measured {args.measured} --cores {args.cores} --docs {args.docs} "
             f"--ppl-docs-per-s {args.ppl_docs_per_s:g} --ppl-cores {args.ppl_cores}`", "",
             "**Every figure in this section is a projection** from the costs measured by `bench/million_docs.py` "
             f"({measured['command']}; machine `{measured['uptime']}`), not a run at these sizes.", "",
             "Measured per-document costs (core-seconds; the run's CPU seconds split over its stages by task time):", ""]
    for name, c in costs["stages"].items():
        extra = f", serial {c['serial_s_per_doc'] * 1e6:.1f} µs/doc (combine + commit)" if "serial_s_per_doc" in c else ""
        lines.append(f"- {name}: {c['core_s_per_doc'] * 1e3:.3f} ms/doc ({1 / c['core_s_per_doc']:,.0f} docs per core-second), "
                     f"measured at {c['measured_at']:,} docs, {c['docs_in_share']:.0%} of the documents reach it{extra}")
    lines.append(f"- perplexity student: {args.ppl_docs_per_s:g} docs/s on {args.ppl_cores} cores (bench/RESULTS.md, "
                 f"Perplexity) = {1 / ppl_core_s:,.0f} docs per core-second; assumed to see 60% of the documents")
    lines.append("")
    for d in sizes:
        lines += [f"**{d:,} documents** (projection)", "",
                  "| stage | " + " | ".join(f"{n} cores" for n in cores) + " |",
                  "|---|" + "---:|" * len(cores)]
        projs = [project(costs, d, n, ppl_core_s) for n in cores]
        for name in projs[0]["stages"]:
            lines.append(f"| {name} | " + " | ".join(hours(p["stages"][name]) for p in projs) + " |")
        lines.append("| **total (stages one after another)** | " + " | ".join(f"**{hours(p['total'])}**" for p in projs) + " |")
        lines.append("| bounding stage | " + " | ".join(p["bound"] for p in projs) + " |")
        p = projs[0]
        lines += ["", f"Disk written: {p['disk'] / 1e12:,.2f} TB (run folder + dedup index, {costs['curate']['disk_bytes'] / costs['curate']['n']:,.0f} "
                  f"bytes/doc measured for extract + dedup; other stages' outputs add theirs). Peak memory: "
                  f"{p['worker_mem'] / 2**30:.1f} GiB per worker process (bounded by shard size and `partition_rows`, "
                  f"not by the run), and {p['combine_mem'] / 2**30:.1f} GiB in dedup's combine task "
                  f"({COMBINE_BYTES_PER_REMOVED} bytes per removed document, {costs['stages']['dedup']['removed_share']:.0%} removed).", ""]
    if args.html_pages_per_core_s:
        lines += warc_lines(costs, args.html_pages_per_core_s, args.html_kept_share, cores, sizes[-1], ppl_core_s)
    if args.crawl:
        lines += crawl_lines(json.loads(args.crawl.read_text()), costs, cores, sizes[-1])
    lines += pdf_lines(args.pdf_text_pages_per_s, args.pdf_ocr_pages_per_s, cores)
    tok_docs_core = TOKENIZER_TOKENS_PER_CORE_S / STUDENT_TOKENS
    gpu_docs = GPU_EFFECTIVE_FLOPS / (2 * STUDENT_FLOP_PARAMS * STUDENT_TOKENS)
    lines += [f"**A GPU (projection, not measured: this machine has none).** The student's body is ~{STUDENT_FLOP_PARAMS / 1e6:.1f}M "
              f"parameters over {STUDENT_TOKENS} tokens: ~{2 * STUDENT_FLOP_PARAMS * STUDENT_TOKENS / 1e9:.1f} GFLOP per document, so "
              f"one H100 at an assumed {GPU_EFFECTIVE_FLOPS / 1e12:.0f} TFLOP/s effective would score ~{gpu_docs:,.0f} docs/s; tokenising "
              f"(~{tok_docs_core:,.0f} docs per core-second) then bounds it, so a GPU machine with 16 cores feeds it "
              f"~{16 * tok_docs_core:,.0f} docs/s: 100M documents in ~{1e8 * 0.6 / (16 * tok_docs_core) / 3600:.1f} h on one GPU "
              f"instead of the CPU figure above. Perplexity stops being the bound; the CPU stages (heuristics first) remain.", ""]
    md = "\n".join(lines) + "\n"
    print(md)
    if args.append:
        with open(args.append, "a") as fh:
            fh.write("\n" + md)


if __name__ == "__main__":
    main()
