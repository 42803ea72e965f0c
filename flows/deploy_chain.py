"""Do the deployments of a prefect.yaml fit together? The chain watch → curate → tokenize-train,
checked as a whole before `quipu deploy` sends anything.

Each config is validated alone by `flows/deploy.py`; here the training blends are held against
what the curate deployments write:

- the datasets: a curate run triggered by a watcher writes into the watcher's `dataset`, a plain
  run into its own `dataset` (or its output folder's name); a blend source must name one of them
  or a dataset already in the catalog;
- the columns: a source's `where:` columns, `dup_upsample_cap` (`dup_count`) and a phase's
  curriculum (`order: ppl_wayra`) need the stage that writes the column switched on in the curate
  config (langid, quality, dedup, perplexity);
- the values: `where: {lang: pt}` needs `pt` among `langid.languages`, or the source is empty; a
  source by language that must be in every version (`when_empty: fail`) is a warning: a batch in
  other languages would fail training;
- the versions: a source pinned to closed versions never reads what the chain curates next.

An error names the train deployment and its config file, the curate deployment and its config
file, and the fix; a warning is printed and the deploy goes on.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quipu.flows.config import ConfigError

CURATE = "flows/curate.py:curate"
WATCH = "flows/watch.py:watch"
TRAIN = "flows/train.py:tokenize_train"
CURATE_COMPLETED = "quipu.curate.completed"
DATA_ARRIVED = "quipu.data.arrived"
DATASET_RESOURCE = "quipu.dataset."

# How to switch on a stage that needs more than its `enabled` (any other: `<stage>.enabled: true`).
STAGE_FIX = {"perplexity": "perplexity.enabled: true (it needs a student: `quipu ppl distill`)",
             "quality": "quality.enabled: true (it needs a classifier: `quipu quality train`)"}


@dataclass
class Producer:
    """What one curate deployment (or one of its triggers) writes."""
    where: str                     # "deployment curate (configs/curate/demo.yaml)"
    file: str                      # its config file
    datasets: set[str] | None      # None: whatever the event names (no watcher deployment to say which)
    columns: set[str]
    stages: set[str]
    languages: set[str] | None     # langid's target languages (None: langid off)


def has_template(value) -> bool:
    """Whether a parameter value holds a `{{ ... }}` template (filled in by the server per event)."""
    if isinstance(value, str):
        return "{{" in value
    if isinstance(value, dict):
        return any(has_template(v) for v in value.values())
    if isinstance(value, list):
        return any(has_template(v) for v in value)
    return False


def _concrete(config: dict) -> dict:
    return {k: v for k, v in (config or {}).items() if not has_template(v)}


def curate_columns(config) -> tuple[set[str], set[str]]:
    """(columns of the curated shards, enabled stages) of a validated CurateConfig."""
    from quipu.tasks.pipeline import STAGES
    from quipu.tasks.schema import BASE_FIELDS
    from quipu.tasks.urls import URL_FIELDS
    stages = {s.name for s in STAGES if getattr(config, s.name).enabled}
    columns = {f.name for f in BASE_FIELDS} | {f.name for f in URL_FIELDS}
    columns |= {f.name for s in STAGES if s.name in stages for f in s.columns}
    return columns, stages


def producers(deployments: list[dict], configs: dict[str, str], root: Path | None = None) -> list[Producer]:
    """`root`: where a curate form's config file is read from (the checkout; default the cwd)."""
    from quipu.catalog.names import name_from
    from quipu.flows.curate_config import from_form
    from quipu.flows.watch import WatchConfig

    watchers = {d["name"]: WatchConfig.model_validate(_concrete((d.get("parameters") or {}).get("config")))
                for d in deployments if d.get("entrypoint") == WATCH}
    out = []
    for d in deployments:
        if d.get("entrypoint") != CURATE:
            continue
        where = f"deployment {d['name']} ({configs.get(d['name'], 'no config file')})"
        base = (d.get("parameters") or {}).get("config") or {}
        variants = [(base, None)] + [((t.get("parameters") or {}).get("config") or base, t)
                                     for t in d.get("triggers") or [] if (t.get("parameters") or {})]
        for cfg_dict, trigger in variants:
            cfg = from_form(_concrete(cfg_dict), root)
            columns, stages = curate_columns(cfg)
            templated = "{{" in str(cfg_dict.get("dataset", ""))
            if trigger is not None and templated and DATA_ARRIVED in (trigger.get("expect") or []):
                datasets = {w.dataset for w in watchers.values()} if watchers else None
            else:
                datasets = {cfg.dataset or name_from(Path(cfg.output).name)}
            out.append(Producer(where, configs.get(d["name"], "its config"), datasets, columns, stages,
                                set(cfg.langid.languages) if "langid" in stages else None))
    return out


def _catalog_datasets() -> set[str]:
    try:
        from quipu.catalog import registry
        return {d["name"] for d in registry.list_datasets(kind="curated")}
    except Exception:    # no catalog yet: nothing curated
        return set()


def check_chain(deployments: list[dict], configs: dict[str, str], root: Path | None = None) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the resolved deployments taken together (config files under `root`)."""
    from quipu.tasks.pipeline import column_stage
    from quipu.trainer.data import parse_condition
    from quipu.trainer.train import TrainConfig

    made = producers(deployments, configs, root)
    written = {ds for p in made for ds in p.datasets or ()}
    errors, warnings = [], []
    catalog = None
    for d in deployments:
        if d.get("entrypoint") != TRAIN:
            continue
        where = f"deployment {d['name']} ({configs.get(d['name'], 'no config file')})"
        file = configs.get(d["name"], "its config")
        cfg = TrainConfig.model_validate(_concrete((d.get("parameters") or {}).get("config")))
        for i, phase in enumerate(cfg.data.phases):
            for j, src in enumerate(phase.sources):
                key = f"data.phases[{i}].sources[{j}]"
                feeding = [p for p in made if p.datasets is None or src.dataset in p.datasets]
                if not feeding:
                    catalog = _catalog_datasets() if catalog is None else catalog
                    if src.dataset not in catalog:
                        errors.append(f"{where}: {key}.dataset: no curate deployment writes dataset {src.dataset!r} "
                                      f"(they write {', '.join(sorted(written)) or 'none'}) and the catalog has no "
                                      f"such dataset; fix: name one of those in {file}, or set `dataset: "
                                      f"{src.dataset}` in a watcher's or the curate deployment's config")
                    continue
                needed = {col: f"{key}.where.{col}" for col in src.where}
                if src.dup_upsample_cap is not None:
                    needed["dup_count"] = f"{key}.dup_upsample_cap"
                if phase.order == "ppl_wayra":
                    needed["ppl_wayra"] = f"data.phases[{i}].order: ppl_wayra"
                for p in feeding:
                    for col, what in needed.items():
                        if col in p.columns:
                            continue
                        stage = column_stage(col)
                        alt = "set `order: shuffle`" if col == "ppl_wayra" else f"drop {what}"
                        switch = STAGE_FIX.get(stage, f"{stage}.enabled: true")
                        fix = f", or switch on {switch} in {p.file}" if stage else ""
                        errors.append(f"{where}: {what} needs column {col!r}, which {p.where} does not write "
                                      f"({stage + ' is off' if stage else 'no stage writes it'}); "
                                      f"fix: {alt} in {file}{fix}")
                    op, lang = parse_condition(src.where["lang"]) if "lang" in src.where else (None, None)
                    wanted = {lang} if op == "==" else set(lang) if op == "in" else None
                    if wanted and p.languages is not None and not wanted & p.languages:
                        errors.append(f"{where}: {key}.where.lang: {src.where['lang']!r} is not among the languages "
                                      f"{p.where} keeps ({', '.join(sorted(p.languages))}), so the source is "
                                      f"always empty; fix: add it to langid.languages in {p.file}, or drop the "
                                      f"source from {file}")
                if "lang" in src.where and src.when_empty == "fail":
                    warnings.append(f"{where}: {key}: a version the chain curates without {src.where['lang']!r} "
                                    "documents (a batch in other languages) fails training, as this source needs "
                                    f"at least 2; fix: set `when_empty: redistribute` on it in {file} (its weight "
                                    "then goes to the sources the version has)")
                if src.versions is not None and not str(src.versions).endswith(".."):
                    warnings.append(f"{where}: {key}.versions: {src.versions!r} is fixed, so the versions "
                                    f"{feeding[0].where} adds later are not read by this source (use e.g. '2..' "
                                    f"or leave `versions` out in {file})")
    return errors, warnings


def train_trigger_resources(blend_datasets: set[str]) -> list[str]:
    """The event resources a training trigger listens to: only the datasets its blend names."""
    return sorted(DATASET_RESOURCE + ds for ds in blend_datasets)


def fail_on(errors: list[str]) -> None:
    if errors:
        raise ConfigError("the deployments do not fit together:\n  " + "\n  ".join(errors))
