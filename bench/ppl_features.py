"""Cache the teacher's states for the frozen-feature study of issue 20 (bench/RESULTS.md, "Which layers").

One teacher pass over bench/out/ppl/labelled-all.jsonl (first 128 tokens, as labelled) writes, per
document and per position j >= 1 (the token the teacher scores): the token id, the teacher's NLL of it,
the log-normaliser of the teacher's next-token distribution at j - 1, and the hidden states after
decoder layers 1, 2, 4 and the final (normed) state at j - 1 and j, as float16 memmaps. A process
handles documents i with i % parts == part, so two 1-thread processes share the machine.

    python bench/ppl_features.py --part 0 --parts 2 & python bench/ppl_features.py --part 1 --parts 2

`--extend 6,8,12` runs only the teacher's layers 5.. on the cached layer-4 states (`--from-layer`;
same positions, same causal attention) and writes those layers' states too: the depth curve for a
few minutes.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from quipu.trainer.teacher import Teacher, TeacherSettings
from quipu.scoring.wayra import length_batches, pad_batch

OUT = Path(__file__).parent / "out" / "ppl" / "feats"
LAYERS = (1, 2, 4)          # decoder layers whose outputs are kept; "final" is the normed last state


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", default=str(Path(__file__).parent / "out" / "ppl" / "labelled-all.jsonl"))
    ap.add_argument("--part", type=int, default=0)
    ap.add_argument("--parts", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--extend", default=None, help="comma-separated deeper layers computed from a cached layer's states")
    ap.add_argument("--from-layer", type=int, default=4, help="with --extend: the cached layer to start from")
    args = ap.parse_args()
    if args.extend:
        return extend(args, [int(x) for x in args.extend.split(",")])
    torch.manual_seed(0)
    docs = [json.loads(line) for line in open(args.input)]
    mine = [i for i in range(len(docs)) if i % args.parts == args.part]
    teacher = Teacher(None, TeacherSettings(max_tokens=128, bf16=True, threads=args.threads))
    model = teacher.model
    base = getattr(model, model.base_model_prefix)
    seqs = teacher.encode([docs[i]["text"] for i in mine])
    n_pos = sum(len(s) for s in seqs)        # positions incl. BOS; targets are n_pos - len(seqs)
    width = base.config.hidden_size
    names = [f"h{layer}" for layer in LAYERS] + ["final"]
    mm = {k: np.lib.format.open_memmap(OUT / f"{k}-{args.part}.npy", mode="w+", dtype=np.float16, shape=(n_pos, width))
          for k in names}
    ids_all = np.zeros(n_pos, dtype=np.int32)
    nll_all = np.zeros(n_pos, dtype=np.float32)     # NLL of token at position j (0 at BOS)
    lse_all = np.zeros(n_pos, dtype=np.float32)     # log-normaliser at position j (predicts j + 1)
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(s) for s in seqs])
    t0, done = time.time(), 0
    pad = teacher.tokenizer.pad_token_id or 0
    for idx in length_batches([len(s) for s in seqs], args.batch):
        ids, mask = pad_batch([seqs[i] for i in idx], pad)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = base(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            states = {f"h{layer}": out.hidden_states[layer] for layer in LAYERS}
            states["final"] = out.last_hidden_state
            logits = model.get_output_embeddings()(out.last_hidden_state).float()
        lse = torch.logsumexp(logits, dim=-1)
        nll = lse[:, :-1] - logits[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        for r, i in enumerate(idx):
            a, n = offsets[i], len(seqs[i])
            for k in names:
                mm[k][a:a + n] = states[k][r, :n].float().numpy().astype(np.float16)
            ids_all[a:a + n] = seqs[i]
            nll_all[a + 1:a + n] = nll[r, :n - 1].numpy()
            lse_all[a:a + n] = lse[r, :n].numpy()
        done += len(idx)
        if done % 400 < len(idx):
            print(f"part {args.part}: {done}/{len(seqs)} docs, {done / (time.time() - t0):.1f} docs/s", flush=True)
    for k in names:
        mm[k].flush()
    np.savez(OUT / f"meta-{args.part}.npz", ids=ids_all, nll=nll_all, lse=lse_all, offsets=offsets,
             doc_index=np.array(mine))
    print(f"part {args.part}: done, {len(seqs)} docs in {time.time() - t0:.0f}s", flush=True)


def extend(args, layers: list[int]) -> None:
    """Run decoder layers from_layer+1..max(layers) over the cached states of this part."""
    from transformers.masking_utils import create_causal_mask
    teacher = Teacher(None, TeacherSettings(max_tokens=128, bf16=True, threads=args.threads))
    base = getattr(teacher.model, teacher.model.base_model_prefix)
    meta = np.load(OUT / f"meta-{args.part}.npz")
    offsets = meta["offsets"]
    h4 = np.load(OUT / f"h{args.from_layer}-{args.part}.npy", mmap_mode="r")   # the starting states
    mm = {k: np.lib.format.open_memmap(OUT / f"h{k}-{args.part}.npy", mode="w+", dtype=np.float16, shape=h4.shape)
          for k in layers}
    lengths = [int(offsets[i + 1] - offsets[i]) for i in range(len(offsets) - 1)]
    t0, done = time.time(), 0
    for idx in length_batches(lengths, args.batch):
        width = max(lengths[i] for i in idx)
        x = torch.zeros((len(idx), width, h4.shape[1]))
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for r, i in enumerate(idx):
            x[r, :lengths[i]] = torch.from_numpy(np.asarray(h4[offsets[i]:offsets[i + 1]], dtype=np.float32))
            mask[r, :lengths[i]] = 1
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            pos = torch.arange(width)[None].expand(len(idx), -1)
            rope = base.rotary_emb(x, pos)
            causal = create_causal_mask(config=base.config, inputs_embeds=x, attention_mask=mask,
                                        cache=None, position_ids=pos)
            for n, layer in enumerate(base.layers[args.from_layer:max(layers)], start=args.from_layer + 1):
                x = layer(x, attention_mask=causal, position_ids=pos, position_embeddings=rope)
                x = x[0] if isinstance(x, tuple) else x
                if n in mm:
                    for r, i in enumerate(idx):
                        mm[n][offsets[i]:offsets[i + 1]] = x[r, :lengths[i]].float().numpy().astype(np.float16)
        done += len(idx)
        if done % 800 < len(idx):
            print(f"part {args.part}: {done}/{len(lengths)} docs, {done / (time.time() - t0):.1f} docs/s", flush=True)
    for k in layers:
        mm[k].flush()


if __name__ == "__main__":
    main()
