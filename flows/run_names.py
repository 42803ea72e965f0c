"""Flow run names a user can follow in the UI and in `quipu catalog ls` (Prefect's default is two
random words): what the run makes, and which version or step.

- curate: `curate-<dataset>-v<N>-<UTC date-time>` (N: the version this run adds to the dataset)
- tokenize-train: `train-<output folder>-step<N>-<UTC date-time>` (N: the step the run trains to,
  at most: `data.max_epochs` may stop a small version sooner), or for a new version
  `train-<output folder>-<dataset>-v<N>-<UTC date-time>`
- watch: `watch-<watcher name>-<UTC date-time>`; others: `<flow>-<output folder>-<UTC date-time>`

The date-time is to the second (20261126-132405), so two runs of a minute have different names.

Each is computed from the run's parameters when Prefect creates the run; a failure to compute one
(a catalog that cannot be read) falls back to the flow's name and the time, never fails the run.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")


def _config():
    from prefect.runtime import flow_run
    params = flow_run.parameters or {}
    return params, params.get("config")


def _get(cfg, key: str, default=None):
    if cfg is None:
        return default
    return cfg.get(key, default) if isinstance(cfg, dict) else getattr(cfg, key, default)


def _named(make) -> str:
    try:
        return make()
    except Exception:   # a name is a label: never the reason a run fails
        from prefect.runtime import flow_run
        return f"{flow_run.flow_name or 'run'}-{_now()}"


def curate_name() -> str:
    def make():
        from quipu.catalog import registry
        from quipu.catalog.names import name_from
        _, cfg = _config()
        dataset = _get(cfg, "dataset") or name_from(Path(_get(cfg, "output", "runs/curate")).name)
        version = max((v["version"] for v in registry.dataset_versions(dataset)), default=0) + 1
        return f"curate-{dataset}-v{version}-{_now()}"
    return _named(make)


def train_name() -> str:
    def make():
        params, cfg = _config()
        run_dir = Path(_get(cfg, "output", "runs/train"))
        new = params.get("new_version")
        if new:
            return f"train-{run_dir.name}-{_get(new, 'dataset')}-v{_get(new, 'version')}-{_now()}"
        return f"train-{run_dir.name}-step{_get(_get(cfg, 'train'), 'max_steps', 0)}-{_now()}"
    return _named(make)


def watch_name() -> str:
    return _named(lambda: f"watch-{_get(_config()[1], 'name', 'raw')}-{_now()}")


def output_name(flow: str):
    """`<flow>-<output folder>-<date-time>` for flows named by what they write."""
    def name() -> str:
        return _named(lambda: f"{flow}-{Path(_get(_config()[1], 'output', flow)).name}-{_now()}")
    return name
