"""Training-step throughput: our Llama (trainer/model.py) vs HF transformers' LlamaForCausalLM at the
same configuration, measured in the same process, alternating rounds so machine load hits both.

A step = forward + loss + backward + gradient clipping + AdamW step, on the same random token
batch. Default: ~35M parameters (vocab 32,000, dim 512, 6 layers, 8 heads, SwiGLU 1408, tied
embeddings), seq 256, batch 8, fp32, 2 threads.

    .venv/bin/python bench/train_throughput.py [--rounds 5] [--steps 3] [--threads 2] [--compile]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quipu.trainer.export import hf_config, to_hf_state  # noqa: E402
from quipu.trainer.model import Llama, ModelConfig  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="steps per round per model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--compile", action="store_true", help="torch.compile our model (trainer's train.compile)")
    ap.add_argument("--packed", action="store_true", help="ours with 4 documents per row (block-diagonal mask)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32000, dim=512, n_layers=6, n_heads=8, n_kv_heads=8, ffn_dim=1408,
                      max_seq_len=args.seq, tie_embeddings=True)
    ours = Llama(cfg)
    from transformers import LlamaForCausalLM
    hf_cfg = hf_config(cfg, None)
    hf_cfg._attn_implementation = "sdpa"
    hf = LlamaForCausalLM(hf_cfg)
    hf.load_state_dict(to_hf_state(ours.state_dict(), True), strict=False)
    hf.tie_weights()
    n_params = ours.num_params()
    assert n_params == sum(p.numel() for p in hf.parameters()), "models differ in size"

    x = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1))
    inp, tgt = x[:, :-1].contiguous(), x[:, 1:].contiguous()
    pos = seg = None
    if args.packed:
        L = args.seq
        seg = (torch.arange(L) // (L // 4)).expand(args.batch, L).contiguous()
        pos = (torch.arange(L) % (L // 4)).expand(args.batch, L).contiguous()

    # the trainer's optimizer (fused AdamW, no decay on norms); HF with torch's default AdamW
    from quipu.trainer.train import OptimConfig, make_optimizer
    opt_ours = make_optimizer(ours, OptimConfig(), torch.device("cpu"))
    opt_hf = torch.optim.AdamW(hf.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95))
    fwd = torch.compile(ours) if args.compile else ours

    def step_ours():
        s, n = fwd(inp, pos, seg, targets=tgt)
        (s / n).backward()
        torch.nn.utils.clip_grad_norm_(ours.parameters(), 1.0)
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)
        return float(s.detach() / n)

    def step_hf():
        out = hf(input_ids=x[:, :-1], labels=x[:, :-1])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        opt_hf.step()
        opt_hf.zero_grad(set_to_none=True)
        return float(out.loss)

    tokens = args.batch * args.seq
    for f in (step_ours, step_hf):   # warm-up (and compilation)
        f()
        f()
    rates = {"ours": [], "hf": []}
    for r in range(args.rounds):
        for name, f in (("ours", step_ours), ("hf", step_hf)) if r % 2 == 0 else (("hf", step_hf), ("ours", step_ours)):
            t = time.perf_counter()
            for _ in range(args.steps):
                f()
            rates[name].append(args.steps * tokens / (time.perf_counter() - t))
        print(f"round {r + 1}: ours {rates['ours'][-1]:,.0f} tok/s, HF {rates['hf'][-1]:,.0f} tok/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    result = {"params": n_params, "seq": args.seq, "batch": args.batch, "threads": args.threads,
              "compile": args.compile, "packed": args.packed, "ours_tokens_per_s": round(med["ours"], 1),
              "hf_tokens_per_s": round(med["hf"], 1), "speedup": round(med["ours"] / med["hf"], 3),
              "rounds": args.rounds, "steps_per_round": args.steps}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
