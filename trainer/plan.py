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
