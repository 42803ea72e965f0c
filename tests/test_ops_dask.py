"""Scale-out: curate's shard tasks on a 2-worker Dask LocalCluster give the same curated bytes as
the default thread runner."""
from __future__ import annotations

import pytest

from tests.ops_helpers import light_curate_config, small_jsonl


@pytest.mark.slow
def test_dask_local_cluster_matches_threads(prefect_server, shared_data, tmp_path):
    from quipu.flows.curate_cli import run_curate
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig

    inp = tmp_path / "in"
    small_jsonl(shared_data, inp / "en.jsonl", "en_nltk_abc_news.jsonl", 40)
    small_jsonl(shared_data, inp / "es.jsonl", "es_gutenberg_quijote.jsonl", 20)
    cfg_file = light_curate_config(tmp_path / "curate.yaml")
    outputs = {}
    for kind in ("threads", "dask"):
        over = [f"input=[{inp}]", f"output={tmp_path / kind}", f"runner.kind={kind}", "extract.shard_mb=0.02"]
        if kind == "dask":
            over += ["runner.dask_workers=2"]
        assert run_curate(load_config(CurateConfig, cfg_file, over)) == 0
        outputs[kind] = {p.relative_to(tmp_path / kind / "curated"): p.read_bytes()
                         for p in sorted((tmp_path / kind / "curated").glob("*.parquet"))}
    assert outputs["threads"] and outputs["threads"] == outputs["dask"]
