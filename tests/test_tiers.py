"""Stage `tiers` (tasks/tiers.py): token-weighted percentile tables, the tier a document gets, removal
by tier per language with its stats, `quipu tiers fit`, blends and ablations selecting by tier."""
from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.tasks.tiers import (DEFAULT_TABLES, QualityTiers, TierTables, TiersConfig, fit_tables, load_tables,
                               percentile_of, weighted_quantiles)
from tests.conftest import ROOT, quipu_main

JUDGES = {"fluency_word_order": True, "ppl_kenlm": False}


def docs(n: int, langs=("es", "pt"), seed: int = 0) -> pa.Table:
    rng = random.Random(seed)
    return pa.table({"id": [f"d{i:04d}" for i in range(n)],
                     "text": [" ".join(["palabra"] * rng.randint(5, 300)) for _ in range(n)],
                     "lang": [langs[i % len(langs)] for i in range(n)],
                     "fluency_word_order": [rng.uniform(-1, 3) for _ in range(n)],
                     "ppl_kenlm": [rng.uniform(50, 5000) if i % 7 else None for i in range(n)]})


def stage_with(tables: TierTables, tmp_path, **cfg) -> QualityTiers:
    path = tmp_path / f"tables-{len(list(tmp_path.glob('tables-*')))}.json"
    tables.save(path)
    stage = QualityTiers(TiersConfig(enabled=True, tables=str(path), **cfg))
    stage.check()
    return stage


def test_quantiles_weigh_documents_by_their_tokens():
    # one long low-scoring document outweighs nine short high-scoring ones
    q = weighted_quantiles([0.0] + [1.0] * 9, [100] + [1] * 9)
    assert q[50] == 0.0 and q[90] == 0.0 and q[100] == 1.0
    q = weighted_quantiles([0.0] + [1.0] * 9, [1] * 10)      # unweighted: the median is 1
    assert q[50] == 1.0 and q[5] == 0.0


def test_percentile_is_monotone_and_bounded():
    rng = np.random.default_rng(1)
    q = weighted_quantiles(list(np.round(rng.normal(size=500), 1)), list(rng.integers(1, 50, 500)))
    xs = np.linspace(-5, 5, 2001)
    ps = [percentile_of(float(x), q) for x in xs]
    assert all(b >= a for a, b in zip(ps, ps[1:]))
    assert ps[0] == 0.0 and ps[-1] == 100.0
    assert percentile_of(q[50], q) == pytest.approx(50, abs=10)


def test_lower_is_better_judges_and_combination(tmp_path):
    t = fit_tables([docs(400)], JUDGES, min_docs=10)
    assert t.judges["ppl_kenlm"]["higher_is_better"] is False
    lo, hi = t.percentile("ppl_kenlm", "es", 60.0), t.percentile("ppl_kenlm", "es", 4900.0)
    assert lo > 90 and hi < 10       # a low perplexity is a high percentile
    assert t.percentile("ppl_kenlm", "en", 60.0) is None      # no table for the language
    best = stage_with(t, tmp_path, combine="max").assign("es", {"fluency_word_order": -0.9, "ppl_kenlm": 60.0})
    worst = stage_with(t, tmp_path, combine="min").assign("es", {"fluency_word_order": -0.9, "ppl_kenlm": 60.0})
    assert best[1] == 4 and worst[1] == 0
    assert stage_with(t, tmp_path).assign("en", {"fluency_word_order": 1.0}) == (None, None)


def test_tiers_do_not_depend_on_batches_or_order(tmp_path):
    """Fitting on shuffled rows in other batches gives the same bytes; tiers of a batch equal the
    tiers of its rows processed one by one."""
    table = docs(600)
    a = fit_tables([table], JUDGES, max_docs=200, min_docs=10)
    perm = np.random.default_rng(3).permutation(table.num_rows)
    shuffled = table.take(pa.array(perm))
    b = fit_tables([shuffled.slice(i, 37) for i in range(0, shuffled.num_rows, 37)], JUDGES, max_docs=200, min_docs=10)
    a.save(tmp_path / "a.json")
    b.save(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    stage = stage_with(a, tmp_path)
    whole = stage.process(table).kept.column("quality_tier").to_pylist()
    single = [stage.process(table.slice(i, 1)).kept.column("quality_tier").to_pylist()[0] for i in range(60)]
    assert whole[:60] == single
    assert set(whole) == {0, 1, 2, 3, 4}


def test_min_tier_removes_per_language_with_reasons_and_stats(tmp_path):
    table = docs(500)
    stage = stage_with(fit_tables([table], JUDGES, min_docs=10), tmp_path, min_tier={"default": None, "es": 2})
    out = stage.process(table)
    assert out.kept.num_rows + out.removed.num_rows == table.num_rows
    removed = out.removed.to_pylist()
    assert removed and {r["lang"] for r in removed} == {"es"}
    assert all(r["quality_tier"] < 2 and r["reason"] == "tiers:quality_tier<2" for r in removed)
    assert all(r["lang"] == "pt" or r["quality_tier"] >= 2 for r in out.kept.to_pylist())
    stats = stage.finalize(out.stats, None, None, None)["tiers"]
    for lang in ("es", "pt"):
        rows = [r for r in table.to_pylist() if r["lang"] == lang]
        assert sum(t["docs"] for t in stats[lang].values()) == len(rows)
        assert sum(t["tokens"] for t in stats[lang].values()) == sum(len(r["text"].split()) for r in rows)
        assert all("example" in t and t["example"]["id"] for t in stats[lang].values())
    assert sum(t["docs"] - t["kept_docs"] for t in stats["es"].values()) == len(removed)
    assert all(t["kept_docs"] == t["docs"] for t in stats["pt"].values())


def test_unscored_documents_are_kept_or_removed_as_configured(tmp_path):
    tables = fit_tables([docs(200)], JUDGES, min_docs=10)
    batch = pa.table({"id": ["x", "y"], "text": ["hola", "olá"], "lang": ["es", "en"],
                      "fluency_word_order": [None, 1.0], "ppl_kenlm": [None, 100.0]})
    kept = stage_with(tables, tmp_path).process(batch)
    assert kept.kept.num_rows == 2 and kept.kept.column("quality_tier").to_pylist() == [None, None]
    assert kept.stats["tiers"]["es"]["unscored"]["docs"] == 1
    out = stage_with(tables, tmp_path, unscored="remove").process(batch)
    assert out.removed.column("reason").to_pylist() == ["tiers:unscored"] * 2
    # a judge whose stage did not run: the others decide, and the stats say so
    scored = pa.table({"id": ["z"], "text": ["olá " * 50], "lang": ["pt"], "fluency_word_order": [1.0]})
    partial = stage_with(tables, tmp_path).process(scored)
    assert partial.stats["judge_column_missing_docs"] == {"ppl_kenlm": 1}
    assert partial.kept.column("quality_tier").to_pylist()[0] is not None


def test_bad_tables_and_config_fail_before_any_document(tmp_path):
    tables = fit_tables([docs(200)], JUDGES, min_docs=10)
    with pytest.raises(ValueError, match="removes every document"):
        stage_with(tables, tmp_path, min_tier=5)
    with pytest.raises(ValueError, match="tiers.judges: quality_score not in"):
        stage_with(tables, tmp_path, judges=["quality_score"])
    (tmp_path / "bad.json").write_text(json.dumps({"format": "something-else"}))
    load_tables.cache_clear()
    with pytest.raises(ValueError, match="not a quality-tier table file"):
        QualityTiers(TiersConfig(enabled=True, tables=str(tmp_path / "bad.json"))).check()
    with pytest.raises(FileNotFoundError, match="tiers.tables"):
        QualityTiers(TiersConfig(enabled=True, tables=str(tmp_path / "none.json"))).check()
    with pytest.raises(ValueError, match="language code"):
        TiersConfig(min_tier={"default": None, "ES": 1})


def test_shipped_tables_match_the_shipped_judges():
    """The shipped tables were fitted with the fluency models and the curate settings shipped now: a
    rebuilt fluency model changes what its scores mean, and a changed threshold or LID tau before the
    tiers stage changes which documents the tables rank; either way they must be refitted
    (bench/tier_tables.py --write)."""
    from bench.tier_tables import curate_settings_sha256
    from quipu.catalog.files import sha256_file
    from quipu.tasks.fluency import MODEL_DIR
    tables = TierTables.load(DEFAULT_TABLES)
    now = {f"fluency/{p.name}": sha256_file(p) for p in sorted(MODEL_DIR.glob("*.json"))}
    stale = "tasks/tier_tables/default.json is stale: rerun `python bench/tier_tables.py --write`"
    assert tables.data["provenance"]["judge_models"] == now, stale
    assert tables.data["provenance"]["curate_settings_sha256"] == curate_settings_sha256(), stale
    assert set(tables.judges) >= {"fluency_word_order", "fluency_burstiness"}
    assert all(set(spec["languages"]) == {"en", "es", "pt"} for spec in tables.judges.values())


def test_where_selects_and_weights_by_tier():
    """Blends select by tier with the trainer's `where:` (a null tier never matches)."""
    from quipu.trainer.data import where_mask
    t = pa.table({"quality_tier": pa.array([0, 1, 2, 3, 4, None], pa.int64()), "lang": ["es"] * 6})
    assert where_mask(t, {"quality_tier": ">= 3"}, "s").tolist() == [False, False, False, True, True, False]
    assert where_mask(t, {"quality_tier": [0, 1], "lang": "es"}, "s").tolist() == [True, True, False, False, False, False]


def test_equal_tokens_selection_takes_the_same_tokens_per_language(tmp_path):
    from quipu.flows.ablate_select import select_draws
    from quipu.tasks.stage import write_table

    class WordTokenizer:
        def encode_docs(self, texts):
            return [t.split() for t in texts]
    table = docs(300).append_column("quality_tier", pa.array([i % 5 for i in range(300)], pa.int64()))
    part = write_table(tmp_path / "curated" / "part-00000.parquet", table)
    wheres = {"top": {"quality_tier": ">= 3"}, "random": {}, "bottom": {"quality_tier": "<= 0"}}
    out, = select_draws({v: [part] for v in wheres}, wheres, True, [(0, "selected")], WordTokenizer(), tmp_path / "sel")
    budget = out["top"]["budget"]
    longest = max(len(t.split()) for t in table.column("text").to_pylist())
    for v, sel in out.items():
        rows = pq.read_table(sel["parts"][0].path).to_pylist()
        assert all(r["quality_tier"] >= 3 for r in rows) if v == "top" else True
        for lang in ("es", "pt"):
            assert budget[lang] <= sel["tokens_by_lang"][lang] < budget[lang] + longest
    assert out["bottom"]["tokens_by_lang"] == budget      # the smallest selection sets the budget
    again, = select_draws({v: [part] for v in wheres}, wheres, True, [(0, "selected")], WordTokenizer(), tmp_path / "sel2")
    assert again["random"]["parts"][0].sha256 == out["random"]["parts"][0].sha256


def test_selection_order_is_fixed_by_seed_and_ids_not_by_file_order():
    """ablate_select: each variant takes its documents in an order fixed by `sample_seed` and the ids
    alone, so the same documents in another file order are taken in the same order."""
    import random

    from quipu.flows.ablate_select import sample_order
    ids = [f"doc-{i}" for i in range(60)]
    order = [ids[i] for i in sample_order(ids, 3)]
    shuffled = ids[:]
    random.Random(1).shuffle(shuffled)
    assert [shuffled[i] for i in sample_order(shuffled, 3)] == order
    assert sorted(order) == sorted(ids) and order != ids and [ids[i] for i in sample_order(ids, 4)] != order


def test_tiers_fit_command(tmp_path, capsys):
    pq.write_table(docs(300), tmp_path / "scored.parquet")
    out = tmp_path / "t.json"
    assert quipu_main("tiers", "fit", str(tmp_path / "scored.parquet"), "--output", str(out), "--min-docs", "20") == 0
    t = TierTables.load(out)
    assert set(t.judges) == {"fluency_word_order", "ppl_kenlm"} and t.data["provenance"]["inputs"]
    assert quipu_main("tiers", "fit", str(tmp_path / "nothing*.parquet"), "--output", str(out)) != 0
    assert quipu_main("tiers", "fit", str(tmp_path / "scored.parquet"), "--output", str(out), "--judge", "text_len") != 0
    err = capsys.readouterr().err
    assert "no such file" in err and "say whether higher or lower is better" in err


def test_classifier_stages_scores_are_known_judges():
    """The hf_judge and edu stages' score columns are judges with their direction known: `quipu tiers fit`
    without --judge fits them when a run has them, and `--judge edu_score` needs no direction."""
    from quipu.flows.tiers_cli import parse_judges
    from quipu.tasks.tiers import KNOWN_JUDGES
    assert parse_judges(["edu_score", "hf_judge_score"]) == {"edu_score": True, "hf_judge_score": True}
    t = docs(200)
    t = t.append_column("edu_score", pa.array([i / 200 for i in range(200)], pa.float64()))
    t = t.append_column("hf_judge_score", pa.array([5 - i / 40 for i in range(200)], pa.float64()))
    tables = fit_tables([t], KNOWN_JUDGES, min_docs=20)
    assert {"edu_score", "hf_judge_score"} <= set(tables.judges)
    assert tables.judges["edu_score"]["higher_is_better"] and tables.judges["hf_judge_score"]["higher_is_better"]


def test_report_shows_documents_and_tokens_per_tier():
    from quipu.flows.reports import format_funnel, summary_markdown
    tiers = {"es": {"0": {"docs": 3, "tokens": 120, "kept_docs": 3, "kept_tokens": 120,
                          "example": {"id": "a", "percentile": 4.2, "snippet": "Texto de ejemplo"}},
                    "unscored": {"docs": 1, "tokens": 5, "kept_docs": 1, "kept_tokens": 5}}}
    run = {"run_id": "r", "stages": [{"name": "tiers", "input_docs": 4, "kept_docs": 4, "removed_docs": 0,
                                      "removed_by_reason": {}, "by_language": {}, "tiers": tiers}],
           "curated": {"rows": 4, "shards": []}}
    text = format_funnel(run)
    assert "quality tiers per language" in text and "Texto de ejemplo" in text and "unscored" in text
    assert "| es | 0 | 3 | 120 |" in summary_markdown(run, ["tiers"])
