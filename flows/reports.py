"""Run and stage reports: the terminal funnel (`quipu report`) and the Prefect UI artifacts.

Artifact keys are stable (`<prefix>-funnel`, `<prefix>-stage-<stage>`), so the UI's Artifacts page
shows each report's history across runs.
"""
from __future__ import annotations

import json
from pathlib import Path

from catalog.files import read_json


def load_run(run_dir: str | Path) -> dict:
    path = Path(run_dir) / "run.json"
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


def format_funnel(run: dict, top: int = 5) -> str:
    out = []
    out.append(f"run {run.get('run_id', '?')}  records read: {run.get('records_read', '?')}  "
               f"quarantined: {run.get('quarantined', 0)}  curated: {run.get('curated', {}).get('rows', '?')} docs "
               f"in {len(run.get('curated', {}).get('shards', []))} shards")
    out.append("")
    out.append(f"{'stage':<12}{'input':>10}{'kept':>10}{'removed':>10}{'kept %':>9}{'seconds':>10}")
    for r in funnel_rows(run):
        out.append(f"{r['stage']:<12}{r['input']:>10}{r['kept']:>10}{r['removed']:>10}{r['kept %']:>9.1f}{r['seconds']:>10.1f}")
    for s in run["stages"]:
        if not s["removed_by_reason"]:
            continue
        out.append("")
        out.append(f"{s['name']}: top removal reasons")
        for reason, n in list(s["removed_by_reason"].items())[:top]:
            out.append(f"  {n:>8}  {reason}")
    if run.get("quarantine_by_reason"):
        out.append("")
        out.append("quarantine reasons")
        for reason, n in run["quarantine_by_reason"].items():
            out.append(f"  {n:>8}  {reason}")
    return "\n".join(out)


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
    if report.get("quarantined"):
        lines += ["## Quarantine", "", f"{report['quarantined']} records or file parts could not be read:", ""]
        lines += [f"- {r}: {n}" for r, n in report.get("quarantine_by_reason", {}).items()]
    if report.get("stats"):
        lines += ["", "## Stage statistics", "", "```json", json.dumps(report["stats"], indent=1)[:4000], "```"]
    return "\n".join(lines)


def publish_artifacts(run: dict, reports: dict[str, dict], prefix: str = "curate") -> None:
    """Table artifact for the funnel, one markdown artifact per stage (needs a Prefect run context)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    create_table_artifact(key=f"{prefix}-funnel", table=funnel_rows(run),
                          description=f"Curation funnel of run {run.get('run_id')} ({run.get('output')})")
    for name, report in reports.items():
        create_markdown_artifact(key=f"{prefix}-stage-{name}", markdown=stage_markdown(report),
                                 description=f"Stage {name}: removal reasons and examples")
    summary = [f"# Curate run `{run.get('run_id')}`", "",
               f"- output: `{run.get('output')}`",
               f"- records read: {run.get('records_read')} · quarantined: {run.get('quarantined')}",
               f"- curated: {run.get('curated', {}).get('rows')} documents in "
               f"{len(run.get('curated', {}).get('shards', []))} shards under `{run.get('output')}/curated`",
               f"- reports: " + ", ".join(f"`{run.get('output')}/{s}/report.json`" for s in reports)]
    create_markdown_artifact(key=f"{prefix}-summary", markdown="\n".join(summary), description="Run summary")
