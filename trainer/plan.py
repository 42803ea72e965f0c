"""Compute planning: training FLOPs ≈ 6·N·D (forward 2ND + backward 4ND, attention ignored), wall
time on G accelerators at a given peak and MFU, and the Chinchilla-optimal N and D for that budget
(Hoffmann et al. 2022: D ≈ 20·N, so N = sqrt(C / 120), D = 20·N).
"""
from __future__ import annotations

import math

TOKENS_PER_PARAM = 20.0


def training_flops(params: float, tokens: float) -> float:
    return 6.0 * params * tokens


def training_days(flops: float, gpus: int, peak_flops: float, mfu: float) -> float:
    return flops / (gpus * peak_flops * mfu) / 86400.0


def chinchilla_optimal(flops: float, tokens_per_param: float = TOKENS_PER_PARAM) -> tuple[float, float]:
    n = math.sqrt(flops / (6.0 * tokens_per_param))
    return n, tokens_per_param * n


def plan(params: float, tokens: float, gpus: int = 1, peak_flops: float = 989e12, mfu: float = 0.4) -> dict:
    if min(params, tokens, gpus, peak_flops, mfu) <= 0 or mfu > 1:
        raise ValueError("params, tokens, gpus, peak-flops must be positive and 0 < mfu <= 1")
    c = training_flops(params, tokens)
    n_opt, d_opt = chinchilla_optimal(c)
    return {"params": params, "tokens": tokens, "tokens_per_param": tokens / params, "flops": c,
            "gpus": gpus, "peak_flops": peak_flops, "mfu": mfu,
            "days": training_days(c, gpus, peak_flops, mfu),
            "gpu_hours": c / (peak_flops * mfu) / 3600.0,
            "chinchilla_params": n_opt, "chinchilla_tokens": d_opt}


def _si(x: float) -> str:
    for unit, v in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= v:
            return f"{x / v:.3g}{unit}"
    return f"{x:.3g}"


def format_plan(p: dict) -> str:
    return "\n".join([
        f"model            {_si(p['params'])} parameters, {_si(p['tokens'])} tokens ({p['tokens_per_param']:.1f} tokens/param)",
        f"compute          6ND = {p['flops']:.3e} FLOPs",
        f"hardware         {p['gpus']} x {p['peak_flops']:.3e} FLOP/s peak at {p['mfu']:.0%} MFU",
        f"time             {p['days']:.2f} days ({p['gpu_hours']:,.0f} GPU-hours)",
        f"chinchilla       for this compute: {_si(p['chinchilla_params'])} parameters on {_si(p['chinchilla_tokens'])} tokens (D = 20 N)",
    ])


# ---- sizing a model for a time budget (quipu ablate --budget) ------------------------------------

# Shapes from tiny to small, (dim, layers, heads): heads of 24-64 dimensions. A budget picks the
# largest whose parameters (embedding included: at this size it is most of the compute) are at most
# the Chinchilla-optimal N for the compute the budget buys.
SHAPES = [(32, 1, 2), (48, 2, 2), (64, 2, 2), (96, 3, 3), (128, 4, 4), (192, 4, 4), (256, 6, 4), (384, 8, 6),
          (512, 8, 8), (768, 12, 12), (1024, 16, 16), (1536, 24, 16), (2048, 24, 32)]


def model_params(dim: int, n_layers: int, vocab_size: int, ffn_dim: int | None = None, kv_dim: int | None = None,
                 tie_embeddings: bool = True) -> int:
    """Parameters of trainer.llama.Llama (SwiGLU of 8/3·dim rounded up to 64 unless given)."""
    ffn = ffn_dim or 64 * math.ceil(8 * dim / 3 / 64)
    kv = kv_dim or dim
    vocab = 64 * math.ceil(vocab_size / 64)
    per_layer = 2 * dim * dim + 2 * dim * kv + 3 * dim * ffn + 2 * dim
    return vocab * dim * (1 if tie_embeddings else 2) + n_layers * per_layer + dim


def size_for_budget(seconds: float, flops_per_s: float, vocab_size: int) -> dict:
    """The model and token count one run gets from `seconds` at `flops_per_s`: C = FLOP/s x s,
    N = the largest shape not above Chinchilla's sqrt(C / 120), D = C / 6N."""
    if seconds <= 0 or flops_per_s <= 0:
        raise ValueError("seconds and flops_per_s must be positive")
    c = seconds * flops_per_s
    n_opt, d_opt = chinchilla_optimal(c)
    fits = [s for s in SHAPES if model_params(s[0], s[1], vocab_size) <= n_opt] or SHAPES[:1]
    dim, layers, heads = fits[-1]
    n = model_params(dim, layers, vocab_size)
    return {"model": {"dim": dim, "n_layers": layers, "n_heads": heads, "n_kv_heads": heads},
            "params": n, "tokens": c / (6.0 * n), "flops": c, "chinchilla_params": n_opt, "chinchilla_tokens": d_opt}


def measure_train_flops(model: dict, vocab_size: int, seq_len: int, micro_batch: int, threads: int | None = None,
                        seconds: float = 3.0) -> float:
    """Sustained training FLOP/s (6ND) of a model shape on this machine: forward, backward and
    AdamW steps on random tokens for about `seconds` (after one warm-up step)."""
    import time

    import torch

    from quipu.trainer.llama import Llama, ModelConfig, pad_vocab
    if threads:
        torch.set_num_threads(threads)
    cfg = ModelConfig(vocab_size=pad_vocab(vocab_size), max_seq_len=seq_len, **model)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    net = Llama(cfg)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    x = torch.randint(0, vocab_size, (micro_batch, seq_len), generator=gen)
    steps, t0 = -1, 0.0
    while True:
        loss, n = net(x, targets=x)
        (loss / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        if steps == 0:
            t0 = time.perf_counter()
        elif time.perf_counter() - t0 >= seconds:
            break
    dt = time.perf_counter() - t0
    return training_flops(net.num_params(), steps * micro_batch * seq_len) / dt
