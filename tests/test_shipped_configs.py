"""Every shipped config under configs/ is loaded and run, at a tiny size, by the command that takes it.

Configs are found by glob: a config added under configs/<kind>/ is run here without editing this file;
a kind with no runner below fails `test_every_config_kind_has_a_runner`. `--set` changes sizes (steps,
documents, tokens, epochs) and where inputs and outputs live (a temporary folder, the curated shards
made here instead of a path the config expects from an earlier step); never what a stage does.
One demo-corpus curate run (`quipu watch --once` with configs/watch/default.yaml, which curates with
configs/curate/default.yaml) feeds the train, quality, kenlm and ppl configs. A config whose input is in
../shared/data skips with the reason on a clone without it; any other path a fresh clone lacks fails.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT, missing_install
from tests.conftest import quipu_main as _main

pytestmark = pytest.mark.slow

SHIPPED = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").glob("*/*.yaml"))
# configs run end to end by another test (their fixture is that test's subject): named, and checked
ELSEWHERE = {"configs/ablate/demo.yaml": "tests/test_ablate.py", "configs/ablate/real.yaml": "tests/test_ablate.py",
             "configs/quality/shared-text.yaml": "tests/test_quality.py", "configs/curate/ca.yaml": "tests/test_languages.py"}


def _needs_shared(path: str) -> None:
    # the config's own relative paths decide where it looks: beside the clone, whatever QUIPU_SHARED_DATA says
    beside = ROOT.parent / "shared" / "data"
    if "../shared/" in (ROOT / path).read_text() and not beside.is_dir():
        pytest.skip(f"{path} reads ../shared/data (real public data beside the repository); not found at {beside}")


class World:
    """What the configs run on: one curated demo corpus (and what runs made from it, by config)."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.outputs: dict[str, Path] = {}

    def out(self, config: str) -> Path:
        return self.tmp / "out" / config.replace("/", "_").removesuffix(".yaml")


LANG_WORDS = {
    "en": "the cat dog river house green small runs sees under over near old new bread water light city".split(),
    "es": "el gato perro río casa verde pequeño corre ve bajo sobre cerca viejo nuevo pan agua luz ciudad".split(),
    "pt": "o gato cão rio casa verde pequeno corre vê sob sobre perto velho novo pão água luz cidade".split(),
}


def blend_docs(n_per_lang: int) -> list[dict]:
    """Curated-like rows in en/es/pt with a `ppl_wayra` score: what the train configs blend by
    `where: {lang: ..}` and order by `ppl_wayra` (written by the test, not by a curate run)."""
    import random
    rng = random.Random(0)
    rows = []
    for lang, words in LANG_WORDS.items():
        for i in range(n_per_lang):
            text = " ".join(" ".join(rng.choice(words) for _ in range(rng.randint(4, 10))).capitalize() + "."
                            for _ in range(rng.randint(3, 8)))
            rows.append({"id": f"{lang}-{i}", "text": text, "lang": lang, "source": f"blend-{lang}",
                         "url": f"https://example.org/{lang}/{i}", "ppl_wayra": rng.uniform(5, 500)})
    return rows


@pytest.fixture(scope="module")
def world(prefect_server, tmp_path_factory) -> World:
    import pyarrow as pa

    from quipu.catalog import registry
    from quipu.catalog.files import sha256_file
    from quipu.synthetic.corpus import build_demo_corpus
    from tests.test_perplexity import build_tiny_teacher
    w = World(tmp_path_factory.mktemp("shipped"))
    # a catalog of its own: the train configs blend "demo" and "crawl", which other tests of the
    # session register with other languages
    home = pytest.MonkeyPatch()
    home.setenv("QUIPU_HOME", str(w.tmp / "quipu-home"))
    raw = w.tmp / "raw"
    build_demo_corpus(w.tmp / "corpus", scale=0.05)
    shutil.copytree(w.tmp / "corpus" / "raw", raw)
    # `quipu watch --once` as shipped: finds the files, curates them with configs/curate/default.yaml
    runs = w.tmp / "incremental"
    assert _main("watch", "configs/watch/default.yaml", "--once", "--location", str(raw),
                 "--set", f"output_root={runs}", "--set", "settle_s=0", "--set", "dataset=shipped-crawl") == 0
    (run,) = runs.iterdir()
    w.run = run
    w.curated = sorted((run / "curated").glob("*.parquet"))
    assert w.curated and sum(pq.ParquetFile(p).metadata.num_rows for p in w.curated) >= 10
    assert registry.get_dataset("shipped-crawl", "curated")["run_id"] == json.loads((run / "run.json").read_text())["run_id"]
    w.outputs["configs/watch/default.yaml"] = w.outputs["configs/curate/default.yaml"] = run
    # the next look finds the curated files seen: no second run
    assert _main("watch", "configs/watch/default.yaml", "--once", "--location", str(raw),
                 "--set", f"output_root={runs}", "--set", "settle_s=0", "--set", "dataset=shipped-crawl") == 0
    assert len(list(runs.iterdir())) == 1
    # the curated text as JSONL: what the kenlm and ppl configs read
    rows = [r for p in w.curated for r in pq.read_table(p, columns=["id", "text", "lang"]).to_pylist()]
    w.jsonl = w.tmp / "curated.jsonl"
    w.jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the datasets the train configs blend ("demo", "crawl")
    blend = w.tmp / "blend"
    blend.mkdir()
    pq.write_table(pa.Table.from_pylist(blend_docs(12)), blend / "part-00000.parquet")
    shard = blend / "part-00000.parquet"
    for name in ("demo", "crawl"):
        if registry.get_dataset(name, "curated") is None:
            registry.register_dataset(name, "curated", str(blend), None, [
                {"path": str(shard), "rows": 36, "bytes": shard.stat().st_size, "sha256": sha256_file(shard)}],
                shared_path=True)
    # a 2-layer teacher in place of SmolLM2-135M (its load alone is a minute here): the ppl configs'
    # students, heads and training as shipped; the real teacher has its own tests in test_perplexity.py
    w.teacher = build_tiny_teacher(w.tmp / "tiny-teacher")
    yield w
    home.undo()


# ---- one runner per kind of config ---------------------------------------------------------------

def run_watch(world: World, config: str) -> None:
    raw = world.tmp / f"raw-{Path(config).stem}"
    shutil.copytree(world.tmp / "corpus" / "raw", raw)
    runs = world.out(config)
    assert _main("watch", config, "--once", "--location", str(raw), "--set", f"output_root={runs}",
                 "--set", "settle_s=0") == 0
    assert any(runs.glob("*/curated/*.parquet"))


def run_curate(world: World, config: str) -> None:
    out = world.out(config)
    assert _main("curate", config, "--input", str(world.tmp / "raw"), "--output", str(out), "--allow-empty") == 0
    assert json.loads((out / "run.json").read_text())["records_read"] > 0


def run_benchmarks(world: World, config: str) -> None:
    from quipu.tasks.benchmarks import load_benchmarks
    (bench,) = load_benchmarks([str(ROOT / config)])
    assert len(bench.items) > 50 and all(any(t.strip() for t in item.texts) for item in bench.items[:50])
    assert _main("benchmarks", "check", str(ROOT / config)) == 0


def run_quality(world: World, config: str) -> None:
    from quipu.flows.config import read_yaml
    raw = read_yaml(ROOT / config)
    args = ["quality", "train", config, "--output", str(world.out(config))]
    if not all(Path(ROOT / s["path"]).exists() for s in raw["positive"] + raw["negative"] if s.get("path")):
        # a step's output (runs/demo/heuristics/...): the demo run's kept and removed documents
        kept = world.run / "curated"
        removed = [p for p in sorted(world.run.glob("*/removed")) if any(pq.ParquetFile(f).metadata.num_rows
                                                                         for f in p.glob("*.parquet"))]
        assert removed, "the curate run kept no removed documents"
        args += ["--set", f"positive=[{{path: '{kept}'}}]",
                 "--set", "negative=[" + ", ".join(f"{{path: '{p}'}}" for p in removed) + "]"]
    # the config's own epochs: a one-epoch model on this tiny corpus scores every text alike, which
    # the quality model's pre-check rightly refuses
    assert _main(*args, "--set", "min_per_class=2") == 0


def run_kenlm(world: World, config: str) -> None:
    from quipu.scoring.kenlm_model import KENLM_BIN_DIR, kenlm_available
    if not kenlm_available():
        missing_install(f"KenLM's lmplz/build_binary are not built in {KENLM_BIN_DIR} (run `make kenlm`)")
    from quipu.flows.config import read_yaml
    args = ["kenlm", "train", config, "--output", str(world.out(config)), "--set", "max_docs_per_lang=200",
            "--set", "order=3"]
    if not read_yaml(ROOT / config).get("input"):
        args += ["--input", str(world.jsonl)]
    assert _main(*args) == 0
    assert list(world.out(config).glob("*.binary")) or list(world.out(config).rglob("*.binary"))


PPL_TINY = ["label_docs=16", "lm_docs=4", "teacher.max_tokens=16", "student.max_len=17", "train.epochs=1",
            "train.pretrain_epochs=0", "train.max_seconds=20", "student.teacher_layers=1", "student.d_model=32"]


def run_ppl(world: World, config: str) -> None:
    from quipu.flows.config import read_yaml
    raw = read_yaml(ROOT / config)
    out = world.out(config)
    args = ["ppl", "distill", config, "--output", str(out), "--input", str(world.jsonl)]
    sets = [*PPL_TINY, f"teacher.path={world.teacher}"]
    if raw.get("lm_input"):
        sets.append(f"lm_input=['{world.jsonl}']")
    if raw.get("assistant"):
        # another shipped config's student: run that one (tiny) first and use it
        (maker,) = [c for c in SHIPPED if c.startswith("configs/ppl/") and read_yaml(ROOT / c).get("output") == raw["assistant"]]
        if maker not in world.outputs:
            run_ppl(world, maker)
        sets.append(f"assistant={world.outputs[maker]}")
    assert _main(*args, *(a for s in sets for a in ("--set", s))) == 0
    assert (out / "model.safetensors").is_file()
    world.outputs[config] = out


def run_train(world: World, config: str) -> None:
    out = world.out(config)
    sets = ["data.seq_len=32", "train.batch_size=2", "train.micro_batch=2", "eval.rows=2", "eval.sample_tokens=4",
            "data.eval_docs_per_source=2", "tokenizer.vocab_size=512", "checkpoint.every=4", "eval.every=4"]
    from quipu.flows.config import read_yaml
    if (read_yaml(ROOT / config).get("tokenizer") or {}).get("kind") not in (None, "bpe"):
        sets.remove("tokenizer.vocab_size=512")
    assert _main("train", config, "--output", str(out), "--max-steps", "4", *(a for s in sets for a in ("--set", s))) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("loss" in m for m in metrics)


def run_ablate(world: World, config: str) -> None:
    from quipu.flows.config import read_yaml
    out = world.out(config)
    sets = []
    if read_yaml(ROOT / config).get("input"):   # crawl files beside the mix: one small WARC of them
        sets += ["--set", "input=[../shared/data/web/pywb__example.warc.gz]"]
    # sizes as tests/test_ablate.py's tiny run: scoring the held-out text (ours and transformers, per
    # run) was four fifths of the run at the shipped 50 kB per source
    sizes = ["raw_mix.scale=0.005", "train.train.max_steps=4", "train.schedule.warmup_steps=1", "train.eval.every=4",
             "train.checkpoint.every=4", "train.train.batch_size=8", "train.train.micro_batch=8", "train.data.seq_len=64",
             "train.model.max_seq_len=64", "tokenizer.vocab_size=512", "tokenizer.sample_docs=2000",
             "heldout.max_docs_per_source=8", "heldout.max_bytes_per_source=8000"]
    assert _main("ablate", config, "--output", str(out), "--seeds", "1", "--set", f"raw_mix.out={out}-mix", *sets,
                 *(a for s in sizes for a in ("--set", s))) == 0


def run_label(world: World, config: str) -> None:
    """`quipu label` as shipped against `quipu serve-labeller`'s endpoint over the tiny teacher."""
    import threading
    from quipu.trainer.label_server import Generator, make_server
    server = make_server(Generator(str(world.teacher), device="cpu"), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = world.out(config)
    try:
        assert _main("label", config, "--endpoint", f"http://127.0.0.1:{server.server_address[1]}/v1", "--output",
                     str(out), "--set", f"input=['{world.jsonl}']", "--set", "limit=6", "--set", "max_tokens=4") == 0
    finally:
        server.shutdown()
        server.server_close()
    assert len((out / "labelled.jsonl").read_text().splitlines()) == 6
    assert json.loads((out / "label_report.json").read_text())["this_run"]["tokens_in"] > 0


RUNNERS = {"watch": run_watch, "curate": run_curate, "benchmarks": run_benchmarks, "quality": run_quality,
           "kenlm": run_kenlm, "ppl": run_ppl, "train": run_train, "ablate": run_ablate, "label": run_label}


def test_every_config_kind_has_a_runner():
    assert len(SHIPPED) >= 15, SHIPPED
    assert {c.split("/")[1] for c in SHIPPED} <= set(RUNNERS), "a config kind without a runner in this file"
    for config, test_file in ELSEWHERE.items():
        assert config in SHIPPED and config in (ROOT / test_file).read_text() or Path(config).name in (ROOT / test_file).read_text()


@pytest.mark.parametrize("config", [c for c in SHIPPED if c not in ELSEWHERE])
def test_shipped_config_runs(world, config):
    _needs_shared(config)
    if config in world.outputs:      # already run, as shipped, by the world it made (watch, curate)
        return
    RUNNERS[config.split("/")[1]](world, config)


def test_default_config_ends_with_annotating_tiers(world):
    """configs/curate/default.yaml as shipped (the world's run) tiers its documents with the shipped
    tables and removes none: every document reaching the stage is counted in one tier of its language."""
    run = json.loads((world.run / "run.json").read_text())
    tiers = run["stages"][-1]
    assert tiers["name"] == "tiers" and tiers["removed_docs"] == 0 and tiers["kept_docs"] == tiers["input_docs"] > 0
    assert sum(t["docs"] for by_tier in tiers["tiers"].values() for t in by_tier.values()) == tiers["input_docs"]
    assigned = [t for p in world.curated for t in pq.read_table(p, columns=["quality_tier"]).column(0).to_pylist()]
    assert {t for t in assigned if t is not None} <= set(range(5)) and any(t is not None for t in assigned)


# ---- commands no other test runs: ppl label, a successful ppl eval, benchmarks ls ----------------

def _last_json(out: str) -> dict:
    """The JSON object a command printed last (indented, after any progress lines)."""
    lines = out.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    return json.loads("\n".join(lines[start:]))


def test_ppl_label_computes_then_reuses_the_teachers_labels(world, tmp_path, capsys):
    """`quipu ppl label` with the shipped demo config: the labels it writes are the teacher's mean
    token NLL (HF transformers' own loss, computed here), and a second run computes none. (A 12-token
    window: the distill runs above cached 16-token labels of the same documents.)"""
    import math

    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    out = tmp_path / "labels.jsonl"
    args = ["ppl", "label", "configs/ppl/demo.yaml", "--input", str(world.jsonl), "--set", f"teacher.path={world.teacher}",
            "--set", "label_docs=10", "--set", "teacher.max_tokens=12", "--set", "student.max_len=13",
            "--set", f"labels_out={out}"]
    assert _main(*args) == 0
    assert _last_json(capsys.readouterr().out)["computed"] == 10
    labels = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(labels) == 10
    texts = {json.loads(line)["id"]: json.loads(line)["text"] for line in world.jsonl.read_text().splitlines()}
    tok = AutoTokenizer.from_pretrained(world.teacher)
    model = LlamaForCausalLM.from_pretrained(world.teacher).eval()
    for row in labels:
        ids = [tok.bos_token_id] + tok(texts[row["id"]], add_special_tokens=False)["input_ids"][:12]
        with torch.no_grad():
            loss = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()
        assert math.isclose(row["log_ppl"], loss, rel_tol=0.03), (row, loss)   # the config's bf16 teacher
    out.unlink()
    assert _main(*args) == 0
    stats = _last_json(capsys.readouterr().out)
    assert stats["computed"] == 0 and stats["cached"] == 10, stats
    assert [json.loads(line) for line in out.read_text().splitlines()] == labels


def test_ppl_eval_reports_what_its_predictions_say(world, tmp_path):
    """`quipu ppl eval` of the student the shipped demo config made (and the demo KenLM where built):
    its Spearman is scipy's on the teacher and student scores it wrote per document."""
    from scipy.stats import spearmanr
    from quipu.scoring.kenlm_model import kenlm_available
    student = world.outputs.get("configs/ppl/demo.yaml")
    if student is None:
        run_ppl(world, "configs/ppl/demo.yaml")
        student = world.outputs["configs/ppl/demo.yaml"]
    args = ["ppl", "eval", "--student", str(student), "--input", str(world.jsonl), "--teacher", str(world.teacher),
            "--out", str(tmp_path / "eval.json"), "--predictions", str(tmp_path / "pred.jsonl"),
            "--timing-docs", "4", "--rounds", "1"]
    kenlm = world.out("configs/kenlm/demo.yaml")
    if kenlm_available() and kenlm.is_dir():
        args += ["--kenlm", str(kenlm)]
    assert _main(*args) == 0
    result = json.loads((tmp_path / "eval.json").read_text())
    pred = [json.loads(line) for line in (tmp_path / "pred.jsonl").read_text().splitlines()]
    n_docs = len(world.jsonl.read_text().splitlines())
    assert result["n"] == len(pred) and 0 < len(pred) <= n_docs
    rho = spearmanr([p["teacher"] for p in pred], [p["student"] for p in pred]).statistic
    assert abs(result["spearman_student"] - rho) < 0.01, (result["spearman_student"], rho)
    assert set(result["by_lang"]) == {p["lang"] for p in pred}
    assert result["student_docs_per_s"] > 0 and result["teacher_docs_per_s"] > 0
    if "--kenlm" in args:
        assert -1 <= result["spearman_kenlm"] <= 1


def test_benchmarks_ls_lists_every_shipped_benchmark(capsys):
    """`quipu benchmarks ls`: each configs/benchmarks/*.yaml by name, with its item count and the
    file's SHA-256 (computed here), or NOT USABLE naming what is missing."""
    import gzip
    import hashlib

    from quipu.tasks.benchmarks import read_spec, resolve_file
    assert _main("benchmarks", "ls", "--registry", str(ROOT / "configs" / "benchmarks")) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    shipped = sorted((ROOT / "configs" / "benchmarks").glob("*.yaml"))
    assert set(lines) == {read_spec(p).name for p in shipped}
    for p in shipped:
        spec = read_spec(p)
        file = resolve_file(spec.path, p.parent)
        line = lines[spec.name]
        if not file.is_file():
            assert "NOT USABLE" in line and str(file) in line, line
            continue
        data = file.read_bytes()
        text = gzip.decompress(data) if file.suffix == ".gz" else data
        items = sum(1 for row in text.decode().splitlines() if row.strip())
        assert f"{items} items" in line and hashlib.sha256(data).hexdigest()[:12] in line, line
