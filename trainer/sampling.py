"""A text sample from the model (the run summary's, at the end of training): seeded, so the same
weights give the same sample. Every rank of an FSDP2 run calls it (a sharded forward needs them all).
"""
from __future__ import annotations

import torch

from quipu.trainer.tokenizer import TextTokenizer


def sample(model, tokenizer: TextTokenizer, prompt: str, tokens: int, seed: int, device: torch.device,
           temperature: float = 0.8, top_k: int = 40) -> str:
    """`prompt` continued by up to `tokens` tokens (top-k sampling); "" when `tokens` is 0."""
    if tokens == 0:
        return ""
    ids = torch.tensor([tokenizer.encode(prompt)], device=device)
    was_training = model.training
    model.eval()
    g = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(ids, tokens, temperature=temperature, top_k=top_k, eos_id=tokenizer.eos_id, generator=g)
    model.train(was_training)
    return tokenizer.decode(out[0].tolist())
