"""`quipu ablate`: a tiny ablation end to end (2 variants, 1 seed), checked from its outputs: the runs
differ only in their data, and the exported models' BPB computed here with transformers (its own
loop, not trainer/bpb.py) matches the ablation's figures. Plus the budget arithmetic and the config
errors that must stop an ablation before any work."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tests.conftest import ROOT

DEMO = ROOT / "configs" / "ablate" / "demo.yaml"


@pytest.fixture(scope="module")
def tiny_ablation(shared_data, prefect_server, tmp_path_factory) -> Path:
    """`quipu ablate configs/ablate/demo.yaml`, in this process (the CLI's `main`), from the repository
    root (the config's paths are relative to it)."""
    from quipu.flows.cli import main
    out = tmp_path_factory.mktemp("ablate") / "out"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert main(["ablate", str(DEMO), "--output", str(out), "--set", f"raw_mix.out={out.parent / 'mix'}"]) == 0
    finally:
        os.chdir(cwd)
    return out


def _train_config(run_dir: Path) -> dict:
    from quipu.trainer.checkpoint import latest_checkpoint, load_checkpoint
    return load_checkpoint(latest_checkpoint(run_dir))["config"]


def test_variants_differ_only_by_data(tiny_ablation):
    from quipu.catalog.files import sha256_file
    out = tiny_ablation
    result = json.loads((out / "ablate.json").read_text())
    assert result["variants"] == ["raw", "full"]
    runs = [out / v / "seed-0" for v in ("raw", "full")]
    # one tokenizer: the same file in every run (its exports encode alike: the BPB test below)
    assert len({sha256_file(r / "tokenizer" / "tokenizer.json") for r in runs}) == 1
    assert len(set(result["invariants"]["tokenizer_sha256"])) == 1
    # the same model and training config; only the data (and where the run writes) differ
    cfgs = [_train_config(r) for r in runs]
    for c in cfgs:
        c["data"].pop("phases"), c["data"].pop("tokens_dir"), c.pop("output")
    assert cfgs[0] == cfgs[1] and cfgs[0]["seed"] == 0
    assert json.loads((runs[0] / "hf" / "config.json").read_text()) == json.loads((runs[1] / "hf" / "config.json").read_text())
    # the same number of training tokens, seen to the end
    tokens = [[json.loads(x) for x in (r / "metrics.jsonl").read_text().splitlines()][-1]["tokens"] for r in runs]
    assert tokens[0] == tokens[1] == cfgs[0]["train"]["max_steps"] * cfgs[0]["train"]["batch_size"] * cfgs[0]["data"]["seq_len"]
    # ... and really different data: full curation removed documents that raw kept
    t = result["table"]
    assert t["full"]["documents"] < t["raw"]["documents"]
    assert t["raw"]["stages"] == [] and "dedup" in t["full"]["stages"]
    # extraction ran once, for both variants
    assert result["curation"][0]["stage"] == "extract" and result["curation"][0]["variants"] == ["raw", "full"]
    assert sum(n["stage"] == "extract" for n in result["curation"]) == 1
    assert (out / "ablate.png").stat().st_size > 0 and "| raw |" in (out / "ablate.md").read_text()


def _bpb_with_transformers(hf_dir: Path, docs: list[tuple[str, str]], seq_len: int) -> dict[str, float]:
    """Bits per byte per language, computed here: one document at a time, BOS + text tokens, windows of
    seq_len inputs, every text token scored."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    nll: dict[str, float] = {}
    size: dict[str, int] = {}
    with torch.no_grad():
        for lang, text in docs:
            ids = [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]
            for s in range(0, len(ids) - 1, seq_len):
                x = torch.tensor([ids[s:s + seq_len]])
                y = torch.tensor(ids[s + 1:s + seq_len + 1])
                logp = torch.log_softmax(model(input_ids=x).logits[0, :len(y)].double(), -1)
                nll[lang] = nll.get(lang, 0.0) - float(logp[torch.arange(len(y)), y].sum())
            size[lang] = size.get(lang, 0) + len(text.encode("utf-8"))
    return {lang: nll[lang] / math.log(2) / size[lang] for lang in nll}


def test_exported_models_bpb_matches_transformers(tiny_ablation):
    out = tiny_ablation
    result = json.loads((out / "ablate.json").read_text())
    seq_len = result["train"]["data"]["seq_len"]
    for run in result["runs"]:
        scored = json.loads((Path(run["run_dir"]) / "bpb.json").read_text())["docs"]
        texts = {}
        from quipu.flows.ablate import AblateConfig
        from quipu.flows.config import load_config
        cfg = load_config(AblateConfig, DEMO)
        from quipu.trainer.text_source import read_source
        for src in cfg.heldout.sources:
            for rec in read_source(src):
                texts[(src.label(), str(rec["id"]))] = rec["text"]
        docs = [(d["lang"], texts[(d["source"], d["id"])]) for d in scored]
        ours = _bpb_with_transformers(Path(run["hf"]), docs, seq_len)
        for lang, bpb in ours.items():
            assert bpb == pytest.approx(run["bpb"]["by_lang"][lang]["bpb"], rel=1e-5), (run["variant"], lang)
        assert set(ours) == {"en", "es", "pt"}


REAL = ROOT / "configs" / "ablate" / "real.yaml"
TINY = ["--seeds", "0", "--set", "raw_mix.scale=0.02", "--set", "tokenizer.vocab_size=512", "--set", "tokenizer.sample_docs=2000",
        "--set", "train.train.max_steps=12", "--set", "train.train.batch_size=8", "--set", "train.train.micro_batch=8",
        "--set", "train.data.seq_len=64", "--set", "train.model.max_seq_len=64", "--set", "train.model.dim=32",
        "--set", "train.model.n_layers=1", "--set", "train.schedule.warmup_steps=2", "--set", "train.eval.rows=4",
        "--set", "train.data.eval_docs_per_source=4", "--set", "heldout.max_docs_per_source=8",
        "--set", "heldout.max_bytes_per_source=8000"]


def test_real_text_ablation_as_shipped_at_a_tiny_size(shared_data, prefect_server, tmp_path):
    """configs/ablate/real.yaml with only its sizes overridden: a mix of real documents and real crawls
    (nothing planted); English defaults, calibrated thresholds and calibrated thresholds with the
    fluency judges on the same filter stages, each arm training on the same tokens per language;
    held-out BPB and the documents and tokens each arm keeps per language."""
    import pyarrow.parquet as pq

    from quipu.flows.ablate import variant_curate_config
    from quipu.flows.ablate_cli import load_ablate_config
    from quipu.flows.cli import build_parser, main
    from quipu.tasks.heuristics import HeuristicsConfig
    out, mix = tmp_path / "out", tmp_path / "mix"
    args = [str(REAL), "--output", str(out), "--set", f"raw_mix.out={mix}", *TINY]
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        assert main(["ablate", *args]) == 0
        config = load_ablate_config(build_parser().parse_args(["ablate", *args]))
        english, calibrated, judged = (variant_curate_config(config, v, out) for v in config.variants)
    finally:
        os.chdir(cwd)
    # real text only: every record of the mix is a real document, and the crawls are the shared ones
    manifest = json.loads((mix / "manifest.json").read_text())
    assert manifest["kinds"] == {"article": manifest["records"]} and manifest["records"] > 0
    # English is the stages' defaults, calibrated the shipped config, judged that plus its fluency stage
    assert english.heuristics == HeuristicsConfig() and calibrated.heuristics != english.heuristics
    assert judged.heuristics == calibrated.heuristics and judged.fluency.enabled and not calibrated.fluency.enabled
    result = json.loads((out / "ablate.json").read_text())
    assert result["variants"] == ["english", "calibrated", "judged"]
    t = result["table"]
    assert t["english"]["stages"] == t["calibrated"]["stages"] == ["urls", "langid", "lines", "heuristics"]
    assert t["judged"]["stages"] == ["urls", "langid", "lines", "heuristics", "fluency"]
    shared = [n["stage"] for n in result["curation"] if n["variants"] == ["english", "calibrated", "judged"]]
    assert shared == ["extract", "urls"]      # the same input and URL filter, curated once
    budget = t["english"]["token_budget"]     # equal tokens per language: the fewest any arm keeps
    assert {"en", "es", "pt"} <= set(budget) and all(row["token_budget"] == budget for row in t.values())
    assert all(row["resampled_per_seed"] and row["dataset"].endswith("-seed-0") for row in t.values())
    for name, row in t.items():
        assert set(row["bpb"]["by_lang"]) == {"en", "es", "pt"}
        kept = row["kept_by_lang"]
        selected = pq.read_table(out / name / "selected-seed-0" / "part-00000.parquet", columns=["id", "lang"])
        langs = selected.column("lang").to_pylist()
        assert {k: v["documents"] for k, v in kept.items()} == {x: langs.count(x) for x in set(langs)}
        assert {"en", "es", "pt"} <= set(kept) and all(v["tokens"] > v["documents"] for v in kept.values())
        # the selection is the arm's own curated documents, up to the budget of every language
        curated = {x for p in sorted((out / name / "curated").glob("*.parquet"))
                   for x in pq.read_table(p, columns=["id"]).column("id").to_pylist()}
        assert set(selected.column("id").to_pylist()) <= curated
        assert all(kept[lang]["tokens"] >= budget[lang] for lang in budget)
    assert "all" in t["calibrated"]["vs"]["english"] and "all" in t["judged"]["vs"]["english"]
    md = (out / "ablate.md").read_text()
    assert "Kept per language" in md and "Δ english" in md and "Equal tokens per language" in md


# ---- fast checks, no training ------------------------------------------------------------------

def test_budget_sizes_model_and_tokens_by_6nd():
    from quipu.trainer.plan import SHAPES, chinchilla_optimal, model_params, size_for_budget
    s = size_for_budget(600, 5e10, 4096)
    n_opt, _ = chinchilla_optimal(600 * 5e10)
    assert s["params"] <= n_opt
    bigger = [x for x in SHAPES if model_params(x[0], x[1], 4096) > s["params"]][0]
    assert model_params(bigger[0], bigger[1], 4096) > n_opt       # the largest shape that fits
    assert 6 * s["params"] * s["tokens"] == pytest.approx(600 * 5e10)
    assert size_for_budget(6000, 5e10, 4096)["params"] > s["params"]


@pytest.mark.parametrize("resample", [True, False])
def test_each_training_seed_draws_its_own_equal_token_sample(tmp_path, resample):
    """With `equal_tokens` every training seed trains on its own sample of each arm (a dataset per arm and
    seed, the same budget per language), so the spread over seeds includes which documents fill the
    budget; `resample_per_seed: false` gives every seed one sample."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from quipu.flows.ablate import AblateConfig, register_variants
    from quipu.flows.config import load_config
    from quipu.tasks.stage import write_table

    class WordTokenizer:
        def encode_docs(self, texts):
            return [t.split() for t in texts]
    rows = 200
    table = pa.table({"id": [f"d{i:03d}" for i in range(rows)], "lang": ["es", "pt"] * (rows // 2),
                      "text": [" ".join(["palabra"] * (5 + i % 40)) for i in range(rows)],
                      "quality_tier": [i % 5 for i in range(rows)]})
    part = write_table(tmp_path / "curated" / "part-00000.parquet", table)
    config = load_config(AblateConfig, DEMO, [f"output={tmp_path / 'out'}", "seeds=[0, 1]", "equal_tokens=true",
                                              f"resample_per_seed={str(resample).lower()}",
                                              "variants=[{name: top, where: {quality_tier: '>= 3'}}, {name: all}]"])
    variants = {"top": {"stages": []}, "all": {"stages": []}}
    register_variants(config, {"top": [part], "all": [part]}, variants, WordTokenizer(), tmp_path / "out", "run-1")
    for name in ("top", "all"):
        names = variants[name]["datasets"]
        assert set(names) == {0, 1} and variants[name]["dataset"] == names[0]
        picked = {seed: pq.read_table(tmp_path / "out" / name / (f"selected-seed-{seed}" if resample else "selected")
                                      / "part-00000.parquet") for seed in (0, 1)}
        assert (names[0] != names[1]) == resample
        ids = {seed: set(t.column("id").to_pylist()) for seed, t in picked.items()}
        # the "all" arm holds more than the budget, so two draws differ; "top" sets the budget and takes all it has
        assert (ids[0] != ids[1]) == (resample and name == "all")
        for t in picked.values():
            got = {lang: sum(len(x.split()) for x, y in zip(t.column("text").to_pylist(), t.column("lang").to_pylist())
                             if y == lang) for lang in ("es", "pt")}
            assert all(got[lang] >= variants[name]["token_budget"][lang] for lang in got)
    assert variants["top"]["token_budget"] == variants["all"]["token_budget"]


def test_training_order_does_not_move_with_the_output_folder(tmp_path):
    """Each arm's dataset is named with a hash of the output folder; the training source's name seeds its
    document order and held-out split, so the runs name it alike whatever the folder (two folders once gave
    results that differed beyond the seeds' spread)."""
    from types import SimpleNamespace

    import numpy as np

    from quipu.flows.ablate import AblateConfig, run_train_config
    from quipu.flows.config import load_config
    from quipu.trainer.data import source_passes, split_heldout

    config = load_config(AblateConfig, DEMO, [f"output={tmp_path / 'out'}"])
    lens = SimpleNamespace(doc_len=np.arange(5, 205, dtype=np.int64), num_docs=200)

    def order(key: str) -> list[int]:
        src = split_heldout(key, lens, 16, 0)
        return source_passes(src, 3000, "shuffle", 0, 0).tolist()

    datasets = [f"ablate-{config.name}-{h}-raw" for h in ("0a1b2c3d", "4e5f6a7b")]   # two folders' names
    keys = [[s.key for s in run_train_config(config, d, tmp_path / "run", tmp_path / "tok", tmp_path / "t.json", 0)
             .data.source_specs().values()] for d in datasets]
    assert keys[0] == keys[1] and len(keys[0]) == 1
    assert order(datasets[0]) != order(datasets[1])    # keyed by the dataset, the order would move
    assert order(keys[0][0]) == order(keys[1][0])


def test_budget_parsing():
    from quipu.catalog.errors import UserError
    from quipu.flows.ablate_cli import parse_minutes
    assert parse_minutes("25m") == 25 and parse_minutes("1.5h") == 90 and parse_minutes("90s") == 1.5
    with pytest.raises(UserError, match="--budget"):
        parse_minutes("soon")


@pytest.mark.parametrize("override, message", [
    (["heldout.sources=[{path: ../shared/data/text/en_nltk_webtext.jsonl}]"], "held-out text must never come from the raw input"),
    (["variants=[{name: raw, stages: [nope]}, {name: full}]"], "unknown stage"),
    (["variants=[{name: raw, stages: []}, {name: full, set: [dedup.threshold=7]}]"], "variant 'full'"),
    (["train.model.dim=-1"], "train: model.dim"),
    (["train.output=x"], "train.output"),
])
def test_bad_config_fails_before_work(shared_data, tmp_path, override, message):
    from quipu.catalog.errors import UserError
    from quipu.flows.ablate import AblateConfig, check_config
    from quipu.flows.config import load_config
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with pytest.raises(UserError, match=message):
            cfg = load_config(AblateConfig, DEMO, [f"output={tmp_path}", *override])
            check_config(cfg)
    finally:
        os.chdir(cwd)
    assert not any(tmp_path.iterdir())


def test_compare_pooled_and_per_seed():
    from quipu.flows.ablate_report import compare, mean_std
    seeds = [0, 1, 2, 3]
    base = [3.00, 3.10, 3.20, 3.05]
    better = [b - 0.05 + d for b, d in zip(base, [0.005, -0.005, 0.004, -0.004])]   # same seed-to-seed spread
    c = compare(mean_std(better, seeds), mean_std(base, seeds))
    assert c["delta"] == pytest.approx(-0.05)
    assert not c["significant"]                       # within twice the pooled seed std (~0.09)...
    assert c["significant_paired"] and c["same_sign_seeds"] == "4/4"   # ...but every seed improves
    assert compare(mean_std([3.0], [0]), mean_std([3.1], [0]))["significant"] is None   # one seed: no spread
