"""Prefect tasks of the `dedup` stage (the logic is in `tasks.dedup`, which does not import Prefect):
mapped signatures, one plan, mapped splits, one commit; `run_dedup_stage` is the curate flow's
runner for `StageSpec("dedup")`.
"""
from __future__ import annotations

from prefect import task, unmapped

from tasks.dedup import DedupConfig, attach_report, commit, compute_signatures, plan, split_shard
from tasks.stage import Shard


@task(name="dedup-signatures", task_run_name="dedup-signatures-{shard.name}", retries=1, retry_delay_seconds=1)
def dedup_signatures_task(shard: Shard, run_dir: str, cfg: DedupConfig) -> dict:
    return compute_signatures(shard, run_dir, cfg)


@task(name="dedup-plan", retries=0)
def dedup_plan_task(sig_results: list[dict], run_dir: str, cfg: DedupConfig) -> dict:
    return plan(sig_results, run_dir, cfg)


@task(name="dedup-split", task_run_name="dedup-split-{shard.name}", retries=1, retry_delay_seconds=1)
def dedup_split_task(shard: Shard, run_dir: str, cfg: DedupConfig, plan_result: dict) -> dict:
    return split_shard(shard, run_dir, cfg, plan_result)


@task(name="dedup-commit", retries=0)
def dedup_commit_task(sig_results: list[dict], plan_result: dict, run_dir: str, cfg: DedupConfig) -> dict:
    return commit(sig_results, plan_result, run_dir, cfg)


def run_dedup_stage(shards: list[Shard], run_dir: str, cfg: DedupConfig) -> list[dict]:
    """The curate flow's runner for StageSpec("dedup"): mapped signatures, one plan, mapped splits,
    one commit (only after every split succeeded)."""
    sigs = [f.result() for f in dedup_signatures_task.map(shards, run_dir=unmapped(run_dir), cfg=unmapped(cfg))]
    p = dedup_plan_task(sigs, run_dir, cfg)
    results = [f.result() for f in dedup_split_task.map(shards, run_dir=unmapped(run_dir), cfg=unmapped(cfg),
                                                          plan_result=unmapped(p))]
    info = dedup_commit_task(sigs, p, run_dir, cfg)
    return attach_report(results, p, info, sigs)
