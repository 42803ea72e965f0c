"""The `quality-train` flow: train, evaluate and register a fastText classifier of the family
(quipu.scoring.fasttext_classifier): the quality classifier the `quality` stage applies, or any other
kind the config names. The steps are in quipu.trainer.classifier_train; this flow runs them as
Prefect tasks, writes `eval.json`, registers `model.bin` with its config, training-data fingerprint
and evaluation in the catalog (as the config's `kind`, `quality-fasttext` by default), and shows the
evaluation as an artifact.
"""
from __future__ import annotations

import time
from pathlib import Path

from prefect import flow, get_run_logger, task

from quipu.catalog import registry
from quipu.catalog.errors import UserError
from quipu.catalog.files import sha256_file, write_json_atomic
from quipu.flows.run_names import output_name
from quipu.flows.runners import failed_run, flow_run_id
from quipu.trainer.classifier_train import (ClassifierTrainConfig, eval_markdown, evaluate_file, model_meta,
                                            prepare_data, train_model)
from quipu.scoring.fasttext_classifier import model_sidecar


@task(name="quality-train-data")
def prepare_data_task(cfg: ClassifierTrainConfig, out_dir: str) -> dict:
    return prepare_data(cfg, out_dir)


@task(name="quality-train-fasttext")
def train_fasttext(train_path: str, params, seed: int, model_path: str) -> str:
    return train_model(train_path, params, seed, model_path)


@task(name="quality-train-eval")
def evaluate_task(model_path: str, valid_path: str, threshold: float) -> dict:
    return evaluate_file(model_path, valid_path, threshold)


@flow(name="quality-train", flow_run_name=output_name("quality-train"), log_prints=True, persist_result=False)
def quality_train(config: ClassifierTrainConfig) -> dict:
    try:
        return _quality_train(config)
    except (UserError, FileNotFoundError) as e:   # on a worker: one ERROR line with the fix, no traceback
        return failed_run(e)


def _quality_train(config: ClassifierTrainConfig) -> dict:
    log = get_run_logger()
    t0 = time.perf_counter()
    out = Path(config.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cfg_json = config.model_dump(mode="json")
    run_id = registry.start_run("quality-train", cfg_json, str(out), flow_run_id())
    try:
        data = prepare_data_task(config, str(out))
        s = data["stats"]
        log.info("training examples: %d, validation: %d, groups: %s", s["train"], s["valid"],
                 {g: v["per_class"] for g, v in s["groups"].items()})
        model_path = str(out / "model.bin")
        meta = model_meta(config, data)   # the sidecar first: the evaluation's loader reads it
        write_json_atomic(model_sidecar(model_path), meta)
        train_fasttext(data["train"], config.fasttext, config.seed, model_path)
        ev = evaluate_task(model_path, data["valid"], config.threshold)
        ev["model_sha256"] = sha256_file(model_path)
        ev["training_data_fingerprint"] = data["fingerprint"]
        write_json_atomic(out / "eval.json", ev)
        model_id = registry.register_model(
            config.name, config.kind, model_path, config={**meta, "train_config": cfg_json},
            metrics={k: ev[k] for k in ("n", "roc_auc", "precision", "recall", "f1", "accuracy", "threshold")}
            | {"per_language": {k: v["roc_auc"] for k, v in ev["per_language"].items()}},
            fingerprint=data["fingerprint"], run_id=run_id)
        try:
            from prefect.artifacts import create_markdown_artifact
            create_markdown_artifact(key=config.artifact_key, markdown=eval_markdown(ev, model_path, s, config.kind),
                                     description=f"Classifier evaluation ({config.name}, {config.kind})")
        except Exception as e:   # no API to publish to: the eval.json is the record
            log.warning("could not publish the evaluation artifact: %s", e)
    except BaseException:
        registry.finish_run(run_id, "failed")
        raise
    summary = {"run_id": run_id, "model_id": model_id, "model": model_path, "eval": str(out / "eval.json"),
               "roc_auc": ev["roc_auc"], "precision": ev["precision"], "recall": ev["recall"], "f1": ev["f1"],
               "per_language": {k: v["roc_auc"] for k, v in ev["per_language"].items()},
               "train": s["train"], "valid": s["valid"], "fingerprint": data["fingerprint"],
               "seconds": round(time.perf_counter() - t0, 2)}
    registry.finish_run(run_id, "completed", summary)
    return summary
