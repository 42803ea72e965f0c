"""The dataset card of a curate run, `OUT/README.md`: what produced the curated shards (run, inputs,
config), the funnel, the columns and the licence fields, with the Hugging Face Hub's YAML header.

It sits in the run folder, not in `curated/`: readers pointed at the folder (`pl.read_parquet`,
`load_dataset("parquet", data_dir=...)`) must find nothing but parquet shards there. Upload the
run folder with `--include README.md "curated/*.parquet"` and the Hub shows a documented dataset
whose `configs` entry points at the shards.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import yaml

from quipu.catalog.files import write_bytes_atomic
from quipu.flows.reports import funnel_rows

# What each column means; a column a stage adds without an entry here is listed with its type only.
COLUMN_DOCS = {
    "id": "stable document id (from the input record, or derived from file and position)",
    "text": "the document text after every editing stage (line dedup, PII redaction, decontamination cuts)",
    "source": "the input file the document came from",
    "url": "the page URL (WARC target URI or the record's `url`)",
    "date": "the crawl date (WARC-Date) or the record's `date`",
    "content_type": "the HTTP content type of the page, or the input format",
    "metadata": "every other field of the input record, as one JSON object",
    "domain": "the registered domain of `url`",
    "tld": "the public suffix of `url`",
    "lang": "language by fastText lid.176 (ISO 639-1)",
    "lang_score": "fastText's probability of `lang`",
    "removed_line_spans": "where lines were removed by line-level dedup ({start, end} in the text before the cut)",
    "terminal_punct_score": "fraction of lines ending in terminal punctuation",
    "quality_score": "probability of high quality by the fastText quality classifier",
    "edu_score": "probability that an LLM rates the document >= 3 of 5 for educational value (fastText distilled from `quipu label`)",
    "hf_judge_score": "score of the Hugging Face classifier of stage `hf_judge` (its model's units, e.g. FineWeb-Edu 0-5)",
    "dup_count": "size of the document's duplicate cluster across the dedup index (1: unique)",
    "decontam_hits": "benchmark n-gram matches ({benchmark, item, start, end, words})",
    "decontam_cuts": "spans cut out as benchmark text ({start, end, text})",
    "pii_spans": "where personal data was replaced by a placeholder ({start, end, type})",
    "ppl_wayra": "log-perplexity estimated by the distilled student of the teacher LLM",
    "ppl_kenlm": "KenLM 5-gram perplexity (CCNet normalisation)",
    "ppl_bucket": "head / middle / tail by per-language perplexity percentiles",
}


def column_doc(column: str) -> str:
    """What a curated column means; a column of a stage with no entry above (a classifier dropped into
    tasks/classifiers/) is named by the stage that writes it."""
    from quipu.tasks.pipeline import column_stage
    if column in COLUMN_DOCS:
        return COLUMN_DOCS[column]
    stage = column_stage(column)
    return f"written by stage `{stage}` (quipu's docs/stages.md)" if stage else ""


def _languages(shards: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in shards:
        if "lang" not in pq.read_schema(path).names:
            return {}
        for lang in pq.read_table(path, columns=["lang"]).column("lang").to_pylist():
            if lang:
                counts[lang] = counts.get(lang, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def _size_category(n: int) -> str:
    for limit, name in [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
                        (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M")]:
        if n < limit:
            return name
    return "100M<n<1B"


def dataset_card(summary: dict, name: str, license: str | None, version: str) -> str:
    shards = summary["curated"]["shards"]
    rows = summary["curated"]["rows"]
    langs = _languages(shards)
    header = {
        "pretty_name": name,
        "license": license or "other",
        "language": list(langs),
        "size_categories": [_size_category(rows)],
        "tags": ["quipu", "curated", "web-crawl"],
        "configs": [{"config_name": "default", "data_files": [{"split": "train", "path": "curated/*.parquet"}]}],
    }
    out = ["---", yaml.safe_dump(header, sort_keys=False, allow_unicode=True).strip(), "---", "",
           f"# {name}", "",
           f"Curated by quipu {version}, run `{summary.get('run_id')}`: "
           f"{rows:,} documents in {len(shards)} parquet shards under `curated/`, from "
           f"{summary.get('records_read', 0):,} records read in {len(summary.get('inputs', []))} input files "
           f"({summary.get('quarantined', 0):,} unreadable records quarantined).", ""]
    if langs:
        out += ["Languages: " + ", ".join(f"{lang} {n:,}" for lang, n in langs.items()) + ".", ""]
    out += ["## How it was made", "",
            "Every stage below read what the previous one kept. Removed documents are in `<stage>/removed/` "
            "with their `stage` and `reason`; `<stage>/report.json` has examples per reason.", "",
            "| stage | input | kept | removed | kept % | top removal reasons |", "|---|---:|---:|---:|---:|---|"]
    for r in funnel_rows(summary):
        out.append(f"| {r['stage']} | {r['input']:,} | {r['kept']:,} | {r['removed']:,} | {r['kept %']} | "
                   f"{r['top reasons'].replace('|', '/')} |")
    out += ["", "The full config is in `run.json` (`config`); rerunning it on the same inputs gives the same bytes.", "",
            "## Columns", "", "| column | type | meaning |", "|---|---|---|"]
    if shards:
        for field in pq.read_schema(shards[0]):
            out.append(f"| `{field.name}` | `{field.type}` | {column_doc(field.name)} |")
    out += ["", "## Licence", "",
            f"Dataset licence field: `{license or 'other'}` (set `curated.license` in the curate config). The "
            "documents keep the licences of their sources: check the input files below before redistribution.", "",
            "Inputs:", ""]
    inputs = summary.get("inputs", [])
    out += [f"- `{p}`" for p in inputs[:50]]
    if len(inputs) > 50:
        out.append(f"- … and {len(inputs) - 50} more (all listed in `run.json`)")
    out += ["", "## Loading", "", "```python",
            "import polars as pl", 'df = pl.read_parquet("curated/")', "",
            "from datasets import load_dataset",
            'ds = load_dataset("parquet", data_dir="curated", split="train")', "```", ""]
    return "\n".join(out)


def write_dataset_card(summary: dict, run_dir: str | Path, name: str, license: str | None, version: str) -> Path | None:
    """OUT/README.md, unless a README.md of the user's was there before the run: that one stays."""
    from quipu.catalog.ownership import is_foreign
    if is_foreign(run_dir, "README.md"):
        return None
    path = Path(run_dir) / "README.md"
    write_bytes_atomic(path, dataset_card(summary, name, license, version).encode("utf-8"))
    return path
