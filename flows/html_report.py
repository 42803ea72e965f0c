"""`quipu report RUN --html`: one self-contained page (charts embedded as PNG data, no network) with
what a run did: the funnel, removal reasons and removed examples per stage, quality and perplexity
score histograms per language with the cut-offs marked, dedup cluster sizes and example pairs,
decontamination hits, line-dedup domains, quarantine reasons and the run's metadata.

Everything is read from what the run wrote (`run.json`, `<stage>/report.json`, and for perplexity
the score columns of its output shards), so the page of a finished run can be made at any time.
`charts()` is also what the curate flow attaches to the Prefect run as an artifact.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path

from quipu.catalog.files import read_json, write_bytes_atomic
from quipu.flows.reports import TIER_HEADER, format_scores, funnel_rows, kept_sample, language_rows, pdf_rows, tier_rows
from quipu.tasks.stage import RunContext

PALETTE = {"kept": "#3b7dd8", "removed": "#e07b39", "cut": "#333333", "bars": "#6a8fb5"}


# ---- data -------------------------------------------------------------------------------------

def load_reports(run_dir: str | Path, run: dict) -> dict[str, dict]:
    ctx = RunContext(str(run_dir))
    reports = {}
    for s in run["stages"]:
        path = ctx.layout(s["name"]).report
        if path.is_file():
            reports[s["name"]] = read_json(path)
    return reports


def perplexity_scores(run_dir: str | Path, run: dict) -> dict[str, list[float]]:
    """log(ppl_wayra) per language of every document the perplexity stage scored (its kept rows are
    the curated shards, its removed rows its removed/ folder); {} when the stage did not run."""
    import pyarrow.parquet as pq
    if "perplexity" not in {s["name"] for s in run["stages"]}:
        return {}
    ctx = RunContext(str(run_dir))
    files = [Path(p) for p in run.get("curated", {}).get("shards", [])]
    files += sorted(ctx.layout("perplexity").removed.glob("*.parquet"))
    by_lang: dict[str, list[float]] = {}
    for f in files:
        if not f.is_file() or not {"ppl_wayra", "lang"} <= set(pq.read_schema(f).names):
            continue
        t = pq.read_table(f, columns=["lang", "ppl_wayra"])
        for lang, v in zip(t.column("lang").to_pylist(), t.column("ppl_wayra").to_pylist()):
            if v is not None and v > 0:
                by_lang.setdefault(lang or "und", []).append(math.log(v))
    return by_lang


# ---- charts (matplotlib, PNG bytes) -------------------------------------------------------------

def _figure(width: float, height: float):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    return plt, fig, ax


def _png(plt, fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", metadata={"Software": None})   # no version stamp: same bytes each time
    plt.close(fig)
    return buf.getvalue()


def funnel_chart(run: dict) -> bytes:
    rows = funnel_rows(run)
    plt, fig, ax = _figure(8, 0.45 * len(rows) + 1.2)
    names = [r["stage"] for r in rows][::-1]
    kept = [r["kept"] for r in rows][::-1]
    removed = [r["removed"] for r in rows][::-1]
    ax.barh(names, kept, color=PALETTE["kept"], label="kept")
    ax.barh(names, removed, left=kept, color=PALETTE["removed"], label="removed")
    for y, (k, r) in enumerate(zip(kept, removed)):
        ax.text(k + r, y, f" {k:,} kept / {r:,} removed", va="center", fontsize=8)
    ax.set_xlabel("documents")
    ax.set_title("Documents into each stage: kept and removed")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_xlim(0, max([k + r for k, r in zip(kept, removed)] + [1]) * 1.45)
    return _png(plt, fig)


def bytes_chart(reports: dict[str, dict]) -> bytes:
    names = [n for n in reports if reports[n].get("bytes_in")]
    plt, fig, ax = _figure(8, 0.45 * len(names) + 1.2)
    ax.barh(names[::-1], [reports[n]["bytes_in"] / 1e6 for n in names][::-1], color=PALETTE["removed"], label="in")
    ax.barh(names[::-1], [reports[n].get("bytes_out", 0) / 1e6 for n in names][::-1], color=PALETTE["kept"], label="out")
    ax.set_xlabel("MB of text")
    ax.set_title("Text bytes into and out of each stage (edits and removals)")
    ax.legend(loc="lower right", fontsize=8)
    return _png(plt, fig)


def reasons_chart(stage: str, reasons: dict[str, int], top: int = 12) -> bytes:
    items = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    plt, fig, ax = _figure(8, 0.35 * len(items) + 1.2)
    ax.barh([r for r, _ in items][::-1], [n for _, n in items][::-1], color=PALETTE["removed"])
    ax.set_xlabel("documents removed")
    ax.set_title(f"{stage}: removal reasons")
    ax.tick_params(axis="y", labelsize=8)
    return _png(plt, fig)


def quality_chart(stage: str, report: dict, threshold: float | None) -> bytes | None:
    hist = report.get("stats", {}).get("histogram_by_lang") or {}
    if not hist:
        return None
    langs = sorted(hist, key=lambda lang: -sum(hist[lang].values()))[:6]
    plt, fig, axes = _figure(8, 2.0 * len(langs) + 0.5)
    fig.clear()
    axes = fig.subplots(len(langs), 1, squeeze=False)[:, 0]
    cutoffs = report.get("stats", {}).get("cutoffs") or {}
    for ax, lang in zip(axes, langs):
        bins = sorted(hist[lang].items(), key=lambda kv: float(kv[0]))
        ax.bar([float(b) + 0.025 for b, _ in bins], [n for _, n in bins], width=0.05, color=PALETTE["bars"], edgecolor="white")
        cut = cutoffs.get(lang, {}).get("score") if cutoffs else threshold
        if cut is not None:
            ax.axvline(cut, color=PALETTE["cut"], linestyle="--", label=f"cut-off {cut:.2f}")
            ax.legend(fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_ylabel(lang)
    axes[0].set_title(f"{stage}: score per language (documents per 0.05 bin)")
    axes[-1].set_xlabel("score")
    return _png(plt, fig)


def perplexity_chart(scores: dict[str, list[float]], report: dict) -> bytes | None:
    if not scores:
        return None
    import numpy as np
    langs = sorted(scores, key=lambda lang: -len(scores[lang]))[:6]
    plt, fig, _ = _figure(8, 2.0 * len(langs) + 0.5)
    fig.clear()
    axes = fig.subplots(len(langs), 1, squeeze=False)[:, 0]
    cutoffs = (report.get("stats", {}).get("cutoffs") or {}).get("by_lang", {})
    for ax, lang in zip(axes, langs):
        ax.hist(np.array(scores[lang]), bins=30, color=PALETTE["bars"], edgecolor="white")
        for name, style in (("head", ":"), ("tail", "--")):
            if lang in cutoffs and cutoffs[lang].get(name) is not None:
                v = cutoffs[lang][name]
                ax.axvline(math.log(v) if v > 0 else v, color=PALETTE["cut"], linestyle=style, label=f"{name} cut-off")
        if lang in cutoffs:
            ax.legend(fontsize=8)
        ax.set_ylabel(lang)
    axes[0].set_title("perplexity: log(ppl_wayra) per language")
    axes[-1].set_xlabel("log perplexity (student estimate of the teacher LLM)")
    return _png(plt, fig)


def cluster_chart(report: dict) -> bytes | None:
    hist = (report.get("stats", {}).get("dedup") or {}).get("cluster_size_histogram") or {}
    if not hist:
        return None
    items = sorted(((int(k), v) for k, v in hist.items()), key=lambda kv: kv[0])
    plt, fig, ax = _figure(8, 2.6)
    ax.bar([str(k) for k, _ in items], [v for _, v in items], color=PALETTE["bars"])
    ax.set_yscale("log")
    ax.set_xlabel("cluster size (documents that are copies of one another)")
    ax.set_ylabel("clusters")
    ax.set_title("dedup: duplicate cluster sizes")
    return _png(plt, fig)


def charts(run: dict, reports: dict[str, dict], run_dir: str | Path) -> list[tuple[str, str, bytes]]:
    """(section, title, PNG) of every chart of the run, in page order."""
    out = [("funnel", "Funnel", funnel_chart(run))]
    if any(r.get("bytes_in") for r in reports.values()):
        out.append(("funnel", "Bytes in and out", bytes_chart(reports)))
    config = run.get("config", {})
    for name, report in reports.items():
        if report.get("removed_by_reason"):
            out.append((name, f"{name}: removal reasons", reasons_chart(name, report["removed_by_reason"])))
        if "histogram_by_lang" in report.get("stats", {}):
            keep = (config.get(name) or {}).get("keep")
            threshold = (config.get(name) or {}).get("threshold") if keep == "threshold" else None
            png = quality_chart(name, report, threshold)
            if png:
                out.append((name, f"{name}: score histograms", png))
    if "perplexity" in reports:
        png = perplexity_chart(perplexity_scores(run_dir, run), reports["perplexity"])
        if png:
            out.append(("perplexity", "perplexity: score histograms", png))
    if "dedup" in reports:
        png = cluster_chart(reports["dedup"])
        if png:
            out.append(("dedup", "dedup: cluster sizes", png))
    return out


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


# ---- the page -----------------------------------------------------------------------------------

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;padding:0 1rem}
h1{font-size:1.6rem}h2{margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.3rem}
table{border-collapse:collapse;margin:.8rem 0;font-size:.9rem}th,td{border:1px solid #ddd;padding:.3rem .6rem;vertical-align:top}
th{background:#f4f6f8;text-align:left}td.n{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;display:block;margin:.6rem 0}.meta td:first-child{color:#555}
.snip{font-family:ui-monospace,monospace;font-size:.8rem;max-width:760px;white-space:pre-wrap;word-break:break-word}
nav a{margin-right:.8rem}
"""


def _e(x) -> str:
    return html.escape(str(x))


def _table(header: list[str], rows: list[list], numeric: set[int] = frozenset(), cls: str = "") -> str:
    out = [f'<table class="{cls}"><tr>' + "".join(f"<th>{_e(h)}</th>" for h in header) + "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f'<td class="{"n" if i in numeric else ""}">{_e(v)}</td>' for i, v in enumerate(row)) + "</tr>")
    return "".join(out) + "</table>"


def _examples(report: dict) -> str:
    rows = [[reason, ex["id"], ex["snippet"]] for reason, exs in report.get("examples", {}).items() for ex in exs]
    if not rows:
        return ""
    out = ['<h3>Examples of removed documents</h3><table><tr><th>reason</th><th>id</th><th>start of the text</th></tr>']
    out += [f'<tr><td>{_e(r)}</td><td>{_e(i)}</td><td class="snip">{_e(s)}</td></tr>' for r, i, s in rows]
    return "".join(out) + "</table>"


def _stage_details(name: str, report: dict) -> str:
    stats = report.get("stats", {})
    parts = []
    if name == "dedup":
        d = stats.get("dedup") or {}
        pairs = d.get("examples") or []
        if pairs:
            header = list(pairs[0].keys())
            parts.append("<h3>Example duplicate pairs</h3>" + _table(header, [[p.get(k, "") for k in header] for p in pairs]))
        figures = {k: v for k, v in d.items() if isinstance(v, (int, float))}
        if figures:
            parts.append(_table(["figure", "value"], [[k, v] for k, v in figures.items()], {1}))
    if name == "decontam":
        docs = stats.get("contaminated_docs") or {}
        if docs:
            parts.append("<h3>Contaminated documents per benchmark</h3>" + _table(["benchmark", "documents", "items hit"],
                         [[b, n, len((stats.get("items_hit") or {}).get(b, {}))] for b, n in docs.items()], {1, 2}))
        matches = [[b, m.get("doc"), m.get("item"), m.get("span")] for b, ms in (stats.get("example_matches") or {}).items() for m in ms]
        if matches:
            parts.append("<h3>Matched spans</h3>" + _table(["benchmark", "document", "item", "matched text"], matches))
    if name == "lines":
        domains = stats.get("top_domains_by_bytes_removed") or {}
        if domains:
            parts.append("<h3>Domains by bytes of lines removed</h3>" + _table(["domain", "bytes"], list(domains.items())[:20], {1}))
        top = stats.get("top_removed_lines") or []
        if top:
            parts.append("<h3>Most repeated lines removed</h3>" + _table(
                ["line", "documents with it", "removed here"], [[x["line"], x["documents"], x["removed_here"]] for x in top[:20]], {1, 2}))
    if stats.get("pdf"):
        parts.append("<h3>PDF pages</h3>" + _table(["what", "count"], pdf_rows(stats["pdf"]), {1}))
    edits = {k: n for k, n in stats.get("edits", {}).items() if n}
    if edits:
        parts.append("<h3>Edits to kept text</h3>" + _table(["edit", "count"], list(edits.items()), {1}))
    for key in ("highest", "lowest"):
        if stats.get(key):
            parts.append(f"<h3>{key.capitalize()}-scoring documents</h3>" + _table(
                ["score", "lang", "id", "start of the text"], [[x["score"], x.get("lang", ""), x["id"], x["snippet"]] for x in stats[key]]))
    return "".join(parts)


def render(run: dict, reports: dict[str, dict], run_dir: str | Path) -> str:
    figs = charts(run, reports, run_dir)
    by_section: dict[str, list[tuple[str, bytes]]] = {}
    for section, title, png in figs:
        by_section.setdefault(section, []).append((title, png))

    def images(section: str) -> str:
        return "".join(f'<img class="chart" alt="{_e(t)}" title="{_e(t)}" src="{data_url(p)}">' for t, p in by_section.get(section, []))

    curated = run.get("curated", {})
    meta = [["run id", run.get("run_id")], ["output", run.get("output")], ["input files", len(run.get("inputs", []))],
            ["records read", run.get("records_read")], ["quarantined", run.get("quarantined", 0)],
            ["curated documents", curated.get("rows")], ["curated shards", len(curated.get("shards", []))],
            ["seconds", run.get("seconds", "")],
            ["dataset", run.get("dataset") or (run.get("config") or {}).get("dataset") or Path(run.get("output") or run_dir).name]]
    names = [s["name"] for s in run["stages"]]
    out = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
           f"<title>quipu run {_e(run.get('run_id'))}</title><style>{CSS}</style></head><body>",
           f"<h1>Curate run <code>{_e(run.get('run_id'))}</code></h1>",
           "<nav>" + "".join(f'<a href="#stage-{_e(n)}">{_e(n)}</a>' for n in names) + "</nav>",
           _table(["", ""], meta, {1}, cls="meta"),
           '<h2 id="funnel">Funnel</h2>', images("funnel"),
           _table(["stage", "input", "kept", "removed", "kept %", "seconds", "top reasons"],
                  [[r["stage"], r["input"], r["kept"], r["removed"], r["kept %"], r["seconds"], r["top reasons"]]
                   for r in funnel_rows(run)], {1, 2, 3, 4, 5}, cls="funnel")]
    per_lang, _ = language_rows(run)
    if per_lang:
        out.append('<h2 id="languages">Decisions per language</h2>')
        out.append(_table(["stage", "lang", "kept", "removed", "top reasons"], per_lang, {2, 3}))
    tiers = tier_rows(run)
    if tiers:
        out.append('<h2 id="tiers">Quality tiers per language</h2><p>Tier 0 is the lowest; tokens are whitespace '
                   "tokens; an example document of each tier.</p>")
        out.append(_table(TIER_HEADER, tiers, {2, 3, 4, 5}))
    sample = kept_sample(run)
    if sample:
        out.append('<h2 id="kept">Kept, per language</h2><p>The first curated documents of each language, with the '
                   "scores that let them through.</p>")
        out.append(_table(["lang", "id", "scores", "start of the text"],
                          [[lang, d["id"], format_scores(d["scores"]), d["snippet"]] for lang, docs in sample.items()
                           for d in docs]))
    for s in run["stages"]:
        name = s["name"]
        report = reports.get(name, {})
        out.append(f'<h2 id="stage-{_e(name)}">{_e(name)}</h2>')
        out.append(f"<p>input <b>{s['input_docs']:,}</b> · kept <b>{s['kept_docs']:,}</b> · removed <b>{s['removed_docs']:,}</b>"
                   f" · {s.get('seconds', 0):.1f} s · text bytes {report.get('bytes_in', 0):,} → {report.get('bytes_out', 0):,}</p>")
        out.append(images(name))
        if s["removed_by_reason"]:
            out.append(_table(["reason", "removed"], list(s["removed_by_reason"].items()), {1}, cls="reasons"))
        out.append(_stage_details(name, report))
        out.append(_examples(report))
    if run.get("quarantine_by_reason"):
        out.append('<h2 id="quarantine">Quarantine</h2><p>Records or file parts that could not be read, in '
                   "<code>quarantine/</code> with their reason.</p>")
        out.append(_table(["reason", "records"], list(run["quarantine_by_reason"].items()), {1}))
    out.append('<h2 id="config">Config</h2><pre class="snip">' + _e(json.dumps(run.get("config", {}), indent=1)) + "</pre>")
    out.append("</body></html>")
    return "\n".join(out)


def write_html_report(run_dir: str | Path, run: dict, path: str | Path | None = None) -> Path:
    path = Path(path) if path else Path(run_dir) / "report.html"
    page = render(run, load_reports(run_dir, run), run_dir)
    write_bytes_atomic(path, page.encode("utf-8"))
    return path


def charts_markdown(run: dict, reports: dict[str, dict], run_dir: str | Path) -> str:
    """The charts as one markdown document (images as data URLs, which the Prefect UI renders)."""
    lines = [f"# Charts of curate run `{run.get('run_id')}`", ""]
    for _, title, png in charts(run, reports, run_dir):
        lines += [f"## {title}", "", f"![{title}]({data_url(png)})", ""]
    return "\n".join(lines)


def publish_charts(run: dict, reports: dict[str, dict], prefix: str = "curate"):
    """The charts as the Prefect artifact `<prefix>-charts` (needs a Prefect run context); its id."""
    from prefect.artifacts import create_markdown_artifact
    return create_markdown_artifact(key=f"{prefix}-charts", markdown=charts_markdown(run, reports, run.get("output", ".")),
                             description="Funnel, removal reasons, score histograms and cluster sizes (as in `quipu report RUN --html`)")
