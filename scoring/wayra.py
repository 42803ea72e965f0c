"""Wayra-style student: a small causal transformer that predicts a teacher LLM's log-perplexity.

WayraPPL (LatamGPT, NeurIPS 2025) distils a 1B Llama teacher's per-document perplexity into a 55M
transformer. Ours must run at least 20x faster than the teacher on a CPU. Two bodies:

`body: own`, a few million parameters trained from scratch:

- its own byte-level BPE tokenizer (HF `tokenizers`, a few thousand pieces, trained on the distillation
  text): small embeddings, and en/es/pt are split as evenly as English;
- a causal transformer (pre-norm blocks, `scaled_dot_product_attention(is_causal=True)`), trained with
  a next-token loss as an auxiliary task (predictability is what perplexity measures; the LM loss
  also uses the unlabelled text) plus a regression loss on the standardised teacher log-perplexity;
- a regression head over the masked mean of the final states, the student's own mean token NLL (when
  `nll_feature`), and the log of the token count (`head: document`); or
- `head: token` (with the teacher's tokenizer): a head on every position that predicts the NLL the
  teacher gave that token, trained on the teacher's per-token NLLs. The document's log-perplexity is
  the mean of those predictions, exactly as the teacher's is the mean of its token NLLs. A document
  of 256 tokens then gives 256 targets instead of one, which is what makes a few thousand labelled
  documents enough (bench/RESULTS.md: document head 0.61 Spearman, token head much higher).

`body: teacher` is not built from scratch: it keeps the teacher's token embeddings
and its first `teacher_layers` decoder layers (a Llama's RMSNorm/RoPE/GQA/SwiGLU blocks, rebuilt from
the teacher's saved HF config) and puts the per-token head on top; the layers are fine-tuned, the
embeddings stay frozen. Those first layers already encode what a from-scratch student has to learn
from a few thousand documents (bench/RESULTS.md: held-out Spearman 0.81 from scratch, 0.89 with two
teacher layers), and dropping the remaining layers and the vocabulary projection is what makes it
fast. `bf16` trains under CPU bf16 autocast and keeps bf16 weights for inference (and in the file).

Saved as `model.safetensors` + `config.json` + `tokenizer.json`. Inference is batched with documents
sorted by length (little padding); `quantize=True` applies int8 dynamic quantisation to the linear layers.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator

from quipu.catalog.errors import UserError
from quipu.catalog.files import atomic_path, sha256_file, write_json_atomic

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "quipu-wayra-v1"
PAD, BOS, EOS = "<pad>", "<s>", "</s>"


class StudentError(UserError, ValueError):
    """A student model directory that cannot be used; the message names the path."""


Device = Literal["auto", "cpu", "cuda"]


def resolve_device(device: str = "auto") -> torch.device:
    """`auto`: CUDA when a GPU is visible, else the CPU; `cuda` without a GPU is an error that says so."""
    if device not in ("auto", "cpu", "cuda"):
        raise StudentError(f"device: {device!r}, expected auto, cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise StudentError("device: cuda, but no CUDA device is available (torch.cuda.is_available() is false); "
                           "use device: auto or cpu")
    return torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")


def autocast(device: torch.device, bf16: bool):
    """bf16 autocast: always on CUDA (tensor cores), on the CPU only when asked (`bf16`)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16 or device.type == "cuda")


def length_batches(lengths: Sequence[int], batch_size: int, max_batch_tokens: int | None = None) -> list[list[int]]:
    """Indices sorted by length (ties by index) cut into batches of at most `batch_size` documents and,
    with `max_batch_tokens`, at most that many padded tokens: documents of similar length together, so
    little padding; on a GPU the token budget makes batches of short documents large."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        # sorted ascending: the batch's padded width is the length of the document being added
        if cur and (len(cur) >= batch_size or (max_batch_tokens and (len(cur) + 1) * lengths[i] > max_batch_tokens)):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


class WayraArch(BaseModel):
    """The student's shape; stored in config.json."""
    model_config = ConfigDict(extra="forbid")
    vocab_size: int = Field(4096, ge=300, le=65536)
    d_model: int = Field(128, ge=16, le=2048)
    n_layers: int = Field(3, ge=1, le=24)
    n_heads: int = Field(4, ge=1, le=32)
    d_ff: int = Field(512, ge=16, le=8192)
    max_len: int = Field(192, ge=8, le=4096, description="student tokens of each document it reads")
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    nll_feature: bool = Field(True, description="feed the student's own mean token NLL to the regression head")
    tokenizer: Literal["own", "teacher"] = Field(
        "own", description="own: a byte-level BPE trained on the distillation text; teacher: the teacher's tokenizer, "
                           "with the student's embeddings initialised from the teacher's (PCA to d_model)")
    head: Literal["document", "token"] = Field(
        "document", description="document: regression on the pooled states; token: predict each token's teacher NLL "
                                "(needs tokenizer: teacher and max_len = teacher max_tokens + 1), the mean is the document's")
    body: Literal["own", "teacher"] = Field(
        "own", description="own: a small transformer of d_model x n_layers trained from scratch; teacher: the teacher's "
                           "embeddings and first teacher_layers decoder layers, fine-tuned (needs tokenizer: teacher)")
    teacher_layers: int = Field(2, ge=1, le=128, description="body: teacher — how many of the teacher's first layers")
    lens_feature: bool = Field(False, description="body: teacher, head: token — also give the head each token's score "
                                                  "under the teacher's (tied) embeddings read from the previous "
                                                  "position's state: a logit lens without the softmax normaliser, "
                                                  "one dot product per token")
    teacher_config: dict | None = Field(
        None, description="body: teacher — the teacher's HF config, written by distillation so that the student "
                          "loads without the teacher")
    bf16: bool = Field(False, description="bf16 autocast on CPU in training; bf16 weights for inference and in the file")

    @model_validator(mode="after")
    def _token_head_needs_teacher_tokens(self):
        if self.head == "token" and self.tokenizer != "teacher":
            raise ValueError("head: token needs tokenizer: teacher (targets are the teacher's per-token NLLs)")
        if self.head == "token" and self.nll_feature:
            raise ValueError("head: token does not use nll_feature; set nll_feature: false")
        if self.body == "teacher" and self.tokenizer != "teacher":
            raise ValueError("body: teacher needs tokenizer: teacher (the layers read the teacher's token ids)")
        if self.body == "teacher" and self.nll_feature:
            raise ValueError("body: teacher has no next-token output; set nll_feature: false")
        if self.lens_feature and (self.body != "teacher" or self.head != "token"):
            raise ValueError("lens_feature needs body: teacher and head: token")
        return self


# ---- tokenizer --------------------------------------------------------------------------------

def train_tokenizer(texts: Sequence[str], vocab_size: int, max_chars: int = 4000):
    """Byte-level BPE on the documents' prefixes (the part the student reads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((t[:max_chars] for t in texts), trainer=trainer, length=len(texts))
    return tok


def encode(tokenizer, texts: Sequence[str], max_len: int, bos: int | None = None) -> list[list[int]]:
    """BOS + the first `max_len - 1` pieces; character prefixes keep encoding fast for long documents."""
    bos = tokenizer.token_to_id(BOS) if bos is None else bos
    # a piece is rarely more than 8 characters: enough characters to fill max_len pieces
    cut = max_len * 8
    return [[bos] + e.ids[: max_len - 1]
            for e in tokenizer.encode_batch([(t or "")[:cut] for t in texts], add_special_tokens=False)]


def teacher_tokenizer(hf_tokenizer):
    """A standalone copy of a HF fast tokenizer's `tokenizers.Tokenizer` (saved with the student), and
    its BOS and pad ids."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    tok.no_truncation()
    tok.no_padding()
    bos = hf_tokenizer.bos_token_id
    pad = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else (hf_tokenizer.eos_token_id or 0)
    return tok, int(bos if bos is not None else pad), int(pad)


def pca_embeddings(weight: torch.Tensor, d: int, seed: int = 0) -> torch.Tensor:
    """The teacher's input embeddings projected on their top-d principal directions, scaled to std 0.02."""
    w = weight.detach().float()
    w = w - w.mean(dim=0, keepdim=True)
    torch.manual_seed(seed)
    _, _, v = torch.pca_lowrank(w, q=min(d, w.shape[1]), center=False)
    z = w @ v
    if z.shape[1] < d:
        z = torch.cat([z, torch.zeros(z.shape[0], d - z.shape[1])], dim=1)
    return z * (0.02 / z.std().clamp(min=1e-8))


# ---- model ------------------------------------------------------------------------------------

def teacher_body(a: WayraArch) -> nn.Module:
    """The teacher's base model (no LM head) cut to its first `a.teacher_layers` layers, randomly
    initialised; `load_teacher_layers` or the student's saved weights fill it."""
    from transformers import AutoConfig, AutoModel
    if not a.teacher_config or "model_type" not in a.teacher_config:
        raise StudentError("body: teacher needs teacher_config (the teacher's HF config with its model_type)")
    cfg = {k: v for k, v in a.teacher_config.items() if k != "model_type"}
    cfg["num_hidden_layers"] = a.teacher_layers
    if isinstance(cfg.get("layer_types"), list):       # per-layer attention kinds (some architectures)
        cfg["layer_types"] = cfg["layer_types"][:a.teacher_layers]
    try:
        config = AutoConfig.for_model(a.teacher_config["model_type"], **cfg)
        return AutoModel.from_config(config)
    except Exception as e:
        raise StudentError(f"body: teacher: cannot build a {a.teacher_config['model_type']!r} model from "
                           f"teacher_config: {str(e)[:300]}") from None


def load_teacher_layers(body: nn.Module, teacher_lm: nn.Module, n_layers: int) -> None:
    """Copy the teacher's embeddings, first `n_layers` decoder layers and final norm into `body`."""
    import re
    base = getattr(teacher_lm, teacher_lm.base_model_prefix)
    layer = re.compile(r"^layers\.(\d+)\.")
    state = {k: v for k, v in base.state_dict().items()
             if not (m := layer.match(k)) or int(m.group(1)) < n_layers}
    try:
        body.load_state_dict(state, strict=True)
    except Exception as e:
        raise StudentError(f"the teacher's first {n_layers} layers do not fit the student body: {str(e)[:300]}") from None


def check_weight_shapes(path: Path, arch: "WayraArch") -> None:
    """StudentError unless the safetensors file holds exactly the tensors `arch` declares, with
    their shapes: read from the file's header and from the model built on the meta device, so a
    config declaring the largest architecture beside tiny weights allocates nothing."""
    from safetensors import safe_open
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in WayraModel(arch).state_dict().items()}
    try:
        with safe_open(str(path), framework="pt") as f:
            got = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:
        raise StudentError(f"student model {path} is not a readable safetensors file: {str(e)[:200]}") from None
    if got != expected:
        diff = sorted(set(got) ^ set(expected)) or [k for k in expected if got[k] != expected[k]]
        k = diff[0]
        raise StudentError(f"student model {path} does not match its config's arch: {k} is "
                           f"{got.get(k, 'missing')}, the arch says {expected.get(k, 'no such tensor')} "
                           f"({len(diff)} tensor(s) differ)")


class Block(nn.Module):
    def __init__(self, a: WayraArch):
        super().__init__()
        self.n_heads = a.n_heads
        self.ln1, self.ln2 = nn.LayerNorm(a.d_model), nn.LayerNorm(a.d_model)
        self.qkv = nn.Linear(a.d_model, 3 * a.d_model)
        self.proj = nn.Linear(a.d_model, a.d_model)
        self.ff = nn.Sequential(nn.Linear(a.d_model, a.d_ff), nn.GELU(), nn.Linear(a.d_ff, a.d_model))
        self.drop = nn.Dropout(a.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        # right padding + causal attention: real tokens never attend to the padding after them
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(att))
        return x + self.drop(self.ff(self.ln2(x)))


class WayraModel(nn.Module):
    def __init__(self, a: WayraArch):
        super().__init__()
        self.arch = a
        self.drop = nn.Dropout(a.dropout)
        extra = (1 if a.lens_feature else 0) if a.head == "token" else (2 if a.nll_feature else 1)
        if a.body == "teacher":
            self.body = teacher_body(a)
            width = self.body.config.hidden_size
            self.head = nn.Sequential(nn.Linear(width + extra, a.d_model), nn.GELU(), nn.Linear(a.d_model, 1))
            self.head.apply(self._init)
            return
        if a.d_model % a.n_heads:
            raise StudentError(f"d_model {a.d_model} is not a multiple of n_heads {a.n_heads}")
        self.tok = nn.Embedding(a.vocab_size, a.d_model)
        self.pos = nn.Embedding(a.max_len, a.d_model)
        self.blocks = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.ln = nn.LayerNorm(a.d_model)
        self.head = nn.Sequential(nn.Linear(a.d_model + extra, a.d_model), nn.GELU(), nn.Linear(a.d_model, 1))
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def precision(self):
        """The autocast context of training and inference: bf16 when `arch.bf16`, and always on CUDA."""
        return autocast(next(self.parameters()).device, self.arch.bf16)

    def hidden(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.arch.body == "teacher":
            return self.body(input_ids=ids, attention_mask=mask).last_hidden_state
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.tok(ids) + self.pos(pos))
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x)

    def token_nll(self, h: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-position next-token NLL (tied output embedding), zero where no target."""
        logits = h[:, :-1] @ self.tok.weight.T
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1),
                              reduction="none").view(ids.shape[0], -1)
        return nll * mask[:, 1:]

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, lm: bool = False, hidden: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(standardised log-ppl prediction, LM loss sum, LM target count, per-position predictions or
        None); the LM loss only with `lm`, per-position predictions only with `head: token`. `hidden`:
        the body's states when they are already known (a frozen body in training)."""
        h = self.hidden(ids, mask) if hidden is None else hidden
        m = mask.to(torch.float32)      # sums over a document stay fp32 under bf16 autocast
        if self.arch.head == "token":
            if self.arch.lens_feature:
                # score of token j under the state at j - 1 (tied embeddings, no normaliser); 0 at BOS
                emb = self.body.get_input_embeddings().weight
                lens = (h[:, :-1] * emb[ids[:, 1:]].to(h.dtype)).sum(-1) / h.shape[-1] ** 0.5
                h = torch.cat([h, F.pad(lens, (1, 0)).unsqueeze(-1).to(h.dtype)], dim=-1)
            per_token = self.head(h).squeeze(-1).float()
            scored = m.clone()
            scored[:, 0] = 0          # BOS: the teacher scores the tokens after it, not BOS itself
            pred = (per_token * scored).sum(dim=1) / scored.sum(dim=1).clamp(min=1)
            lm_sum, lm_n = h.new_zeros(()), m[:, 1:].sum()
            if lm:
                lm_sum = self.token_nll(h, ids, m).sum()
            return pred, lm_sum, lm_n, per_token
        n = m.sum(dim=1).clamp(min=1)
        pooled = (h.float() * m.unsqueeze(-1)).sum(dim=1) / n.unsqueeze(-1)
        feats = [pooled, torch.log(n).unsqueeze(-1) - 4.0]
        lm_sum = h.new_zeros(())
        lm_n = m[:, 1:].sum()
        if self.arch.nll_feature or lm:
            nll = self.token_nll(h, ids, m)
            lm_sum = nll.sum()
            if self.arch.nll_feature:
                mean_nll = nll.sum(dim=1) / m[:, 1:].sum(dim=1).clamp(min=1)
                # the head sees the NLL but its gradient does not reshape the LM through it
                feats.append(mean_nll.detach().unsqueeze(-1) - 5.0)
        pred = self.head(torch.cat(feats, dim=-1)).squeeze(-1).float()
        return pred, lm_sum, lm_n, None


def pad_batch(seqs: list[list[int]], pad_id: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and mask (built on the CPU, then moved in one copy)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = torch.tensor(s, dtype=torch.long)
        mask[r, :len(s)] = 1
    if device is not None and device.type != "cpu":
        return ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)
    return ids, mask


# ---- the student: model + tokenizer + label scale ---------------------------------------------

class WayraStudent:
    def __init__(self, model: WayraModel, tokenizer, label_mean: float, label_std: float, meta: dict | None = None,
                 bos_id: int | None = None, pad_id: int | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.label_mean = label_mean
        self.label_std = label_std
        self.meta = meta or {}
        self.bos_id = tokenizer.token_to_id(BOS) if bos_id is None else bos_id
        self.pad_id = tokenizer.token_to_id(PAD) if pad_id is None else pad_id
        self.path: Path | None = None

    @property
    def arch(self) -> WayraArch:
        return self.model.arch

    def n_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def encode(self, texts: Sequence[str], max_len: int | None = None) -> list[list[int]]:
        return encode(self.tokenizer, texts, min(max_len or self.arch.max_len, self.arch.max_len), self.bos_id)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def for_inference(self, device: str | torch.device = "cpu") -> "WayraStudent":
        """Eval mode on `device` (auto|cpu|cuda); bf16 weights with `arch.bf16` and always on CUDA
        (autocast would cast every weight on every call: ~20% of the student's time on the CPU here)."""
        dev = device if isinstance(device, torch.device) else resolve_device(device)
        self.model.eval()
        self.model.to(dev)
        if self.arch.bf16 or dev.type == "cuda":
            self.model.to(torch.bfloat16)
        return self

    def predict_log_ppl(self, texts: Sequence[str], batch_size: int = 16, max_len: int | None = None,
                        max_batch_tokens: int | None = None) -> list[float]:
        """Predicted teacher log-perplexity of each text, in batches of similar length (at most
        `batch_size` documents and `max_batch_tokens` padded tokens). `max_len`: read only the first
        `max_len - 1` tokens (a shorter window than the student was trained on; default its own)."""
        if not len(texts):
            return []
        seqs = self.encode(texts, max_len)
        out = [0.0] * len(seqs)
        device = self.device
        self.model.eval()
        with torch.inference_mode(), self.model.precision():
            for idx in length_batches([len(s) for s in seqs], batch_size, max_batch_tokens):
                ids, mask = pad_batch([seqs[i] for i in idx], self.pad_id, device)
                pred, _, _, _ = self.model(ids, mask)
                for i, v in zip(idx, pred.float().cpu().tolist()):
                    out[i] = v * self.label_std + self.label_mean
        return out

    def predict_token_nll(self, texts: Sequence[str], batch_size: int = 16,
                          max_batch_tokens: int | None = None) -> list[list[float]]:
        """`head: token`: the NLL (nats) the student predicts the teacher gives each token after BOS;
        what a smaller student learns from when this one is its assistant (unlabelled text)."""
        if self.arch.head != "token":
            raise StudentError("per-token predictions need a student with head: token")
        seqs = self.encode(texts)
        out: list[list[float]] = [[] for _ in seqs]
        device = self.device
        self.model.eval()
        with torch.inference_mode(), self.model.precision():
            for idx in length_batches([len(s) for s in seqs], batch_size, max_batch_tokens):
                ids, mask = pad_batch([seqs[i] for i in idx], self.pad_id, device)
                _, _, _, per_token = self.model(ids, mask)
                per_token = (per_token.float() * self.label_std + self.label_mean).cpu()
                for r, i in enumerate(idx):
                    out[i] = [round(v, 3) for v in per_token[r, 1:len(seqs[i])].tolist()]
        return out

    def quantize(self) -> "WayraStudent":
        """int8 dynamic quantisation of the linear layers (weights int8, activations quantised on the fly;
        CPU only)."""
        from torch.ao.quantization import quantize_dynamic
        self.model.eval().float().cpu()
        self.model = quantize_dynamic(self.model, {nn.Linear}, dtype=torch.qint8)
        # the int8 kernels take fp32 activations: no bf16 autocast around them
        self.model.arch = self.model.arch.model_copy(update={"bf16": False})
        return self

    # -- files --
    def save(self, directory: str | Path, extra: dict | None = None) -> dict:
        from safetensors.torch import save_file
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.model.state_dict().items()}
        with atomic_path(d / WEIGHTS_FILE) as tmp:
            save_file(state, str(tmp))
        with atomic_path(d / TOKENIZER_FILE) as tmp:
            self.tokenizer.save(str(tmp))
        cfg = {"format": FORMAT, "arch": self.arch.model_dump(), "label_mean": self.label_mean,
               "label_std": self.label_std, "bos_id": self.bos_id, "pad_id": self.pad_id,
               "weights_sha256": sha256_file(d / WEIGHTS_FILE),
               **self.meta, **(extra or {})}
        write_json_atomic(d / CONFIG_FILE, cfg)
        self.path = d
        return cfg

    @classmethod
    def load(cls, directory: str | Path, quantize: bool = False, threads: int | None = None,
             device: str = "cpu") -> "WayraStudent":
        """Load and verify a student directory; every failure names the path. `device`: auto|cpu|cuda
        (int8 quantisation runs on the CPU only)."""
        from safetensors.torch import load_file
        from tokenizers import Tokenizer
        d = Path(directory)
        if not d.is_dir():
            raise StudentError(f"student model directory not found: {d}")
        for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE):
            if not (d / name).is_file():
                raise StudentError(f"student model {d}: missing {name}")
        try:
            cfg = json.loads((d / CONFIG_FILE).read_text())
            if cfg.get("format") != FORMAT:
                raise ValueError(f"format {cfg.get('format')!r}, expected {FORMAT!r}")
            arch = WayraArch(**cfg["arch"])
        except Exception as e:
            raise StudentError(f"student model {d / CONFIG_FILE} is not a valid config: {e}") from None
        expected = cfg.get("weights_sha256")
        if expected and sha256_file(d / WEIGHTS_FILE) != expected:
            raise StudentError(f"student model {d / WEIGHTS_FILE} is corrupt (hash differs from config.json)")
        check_weight_shapes(d / WEIGHTS_FILE, arch)   # before any allocation the arch declares
        try:
            state = load_file(str(d / WEIGHTS_FILE))
            model = WayraModel(arch)
            model.load_state_dict(state)
        except Exception as e:
            raise StudentError(f"student model {d / WEIGHTS_FILE} does not load: {str(e)[:300]}") from None
        bad = next((k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())), None)
        if bad is not None:
            raise StudentError(f"student model {d / WEIGHTS_FILE}: tensor {bad!r} holds NaN or infinite weights; retrain it")
        del state
        if not all(isinstance(cfg.get(k), (int, float)) and math.isfinite(cfg[k]) for k in ("label_mean", "label_std")) \
                or cfg["label_std"] <= 0:
            raise StudentError(f"student model {d / CONFIG_FILE}: label_mean and label_std must be finite numbers, "
                               f"label_std > 0 (got {cfg.get('label_mean')!r}, {cfg.get('label_std')!r})")
        try:
            tok = Tokenizer.from_file(str(d / TOKENIZER_FILE))
        except Exception as e:
            raise StudentError(f"student tokenizer {d / TOKENIZER_FILE} does not load: {str(e)[:200]}") from None
        if threads:
            torch.set_num_threads(threads)
        meta = {k: v for k, v in cfg.items() if k not in ("format", "arch", "label_mean", "label_std", "weights_sha256",
                                                          "bos_id", "pad_id")}
        student = cls(model, tok, float(cfg["label_mean"]), float(cfg["label_std"]), meta,
                      bos_id=cfg.get("bos_id"), pad_id=cfg.get("pad_id"))
        student.path = d
        if quantize:
            if resolve_device(device).type != "cpu":
                raise StudentError("quantize: int8 dynamic quantisation runs on the CPU only; use device: cpu")
            return student.quantize()
        return student.for_inference(device)
