"""Run and stage reports: the terminal funnel (`quipu report`) and the Prefect UI artifacts.

Artifact keys are stable (`<prefix>-funnel`, `<prefix>-stage-<stage>`), so the UI's Artifacts page
shows each report's history across runs.
"""
from __future__ import annotations

import json
from pathlib import Path

from quipu.catalog.files import read_json
from quipu.tasks.stage import RunContext


def load_run(run_dir: str | Path) -> dict:
    path = RunContext(str(run_dir)).summary
    if not path.is_file():
        raise FileNotFoundError(f"no run.json in {run_dir} (not a finished curate run directory)")
    return read_json(path)


def funnel_rows(run: dict) -> list[dict]:
    rows = []
    for s in run["stages"]:
        top = list(s["removed_by_reason"].items())[:3]
        rows.append({
            "stage": s["name"], "input": s["input_docs"], "kept": s["kept_docs"], "removed": s["removed_docs"],
            "kept %": round(100.0 * s["kept_docs"] / s["input_docs"], 1) if s["input_docs"] else 0.0,
            "seconds": s.get("seconds", 0),
            "top reasons": ", ".join(f"{r} ({n})" for r, n in top),
        })
    return rows


KEPT_PER_LANGUAGE = 3     # kept documents shown per language in every report
SNIPPET_CHARS = 160


def score_columns(names: list[str]) -> list[str]:
    """The columns a stage wrote to decide on a document: langid's `lang_score`, a classifier's
    `<name>_score`, the perplexity stage's `ppl_*`."""
    return [n for n in names if n.endswith("_score") or n.startswith("ppl_")]


def kept_sample(run: dict, per_language: int = KEPT_PER_LANGUAGE) -> dict[str, list[dict]]:
    """Per language, the first `per_language` curated documents: id, the start of the text and the
    scores that let them through (read batch by batch, only those columns, until every language
    seen has its sample)."""
    import pyarrow.parquet as pq
    last = (run.get("stages") or [{}])[-1].get("by_language", {})
    wanted = {lang: min(per_language, d["kept"]) for lang, d in last.items() if d.get("kept")}
    out: dict[str, list[dict]] = {}
    for path in run.get("curated", {}).get("shards", []):
        if wanted and all(len(out.get(lang, [])) >= n for lang, n in wanted.items()):
            break
        try:
            f = pq.ParquetFile(path)
        except (OSError, ValueError):   # a shard moved or deleted since: the report shows the rest
            continue
        names = f.schema_arrow.names
        scores = score_columns(names)
        cols = [c for c in ("id", "lang", "text") if c in names] + scores
        for batch in f.iter_batches(batch_size=256, columns=cols):
            for row in batch.to_pylist():
                docs = out.setdefault(str(row.get("lang") or "und"), [])
                if len(docs) < per_language:
                    text = " ".join(str(row.get("text") or "").split())
                    docs.append({"id": row.get("id"), "snippet": text[:SNIPPET_CHARS],
                                 "scores": {k: round(row[k], 3) for k in scores if isinstance(row.get(k), (int, float))}})
            if wanted and all(len(out.get(lang, [])) >= n for lang, n in wanted.items()):
                break
    return dict(sorted(out.items()))


def language_rows(run: dict) -> tuple[list[list], list[str]]:
    """Per stage and language: kept, removed and the top reasons (rows), and the languages seen."""
    rows, langs = [], set()
    for s in run.get("stages", []):
        for lang, d in sorted(s.get("by_language", {}).items()):
            langs.add(lang)
            reasons = sorted(d["by_reason"].items(), key=lambda kv: (-kv[1], kv[0]))[:3]
            rows.append([s["name"], lang, d["kept"], d["removed"], ", ".join(f"{r} ({n})" for r, n in reasons)])
    return rows, sorted(langs)


def tier_rows(run: dict) -> list[list]:
    """Per language and quality tier (stage `tiers`): documents, tokens, their share of the
    language's tokens, kept documents, and an example (id and start of the text)."""
    rows = []
    for s in run.get("stages", []):
        for lang, tiers in sorted((s.get("tiers") or {}).items()):
            total = sum(t["tokens"] for t in tiers.values()) or 1
            for tier, t in tiers.items():
                ex = t.get("example") or {}
                rows.append([lang, tier, t["docs"], t["tokens"], f"{100 * t['tokens'] / total:.1f} %", t["kept_docs"],
                             ex.get("id", ""), " ".join(str(ex.get("snippet", "")).split())[:SNIPPET_CHARS]])
    return rows


TIER_HEADER = ["lang", "tier", "docs", "tokens", "tokens %", "kept", "example id", "example"]


def format_scores(scores: dict) -> str:
    return " ".join(f"{k}={v:g}" for k, v in scores.items()) or "no scores"


def format_funnel(run: dict, top: int = 5) -> str:
    out = []
    out.append(f"run {run.get('run_id', '?')}  records read: {run.get('records_read', '?')}  "
               f"quarantined: {run.get('quarantined', 0)}  curated: {run.get('curated', {}).get('rows', '?')} docs "
               f"in {len(run.get('curated', {}).get('shards', []))} shards")
    out.append("")
    out.append(f"{'stage':<12}{'input':>10}{'kept':>10}{'removed':>10}{'kept %':>9}{'seconds':>10}")
    for r in funnel_rows(run):
        out.append(f"{r['stage']:<12}{r['input']:>10}{r['kept']:>10}{r['removed']:>10}{r['kept %']:>9.1f}{r['seconds']:>10.1f}")
    reused = [f"{s['name']} {s['reused_shards']}" for s in run["stages"] if s.get("reused_shards")]
    if reused:
        out.append("")
        out.append("reused from an earlier run (shards or files; their seconds are not counted): " + ", ".join(reused))
    for s in run["stages"]:
        if s["removed_by_reason"]:
            out.append("")
            out.append(f"{s['name']}: top removal reasons")
            for reason, n in list(s["removed_by_reason"].items())[:top]:
                out.append(f"  {n:>8}  {reason}")
        if s.get("pdf"):
            out.append("")
            out.append(f"{s['name']}: PDF pages")
            for what, n in pdf_rows(s["pdf"]):
                out.append(f"  {n:>8}  {what}")
        if s.get("edits"):
            out.append("")
            out.append(f"{s['name']}: edits to kept text")
            for what, n in s["edits"].items():
                out.append(f"  {n:>8}  {what}")
    per_lang, _ = language_rows(run)
    if per_lang:
        out.append("")
        out.append("decisions per language (document lang from langid)")
        out.append(f"  {'stage':<12}{'lang':<6}{'kept':>9}{'removed':>9}  top reasons")
        for stage, lang, kept, removed, reasons in per_lang:
            out.append(f"  {stage:<12}{lang:<6}{kept:>9}{removed:>9}  {reasons}")
    tiers = tier_rows(run)
    if tiers:
        out.append("")
        out.append("quality tiers per language (0 lowest; tokens: whitespace tokens; an example of each)")
        out.append(f"  {'lang':<6}{'tier':<10}{'docs':>8}{'tokens':>11}{'tokens %':>10}{'kept':>8}  example")
        for lang, tier, n, tok, share, kept, ex_id, ex in tiers:
            out.append(f"  {lang:<6}{tier:<10}{n:>8}{tok:>11}{share:>10}{kept:>8}  {ex_id}  {ex[:80]}")
    sample = kept_sample(run)
    if sample:
        out.append("")
        out.append("kept, per language (the first curated documents, with the scores that let them through)")
        for lang, docs in sample.items():
            for d in docs:
                out.append(f"  {lang:<4} {d['id']}  [{format_scores(d['scores'])}]  {d['snippet'][:100]}")
    if run.get("quarantine_by_reason"):
        out.append("")
        out.append("quarantine reasons")
        for reason, n in run["quarantine_by_reason"].items():
            out.append(f"  {n:>8}  {reason}")
    return "\n".join(out)


def pdf_rows(pdf: dict) -> list[tuple[str, int]]:
    """What extract did with PDF pages (tasks/pdf.py stats), as (what, count) rows."""
    rows = [("PDF documents", pdf.get("documents", 0)), ("pages", pdf.get("pages", 0)),
            ("pages read from the text layer", pdf.get("pages_text", 0)), ("pages read by OCR", pdf.get("pages_ocr", 0)),
            ("empty pages", pdf.get("pages_empty", 0))]
    rows += [(f"pages dropped: {reason}", n) for reason, n in sorted(pdf.get("pages_dropped", {}).items())]
    if pdf.get("removed_page_rows"):   # a row for each page dropped (one for the pages past max_pages)
        rows += [("dropped-page rows in extract/removed (not documents)", pdf["removed_page_rows"])]
    rows += [(f"documents not opened: {reason}", n) for reason, n in sorted(pdf.get("documents_unread", {}).items())]
    rows += [("running header/footer lines removed", pdf.get("running_lines_removed", 0)),
             ("page numbers removed", pdf.get("page_numbers_removed", 0))]
    return rows


def stage_markdown(report: dict) -> str:
    lines = [f"# Stage `{report['stage']}`", "",
             f"input **{report['input_docs']}** · kept **{report['kept_docs']}** · removed **{report['removed_docs']}** "
             f"· {report.get('seconds', 0):.1f} s", "",
             f"bytes in/out: {report.get('bytes_in', 0):,} / {report.get('bytes_out', 0):,} · "
             f"characters in/out: {report.get('chars_in', 0):,} / {report.get('chars_out', 0):,}", ""]
    if report.get("removed_by_reason"):
        lines += ["| reason | removed |", "|---|---:|"]
        lines += [f"| `{r}` | {n} |" for r, n in report["removed_by_reason"].items()]
        lines.append("")
        lines.append("## Examples")
        for reason, exs in report.get("examples", {}).items():
            lines.append(f"**{reason}**")
            for ex in exs:
                text = ex["snippet"].replace("|", "\\|").replace("\n", " ")
                lines.append(f"- `{ex['id']}`: {text}")
            lines.append("")
    if report.get("stats", {}).get("pdf"):
        lines += ["## PDF pages", "", "| what | count |", "|---|---:|"]
        lines += [f"| {what} | {n} |" for what, n in pdf_rows(report["stats"]["pdf"])]
        lines.append("")
    edits = {k: n for k, n in report.get("stats", {}).get("edits", {}).items() if n}
    if edits:
        lines += ["## Edits to kept text", "", "| edit | count |", "|---|---:|"]
        lines += [f"| {k.replace('<', '&lt;').replace('>', '&gt;')} | {n} |" for k, n in edits.items()]
        lines.append("")
    if report.get("quarantined"):
        lines += ["## Quarantine", "", f"{report['quarantined']} records or file parts could not be read:", ""]
        lines += [f"- {r}: {n}" for r, n in report.get("quarantine_by_reason", {}).items()]
    if report.get("domains"):   # top sites and TLDs kept and removed (tasks/domain_stats.py)
        from quipu.tasks.domain_stats import domain_markdown
        lines += ["", domain_markdown(report["domains"])]
    by_language = report.get("stats", {}).get("by_language") or {}
    if by_language:
        rows, _ = language_rows({"stages": [{"name": report["stage"], "by_language": by_language}]})
        lines += ["", "## Decisions per language", "", "| lang | kept | removed | top reasons |", "|---|---:|---:|---|"]
        lines += [f"| {lang} | {kept} | {removed} | {reasons} |" for _, lang, kept, removed, reasons in rows]
    rest = {k: v for k, v in report.get("stats", {}).items() if k != "by_language"}
    if rest:
        lines += ["", "## Stage statistics", "", "```json", json.dumps(rest, indent=1)[:4000], "```"]
    return "\n".join(lines)


def publish_artifacts(run: dict, reports: dict[str, dict], prefix: str = "curate",
                      others: dict[str, object] | None = None) -> str:
    """Table artifact for the funnel, one markdown artifact per stage, then the summary linking
    each of them (and `others`: {title: artifact id}) by its UI page; needs a Prefect run
    context. Returns the summary's UI address.

    The summary cannot be put first in a run's Artifacts tab: both Prefect 3.8 UIs list a run's
    artifacts by id, descending (`sort: ID_DESC`), and the server gives artifacts random (uuid4)
    ids, so their order is neither creation order nor chosen by us. It is created last, so that
    it can link every other artifact, and a log line at the run's end names it."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    pages = {"funnel": create_table_artifact(
        key=f"{prefix}-funnel", table=funnel_rows(run),
        description=f"Curation funnel of run {run.get('run_id')} ({run.get('output')})")}
    for name, report in reports.items():
        pages[name] = create_markdown_artifact(key=f"{prefix}-stage-{name.replace('_', '-')}",
                                               markdown=stage_markdown(report),
                                               description=f"Stage {name}: removal reasons and examples")
    links = {name: artifact_url(i) for name, i in {**pages, **(others or {})}.items()}
    summary = create_markdown_artifact(key=f"{prefix}-summary", markdown=summary_markdown(run, list(reports), links),
                                       description="Start here: the run's funnel, with a link to every report")
    return artifact_url(summary)


def artifact_url(artifact_id) -> str:
    """An artifact's page in the Prefect UI (root-relative when no UI address is configured)."""
    from prefect.settings import PREFECT_UI_URL
    return f"{(PREFECT_UI_URL.value() or '').rstrip('/')}/artifacts/artifact/{artifact_id}"


def summary_markdown(run: dict, stages: list[str], links: dict[str, str] | None = None) -> str:
    """The run in a few lines and its funnel; `links`: {stage or title: UI page of its artifact}."""
    links = links or {}
    out = run.get("output", ".")
    curated = run.get("curated", {})
    # Paths are shown as text: a file:// link does not open from the UI's page (browsers refuse it);
    # every report has its artifact, linked by its UI page.
    lines = [f"# Curate run `{run.get('run_id')}`", "",
             f"- dataset: **{run.get('dataset') or (run.get('config') or {}).get('dataset') or Path(out).name}**",
             f"- output: `{out}` (run summary `run.json`, `quipu report {out}`)",
             f"- inputs: {len(run.get('inputs', []))} files",
             f"- records read: {run.get('records_read')} · quarantined: {run.get('quarantined')}",
             f"- curated: **{curated.get('rows')}** documents in {len(curated.get('shards', []))} shards under "
             f"`{Path(out, 'curated')}`",
             *(f"- {title}: [{title}]({url})" for title, url in links.items() if title not in stages), "",
             "| stage | input | kept | removed | report |", "|---|---:|---:|---:|---|"]
    by_name = {s["name"]: s for s in run.get("stages", [])}
    for name in stages:
        s = by_name.get(name, {})
        page = f"[artifact]({links[name]})" if name in links else f"`{Path(out, name, 'report.json')}`"
        lines.append(f"| {name} | {s.get('input_docs', '')} | {s.get('kept_docs', '')} | {s.get('removed_docs', '')} "
                     f"| {page} |")
    per_lang, _ = language_rows(run)
    if per_lang:
        lines += ["", "## Decisions per language", "", "| stage | lang | kept | removed | top reasons |",
                  "|---|---|---:|---:|---|"]
        lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in per_lang]
    tiers = tier_rows(run)
    if tiers:
        lines += ["", "## Quality tiers per language", "", "| " + " | ".join(TIER_HEADER) + " |",
                  "|---|---|---:|---:|---:|---:|---|---|"]
        lines += [f"| {lang} | {tier} | {n} | {tok} | {share} | {kept} | `{ex_id}` | {_cell(ex)} |"
                  for lang, tier, n, tok, share, kept, ex_id, ex in tiers]
    sample = kept_sample(run)
    if sample:
        lines += ["", "## Kept, per language", "", "The first curated documents of each language, with the scores "
                  "that let them through.", "", "| lang | id | scores | start of the text |", "|---|---|---|---|"]
        lines += [f"| {lang} | `{d['id']}` | {format_scores(d['scores'])} | {_cell(d['snippet'])} |"
                  for lang, docs in sample.items() for d in docs]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;")


class RunProgress:
    """A progress artifact (`<prefix>-progress`) updated in place while the stages run.

    Progress is (finished stages + the running stage's finished fraction) / stages, in percent.
    A failed update (server busy) is logged, never fails the run.
    """

    def __init__(self, prefix: str, stages: list[str]):
        self.stages = stages
        self.artifact_id = None
        from prefect.context import FlowRunContext
        if FlowRunContext.get() is None:   # called outside a flow run: nothing to show it in
            return
        try:
            from prefect.artifacts import create_progress_artifact
            self.artifact_id = create_progress_artifact(progress=0.0, key=f"{prefix}-progress",
                                                        description=self._describe(stages[0], 0.0))
        except Exception as e:  # no run context or the API is unreachable: progress is only a display
            self._warn(e)

    def _describe(self, stage: str, fraction: float) -> str:
        return f"stage {stage} ({self.stages.index(stage) + 1}/{len(self.stages)}), {100 * fraction:.0f}% of its shards done"

    @staticmethod
    def _warn(e: Exception) -> None:
        import logging
        logging.getLogger("quipu.reports").warning("progress artifact not updated: %s", e)

    def update(self, stage: str, fraction: float) -> float:
        i = self.stages.index(stage) if stage in self.stages else len(self.stages) - 1
        pct = round(100.0 * (i + min(max(fraction, 0.0), 1.0)) / len(self.stages), 1)
        if self.artifact_id is not None:
            try:
                from prefect.artifacts import update_progress_artifact
                update_progress_artifact(self.artifact_id, pct, description=self._describe(stage, fraction))
            except Exception as e:
                self._warn(e)
        return pct

    def done(self) -> None:
        self.update(self.stages[-1], 1.0)


def resolve_run_dir(run: str) -> str:
    """A curate run's directory from what a user has at hand: the directory itself, a run id (`quipu
    catalog ls`), a dataset name (its newest version's run) or `dataset@version`."""
    if RunContext(run).summary.is_file():
        return run
    from quipu.catalog import registry
    found = registry.get_run(run)
    if found is None:
        name, _, version = run.partition("@")
        versions = registry.dataset_versions(name) if name else []
        if version:
            versions = [v for v in versions if str(v["version"]) == version.lstrip("v")]
            if not versions and registry.dataset_versions(name):
                have = ", ".join(str(v["version"]) for v in registry.dataset_versions(name))
                raise FileNotFoundError(f"{run}: dataset {name!r} has no version {version} (it has {have})")
        if versions:
            found = registry.get_run(versions[-1]["run_id"])
    if found is None or not found.get("output"):
        raise FileNotFoundError(f"{run}: not a run directory with run.json, a run id (quipu catalog ls runs), "
                                "a dataset or dataset@version (quipu catalog ls datasets)")
    return found["output"]


def diff_runs(a: dict, b: dict, top: int = 5) -> str:
    """Stage-by-stage comparison of two runs: counts, kept share and the reasons that moved most."""
    sa = {s["name"]: s for s in a["stages"]}
    sb = {s["name"]: s for s in b["stages"]}
    names = [s["name"] for s in a["stages"]] + [s["name"] for s in b["stages"] if s["name"] not in sa]

    def pct(s):
        return 100.0 * s["kept_docs"] / s["input_docs"] if s and s["input_docs"] else 0.0

    out = [f"A: {a.get('run_id', '?')} ({a.get('output', '?')})", f"B: {b.get('run_id', '?')} ({b.get('output', '?')})", "",
           f"{'stage':<14}{'input A':>9}{'input B':>9}{'kept A':>9}{'kept B':>9}{'kept% A':>9}{'kept% B':>9}{'Δ pts':>8}"]
    for n in names:
        x, y = sa.get(n), sb.get(n)
        cell = lambda s, k: str(s[k]) if s else "-"  # noqa: E731
        delta = f"{pct(y) - pct(x):+.1f}" if x and y else "-"
        out.append(f"{n:<14}{cell(x, 'input_docs'):>9}{cell(y, 'input_docs'):>9}{cell(x, 'kept_docs'):>9}"
                   f"{cell(y, 'kept_docs'):>9}{(f'{pct(x):.1f}' if x else '-'):>9}{(f'{pct(y):.1f}' if y else '-'):>9}{delta:>8}")
    ca, cb = a.get("curated", {}).get("rows"), b.get("curated", {}).get("rows")
    out.append(f"{'curated':<14}{'':>9}{'':>9}{str(ca):>9}{str(cb):>9}")
    for n in names:
        ra = (sa.get(n) or {}).get("removed_by_reason", {})
        rb = (sb.get(n) or {}).get("removed_by_reason", {})
        moved = sorted(((r, ra.get(r, 0), rb.get(r, 0)) for r in set(ra) | set(rb) if ra.get(r, 0) != rb.get(r, 0)),
                       key=lambda t: (-abs(t[2] - t[1]), t[0]))[:top]
        if moved:
            out += ["", f"{n}: removal reasons that changed (A → B)"]
            out += [f"  {r:<48}{x:>8} → {y:<8}" for r, x, y in moved]
    return "\n".join(out)
