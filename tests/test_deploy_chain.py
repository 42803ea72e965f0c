"""`quipu deploy` checks the deployments together: what each training blend needs against what the
curate deployments write (no server needed). The shipped files pass; each broken pair fails naming
both files and the fix. Plus the tokenizer's fit checks the training flow runs before training."""
from __future__ import annotations

import pytest
import yaml

from quipu.flows.config import ConfigError
from quipu.flows.deploy import DEFAULT_FILE, ROOT, resolve

TRAIN_FILE = "configs/train/default.yaml"
CURATE_FILE = "configs/curate/default.yaml"


def _spec(tmp_path, train: dict | None = None, curate: dict | None = None) -> dict:
    """The shipped prefect.yaml with the train (and curate) config replaced by edited copies."""
    spec = yaml.safe_load(DEFAULT_FILE.read_text())
    for name, edit, shipped in (("tokenize-train", train, TRAIN_FILE), ("curate", curate, CURATE_FILE)):
        if edit is not None:
            cfg = yaml.safe_load((ROOT / shipped).read_text())
            edit(cfg)
            path = tmp_path / f"{name}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            spec["quipu"]["configs"][name] = str(path)
    return spec


def _phase(cfg: dict) -> dict:
    return cfg["data"]["phases"][0]


def test_shipped_deployments_fit_together_and_training_listens_to_its_blend():
    resolved, kept, _ = resolve(yaml.safe_load(DEFAULT_FILE.read_text()), ROOT)
    deps = {d["name"]: d for d in resolved["deployments"]}
    (trigger,) = deps["tokenize-train"]["triggers"]
    assert trigger["match"]["prefect.resource.id"] == ["quipu.dataset.crawl"]   # not every curate run
    assert trigger["name"] == "train-on-new-version" and deps["curate"]["triggers"][0]["name"] == "curate-new-files"
    cfg = deps["tokenize-train"]["parameters"]["config"]
    assert _phase(cfg)["order"] == "shuffle" and cfg["tokenizer"]["kind"] == "smollm2"
    assert cfg["train"]["max_steps"] * cfg["train"]["batch_size"] * cfg["data"]["seq_len"] <= 500_000   # CPU-sized
    assert (ROOT / "configs/train/crawl-gpu.yaml").is_file() and "crawl-gpu.yaml" in (ROOT / TRAIN_FILE).read_text()
    gpu = yaml.safe_load(DEFAULT_FILE.read_text())
    gpu["quipu"]["configs"]["tokenize-train"] = "configs/train/crawl-gpu.yaml"
    resolve(gpu, ROOT)                                  # the GPU config fits the shipped chain as well


@pytest.mark.parametrize("train, curate, message", [
    (lambda c: _phase(c).update(order="ppl_wayra"), None,
     r"tokenize-train \(.*tokenize-train.yaml\): data.phases\[0\].order: ppl_wayra needs column 'ppl_wayra', which "
     r"deployment curate \(configs/curate/default.yaml\) does not write \(perplexity is off\); fix: set `order: shuffle` "
     r"in .*tokenize-train.yaml, or switch on perplexity.enabled: true"),
    (lambda c: _phase(c)["sources"][0].update(where={"quality_score": ">= 0.5", "lang": "es"}), None,
     r"sources\[0\].where.quality_score needs column 'quality_score'.*quality is off.*quality.enabled: true"),
    # a classifier stage found in tasks/classifiers/ is named with its switch, as the built-in stages are
    (lambda c: _phase(c)["sources"][0].update(where={"news_score": ">= 0.5"}), None,
     r"sources\[0\].where.news_score needs column 'news_score'.*\(news is off\).*switch on news.enabled: true"),
    (lambda c: _phase(c)["sources"][0].update(dup_upsample_cap=3), lambda c: c.update(dedup={"enabled": False}),
     r"sources\[0\].dup_upsample_cap needs column 'dup_count'.*curate.yaml\) does not write \(dedup is off\)"),
    (None, lambda c: c["langid"].update(languages=["en", "es"]),
     r"sources\[1\].where.lang: 'pt' is not among the languages .* keeps \(en, es\).*add it to langid.languages in "
     r".*curate.yaml"),
    (lambda c: _phase(c)["sources"][0].update(dataset="nowhere-dataset"), None,
     r"sources\[0\].dataset: no curate deployment writes dataset 'nowhere-dataset' \(they write crawl, curate\)"),
])
def test_deploy_fails_on_configs_that_do_not_fit(tmp_path, train, curate, message):
    spec = _spec(tmp_path, train, curate)
    with pytest.raises(ConfigError, match=message):
        resolve(spec, ROOT)
    with pytest.raises(ConfigError, match="do not fit together"):    # also when deploying one of them
        resolve(spec, ROOT, ["watch"])


def test_a_language_every_version_must_hold_is_a_warning(tmp_path):
    """The shipped blend trains on whatever languages a version holds; a source that must be in
    every version (when_empty: fail) is told at deploy: a batch in other languages fails training."""
    from quipu.flows.deploy_chain import check_chain

    def resolved(spec):
        out, _, _ = resolve(spec, ROOT, check=False)
        return out["deployments"], {k: v for k, v in spec["quipu"]["configs"].items()}
    errors, warnings = check_chain(*resolved(yaml.safe_load(DEFAULT_FILE.read_text())), ROOT)
    assert errors == [] and not [w for w in warnings if "when_empty" in w]
    strict = _spec(tmp_path, lambda c: _phase(c)["sources"][2].update(when_empty="fail"))
    errors, warnings = check_chain(*resolved(strict), ROOT)
    (warning,) = [w for w in warnings if "when_empty" in w]
    assert errors == [] and "data.phases[0].sources[2]: a version the chain curates without 'en' documents" in warning
    assert "fix: set `when_empty: redistribute` on it in" in warning and "tokenize-train.yaml" in warning


def test_without_a_watcher_deployment_a_triggered_run_may_write_any_dataset(tmp_path):
    """Watchers outside the file (cron, another project) name the dataset in their event: the
    blend's dataset cannot be checked, its columns still are."""
    def other_dataset(cfg):
        for src in _phase(cfg)["sources"]:
            src["dataset"] = "fed-from-elsewhere"
    spec = _spec(tmp_path, other_dataset)
    spec["deployments"] = [d for d in spec["deployments"] if d["name"] in ("curate", "tokenize-train")]
    resolve(spec, ROOT)
    spec = _spec(tmp_path, lambda c: (other_dataset(c), _phase(c).update(order="ppl_wayra")))
    spec["deployments"] = [d for d in spec["deployments"] if d["name"] in ("curate", "tokenize-train")]
    with pytest.raises(ConfigError, match="ppl_wayra"):
        resolve(spec, ROOT)


def test_deploy_set_overrides_a_deployments_config_and_its_triggers(tmp_path):
    spec = yaml.safe_load(DEFAULT_FILE.read_text())
    resolved, _, _ = resolve(spec, ROOT, overrides=["curate.langid.min_score=0.5", "tokenize-train.train.max_steps=7"])
    deps = {d["name"]: d for d in resolved["deployments"]}
    assert deps["curate"]["parameters"]["config"]["langid"]["min_score"] == 0.5
    assert deps["curate"]["triggers"][0]["parameters"]["config"]["langid"]["min_score"] == 0.5
    assert deps["tokenize-train"]["parameters"]["config"]["train"]["max_steps"] == 7
    with pytest.raises(ConfigError, match="DEPLOYMENT.KEY=VALUE"):
        resolve(spec, ROOT, overrides=["nope.x=1"])
    with pytest.raises(ConfigError, match="order"):    # the chain check sees the overridden value
        resolve(spec, ROOT, overrides=["tokenize-train.data.phases=[{sources: [{dataset: crawl, weight: 1}], "
                                       "order: ppl_wayra}]"])


def test_quipu_root_is_the_flow_runs_working_directory(tmp_path, monkeypatch, capsys):
    from quipu.flows.deploy import deploy
    monkeypatch.setenv("QUIPU_ROOT", str(tmp_path))
    assert deploy(DEFAULT_FILE, dry_run=True) == 0
    assert f"QUIPU_ROOT={tmp_path} is not the checkout" in capsys.readouterr().err
    from quipu.catalog import db
    resolved = yaml.safe_load((db.quipu_home() / "deploy" / "prefect.yaml").read_text())
    assert resolved["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(tmp_path)


def test_tokenizer_fit_checks(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from quipu.trainer.prepare import tokenizer_text_shortfall
    from quipu.trainer.train import TrainConfig
    from quipu.trainer.data import DataConfig
    from quipu.trainer.prepare import blend_languages, fertility_problems
    data = DataConfig.model_validate(yaml.safe_load((ROOT / TRAIN_FILE).read_text())["data"])
    assert blend_languages(data) == {"es", "pt", "en"}
    fert = {"en": {"tokens_per_word": 1.3}, "es": {"tokens_per_word": 3.4}}
    assert fertility_problems(fert, {"en", "es", "pt"}, 2.5) == [
        "es: 3.40 tokens per word, above tokenizer.max_tokens_per_word 2.5", "pt: no held-out text to measure the tokenizer on"]
    # the shipped blend may go without a language (when_empty: redistribute): its absence is no problem
    assert blend_languages(data, required_only=True) == set()
    assert fertility_problems(fert, {"en", "es", "pt"}, 2.5, required=set()) == [
        "es: 3.40 tokens per word, above tokenizer.max_tokens_per_word 2.5"]
    shard = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(60)], "text": ["uma frase curta aqui"] * 30 + ["a b"] * 30,
                             "lang": ["pt"] * 30 + ["es"] * 30}), shard)
    cfg = TrainConfig.model_validate(yaml.safe_load((ROOT / "configs/train/crawl-gpu.yaml").read_text()))
    bpe = cfg.tokenizer.model_copy(update={"kind": "bpe", "min_words_per_language": 100})
    short = tokenizer_text_shortfall(bpe, cfg.data, {"crawl": [{"path": str(shard)}]})
    assert [s.split(":")[0] for s in short] == ["en", "es"] and short[0] == "en: 0 of 100 words"   # pt has ~110
    assert tokenizer_text_shortfall(cfg.tokenizer, cfg.data, {"crawl": [{"path": str(shard)}]}) == []   # smollm2: fixed


def test_a_dataset_another_checkout_curated_is_said(tmp_path):
    """One catalog per user (QUIPU_HOME) serves every checkout: a curate run into a dataset that
    another checkout's runs filled says so before it adds to it and deduplicates against it."""
    import uuid

    from quipu.catalog import registry
    from quipu.flows.curate import CHECKOUT, shared_dataset_warning
    name = f"shared-{uuid.uuid4().hex[:6]}"
    assert shared_dataset_warning(name) is None
    registry.register_dataset(name, "curated", str(tmp_path / "mine"), None, [], info={"checkout": str(CHECKOUT)})
    assert shared_dataset_warning(name) is None
    registry.register_dataset(name, "curated", str(tmp_path / "theirs"), None, [], info={"checkout": "/elsewhere/quipu"})
    warning = shared_dataset_warning(name)
    assert f"dataset {name!r} in the catalog" in warning and "(v2 from /elsewhere/quipu)" in warning
    assert "set QUIPU_HOME per checkout" in warning


def test_makefile_takes_the_prefect_address_from_the_environment():
    import os
    import shutil
    import subprocess
    if shutil.which("make") is None:
        pytest.skip("no make")
    env = {**os.environ, "PREFECT_API_URL": "http://scheduler.example:4300/api", "PREFECT_PORT": "4999"}
    worker = subprocess.run(["make", "-n", "-s", "worker"], cwd=ROOT, env=env, capture_output=True, text=True).stdout
    assert "PREFECT_API_URL=http://scheduler.example:4300/api " in worker and "quipu-process" in worker
    server = subprocess.run(["make", "-n", "-s", "server"], cwd=ROOT, env=env, capture_output=True, text=True).stdout
    assert "--port 4999" in server and "PREFECT_UI_API_URL=http://127.0.0.1:4999/api" in server


def test_warnings_for_another_checkout_and_a_missing_watched_folder(tmp_path):
    import quipu.flows.curate as curate_module
    from quipu.flows.runners import checkout_warning
    from quipu.flows.watch import WatchConfig, missing_locations
    assert checkout_warning(curate_module.__file__) is None
    assert "install the project in /elsewhere" in checkout_warning("/elsewhere/flows/curate.py")
    (tmp_path / "here").mkdir()
    cfg = WatchConfig(locations=[str(tmp_path / "here"), str(tmp_path / "not-there")])
    (warning,) = missing_locations(cfg)
    assert f"watched location {tmp_path / 'not-there'} does not exist" in warning


@pytest.mark.parametrize("argv", [["--help"], ["config", "show", "curate"], ["curate", "--bogus"]])
def test_quick_commands_import_neither_prefect_nor_torch(argv):
    """`quipu --help`, `config show curate` and a failing argument check answer without importing
    Prefect or torch (seconds each on this machine): bench/cli_startup.py has the timings."""
    import subprocess
    import sys
    code = ("import sys\nfrom quipu.flows.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('prefect', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-500:] + out.stderr[-500:]
