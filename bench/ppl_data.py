"""Train / held-out JSONL samples for the perplexity distillation benchmark, from ../shared/data/text.

Deterministic: per source file, documents in en/es/pt are ordered by a hash of their id; the first
`--heldout-per-file` (at most a fifth of the file) go to heldout.jsonl, the next `--train-per-file`
to train.jsonl (disjoint, same sources). Written under bench/out/ppl/ (gitignored); the shared data
is never copied into the repo.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from quipu.catalog.files import write_bytes_atomic  # noqa: E402

LANGS = {"en", "es", "pt"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared/data/text"))
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "out/ppl"))
    ap.add_argument("--train-per-file", type=int, default=1500)
    ap.add_argument("--heldout-per-file", type=int, default=50)
    args = ap.parse_args()
    train, held = [], []
    for f in sorted(Path(args.data).glob("*.jsonl")):
        docs = [d for d in map(json.loads, f.open()) if d.get("lang") in LANGS and d.get("text", "").strip()]
        docs.sort(key=lambda d: hashlib.sha256(f"{f.name}:{d['id']}".encode()).hexdigest())
        # held-out first, so that a larger --train-per-file never changes the held-out set
        n_held = min(args.heldout_per_file, len(docs) // 5)
        held += docs[:n_held]
        train += docs[n_held:n_held + args.train_per_file]
    out = Path(args.out)
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", held)):
        write_bytes_atomic(out / name, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in rows).encode())
        print(f"{out / name}: {len(rows)} documents")


if __name__ == "__main__":
    main()
