"""Stage `decontam`: remove evaluation-set text (GSM8K, HumanEval, MMLU, ...) from the corpus.

Benchmarks come from the YAML registry (quipu.tasks.benchmarks). Their text is normalised and every
item's word n-grams (n = 13 by default) are hashed into ONE index across all benchmarks
(quipu.tasks.benchmark_index); fields shorter than `min_short_words` (e.g. `return x`) are too
common to match safely and are counted in the index instead.

Scanning is batched: a shard batch is normalised and split into words in one pass (polars' regex
over the whole batch), words become 64-bit hashes through the index's vocabulary (a word no
benchmark has gets 0 and no window through it can match), window hashes are computed with numpy
for the whole batch at once and looked up by binary search in the sorted keys. The cost per
document is a hash per window whatever the number of benchmarks. Only documents with a hit are
tokenised again with character offsets, to report and cut the matched spans.

Policies: `drop` removes a document with a hit (reason `contaminated:<benchmark>`, the benchmark
with the most matched words); `cut` removes the matched spans plus `cut_margin_words` on each side
and keeps the rest, recording what was cut in `decontam_cuts` (a document left with fewer than
`min_words_after_cut` words is dropped). Every row gets `decontam_hits`: a list of structs
{benchmark, item, start, end, words} (character offsets in the text as the stage read it).

The index is built once per benchmark set and cached on disk under a key made of the benchmark
files' SHA-256, the fields and the matching parameters; a changed benchmark file gives a new key,
and the key is part of the stage fingerprint, so finished shards are redone against the new version.
"""
from __future__ import annotations

import sys
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from quipu.tasks.benchmark_index import CHUNK, BenchmarkIndex, index_key, layout, split_words
from quipu.tasks.benchmarks import load_benchmarks
from quipu.tasks.schema import set_column
from quipu.tasks.stage import Outcome, RunContext, Stage, StageConfig, module_version, snippet, split_by_mask

EXAMPLES_PER_BENCHMARK = 3
# Nested Arrow types, not JSON strings: polars, duckdb and `datasets` query them directly
# (e.g. `pl.col("decontam_hits").list.len() > 0`).
HIT = pa.struct([pa.field("benchmark", pa.string()), pa.field("item", pa.string()),
                 pa.field("start", pa.int32()), pa.field("end", pa.int32()), pa.field("words", pa.int32())])
CUT = pa.struct([pa.field("start", pa.int32()), pa.field("end", pa.int32()), pa.field("text", pa.string())])
HITS = pa.field("decontam_hits", pa.list_(HIT))
CUTS = pa.field("decontam_cuts", pa.list_(CUT))

class DecontamConfig(StageConfig):
    benchmarks: list[str] = Field(default_factory=lambda: ["humaneval"], min_length=1,
                                  description="registry names (configs/benchmarks/<name>.yaml) or paths of benchmark YAML files")
    registry_dir: str | None = Field(None, description="directory of benchmark YAML files; default: configs/benchmarks")
    n: int = Field(13, ge=3, le=64, description="n-gram length in words")
    min_short_words: int = Field(8, ge=1, description="fields shorter than n words are matched whole if they have at least this many words")
    policy: Literal["drop", "cut"] = Field("drop", description="drop the document, or cut the matched spans and keep the rest")
    cut_margin_words: int = Field(5, ge=0, description="words removed on each side of a matched span (policy cut)")
    min_words_after_cut: int = Field(20, ge=0, description="a cut document left with fewer words is dropped")
    cache_dir: str | None = Field(None, description="where built indexes are kept; default $QUIPU_CACHE/decontam ($QUIPU_HOME/cache)")

    @model_validator(mode="after")
    def _check(self):
        if self.min_short_words > self.n:
            raise ValueError(f"min_short_words ({self.min_short_words}) must not exceed n ({self.n})")
        if len(set(self.benchmarks)) != len(self.benchmarks):
            raise ValueError("benchmarks: a benchmark is listed twice")
        return self


# ---- building once, caching --------------------------------------------------------------------

_INDEXES: dict[str, BenchmarkIndex] = {}
_LOCK = threading.Lock()


def cache_dir(cfg: DecontamConfig) -> Path:
    if cfg.cache_dir:
        return Path(cfg.cache_dir)
    from quipu.catalog.db import cache_home
    return cache_home() / "decontam"


def get_index(cfg: DecontamConfig) -> BenchmarkIndex:
    """The index of `cfg.benchmarks`: from memory, else from the disk cache, else built and saved."""
    benchmarks = load_benchmarks(cfg.benchmarks, cfg.registry_dir)
    key = index_key(benchmarks, cfg.n, cfg.min_short_words)
    with _LOCK:
        index = _INDEXES.get(key)
        if index is None:
            directory = cache_dir(cfg)
            index = BenchmarkIndex.load(directory, key)
            if index is not None:  # same contents; report where the files are now
                index.benchmarks = [b.describe() for b in sorted(benchmarks, key=lambda b: b.name)]
            else:
                index = BenchmarkIndex.build(benchmarks, cfg.n, cfg.min_short_words, key)
                index.save(directory)
            _INDEXES[key] = index
    return index


# ---- finding hits in documents ----------------------------------------------------------------

@dataclass
class Hit:
    benchmark: str
    item: str
    start: int          # character offsets in the document
    end: int
    words: int          # matched words


@dataclass
class DocMatches:
    hits: list[Hit]
    cut_spans: list[tuple[int, int]]   # merged character spans to cut (matches plus margin)


class Matcher:
    """Finds benchmark text in batches of documents with one `BenchmarkIndex`."""

    def __init__(self, index: BenchmarkIndex, margin_words: int = 0):
        self.index = index
        self.margin = margin_words

    def candidates(self, texts: list[str]) -> list[int]:
        """Documents with at least one match (fast: whole batch, no character offsets)."""
        words, parents = split_words(texts)
        h = np.zeros(len(words) + len(texts), np.uint64)
        h[layout(parents)] = self.index.hashes(words)
        starts, _, _ = self.index.matches(h)
        if len(starts) == 0:
            return []
        doc_first = np.concatenate([[0], np.cumsum(np.bincount(parents, minlength=len(texts)) + 1)[:-1]])
        return sorted(set((np.searchsorted(doc_first, starts, side="right") - 1).tolist()))

    def find(self, texts: list[str]) -> list[DocMatches]:
        """Hits with character spans for each document (run on the candidates only)."""
        chunk_doc, chunk_start, chunk_end, chunk_text = [], [], [], []
        for d, t in enumerate(texts):
            for m in CHUNK.finditer(t):
                a, b = _word_span(m.group())   # the span without the punctuation around the word
                chunk_doc.append(d); chunk_start.append(m.start() + a); chunk_end.append(m.start() + b)
                chunk_text.append(m.group())
        words, wchunk = split_words(chunk_text)
        chunk_doc = np.asarray(chunk_doc, np.int64)
        wdoc = chunk_doc[wchunk] if len(wchunk) else np.zeros(0, np.int64)
        pos = layout(wdoc)
        h = np.zeros(len(words) + len(texts), np.uint64)
        h[pos] = self.index.hashes(words)
        starts, lengths, items = self.index.matches(h)
        word_at = np.full(len(h), -1, np.int64)
        word_at[pos] = np.arange(len(words))
        w_start = np.asarray(chunk_start, np.int64)[wchunk] if len(wchunk) else np.zeros(0, np.int64)
        w_end = np.asarray(chunk_end, np.int64)[wchunk] if len(wchunk) else np.zeros(0, np.int64)
        doc_words = np.bincount(wdoc, minlength=len(texts))
        doc_first_word = np.concatenate([[0], np.cumsum(doc_words)[:-1]])

        per_doc: dict[int, dict[int, list[tuple[int, int]]]] = {}
        for s, ln, it in zip(starts.tolist(), lengths.tolist(), items.tolist()):
            w0 = int(word_at[s])
            per_doc.setdefault(int(wdoc[w0]), {}).setdefault(it, []).append((w0, w0 + ln))
        out = []
        names = self.index.bench_names
        for d in range(len(texts)):
            by_item = per_doc.get(d, {})
            hits, all_spans = [], []
            for it, spans in by_item.items():
                for a, b in _merge(spans):
                    hits.append(Hit(names[self.index.item_bench[it]], self.index.item_ids[it],
                                    int(w_start[a]), int(w_end[b - 1]), b - a))
                    all_spans.append((a, b))
            hits.sort(key=lambda x: (x.start, x.end, x.benchmark, x.item))
            lo, hi = doc_first_word[d], doc_first_word[d] + doc_words[d]
            cut = [_widen(texts[d], int(w_start[max(lo, a - self.margin)]), int(w_end[min(hi, b + self.margin) - 1]))
                   for a, b in _merge(all_spans)]
            out.append(DocMatches(hits, _merge(cut)))
        return out


def _word_span(chunk: str) -> tuple[int, int]:
    """Offsets of the first and last letter/digit (or mark) of a chunk: "(today?" -> "today"."""
    def word_char(c: str) -> bool:
        return c.isalnum() or unicodedata.category(c)[0] == "M"
    a = next((i for i, c in enumerate(chunk) if word_char(c)), 0)
    b = next((i + 1 for i in range(len(chunk) - 1, -1, -1) if word_char(chunk[i])), len(chunk))
    return (a, b) if a < b else (0, len(chunk))


def _widen(text: str, a: int, b: int) -> tuple[int, int]:
    """A cut span grown over the punctuation touching it (`"`, `?`, `)`), up to whitespace or a word."""
    while a > 0 and not text[a - 1].isspace() and not text[a - 1].isalnum():
        a -= 1
    while b < len(text) and not text[b].isspace() and not text[b].isalnum():
        b += 1
    return a, b


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def cut_text(text: str, spans: list[tuple[int, int]]) -> tuple[str, list[dict]]:
    """`text` without the character spans; a cut becomes one line break between what remains."""
    pieces, cuts, last = [], [], 0
    for a, b in spans:
        pieces.append(text[last:a])
        cuts.append({"start": a, "end": b, "text": text[a:b]})
        last = b
    pieces.append(text[last:])
    kept = [p.strip(" \t") for p in pieces]
    return "\n".join(p for p in kept if p.strip()).strip(), cuts


def _dominant(hits: list[Hit]) -> str:
    words: dict[str, int] = {}
    for h in hits:
        words[h.benchmark] = words.get(h.benchmark, 0) + h.words
    return min(words, key=lambda b: (-words[b], b))


# ---- the stage --------------------------------------------------------------------------------

class Decontaminate(Stage):
    name = "decontam"
    columns = (HITS, CUTS)
    Config = DecontamConfig

    def __init__(self, config: DecontamConfig, context: RunContext | None = None, index: BenchmarkIndex | None = None):
        super().__init__(config, context)
        self._index = index

    @property
    def index(self) -> BenchmarkIndex:
        if self._index is None:   # built once per process and benchmark set (get_index caches it)
            self._index = get_index(self.config)
        return self._index

    def check(self) -> None:
        """Read and check every benchmark file and build (or load) the index: a missing or empty
        file, or a declared field absent, fails here naming the file and field."""
        self.index

    def code_version(self) -> str:
        return module_version(sys.modules[__name__], sys.modules["quipu.tasks.benchmark_index"])

    def fingerprint(self, shard_plan) -> dict:
        # The benchmark versions are part of what a finished shard was checked against.
        return {"index": self.index.key}

    def commit(self, scans, plan) -> dict:
        """Record each benchmark file (path, items, SHA-256) in the catalog as a `benchmark` dataset."""
        from quipu.catalog import registry
        for b in self.index.benchmarks:
            registry.register_dataset(b["name"], "benchmark", b["path"], self.context.run_id,
                                      [{"path": b["path"], "rows": b["items"], "bytes": b["bytes"], "sha256": b["sha256"]}],
                                      info={**b, "index": self.index.key,
                                            "skipped_fields": self.index.skipped_fields.get(b["name"], 0)})
        return {"benchmarks": len(self.index.benchmarks)}

    def finalize(self, stats: dict, scans, plan, committed) -> dict:
        # shard lists are concatenated in shard order: keep the first examples per benchmark
        for bench, examples in stats.get("example_matches", {}).items():
            stats["example_matches"][bench] = examples[:EXAMPLES_PER_BENCHMARK]
        return stats

    @property
    def matcher(self) -> Matcher:
        if not hasattr(self, "_matcher"):
            cfg = self.config
            self._matcher = Matcher(self.index, cfg.cut_margin_words if cfg.policy == "cut" else 0)
        return self._matcher

    def process(self, batch: pa.Table, shard_plan=None) -> Outcome:
        cfg = self.config
        texts = batch.column("text").to_pylist()
        cand = self.matcher.candidates(texts) if texts else []
        found = self.matcher.find([texts[i] for i in cand]) if cand else []
        by_doc = dict(zip(cand, found))

        ids = batch.column("id").to_pylist()
        changed = False
        hits_col, cuts_col, keep, reasons = [], [], [], []
        stats = _Stats(self.index)
        for i in range(batch.num_rows):
            m = by_doc.get(i)
            if m is None or not m.hits:
                hits_col.append([]); cuts_col.append([]); keep.append(True); reasons.append(None)
                continue
            text = texts[i]
            hits_col.append([h.__dict__ for h in m.hits])
            bench = _dominant(m.hits)
            stats.contaminated(ids[i], text, m.hits)
            if cfg.policy == "cut":
                rest, cuts = cut_text(text, m.cut_spans)
                cuts_col.append(cuts)
                if len(split_words([rest])[0]) >= max(1, cfg.min_words_after_cut):
                    texts[i], changed = rest, True
                    keep.append(True); reasons.append(None)
                    stats.cut(m.hits, sum(b - a for a, b in m.cut_spans))
                    continue
            else:
                cuts_col.append([])
            keep.append(False); reasons.append(f"contaminated:{bench}")

        if changed:
            batch = set_column(batch, batch.schema.field("text"), pa.array(texts, pa.string()))
        batch = set_column(set_column(batch, HITS, pa.array(hits_col, HITS.type)), CUTS, pa.array(cuts_col, CUTS.type))
        kept, removed = split_by_mask(batch, keep, reasons)
        return Outcome(kept, removed, stats.as_dict())


class _Stats:
    """Per-shard counters: contaminated documents per benchmark, items hit, example matches."""

    def __init__(self, index: BenchmarkIndex):
        self.index = index
        self.docs: dict[str, int] = {}
        self.items: dict[str, dict[str, int]] = {}
        self.examples: dict[str, list[dict]] = {}
        self.cut_docs: dict[str, int] = {}
        self.cut_chars = 0

    def contaminated(self, doc_id: str, text: str, hits: list[Hit]) -> None:
        for bench in sorted({h.benchmark for h in hits}):
            self.docs[bench] = self.docs.get(bench, 0) + 1
        for bench, item in sorted({(h.benchmark, h.item) for h in hits}):
            slot = self.items.setdefault(bench, {})
            slot[item] = slot.get(item, 0) + 1
        for h in hits:
            ex = self.examples.setdefault(h.benchmark, [])
            if len(ex) < EXAMPLES_PER_BENCHMARK and all(e["doc"] != doc_id for e in ex):
                ex.append({"doc": doc_id, "item": h.item, "span": snippet(text[h.start:h.end])})

    def cut(self, hits: list[Hit], chars: int) -> None:
        for bench in sorted({h.benchmark for h in hits}):
            self.cut_docs[bench] = self.cut_docs.get(bench, 0) + 1
        self.cut_chars += chars

    def as_dict(self) -> dict:
        # Strings only under `benchmarks`: shard stats are summed, strings are carried over.
        return {"contaminated_docs": self.docs, "cut_docs": self.cut_docs, "cut_chars": self.cut_chars,
                "items_hit": self.items, "example_matches": self.examples, "index": self.index.key,
                "benchmarks": {b["name"]: {"path": b["path"], "sha256": b["sha256"], "spec": str(b["spec"]),
                                           "fields": ", ".join(b["fields"])} for b in self.index.benchmarks}}
