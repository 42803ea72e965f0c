"""Stage `lines`: remove lines repeated across the dataset (cookie banners, navigation, footers).

CCNet's paragraph dedup and RefinedWeb's line-wise corrections: a line whose normalised form
appears in more than `max_line_count` documents (this run and every earlier run into the same
dataset) is boilerplate and is removed from every document. A document left with fewer than
`min_words_left` words is removed (`lines:too_short`; `lines:all_lines_repeated` when nothing is
left), with its original text. Edited documents carry `removed_line_spans` (character offsets of
the removed lines in the text the stage read).

A global stage on the stage contract, out of core:
    scan     per shard: the distinct line hashes of each document, counted (one sorted .npy pair)
    plan     per hash range (partition, in parallel: quipu.tasks.partitions): add the shards' counts
             and the persistent index's, keep the hashes above the limit (`frequent-<p>.npy`);
             memory is one partition, whatever the run; a combine lists the partitions
    process  per shard: look every line up in the frequent hashes (memory-mapped)
    commit   this run's counts become one generation of the dataset's line index
Time is linear in lines; memory is a shard's distinct lines (scan), `partition_rows` (plan) and
the pages of the frequent set a batch touches (process); disk is 12 bytes per distinct line.
"""
from __future__ import annotations

import re
import shutil
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash
from pydantic import BaseModel, Field, field_validator

from quipu.catalog.files import read_json, sha256_file, sha256_json, write_json_atomic
from quipu.catalog.names import check_name
from quipu.tasks.partitions import KeyRange, key_range, key_ranges, n_partitions, save_npy
from quipu.tasks.schema import set_column
from quipu.tasks.per_language import PerLanguage, resolve
from quipu.tasks.stage import Outcome, Shard, Stage, StageConfig, langs_of, snippet, split_by_mask
from quipu.tasks.urls import host_of

NORMALISATION = "ccnet-lower-digits0-nopunct-v1"   # stored in the index: counts only add up under one
REMOVED_SPAN = pa.struct([pa.field("start", pa.int32()), pa.field("end", pa.int32())])
REMOVED_LINE_SPANS = pa.field("removed_line_spans", pa.list_(REMOVED_SPAN))
TOP_LINES = 50           # most frequent removed lines the report shows
TOP_DOMAINS_PER_BATCH = 20

_WORD_CHAR = re.compile(r"\w")


class _NormalisingTable(dict):
    """str.translate table, filled per character on first sight: digits -> 0, punctuation and
    symbols deleted, other whitespace than newline -> space, word characters unchanged."""

    def __missing__(self, cp: int):
        c = chr(cp)
        if c == "\n" or (c != "_" and _WORD_CHAR.match(c) and not c.isdigit()):
            out = c
        elif c.isdigit():
            out = "0"
        else:
            out = " " if c.isspace() else None
        self[cp] = out
        return out


_TABLE = _NormalisingTable()


class LinesConfig(StageConfig):
    max_line_count: PerLanguage(int, ge=1) = Field(10, description="a line found in more documents than this (this run plus the index of earlier runs) is removed from all of them; per language: {default: 10, pt: 20} (by the document's lang)")
    min_words_left: PerLanguage(int, ge=0) = Field(20, description="a document with lines removed and fewer words left is removed (lines:too_short)")
    partition_rows: int = Field(20_000_000, ge=1000, description="line hashes the plan adds up at once (~36 bytes each, 0.7 GB at the default): bounds its memory")
    index: str | None = Field(None, description="name of the persistent line index (default: the curate `dataset`; neither: this run only)")
    backend: str = Field("file", pattern="^(file|none)$", description="file: counts persist between runs of the dataset; none: this run only")
    index_dir: str | None = Field(None, description="folder of the index (default: $QUIPU_HOME/lines/<index>)")

    @field_validator("max_line_count")
    @classmethod
    def _positive(cls, v):
        if any(n is None or n < 1 for n in (v.values() if isinstance(v, dict) else [v])):
            raise ValueError("expected a count of at least 1 (a line index has no `off`: switch the stage off instead)")
        return v

    def lowest_line_count(self) -> int:
        """The smallest per-language limit: the plan keeps every line above it."""
        v = self.max_line_count
        return min(v.values()) if isinstance(v, dict) else v

    @field_validator("index")
    @classmethod
    def _safe(cls, v):
        return None if v is None else check_name(v, "line index name")


def normalise(text: str) -> str:
    """CCNet's normalisation (newlines kept): lower case, digits to 0, no punctuation or symbols."""
    return text.lower().translate(_TABLE)


def line_hashes(text: str) -> list[int]:
    """One 64-bit hash per line of `text` (0 for a line that is empty once normalised); runs of
    spaces count as one."""
    return [xxhash.xxh64_intdigest(n) if (n := " ".join(line.split())) else 0 for line in normalise(text).split("\n")]


# ---- counts on disk: a pair of sorted .npy files (hash uint64, count uint32) ----------------------

class Counts(BaseModel):
    """Sorted distinct hashes and their document counts, as `<prefix>.hash.npy` / `<prefix>.count.npy`."""
    prefix: str
    rows: int

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.load(self.prefix + ".hash.npy", mmap_mode="r"), np.load(self.prefix + ".count.npy", mmap_mode="r"))

    def slice(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """The entries with lo <= hash < hi (hi may be 2^64), read from disk."""
        h, c = self.arrays()
        s = key_range(h, lo, hi)
        return np.array(h[s]), np.array(c[s])

    def sha256(self) -> str:
        return sha256_json([sha256_file(self.prefix + ".hash.npy"), sha256_file(self.prefix + ".count.npy")])

    @staticmethod
    def write(prefix: Path, hashes: np.ndarray, counts: np.ndarray) -> "Counts":
        save_npy(Path(str(prefix) + ".hash.npy"), hashes.astype(np.uint64, copy=False))
        save_npy(Path(str(prefix) + ".count.npy"), counts.astype(np.uint32, copy=False))
        return Counts(prefix=str(prefix), rows=len(hashes))

    def delete(self) -> None:
        for ext in (".hash.npy", ".count.npy"):
            Path(self.prefix + ext).unlink(missing_ok=True)


def add_up(hashes: list[np.ndarray], counts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Sum counts of equal hashes: (sorted distinct hashes, totals)."""
    if not hashes:
        return np.empty(0, np.uint64), np.empty(0, np.uint32)
    h = np.concatenate(hashes)
    c = np.concatenate(counts).astype(np.int64)
    uniq, inverse = np.unique(h, return_inverse=True)
    return uniq, np.bincount(inverse, weights=c, minlength=len(uniq)).astype(np.uint32)


class LinePlan(BaseModel):
    frequent: list[Counts]            # per partition, in hash order
    bounds: list[int]                 # partition p covers bounds[p] <= hash < bounds[p+1]
    run_counts: list[Counts]          # this run's own counts: what commit adds to the index
    fingerprint: str
    lines: int                        # distinct lines in this run
    frequent_lines: int
    index_generations: int
    top: dict[str, int]               # hex hash -> count, the most frequent lines (for the report)


# ---- the persistent index ---------------------------------------------------------------------

class LineIndex:
    """`manifest.json` + one Counts pair per committed run (generation). A run re-executed into the
    same output folder replaces its own generation; commits are serialised by a file lock."""

    def __init__(self, folder: Path):
        self.folder = folder

    def manifest(self) -> dict:
        path = self.folder / "manifest.json"
        m = read_json(path) if path.exists() else {"normalisation": NORMALISATION, "generations": []}
        if m.get("normalisation") != NORMALISATION:
            raise ValueError(f"line index {self.folder} was built with normalisation {m.get('normalisation')!r}, "
                             f"this version uses {NORMALISATION!r}: name another `lines.index`")
        return m

    def visible(self, run_dir: str) -> list[Counts]:
        """The parts of every committed generation but the one of `run_dir` (a rerun's own)."""
        return [Counts(**c) for g in self.manifest()["generations"] if g["run_dir"] != run_dir for c in g["parts"]]

    def commit(self, run_dir: str, parts: list[Counts], docs: int) -> int:
        """Copies this run's counts (already split by hash range) in as a new generation: a file
        copy per part, so memory stays flat; the manifest's atomic write makes it visible."""
        import fcntl
        from quipu.catalog.files import atomic_path
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            m = self.manifest()
            gen = 1 + max((g["gen"] for g in m["generations"]), default=0)
            stored = []
            for i, part in enumerate(parts):
                prefix = self.folder / f"gen-{gen:06d}-{i:04d}"
                for ext in (".hash.npy", ".count.npy"):
                    with atomic_path(str(prefix) + ext) as tmp:
                        shutil.copyfile(part.prefix + ext, tmp)
                stored.append(Counts(prefix=str(prefix), rows=part.rows).model_dump())
            replaced = [g for g in m["generations"] if g["run_dir"] == run_dir]
            m["generations"] = [g for g in m["generations"] if g["run_dir"] != run_dir] + [
                {"gen": gen, "run_dir": run_dir, "docs": docs, "parts": stored}]
            write_json_atomic(self.folder / "manifest.json", m)
            for g in replaced:
                for c in g["parts"]:
                    Counts(**c).delete()
        return gen


# ---- the stage --------------------------------------------------------------------------------

@lru_cache(maxsize=4)
def _frequent(prefixes: tuple[str, ...], fingerprint: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The plan's frequent hashes, memory-mapped once per process and plan (the fingerprint keys the
    cache: a later plan written to the same paths is another plan)."""
    return [Counts(prefix=p, rows=0).arrays() for p in prefixes]


class LineDedup(Stage):
    name = "lines"
    columns = (REMOVED_LINE_SPANS,)
    Config = LinesConfig

    # ---- where things are
    def index(self) -> LineIndex | None:
        cfg = self.config
        name = cfg.index or self.context.dataset
        if cfg.backend == "none" or not (name or cfg.index_dir):
            return None
        from quipu.catalog.db import quipu_home
        return LineIndex(Path(cfg.index_dir) if cfg.index_dir else quipu_home() / "lines" / name)

    def check(self) -> None:
        idx = self.index()
        if idx is not None:
            idx.manifest()   # a wrong normalisation fails before any document is read

    # ---- scan: each shard's distinct lines per document, counted
    def needs_scan(self) -> bool:
        return True

    def scan(self, shard: Shard) -> dict:
        parts, docs = [], 0
        for rb in pq.ParquetFile(shard.path).iter_batches(batch_size=self.config.batch_rows, columns=["text"]):
            for text in rb.column(0).to_pylist():
                hs = set(line_hashes(text))
                hs.discard(0)
                parts.append(np.fromiter(hs, np.uint64, len(hs)))
                docs += 1
        h, c = np.unique(np.concatenate(parts), return_counts=True) if parts else (np.empty(0, np.uint64), np.empty(0))
        counts = Counts.write(self.layout.scratch("_counts") / shard.name, h, c)
        return {"counts": counts.model_dump(), "docs": docs}

    # ---- plan, per hash range in parallel: add up, keep what is above the limit; then combine
    def _counts(self, scans: list | None) -> tuple[list[Counts], list[Counts]]:
        idx = self.index()
        return [Counts(**s["counts"]) for s in scans or []], (idx.visible(self.context.run_dir) if idx is not None else [])

    def plan_partitions(self, scans: list | None) -> list[KeyRange]:
        mine, earlier = self._counts(scans)
        return key_ranges(n_partitions(sum(c.rows for c in mine + earlier), self.config.partition_rows))

    def plan_partition(self, scans: list | None, part: KeyRange) -> dict:
        cfg = self.config
        mine, earlier = self._counts(scans)
        own = [c.slice(part.lo, part.hi) for c in mine]
        run_h, run_c = add_up([h for h, _ in own], [c for _, c in own])
        old = [c.slice(part.lo, part.hi) for c in earlier]
        all_h, all_c = add_up([run_h] + [h for h, _ in old], [run_c] + [c for _, c in old])
        keep = all_c > cfg.lowest_line_count()
        freq_h, freq_c = all_h[keep], all_c[keep]
        out = self.layout.scratch("_plan")
        top = []
        if len(freq_c):
            k = min(TOP_LINES, len(freq_c))
            best = np.argpartition(-freq_c.astype(np.int64), k - 1)[:k]
            top = [(int(freq_c[i]), int(freq_h[i])) for i in best]
        return {"frequent": Counts.write(out / f"frequent-{part.p:04d}", freq_h, freq_c).model_dump(),
                "run": Counts.write(out / f"run-{part.p:04d}", run_h, run_c).model_dump(),
                "lo": part.lo, "lines": len(run_h), "frequent_lines": len(freq_h), "top": top,
                "index_generations": len(earlier)}

    def combine(self, scans: list | None, partials: list[dict]) -> LinePlan:
        frequent = [Counts(**p["frequent"]) for p in partials]
        top = sorted((tuple(t) for p in partials for t in p["top"]), key=lambda x: (-x[0], x[1]))[:TOP_LINES]
        fp = sha256_json({"frequent": [c.sha256() for c in frequent], "limit": self.config.max_line_count})
        return LinePlan(frequent=frequent, bounds=[p["lo"] for p in partials],
                        run_counts=[Counts(**p["run"]) for p in partials], fingerprint=fp,
                        lines=sum(p["lines"] for p in partials), frequent_lines=sum(p["frequent_lines"] for p in partials),
                        index_generations=partials[0]["index_generations"] if partials else 0,
                        top={f"{h:016x}": n for n, h in top})

    def fingerprint(self, shard_plan: LinePlan) -> dict:
        return {"frequent": shard_plan.fingerprint}

    def lookup(self, plan: LinePlan, hashes: np.ndarray) -> np.ndarray:
        """Each hash's count if it is frequent, else 0."""
        parts = _frequent(tuple(c.prefix for c in plan.frequent), plan.fingerprint)
        which = np.searchsorted(np.array(plan.bounds, dtype=np.uint64), hashes, side="right") - 1
        found = np.zeros(len(hashes), np.int64)
        for p, (fh, fc) in enumerate(parts):
            sel = np.nonzero(which == p)[0]
            if len(sel) == 0 or len(fh) == 0:
                continue
            pos = np.minimum(np.searchsorted(fh, hashes[sel]), len(fh) - 1)
            hit = fh[pos] == hashes[sel]
            found[sel[hit]] = fc[pos[hit]]
        return found

    # ---- process: drop the frequent lines of every document
    def process(self, batch: pa.Table, shard_plan: LinePlan = None) -> Outcome:
        cfg = self.config
        texts = batch.column("text").to_pylist()
        per_doc = [line_hashes(t) for t in texts]
        flat = np.fromiter((h for hs in per_doc for h in hs), np.uint64)
        counts = self.lookup(shard_plan, flat) if len(flat) else np.zeros(0, np.int64)
        counts[flat == 0] = 0
        urls = batch.column("url").to_pylist() if "url" in batch.column_names else [None] * len(texts)
        sources = batch.column("source").to_pylist() if "source" in batch.column_names else [None] * len(texts)
        langs = langs_of(batch, None)
        new_texts, spans_col, keep, reasons = [], [], [], []
        stats = {"lines_removed": 0, "docs_edited": 0, "chars_removed": 0, "top_lines": {}}
        by_domain: dict[str, int] = {}
        i = 0
        for text, hs, url, source, lang in zip(texts, per_doc, urls, sources, langs):
            doc_counts = counts[i:i + len(hs)]
            i += len(hs)
            if isinstance(cfg.max_line_count, dict):   # the plan kept lines above the lowest limit
                doc_counts = np.where(doc_counts > resolve(cfg.max_line_count, lang), doc_counts, 0)
            if not doc_counts.any():
                new_texts.append(text); spans_col.append([]); keep.append(True); reasons.append(None)
                continue
            lines = text.split("\n")
            kept_lines, spans, pos = [], [], 0
            for line, h, n in zip(lines, hs, doc_counts):
                end = pos + len(line) + 1
                if n:
                    spans.append({"start": pos, "end": min(end, len(text))})
                    if f"{h:016x}" in shard_plan.top:
                        slot = stats["top_lines"].setdefault(f"{h:016x}", {"removed": 0, "line": snippet(line, 120)})
                        slot["removed"] += 1
                else:
                    kept_lines.append(line)
                pos = end
            new_text = "\n".join(kept_lines).strip("\n")
            removed_chars = len(text) - len(new_text)
            domain = host_of(url) if url else f"source:{Path(source or '?').name}"
            by_domain[domain] = by_domain.get(domain, 0) + len(text.encode()) - len(new_text.encode())
            stats["lines_removed"] += len(spans)
            stats["docs_edited"] += 1
            stats["chars_removed"] += removed_chars
            words_left = len(new_text.split())
            if words_left == 0 or words_left < resolve(cfg.min_words_left, lang, 0):
                new_texts.append(text)
                reasons.append("lines:all_lines_repeated" if words_left == 0 else "lines:too_short")
                keep.append(False)
            else:
                new_texts.append(new_text); keep.append(True); reasons.append(None)
            spans_col.append(spans)
        stats["edits"] = {"documents edited": stats["docs_edited"], "lines removed": stats["lines_removed"]}
        top_domains = sorted(by_domain.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_DOMAINS_PER_BATCH]
        stats["bytes_removed_by_domain"] = dict(top_domains)
        batch = set_column(batch, pa.field("text", pa.string(), nullable=False), new_texts)
        batch = set_column(batch, REMOVED_LINE_SPANS, pa.array(spans_col, REMOVED_LINE_SPANS.type))
        kept, removed = split_by_mask(batch, keep, reasons)
        return Outcome(kept, removed, stats)

    # ---- commit: this run's counts join the dataset's index
    def commit(self, scans: list | None, plan: LinePlan) -> dict | None:
        idx = self.index()
        if idx is None:
            return None
        gen = idx.commit(self.context.run_dir, plan.run_counts, sum(s["docs"] for s in scans or []))
        return {"index": str(idx.folder), "generation": gen}

    def finalize(self, stats: dict, scans, plan: LinePlan, committed) -> dict:
        top = stats.pop("top_lines", {})
        stats["top_removed_lines"] = [
            {"line": top[h]["line"], "documents": plan.top[h], "removed_here": top[h]["removed"]}
            for h in sorted(top, key=lambda h: (-plan.top[h], h))][:20]
        domains = stats.pop("bytes_removed_by_domain", {})
        stats["top_domains_by_bytes_removed"] = dict(sorted(domains.items(), key=lambda kv: (-kv[1], kv[0]))[:20])
        stats.update(distinct_lines=plan.lines, frequent_lines=plan.frequent_lines, partitions=len(plan.frequent),
                     index_generations_read=plan.index_generations, index=committed)
        return stats
