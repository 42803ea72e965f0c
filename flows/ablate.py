"""The `ablate` flow: does curation help? Curate the same raw input once per variant of the curate
config, train the same small model on each for the same number of tokens with the same seeds, and
compare bits per byte on held-out text the curation never saw.

    raw input ─ extract ─┬─ urls ─ langid ─┬──────────────────────────── variant `langid`
       (once)            │                 └─ lines ─ heuristics ─┬────── variant `heuristics`
                         │                                        └─ dedup ─ ... variant `full`
                         └────────────────────────────────────────────── variant `raw`

Curation runs the curate flow's own phases (`flows.curate`: `extract.run_extract` and `driver.run_stage` with
the Prefect phases, `write_curated`) over a tree: a stage whose whole prefix (extract config, then
each earlier stage and its config) is the same in two variants runs once and both continue from
its output. Each node has its own folder and no catalog dataset, so persistent indexes (dedup,
lines) see that node's documents only, never another variant's or an earlier run's.

Every run then differs only in its data: one BPE tokenizer, trained on a fixed sample of the
extracted raw input, the same model config, token count and seeds; each trains through the
`tokenize-train` flow (the trainer, checkpoints and HF export of `quipu train`) into
`OUT/<variant>/seed-<k>/` and is scored on the held-out text with our model and, independently,
with transformers on its export (trainer/bpb.py).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quipu.catalog import registry
from quipu.catalog.errors import UserError
from quipu.catalog.files import read_json, sha256_json, write_json_atomic
from quipu.catalog.names import check_name
from quipu.catalog.ownership import claim, identity, output_lock, record_written
from quipu.synthetic.ablate_mix import RawMixConfig, ensure_mix
from quipu.flows.config import ConfigError, apply_overrides, format_validation_error, read_yaml
from quipu.flows.curate import CurateConfig, PrefectPhases, enabled_stages, write_curated_task
from quipu.flows.runners import flow_run_id
from quipu.tasks import driver
from quipu.tasks.extract import pack_inputs, run_extract
from quipu.tasks.pipeline import REMOVED_SCHEMA, stage_names, stage_ref
from quipu.tasks.stage import RunContext, Shard
from quipu.trainer.bpb import HeldoutConfig

SAFE_VARIANT = r"^[a-z0-9][a-z0-9_-]{0,39}$"


# ---- config ------------------------------------------------------------------------------------

class VariantSpec(BaseModel):
    """One curation variant: the base curate config with `--set`-style overrides."""
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=SAFE_VARIANT, description="folder and column name, e.g. raw, langid, full")
    stages: list[str] | None = Field(None, description="exactly these stages on, every other one off (extract always runs); "
                                                       "null: as the base config")
    set: list[str] = Field(default_factory=list, description="overrides of the curate config, dotted.key=value")
    where: dict[str, Any] = Field(default_factory=dict, description="train on the curated documents matching this, "
                                                                    "as a blend's `where:` ({quality_tier: '>= 3'})")

    @field_validator("where")
    @classmethod
    def _where(cls, v: dict):
        from quipu.trainer.data import check_where
        return check_where(v)

    @field_validator("stages")
    @classmethod
    def _known(cls, v):
        unknown = [s for s in v or [] if s not in stage_names()]
        if unknown:
            raise ValueError(f"unknown stage(s) {unknown}; stages: {', '.join(stage_names())}")
        return v


class CurateBase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: str | None = Field(None, description="a curate YAML every variant starts from (null: the stage defaults)")
    set: list[str] = Field(default_factory=list, description="overrides applied to every variant, before its own")


class TokenizerSample(BaseModel):
    """The one tokenizer of the ablation: byte-level BPE on a fixed sample of the extracted raw input."""
    model_config = ConfigDict(extra="forbid")
    vocab_size: int = Field(8192, ge=300)
    sample_docs: int = Field(20000, gt=0, description="raw documents read (in shard order, every 20th by id hash left out)")
    min_frequency: int = Field(2, ge=1)


class BudgetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    minutes: float | None = Field(None, gt=0, description="wall-clock budget of the whole ablation; sizes model and tokens "
                                                          "(6ND, Chinchilla D = 20 N); null: `train` as given")
    device_flops: float | None = Field(None, gt=0, description="sustained training FLOP/s of this machine (null: measured)")
    train_share: float = Field(0.7, gt=0, le=1, description="share of the time left after curation given to training steps "
                                                           "(the rest: tokenizing, export, evaluation)")


class AblateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("ablation", pattern=SAFE_VARIANT, description="names the catalog datasets ablate-<name>-<output hash>-<variant>")
    output: str = "runs/ablate"
    raw_mix: RawMixConfig | None = Field(None, description="build a raw mix from real text files (synthetic/ablate_mix.py) and add it to the input")
    input: list[str] = Field(default_factory=list, description="raw input: paths, globs or URLs, as for curate")
    curate: CurateBase = CurateBase()
    variants: list[VariantSpec] = Field(min_length=2)
    seeds: list[int] = Field(default_factory=lambda: [0, 1], min_length=1, description="one training run per variant and seed")
    tokenizer: TokenizerSample = TokenizerSample()
    train: dict[str, Any] = Field(default_factory=dict, description="a `quipu train` config without output, seed, tokenizer "
                                                                   "and data.phases (the ablation sets those per run)")
    heldout: HeldoutConfig
    budget: BudgetConfig = BudgetConfig()
    check_hf: bool = Field(True, description="score every run's HF export again with transformers and record the difference")
    workers: int = Field(2, ge=1, le=64, description="parallel shard tasks while curating")
    equal_tokens: bool = Field(False, description="every variant trains on the same number of tokens per language: "
                                                  "the fewest any variant's selection holds, each taking its documents "
                                                  "in a random order (`sample_seed`) up to that count")
    sample_seed: int = Field(0, description="the document order of `equal_tokens` sampling")
    resample_per_seed: bool = Field(True, description="with `equal_tokens`, each training seed draws its own sample "
                                                      "(order fixed by `sample_seed` and the training seed), so the "
                                                      "spread over seeds includes the sample's; false: one sample "
                                                      "for every seed")

    @field_validator("input", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _checks(self):
        names = [v.name for v in self.variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variants: names must be unique (got {names})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError("seeds: must be distinct")
        if not self.input and self.raw_mix is None:
            raise ValueError("no raw input: give `input` globs or a `raw_mix`")
        for key in ("output", "seed", "tokenizer"):
            if key in self.train:
                raise ValueError(f"train.{key}: set by the ablation for every run; leave it out")
        if "phases" in (self.train.get("data") or {}):
            raise ValueError("train.data.phases: set by the ablation (one phase: the variant's curated data); leave it out")
        return self


def variant_curate_config(config: AblateConfig, v: VariantSpec, output: Path) -> CurateConfig:
    """The curate config of one variant: the base YAML, the shared overrides, `stages`, its own overrides."""
    raw = read_yaml(config.curate.config) if config.curate.config else {}
    raw = apply_overrides(raw, config.curate.set)
    if v.stages is not None:
        raw = apply_overrides(raw, [f"{s}.enabled={'true' if s in v.stages else 'false'}" for s in stage_names()])
    raw = apply_overrides(raw, v.set)
    raw.update(input=[], output=str(output / v.name), dataset=None, workers=config.workers)
    from pydantic import ValidationError
    try:
        return CurateConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, f"variant {v.name!r} (curate config)")) from None


TRAIN_SOURCE = "selection"     # every run's one training source: the arm's selected documents


def run_train_config(config: AblateConfig, dataset: str, run_dir: Path, tokens_dir: Path, tokenizer_json: Path,
                     seed: int, sizing: dict | None = None):
    """One training run's TrainConfig: the `train` block, with this run's data, seed and the shared tokenizer."""
    from pydantic import ValidationError

    from quipu.trainer.train import TrainConfig
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in config.train.items()}
    data = dict(raw.get("data") or {})
    # The source's name seeds its document order and held-out split (trainer/data.py), so it is one fixed name:
    # the dataset's name carries a hash of the output folder, and results must not move with where they are written.
    data.update(phases=[{"name": "main", "sources": [{"dataset": dataset, "name": TRAIN_SOURCE, "weight": 1.0}]}],
                tokens_dir=str(tokens_dir))
    raw.update(output=str(run_dir), seed=seed, data=data, export_hf=True,
               tokenizer={"kind": "file", "path": str(tokenizer_json)})
    if sizing:
        raw["model"] = {**(raw.get("model") or {}), **sizing["model"]}
        raw["train"] = {**(raw.get("train") or {}), "max_steps": sizing["max_steps"]}
        sched = dict(raw.get("schedule") or {})
        sched["warmup_steps"] = min(int(sched.get("warmup_steps", 100)), max(1, sizing["max_steps"] // 10))
        raw["schedule"] = sched
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, "train")) from None


def check_config(config: AblateConfig) -> dict[str, CurateConfig]:
    """Everything that can fail before work starts: variant curate configs, the train block, held-out
    files (and that none of them is a raw input)."""
    out = Path(config.output).resolve()
    curate_cfgs = {v.name: variant_curate_config(config, v, out) for v in config.variants}
    check_name(f"ablate-{config.name}-x", "ablation name")
    probe = run_train_config(config, "probe", out / "probe", out / "tokens", out / "tokenizer" / "tokenizer.json", 0)
    if probe.model.init_from:
        raise ConfigError("train.model.init_from: an ablation trains from scratch (every variant the same initialisation)")
    if probe.train.max_minutes or probe.train.stop_at_step:
        raise ConfigError("train.train.max_minutes / stop_at_step: every run must see the same number of tokens; leave them out")
    for s in config.heldout.sources:
        if s.path is not None and not Path(s.path).is_file():
            raise ConfigError(f"heldout.sources: {s.path} not found")
    if config.raw_mix is not None:
        for s in config.raw_mix.text:
            if not Path(s.path).is_file():
                raise ConfigError(f"raw_mix.text: {s.path} not found")
        held = {Path(s.path).resolve() for s in config.heldout.sources if s.path}
        for s in config.raw_mix.text:
            if Path(s.path).resolve() in held:
                same = [h for h in config.heldout.sources if h.path and Path(h.path).resolve() == Path(s.path).resolve()]
                # the same file may feed both only when the filters split it (e.g. {label: fake} / {label: true})
                if any(not h.where or not s.where or _filters_overlap(h.where, s.where) for h in same):
                    raise ConfigError(f"heldout.sources: {s.path} is also in raw_mix.text with overlapping filters; "
                                      "held-out text must never come from the raw input")
    return curate_cfgs


def _filters_overlap(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in set(a) & set(b))


def resolve_inputs(config: AblateConfig) -> list[str]:
    from quipu.tasks.reading import expand_inputs
    files: list[str] = []
    if config.raw_mix is not None:
        built, _ = ensure_mix(config.raw_mix)
        files += [str(p) for p in built]
    if config.input:
        files += expand_inputs(config.input)
    files = sorted(dict.fromkeys(files))
    held = {str(Path(s.path).resolve()) for s in config.heldout.sources if s.path}
    clash = [f for f in files if str(Path(f).resolve()) in held]
    if clash:
        raise ConfigError(f"heldout.sources: {clash[0]} is also a raw input; held-out text must never come from the raw input")
    return files


# ---- curation as a tree of shared prefixes -----------------------------------------------------

class CurationTree:
    """Runs each variant's curation, running every shared prefix once (see the module docstring)."""

    def __init__(self, root: Path, files: list[str], run_id: str, log):
        self.root, self.files, self.run_id, self.log = root, files, run_id, log
        self.nodes: dict[str, dict] = {}    # prefix hash -> {"stage", "dir", "shards", "report", "variants"}

    def _node(self, prefix: list, run) -> dict:
        key = sha256_json(prefix)[:12]
        if key not in self.nodes:
            stage = prefix[-1][0]
            node_dir = self.root / f"{len(prefix) - 1:02d}-{stage}-{key}"
            t0 = time.perf_counter()
            shards, report = run(node_dir)
            write_json_atomic(node_dir / "node.json", {"stage": stage, "prefix": [p[0] for p in prefix], "key": key})
            self.nodes[key] = {"stage": stage, "dir": str(node_dir), "shards": shards, "report": report,
                               "variants": [], "seconds": round(time.perf_counter() - t0, 2)}
            self.log.info("curate %s: %d in, %d kept (%.1f s)", node_dir.name, report["input_docs"], report["kept_docs"],
                          self.nodes[key]["seconds"])
        return self.nodes[key]

    def _extract(self, cfg: CurateConfig):
        def run(node_dir: Path):
            units = pack_inputs(self.files, int(cfg.extract.pack_mb * 1e6))   # work units sized by data, as curate's
            run = RunContext(str(node_dir.resolve()), removed_schema=REMOVED_SCHEMA)
            results, report = run_extract(units, run, cfg.extract, PrefectPhases().extract)
            return [s for r in results for s in r.kept_shards], report
        return run

    def _stage(self, name: str, cfg: CurateConfig, shards: list[Shard]):
        def run(node_dir: Path):
            ref = stage_ref(name, getattr(cfg, name), RunContext(str(node_dir.resolve()), None, self.run_id))
            results, report = driver.run_stage(ref, [s for s in shards if s.rows > 0], PrefectPhases())
            if report["input_docs"] != sum(s.rows for s in shards):
                raise AssertionError(f"{name}: read {report['input_docs']} documents, previous stage kept {sum(s.rows for s in shards)}")
            driver.write_report(str(node_dir), name, report)
            return [r.kept for r in results], report
        return run

    def curate(self, variant: str, cfg: CurateConfig) -> tuple[list[Shard], list[dict]]:
        """(the variant's final shards, its funnel: one row per stage with the node that ran it)."""
        prefix = [("extract", cfg.extract.model_dump(mode="json"), self.files)]
        node = self._node(prefix, self._extract(cfg))
        path = [node]
        for name in enabled_stages(cfg):
            prefix = prefix + [(name, getattr(cfg, name).model_dump(mode="json"))]
            node = self._node(prefix, self._stage(name, cfg, node["shards"]))
            path.append(node)
        for n in path:
            n["variants"].append(variant)
        funnel = [{"stage": n["stage"], "node": Path(n["dir"]).name, "input_docs": n["report"]["input_docs"],
                   "kept_docs": n["report"]["kept_docs"], "removed_docs": n["report"]["removed_docs"],
                   "removed_by_reason": dict(list(n["report"]["removed_by_reason"].items())[:8])} for n in path]
        return node["shards"], funnel


def register_variants(config: AblateConfig, curated: dict[str, list[Shard]], variants: dict[str, dict], tok,
                      out: Path, run_id: str) -> None:
    """Each variant's training data (its curated documents, or its selection: flows/ablate_select.py)
    as a catalog dataset named for this ablation output: a catalog name is the union of its versions,
    and two ablations (or two outputs of one config) must never train on each other's data. With
    `equal_tokens` and `resample_per_seed`, one dataset per variant and training seed
    (`variants[v]["datasets"]`, seed -> name): each seed trains on its own equal-token sample."""
    wheres = {v.name: v.where for v in config.variants}
    base = {v.name: f"ablate-{config.name}-{sha256_json(str(out))[:8]}-{v.name}" for v in config.variants}
    data: dict[str, dict[str, list[Shard]]] = {v.name: {} for v in config.variants}     # dataset -> its parts
    datasets: dict[str, dict[int, str]] = {v.name: {} for v in config.variants}         # training seed -> dataset
    if config.equal_tokens or any(wheres.values()):
        from quipu.flows.ablate_select import select_draws
        per_seed = config.equal_tokens and config.resample_per_seed
        seeds = list(config.seeds) if per_seed else [None]
        draws = [(f"{config.sample_seed}:{s}", f"selected-seed-{s}") for s in config.seeds] if per_seed else \
            [(config.sample_seed, "selected")]
        for seed, chosen in zip(seeds, select_draws(curated, wheres, config.equal_tokens, draws, tok, out)):
            for name, sel in chosen.items():
                if not sum(p.rows for p in sel["parts"]):
                    raise UserError(f"variants: {name!r} selects no documents (where: {wheres[name] or '{}'}"
                                    f"{'; equal_tokens: no language every variant holds' if config.equal_tokens else ''})")
                dataset = base[name] if seed is None else f"{base[name]}-seed-{seed}"
                data[name][dataset] = sel["parts"]
                datasets[name].update({s: dataset for s in (config.seeds if seed is None else [seed])})
                if seed in (None, config.seeds[0]):    # the report's documents and tokens: the first seed's sample
                    variants[name].update(where=wheres[name] or None, documents=sum(p.rows for p in sel["parts"]),
                                          bytes=sum(p.bytes for p in sel["parts"]), tokens_by_lang=sel["tokens_by_lang"],
                                          selected_tokens_by_lang=sel["selected_tokens_by_lang"],
                                          token_budget=sel["budget"], resampled_per_seed=per_seed)
    else:
        for v in config.variants:
            data[v.name][base[v.name]] = curated[v.name]
            datasets[v.name] = {s: base[v.name] for s in config.seeds}
    for v in config.variants:
        for dataset, parts in data[v.name].items():
            folder = Path(parts[0].path).parent if parts else out / v.name / "curated"
            registry.register_dataset(dataset, "curated", str(folder), run_id,
                                      [{"path": p.path, "rows": p.rows, "bytes": p.bytes, "sha256": p.sha256} for p in parts],
                                      info={"ablation": config.name, "variant": v.name, "stages": variants[v.name]["stages"]})
        variants[v.name]["datasets"] = datasets[v.name]
        variants[v.name]["dataset"] = datasets[v.name][config.seeds[0]]
        write_json_atomic(out / v.name / "curate.json", variants[v.name])


# ---- budget ------------------------------------------------------------------------------------

def size_runs(config: AblateConfig, seconds_left: float, vocab_size: int, log) -> dict:
    """Model shape and steps so that every run fits its share of the time left (trainer/plan.py)."""
    from quipu.trainer.plan import measure_train_flops, size_for_budget
    from quipu.trainer.train import TrainConfig
    base = TrainConfig.model_validate({**config.train, "data": {**(config.train.get("data") or {}),
                                                                "phases": [{"sources": [{"dataset": "x", "weight": 1}]}]}})
    runs = len(config.variants) * len(config.seeds)
    per_run = max(1.0, seconds_left * config.budget.train_share / runs)
    tokens_per_step = base.train.batch_size * base.data.seq_len
    flops = config.budget.device_flops
    measured = []
    sizing = size_for_budget(per_run, flops or 5e10, vocab_size)
    if flops is None:   # measure the machine on the shape we would pick, until the pick stops changing
        for _ in range(3):
            f = measure_train_flops(sizing["model"], vocab_size, base.data.seq_len, base.train.micro_batch, base.train.threads)
            measured.append({"model": sizing["model"], "flops_per_s": f})
            new = size_for_budget(per_run, f, vocab_size)
            if new["model"] == sizing["model"]:
                sizing = new
                break
            sizing = new
        flops = measured[-1]["flops_per_s"]
    sizing["max_steps"] = max(10, int(sizing["tokens"] // tokens_per_step))
    sizing.update(seconds_per_run=round(per_run, 1), runs=runs, flops_per_s=flops, measured=measured,
                  tokens_per_step=tokens_per_step, tokens_seen=sizing["max_steps"] * tokens_per_step)
    log.info("budget: %.0f s left, %d runs, %.0f s of training each at %.3g FLOP/s: %s, %d steps (%d tokens)",
             seconds_left, runs, per_run, flops, sizing["model"], sizing["max_steps"], sizing["tokens_seen"])
    return sizing


# ---- the flow ----------------------------------------------------------------------------------

NOT_IDENTITY = ("workers",)


def owned_entries(config: AblateConfig) -> list[str]:
    return ["curate", "tokenizer", *[v.name for v in config.variants], "budget.json", "ablate.json", "ablate.md", "ablate.png"]


@flow(name="ablate", log_prints=True, persist_result=False)
def ablate(config: AblateConfig, overwrite: bool = False) -> dict:
    log = get_run_logger()
    t_start = time.monotonic()
    curate_cfgs = check_config(config)
    out = Path(config.output).resolve()
    files = resolve_inputs(config)
    cfg_json = config.model_dump(mode="json")
    with output_lock(out):
        claim(out, identity(files, cfg_json, NOT_IDENTITY), owned_entries(config), overwrite)
        registry.mark_stale_runs_crashed("ablate", output=str(out))
        run_id = registry.start_run("ablate", cfg_json, str(out), flow_run_id())
        try:
            result = _ablate(config, curate_cfgs, files, out, run_id, t_start, log)
        except BaseException:
            registry.finish_run(run_id, "failed")
            raise
        record_written(out, owned_entries(config))
        registry.finish_run(run_id, "completed", {k: result[k] for k in ("output", "variants", "seconds")})
    return result


def _ablate(config: AblateConfig, curate_cfgs: dict[str, CurateConfig], files: list[str], out: Path, run_id: str,
            t_start: float, log) -> dict:
    from quipu.flows.train import tokenize_train
    from quipu.trainer.bpb import load_heldout
    from quipu.trainer.tokenizer import TokenizerConfig, prepare_tokenizer

    timings: dict[str, float] = {}
    heldout = load_heldout(config.heldout)
    log.info("held-out: %d documents from %d sources", len(heldout), len(config.heldout.sources))

    # 1. curation, shared prefixes once
    t0 = time.monotonic()
    tree = CurationTree(out / "curate", files, run_id, log)
    variants: dict[str, dict] = {}
    curated: dict[str, list[Shard]] = {}
    for v in config.variants:
        shards, funnel = tree.curate(v.name, curate_cfgs[v.name])
        curated[v.name] = write_curated_task(shards, str(out / v.name / "curated"), curate_cfgs[v.name].curated)
        variants[v.name] = {"stages": enabled_stages(curate_cfgs[v.name]), "funnel": funnel,
                            "documents": sum(p.rows for p in curated[v.name]),
                            "bytes": sum(p.bytes for p in curated[v.name])}
    timings["curate"] = time.monotonic() - t0

    # 2. held-out text must not be in the raw input, not even as a copy under another name
    raw_root = next(iter(tree.nodes.values()))
    overlap = heldout_overlap(heldout, raw_root["shards"])
    if overlap:
        log.warning("%d held-out documents also occur in the raw input: left out of the evaluation", len(overlap))
        heldout = [d for d in heldout if (d.source, d.id) not in overlap]

    # 3. one tokenizer for every run: BPE on a fixed sample of the extracted raw input
    t0 = time.monotonic()
    tok = prepare_tokenizer(TokenizerConfig(kind="bpe", vocab_size=config.tokenizer.vocab_size,
                                            train_docs=config.tokenizer.sample_docs, min_frequency=config.tokenizer.min_frequency),
                            sorted(s.path for s in raw_root["shards"]), out / "tokenizer")
    timings["tokenizer"] = time.monotonic() - t0
    register_variants(config, curated, variants, tok, out, run_id)

    # 4. model and tokens from the budget, the same for every run
    sizing = None
    if config.budget.minutes:
        sized = out / "budget.json"     # sized once: a resumed ablation must train the model it started
        if sized.exists():
            sizing = read_json(sized)
        else:
            left = config.budget.minutes * 60 - (time.monotonic() - t_start)
            if left <= 0:
                raise UserError(f"budget: {config.budget.minutes:g} minutes are spent before training starts "
                                f"(curation took {timings['curate']:.0f} s); raise --budget")
            sizing = size_runs(config, left, tok.vocab_size, log)
            write_json_atomic(sized, sizing)

    # 5. train and score every (variant, seed)
    runs = []
    t0 = time.monotonic()
    for v in config.variants:
        for seed in config.seeds:
            run_dir = out / v.name / f"seed-{seed}"
            cfg = run_train_config(config, variants[v.name]["datasets"][seed], run_dir, out / v.name / "tokens",
                                   tok.path, seed, sizing)
            runs.append(train_and_score(cfg, v.name, seed, run_dir, heldout, config.check_hf, tokenize_train, log))
    timings["train_and_score"] = time.monotonic() - t0
    for v in config.variants:     # the tokens each variant keeps per language, in the one shared tokenizer
        first = next(r for r in runs if r["variant"] == v.name)
        variants[v.name]["kept_by_lang"] = kept_by_lang(Path(first["run_dir"]), variants[v.name]["dataset"])

    from quipu.flows.ablate_report import build_results
    result = build_results(config, out, variants, runs, heldout, tree, sizing, timings, tok, overlap)
    result["seconds"] = round(time.monotonic() - t_start, 1)
    write_json_atomic(out / "ablate.json", result)
    from quipu.flows.ablate_report import publish
    publish(result, out)
    return result


def kept_by_lang(run_dir: Path, dataset: str) -> dict[str, dict[str, int]]:
    """Documents and training tokens (BOS and EOS included) of a variant's curated data per `lang`
    (`unknown` where no language was identified), read from the run's token shards."""
    import numpy as np
    import pyarrow.parquet as pq

    from quipu.trainer.prepare import document_columns
    from quipu.trainer.tokenize import TokenShards
    markers = read_json(run_dir / "prepared.json")["sources"][dataset]
    lens = TokenShards.open(markers).doc_len
    with_lang = all("lang" in pq.read_schema(m["input"]).names for m in markers)
    langs = document_columns(markers, ["lang"]).column(0).to_pylist() if with_lang else [None] * len(lens)
    keys = np.array([x or "unknown" for x in langs], dtype=object)
    return {str(k): {"documents": int((keys == k).sum()), "tokens": int(lens[keys == k].sum())} for k in sorted(set(keys))}


def heldout_overlap(heldout, raw_shards: list[Shard]) -> set[tuple[str, str]]:
    """(source, id) of held-out documents whose whitespace-normalised text is also a raw document."""
    import hashlib

    from quipu.trainer.tokenizer import iter_texts

    def h(t: str) -> bytes:
        return hashlib.blake2b(" ".join(t.split()).encode(), digest_size=16).digest()
    want = {h(d.text): (d.source, d.id) for d in heldout}
    found = set()
    for row in iter_texts([s.path for s in raw_shards], columns=("text",)):
        k = h(row["text"])
        if k in want:
            found.add(want[k])
    return found


def train_and_score(cfg, variant: str, seed: int, run_dir: Path, heldout, check_hf: bool, tokenize_train, log) -> dict:
    """Train one run (or find it finished), then score its held-out BPB with our model and with transformers."""
    from quipu.trainer.bpb import score_checkpoint, score_hf, scores_to_rows, summarize
    from quipu.trainer.checkpoint import latest_checkpoint
    from quipu.trainer.data import BlendError
    from quipu.trainer.train import TrainingDiverged

    done = run_dir / "ablate-run.json"    # written once the run is trained and exported
    summary = read_json(done) if done.exists() else None
    cfg_sha = sha256_json(cfg.model_dump(mode="json"))
    if summary is None or summary.get("config_sha256") != cfg_sha or summary.get("step") != cfg.train.max_steps \
            or not (run_dir / "hf").is_dir():
        t0 = time.monotonic()
        try:
            summary = tokenize_train(cfg, resume=True)
        except (BlendError, TrainingDiverged, FileNotFoundError) as e:
            raise UserError(f"variant {variant!r}, seed {seed}: {e}") from None
        summary = {k: summary.get(k) for k in ("step", "final_loss", "eval_loss", "params", "model", "metrics", "hf")}
        summary["train_seconds"] = round(time.monotonic() - t0, 1)
        summary["config_sha256"] = cfg_sha
        write_json_atomic(done, summary)
    scores_path = run_dir / "bpb.json"
    ckpt = latest_checkpoint(run_dir)
    fp = sha256_json({"checkpoint": str(ckpt), "heldout": [(d.source, d.id) for d in heldout], "seq_len": cfg.data.seq_len})
    cached = read_json(scores_path) if scores_path.exists() else None
    if cached is None or cached.get("fingerprint") != fp or (check_hf and "hf" not in cached):
        t0 = time.monotonic()
        prepared = read_json(run_dir / "prepared.json")
        ours = score_checkpoint(ckpt, prepared["tokenizer"], heldout, cfg.data.seq_len)
        cached = {"fingerprint": fp, "ours": summarize(ours), "docs": scores_to_rows(ours)}
        if check_hf:
            hf = score_hf(run_dir / "hf", heldout, cfg.data.seq_len)
            cached["hf"] = summarize(hf)
            cached["max_abs_doc_nll_diff"] = max((abs(a.nll - b.nll) for a, b in zip(ours, hf)), default=0.0)
            cached["tokens_match"] = all(a.tokens == b.tokens for a, b in zip(ours, hf))
        cached["seconds"] = round(time.monotonic() - t0, 1)
        write_json_atomic(scores_path, cached)
    blend = read_json(run_dir / "blend.json") if (run_dir / "blend.json").exists() else []
    log.info("%s seed %d: held-out BPB %.4f (%s)", variant, seed, cached["ours"]["all"]["bpb"],
             ", ".join(f"{k} {v['bpb']:.4f}" for k, v in cached["ours"]["by_lang"].items()))
    return {"variant": variant, "seed": seed, "run_dir": str(run_dir), "hf": str(run_dir / "hf"),
            "summary": {k: summary.get(k) for k in ("step", "final_loss", "eval_loss", "params", "model", "train_seconds")},
            "blend": blend, "bpb": cached["ours"], "bpb_hf": cached.get("hf"),
            "hf_max_abs_doc_nll_diff": cached.get("max_abs_doc_nll_diff"), "hf_tokens_match": cached.get("tokens_match"),
            "score_seconds": cached.get("seconds"),
            "tokenizer_sha256": sha256_of_tokenizer(run_dir), "model_config": summary.get("model"),
            "tokens_seen": cfg.train.max_steps * cfg.train.batch_size * cfg.data.seq_len,
            "train_config": cfg.model_dump(mode="json")}


def sha256_of_tokenizer(run_dir: Path) -> str:
    from quipu.catalog.files import sha256_file
    return sha256_file(run_dir / "tokenizer" / "tokenizer.json")

