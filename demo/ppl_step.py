"""The demo's `ppl-distill` step: a student (and KenLM models) from the demo's own data, so that
the curate step's `perplexity` stage runs for real.

1. Input: the documents the first pass's heuristics kept (`<run>/heuristics/kept`, written by the
   quality-train step); without that pass, the demo's JSONL inputs.
2. `ppl-distill` with configs/ppl/demo.yaml: SmolLM2-135M labels a few hundred documents (first 128
   tokens, cached in the catalog, so a rerun costs nothing), a tiny student trains for ~40 s. The
   labels shipped in demo/teacher_labels.json.gz (`make demo-labels` regenerates them; provenance in
   the file) go into the cache first when they were made with this teacher and window: labelling was
   most of the demo's time. They are keyed by the teacher's file hash and each text's hash, so a
   document they do not cover (another corpus build) is labelled now; `--label-anew` ignores them.
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


def corpus_fingerprint(data_dir: Path) -> str | None:
    """A hash of the built demo corpus (its manifest's scale and file hashes); None when not built."""
    import hashlib
    import json
    manifest = Path(data_dir) / "manifest.json"
    if not manifest.is_file():
        return None
    m = json.loads(manifest.read_text())
    return hashlib.sha256(json.dumps([m.get("scale"), m.get("files")], sort_keys=True).encode()).hexdigest()[:24]


def read_shipped_labels(path: Path = SHIPPED_LABELS) -> dict | None:
    """{"provenance": {...}, "labels": {namespace: {key: value}}} from the shipped file; None without one."""
    import gzip
    import json
    if not path.is_file():
        return None
    return json.loads(gzip.decompress(path.read_bytes()))


def shipped_labels_mismatch(provenance: dict, teacher_fingerprint: str, max_tokens: int) -> str | None:
    """Why the shipped labels cannot serve this teacher (another model or window), or None."""
    if provenance.get("teacher_fingerprint") != teacher_fingerprint:
        return (f"they are teacher {provenance.get('teacher_fingerprint')}'s labels; this teacher is {teacher_fingerprint}")
    if provenance.get("max_tokens") != max_tokens:
        return f"they score the first {provenance.get('max_tokens')} tokens; teacher.max_tokens is {max_tokens}"
    return None


def seed_teacher_labels(path: Path = SHIPPED_LABELS) -> int:
    """Put the shipped teacher labels into the catalog's label cache (entries it lacks); their count."""
    from quipu.catalog.registry import kv_get_many, kv_put_many
    shipped = read_shipped_labels(path)
    if shipped is None:
        return 0
    added = 0
    for namespace, items in shipped["labels"].items():
        have = kv_get_many(namespace, list(items))
        new = {k: v for k, v in items.items() if k not in have}
        kv_put_many(namespace, new)
        added += len(new)
    return added


def export_teacher_labels(path: Path = SHIPPED_LABELS, provenance: dict | None = None) -> int:
    """Write every teacher label in the catalog to `path` (deterministic bytes for the same labels
    and provenance); the number of entries. `make demo-labels` runs it on a catalog that holds only
    the demo's labels (a fresh QUIPU_HOME, `quipu demo --label-anew` up to ppl-distill)."""
    import gzip
    import json

    import sqlalchemy as sa

    from quipu.catalog import db
    out: dict[str, dict] = {}
    with db.engine().connect() as conn:
        for namespace in label_namespaces():
            rows = conn.execute(sa.select(db.kv.c.key, db.kv.c.value).where(db.kv.c.namespace == namespace))
            out[namespace] = {k: json.loads(v) for k, v in sorted(rows)}
    doc = {"provenance": provenance or {}, "labels": out}
    path.write_bytes(gzip.compress(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), mtime=0))
    return sum(len(v) for v in out.values())


def labels_provenance(data_dir: Path) -> dict:
    """What the shipped labels were made with: the demo's teacher (file, content hash, window,
    precision), the corpus build, the library versions and the command."""
    import torch
    import transformers

    from quipu.flows.config import load_config
    from quipu.flows.ppl import PplConfig
    from quipu.scoring.model_files import weights_fingerprint
    from quipu.trainer.teacher import cpu_bf16_native, resolve_teacher_path
    cfg = load_config(PplConfig, str(PPL_DEMO_CONFIG), []).teacher
    path = resolve_teacher_path(cfg.path)
    bf16 = torch.cuda.is_available() or (cfg.bf16 and cpu_bf16_native())
    return {"teacher": path.name, "teacher_fingerprint": weights_fingerprint(path), "max_tokens": cfg.max_tokens,
            "precision": "bf16" if bf16 else "fp32", "corpus_fingerprint": corpus_fingerprint(data_dir),
            "label_docs": load_config(PplConfig, str(PPL_DEMO_CONFIG), []).label_docs,
            "torch": torch.__version__, "transformers": transformers.__version__, "command": "make demo-labels"}


def use_shipped_labels(ctx, config) -> None:
    """Seed the label cache from demo/teacher_labels.json.gz when it was made with this teacher;
    say what happened (another corpus build: the documents it does not cover are labelled)."""
    from quipu.scoring.model_files import weights_fingerprint
    from quipu.trainer.teacher import resolve_teacher_path
    if ctx.label_anew:
        print("teacher labels: --label-anew, the shipped ones are not used: the teacher labels every document")
        return
    shipped = read_shipped_labels()
    if shipped is None:
        print(f"teacher labels: no {SHIPPED_LABELS.name} (make demo-labels): the teacher labels every document")
        return
    prov = shipped["provenance"]
    why = shipped_labels_mismatch(prov, weights_fingerprint(resolve_teacher_path(config.teacher.path)),
                                  config.teacher.max_tokens)
    if why:
        print(f"teacher labels: {SHIPPED_LABELS.name} not used ({why}): the teacher labels every document")
        return
    seeded = seed_teacher_labels()
    corpus = "this corpus build" if prov.get("corpus_fingerprint") == corpus_fingerprint(ctx.data_dir) else \
        "another build of the demo corpus: documents they do not cover are labelled now"
    print(f"teacher labels: {SHIPPED_LABELS.name} ({prov.get('teacher')}, {prov.get('precision')}, first "
          f"{prov.get('max_tokens')} tokens, made on {corpus}); {seeded} entries new to the cache")


def ppl_distill_step(ctx) -> None:
    from quipu.flows.config import load_config
    from quipu.flows.ppl import KenLMTrainConfig, PplConfig, kenlm_train, ppl_distill
    from quipu.scoring.kenlm_model import KENLM_BIN_DIR, kenlm_available

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
    use_shipped_labels(ctx, config)
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


if __name__ == "__main__":   # python -m quipu.demo.ppl_step DATA_DIR (make demo-labels)
    import sys
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("data/demo")
    print(f"{export_teacher_labels(SHIPPED_LABELS, labels_provenance(data))} labels written to {SHIPPED_LABELS}")
