"""The example stage of docs/architecture.md, "Adding a stage": terminal_punct, a ScoreFilter without a model.
Through the plain driver (no Prefect) and through the curate flow."""
from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.tasks.pipeline import run_local
from quipu.tasks.stage import write_table
from quipu.tasks.terminal_punct import TerminalPunctConfig, terminal_punct_ratio
from tests.conftest import ROOT, quipu_main

PROSE = "The river rose in the night.\nBy morning the bridge was gone!\nWho could have known?"
MENU = "Home\nAbout us\nProducts\nContact\nLogin"
MIXED = "Menu\nNews\nThe council met on Monday.\nIt voted to rebuild the bridge."   # 2 of 4 lines


def test_ratio_counts_non_empty_lines_ending_in_terminal_punctuation():
    assert terminal_punct_ratio(PROSE, strip=True) == 1.0
    assert terminal_punct_ratio(MENU, strip=True) == 0.0
    assert terminal_punct_ratio(MIXED + "\n\n  \n", strip=True) == 0.5      # blank lines do not count
    assert terminal_punct_ratio("", strip=True) == 0.0
    assert terminal_punct_ratio("Done.  ", strip=True) == 1.0
    assert terminal_punct_ratio("Done.  ", strip=False) == 0.0                # FineWeb's exact rule
    assert terminal_punct_ratio("¿Qué pasó?\n«Nada»", strip=True) == 0.5     # Spanish ? counts, » does not


def _shards(tmp_path, docs_per_shard: list[list[tuple[str, str, str]]]):
    shards = []
    for n, docs in enumerate(docs_per_shard):
        t = pa.table({"id": [d[0] for d in docs], "text": [d[1] for d in docs], "lang": [d[2] for d in docs]})
        shards.append(write_table(tmp_path / "in" / f"part-{n}.parquet", t))
    return shards


def test_threshold_keeps_prose_and_reports_why(tmp_path):
    shards = _shards(tmp_path, [[("p1", PROSE, "en"), ("m1", MENU, "en")], [("x1", MIXED, "es"), ("m2", MENU, "es")]])
    results, report = run_local("terminal_punct", TerminalPunctConfig(enabled=True), shards, tmp_path / "run")
    assert (report["input_docs"], report["kept_docs"], report["removed_docs"]) == (4, 2, 2)
    assert report["removed_by_reason"] == {"terminal_punct<0.12": 2}
    kept = pa.concat_tables([pq.read_table(r.kept.path) for r in results])
    assert kept.column("id").to_pylist() == ["p1", "x1"]
    assert kept.column("terminal_punct_score").to_pylist() == [1.0, 0.5]
    removed = pq.read_table(results[0].removed.path)
    assert removed.column("id").to_pylist() == ["m1"] and removed.column("reason").to_pylist() == ["terminal_punct<0.12"]
    st = report["stats"]
    assert st["keep"] == "threshold" and st["docs_by_lang"] == {"en": 2, "es": 2}
    assert st["histogram_by_lang"] == {"en": {"0.95": 1, "0.00": 1}, "es": {"0.50": 1, "0.00": 1}}
    assert st["mean_by_lang"] == {"en": 0.5, "es": 0.25}
    assert [e["id"] for e in st["highest"]][:2] == ["p1", "x1"]


def test_top_fraction_is_exact_per_language_across_shards(tmp_path):
    """ceil(0.5 * n) per language, whatever the shard boundaries; ties at the cut broken by id."""
    docs = [(f"en-{i:02d}", "\n".join(["line."] * i + ["menu"] * (10 - i)), "en") for i in range(11)]
    docs += [(f"es-{i:02d}", PROSE, "es") for i in range(5)]                 # five equal scores: ties
    shards = _shards(tmp_path, [docs[:4], docs[4:9], docs[9:]])
    cfg = TerminalPunctConfig(enabled=True, keep="top_fraction", top_fraction=0.5)
    results, report = run_local("terminal_punct", cfg, shards, tmp_path / "run")
    kept = [i for r in results for i in pq.read_table(r.kept.path).column("id").to_pylist()]
    assert sorted(i for i in kept if i.startswith("en")) == [f"en-{i:02d}" for i in range(5, 11)]   # ceil(5.5)
    assert sorted(i for i in kept if i.startswith("es")) == ["es-00", "es-01", "es-02"]            # ceil(2.5)
    reasons = {k: v for k, v in report["removed_by_reason"].items()}
    assert reasons == {"terminal_punct<0.50": 5, "terminal_punct=1.00:tie": 2}
    assert report["stats"]["cutoffs"]["es"] == {"score": 1.0, "id": "es-02", "keep_all": False, "keep_none": False}
    assert report["kept_docs"] == math.ceil(5.5) + math.ceil(2.5)
    # a rerun reuses every shard (same input, config, cut-offs) and gives the same bytes
    again, _ = run_local("terminal_punct", cfg, shards, tmp_path / "run")
    assert all(r.skipped for r in again) and [r.kept.sha256 for r in again] == [r.kept.sha256 for r in results]


@pytest.mark.slow
def test_in_the_curate_flow(tmp_path, prefect_server):
    inp = tmp_path / "docs.jsonl"
    inp.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in (("p", PROSE), ("m", MENU), ("x", MIXED))))
    out = tmp_path / "run"
    from quipu.tasks.pipeline import STAGES
    off = [f"--set={s.name}.enabled=false" for s in STAGES if s.name != "terminal_punct"]
    assert quipu_main("curate", str(ROOT / "configs/curate/demo.yaml"), "--input", str(inp), "--output", str(out),
                      "--set", "terminal_punct.enabled=true", "--set", "terminal_punct.threshold=0.6", *off) == 0
    run = json.loads((out / "run.json").read_text())
    assert [s["name"] for s in run["stages"]] == ["extract", "terminal_punct"]
    assert run["stages"][1]["removed_by_reason"] == {"terminal_punct<0.60": 2}
    curated = pq.read_table(out / "curated" / "part-00000.parquet")
    assert curated.column("id").to_pylist() == ["p"] and curated.column("terminal_punct_score").to_pylist() == [1.0]
    assert "terminal_punct" in json.loads((out / "terminal_punct" / "report.json").read_text())["stage"]
