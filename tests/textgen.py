"""Real English prose available on every machine (Python's own documentation topics), cut into
documents, for tests that must run without ../shared."""
from __future__ import annotations

import json
import random
from pathlib import Path


def python_doc_paragraphs(min_chars: int = 200) -> list[str]:
    import pydoc_data.topics as topics
    paras = []
    for key in sorted(topics.topics):
        for p in topics.topics[key].split("\n\n"):
            p = " ".join(p.split())
            if len(p) >= min_chars and p.count(" ") > 30:
                paras.append(p)
    return paras


def make_docs(n: int, seed: int = 0, paras_per_doc: int = 4) -> list[dict]:
    paras = python_doc_paragraphs()
    rng = random.Random(seed)
    return [{"id": f"doc-{seed}-{i}", "text": "\n\n".join(rng.sample(paras, paras_per_doc)), "url": f"https://example.org/{i}"}
            for i in range(n)]


def write_jsonl(path: Path, docs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for d in docs:
            fh.write(json.dumps(d) + "\n")
    return path
