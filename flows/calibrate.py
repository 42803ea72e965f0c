"""Command `quipu calibrate`: per-language thresholds from reference text, and the report card.

    quipu calibrate CONFIG --reference 'ref/pt/*.jsonl' --lang pt [--junk 'junk/pt/*.jsonl'] [--crawl 'sample/*.warc.gz']
                    [--keep 0.97] --output NEW.yaml
    quipu calibrate --check CONFIG --reference ... [--junk ...] --lang pt     # the report card only

The statistics and thresholds are quipu.tasks.calibration's (pure); this module reads the files,
writes the new config (every calibrated threshold with a comment saying how it was derived), the
report as JSON and HTML (the page style of `quipu report --html`) and, as a Prefect flow, the
report as an artifact. The reference is checked (empty, too small, another language) before any
statistic is computed.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml

from quipu.catalog.errors import UserError
from quipu.catalog.files import write_bytes_atomic
from quipu.tasks import calibration as cal
from quipu.tasks import languages


class CalibrateError(UserError, ValueError):
    pass


def read_texts(patterns: list[str], option: str) -> list[str]:
    """The plain-text documents of the files matching the globs, in file then record order (read as
    every model's training text is: quipu.trainer.text_source). HTML pages and PDFs would need
    extraction: a sample holding them is refused, naming `option`, rather than read as nothing."""
    from quipu.trainer.text_source import SourceError, read_documents
    counts: dict = {}
    try:
        docs = read_documents(patterns, counts=counts)
    except SourceError as e:
        raise CalibrateError(str(e)) from None
    if counts.get("not_extracted"):
        raise CalibrateError(f"{option}: {counts['not_extracted']:,} HTML or PDF records in {', '.join(patterns)}, which "
                             "quipu calibrate does not extract: give their text (JSONL or parquet), e.g. "
                             "OUT/extract/kept/*.parquet of `quipu curate ... --set keep_intermediate=true`")
    return [d["text"] for d in docs if d["text"].strip()]


# ---- the config, written with a comment on every calibrated threshold ---------------------------

def _flow(value) -> str:
    if isinstance(value, float) and value != value:
        return ".nan"
    out = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10_000).strip()
    return out.removesuffix("\n...").removesuffix("...").strip()


COMMENTED = re.compile(r"^(?P<indent> *)(?P<key>[^#:\s][^:]*):(?P<value>.*?)(?:\s+#\s(?P<note>.*))?$")


def read_comments(path: str) -> dict[tuple, str]:
    """The end-of-line comments of a config this module wrote, by key path (block style, 2 spaces)."""
    out: dict[tuple, str] = {}
    stack: list[str] = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        m = COMMENTED.match(line)
        if not m or line.lstrip().startswith(("#", "- ")):
            continue
        depth = len(m["indent"]) // 2
        stack = stack[:depth] + [m["key"].strip()]
        if m["note"]:
            out[tuple(stack)] = m["note"]
    return out


def _canonical(data) -> str:
    return json.dumps(data, sort_keys=True, default=str)


def one_line(text: str) -> str:
    """`text` safe inside a YAML comment: every character YAML could end a line at (newlines, \x85,
    U+2028) or a terminal would act on, escaped; a file name cannot inject keys."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(text))


def config_yaml(data: dict, comments: dict[tuple, str], header: list[str], path: tuple = ()) -> str:
    lines = [f"# {one_line(h)}" for h in header] if not path else []
    indent = "  " * len(path)
    for key, value in data.items():
        here = path + (key,)
        note = f"   # {one_line(comments[here])}" if here in comments else ""
        if isinstance(value, dict) and value:
            lines.append(f"{indent}{_flow(key)}:{note}")
            lines.append(config_yaml(value, comments, header, here))
        else:
            lines.append(f"{indent}{_flow(key)}: {_flow(value)}{note}")
    return "\n".join(line for line in lines if line)


# ---- the report: HTML page and markdown artifact -------------------------------------------------

def rule_chart(row: dict) -> bytes:
    from quipu.flows.html_report import PALETTE, _figure, _png
    import numpy as np
    lo, hi = row["range"]
    edges = np.linspace(lo, hi, len(row["reference_hist"]) + 1)
    plt, fig, ax = _figure(4.2, 2.0)
    ref = np.array(row["reference_hist"], float)
    ax.stairs(ref / max(ref.sum(), 1), edges, fill=True, alpha=0.6, color=PALETTE["kept"], label="reference")
    if "junk_hist" in row:
        junk = np.array(row["junk_hist"], float)
        ax.stairs(junk / max(junk.sum(), 1), edges, fill=True, alpha=0.5, color=PALETTE["removed"], label="junk")
    if "crawl_hist" in row:
        crawl = np.array(row["crawl_hist"], float)
        ax.stairs(crawl / max(crawl.sum(), 1), edges, fill=False, color="#444444", label="crawl sample")
    if row["threshold"] is not None:
        ax.axvline(row["threshold"], color=PALETTE["cut"], linestyle="--", label=f"cut-off {row['threshold']:g}")
    ax.set_title(f"{row['rule']} ({row['statistic']}, {row['kind']})", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6)
    return _png(plt, fig)


def render_html(report: dict) -> str:
    from quipu.flows.html_report import CSS, _e, _table, data_url
    out = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
           f"<title>quipu calibration</title><style>{CSS}</style></head><body>",
           "<h1>Calibration report</h1>",
           _table(["", ""], [["config", report["config"]], ["mode", report["mode"]], ["keep target", report.get("keep", "")]],
                  {1}, cls="meta")]
    for lang, ev in report["languages"].items():
        out.append(f'<h2 id="lang-{_e(lang)}">{_e(lang)}: {ev["reference_docs"]} reference, {ev["junk_docs"]} junk documents</h2>')
        together = f"all rules together remove <b>{100 * ev['reference_removed']:.1f} %</b> of the reference"
        if ev.get("junk_removed") is not None:
            together += f" and <b>{100 * ev['junk_removed']:.1f} %</b> of the junk"
        out.append(f"<p>{together}.</p>")
        if report.get("comparison"):
            out.extend(comparison_html(report["comparison"]))
        out.append(_table(["rule", "statistic", "cut-off", "calibrated", "reference removed %", "junk removed %"],
                          [[r["rule"], r["statistic"], "off" if r["threshold"] is None else f"{r['threshold']:g}"
                            + (" (clipped)" if r.get("clipped") else ""),
                            "yes" if r["calibrated"] else "no", f"{100 * r['reference_removed']:.1f}",
                            f"{100 * r['junk_removed']:.1f}" if "junk_removed" in r else ""] for r in ev["rules"]], {2, 4, 5}))
        for r in ev["rules"]:
            out.append(f'<img class="chart" alt="{_e(r["rule"])}" src="{data_url(rule_chart(r))}" style="display:inline-block;max-width:49%">')
    out.append("</body></html>")
    return "\n".join(out)


def moved_sentence(comparison: dict) -> str:
    """One line: what the reference changed, said plainly when it changed nothing."""
    changed, inside = comparison["changed"], comparison["inside_range"]
    if not inside:
        head = (f"this reference moved no heuristic threshold off its clip bound: all {len(comparison['clipped'])} "
                "sit at an end of their plausible range (a reference this clean or this small says nothing the "
                "ranges did not)")
    else:
        head = f"{len(inside)} heuristic threshold(s) set inside their plausible range, {len(comparison['clipped'])} clipped"
    head += f"; {len(changed)} value(s) differ from the config's" if changed else "; no value differs from the config's"
    if comparison.get("earlier_reference_docs") is not None:
        head += (f"; the config's were calibrated on {comparison['earlier_reference_docs']} reference documents, "
                 f"these on {comparison['reference_docs']}")
    if not comparison["written"]:
        head += ": NOT written (--replace to write)"
    return head


def _value(v) -> str:
    return "off" if v is None else f"{v:g}"


def comparison_html(comparison: dict) -> list[str]:
    from quipu.flows.html_report import _table
    return [f"<p><b>Old and new</b>: {moved_sentence(comparison)}.</p>",
            _table(["threshold", "old (the config's)", "new", "clipped", "how"],
                   [[r["rule"], _value(r["old"]), _value(r["new"]), "clipped" if r["clipped"] else "",
                     r["how"]] for r in comparison["rows"]], {1, 2})]


def report_markdown(report: dict) -> str:
    lines = ["# Calibration report", "", f"config `{report['config']}`, mode {report['mode']}", ""]
    for lang, ev in report["languages"].items():
        lines += [f"## {lang}: {ev['reference_docs']} reference, {ev['junk_docs']} junk documents", "",
                  f"removed together: reference {100 * ev['reference_removed']:.1f} %"
                  + (f", junk {100 * ev['junk_removed']:.1f} %" if ev.get("junk_removed") is not None else ""), "",
                  "| rule | statistic | cut-off | reference removed % | junk removed % |", "|---|---|---|---|---|"]
        for r in ev["rules"]:
            thr = "off" if r["threshold"] is None else f"{r['threshold']:g}"
            junk = f"{100 * r['junk_removed']:.1f}" if "junk_removed" in r else ""
            lines.append(f"| {r['rule']} | {r['statistic']} | {thr} | {100 * r['reference_removed']:.1f} | {junk} |")
        lines.append("")
    if report.get("comparison"):
        lines += ["## Old and new", "", moved_sentence(report["comparison"]), "",
                  "| threshold | old | new | clipped |", "|---|---|---|---|"]
        lines += [f"| {r['rule']} | {_value(r['old'])} | {_value(r['new'])} | {'clipped' if r['clipped'] else ''} |"
                  for r in report["comparison"]["rows"]]
    return "\n".join(lines)


# ---- the work -----------------------------------------------------------------------------------

OLD_CALIBRATION = re.compile(r"^# calibrated (?P<lang>[^:\s]+): --keep [0-9.]+, (?P<docs>\d+) reference documents")


def earlier_calibration(config_path: str, lang: str) -> int | None:
    """How many reference documents the config's current `lang` thresholds were calibrated on (from
    the header line this module writes), or None when it holds no calibration of `lang`."""
    for line in Path(config_path).read_text(encoding="utf-8").splitlines():
        m = OLD_CALIBRATION.match(line)
        if m and m["lang"] == lang:
            return int(m["docs"])
    return None


def read_reference(config, reference: list[str], lang: str) -> list[str]:
    """The reference texts, refused in one line (empty, too small, another language) before any statistic."""
    ref_texts = read_texts(reference, "--reference")
    try:
        cal.check_reference(len(ref_texts), lang)
        labels, _, _ = cal.lid_scores(ref_texts, lang, config.langid)
        cal.check_reference(len(ref_texts), lang, labels)
    except cal.CalibrationError as e:
        raise CalibrateError(str(e)) from None
    return ref_texts


def fit_fluency(config, lang: str, ref_texts: list[str], junk_texts: list[str] | None, crawl_texts: list[str] | None,
                ) -> tuple[object, list[dict], list[dict]]:
    """The fluency judges fitted on the reference (tasks.fluency.fit_with_cutoffs: cut-offs from held-out
    folds); returns the model, the report rows (held-out reference, junk and crawl scores with the
    cut-off) and the old-and-new rows."""
    from quipu.tasks.fluency import FluencyFilter, fit_with_cutoffs, judge_scores, load_model
    try:
        model, held = fit_with_cutoffs(lang, ref_texts, provenance=f"fitted by quipu calibrate on {len(ref_texts)} "
                                                                   f"{lang} reference documents")
    except ValueError as e:
        raise CalibrateError(f"--fluency-model: {e}") from None
    stage = FluencyFilter(config.fluency)
    old_path = Path(stage.model_path(lang))
    old_model = load_model(str(old_path)) if old_path.is_file() else None
    junk = judge_scores(model, junk_texts) if junk_texts else None
    crawl = judge_scores(model, crawl_texts) if crawl_texts else None
    rows, sides = [], []
    for key in ("word_order", "burstiness"):
        cut = model.cutoffs[key]
        rows.append(cal.score_row(f"fluency.min_{key}", f"fluency_{key} (reference: held-out folds)", cut,
                                  held["reference"][key], junk and junk[key], crawl and crawl[key]))
        how = ("percentile 1.5 of the held-out reference" if key == "burstiness" else
               "halfway between the held-out reference's percentile 1.5 and its spun copies' 95th")
        sides.append({"rule": f"fluency.min_{key}", "new": cut, "clipped": False, "how": how,
                      "old": stage.cutoff(old_model, key, lang) if old_model is not None else None})
    return model, rows, sides


def apply_fluency(raw: dict, lang: str, cutoffs: dict, model_path: str, docs: int) -> tuple[dict, dict]:
    """`raw` with the fluency stage on for `lang`, its model and its two cut-offs; a comment on each."""
    import copy
    raw = copy.deepcopy(raw)
    block = raw.get("fluency") or {}
    raw["fluency"] = block
    block["enabled"] = True
    block["languages"] = sorted(set(block.get("languages") or ["en", "es", "pt"]) | {lang})
    block["model_paths"] = {**(block.get("model_paths") or {}), lang: model_path}
    comments = {("fluency", "model_paths", lang): f"fitted by quipu calibrate on {docs} {lang} reference docs"}
    for key, value in cutoffs.items():
        current = block.get(f"min_{key}")
        per_lang = dict(current) if isinstance(current, dict) else {"default": current}
        per_lang[lang] = value
        block[f"min_{key}"] = per_lang
        comments[("fluency", f"min_{key}", lang)] = (
            f"{key} cut-off from held-out folds of {docs} {lang} reference docs (quipu.tasks.fluency.fit_with_cutoffs)")
    return raw, comments


def run_calibration(config_path: str, reference: list[str], lang: str, junk: list[str] | None = None,
                    keep: float = 0.97, output: str | None = None, check: bool = False,
                    report_path: str | None = None, crawl: list[str] | None = None,
                    lid_tau: tuple[float, str] | None = None, replace: bool = False,
                    fluency_model: str | None = None) -> dict:
    """Calibrate (or only check) `lang`'s thresholds; writes the config (unless check) and the report.
    The report holds the config's old values beside the new ones; a config calibrated on more reference
    documents than this reference has is not replaced unless `replace` (the report is written either way)."""
    from quipu.flows.config import load_config, read_yaml
    from quipu.flows.curate import CurateConfig
    if not 0.5 <= keep < 1:
        raise CalibrateError(f"--keep: expected a share of the reference to keep between 0.5 and 1 (got {keep})")
    if not check and not output:
        raise CalibrateError("--output: where to write the calibrated config (or --check for the report only)")
    if lid_tau is not None and not 0.3 <= lid_tau[0] <= 0.9:
        raise CalibrateError(f"--lid-tau: expected FineWeb-2's tau, between 0.3 and 0.9 (got {lid_tau[0]})")
    if languages.language(lang) is None:
        raise CalibrateError(languages.missing_message("--lang", [lang], "calibration and the heuristics stage"))
    raw = read_yaml(config_path)
    config = load_config(CurateConfig, config_path)
    if lang not in config.langid.languages:     # a new language: kept from now on (and no rival of itself)
        config.langid = config.langid.model_copy(update={"languages": [*config.langid.languages, lang]})
    ref_texts = read_reference(config, reference, lang)
    heur = config.heuristics.model_copy(update={"compat": "quipu"})
    junk_texts = read_texts(junk, "--junk") if junk else None
    crawl_lid, crawl_texts = None, None
    if crawl:
        crawl_texts = read_texts(crawl, "--crawl")
        if not crawl_texts:
            raise CalibrateError(f"--crawl: no documents in {', '.join(crawl)}")
        crawl_labels, crawl_scores, _ = cal.lid_scores(crawl_texts, lang, config.langid)
        crawl_lid = (crawl_labels, crawl_scores)
    ref = cal.measure(ref_texts, lang, heur, config.langid)
    junk_m = cal.measure(junk_texts, lang, heur, config.langid) if junk_texts else None
    written, comparison = None, None
    if not check:
        try:
            values = cal.calibrate(ref, heur, config.langid, keep, crawl_lid, lid_tau)
        except cal.CalibrationError as e:
            raise CalibrateError(str(e)) from None
        rows = cal.side_by_side(values, heur, config.langid, lang)
        fluency = None
        if fluency_model:
            model, fluency_rows, sides = fit_fluency(config, lang, ref_texts, junk_texts, crawl_texts)
            rows += sides
            fluency = (model, fluency_model)
        earlier = earlier_calibration(config_path, lang)
        comparison = {"rows": rows, **cal.moved(rows), "earlier_reference_docs": earlier,
                      "reference_docs": len(ref_texts),
                      "written": replace or earlier is None or earlier <= len(ref_texts)}
        if comparison["written"]:
            written = write_calibrated(config_path, raw, lang, values, keep, ref_texts, reference, output, fluency)
            config = load_config(CurateConfig, written)
            heur = config.heuristics
    evaluation = cal.evaluate(ref, junk_m, heur, config.langid)
    if fluency_model and not check:
        evaluation["rules"] += fluency_rows
    if crawl_lid is not None:
        evaluation["rules"][0]["crawl_hist"] = cal.crawl_hist(evaluation["rules"][0], crawl_lid, lang)
    report = {"config": written or config_path, "mode": "check" if check else "calibrate", "keep": keep,
              "reference": reference, "junk": junk or [], "crawl": crawl or [], "languages": {lang: evaluation}}
    if comparison is not None:
        report["comparison"] = comparison
    base = Path(report_path) if report_path else Path(output or config_path).with_suffix("")
    json_path = Path(f"{base}.calibration.json")
    html_path = Path(f"{base}.calibration.html")
    write_bytes_atomic(json_path, json.dumps(report, indent=1, sort_keys=True).encode())
    write_bytes_atomic(html_path, render_html(report).encode())
    report["files"] = {"json": str(json_path), "html": str(html_path)}
    if comparison is not None and not comparison["written"]:
        raise CalibrateError(f"{lang}: {config_path} was calibrated on {comparison['earlier_reference_docs']} reference "
                             f"documents and this reference has {len(ref_texts)}: not replaced (old and new side by side "
                             f"in {html_path}); pass --replace to write it anyway")
    return report


def write_calibrated(config_path: str, raw: dict, lang: str, values: dict, keep: float, ref_texts: list[str],
                     reference: list[str], output: str, fluency: tuple | None = None) -> str:
    """The calibrated config at `output`, every calibrated value with its comment; checked to read back."""
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig
    new_raw, comments = cal.apply(raw, lang, values)
    if fluency is not None:
        model, model_path = fluency
        Path(model_path).parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(Path(model_path), (json.dumps(model.data, ensure_ascii=False, sort_keys=True,
                                                         separators=(",", ":")) + "\n").encode())
        new_raw, more = apply_fluency(new_raw, lang, model.cutoffs, model_path, len(ref_texts))
        comments.update(more)
    comments = {**read_comments(config_path), **comments}   # earlier languages' notes stay
    load_config(CurateConfig, data=new_raw)                 # what is written must load
    earlier = [line[2:] for line in Path(config_path).read_text(encoding="utf-8").splitlines()
               if line.startswith("# calibrated ") and not line.startswith(f"# calibrated {lang}:")]
    header = ["written by `quipu calibrate`: every calibrated threshold says which statistic and percentile",
              "of the reference documents it is (clipped to the rule's plausible range where noted); docs/languages.md",
              *earlier, f"calibrated {lang}: --keep {keep}, {len(ref_texts)} reference documents from "
                        f"{', '.join(Path(r).name for r in reference)}"]
    written = str(output)
    Path(written).parent.mkdir(parents=True, exist_ok=True)
    text = config_yaml(new_raw, comments, header) + "\n"
    if _canonical(yaml.safe_load(text)) != _canonical(new_raw):    # reads back as exactly what was calibrated
        raise CalibrateError(f"{written}: the calibrated config does not read back as written; not written")
    write_bytes_atomic(Path(written), text.encode())
    return written


def calibrate_flow_fn(config_path: str, reference: list[str], lang: str, junk: list[str] | None = None,
                      keep: float = 0.97, output: str | None = None, check: bool = False,
                      report_path: str | None = None, crawl: list[str] | None = None,
                      lid_tau: tuple[float, str] | None = None, replace: bool = False,
                      fluency_model: str | None = None) -> dict:
    """The calibration as a Prefect flow run, with the report as the artifact `calibration-<lang>`."""
    from prefect import flow
    from prefect.artifacts import create_markdown_artifact

    @flow(name="calibrate", log_prints=False)
    def calibrate_flow() -> dict:
        report = run_calibration(config_path, reference, lang, junk, keep, output, check, report_path, crawl,
                                 lid_tau, replace, fluency_model)
        create_markdown_artifact(key=f"calibration-{lang}", markdown=report_markdown(report),
                                 description=f"quipu calibrate: per-rule cut-offs for {lang}, reference and junk removed")
        return report

    return calibrate_flow()


def parse_lid_tau(text: str | None) -> tuple[float, str] | None:
    if text is None:
        return None
    value, _, source = text.partition("=")
    try:
        tau = float(value)
    except ValueError:
        tau = None
    if tau is None or not source.strip():
        raise CalibrateError(f"--lid-tau: expected VALUE=WHERE (a number, then where it was computed), got {text!r}")
    return tau, cal.lid_tau_over(source.strip())


def cmd_calibrate(args) -> int:
    kwargs = dict(config_path=args.config, reference=args.reference, lang=args.lang, junk=args.junk, keep=args.keep,
                  output=args.output, check=args.check, report_path=args.report, crawl=args.crawl,
                  lid_tau=parse_lid_tau(args.lid_tau), replace=args.replace, fluency_model=args.fluency_model)
    report = calibrate_flow_fn(**kwargs) if args.flow else run_calibration(**kwargs)
    ev = report["languages"][args.lang]
    if report["mode"] == "calibrate":
        print(f"wrote {report['config']}")
        comparison = report["comparison"]
        print(f"{args.lang}: {moved_sentence(comparison)}")
        for r in comparison["rows"]:
            if r["rule"] in comparison["changed"] or r["clipped"]:
                print(f"  {r['rule']:<44} old {_value(r['old']):<8} new {_value(r['new']):<8}"
                      + ("  (clipped)" if r["clipped"] else ""))
    print(f"{args.lang}: {ev['reference_docs']} reference documents, {100 * ev['reference_removed']:.1f} % removed"
          + (f"; {ev['junk_docs']} junk documents, {100 * ev['junk_removed']:.1f} % removed" if ev.get("junk_removed") is not None else ""))
    for r in ev["rules"]:
        if r["reference_removed"] or r.get("junk_removed"):
            thr = "off" if r["threshold"] is None else f"{r['threshold']:g}"
            print(f"  {r['rule']:<44} cut-off {thr:<8} reference {100 * r['reference_removed']:5.1f} %"
                  + (f"  junk {100 * r['junk_removed']:5.1f} %" if "junk_removed" in r else ""))
    print(f"report: {report['files']['html']} (and .json)")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="per-language filter thresholds from reference text (FineWeb-2's method), "
                                         "or --check: the report card of a config")
    p.add_argument("config", help="curate config to start from (or to check)")
    p.add_argument("--reference", action="append", required=True, help="glob of text you trust in --lang (JSONL/parquet; repeatable)")
    p.add_argument("--lang", required=True, help="the language to calibrate, as langid labels it (es, pt, en...)")
    p.add_argument("--junk", action="append", help="glob of text the config should remove (repeatable): the report shows how much it does")
    p.add_argument("--crawl", action="append", help="glob of a sample of your crawl (repeatable): LID tau is computed "
                                                    "over its documents in --lang, as FineWeb-2 does, not over the reference")
    p.add_argument("--lid-tau", help="VALUE=WHERE: LID tau computed FineWeb-2's way over a crawl you cannot sample here, "
                                      "and where it comes from (e.g. '0.799=FineWeb-2's Portuguese crawl (published)')")
    p.add_argument("--fluency-model", help="also fit the fluency judges (word order, burstiness) on the reference: "
                                            "the model is written to this path and the config's fluency stage uses it")
    p.add_argument("--replace", action="store_true", help="write even when CONFIG's thresholds for --lang were "
                                                          "calibrated on more reference documents than this reference has")
    p.add_argument("--keep", type=float, default=0.97, help="share of the reference that must pass every rule together (default 0.97)")
    p.add_argument("--output", help="the calibrated config to write")
    p.add_argument("--check", action="store_true", help="only the report card of CONFIG's thresholds; writes no config")
    p.add_argument("--report", help="report path prefix (default: beside the output config)")
    p.add_argument("--flow", action="store_true", help="run as a Prefect flow (the report also as an artifact)")
    p.set_defaults(func=cmd_calibrate)
