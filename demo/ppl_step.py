"""The demo's `ppl-distill` step: a student (and KenLM models) from the demo's own data, so that
the curate step's `perplexity` stage runs for real.

1. Input: the documents the first pass's heuristics kept (`<run>/heuristics/kept`, written by the
   quality-train step); without that pass, the demo's JSONL inputs.
2. `ppl-distill` with configs/ppl/demo.yaml: SmolLM2-135M labels a few hundred documents (first 128
   tokens, cached in the catalog, so a rerun costs nothing), a tiny student trains for ~40 s. When
   demo/teacher_labels.json.gz is there (made by `export_teacher_labels` after one demo run), its
   labels go into the cache first: labelling took 8 of the demo's 12.5 minutes. They are keyed by
   the teacher's file hash and each text's hash, so another teacher or a changed corpus labels anew.
3. `kenlm-train` with configs/kenlm/demo.yaml when `make kenlm` has built lmplz; otherwise a one-line
   notice and the stage runs without `ppl_kenlm`.
4. The curate step runs with the perplexity stage on (buckets, nothing removed) and writes the
   curated shards in curriculum order (ascending `ppl_wayra` within each source).
"""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PPL_DEMO_CONFIG = REPO / "configs" / "ppl" / "demo.yaml"
KENLM_DEMO_CONFIG = REPO / "configs" / "kenlm" / "demo.yaml"
SHIPPED_LABELS = REPO / "demo" / "teacher_labels.json.gz"


def label_namespaces() -> list[str]:
    from quipu.trainer.teacher import LABEL_NAMESPACE
    return [LABEL_NAMESPACE, f"{LABEL_NAMESPACE}:tokens"]


def seed_teacher_labels(path: Path = SHIPPED_LABELS) -> int:
    """Put the shipped teacher labels into the catalog's label cache (entries it lacks); their count."""
    import gzip
    import json

    from quipu.catalog.registry import kv_get_many, kv_put_many
    if not path.is_file():
        return 0
    shipped = json.loads(gzip.decompress(path.read_bytes()))
    added = 0
    for namespace, items in shipped.items():
        have = kv_get_many(namespace, list(items))
        new = {k: v for k, v in items.items() if k not in have}
        kv_put_many(namespace, new)
        added += len(new)
    return added


def export_teacher_labels(path: Path = SHIPPED_LABELS) -> int:
    """Write every teacher label in the catalog to `path` (deterministic bytes). Run after a demo
    run with a fresh QUIPU_HOME, so that only the demo's labels are in it:
    `QUIPU_HOME=$(mktemp -d) quipu demo --steps build-corpus,quality-train,ppl-distill`, then
    `QUIPU_HOME=<that> python -m quipu.demo.ppl_step`."""
    import gzip
    import json

    import sqlalchemy as sa

    from quipu.catalog import db
    out: dict[str, dict] = {}
    with db.engine().connect() as conn:
        for namespace in label_namespaces():
            rows = conn.execute(sa.select(db.kv.c.key, db.kv.c.value).where(db.kv.c.namespace == namespace))
            out[namespace] = {k: json.loads(v) for k, v in sorted(rows)}
    path.write_bytes(gzip.compress(json.dumps(out, sort_keys=True, separators=(",", ":")).encode(), mtime=0))
    return sum(len(v) for v in out.values())


def ppl_distill_step(ctx) -> None:
    from quipu.flows.config import load_config
    from quipu.flows.ppl import KenLMTrainConfig, PplConfig, kenlm_train, ppl_distill
    from quipu.trainer.kenlm_model import KENLM_BIN_DIR, kenlm_available

    run = Path(ctx.run_dir).resolve()
    kept = run / "heuristics" / "kept"
    if kept.is_dir() and any(kept.glob("*.parquet")):
        inputs = [str(kept)]
    else:
        inputs = [str(p) for p in ctx.inputs if ".jsonl" in p.name]
        print(f"no first pass in {kept}: distilling on the demo's JSONL inputs")
    if not inputs:
        from quipu.catalog.errors import UserError
        raise UserError("ppl-distill: no text documents to distil on (run the build-corpus step first)")
    student_dir = run.parent / f"{run.name}-ppl-student"
    config = load_config(PplConfig, str(PPL_DEMO_CONFIG), [f"output={student_dir}"])
    config = PplConfig.model_validate({**config.model_dump(), "input": inputs})
    seeded = seed_teacher_labels()
    if seeded:
        print(f"teacher labels: {seeded} shipped with the demo put in the cache ({SHIPPED_LABELS.name})")
    summary = ppl_distill(config)
    print(f"student {summary['output']}: {summary['train_docs']} training / {summary['val_docs']} validation documents "
          f"(teacher labels: {summary['labels']['computed']} computed, {summary['labels']['cached']} cached), "
          f"validation Spearman {summary['val_spearman']} with the teacher's log-perplexity")
    ctx.overrides += ["perplexity.enabled=true", f"perplexity.student={summary['output']}",
                      "perplexity.buckets=true", "curated.sort_by=ppl_wayra"]
    ctx.where.append(("ppl student", f"{summary['output']}  (metrics.json; quipu catalog ls models)"))

    if not kenlm_available():
        print(f"kenlm: skipped, lmplz/build_binary not built in {KENLM_BIN_DIR} (run `make kenlm`); no ppl_kenlm column")
        return
    kdir = run.parent / f"{run.name}-kenlm"
    kcfg = load_config(KenLMTrainConfig, str(KENLM_DEMO_CONFIG), [f"output={kdir}"])
    kcfg = KenLMTrainConfig.model_validate({**kcfg.model_dump(), "input": inputs})
    from quipu.catalog.errors import UserError
    try:
        ksum = kenlm_train(kcfg)
    except UserError as e:   # e.g. too little text in a language for lmplz: the demo goes on without KenLM
        print(f"kenlm: skipped ({e}); no ppl_kenlm column")
        return
    print("kenlm: " + ", ".join(f"{lang} {f['tokens']} tokens" for lang, f in ksum["languages"].items()))
    ctx.overrides.append(f"perplexity.kenlm={ksum['output']}")
    ctx.where.append(("kenlm models", f"{ksum['output']}/<lang>.binary"))


if __name__ == "__main__":
    print(f"{export_teacher_labels()} labels written to {SHIPPED_LABELS}")
