"""The `label` flow: LLM labels of educational value (quipu.trainer.llm_labels) as a Prefect run, its
progress lines in the run's log, its report (counts per language, reasons, cost per 1,000 documents)
as an artifact. The labelling itself is resumable on its own (the store), so a crashed flow run is
simply run again."""
from __future__ import annotations

from prefect import flow, get_run_logger, task

from quipu.catalog.errors import UserError
from quipu.flows.run_names import output_name
from quipu.flows.runners import failed_run
from quipu.trainer.llm_labels import LabelConfig, label_documents


@task(name="label-documents")
def label_task(config: LabelConfig) -> dict:
    log = get_run_logger()
    return label_documents(config, log=log.info)


def report_markdown(r: dict) -> str:
    c = r["this_run"]
    per = c["per_1000_docs"]
    lines = [f"# LLM labels ({r['model']} at {r['endpoint']})", "",
             f"{r['documents']} documents: {r['asked_this_run']} asked this run, {r['from_store']} from the store. "
             f"This run: {c['tokens_in']} tokens in, {c['tokens_out']} out, {c['seconds']} s, {c['docs_per_s']} docs/s.", "",
             f"Per 1,000 documents: {per['tokens_in']} tokens in, {per['tokens_out']} out, {per['seconds']} s"
             + (f", cost {per['cost']}" if "cost" in per else ""), "",
             "| language | documents | scored | 0 | 1 | 2 | 3 | 4 | 5 | not scored (reason) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for lang, s in r["by_lang"].items():
        hist = " | ".join(str(s["scores"].get(str(k), 0)) for k in range(6))
        why = ", ".join(f"{k} {v}" for k, v in sorted(s["reasons"].items())) or "-"
        lines.append(f"| {lang} | {s['documents']} | {s['scored']} | {hist} | {why} |")
    return "\n".join(lines)


@flow(name="label", flow_run_name=output_name("label"), log_prints=True, persist_result=False)
def label(config: LabelConfig) -> dict:
    try:
        report = label_task(config)
    except (UserError, FileNotFoundError) as e:
        return failed_run(e)
    try:
        from prefect.artifacts import create_markdown_artifact
        create_markdown_artifact(key="llm-labels", markdown=report_markdown(report), description="LLM labels")
    except Exception as e:   # no API to publish to: label_report.json is the record
        get_run_logger().warning("could not publish the labels artifact: %s", e)
    return report
