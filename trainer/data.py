"""Blends, phases and the packed-sequence data stream.

A training config names sources (catalog datasets) with a `weight` (share of the phase's tokens)
or an `epochs` multiplier (like K2's table: a high-quality source 6x, code 0.5x; the multipliers
become shares `epochs·size / Σ epochs·size`). Phases run in sequence, each starting at a step or at
the step where the learning rate has decayed to a fraction of its peak (the continued pre-training
recipe: general blend, then the target blend from LR = 20 % of peak).

Each phase is laid out once, deterministically from the seed, as one list of documents: every
source's documents in a fresh random order per epoch, taken until the source's share of the phase's
tokens is covered; the list is then shuffled (or, for a curriculum, sorted by ascending
`ppl_wayra`; the shuffled list is the random-order control). Sequence j of a phase is tokens
[j·L, j·L + L + 1) of the concatenation. Nothing is stateful: the data position is the step, so
resuming, data-parallel ranks and gradient accumulation all index the same stream.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from quipu.catalog.errors import UserError
from quipu.trainer.tokenize import TokenShards

WEIGHT_TOLERANCE = 1e-6


class BlendError(UserError, ValueError):
    """A blend or phase that cannot be trained; the message names the config key."""


class SourceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dataset: str = Field(description="catalog dataset name (a curated dataset)")
    weight: float | None = Field(None, gt=0, description="share of the phase's tokens (weights of a phase sum to 1)")
    epochs: float | None = Field(None, gt=0, description="epoch multiplier (alternative to weight)")

    @model_validator(mode="after")
    def _one(self):
        if (self.weight is None) == (self.epochs is None):
            raise ValueError(f"source {self.dataset!r}: give exactly one of weight or epochs")
        return self


class PhaseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "main"
    sources: list[SourceSpec] = Field(min_length=1)
    start_step: int | None = Field(None, ge=0, description="the step this phase starts at")
    start_lr_fraction: float | None = Field(None, gt=0, lt=1, description="...or the step where LR has decayed to this fraction of its peak")
    order: Literal["shuffle", "ppl_wayra"] = Field("shuffle", description="ppl_wayra: curriculum, ascending perplexity; shuffle: random order (the control)")

    @model_validator(mode="after")
    def _blend(self):
        if self.start_step is not None and self.start_lr_fraction is not None:
            raise ValueError(f"phase {self.name!r}: give start_step or start_lr_fraction, not both")
        kinds = {s.weight is None for s in self.sources}
        if len(kinds) > 1:
            raise ValueError(f"phase {self.name!r}: sources mix weight and epochs; use one kind per phase")
        if self.sources[0].weight is not None:
            total = sum(s.weight for s in self.sources)
            if abs(total - 1.0) > WEIGHT_TOLERANCE:
                raise ValueError(f"phase {self.name!r}: source weights sum to {total:g}, not 1")
        names = [s.dataset for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"phase {self.name!r}: a source is listed twice")
        return self


class DataConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seq_len: int = Field(256, gt=1)
    phases: list[PhaseSpec] = Field(min_length=1)
    eval_docs_per_source: int = Field(16, ge=1, description="held-out documents per source (at most 10 % of it)")
    tokens_dir: str | None = Field(None, description="where token shards go (default RUN_DIR/tokens); reused across runs")
    workers: int = Field(2, ge=1, description="shards tokenized in parallel")

    @model_validator(mode="after")
    def _phases(self):
        first = self.phases[0]
        if first.start_lr_fraction is not None or (first.start_step or 0) != 0:
            raise ValueError("data.phases[0] starts at step 0 (leave start_step out or set 0)")
        for i, p in enumerate(self.phases[1:], 1):
            if p.start_step is None and p.start_lr_fraction is None:
                raise ValueError(f"data.phases[{i}] ({p.name!r}): needs start_step or start_lr_fraction")
        return self

    def dataset_names(self) -> list[str]:
        seen: list[str] = []
        for p in self.phases:
            for s in p.sources:
                if s.dataset not in seen:
                    seen.append(s.dataset)
        return seen


# ---- phases ------------------------------------------------------------------------------------

def resolve_phase_starts(cfg: DataConfig, max_steps: int, lr_fraction: Callable[[int], float]) -> list[int]:
    """Start step of every phase; a boundary at or past the end of training is an error."""
    starts = []
    for i, p in enumerate(cfg.phases):
        if i == 0:
            starts.append(0)
            continue
        key = f"data.phases[{i}] ({p.name!r})"
        if p.start_step is not None:
            s = p.start_step
            if s >= max_steps:
                raise BlendError(f"{key}: start_step {s} is past the end of training (max_steps {max_steps})")
        else:
            s = next((t for t in range(1, max_steps) if lr_fraction(t) <= p.start_lr_fraction + 1e-12
                      and lr_fraction(t) < lr_fraction(t - 1)), None)
            if s is None:
                raise BlendError(f"{key}: the learning rate never decays to {p.start_lr_fraction:g} of its peak "
                                 f"within {max_steps} steps (phase boundary past the end)")
        if s <= starts[-1]:
            raise BlendError(f"{key}: starts at step {s}, not after the previous phase (step {starts[-1]})")
        starts.append(s)
    return starts


@dataclass
class SourceData:
    name: str
    train: TokenShards
    train_docs: np.ndarray      # indices into `train` of documents used for training
    eval_docs: np.ndarray       # held-out documents

    @property
    def train_tokens(self) -> int:
        return int(self.train.doc_len[self.train_docs].sum())


def split_heldout(name: str, shards: TokenShards, per_source: int, seed: int) -> SourceData:
    n = shards.num_docs
    if n < 2:
        raise BlendError(f"source {name!r}: has {n} document(s); need at least 2 (one held out for eval)")
    k = min(per_source, max(1, n // 10))
    perm = np.random.default_rng([seed, _stable(name), 0xE7A1]).permutation(n)
    return SourceData(name, shards, np.sort(perm[k:]), np.sort(perm[:k]))


def _stable(s: str) -> int:
    import zlib
    return zlib.crc32(s.encode())


@dataclass
class PhaseStream:
    """One phase's documents as one token stream: sequence j = stream[j·L : j·L + L + 1]."""
    name: str
    start_step: int
    end_step: int
    seq_len: int
    docs_source: np.ndarray     # int32 source index per document in stream order
    docs_index: np.ndarray      # int64 document index within that source
    ends: np.ndarray            # int64 cumulative token end of each document in the stream
    sources: list = field(default_factory=list)   # SourceData, indexed by docs_source
    report: list[dict] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0


def build_phase(name: str, spec: PhaseSpec, sources: list[SourceData], start: int, end: int,
                tokens_per_step: int, seq_len: int, seed: int, phase_idx: int) -> PhaseStream:
    budget = (end - start) * tokens_per_step + 1
    sizes = np.array([s.train_tokens for s in sources], dtype=np.float64)
    if spec.sources[0].weight is not None:
        shares = np.array([s.weight for s in spec.sources])
    else:
        e = np.array([s.epochs for s in spec.sources]) * sizes
        shares = e / e.sum()
    docs_src, docs_idx, lens = [], [], []
    report = []
    for si, (src, spec_s, share) in enumerate(zip(sources, spec.sources, shares)):
        need = math.ceil(share * budget)
        taken, epoch = 0, 0
        picked = []
        while taken < need:
            rng = np.random.default_rng([seed, phase_idx, _stable(src.name), epoch])
            order = src.train_docs[rng.permutation(len(src.train_docs))]
            cum = np.cumsum(src.train.doc_len[order])
            cut = int(np.searchsorted(cum, need - taken, side="left")) + 1
            picked.append(order[:cut])
            taken += int(cum[min(cut, len(cum)) - 1])
            epoch += 1
        idx = np.concatenate(picked) if picked else np.zeros(0, np.int64)
        docs_src.append(np.full(len(idx), si, dtype=np.int32))
        docs_idx.append(idx)
        lens.append(src.train.doc_len[idx])
        report.append({"phase": name, "source": src.name, "weight": spec_s.weight, "epochs": spec_s.epochs,
                       "available_tokens": int(sizes[si]), "share": round(float(share), 6),
                       "tokens": int(share * budget), "repetitions": round(float(share * budget / sizes[si]), 4) if sizes[si] else None})
    src_arr, idx_arr, len_arr = np.concatenate(docs_src), np.concatenate(docs_idx), np.concatenate(lens)
    if spec.order == "ppl_wayra":
        ppl = np.array([sources[s].train.doc_ppl[i] for s, i in zip(src_arr, idx_arr)], dtype=np.float64)
        # stable sort: ties (and repeated epochs of one document) keep the shuffled order below
        pre = np.random.default_rng([seed, phase_idx, 0x5EED]).permutation(len(src_arr))
        order = pre[np.argsort(ppl[pre], kind="stable")]
    else:
        order = np.random.default_rng([seed, phase_idx, 0x5EED]).permutation(len(src_arr))
    src_arr, idx_arr, len_arr = src_arr[order], idx_arr[order], len_arr[order]
    return PhaseStream(name, start, end, seq_len, src_arr, idx_arr, np.cumsum(len_arr), list(sources), report)


class Batcher:
    """Packed rows for a step: (input_ids, targets, position_ids, segment_ids) as int64 arrays."""

    def __init__(self, phases: list[PhaseStream], sources: list[SourceData], seq_len: int, rows_per_step: int):
        self.phases, self.sources, self.seq_len = phases, sources, seq_len
        self.rows_per_step = rows_per_step   # the global batch, in rows

    def phase_at(self, step: int) -> PhaseStream:
        for p in reversed(self.phases):
            if step >= p.start_step:
                return p
        return self.phases[0]

    def _window(self, p: PhaseStream, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens [j·L, j·L+L+1) of the phase stream and a flag per token: 1 where a document starts."""
        L = self.seq_len
        start = (j * L) % max(1, p.num_tokens - L)   # wraps only past the phase's budget (data skipped after a rollback)
        end = start + L + 1
        d = int(np.searchsorted(p.ends, start, side="right"))
        toks, starts = [], []
        pos = start
        while pos < end:
            doc_begin = int(p.ends[d - 1]) if d > 0 else 0
            src = p.sources[int(p.docs_source[d])].train
            tokens = src.doc(int(p.docs_index[d]))
            a, b = pos - doc_begin, min(len(tokens), end - doc_begin)
            flag = np.zeros(b - a, dtype=np.int8)
            if a == 0:
                flag[0] = 1
            toks.append(np.asarray(tokens[a:b], dtype=np.int64))
            starts.append(flag)
            pos = doc_begin + b
            d += 1
        return np.concatenate(toks), np.concatenate(starts)

    @staticmethod
    def pack(window: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, ...]:
        starts = starts.copy()
        starts[0] = 1                                       # a row always starts a segment
        seg = np.cumsum(starts) - 1
        idx = np.arange(len(window))
        seg_start = np.maximum.accumulate(np.where(starts == 1, idx, 0))
        pos = idx - seg_start
        x, y = window[:-1], window[1:].copy()
        y[starts[1:] == 1] = -100                           # never predict across a document boundary
        return x, y, pos[:-1], seg[:-1]

    def rows(self, step: int, row_ids: range | list[int]) -> tuple[np.ndarray, ...]:
        """Rows `row_ids` of the global batch at `step` (each rank/micro-batch takes its own slice)."""
        p = self.phase_at(step)
        out = [[], [], [], []]
        for r in row_ids:
            j = (step - p.start_step) * self.rows_per_step + r
            for k, a in enumerate(self.pack(*self._window(p, j))):
                out[k].append(a)
        return tuple(np.stack(a) for a in out)


def eval_rows(sources: list[SourceData], seq_len: int, n_rows: int) -> tuple[np.ndarray, ...]:
    """Fixed held-out rows: every source's held-out documents, packed, in a fixed order."""
    toks, starts = [], []
    for s in sources:
        for i in s.eval_docs:
            t = np.asarray(s.train.doc(int(i)), dtype=np.int64)
            f = np.zeros(len(t), dtype=np.int8)
            f[0] = 1
            toks.append(t)
            starts.append(f)
    stream, flags = np.concatenate(toks), np.concatenate(starts)
    n_rows = max(1, min(n_rows, (len(stream) - 1) // seq_len))
    out = [[], [], [], []]
    for j in range(n_rows):
        w = slice(j * seq_len, j * seq_len + seq_len + 1)
        for k, a in enumerate(Batcher.pack(stream[w], flags[w])):
            out[k].append(a)
    return tuple(np.stack(a) for a in out)


def blend_report(phases: list[PhaseStream]) -> list[dict]:
    return [r | {"start_step": p.start_step, "end_step": p.end_step} for p in phases for r in p.report]


def format_blend_report(rows: list[dict]) -> str:
    lines = [f"{'phase':<12} {'source':<20} {'steps':>13} {'avail tok':>11} {'weight':>7} {'epochs':>7} {'share':>7} {'tokens':>11} {'reps':>6}"]
    for r in rows:
        lines.append(f"{r['phase']:<12.12} {r['source']:<20.20} {str(r['start_step']) + '-' + str(r['end_step']):>13} "
                     f"{r['available_tokens']:>11,} {'' if r['weight'] is None else format(r['weight'], '.3g'):>7} "
                     f"{'' if r['epochs'] is None else format(r['epochs'], '.3g'):>7} {r['share']:>7.3f} "
                     f"{r['tokens']:>11,} {r['repetitions'] if r['repetitions'] is not None else '-':>6}")
    return "\n".join(lines)
