"""Continual training: what a training run does when a new version of one of its datasets is curated.

The `tokenize-train` deployment's trigger on `quipu.curate.completed` calls the flow with the new
version. If the run folder has no checkpoint, training starts with the config as it is (every
source naming the dataset reads all its versions, the new one included). Otherwise the run goes
on from its newest checkpoint with `data.continual.steps` more steps and one more phase starting at
that step, by `data.continual.policy`:

- `append`: the last phase's blend again (its sources name whole datasets, so the new version is
  in it; a source pinned to versions stays pinned);
- `new_phase`: the last phase's sources scaled by 1 - w plus the new version alone at weight w
  (`new_version_weight`), e.g. to look at fresh data more than its size would.

Phase boundaries already passed are frozen as `start_step` (a boundary given as an LR fraction
would move with the longer schedule). The config a run actually trains with is kept as
`RUN/train_config.json`: the next continuation starts from it, and `quipu train
RUN/train_config.json --resume` resumes it by hand.
"""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from quipu.catalog.files import write_json_atomic
from quipu.trainer.checkpoint import NAME, latest_checkpoint
from quipu.trainer.data import BlendError, PhaseSpec, SourceSpec, resolve_phase_starts

EFFECTIVE_CONFIG = "train_config.json"
HISTORY = "continual.json"


class NewVersion(BaseModel):
    """The payload of `quipu.curate.completed` that a continuation needs."""
    model_config = ConfigDict(extra="ignore")
    dataset: str
    version: int = Field(ge=1)


def effective_config(config, run_dir: Path):
    """The config the run in `run_dir` last trained with (its continuations included), else `config`."""
    p = run_dir / EFFECTIVE_CONFIG
    return type(config).model_validate(json.loads(p.read_text())) if p.exists() else config


def checkpoint_step(run_dir: Path) -> int | None:
    ck = latest_checkpoint(run_dir)
    return int(NAME.match(ck.name).group(1)) if ck is not None else None


def continue_with(config, run_dir: Path, new: NewVersion, trained_versions: dict[str, list[int]] | None):
    """(config to train with, resume?) for a new version, or (None, reason) when there is nothing to do."""
    config = effective_config(config, run_dir)
    datasets = {s.dataset for p in config.data.phases for s in p.sources}
    if new.dataset not in datasets:
        return None, f"dataset {new.dataset!r} is not in this run's blend ({', '.join(sorted(datasets))})"
    step = checkpoint_step(run_dir)
    if step is None:
        return config, False
    if any(new.version in v for sel, v in (trained_versions or {}).items() if sel.split("@")[0] == new.dataset):
        return None, f"{new.dataset} v{new.version} is already in this run's data"
    data = config.data
    old_max = config.train.max_steps
    starts = resolve_phase_starts(data, old_max, lambda s: config.schedule.fraction(s, old_max))
    phases = [p.model_copy(update={"start_step": s if i else None, "start_lr_fraction": None})
              for i, (p, s) in enumerate(zip(data.phases, starts))]
    base = phases[-1]
    if starts[-1] >= step and len(phases) > 1:   # the last phase has not started yet: replace it
        phases = phases[:-1]
    tag = f"{new.dataset}-v{new.version}"
    if data.continual.policy == "append":
        sources = list(base.sources)
    else:
        if base.sources[0].weight is None:
            raise BlendError("data.continual.policy: new_phase needs the last phase's sources given by weight, not epochs")
        w = data.continual.new_version_weight
        sources = [s.model_copy(update={"weight": s.weight * (1 - w)}) for s in base.sources]
        sources.append(SourceSpec(dataset=new.dataset, versions=new.version, weight=w, name=tag))
    phases.append(PhaseSpec(name=f"{base.name.split('+')[0]}+{tag}", sources=sources, order=base.order, start_step=step))
    if len(phases) == 1:
        phases[0] = phases[0].model_copy(update={"start_step": None})
    out = config.model_validate(config.model_dump(mode="json") | {
        "data": data.model_dump(mode="json") | {"phases": [p.model_dump(mode="json") for p in phases]},
        "train": config.train.model_dump(mode="json") | {"max_steps": step + data.continual.steps}})
    return out, True


def record(run_dir: Path, config, entry: dict) -> None:
    """Keep the effective config and append to the run's continuation history."""
    write_json_atomic(run_dir / EFFECTIVE_CONFIG, config.model_dump(mode="json"))
    p = run_dir / HISTORY
    history = json.loads(p.read_text()) if p.exists() else []
    write_json_atomic(p, history + [entry])
