"""The quality classifier: training flow, evaluation, the `quality` stage, and its curate wiring."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.catalog.files import read_json, sha256_file
from quipu.flows.config import load_config, read_yaml
from quipu.tasks.quality import QualityConfig, QualityFilter
from quipu.tasks.score_filter import Cutoff, top_fraction_cutoffs
from quipu.scoring.resolver import QUALITY_KIND, ModelNotFound, resolve_model as resolve
from quipu.scoring.fasttext_classifier import ClassifierModelError, Normalization, load_classifier, normalize_text


def resolve_model(ref):
    return resolve(QUALITY_KIND, ref, "quality.model", (".bin", ".ftz"))

ROOT = Path(__file__).resolve().parents[1]
# Light hyper-parameters so the tests stay fast; the shipped config uses larger ones.
FAST = ["fasttext.dim=32", "fasttext.epoch=5", "fasttext.bucket=50000", "fasttext.thread=1",
        "normalization.max_chars=4000"]


def shared_config(shared_data: Path, out: Path, extra: list[str] = ()):
    """configs/quality/shared-text.yaml with its ../shared/data paths pointed at the fixture's folder."""
    from quipu.trainer.classifier_train import ClassifierTrainConfig
    raw = read_yaml(ROOT / "configs/quality/shared-text.yaml")
    for side in ("positive", "negative"):
        for src in raw[side]:
            src["path"] = src["path"].replace("../shared/data", str(shared_data))
    raw["output"] = str(out)
    return load_config(ClassifierTrainConfig, data=raw, overrides=FAST + list(extra))


@pytest.fixture(scope="module")
def shared_model(shared_data, prefect_server, tmp_path_factory):
    """One classifier trained by the flow on the shared text, for the tests below."""
    from quipu.flows.quality_train import quality_train
    out = tmp_path_factory.mktemp("quality-model")
    summary = quality_train(shared_config(shared_data, out))
    return {"summary": summary, "dir": out, "path": summary["model"]}


# ---- pure logic -------------------------------------------------------------------------------

def test_normalization_is_one_line_of_tokens():
    norm = Normalization(max_chars=40)
    assert normalize_text("Hello,  World!\nSecond line.", norm) == "hello , world ! second line ."
    assert len(normalize_text("x" * 100, norm)) == 40
    assert normalize_text("Keep Case", Normalization(lowercase=False, split_punctuation=False)) == "Keep Case"


def test_roc_auc_matches_pairwise_definition():
    from quipu.trainer.classifier_train import roc_auc
    rng = random.Random(3)
    labels = [rng.random() < 0.4 for _ in range(300)]
    scores = [round(rng.random(), 1) for _ in range(300)]     # many ties
    pairs = [(p, n) for p, yp in zip(scores, labels) if yp for n, yn in zip(scores, labels) if not yn]
    expected = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)
    assert roc_auc(labels, scores) == pytest.approx(expected)
    assert roc_auc([1, 1], [0.2, 0.3]) is None


def test_cutoffs_keep_exactly_the_top_fraction_with_ties():
    cfg = QualityConfig(enabled=True, keep="top_fraction", top_fraction=0.1, top_fraction_per_language={"es": 0.5})
    scored = {"en": [(0.5, f"d{i:03d}") for i in range(95)] + [(0.9, "z1"), (0.1, "z2"), (0.5, "a0"), (0.7, "b"), (0.5, "c")],
              "es": [(0.3, "x"), (0.3, "y"), (0.3, "w")], "pt": [(0.2, "only")]}
    cut = top_fraction_cutoffs(scored, cfg)
    for lang, pairs in scored.items():
        kept = [i for s, i in pairs if cut[lang].keeps(s, i)]
        assert len(kept) == math.ceil(cfg.fraction(lang) * len(pairs)), lang
    assert sorted(i for s, i in scored["en"] if cut["en"].keeps(s, i)) == sorted(
        ["z1", "b", "a0", "c", "d000", "d001", "d002", "d003", "d004", "d005"])
    assert Cutoff(0.0, "", keep_all=True).keeps(0.0, "q") and not Cutoff(1.0, "", keep_none=True).keeps(1.0, "q")


def test_bad_config_names_the_key():
    from quipu.flows.config import ConfigError
    from quipu.flows.curate import CurateConfig
    with pytest.raises(ConfigError, match="quality.keep"):
        load_config(CurateConfig, data={"quality": {"keep": "best"}})
    with pytest.raises(ConfigError, match="quality.top_fraction"):
        load_config(CurateConfig, data={"quality": {"top_fraction": 0}})
    with pytest.raises(ConfigError, match="quality.top_fraction_per_language"):
        load_config(CurateConfig, data={"quality": {"top_fraction_per_language": {"es": 1.5}}})
    assert load_config(CurateConfig, data={}).quality.enabled is False


# ---- missing or corrupt model -----------------------------------------------------------------

def test_missing_or_corrupt_model_names_the_path(tmp_path):
    missing = tmp_path / "nope.bin"
    with pytest.raises(ClassifierModelError, match=str(missing)):
        load_classifier(str(missing))
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a model at all" * 10)
    with pytest.raises(ClassifierModelError, match=str(junk)):
        load_classifier(str(junk))
    header_only = tmp_path / "truncated.bin"     # a valid fastText header, then nothing
    header_only.write_bytes((793712314).to_bytes(4, "little") + (12).to_bytes(4, "little") + b"\0" * 16)
    with pytest.raises(ClassifierModelError, match=str(header_only)):
        load_classifier(str(header_only))
    with pytest.raises(ModelNotFound, match="no-such-model"):
        resolve_model("no-such-model")


def test_curate_with_corrupt_model_fails_before_reading(tmp_path, prefect_server, capsys):
    from tests.conftest import quipu_main
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"\0" * 64)
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"id": "a", "text": "some text"}) + "\n")
    out = tmp_path / "run"
    code = quipu_main("curate", str(ROOT / "configs/curate/demo.yaml"), "--input", str(data), "--output", str(out),
                      "--set", "quality.enabled=true", "--set", f"quality.model={bad}")
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert str(bad) in err and "Traceback" not in err
    assert not (out / "extract").exists()     # nothing was read


# ---- training on the shared text --------------------------------------------------------------

@pytest.mark.slow
def test_shared_text_classifier_reaches_auc(shared_model):
    ev = read_json(Path(shared_model["dir"]) / "eval.json")
    assert ev["roc_auc"] >= 0.90, ev
    for lang in ("en", "es", "pt"):
        assert ev["per_language"][lang]["roc_auc"] >= 0.90, (lang, ev["per_language"][lang])
        assert ev["per_language"][lang]["n"] >= 200
    assert sum(ev["histogram"]["hq"]) + sum(ev["histogram"]["lq"]) == ev["n"]
    assert ev["model_sha256"] == sha256_file(shared_model["path"])
    from quipu.catalog import registry
    row = registry.get_model(None, "quality-fasttext")
    assert row["path"] == shared_model["path"] and row["fingerprint"] == ev["training_data_fingerprint"]
    assert json.loads(row["metrics"])["roc_auc"] == ev["roc_auc"]
    assert resolve_model(None) == shared_model["path"]


@pytest.mark.slow
def test_training_and_scoring_are_deterministic(shared_data, tmp_path):
    from quipu.trainer.classifier_train import prepare_data, train_model
    shas, scores, prints = [], [], []
    docs = [json.loads(line)["text"] for line in (shared_data / "text/en_ud_ewt_web.jsonl").open()][:200]
    small = [f"positive=[{shared_data}/text/en_nltk_abc_news.jsonl]", f"negative=[{shared_data}/text/en_nltk_webtext.jsonl]",
             "max_per_class=150"]
    for run in ("a", "b"):
        cfg = shared_config(shared_data, tmp_path / run, small + ["seed=7"])
        data = prepare_data(cfg, str(tmp_path / run))
        (tmp_path / run / "model.json").write_text(json.dumps({"normalization": cfg.normalization.model_dump()}))
        path = train_model(data["train"], cfg.fasttext, cfg.seed, str(tmp_path / run / "model.bin"))
        prints.append(data["fingerprint"])
        shas.append(sha256_file(path))
        scores.append(load_classifier(path).score(docs))
    assert prints[0] == prints[1]
    assert shas[0] == shas[1]
    assert scores[0] == scores[1]
    other = prepare_data(shared_config(shared_data, tmp_path / "c", small + ["seed=8"]), str(tmp_path / "c"))
    assert other["fingerprint"] != prints[0]   # the seed matters


def _stage_input(shared_data: Path, path: Path) -> Path:
    picks = [("en_nltk_abc_news", 40), ("en_nltk_webtext", 40), ("es_nltk_conll2002_efe_news", 30),
             ("es_activ_es_subtitles", 30)]
    with path.open("w") as fh:
        for name, n in picks:
            for line in list((shared_data / f"text/{name}.jsonl").open())[:n]:
                d = json.loads(line)
                fh.write(json.dumps({"id": d["id"], "text": d["text"], "source": d["source"]}) + "\n")
    return path


@pytest.mark.slow
def test_quality_filter_top_fraction_is_exact_across_shards(shared_data, shared_model, tmp_path):
    rows = [json.loads(line) for line in _stage_input(shared_data, tmp_path / "in.jsonl").open()]
    table = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows],
                      "lang": ["en"] * 80 + ["es"] * 60})
    cfg = QualityConfig(enabled=True, keep="top_fraction", top_fraction=0.25)
    model = load_classifier(shared_model["path"])
    scored: dict = {}
    for lang, s, i in zip(table.column("lang").to_pylist(), model.score(table.column("text").to_pylist()),
                          table.column("id").to_pylist()):
        scored.setdefault(lang, []).append((s, i))
    stage = QualityFilter(cfg)
    stage.model = model
    cutoffs = top_fraction_cutoffs(scored, cfg)
    outs = [stage.process(table.slice(0, 57), cutoffs), stage.process(table.slice(57), cutoffs)]   # two "shards"
    kept = pa.concat_tables([o.kept for o in outs])
    assert kept.num_rows + sum(o.removed.num_rows for o in outs) == table.num_rows
    assert kept.column("lang").to_pylist().count("en") == 20 and kept.column("lang").to_pylist().count("es") == 15
    reasons = {r for o in outs for r in o.removed.column("reason").to_pylist()}
    assert reasons and all(r.startswith(("quality<", "quality=")) for r in reasons)


@pytest.mark.slow
def test_curate_with_quality_stage(shared_data, shared_model, tmp_path, prefect_server):
    from quipu.flows.curate import CurateConfig, curate
    src = _stage_input(shared_data, tmp_path / "in.jsonl")
    cfg = load_config(CurateConfig, ROOT / "configs/curate/demo.yaml",
                      [f"input=[{src}]", f"output={tmp_path / 'run'}", "heuristics.enabled=false",
                       "quality.enabled=true", f"quality.model={shared_model['path']}", "quality.threshold=0.5",
                       "keep_intermediate=true"])   # quality/kept is read below
    summary = curate(cfg)
    stages = {s["name"]: s for s in summary["stages"]}
    q = stages["quality"]
    assert q["input_docs"] == stages["langid"]["kept_docs"] == q["kept_docs"] + q["removed_docs"]
    assert q["kept_docs"] > 0 and q["removed_docs"] > 0
    assert set(q["removed_by_reason"]) == {"quality<0.50"}
    run = tmp_path / "run"
    removed = pq.read_table(run / "quality/removed")
    kept = pq.read_table(run / "quality/kept")
    assert "quality_score" in kept.column_names and "quality_score" in removed.column_names
    assert min(kept.column("quality_score").to_pylist()) >= 0.5 > max(removed.column("quality_score").to_pylist())
    assert "quality_score" in pq.read_schema(next((run / "curated").glob("*.parquet"))).names
    # edited prose should survive far more often than web/chat text
    ids = set(kept.column("id").to_pylist())
    news = sum(1 for i in ids if i.startswith(("nltk-abc", "nltk-conll2002")))
    assert news > (len(ids) - news)
    report = read_json(run / "quality/report.json")
    st = report["stats"]
    assert len(st["highest"]) == 5 and len(st["lowest"]) == 5
    assert st["highest"][0]["score"] >= st["lowest"][0]["score"]
    assert set(st["histogram_by_lang"]) == {"en", "es"}
    assert sum(st["removed_by_lang"].values()) == q["removed_docs"]
    assert st["model"] == shared_model["path"]


@pytest.mark.slow
def test_curate_top_fraction_per_language(shared_data, shared_model, tmp_path, prefect_server):
    from quipu.flows.curate import CurateConfig, curate
    src = _stage_input(shared_data, tmp_path / "in.jsonl")
    cfg = load_config(CurateConfig, ROOT / "configs/curate/demo.yaml",
                      [f"input=[{src}]", f"output={tmp_path / 'run'}", "heuristics.enabled=false",
                       "quality.enabled=true", f"quality.model={shared_model['path']}", "quality.keep=top_fraction",
                       "quality.top_fraction=0.3", "quality.top_fraction_per_language={es: 0.5}",
                       "extract.shard_mb=0.05", "keep_intermediate=true"])   # several shards: the cut must not depend on them
    summary = curate(cfg)
    report = read_json(tmp_path / "run/quality/report.json")
    st = report["stats"]
    assert len(report["shards"]) > 1
    for lang, frac in (("en", 0.3), ("es", 0.5)):
        assert st["kept_by_lang"][lang] == math.ceil(frac * st["docs_by_lang"][lang]), (lang, st)
    assert set(st["cutoffs"]) == {"en", "es"}
    kept = pq.read_table(tmp_path / "run/quality/kept")
    assert kept.num_rows == [s for s in summary["stages"] if s["name"] == "quality"][0]["kept_docs"]


def test_cli_train_source_errors_name_the_source(tmp_path, capsys):
    from quipu.flows.cli import main
    cfg = tmp_path / "q.yaml"
    cfg.write_text(f"positive: [{tmp_path}/nothing-*.jsonl]\nnegative: [{tmp_path}/also-nothing.jsonl]\n")
    assert main(["quality", "train", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "nothing-*.jsonl" in err and "Traceback" not in err
    assert main(["quality", "train", str(cfg), "--set", "fasttext.dimm=3"]) == 2
    assert "fasttext.dimm" in capsys.readouterr().err


def test_one_text_source_reads_what_every_trainer_reads(tmp_path):
    """trainer/text_source.py: `where` (one value or a list, a top-level field or a key of a curate
    run's `metadata` JSON), `reasons`, `lang`, `limit`, unreadable lines counted; `read_documents`
    (distillation, KenLM) filters by language and length over sorted, de-duplicated globs."""
    from quipu.trainer.text_source import SourceError, TextSource, read_documents, read_source
    rows = [{"id": "a", "text": "alpha one", "lang": "en", "label": "x"},
            {"id": "b", "text": "beta", "lang": "es", "metadata": json.dumps({"label": "y"}), "reason": "heuristics:short"},
            {"id": "c", "text": "gamma three", "lang": "pt", "label": "z", "reason": "quality<0.50"}]
    f = tmp_path / "d.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{broken\n")
    ids = lambda docs: [d["id"] for d in docs]
    counts: dict = {}
    assert ids(read_source(TextSource(path=str(f), where={"label": ["x", "y"]}), counts)) == ["a", "b"]
    assert counts == {"unreadable": 1}
    assert ids(read_source(TextSource(path=str(f), reasons=["heuristics"]))) == ["b"]
    assert [d["lang"] for d in read_source(TextSource(path=str(tmp_path), lang="en", limit=2))] == ["en", "en"]
    with pytest.raises(SourceError, match="yielded no documents"):
        read_source(TextSource(path=str(f), where={"label": "none"}))
    assert ids(read_documents([str(f), str(tmp_path / "*.jsonl")], ["en", "pt"], min_chars=10)) == ["c"]
    # a document's lang: the source's, else the record's, else "und"
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "n.jsonl").write_text(json.dumps({"id": "n", "text": "no language field"}) + "\n")
    assert [d["lang"] for d in read_source(TextSource(path=str(tmp_path / "sub")))] == ["und"]
    assert [d["lang"] for d in read_source(TextSource(path=str(f)))] == ["en", "es", "pt"]


@pytest.mark.slow
def test_cli_train_registers_a_model(shared_data, tmp_path, prefect_server, capsys):
    from tests.conftest import quipu_main
    t = shared_data / "text"
    cfg = tmp_path / "q.yaml"
    cfg.write_text(f"positive: [{t}/en_nltk_abc_news.jsonl]\nnegative: [{t}/en_nltk_webtext.jsonl]\n"
                   f"name: cli-model\nmax_per_class: 100\nfasttext: {{dim: 16, bucket: 10000}}\n")
    assert quipu_main("quality", "train", str(cfg), "--output", str(tmp_path / "m")) == 0
    assert "ROC AUC" in capsys.readouterr().out and (tmp_path / "m/eval.json").is_file()
    ev = read_json(tmp_path / "m/eval.json")
    assert ev["n"] == 40 and ev["per_language"]["en"]["n"] == 40
    assert quipu_main("catalog", "ls", "models") == 0
    out = capsys.readouterr().out
    assert "cli-model" in out and str(tmp_path / "m/model.bin") in out
