"""Distilling a teacher LLM's perplexity into a Wayra student (quipu.scoring.wayra): settings, the
training data, the model with its parameter groups, the two training passes and the loop.

`distill(texts, labels, arch, settings)` returns the best-on-validation student and its metrics.
Training is seeded: the same texts, labels and settings give the same student (on one thread).
"""
from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from quipu.scoring.wayra import (BOS, PAD, Device, StudentError, WayraArch, WayraModel, WayraStudent, encode,
                                 length_batches,
                                 load_teacher_layers, pad_batch, pca_embeddings, resolve_device, teacher_tokenizer,
                                 train_tokenizer)


class DistillSettings(BaseModel):
    """How the student is trained (`train:` in the ppl config)."""
    model_config = ConfigDict(extra="forbid")
    epochs: int = Field(30, ge=1, le=1000)
    batch_size: int = Field(16, ge=1, le=1024)
    lr: float = Field(2e-3, gt=0, le=1)
    weight_decay: float = Field(0.01, ge=0)
    lm_weight: float = Field(0.3, ge=0, description="weight of the auxiliary next-token loss, relative to the regression loss")
    pretrain_epochs: int = Field(1, ge=0, le=100, description="LM-only passes over all (also unlabelled) text before distillation")
    val_fraction: float = Field(0.1, gt=0, lt=0.5)
    patience: int = Field(4, ge=1, description="early stopping: epochs without a better validation Spearman")
    max_seconds: float | None = Field(None, gt=0, le=365 * 86400, description="training time budget (checked between epochs)")
    seed: int = 0
    threads: int | None = Field(None, ge=1, le=256)
    freeze_embeddings: bool = Field(False, description="keep the (teacher-initialised) token embeddings fixed (few labels: less overfitting)")
    doc_weight: float = Field(1.0, ge=0, description="student.head: token — weight of the document-mean loss next to the per-token loss")
    body_lr: float | None = Field(None, gt=0, le=1, description="student.body: teacher — peak learning rate of the "
                                                                "teacher's layers (None: lr, which the head gets)")
    freeze_body: bool = Field(False, description="student.body: teacher — keep the teacher's layers as they are: their "
                                                 "states are computed once (memory: documents x max_len x hidden "
                                                 "in bf16) and only the head trains; deep bodies train in minutes")
    device: Device = Field("auto", description="auto: CUDA when a GPU is visible (bf16 autocast), else the CPU")


# ---- metrics ----------------------------------------------------------------------------------

def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    from scipy.stats import spearmanr  # scipy comes with the stack (datatrove/sklearn); exact tie handling
    if len(a) < 3:
        return float("nan")
    return float(spearmanr(np.asarray(a), np.asarray(b)).statistic)


def pearson(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) < 3:
        return float("nan")
    return float(np.corrcoef(np.asarray(a, dtype=float), np.asarray(b, dtype=float))[0, 1])


# ---- data ---------------------------------------------------------------------------------------

def checked_arch(arch: WayraArch, settings: DistillSettings, teacher_model, token_labels, n_texts: int):
    """The architecture completed from the teacher (its HF config for `body: teacher`), and the
    per-token labels (empty ones for `head: document`); raises StudentError for what cannot work."""
    if settings.freeze_body and arch.body != "teacher":
        raise StudentError("train.freeze_body needs student.body: teacher (an own body has nothing to keep)")
    if arch.body == "teacher":
        if teacher_model is None:
            raise StudentError("student.body: teacher needs the teacher model")
        if settings.lm_weight > 0:
            raise StudentError("student.body: teacher has no next-token output: set train.lm_weight: 0")
        tcfg = teacher_model.model.config
        if arch.teacher_layers > tcfg.num_hidden_layers:
            raise StudentError(f"student.teacher_layers {arch.teacher_layers}: the teacher has only "
                               f"{tcfg.num_hidden_layers} layers")
        arch = arch.model_copy(update={"teacher_config": json.loads(tcfg.to_json_string(use_diff=False))})
    if arch.head != "token":
        return arch, [()] * n_texts
    if token_labels is None or len(token_labels) != n_texts:
        raise StudentError("student.head: token needs the teacher's per-token NLLs for every labelled document")
    if teacher_model is not None and arch.max_len != teacher_model.settings.max_tokens + 1:
        raise StudentError(f"student.max_len {arch.max_len}: with head: token it must be the teacher's "
                           f"max_tokens + 1 = {teacher_model.settings.max_tokens + 1} (the student reads what the teacher scored)")
    return arch, token_labels


def _align_token_targets(seqs: list[list[int]], token_targets: list[Sequence[float]]
                         ) -> tuple[list[list[int]], list[Sequence[float]]]:
    """Cut each student sequence and its teacher token NLLs to a common length: target i belongs to
    the token at position i + 1 (after BOS). They differ only where the student's character-prefix
    encoding ends a piece early; a document without targets keeps BOS + its first token."""
    out_seqs, out_targets = [], []
    for seq, tgt in zip(seqs, token_targets):
        n = max(1, min(len(seq) - 1, len(tgt)))
        out_seqs.append(seq[:n + 1])
        out_targets.append(list(tgt[:n]) or [0.0])
    return out_seqs, out_targets


def pad_token_targets(targets: list[torch.Tensor], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch x width) targets at positions 1..n (position 0 is BOS), and their mask."""
    z = torch.zeros((len(targets), width))
    m = torch.zeros((len(targets), width))
    for r, t in enumerate(targets):
        z[r, 1:1 + len(t)] = t
        m[r, 1:1 + len(t)] = 1
    return z, m


@dataclass
class DistillData:
    """Encoded documents, standardised targets and the train/validation split."""
    arch: WayraArch
    tokenizer: object
    bos_id: int | None
    pad_id: int | None
    init: torch.Tensor | None        # teacher embeddings to start from (tokenizer: teacher)
    seqs: list[list[int]]
    train_idx: list[int]
    val_idx: list[int]
    val_texts: list[str]
    val_y: list[float]
    target: torch.Tensor             # standardised document targets
    token_z: list[torch.Tensor] | None
    doc_var: float
    mean: float
    std: float
    lm_seqs: list[list[int]]         # labelled + unlabelled text for the next-token loss
    lm_items: list[int]


def prepare_data(pairs: list[tuple], arch: WayraArch, settings: DistillSettings, unlabelled: Sequence[str],
                 teacher_model, rng: random.Random, assisted: Sequence[tuple] = ()) -> DistillData:
    """`assisted`: (text, log-ppl, per-token NLLs) an assistant student predicted; training only, never
    validation (validation compares with the teacher itself)."""
    order = list(range(len(pairs)))
    rng.shuffle(order)
    n_val = max(3, int(len(pairs) * settings.val_fraction))
    val_idx, train_idx = sorted(order[:n_val]), sorted(order[n_val:])
    if assisted:
        train_idx += list(range(len(pairs), len(pairs) + len(assisted)))
        pairs = list(pairs) + list(assisted)
    init = None
    if arch.tokenizer == "teacher":
        if teacher_model is None:
            raise StudentError("student.tokenizer: teacher needs the teacher model")
        tokenizer, bos_id, pad_id = teacher_tokenizer(teacher_model.tokenizer)
        init = teacher_model.model.get_input_embeddings().weight
    else:
        tokenizer = train_tokenizer([pairs[i][0] for i in train_idx] + list(unlabelled), arch.vocab_size)
        bos_id, pad_id = tokenizer.token_to_id(BOS), tokenizer.token_to_id(PAD)
    arch = arch.model_copy(update={"vocab_size": max(tokenizer.get_vocab_size(), init.shape[0] if init is not None else 0)})
    seqs = encode(tokenizer, [p[0] for p in pairs], arch.max_len, bos_id)
    y = np.array([p[1] for p in pairs], dtype=np.float64)
    token_z, doc_var = None, 1.0
    if arch.head == "token":
        # standardise by the token NLL distribution: the document value is a mean of token values,
        # so one affine scale serves both (prediction * std + mean is nats either way)
        seqs, token_targets = _align_token_targets(seqs, [p[2] for p in pairs])
        flat = np.concatenate([np.asarray(token_targets[i], dtype=np.float64) for i in train_idx])
        mean, std = float(flat.mean()), float(flat.std() or 1.0)
        token_z = [torch.tensor((np.asarray(t, dtype=np.float64) - mean) / std, dtype=torch.float32) for t in token_targets]
        target = torch.stack([z.mean() for z in token_z])
        doc_var = float(target[train_idx].var().clamp(min=1e-6))
    else:
        mean, std = float(y[train_idx].mean()), float(y[train_idx].std() or 1.0)
        target = torch.tensor((y - mean) / std, dtype=torch.float32)
    lm_seqs = seqs + encode(tokenizer, list(unlabelled), arch.max_len, bos_id) if unlabelled else seqs
    return DistillData(arch, tokenizer, bos_id, pad_id, init, seqs, train_idx, val_idx,
                       [pairs[i][0] for i in val_idx], [pairs[i][1] for i in val_idx], target, token_z, doc_var,
                       mean, std, lm_seqs, train_idx + list(range(len(seqs), len(lm_seqs))))


# ---- model --------------------------------------------------------------------------------------

def build_student(d: DistillData, settings: DistillSettings, teacher_model) -> tuple[WayraStudent, list[dict]]:
    """The student and its optimiser parameter groups (teacher layers may get their own rate)."""
    model = WayraModel(d.arch)
    if d.arch.body == "teacher":
        load_teacher_layers(model.body, teacher_model.model, d.arch.teacher_layers)
        # frozen: most of the student's parameters, rows of tokens the labelled text never shows would
        # not move anyway, and their Adam state would cost twice their size
        model.body.get_input_embeddings().weight.requires_grad_(False)
        if settings.freeze_body:
            model.body.requires_grad_(False)
        groups = [{"params": list(model.head.parameters()), "lr": settings.lr}]
        if not settings.freeze_body:
            groups.insert(0, {"params": [p for p in model.body.parameters() if p.requires_grad],
                              "lr": settings.body_lr or settings.lr})
    else:
        if d.init is not None:
            with torch.no_grad():
                model.tok.weight.copy_(pca_embeddings(d.init, d.arch.d_model, settings.seed))
        if settings.freeze_embeddings:
            model.tok.weight.requires_grad_(False)
        groups = [{"params": [p for p in model.parameters() if p.requires_grad], "lr": settings.lr}]
    return WayraStudent(model, d.tokenizer, d.mean, d.std, bos_id=d.bos_id, pad_id=d.pad_id), groups


# ---- training -----------------------------------------------------------------------------------

def _batches(items: list[int], size: int, rng: random.Random, lengths: list[int]) -> list[list[int]]:
    """Shuffled batches of similar length (bucket by length within a shuffled pool of 50 batches)."""
    idx = items[:]
    rng.shuffle(idx)
    pool = size * 50
    out = []
    for p in range(0, len(idx), pool):
        chunk = sorted(idx[p:p + pool], key=lambda i: lengths[i])
        out += [chunk[s:s + size] for s in range(0, len(chunk), size)]
    rng.shuffle(out)
    return out


def _step(model, opt, sched, loss: torch.Tensor) -> None:
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()


def lm_epoch(model: WayraModel, opt, sched, d: DistillData, settings: DistillSettings, rng: random.Random) -> float:
    """One next-token-only pass over all text; returns the mean LM loss."""
    model.train()
    tot = cnt = 0.0
    device = next(model.parameters()).device
    for b in _batches(d.lm_items, settings.batch_size, rng, [len(s) for s in d.lm_seqs]):
        ids, mask = pad_batch([d.lm_seqs[i] for i in b], d.pad_id, device)
        with model.precision():
            _, lm_sum, lm_n, _ = model(ids, mask, lm=True)
        _step(model, opt, sched, lm_sum / lm_n.clamp(min=1))
        tot += lm_sum.item(); cnt += lm_n.item()
    return tot / max(cnt, 1)


def body_states(model: WayraModel, d: DistillData, settings: DistillSettings) -> dict[int, torch.Tensor]:
    """`freeze_body`: the frozen body's states of every training document, computed once (bf16)."""
    device = next(model.parameters()).device
    states: dict[int, torch.Tensor] = {}
    model.eval()
    with torch.inference_mode():
        for b in length_batches([len(d.seqs[i]) for i in d.train_idx], settings.batch_size * 4):
            docs = [d.train_idx[k] for k in b]
            ids, mask = pad_batch([d.seqs[i] for i in docs], d.pad_id, device)
            with model.precision():
                h = model.hidden(ids, mask)
            for r, i in enumerate(docs):
                states[i] = h[r, :len(d.seqs[i])].to(torch.bfloat16).clone()
    return states


def regression_epoch(model: WayraModel, opt, sched, d: DistillData, settings: DistillSettings,
                     rng: random.Random, states: dict[int, torch.Tensor] | None = None) -> tuple[float, float]:
    """One pass of the regression loss (per token and per document) plus the auxiliary LM loss;
    returns (mean standardised regression loss, mean LM loss). With `states` (a frozen body's), the
    head reads them instead of running the body."""
    model.train()
    reg_tot = lm_tot = lm_cnt = 0.0
    device = next(model.parameters()).device
    for b in _batches(d.train_idx, settings.batch_size, rng, [len(s) for s in d.seqs]):
        ids, mask = pad_batch([d.seqs[i] for i in b], d.pad_id, device)
        hidden = None
        if states is not None:
            # kept in bf16 (memory); the head reads them in its own dtype
            hidden = torch.zeros((len(b), ids.shape[1], states[b[0]].shape[-1]),
                                 dtype=next(model.head.parameters()).dtype, device=device)
            for r, i in enumerate(b):
                hidden[r, :len(d.seqs[i])] = states[i]
        with model.precision():
            pred, lm_sum, lm_n, per_token = model(ids, mask, lm=settings.lm_weight > 0, hidden=hidden)
        reg = F.mse_loss(pred, d.target[b].to(device))
        if per_token is not None:
            tz, tmask = pad_token_targets([d.token_z[i] for i in b], ids.shape[1])
            tz, tmask = tz.to(device), tmask.to(device)
            token_mse = ((per_token - tz) ** 2 * tmask).sum() / tmask.sum().clamp(min=1)
            reg = token_mse + settings.doc_weight * reg / d.doc_var
        _step(model, opt, sched, reg + settings.lm_weight * (lm_sum / lm_n.clamp(min=1)))
        reg_tot += reg.item() * len(b); lm_tot += lm_sum.item(); lm_cnt += lm_n.item()
    return reg_tot / len(d.train_idx), lm_tot / max(lm_cnt, 1)


def distill(texts: Sequence[str], labels: Sequence[float], arch: WayraArch, settings: DistillSettings,
            unlabelled: Sequence[str] = (), log: Callable[[str], None] = print,
            teacher_model=None, token_labels: Sequence[Sequence[float]] | None = None,
            assisted: Sequence[tuple[str, Sequence[float]]] = ()) -> tuple[WayraStudent, dict]:
    """Train a student on (text, teacher log-ppl); returns the best-on-validation student and metrics.

    `teacher_model` (a loaded trainer.teacher.Teacher) is needed with `arch.tokenizer == "teacher"`;
    `token_labels` (each text's per-token teacher NLLs) with `arch.head == "token"`; `assisted`:
    (text, per-token NLLs predicted by an assistant student) for more training text (`head: token`)."""
    arch, token_labels = checked_arch(arch, settings, teacher_model, token_labels, len(texts))
    pairs = [(t, float(y), tl) for t, y, tl in zip(texts, labels, token_labels)
             if y is not None and not math.isnan(float(y))]
    if len(pairs) < 10:
        raise StudentError(f"distillation needs at least 10 labelled documents, got {len(pairs)}")
    if assisted and arch.head != "token":
        raise StudentError("an assistant's per-token predictions need student.head: token")
    extra = [(t, sum(n) / len(n), n) for t, n in assisted if len(n)]
    device = resolve_device(settings.device)
    torch.manual_seed(settings.seed)
    rng = random.Random(settings.seed)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    t0 = time.perf_counter()
    d = prepare_data(pairs, arch, settings, unlabelled, teacher_model, rng, extra)
    student, groups = build_student(d, settings, teacher_model)
    model = student.model.to(device)
    opt = torch.optim.AdamW(groups, weight_decay=settings.weight_decay)
    pretrain_epochs = settings.pretrain_epochs if settings.lm_weight > 0 else 0
    total = (pretrain_epochs * math.ceil(len(d.lm_items) / settings.batch_size)
             + settings.epochs * math.ceil(len(d.train_idx) / settings.batch_size))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[g["lr"] for g in groups], total_steps=total, pct_start=0.1)
    trainable = sum(p.numel() for g in groups for p in g["params"])
    log(f"student: {student.n_params() / 1e6:.2f}M parameters ({trainable / 1e6:.2f}M trained), vocab {d.arch.vocab_size}, "
        f"{len(d.train_idx)} train ({len(extra)} of them labelled by an assistant) / {len(d.val_idx)} validation "
        f"documents, {len(d.lm_items)} LM documents, on {device}")

    for ep in range(pretrain_epochs):
        log(f"pretrain epoch {ep + 1}: LM loss {lm_epoch(model, opt, sched, d, settings, rng):.3f}")
    best = {"spearman": -2.0, "epoch": 0, "state": None}
    history = []
    states = None
    if settings.freeze_body and d.arch.body == "teacher":
        states = body_states(model, d, settings)
        log(f"frozen body: states of {len(states)} documents computed once ({time.perf_counter() - t0:.0f}s)")
    for ep in range(settings.epochs):
        mse, lm = regression_epoch(model, opt, sched, d, settings, rng, states)
        val_pred = student.predict_log_ppl(d.val_texts)
        rho = spearman(val_pred, d.val_y)
        rmse = float(np.sqrt(np.mean((np.array(val_pred) - np.array(d.val_y)) ** 2)))
        history.append({"epoch": ep + 1, "train_mse": round(mse, 4), "lm_loss": round(lm, 4),
                        "val_spearman": round(rho, 4), "val_rmse": round(rmse, 4)})
        log(f"epoch {ep + 1}: train mse {mse:.4f} (standardised), LM {lm:.3f}, "
            f"validation Spearman {rho:.4f}, RMSE {rmse:.3f} nats")
        if rho > best["spearman"]:
            best = {"spearman": rho, "epoch": ep + 1, "rmse": rmse,
                    "state": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
        elif ep + 1 - best["epoch"] >= settings.patience:
            log(f"early stop: no better validation Spearman for {settings.patience} epochs")
            break
        if settings.max_seconds and time.perf_counter() - t0 > settings.max_seconds:
            log(f"time budget of {settings.max_seconds:.0f}s reached after epoch {ep + 1}")
            break
    model.load_state_dict(best["state"])
    student.for_inference(device)       # as it will be loaded: the metrics below are the saved student's
    val_pred = student.predict_log_ppl(d.val_texts)
    metrics = {"val_spearman": round(spearman(val_pred, d.val_y), 4), "val_pearson": round(pearson(val_pred, d.val_y), 4),
               "val_rmse": round(best["rmse"], 4), "best_epoch": best["epoch"], "epochs_run": len(history),
               "train_docs": len(d.train_idx), "assisted_docs": len(extra), "val_docs": len(d.val_idx),
               "lm_docs": len(d.lm_items), "device": device.type,
               "params": student.n_params(), "trained_params": trainable, "seconds": round(time.perf_counter() - t0, 1),
               "history": history}
    return student, metrics
