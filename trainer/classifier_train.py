"""Training and evaluating a fastText document classifier (quipu.scoring.fasttext_classifier) of any
kind: the quality classifier the `quality` stage applies is the first; the config's `kind` and
labels make another (a topic or register classifier applied by its own `FastTextFilter` stage).
The `quality-train` flow (quipu.flows.quality_train, `quipu quality train CONFIG`) runs these steps.

Positives (label `hq` by default) and negatives (`lq`) come from sources (quipu.trainer.text_source):
globs of JSONL/parquet files, catalog datasets, or an earlier curate run's `<stage>/kept` /
`<stage>/removed` directories, each optionally filtered by field values or removal reasons. The steps:

1. read the sources, drop exact duplicates and any text that appears in both classes,
2. sample the classes to equal size (per language, with `per_language`), with a fixed seed,
3. split each class into train and validation with that seed,
4. train fastText supervised on `normalize_text(...)` lines (the stage's own normalisation),
5. score the validation split through the stage's scoring code (precision/recall/F1 at the
   threshold, ROC AUC, score histograms, per language).

With `fasttext.thread: 1` the model file is byte-identical for the same data, config and seed;
with more threads fastText's lock-free (Hogwild) updates make runs differ slightly.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import hashlib
import json
import random
import warnings
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quipu.catalog.errors import UserError
from quipu.tasks.stage import snippet
from quipu.catalog.files import atomic_path, write_bytes_atomic
from quipu.scoring.fasttext_classifier import NEGATIVE, POSITIVE, Normalization, load_classifier, normalize_text
from quipu.scoring.resolver import QUALITY_KIND
from quipu.trainer.text_source import SourceError, TextSource, read_source

HIST_BINS = 20
M_PERTURB = -6           # glibc mallopt parameter


# ---- config -----------------------------------------------------------------------------------

class FastTextParams(BaseModel):
    """fastText supervised hyper-parameters, under fastText's own names."""
    model_config = ConfigDict(extra="forbid")
    wordNgrams: int = Field(2, ge=1, le=5)
    dim: int = Field(64, ge=2, le=1000)
    epoch: int = Field(5, ge=1, le=1000)
    lr: float = Field(0.5, gt=0, le=10)
    minCount: int = Field(2, ge=1)
    bucket: int = Field(200_000, ge=0, description="hash buckets for word n-grams (model size ~ bucket * dim * 4 bytes)")
    thread: int = Field(1, ge=1, le=256, description="1 = byte-identical models for a fixed seed")
    loss: str = Field("softmax", pattern=r"^(softmax|hs|ns|ova)$")


class ClassifierTrainConfig(BaseModel):
    """`quipu quality train CONFIG`: one fastText classifier of the family, its kind named here."""
    model_config = ConfigDict(extra="forbid")
    kind: str = Field(QUALITY_KIND, pattern=r"^[a-z0-9]+(-[a-z0-9]+)*-fasttext$",
                      description="catalog model kind, `<what>-fasttext`: the stage that applies the model looks it up by this")
    positive: list[TextSource] = Field(..., min_length=1, description="sources of positive examples (label `positive_label`)")
    negative: list[TextSource] = Field(..., min_length=1, description="sources of negative examples (label `negative_label`)")
    positive_label: str = Field(POSITIVE, pattern=r"^[A-Za-z0-9_-]+$", description="label whose probability is the score")
    negative_label: str = Field(NEGATIVE, pattern=r"^[A-Za-z0-9_-]+$")
    output: str | None = Field(None, description="directory for model.bin, model.json, eval.json, train/valid data "
                                                 "(default runs/<what> for kind <what>-fasttext)")
    name: str | None = Field(None, description="catalog name of the model (default: the kind)")
    languages: list[str] | None = Field(None, description="use only documents in these languages")
    per_language: bool = Field(True, description="balance the classes within each language")
    max_per_class: int | None = Field(None, gt=0, description="cap on examples per class (per language with per_language)")
    min_per_class: int = Field(10, ge=2, description="a language with fewer examples of either class is left out")
    validation_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = 0
    threshold: float = Field(0.5, ge=0, le=1, description="decision threshold for precision/recall/F1")
    normalization: Normalization = Normalization()
    fasttext: FastTextParams = FastTextParams()
    artifact_key: str | None = Field(None, pattern=r"^[a-z0-9-]+$", description="default <what>-train-eval")

    @field_validator("negative_label")
    @classmethod
    def _two_labels(cls, v, info):
        if v == info.data.get("positive_label"):
            raise ValueError(f"{v!r} is also the positive_label: the two classes need two labels")
        return v

    @model_validator(mode="after")
    def _defaults_from_kind(self):
        what = self.kind.removesuffix("-fasttext")   # quality: runs/quality, quality-fasttext, quality-train-eval
        self.output = self.output or f"runs/{what}"
        self.name = self.name or self.kind
        self.artifact_key = self.artifact_key or f"{what}-train-eval"
        return self

    @field_validator("positive", "negative", mode="before")
    @classmethod
    def _paths(cls, v):
        v = [v] if isinstance(v, (str, dict)) else v
        return [{"path": s} if isinstance(s, str) else s for s in v]


# ---- selecting examples ------------------------------------------------------------------------

def text_key(norm_text: str) -> str:
    return hashlib.sha1(norm_text.encode()).hexdigest()


def select_examples(pos: list[tuple[str, str]], neg: list[tuple[str, str]], cfg: ClassifierTrainConfig) -> dict:
    """Dedupe, drop cross-class texts, balance (per language) and split train/validation, seeded;
    examples are (label, text, lang), the labels the config's."""
    norm = cfg.normalization
    pos_label, neg_label = cfg.positive_label, cfg.negative_label
    classes: dict[str, dict[str, list[tuple[str, str]]]] = {}
    seen: dict[str, dict[str, str]] = {pos_label: {}, neg_label: {}}
    stats = {"read": {pos_label: len(pos), neg_label: len(neg)}, "duplicates": 0, "in_both_classes": 0,
             "empty": 0, "other_language": 0}
    for label, docs in ((pos_label, pos), (neg_label, neg)):
        for text, lang in docs:
            if cfg.languages and lang not in cfg.languages:
                stats["other_language"] += 1
                continue
            line = normalize_text(text, norm)
            if not line:
                stats["empty"] += 1
                continue
            key = text_key(line)
            if key in seen[label]:
                stats["duplicates"] += 1
                continue
            seen[label][key] = lang
            classes.setdefault(label, {}).setdefault(key, (text, lang))
    both = set(seen[pos_label]) & set(seen[neg_label])
    stats["in_both_classes"] = len(both)
    groups: dict[str, dict[str, list[tuple[str, str, str]]]] = {}
    for label in (pos_label, neg_label):
        for key, (text, lang) in classes.get(label, {}).items():
            if key in both:
                continue
            group = lang if cfg.per_language else "all"
            groups.setdefault(group, {pos_label: [], neg_label: []})[label].append((key, text, lang))
    rng = random.Random(cfg.seed)
    train: list[tuple[str, str, str]] = []
    valid: list[tuple[str, str, str]] = []
    per_group: dict[str, dict] = {}
    skipped: dict[str, dict] = {}
    for group in sorted(groups):
        p, n = groups[group][pos_label], groups[group][neg_label]
        size = min(len(p), len(n), cfg.max_per_class or 1 << 62)
        if size < cfg.min_per_class:
            skipped[group] = {pos_label: len(p), neg_label: len(n)}
            continue
        n_valid = max(1, round(size * cfg.validation_fraction))
        per_group[group] = {"per_class": size, "train_per_class": size - n_valid, "valid_per_class": n_valid,
                            "available": {pos_label: len(p), neg_label: len(n)}}
        for label, docs in ((pos_label, p), (neg_label, n)):
            picked = rng.sample(docs, size)     # a seeded sample of the larger class
            valid += [(label, text, lang) for _, text, lang in picked[:n_valid]]
            train += [(label, text, lang) for _, text, lang in picked[n_valid:]]
    if not per_group:
        raise SourceError(f"no language has at least {cfg.min_per_class} examples of both classes "
                          f"(found: {skipped}); add sources or lower min_per_class")
    rng.shuffle(train)   # fastText reads examples in file order
    stats["groups"] = per_group
    stats["skipped_groups"] = skipped
    stats["train"] = len(train)
    stats["valid"] = len(valid)
    return {"train": train, "valid": valid, "stats": stats}


# ---- evaluation -------------------------------------------------------------------------------

def roc_auc(labels: list[int], scores: list[float]) -> float | None:
    """Area under the ROC curve (Mann-Whitney U, ties counted half); None with a single class."""
    import numpy as np
    y = np.asarray(labels, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=np.float64)
    sorted_s = s[order]
    i = 0
    while i < len(s):   # average ranks over ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def binary_metrics(labels: list[int], scores: list[float], threshold: float) -> dict:
    tp = sum(1 for y, s in zip(labels, scores) if y and s >= threshold)
    fp = sum(1 for y, s in zip(labels, scores) if not y and s >= threshold)
    fn = sum(1 for y, s in zip(labels, scores) if y and s < threshold)
    tn = len(labels) - tp - fp - fn
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    auc = roc_auc(labels, scores)
    return {"n": len(labels), "positives": sum(labels), "threshold": threshold,
            "precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
            "accuracy": round((tp + tn) / len(labels), 4) if labels else 0.0,
            "roc_auc": round(auc, 4) if auc is not None else None,
            "confusion": {"tp": tp, "fp": fp, "fn": fn, "tn": tn}}


def histogram(scores: list[float], bins: int = HIST_BINS) -> list[int]:
    counts = [0] * bins
    for s in scores:
        counts[min(bins - 1, int(s * bins))] += 1
    return counts


def evaluate(model_path: str, valid: list[dict], threshold: float) -> dict:
    """Score the held-out split with the stage's own scoring code; metrics overall and per language."""
    model = load_classifier(model_path)
    positive, negative = model.positive_label, model.negative_label
    scores = model.score([v["text"] for v in valid])
    labels = [int(v["label"] == positive) for v in valid]
    langs = [v["lang"] for v in valid]
    out = binary_metrics(labels, scores, threshold)
    out["per_language"] = {}
    for lang in sorted(set(langs)):
        idx = [i for i, x in enumerate(langs) if x == lang]
        out["per_language"][lang] = binary_metrics([labels[i] for i in idx], [scores[i] for i in idx], threshold)
    out["histogram"] = {"bins": [round(i / HIST_BINS, 2) for i in range(HIST_BINS + 1)],
                        positive: histogram([s for s, y in zip(scores, labels) if y]),
                        negative: histogram([s for s, y in zip(scores, labels) if not y])}
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    ex = lambda i: {"score": round(scores[i], 4), "label": valid[i]["label"], "lang": langs[i],
                    "snippet": snippet(valid[i]["text"], 160)}
    out["highest"] = [ex(i) for i in order[:5]]
    out["lowest"] = [ex(i) for i in order[-5:][::-1]]
    return out


def eval_markdown(ev: dict, model_path: str, stats: dict, kind: str = QUALITY_KIND) -> str:
    positive, negative = [k for k in ev["histogram"] if k != "bins"]
    lines = [f"# Classifier `{model_path}` ({kind})", "",
             f"validation: **{ev['n']}** documents · ROC AUC **{ev['roc_auc']}** · at threshold {ev['threshold']}: "
             f"precision {ev['precision']} · recall {ev['recall']} · F1 {ev['f1']}", "",
             "| language | docs | ROC AUC | precision | recall | F1 |", "|---|---:|---:|---:|---:|---:|"]
    for lang, m in ev["per_language"].items():
        lines.append(f"| {lang} | {m['n']} | {m['roc_auc']} | {m['precision']} | {m['recall']} | {m['f1']} |")
    lines += ["", "## Score histogram (validation)", "", f"| score | {positive} | {negative} |", "|---|---:|---:|"]
    h = ev["histogram"]
    for i in range(HIST_BINS):
        lines.append(f"| {h['bins'][i]:.2f}–{h['bins'][i + 1]:.2f} | {h[positive][i]} | {h[negative][i]} |")
    lines += ["", f"training examples: {stats['train']} · groups: " +
              ", ".join(f"{g}: {v['per_class']}/class" for g, v in stats["groups"].items())]
    return "\n".join(lines)


# ---- flow steps -------------------------------------------------------------------------------

def model_meta(cfg: ClassifierTrainConfig, data: dict) -> dict:
    """The model's sidecar (`model.json`): kind, labels and normalisation the loader reads, and
    what it was trained on. Written before training: the evaluation loads the model through it."""
    return {"kind": cfg.kind, "positive_label": cfg.positive_label, "negative_label": cfg.negative_label,
            "normalization": cfg.normalization.model_dump(), "fasttext": cfg.fasttext.model_dump(),
            "seed": cfg.seed, "training_data_fingerprint": data["fingerprint"], "data": data["stats"],
            "sources": {"positive": [x.describe() for x in cfg.positive],
                        "negative": [x.describe() for x in cfg.negative]}}


def prepare_data(cfg: ClassifierTrainConfig, out_dir: str) -> dict:
    """Read the sources and write `train.txt` (fastText lines) and `valid.jsonl`; returns paths and counts."""
    counts: dict = {}
    pos = [(d["text"], d["lang"]) for s in cfg.positive for d in read_source(s, counts)]
    neg = [(d["text"], d["lang"]) for s in cfg.negative for d in read_source(s, counts)]
    sel = select_examples(pos, neg, cfg)
    sel["stats"]["unreadable"] = counts.get("unreadable", 0)
    out = Path(out_dir)
    train_bytes = "".join(f"__label__{label} {normalize_text(text, cfg.normalization)}\n"
                          for label, text, _ in sel["train"]).encode()
    valid_bytes = "".join(json.dumps({"label": label, "lang": lang, "text": text}, ensure_ascii=False) + "\n"
                          for label, text, lang in sel["valid"]).encode()
    write_bytes_atomic(out / "train.txt", train_bytes)
    write_bytes_atomic(out / "valid.jsonl", valid_bytes)
    fingerprint = hashlib.sha256(hashlib.sha256(train_bytes).digest() + hashlib.sha256(valid_bytes).digest()).hexdigest()
    return {"train": str(out / "train.txt"), "valid": str(out / "valid.jsonl"), "fingerprint": fingerprint,
            "stats": sel["stats"]}


class TrainingError(UserError, RuntimeError):
    """fastText training failed (diverged); the message says what to change."""


@contextlib.contextmanager
def zero_filled_allocations():
    """Make glibc hand out zero-filled memory while fastText trains.

    fastText 0.9.x initialises its input matrix in 10 blocks, one per thread, and only `thread` of
    them: with thread < 10 the other rows keep whatever the allocator returns. Fresh pages are zero,
    but memory reused from earlier allocations in the same process is not, which made training
    non-deterministic and sometimes diverge ("Encountered NaN"). M_PERTURB=255 fills every new
    allocation with 0x00 (255 ^ 0xff), so those rows start at zero, as they do in a fresh process.
    """
    libc = None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(M_PERTURB, 255) == 1
    except (OSError, AttributeError):
        ok = False
    if not ok:
        warnings.warn("cannot zero-fill allocations (not glibc): fastText training may not be reproducible")
    try:
        yield ok
    finally:
        if ok:
            libc.mallopt(M_PERTURB, 0)


def train_model(train_path: str, params: FastTextParams, seed: int, model_path: str) -> str:
    """fastText supervised training; the model is written atomically to `model_path`."""
    import fasttext
    with zero_filled_allocations():
        try:
            model = fasttext.train_supervised(input=train_path, seed=seed, verbose=0, **params.model_dump())
        except RuntimeError as e:
            if "NaN" in str(e):
                raise TrainingError(f"fastText training diverged (NaN) with lr={params.lr}: lower fasttext.lr") from None
            raise
    with atomic_path(model_path) as tmp:
        model.save_model(str(tmp))
    return model_path


def evaluate_file(model_path: str, valid_path: str, threshold: float) -> dict:
    """`evaluate` on a validation file written by `prepare_data`."""
    # split on "\n" only: str.splitlines also splits at U+2028 inside JSON strings
    valid = [json.loads(line) for line in Path(valid_path).read_text().split("\n") if line]
    return evaluate(model_path, valid, threshold)
