"""Training-step throughput: our Llama (trainer/llama.py) vs HF transformers' LlamaForCausalLM at the
same configuration, measured in the same process, alternating rounds so machine load hits both.

A step = forward + loss + backward + gradient clipping + AdamW step, on the same random token
batch. Default: ~35M parameters (vocab 32,000, dim 512, 6 layers, 8 heads, SwiGLU 1408, tied
embeddings), seq 256, batch 8, fp32, 2 threads. Ours steps with the trainer's optimizer (fused
AdamW); HF with its Trainer's default, fused AdamW too (`--hf-optim default`: torch's default
AdamW, the anchor of RESULTS.md's rows before 2026-11-28).

    .venv/bin/python bench/train_throughput.py [--rounds 5] [--steps 3] [--threads 2] [--compile]

`--unfused`: a third contestant, our model on its plain paths (`Llama.use_fused(False)`: three q/k/v
GEMMs, two gate/up, the full logit tensor), same weights; every round also prints CPU seconds per
step (process time: less swayed than wall time by other jobs on a shared machine).

`--options`: the trainer's memory and speed options on our model alone, each in its own process so
its peak memory is its own (peak RSS on CPU; peak allocated GPU memory on CUDA): plain, activation
checkpointing per block, torch.compile, both; tokens/s and peak memory per option.

    .venv/bin/python bench/train_throughput.py --options [--device cuda --bf16] [--steps 3]

`--profile`: after the timed rounds, each model's step split into its parts (forward + loss,
backward, clipping, optimizer; wall time), and one forward + backward under torch.profiler by op
category (matmuls: linear layers and the LM head; attention; loss; norms/rotary/activations; the
rest), so the ratio can be read against where each step's time goes.
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
from quipu.trainer.llama import Llama, ModelConfig  # noqa: E402


OPTIONS = {"plain": {}, "activation_checkpointing": {"ac": True}, "compile": {"compile": True},
           "compile+activation_checkpointing": {"ac": True, "compile": True}}


def one_option(args) -> dict:
    """Our model with one option: warm-up steps, then `--steps` timed; peak memory of this process."""
    import resource
    opt = OPTIONS[args.only]
    dev = torch.device(args.device)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=32000, dim=args.dim, n_layers=args.layers, n_heads=8, n_kv_heads=8, ffn_dim=args.dim * 11 // 4,
                      max_seq_len=args.seq, tie_embeddings=True)
    model = Llama(cfg).to(dev)
    model.activation_checkpointing = opt.get("ac", False)
    from quipu.trainer.build import make_optimizer
    from quipu.trainer.train_config import OptimConfig
    optim = make_optimizer(model, OptimConfig(), dev)
    fwd = torch.compile(model) if opt.get("compile") else model
    x = torch.randint(0, cfg.vocab_size, (args.batch, args.seq + 1), device=dev)
    inp, tgt = x[:, :-1].contiguous(), x[:, 1:].contiguous()
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if args.bf16 else torch.autocast(dev.type, enabled=False)

    def step():
        with amp:
            s, n = fwd(inp, None, None, targets=tgt)
        (s / n).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()
    for _ in range(2):
        step()
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    dt = time.perf_counter() - t
    peak = (torch.cuda.max_memory_allocated() if dev.type == "cuda" else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"option": args.only, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
            "params": model.num_params(), "seq": args.seq, "batch": args.batch, "bf16": args.bf16,
            "tokens_per_s": round(args.steps * args.batch * args.seq / dt, 1), "peak_mib": round(peak / 2**20, 1)}


CATEGORIES = (   # torch.profiler op name -> category (first match wins)
    ("attention", ("scaled_dot_product", "_flash_attention", "_efficient_attention", "attention")),
    ("loss", ("cross_entropy", "log_softmax", "nll_loss", "logsumexp")),
    ("matmul", ("mm", "addmm", "bmm", "matmul", "linear")),
    ("embedding", ("embedding",)),
    ("elementwise: norms, rotary, SiLU", ("rsqrt", "pow", "mean", "silu", "mul", "add", "cat", "neg", "index", "sum", "div")),
)


def category(op: str) -> str:
    name = op.lower().removeprefix("aten::")
    for cat, keys in CATEGORIES:
        if any(k in name for k in keys):
            return cat
    return "other (copies, views, allocation)"


def phase_seconds(parts: list[tuple[str, callable]], repeat: int = 2) -> dict[str, float]:
    """Wall seconds of each part of a step (forward + loss, backward, clip, optimizer), median of `repeat` steps."""
    times: dict[str, list[float]] = {name: [] for name, _ in parts}
    for _ in range(repeat):
        for name, f in parts:
            t = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def op_seconds(forward_backward) -> dict[str, float]:
    """Seconds of self CPU time per op category in one forward + backward (leaf ops: no double counting)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        forward_backward()
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        out[category(ev.key)] = out.get(category(ev.key), 0.0) + ev.self_cpu_time_total / 1e6
    return out


def print_table(title: str, rows: dict[str, dict[str, float]]) -> None:
    cats = sorted({c for p in rows.values() for c in p}, key=lambda c: -rows["hf"].get(c, 0))
    total = {k: sum(p.values()) for k, p in rows.items()}
    print(f"\n{title:<34} {'ours s':>8} {'share':>6} {'HF s':>8} {'share':>6} {'HF - ours':>9}")
    for c in cats:
        o, h = rows["ours"].get(c, 0.0), rows["hf"].get(c, 0.0)
        print(f"{c:<34} {o:>8.3f} {o / total['ours']:>6.1%} {h:>8.3f} {h / total['hf']:>6.1%} {h - o:>+9.3f}")
    print(f"{'total':<34} {total['ours']:>8.3f} {'':>6} {total['hf']:>8.3f} {'':>6} {total['hf'] - total['ours']:>+9.3f}")


def step_parts(model, optim, forward) -> list[tuple[str, callable]]:
    """A training step as its parts, run in order: `forward()` returns the mean loss."""
    held = {}
    return [("forward + loss", lambda: held.update(loss=forward())), ("backward", lambda: held.pop("loss").backward()),
            ("clip", lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)),
            ("optimizer", lambda: (optim.step(), optim.zero_grad(set_to_none=True)))]


def all_options(args) -> int:
    import subprocess
    rows = []
    for name in OPTIONS:
        if "compile" in name and args.no_compile:
            continue
        cmd = [sys.executable, __file__, "--only", name, "--device", args.device, "--steps", str(args.steps),
               "--seq", str(args.seq), "--batch", str(args.batch), "--threads", str(args.threads),
               "--dim", str(args.dim), "--layers", str(args.layers)] + (["--bf16"] if args.bf16 else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(f"{name}: failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            continue
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    base = next((r for r in rows if r["option"] == "plain"), None)
    print(f"\n{'option':<34} {'tok/s':>10} {'x plain':>8} {'peak MiB':>10} {'x plain':>8}")
    for r in rows:
        print(f"{r['option']:<34} {r['tokens_per_s']:>10,.0f} {r['tokens_per_s'] / base['tokens_per_s'] if base else 0:>8.2f} "
              f"{r['peak_mib']:>10,.0f} {r['peak_mib'] / base['peak_mib'] if base else 0:>8.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--options", action="store_true", help="tokens/s and peak memory per trainer option (ours only)")
    ap.add_argument("--only", choices=list(OPTIONS), help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (the trainer's precision on a GPU)")
    ap.add_argument("--no-compile", action="store_true", help="--options without the torch.compile rows")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="steps per round per model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--compile", action="store_true", help="torch.compile our model (trainer's train.compile)")
    ap.add_argument("--packed", action="store_true", help="ours with 4 documents per row (block-diagonal mask)")
    ap.add_argument("--hf-optim", choices=("fused", "default"), default="fused",
                    help="HF's optimizer: fused AdamW (its Trainer's default with torch >= 2.8) or torch's default AdamW")
    ap.add_argument("--unfused", action="store_true", help="also our model on its plain paths (Llama.use_fused(False))")
    ap.add_argument("--profile", action="store_true", help="then each step split into parts and ops (see above)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.only:
        print(json.dumps(one_option(args)))
        return 0
    if args.options:
        return all_options(args)
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

    # the trainer's optimizer (fused AdamW, no decay on norms); HF with what its Trainer uses by default
    # (`adamw_torch_fused` with torch >= 2.8), or with `--hf-optim default` torch's default AdamW
    from quipu.trainer.build import make_optimizer
    from quipu.trainer.train_config import OptimConfig

    def contestant(model):   # our model with its optimizer: a list of step parts
        fwd = torch.compile(model) if args.compile else model

        def forward_ours():
            s, n = fwd(inp, pos, seg, targets=tgt)
            return s / n
        return step_parts(model, make_optimizer(model, OptimConfig(), torch.device("cpu")), forward_ours)

    opt_hf = torch.optim.AdamW(hf.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.95),
                               fused=args.hf_optim == "fused")

    def forward_hf():
        return hf(input_ids=x[:, :-1], labels=x[:, :-1]).loss

    parts = {"ours": contestant(ours), "hf": step_parts(hf, opt_hf, forward_hf)}
    if args.unfused:   # the same weights on our plain paths (three q/k/v GEMMs, two gate/up, full logits)
        plain = Llama(cfg).use_fused(False)
        plain.load_state_dict(ours.state_dict())
        parts["ours unfused"] = contestant(plain)
    names = list(parts)

    def step(name):
        for _, f in parts[name]:
            f()

    tokens = args.batch * args.seq
    for name in names:   # warm-up (and compilation)
        step(name)
        step(name)
    rates = {k: [] for k in names}
    cpu = {k: [] for k in names}
    for r in range(args.rounds):
        k = r % len(names)   # rotate who goes first, so load hits all alike
        for name in names[k:] + names[:k]:
            t, c = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                step(name)
            rates[name].append(args.steps * tokens / (time.perf_counter() - t))
            cpu[name].append((time.process_time() - c) / args.steps)
        print(f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:,.0f} tok/s ({cpu[n][-1]:.2f} CPU s/step)" for n in names)
              + "; ours / HF " + ", ".join(f"{rates[n][-1] / rates['hf'][-1]:.2f} ({n})" for n in names if n != "hf"),
              flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    result = {"params": n_params, "seq": args.seq, "batch": args.batch, "threads": args.threads,
              "compile": args.compile, "packed": args.packed, "hf_optim": args.hf_optim, "ours_tokens_per_s": round(med["ours"], 1),
              "hf_tokens_per_s": round(med["hf"], 1), "speedup": round(med["ours"] / med["hf"], 3),
              "per_round": [round(o / h, 3) for o, h in zip(rates["ours"], rates["hf"])],
              "cpu_s_per_step": {k: round(statistics.median(v), 3) for k, v in cpu.items()},
              "rounds": args.rounds, "steps_per_round": args.steps}
    if args.unfused:
        result["unfused_tokens_per_s"] = round(med["ours unfused"], 1)
        result["unfused_speedup"] = round(med["ours unfused"] / med["hf"], 3)
    print(json.dumps(result))
    if args.profile:
        print_table("one step, wall time", {k: phase_seconds(parts[k]) for k in ("ours", "hf")})
        fb = {k: parts[k][0][1] for k in ("ours", "hf")}   # the forward part stores the loss; backward pops it
        print_table("forward + backward, self CPU time", {k: op_seconds(lambda k=k: (fb[k](), parts[k][1][1]())) for k in fb})
    return 0

if __name__ == "__main__":
    sys.exit(main())
