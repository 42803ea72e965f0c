"""Any Hugging Face sequence-classification model from a local folder as a document scorer (a judge):
FineWeb-Edu's classifier, FinePDFs' Spanish and Portuguese educational classifiers, or a head quipu
trained itself on frozen SmolLM2 layers from LLM labels (quipu.trainer.label_head).

Loading is checked (one line naming the folder and what is wrong), cached per process, and the
scoring is batched: every text is tokenised once, cut at the model's maximum length, and the texts
go through the model in batches of similar length (little padding), on a GPU when one exists
(`device: auto`; there in bf16). What a document's score is depends on the head:

- `regression` (one output, FineWeb-Edu's style): the logit itself (FineWeb-Edu: 0-5 educational value);
- `expected`: the expected class value, sum_i p_i * v_i, with v_i the class's label read as a number
  (`id2label` "0".."5") or else its index;
- `probability`: the probability of one named label (`label: hq`).

`auto` picks `regression` for one output, `expected` when every label reads as a number, and asks for
`label` otherwise. Scores are rounded to 1e-6: padding changes the floats of a batch in the last bits,
and a document's score must not depend on which documents share its batch.
"""
from __future__ import annotations

import math
import threading
from functools import lru_cache
from pathlib import Path
from typing import Literal, Sequence

from quipu.catalog.errors import UserError

Head = Literal["auto", "regression", "expected", "probability"]
SCORE_DECIMALS = 6
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")


class HfModelError(UserError, ValueError):
    """A classifier folder that cannot be used; the message names it and says why."""


def check_folder(path: str | Path) -> Path:
    """The folder when it holds a sequence-classification model's config and weights and a tokenizer;
    otherwise one line saying what is missing (before any document is read)."""
    p = Path(path).expanduser()
    if not p.is_dir():
        raise HfModelError(f"classifier model {p}: not a folder (give the folder holding config.json, the weights and the tokenizer)")
    if not (p / "config.json").is_file():
        raise HfModelError(f"classifier model {p}: no config.json (not a Hugging Face model folder)")
    if not any((p / f).is_file() for f in WEIGHT_FILES):
        raise HfModelError(f"classifier model {p}: no weights (expected one of {', '.join(WEIGHT_FILES)})")
    if not any((p / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        raise HfModelError(f"classifier model {p}: no tokenizer (tokenizer.json or tokenizer_config.json)")
    return p


def class_values(id2label: dict) -> list[float] | None:
    """Each class's label as a number ("0".."5" -> 0..5), or None when a label is not a number."""
    try:
        values = [float(id2label[i]) for i in range(len(id2label))]
    except (KeyError, TypeError, ValueError):
        return None
    return values if all(math.isfinite(v) for v in values) else None


class HfClassifier:
    """A loaded sequence-classification model; `score(texts)` gives one float per text."""

    def __init__(self, path: str | Path, head: Head = "auto", label: str | None = None, device: str = "auto",
                 batch_size: int = 32, max_length: int | None = None, max_batch_tokens: int = 65536,
                 threads: int | None = None):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from quipu.scoring.model_files import weights_fingerprint
        from quipu.scoring.wayra import StudentError, resolve_device
        self.path = check_folder(path)
        try:
            self.device = resolve_device(device)
        except StudentError as e:
            raise HfModelError(f"classifier {e}") from None
        if threads:
            torch.set_num_threads(threads)
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()   # "Loading weights" bars per model: noise in a run's log
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.path))
            self.model = AutoModelForSequenceClassification.from_pretrained(str(self.path), dtype=torch.float32)
        except Exception as e:   # transformers raises many types: the user needs the folder and the cause
            raise HfModelError(f"classifier model {self.path} does not load: {type(e).__name__}: {str(e)[:300]}") from None
        self.model.eval().to(self.device)
        if self.device.type == "cuda":   # bf16 weights: 2.5x autocast over fp32 ones on an H200 (bench/RESULTS.md)
            self.model.to(torch.bfloat16)
        self._pad_setup()
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_length = self._max_length(max_length)
        self.head, self.label_index, self.values = self._head(head, label)
        self.fingerprint = weights_fingerprint(self.path)

    def _pad_setup(self) -> None:
        """Decoder models (Llama) often lack a pad token: pad with EOS and tell the model which id it is
        (it pools the last non-pad token)."""
        tok, cfg = self.tokenizer, self.model.config
        if tok.pad_token is None:
            if tok.eos_token is None:
                raise HfModelError(f"classifier model {self.path}: its tokenizer has neither a pad nor an EOS token")
            tok.pad_token = tok.eos_token
        if getattr(cfg, "pad_token_id", None) is None:
            cfg.pad_token_id = tok.pad_token_id

    def _max_length(self, cap: int | None) -> int:
        limits = [cap, getattr(self.model.config, "max_position_embeddings", None)]
        if 0 < (self.tokenizer.model_max_length or 0) < 1_000_000:   # unset: a huge sentinel
            limits.append(self.tokenizer.model_max_length)
        found = [x for x in limits if x]
        return min(found) if found else 512

    def _head(self, head: Head, label: str | None) -> tuple[str, int | None, list[float] | None]:
        cfg = self.model.config
        n = cfg.num_labels
        id2label = {int(k): str(v) for k, v in (cfg.id2label or {}).items()}
        values = class_values(id2label) if n > 1 else None
        if head == "auto":
            head = "regression" if n == 1 else "probability" if label else "expected" if values else ""
            if not head:
                raise HfModelError(f"classifier model {self.path}: labels {sorted(id2label.values())} are not numbers; "
                                   "set `label:` to the label whose probability is the score (head: probability)")
        if head == "regression":
            if n != 1:
                raise HfModelError(f"classifier model {self.path}: head regression needs one output, the model has {n}")
            return head, None, None
        if n < 2:
            raise HfModelError(f"classifier model {self.path}: head {head} needs class outputs, the model has one (use head: regression)")
        if head == "expected":
            return head, None, values or [float(i) for i in range(n)]
        names = {v: k for k, v in id2label.items()}
        if label not in names:
            raise HfModelError(f"classifier model {self.path}: no label {label!r} (labels: {', '.join(sorted(names))})")
        return head, names[label], None

    def describe(self) -> dict:
        return {"path": str(self.path), "head": self.head, "max_length": self.max_length,
                "device": self.device.type, "fingerprint": self.fingerprint}

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tokenizer([t or "" for t in texts], truncation=True, max_length=self.max_length)["input_ids"]

    def score(self, texts: Sequence[str]) -> list[float]:
        """One score per text, in order."""
        import torch
        if not texts:
            return []
        logits = self.logits(texts)
        if self.head == "regression":   # `score_offset`: the intercept of a head quipu fitted (label_head)
            scores = logits[:, 0] + float(getattr(self.model.config, "score_offset", 0.0) or 0.0)
        else:
            probs = torch.softmax(logits, dim=-1)
            scores = probs[:, self.label_index] if self.head == "probability" else probs @ torch.tensor(
                self.values, dtype=probs.dtype)
        return [round(float(s), SCORE_DECIMALS) for s in scores]

    def logits(self, texts: Sequence[str]):
        """The model's outputs (texts x labels, float32 on the CPU), in order; batched by length
        (GPU: by a padded-token budget)."""
        import torch

        from quipu.scoring.wayra import length_batches
        encoded = self.encode(texts)
        on_gpu = self.device.type == "cuda"
        batches = length_batches([len(e) for e in encoded], 1 << 20 if on_gpu else self.batch_size,
                                 self.max_batch_tokens if on_gpu else None)
        out = torch.zeros((len(texts), self.model.config.num_labels), dtype=torch.float32)
        for idx in batches:
            batch = self.tokenizer.pad({"input_ids": [encoded[i] for i in idx]}, return_tensors="pt")
            batch = {k: v.to(self.device) for k, v in batch.items()}
            with torch.inference_mode(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=on_gpu):
                out[idx] = self.model(**batch).logits.float().cpu()
        return out


_load_lock = threading.Lock()


@lru_cache(maxsize=8)
def _load_cached(path: str, stamp: tuple, options: tuple) -> HfClassifier:
    return HfClassifier(path, **dict(options))


def load_hf_classifier(path: str | Path, **options) -> HfClassifier:
    """Load once per process (threads share it); a folder whose files changed is loaded again."""
    folder = check_folder(path)
    stamp = tuple(sorted((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in folder.iterdir() if f.is_file()))
    with _load_lock:
        return _load_cached(str(folder.resolve()), stamp, tuple(sorted(options.items())))
