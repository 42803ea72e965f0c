"""Held-out evaluation during training: loss and perplexity on held-out rows, bits per byte and loss
per source and per language on every source's held-out documents, and task files scored by
log-likelihood. Usable alone on any model with `loss_sum` (an FSDP2 one included: every rank scores
the same documents, since a sharded forward needs them all).
"""
from __future__ import annotations

import math

import torch

from quipu.trainer.build import autocast
from quipu.trainer.data import eval_rows
from quipu.trainer.tokenizer import TextTokenizer
from quipu.trainer.train_config import TrainConfig, TrainConfigError


def heldout_documents(sources: list, tokenizer: TextTokenizer) -> list:
    """Every source's held-out documents as text (decoded from their tokens), with source and language."""
    from quipu.trainer.bpb import HeldoutDoc
    docs = []
    for s in sources:
        langs = s.eval_lang or ["und"] * len(s.eval_docs)
        for i, lang in zip(s.eval_docs, langs):
            docs.append(HeldoutDoc(s.name, lang, f"{s.name}:{int(i)}", tokenizer.decode(s.train.doc(int(i)).tolist())))
    return docs


class Evaluator:
    """`row()`: the metrics of one evaluation. `model` is what the loop calls (its train/eval mode is
    switched), `raw_model` the Llama under it (what is scored)."""

    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, raw_model: torch.nn.Module,
                 tokenizer: TextTokenizer, sources: list, device: torch.device, amp: torch.dtype | None):
        from quipu.trainer.bpb import load_task_items
        self.cfg, self.model, self.raw_model, self.tokenizer = cfg, model, raw_model, tokenizer
        self.device, self.amp = device, amp
        self.batch = tuple(torch.from_numpy(a) for a in eval_rows(sources, cfg.data.seq_len, cfg.eval.rows))
        self.heldout = heldout_documents(sources, tokenizer) if cfg.eval.per_source else []
        self.tasks = {}
        for i, t in enumerate(cfg.eval.tasks):
            try:
                self.tasks[t.label()] = load_task_items(t)
            except (ValueError, FileNotFoundError) as e:
                reason = str(e).removeprefix("eval.tasks: ")
                raise TrainConfigError(f"eval.tasks[{i}]", f"a task file of prompts, choices and answers ({reason})") from None

    def row(self) -> dict:
        eval_loss = self.loss()
        row = {"eval_loss": eval_loss, "eval_ppl": math.exp(min(eval_loss, 50))}
        if self.heldout:
            g = self.by_source()
            row |= {"eval_bpb": g["all"]["bpb"], "eval_by_source": g["by_source"], "eval_by_lang": g["by_lang"]}
        if self.tasks:
            row["eval_tasks"] = self.task_scores()
        return row

    @torch.no_grad()
    def loss(self) -> float:
        """Mean loss per target token over the held-out rows."""
        self.model.eval()
        x, y, pos, seg = (t.to(self.device) for t in self.batch)
        total, count = 0.0, 0
        mb = self.cfg.train.micro_batch
        for i in range(0, len(x), mb):
            with autocast(self.device, self.amp):
                s, n = self.raw_model.loss_sum(x[i:i + mb], y[i:i + mb], pos[i:i + mb], seg[i:i + mb])
            total += float(s)
            count += int(n)
        self.model.train()
        return total / max(1, count)

    @torch.no_grad()
    def by_source(self) -> dict:
        """Held-out bits per byte and loss per source and per language."""
        from quipu.trainer.bpb import group_losses, score_model
        self.raw_model.eval()
        with autocast(self.device, self.amp):
            scores = score_model(self.raw_model, self.tokenizer, self.heldout, self.cfg.data.seq_len,
                                 batch=self.cfg.train.micro_batch)
        self.raw_model.train()
        return group_losses(scores)

    @torch.no_grad()
    def task_scores(self) -> dict:
        from quipu.trainer.bpb import score_task
        self.raw_model.eval()
        with autocast(self.device, self.amp):
            out = {name: score_task(items, self.tokenizer, lambda x: self.raw_model(x.to(self.device)),
                                    self.cfg.data.seq_len) for name, items in self.tasks.items()}
        self.raw_model.train()
        return out
