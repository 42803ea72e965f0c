"""The worked example (docs/architecture.md, "Model families") of a second fastText classifier, the `news` topic stage
(tasks/classifiers/news.py, configs/quality/news.yaml): the pipeline finds it, its config trains a
model of its own kind and labels, and on documents it never saw it keeps news and removes the rest."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from quipu.catalog.files import write_json_atomic
from quipu.flows.config import load_config, read_yaml
from quipu.trainer.classifier_train import ClassifierTrainConfig, model_meta, prepare_data, train_model
from quipu.scoring.fasttext_classifier import model_sidecar
from tests.conftest import ROOT

# records after every training `limit` of configs/quality/news.yaml: (file, first, count)
UNSEEN_NEWS = [("en_nltk_abc_news", 1000, 30), ("es_nltk_conll2002_efe_news", 1000, 30), ("pt_fakebr_news", 3000, 30)]
UNSEEN_OTHER = [("en_nltk_webtext", 2000, 30), ("en_ud_ewt_web", 1000, 30), ("es_activ_es_subtitles", 2000, 30)]


def _records(shared: Path, parts) -> list[dict]:
    out = []
    for name, first, n in parts:
        lines = (shared / "text" / f"{name}.jsonl").read_text().splitlines()[first:first + n]
        out += [json.loads(line) for line in lines]
    return out


def test_news_stage_is_found_trains_and_keeps_news(shared_data, tmp_path):
    from quipu.flows.curate_config import CurateConfig
    from quipu.tasks.classifiers.news import NewsConfig, NewsFilter
    from quipu.tasks.pipeline import stage_names
    assert stage_names().index("news") == stage_names().index("quality") + 1
    assert CurateConfig.model_fields["news"].annotation is NewsConfig

    raw = read_yaml(ROOT / "configs/quality/news.yaml")
    for src in raw["positive"] + raw["negative"]:
        src["path"] = src["path"].replace("../shared/data", str(shared_data))
    cfg = load_config(ClassifierTrainConfig, data={**raw, "output": str(tmp_path)})
    data = prepare_data(cfg, str(tmp_path))
    assert set(data["stats"]["groups"]) == {"en", "es", "pt"}
    assert (tmp_path / "train.txt").read_text().startswith(("__label__news ", "__label__other "))
    model = tmp_path / "model.bin"
    write_json_atomic(model_sidecar(model), model_meta(cfg, data))
    train_model(data["train"], cfg.fasttext, cfg.seed, str(model))

    news, other = _records(shared_data, UNSEEN_NEWS), _records(shared_data, UNSEEN_OTHER)
    docs = news + other
    batch = pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs], "lang": [d["lang"] for d in docs]})
    stage = NewsFilter(NewsConfig(enabled=True, model=str(model)))
    stage.check()
    assert stage.model.kind == "news-fasttext" and stage.model.positive_label == "news"
    out = stage.process(batch)
    kept = set(out.kept.column("id").to_pylist())
    assert "news_score" in out.kept.column_names
    assert sum(d["id"] in kept for d in news) >= 0.9 * len(news)
    assert sum(d["id"] in kept for d in other) <= 0.2 * len(other)   # web text holds some news-like posts
    assert set(out.removed.column("reason").to_pylist()) <= {"news<0.50"}
