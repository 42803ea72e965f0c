"""Which benchmark documents already have teacher labels in the catalog cache (no teacher run).

Writes bench/out/ppl/<name>.labelled.jsonl with the documents of bench/out/ppl/<name>.jsonl whose
SmolLM2 label (first --max-tokens tokens) is cached. Used when the CPU budget for labelling ran out
before every document was labelled: the distillation and the evaluation then use exactly these.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QUIPU_HOME", str(ROOT / "bench" / "out" / "quipu"))


def main() -> None:
    from catalog.files import write_bytes_atomic
    from catalog.registry import kv_get_many
    from trainer.teacher import LABEL_NAMESPACE, default_teacher_path, teacher_fingerprint, text_hash
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="+", help="train, heldout")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--split", type=float, default=None,
                    help="also pool the labelled documents of all names and split them by a hash of the id: "
                         "this fraction to labelled-heldout.jsonl, the rest to labelled-train.jsonl")
    args = ap.parse_args()
    pooled = []
    fp = teacher_fingerprint(Path(default_teacher_path()))
    for name in args.names:
        src = ROOT / "bench" / "out" / "ppl" / f"{name}.jsonl"
        docs = [json.loads(line) for line in src.open()]
        keys = [f"{fp}:{args.max_tokens}:{text_hash(d['text'])}" for d in docs]
        have = kv_get_many(LABEL_NAMESPACE, keys)
        keep = [d for d, k in zip(docs, keys) if have.get(k) is not None]
        out = src.with_name(f"{name}.labelled.jsonl")
        write_bytes_atomic(out, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in keep).encode())
        print(f"{out}: {len(keep)} of {len(docs)} documents labelled")
        pooled += keep
    if args.split:
        import hashlib
        held = lambda d: int(hashlib.sha256(f"split:{d['source']}:{d['id']}".encode()).hexdigest()[:8], 16) < args.split * 16**8
        base = ROOT / "bench" / "out" / "ppl"
        for name, rows in (("labelled-train", [d for d in pooled if not held(d)]), ("labelled-heldout", [d for d in pooled if held(d)])):
            write_bytes_atomic(base / f"{name}.jsonl", "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in rows).encode())
            print(f"{base / name}.jsonl: {len(rows)} documents")


if __name__ == "__main__":
    main()
