"""flows/run_names.py as its docstring states it: each flow's run name from its parameters, and a
name that cannot be computed falling back to the flow's name and the time instead of failing the run."""
from __future__ import annotations

import pytest

from quipu.flows import run_names

NOW = "20261126-132405"


@pytest.fixture
def params(monkeypatch, tmp_path):
    """Sets the run's parameters (as Prefect's flow_run.parameters would give them) and the clock."""
    monkeypatch.setenv("QUIPU_HOME", str(tmp_path / "home"))   # a catalog with no versions yet
    monkeypatch.setattr(run_names, "_now", lambda: NOW)

    def set_params(**p):
        monkeypatch.setattr(run_names, "_config", lambda: (p, p.get("config")))
    return set_params


def test_each_flow_names_its_runs_by_what_they_make(params):
    params(config={"output": "runs/big", "train": {"max_steps": 500}})
    assert run_names.train_name() == f"train-big-step500-{NOW}"
    params(config={"output": "runs/big"}, new_version={"dataset": "crawl", "version": 3})
    assert run_names.train_name() == f"train-big-crawl-v3-{NOW}"
    params(config={"name": "news"})
    assert run_names.watch_name() == f"watch-news-{NOW}"
    params(config={})
    assert run_names.watch_name() == f"watch-raw-{NOW}"
    params(config={"output": "models/q"})
    assert run_names.output_name("quality-train")() == f"quality-train-q-{NOW}"
    # curate: the version this run adds (the first: v1), the dataset named from the output folder
    params(config={"output": "runs/my crawl"})
    assert run_names.curate_name() == f"curate-my_crawl-v1-{NOW}"
    params(config={"output": "runs/x", "dataset": "web"})
    assert run_names.curate_name() == f"curate-web-v1-{NOW}"


def test_a_name_that_cannot_be_computed_falls_back_to_the_flow_and_time(params, monkeypatch):
    def unreadable():
        raise OSError("catalog cannot be read")
    monkeypatch.setattr(run_names, "_config", unreadable)
    for name in (run_names.curate_name(), run_names.train_name(), run_names.watch_name(), run_names.output_name("ppl")()):
        assert name == f"run-{NOW}"        # no flow run here: Prefect knows no flow name
