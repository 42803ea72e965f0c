"""Bits per byte (BPB) on held-out text: a model's compression of text it never trained on, in a unit
that does not depend on its tokenizer (bits over UTF-8 bytes, not nats over tokens).

Each document is BOS + its tokens; it is cut into windows of `seq_len` inputs (positions restart at
0 in each window, as in training, where a row may start inside a document) and every text token is
scored given the tokens before it in its window (EOS is not scored: it is not text). Per document
we keep bytes, tokens and the summed negative log-likelihood, so any grouping (per language, per
source, all) is Σ nll / ln 2 / Σ bytes.

`score_checkpoint` scores with our model from a training checkpoint; `score_hf` does the same
with transformers' `AutoModelForCausalLM` and `AutoTokenizer` from an exported folder, an
independent path through the weights and the tokenizer: the two must agree.
"""
from __future__ import annotations

import json
import math
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator

from quipu.trainer.text_source import TextSource, read_source


class HeldoutConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sources: list[TextSource] = Field(min_length=1, description="held-out text: whole sources the curation never saw")
    max_docs_per_source: int = Field(200, gt=0)
    max_bytes_per_source: int = Field(150_000, gt=0, description="documents are taken in a fixed order (by id hash) until this many bytes")


@dataclass
class HeldoutDoc:
    source: str
    lang: str
    id: str
    text: str


def load_heldout(cfg: HeldoutConfig) -> list[HeldoutDoc]:
    """A fixed sample of every held-out source (quipu.trainer.text_source; a dataset is a curated
    one): documents with text, ordered by a hash of their id, taken until the per-source document
    or byte cap."""
    out: list[HeldoutDoc] = []
    for src in cfg.sources:
        recs = [d for d in read_source(src, dataset_kind="curated") if d["text"].strip()]
        if not recs:
            raise ValueError(f"held-out source {src.label()!r} has no documents{' matching ' + str(src.where) if src.where else ''}")
        recs.sort(key=lambda r: (zlib.crc32(r["id"].encode()), r["id"]))
        size = 0
        for r in recs[:cfg.max_docs_per_source]:
            out.append(HeldoutDoc(src.label(), r["lang"], r["id"], r["text"]))
            size += len(r["text"].encode("utf-8"))
            if size >= cfg.max_bytes_per_source:
                break
    return out


# ---- scoring -----------------------------------------------------------------------------------

@dataclass
class DocScore:
    source: str
    lang: str
    id: str
    bytes: int
    tokens: int
    nll: float          # nats, summed over the document's text tokens


def windows(ids: list[int], seq_len: int) -> list[tuple[list[int], list[int]]]:
    """(inputs, targets) windows covering every token after the first."""
    return [(ids[s:s + seq_len], ids[s + 1:s + seq_len + 1]) for s in range(0, len(ids) - 1, seq_len)]


@torch.no_grad()
def score_documents(docs: list[HeldoutDoc], encode: Callable[[str], list[int]], logits_fn: Callable[[torch.Tensor], torch.Tensor],
                    seq_len: int, eos_id: int | None = None, batch: int = 16) -> list[DocScore]:
    """Summed NLL of every document's text tokens. Windows are right-padded to `seq_len` (padding
    is never a target, and causal attention keeps it from reaching earlier positions)."""
    items = []          # (doc index, inputs, targets)
    ntok = []
    for i, d in enumerate(docs):
        ids = encode(d.text)
        if eos_id is not None and ids and ids[-1] == eos_id:
            ids = ids[:-1]
        ntok.append(len(ids) - 1)
        items += [(i, x, y) for x, y in windows(ids, seq_len)]
    nll = [0.0] * len(docs)
    for b in range(0, len(items), batch):
        chunk = items[b:b + batch]
        T = max(len(x) for _, x, _ in chunk)
        x = torch.zeros(len(chunk), T, dtype=torch.long)
        y = torch.full((len(chunk), T), -100, dtype=torch.long)
        for r, (_, xi, yi) in enumerate(chunk):
            x[r, :len(xi)] = torch.tensor(xi)
            y[r, :len(yi)] = torch.tensor(yi)
        logits = logits_fn(x).float()
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), ignore_index=-100,
                               reduction="none").view(len(chunk), T).double().sum(1)
        for r, (i, _, _) in enumerate(chunk):
            nll[i] += float(loss[r])
    return [DocScore(d.source, d.lang, d.id, len(d.text.encode("utf-8")), n, v) for d, n, v in zip(docs, ntok, nll)]


def score_checkpoint(checkpoint: str | Path, tokenizer_dir: str | Path, docs: list[HeldoutDoc], seq_len: int) -> list[DocScore]:
    """Our model, from a training checkpoint, with the run's tokenizer."""
    from quipu.trainer.checkpoint import load_checkpoint
    from quipu.trainer.llama import Llama, ModelConfig
    from quipu.trainer.tokenizer import TextTokenizer
    checkpoint = Path(checkpoint)
    if checkpoint.is_dir():   # sharded (DCP): its shards joined into one process's model
        from quipu.trainer.checkpoint import load_sharded
        model = Llama(ModelConfig.model_validate(load_checkpoint(checkpoint / "trainer.pt")["model_config"]))
        load_sharded(checkpoint, model, None)
    else:
        ck = load_checkpoint(checkpoint)
        model = Llama(ModelConfig.model_validate(ck["model_config"]))
        model.load_state_dict(ck["model"])
    model.eval()
    return score_model(model, TextTokenizer.load(tokenizer_dir), docs, seq_len)


def score_model(model, tok, docs: list[HeldoutDoc], seq_len: int, batch: int = 16) -> list[DocScore]:
    """Our model (any wrapper whose forward gives logits) with a run's tokenizer: documents as
    training saw them, BOS first. The training loop's evaluation and `quipu ablate` both score here."""
    return score_documents(docs, lambda t: tok.encode(t, bos=True), lambda x: model(x), seq_len, batch=batch)


def score_hf(hf_dir: str | Path, docs: list[HeldoutDoc], seq_len: int) -> list[DocScore]:
    """transformers' own model and tokenizer, loaded from an exported folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    model.eval()
    bos = tok.bos_token_id

    def encode(text: str) -> list[int]:
        return [bos, *tok(text, add_special_tokens=False)["input_ids"]]
    return score_documents(docs, encode, lambda x: model(input_ids=x).logits, seq_len)


def bits_per_byte(scores: list[DocScore]) -> float:
    b = sum(s.bytes for s in scores)
    return sum(s.nll for s in scores) / math.log(2) / b if b else float("nan")


def summarize(scores: list[DocScore]) -> dict:
    """BPB per language, per source and over everything, with the bytes and tokens behind each."""
    def group(key) -> dict:
        out: dict[str, list[DocScore]] = {}
        for s in scores:
            out.setdefault(key(s), []).append(s)
        return {k: {"bpb": bits_per_byte(v), "docs": len(v), "bytes": sum(s.bytes for s in v),
                    "tokens": sum(s.tokens for s in v)} for k, v in sorted(out.items())}
    return {"all": group(lambda s: "all")["all"], "by_lang": group(lambda s: s.lang),
            "by_source": group(lambda s: s.source)}


def group_losses(scores: list[DocScore]) -> dict:
    """The training loop's compact view: BPB and loss (nats per token) overall, per source, per language."""
    def one(v: list[DocScore]) -> dict:
        return {"bpb": round(bits_per_byte(v), 6), "loss": round(sum(s.nll for s in v) / max(1, sum(s.tokens for s in v)), 6)}
    by: dict[str, dict[str, list[DocScore]]] = {"source": {}, "lang": {}}
    for s in scores:
        by["source"].setdefault(s.source, []).append(s)
        by["lang"].setdefault(s.lang, []).append(s)
    return {"all": one(scores), "by_source": {k: one(v) for k, v in sorted(by["source"].items())},
            "by_lang": {k: one(v) for k, v in sorted(by["lang"].items())}}


def scores_to_rows(scores: list[DocScore]) -> list[dict]:
    return [asdict(s) for s in scores]


# ---- task files: choices scored by log-likelihood -----------------------------------------------

class TaskFile(BaseModel):
    """A task scored by log-likelihood during training: a JSONL file of `prompt`, `choices`, `answer`
    (index or the choice's text), `lang`; or a benchmark of the registry (configs/benchmarks:
    `humaneval`, `gsm8k`, or a YAML path), whose first field is the prompt and second the reference
    answer, scored as its only choice (answer bits per byte; accuracy is then meaningless)."""
    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(None, description="JSONL: prompt, choices, answer, lang")
    benchmark: str | None = Field(None, description="...or a benchmark registry name or YAML (prompt field, answer field)")
    name: str | None = None
    max_items: int = Field(100, gt=0, description="the first N items (file order)")
    lang: str | None = Field(None, description="language of every item (default: each item's `lang`)")

    @model_validator(mode="after")
    def _one(self):
        if (self.path is None) == (self.benchmark is None):
            raise ValueError("give exactly one of path or benchmark")
        return self

    def label(self) -> str:
        return self.name or (Path(self.path).name.split(".")[0] if self.path else Path(str(self.benchmark)).stem)


@dataclass
class TaskItem:
    prompt: str
    choices: list[str]
    answer: int
    lang: str


def load_task_items(task: TaskFile) -> list[TaskItem]:
    """The task's first `max_items` items; a malformed line names the file, line and field."""
    items: list[TaskItem] = []
    if task.benchmark is not None:
        from quipu.tasks.benchmarks import load_benchmarks
        (bench,) = load_benchmarks([task.benchmark])
        if len(bench.spec.fields) < 2:
            raise ValueError(f"eval.tasks: benchmark {bench.name!r} has no answer field (fields: {bench.spec.fields})")
        for it in bench.items[:task.max_items]:
            if len(it.texts) >= 2:
                items.append(TaskItem(it.texts[0], [it.texts[1]], 0, task.lang or "und"))
        return items
    p = Path(task.path)
    if not p.is_file():
        raise FileNotFoundError(f"eval.tasks: task file not found: {task.path}")
    with open(p, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if len(items) >= task.max_items:
                break
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                choices = [str(c) for c in r["choices"]]
                answer = r["answer"] if isinstance(r["answer"], int) else choices.index(str(r["answer"]))
                if not choices or not 0 <= answer < len(choices):
                    raise ValueError("answer is not one of the choices")
                items.append(TaskItem(str(r["prompt"]), choices, answer, task.lang or str(r.get("lang") or "und")))
            except (KeyError, ValueError, TypeError, json.JSONDecodeError) as e:
                raise ValueError(f"eval.tasks: {task.path} line {n}: expected prompt, choices, answer "
                                 f"(index or one of the choices): {e}") from None
    return items


@torch.no_grad()
def continuation_logprob(ctx: list[int], cont: list[int], logits_fn, seq_len: int) -> float:
    """Σ log p(continuation tokens | context), the context cut from the left to fit `seq_len`."""
    full = (ctx + cont)[-(seq_len + 1):]
    n = min(len(cont), len(full) - 1)
    x = torch.tensor([full[:-1]])
    logp = F.log_softmax(logits_fn(x).float()[0, -n:], -1)
    return float(logp.gather(1, torch.tensor(full[-n:]).unsqueeze(1)).sum())


def score_task(items: list[TaskItem], tok, logits_fn, seq_len: int) -> dict:
    """Accuracy (the choice with the highest log-likelihood per byte is the answer) and the answer's
    bits per byte, overall and per language."""
    rows = []
    for it in items:
        ctx = tok.encode(it.prompt, bos=True)
        lls = [continuation_logprob(ctx, tok.encode(c, bos=False) or [tok.eos_id], logits_fn, seq_len) for c in it.choices]
        nbytes = [max(1, len(c.encode("utf-8"))) for c in it.choices]
        pick = max(range(len(lls)), key=lambda k: lls[k] / nbytes[k])
        rows.append((it.lang, pick == it.answer, -lls[it.answer], nbytes[it.answer]))

    def agg(rs) -> dict:
        return {"items": len(rs), "accuracy": round(sum(r[1] for r in rs) / len(rs), 6),
                "answer_bpb": round(sum(r[2] for r in rs) / math.log(2) / sum(r[3] for r in rs), 6)}
    out = agg(rows) if rows else {"items": 0}
    out["by_lang"] = {lang: agg([r for r in rows if r[0] == lang]) for lang in sorted({r[0] for r in rows})}
    return out
