"""The driver runs any stage it is given: a toy stage defined here, in no pipeline list."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from quipu.tasks.driver import InProcess, StageRef, run_pipeline, run_stage
from quipu.tasks.schema import BASE_SCHEMA, removed_schema
from quipu.tasks.stage import Outcome, RunContext, Stage, StageConfig, split_by_mask, write_table

SHOUT = pa.field("shout_score", pa.float64())


class ShoutConfig(StageConfig):
    max_upper: float = 0.5


class ShoutFilter(Stage):
    """Removes documents that are mostly capitals; adds the share of capitals as a column."""
    name = "shout"
    Config = ShoutConfig
    columns = (SHOUT,)

    def process(self, batch: pa.Table, shard_plan=None) -> Outcome:
        texts = batch.column("text").to_pylist()
        scores = [sum(c.isupper() for c in t) / max(1, sum(c.isalpha() for c in t)) for t in texts]
        batch = batch.append_column(SHOUT, pa.array(scores, pa.float64()))
        keep = [s <= self.config.max_upper for s in scores]
        kept, removed = split_by_mask(batch, keep, [None if k else "shout:too_loud" for k in keep])
        return Outcome(kept, removed, {"scored": len(texts)})


def _shards(tmp_path, texts_per_shard: list[list[str]]):
    shards = []
    for i, texts in enumerate(texts_per_shard):
        rows = [{"id": f"{i}-{j}", "text": t} for j, t in enumerate(texts)]
        shards.append(write_table(tmp_path / "in" / f"s{i}.parquet", pa.Table.from_pylist(rows, BASE_SCHEMA)))
    return shards


def test_driver_runs_a_stage_no_pipeline_lists(tmp_path):
    shards = _shards(tmp_path, [["quiet words here", "LOUD WORDS HERE"], ["STOP IT NOW", "fine", "Also fine"]])
    ref = StageRef(ShoutFilter, ShoutConfig(), RunContext(str(tmp_path / "run")))
    results, report = run_stage(ref, shards, InProcess())
    assert (report["input_docs"], report["kept_docs"], report["removed_docs"]) == (5, 3, 2)
    assert report["removed_by_reason"] == {"shout:too_loud": 2} and report["stats"]["scored"] == 5
    removed = pq.read_table(results[0].removed.path)
    # run alone, its removed rows carry the base columns, stage, reason and its own column
    assert removed.schema.equals(removed_schema([SHOUT]))
    assert removed.column("id").to_pylist() == ["0-1"] and removed.column("stage").to_pylist() == ["shout"]
    again, _ = run_stage(ref, shards, InProcess())
    assert all(r.skipped for r in again)   # its done-markers serve it as any stage's


def test_the_run_gives_the_removed_rows_schema(tmp_path):
    """In a run of several stages, every stage writes its removed rows in the run's one schema."""
    extra = pa.field("other_stage_score", pa.float64())
    shared = removed_schema([extra, SHOUT])
    ctx = RunContext(str(tmp_path / "run"), removed_schema=shared)
    reports, out = run_pipeline([StageRef(ShoutFilter, ShoutConfig(), ctx)], _shards(tmp_path, [["A B", "a b"]]))
    assert reports["shout"]["kept_docs"] == 1 and out[0].rows == 1
    removed = pq.read_table(next((tmp_path / "run" / "shout" / "removed").glob("*.parquet")))
    assert removed.schema.equals(shared) and removed.column("other_stage_score").null_count == 1
