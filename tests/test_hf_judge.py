"""Stage `hf_judge`: any Hugging Face sequence-classification model from a folder scores documents.
Tiny models the tests build themselves (tests/hf_tiny.py): no download."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.catalog.errors import UserError
from quipu.tasks.classifiers.transformer_judge import HfJudge, HfJudgeConfig
from quipu.scoring.hf_classifier import HfModelError, load_hf_classifier
from tests.hf_tiny import tiny_bert

TEXTS = {
    "es": ["el la de que y a en un ser se no los las por con una para es " * k for k in (1, 3, 9, 40)]
    + ["de la de la que que", "los las por", "el el el no no", "una para es con"],
    "pt": ["o os da do em um uma para com não se na no ao " * k for k in (1, 2, 30)] + ["não não o", "da do em"],
    "en": ["the of and to in is that it for was on are with as " * k for k in (1, 5)] + ["the the of", "it was"],
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf-models")
    return {"regression": tiny_bert(root / "reg"),
            "numeric": tiny_bert(root / "num", 3, {0: "0", 1: "1", 2: "2"}, seed=1),
            "named": tiny_bert(root / "named", 2, {0: "lq", 1: "hq"}, seed=2)}


def docs() -> pa.Table:
    rows = [(f"{lang}-{i}", t, lang) for lang, ts in TEXTS.items() for i, t in enumerate(ts)]
    return pa.table({"id": [r[0] for r in rows], "text": [r[1] for r in rows], "lang": [r[2] for r in rows]})


def reference_scores(folder, texts, head, label=None):
    """Plain transformers, one document at a time, no padding: what the batched scorer must equal."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    out = []
    for t in texts:
        with torch.no_grad():
            logits = model(**tok(t, truncation=True, max_length=64, return_tensors="pt")).logits[0]
        if head == "regression":
            out.append(float(logits[0]))
        elif head == "expected":
            out.append(float(torch.softmax(logits, -1) @ torch.tensor([0.0, 1.0, 2.0])))
        else:
            out.append(float(torch.softmax(logits, -1)[model.config.label2id[label]]))
    return out


@pytest.mark.parametrize("kind,head,label", [("regression", "regression", None), ("numeric", "expected", None),
                                             ("named", "probability", "hq")])
def test_batched_scores_equal_one_document_at_a_time(models, kind, head, label):
    """Length-sorted batches with padding, truncation at the model's 64 positions (a 40x text), every
    head: the same scores as plain transformers on each document alone; `auto` picks the head."""
    texts = [t for ts in TEXTS.values() for t in ts]
    clf = load_hf_classifier(models[kind], head="auto", label=label, device="cpu", batch_size=3)
    assert clf.head == head and clf.max_length == 64
    got = clf.score(texts)
    want = reference_scores(str(models[kind]), texts, head, label)
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-5
    assert len(set(got)) > len(texts) // 2        # the documents score apart: the check can fail
    assert clf.score(texts[::-1]) == got[::-1]    # another batching, the same bytes


def test_stage_thresholds_per_language_unscored_languages_and_stats(models, tmp_path):
    """One model for es and pt, none for en (kept unscored, counted); a threshold per language; every
    input document kept or removed with a reason; the score column on both sides."""
    table = docs()
    scores = load_hf_classifier(models["regression"], device="cpu").score(table.column("text").to_pylist())
    es_mid = sorted(s for s, lang in zip(scores, table.column("lang").to_pylist()) if lang == "es")[4]
    cfg = HfJudgeConfig(enabled=True, model={"default": "off", "es": str(models["regression"]),
                                             "pt": str(models["regression"])},
                        threshold={"default": 1e9, "es": es_mid, "pt": "off"}, device="cpu")
    stage = HfJudge(cfg)
    stage.check()
    out = stage.process(table)
    assert out.kept.num_rows + out.removed.num_rows == table.num_rows
    removed = out.removed.to_pylist()
    assert {r["lang"] for r in removed} == {"es"} and len(removed) == 4      # pt: off, en: no model
    assert all(r["reason"] == f"hf_judge<{es_mid:.2f}" and r["hf_judge_score"] < es_mid for r in removed)
    kept = out.kept.to_pylist()
    assert all((r["hf_judge_score"] is None) == (r["lang"] == "en") for r in kept)
    assert out.stats["unscored_by_lang"] == {"en": 4}
    assert out.stats["docs_by_lang"] == {"es": 8, "pt": 5} and out.stats["removed_by_lang"] == {"es": 4, "pt": 0}
    assert sum(out.stats["histogram_by_lang"]["es"].values()) == 8
    assert set(stage.describe()["models"]) == {"es", "pt"}


def test_stage_runs_in_the_pipeline_and_feeds_the_tiers(models, tmp_path):
    """Found in tasks/classifiers/ by the pipeline; its column is a tier judge with no other wiring."""
    from quipu.tasks.pipeline import run_local, stage_names
    from quipu.tasks.stage import write_table
    from quipu.tasks.tiers import QualityTiers, TiersConfig, fit_tables
    assert stage_names().index("hf_judge") < stage_names().index("tiers")
    shard = write_table(tmp_path / "in" / "part-0.parquet", docs())
    cfg = HfJudgeConfig(enabled=True, model=str(models["regression"]), keep="top_fraction", top_fraction=0.5,
                        device="cpu")
    results, report = run_local("hf_judge", cfg, [shard], tmp_path / "run")
    assert results[0].kept_docs == 4 + 3 + 2 and results[0].removed_docs == 17 - 9
    assert report["stats"]["cutoffs"]["es"]["keep_all"] is False
    kept = pq.read_table(results[0].kept.path)
    tables = fit_tables([kept], {"hf_judge_score": True}, min_docs=2)
    tables.save(tmp_path / "tables.json")
    tiered = QualityTiers(TiersConfig(enabled=True, tables=str(tmp_path / "tables.json"), tiers=2)).process(kept)
    tiers = tiered.kept.column("quality_tier").to_pylist()
    assert None not in tiers and set(tiers) == {0, 1}


def test_bad_folder_or_head_is_one_line_before_any_document(models, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text("{}")
    for folder, says in [(tmp_path / "missing", "not a folder"), (tmp_path / "empty", "no config.json"),
                         (tmp_path / "noweights", "no weights")]:
        stage = HfJudge(HfJudgeConfig(enabled=True, model={"default": str(models["regression"]), "pt": str(folder)}))
        with pytest.raises(UserError) as e:
            stage.check()
        assert says in str(e.value) and str(folder) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(HfModelError, match="not numbers; set `label:`"):
        HfJudge(HfJudgeConfig(enabled=True, model=str(models["named"]), device="cpu")).check()
    with pytest.raises(HfModelError, match="no label 'good'"):
        HfJudge(HfJudgeConfig(enabled=True, model=str(models["named"]), label="good", device="cpu")).check()
    with pytest.raises(ValueError, match="model"):
        HfJudgeConfig(enabled=True)
    with pytest.raises(ValueError, match="language code"):
        HfJudgeConfig(model={"default": "x", "ES": "y"})
    assert HfJudgeConfig().enabled is False
