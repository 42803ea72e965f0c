"""The demo's `quality-train` step: train the quality classifier on the demo's own data.

1. A first curate pass over the demo corpus with every stage after `heuristics` switched off: the
   documents the heuristic filters kept are the positives, those they removed the negatives.
   It writes into the demo's run directory, so the full curate step afterwards reuses its
   extract/langid/heuristics shards (same fingerprints) instead of redoing them.
2. `quality-train` with configs/quality/demo.yaml pointed at that pass.
3. The curate step then runs with `quality.enabled=true` and `quality.model=<this model>`.
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUALITY_DEMO_CONFIG = REPO / "configs" / "quality" / "demo.yaml"
DEMO_CONFIG = REPO / "configs" / "curate" / "demo.yaml"     # the curate config (as demo/run.py)


def quality_train_step(ctx) -> None:
    from quipu.flows.config import load_config
    from quipu.flows.curate import STAGES, CurateConfig, curate
    from quipu.synthetic.corpus import built_corpus
    from quipu.flows.quality_train import ClassifierTrainConfig, quality_train
    from quipu.flows.runners import make_task_runner

    inputs = ctx.inputs or built_corpus(ctx.data_dir, ctx.scale) or []
    if not inputs:
        from quipu.catalog.errors import UserError
        raise UserError(f"no demo corpus in {ctx.data_dir}: run the build-corpus step first")
    names = [s.name for s in STAGES]
    later = names[names.index("heuristics") + 1:]
    # heuristics/kept is the classifier's positives: kept after the run (by default only curated/ is)
    overrides = list(ctx.overrides) + [f"{name}.enabled=false" for name in later] + ["keep_intermediate=true"]
    config = load_config(CurateConfig, str(DEMO_CONFIG), overrides)
    config = CurateConfig.model_validate({**config.model_dump(), "input": [str(p) for p in inputs],
                                          "output": str(ctx.run_dir)})
    print(f"first pass (extract, langid, heuristics) into {ctx.run_dir}: its kept/removed documents train the classifier")
    curate.with_options(task_runner=make_task_runner(config.runner, config.workers))(config)

    run = Path(ctx.run_dir).resolve()
    out = run.parent / f"{run.name}-quality"
    qcfg = load_config(ClassifierTrainConfig, str(QUALITY_DEMO_CONFIG),
                       [f"positive=[{run / 'heuristics' / 'kept'}]", f"negative=[{run / 'heuristics' / 'removed'}]",
                        f"output={out}"])
    summary = quality_train(qcfg)
    print(f"quality classifier {summary['model']}: {summary['train']} training / {summary['valid']} validation documents, "
          f"ROC AUC {summary['roc_auc']}, F1 {summary['f1']}")
    ctx.overrides += ["quality.enabled=true", f"quality.model={summary['model']}"]
    ctx.artifacts["quality_model"] = summary["model"]
    ctx.where.append(("quality model", f"{summary['model']}  (evaluation: {summary['eval']}; "
                                       f"Prefect artifact {qcfg.artifact_key})"))
