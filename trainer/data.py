"""Blends, phases and the packed-sequence data stream.

A training config names sources with a `weight` (share of the phase's tokens) or an `epochs`
multiplier (like K2's table: a high-quality source 6x, code 0.5x; the multipliers become shares
`epochs·size / Σ epochs·size`). A source is a curated dataset (every version by default, or
`versions: 3` / `"2..4"`), optionally narrowed by `where:` on any column (`lang: pt`,
`domain: [a.com, b.org]`, `quality_score: ">= 0.8"`), optionally upsampled by `dup_count` (the
size of a kept document's duplicate cluster) up to a cap or by a table of cluster sizes (FineWeb-2's
rehydration). Phases run in sequence, each starting at a step or at the step where the learning
rate has decayed to a fraction of its peak (the continued pre-training recipe: general blend, then
the target blend from LR = 20 % of peak).

Each phase is laid out once, deterministically from the seed. Every source contributes a list of
passes over its documents (one per epoch, and per `dup_count` round), each pass in a fresh random
order or, for a curriculum (`order: ppl_wayra`), sorted easy → hard by `ppl_wayra`, taken until
the source's share of the phase's tokens is covered. The sources' lists are then interleaved by
their shares (weighted fair queueing on tokens), so every source's share is the same in any window
of steps, and a document's repeats are a whole pass apart. Sequence j of a phase is tokens
[j·L, j·L + L + 1) of the result. Nothing is stateful: the data position is the step, so resuming,
data-parallel ranks and gradient accumulation all index the same stream.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quipu.catalog.errors import UserError
from quipu.trainer.tokenize import TokenShards

WEIGHT_TOLERANCE = 1e-6


class BlendError(UserError, ValueError):
    """A blend or phase that cannot be trained; the message names the config key."""


WHERE_OP = re.compile(r"^\s*(==|!=|>=|<=|>|<)\s*(.+?)\s*$")
URL_COLUMNS = ("domain", "tld")     # derived from `url` when a curated dataset predates them


def parse_condition(value: Any) -> tuple[str, Any]:
    """A `where:` value as (operator, operand): a list is `in`, a string may start with an
    operator (`">= 0.8"`, `"!= en"`), anything else is equality."""
    if isinstance(value, list):
        if not value:
            raise ValueError("an empty list matches nothing")
        return "in", value
    if isinstance(value, str):
        m = WHERE_OP.match(value)
        if m:
            op, operand = m.groups()
            try:
                return op, float(operand)
            except ValueError:
                if op not in ("==", "!="):
                    raise ValueError(f"{value!r}: {op} needs a number") from None
                return op, operand
    if isinstance(value, dict):
        raise ValueError(f"{value!r}: give a value, a list of values or an operator and a number ('>= 0.8')")
    return "==", value


def check_where(where: dict[str, Any]) -> dict[str, Any]:
    """A `where:` mapping whose every condition parses; ValueError naming the column otherwise."""
    for col, cond in where.items():
        try:
            parse_condition(cond)
        except ValueError as e:
            raise ValueError(f"where.{col}: {e}") from None
    return where


# FineWeb-2's rehydration schedule: a kept document of a duplicate cluster of size N is repeated
# 1 time when N = 1, N times for N = 2-3, 3 times for N = 4, 5 for 5-99, 8 for 100-999 and 1 time
# from 1000 on ("very large clusters are lower quality"). Source: the huggingface/fineweb-2
# repository's README, "Deduplication" (its Rehydrater example: {1: 1, 2: 2, 3: 3, 5: 5, 100: 8,
# 1000: 1} as lower bounds; commit d0defb24): "we did not extensively explore different upsampling
# weights, but observed promising results with the following weights". Rehydration itself: Penedo
# et al. 2025, "FineWeb2: One Pipeline to Scale Them All", arXiv:2506.20920.
DUP_UPSAMPLE_PRESETS: dict[str, dict[str, int]] = {
    "fineweb2": {"1": 1, "2": 2, "3-4": 3, "5-99": 5, "100-999": 8, "1000+": 1},
}
CLUSTER_SIZES = re.compile(r"^\s*(\d+)\s*(?:(-)\s*(\d+)|(\+))?\s*$")


def parse_dup_upsample(value: Any) -> int | str | dict[str, int]:
    """`dup_upsample_cap` checked: a cap K >= 1 (kept as given), a preset name (kept as given) or a
    table of cluster sizes (`N`, `A-B`, `N+`) to copies per epoch, which must cover every size from 1
    on exactly once (the last range open) with whole copies >= 1; returned ordered, keys as text."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r}: give a cap (a whole number >= 1), a table {{cluster size: copies}} or a preset "
                         f"({', '.join(DUP_UPSAMPLE_PRESETS)})")
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        if value < 1:
            raise ValueError(f"{value!r}: a cap must be >= 1 (1: every document once)")
        return int(value)
    if isinstance(value, str):
        if value not in DUP_UPSAMPLE_PRESETS:
            raise ValueError(f"{value!r}: no such preset (presets: {', '.join(DUP_UPSAMPLE_PRESETS)})")
        return value
    if not isinstance(value, dict) or not value:
        raise ValueError(f"{value!r}: give a cap (a whole number >= 1), a table {{cluster size: copies}} or a preset "
                         f"({', '.join(DUP_UPSAMPLE_PRESETS)})")
    ranges = []
    for key, copies in value.items():
        m = CLUSTER_SIZES.match(str(key))
        lo = int(m.group(1)) if m else 0
        hi = None if m and m.group(4) else int(m.group(3)) if m and m.group(2) else lo
        if not m or lo < 1 or (hi is not None and hi < lo):
            raise ValueError(f"key {key!r}: a cluster size (3), a range (5-99) or an open range (1000+), from 1 on")
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
            raise ValueError(f"{key}: {copies!r} copies; give a whole number >= 1 (1: the document once)")
        ranges.append((lo, hi, copies))
    ranges.sort(key=lambda r: r[0])
    expect = 1
    for lo, hi, _ in ranges:
        if expect is None or lo < expect:
            raise ValueError(f"cluster size {lo} is covered twice (ranges overlap)")
        if lo > expect:
            gap = _span(expect, lo - 1)
            raise ValueError(f"cluster size{'s' * ('-' in gap)} {gap} ha{'ve' if '-' in gap else 's'} no entry; "
                             "cover every size from 1 on")
        expect = None if hi is None else hi + 1
    if expect is not None:
        raise ValueError(f"cluster sizes from {expect} on have no entry; end with an open range ({expect}+)")
    return {_span(lo, hi): copies for lo, hi, copies in ranges}


def _span(lo: int, hi: int | None) -> str:
    return f"{lo}+" if hi is None else str(lo) if hi == lo else f"{lo}-{hi}"


def dup_schedule(value: str | dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """(lower bounds, copies) of a checked table or preset: cluster size n gets copies[i] for the
    last i with bounds[i] <= n."""
    table = DUP_UPSAMPLE_PRESETS[value] if isinstance(value, str) else value
    bounds = [int(CLUSTER_SIZES.match(k).group(1)) for k in table]
    return np.array(bounds, dtype=np.int64), np.array(list(table.values()), dtype=np.int64)


class SourceSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dataset: str = Field(description="catalog name of a curated dataset")
    versions: int | str | None = Field(None, description="a version (3) or range ('2..4', '3..'); default: every version")
    where: dict[str, Any] = Field(default_factory=dict, description="keep documents whose columns match: {lang: pt}, {tld: [br, pt]}, {quality_score: '>= 0.8'}")
    name: str | None = Field(None, description="the source's name in reports (default: dataset, versions and where)")
    weight: float | None = Field(None, gt=0, description="share of the phase's tokens (weights of a phase sum to 1)")
    epochs: float | None = Field(None, gt=0, description="epoch multiplier (alternative to weight)")
    dup_upsample_cap: int | str | dict[str, int] | None = Field(
        None, description="copies per epoch by duplicate cluster size (dup_count, from dedup): K (min(dup_count, K)), "
                           "a table {1: 1, 2: 2, 3-4: 3, 5+: 4} or a preset (fineweb2)")
    when_empty: Literal["fail", "redistribute"] = Field(
        "fail", description="data with fewer than 2 of this source's documents (a batch without its language): "
                            "fail, or redistribute (train without it; its weight goes to the phase's other sources "
                            "in proportion to theirs, as the blend table says)")

    @field_validator("versions")
    @classmethod
    def _versions(cls, v):
        from quipu.catalog.versions import parse_versions
        parse_versions(v)
        return v

    @field_validator("dup_upsample_cap", mode="before")
    @classmethod
    def _dup_upsample(cls, v):
        return None if v is None else parse_dup_upsample(v)

    @field_validator("where")
    @classmethod
    def _where(cls, v: dict):
        return check_where(v)

    @model_validator(mode="after")
    def _one(self):
        if (self.weight is None) == (self.epochs is None):
            raise ValueError(f"source {self.dataset!r}: give exactly one of weight or epochs")
        return self

    @property
    def key(self) -> str:
        """What names this source: its `name`, else e.g. `cc-main@2..4[lang=pt]`."""
        if self.name:
            return self.name
        out = self.dataset + (f"@{self.versions}" if self.versions is not None else "")
        if self.where:
            out += "[" + ",".join(f"{k}={v}" for k, v in sorted(self.where.items())) + "]"
        return out

    @property
    def selection(self) -> str:
        """The documents before `where`: the dataset and its versions (what gets tokenized)."""
        return self.dataset + (f"@{self.versions}" if self.versions is not None else "")


class PhaseSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = "main"
    sources: list[SourceSpec] = Field(min_length=1)
    start_step: int | None = Field(None, ge=0, description="the step this phase starts at")
    start_lr_fraction: float | None = Field(None, gt=0, lt=1, description="...or the step where LR has decayed to this fraction of its peak")
    order: Literal["shuffle", "ppl_wayra"] = Field("shuffle", description="ppl_wayra: curriculum, ascending perplexity; shuffle: random order (the control)")
    # stages of context: a phase may train longer rows with another RoPE base (e.g. 4K -> 32K, theta 5e5 -> 4e6)
    seq_len: int | None = Field(None, gt=1, description="tokens per row in this phase (default data.seq_len): packing and "
                                                       "the document mask follow it; the global batch stays train.batch_size rows")
    rope_theta: float | None = Field(None, gt=0, description="RoPE base from this phase on (default: model.rope_theta)")
    lr_schedule: Literal["continue", "rewarm"] = Field(
        "continue", description="continue: the run's schedule goes on; rewarm: this phase warms up again to `lr` "
                                "(default optim.lr) over `warmup_steps` and decays by schedule.kind to its own end")
    warmup_steps: int | None = Field(None, ge=0, description="rewarm: warm-up steps of this phase (default schedule.warmup_steps)")
    lr: float | None = Field(None, gt=0, description="rewarm: the phase's peak learning rate (default optim.lr)")

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
        if self.lr_schedule == "continue" and (self.warmup_steps is not None or self.lr is not None):
            raise ValueError(f"phase {self.name!r}: warmup_steps and lr apply to lr_schedule: rewarm")
        names = [s.key for s in self.sources]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"phase {self.name!r}: source {dup[0]!r} is listed twice (give each a different `where` or `name`)")
        return self


class ContinualConfig(BaseModel):
    """What a training run does when a new version of one of its datasets is curated (the
    `tokenize-train` deployment's trigger on `quipu.curate.completed`)."""
    model_config = ConfigDict(extra="forbid")
    policy: Literal["append", "new_phase"] = Field("append", description="append: a phase with the last phase's blend (every version included) from the checkpoint on; new_phase: a phase where the new version gets `new_version_weight` and the last phase's sources share the rest")
    steps: int = Field(100, gt=0, description="training steps added for each new version")
    new_version_weight: float = Field(0.5, gt=0, lt=1, description="new_phase: the new version's share of the new phase")


class DataConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seq_len: int = Field(256, gt=1)
    max_epochs: float | None = Field(None, gt=0, description="steps to train now that would repeat the blend's distinct "
                                                             "tokens more often than this: train fewer steps (said before "
                                                             "training); null: train every step (a WARNING above 4 epochs)")
    phases: list[PhaseSpec] = Field(min_length=1)
    continual: ContinualConfig = Field(default_factory=ContinualConfig)
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
        self.source_specs()
        return self

    def source_specs(self) -> dict[str, SourceSpec]:
        """Every distinct source (by key), in first-use order; one key means one definition."""
        seen: dict[str, SourceSpec] = {}
        for i, p in enumerate(self.phases):
            for j, s in enumerate(p.sources):
                other = seen.setdefault(s.key, s)
                if (other.dataset, other.versions, other.where, other.dup_upsample_cap) != \
                        (s.dataset, s.versions, s.where, s.dup_upsample_cap):
                    raise BlendError(f"data.phases[{i}].sources[{j}].name: {s.key!r} names two different sources")
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
    copies: np.ndarray | None = None   # per train_docs entry: times per epoch (by dup_count); None: once
    eval_lang: list[str] | None = None  # language of each held-out document (curated `lang`), for per-language eval

    @property
    def train_tokens(self) -> int:
        """Distinct training tokens (each document once)."""
        return int(self.train.doc_len[self.train_docs].sum())

    @property
    def epoch_tokens(self) -> int:
        """Tokens of one epoch, with the dup_count copies."""
        lens = self.train.doc_len[self.train_docs]
        return int((lens * self.copies).sum()) if self.copies is not None else int(lens.sum())


def split_heldout(name: str, shards: TokenShards, per_source: int, seed: int,
                  selected: np.ndarray | None = None, copies: np.ndarray | None = None) -> SourceData:
    """Hold out documents for evaluation. `selected`: the documents the source's `where` keeps
    (default all); `copies`: per selected document, how many times an epoch repeats it."""
    docs = np.arange(shards.num_docs) if selected is None else np.asarray(selected, dtype=np.int64)
    n = len(docs)
    if n < 2:
        raise BlendError(f"source {name!r}: has {n} document(s); need at least 2 (one held out for eval); fix: curate "
                         "more of its documents, or set `when_empty: redistribute` on the source to train without it "
                         "when the data lacks it")
    k = min(per_source, max(1, n // 10))
    perm = np.random.default_rng([seed, _stable(name), 0xE7A1]).permutation(n)
    train_pos, eval_pos = np.sort(perm[k:]), np.sort(perm[:k])
    return SourceData(name, shards, docs[train_pos], docs[eval_pos],
                      None if copies is None else np.asarray(copies, dtype=np.int64)[train_pos])


def _stable(s: str) -> int:
    import zlib
    return zlib.crc32(s.encode())


# ---- which documents a source takes: `where` and dup_count ---------------------------------------

def where_mask(table: pa.Table, where: dict[str, Any], key: str) -> np.ndarray:
    """Documents (rows of `table`) that match every condition; a null never matches."""
    mask = np.ones(table.num_rows, dtype=bool)
    for col, cond in where.items():
        if col not in table.column_names:
            raise BlendError(f"{key}.where.{col}: no column {col!r} in the curated data "
                             f"(columns: {', '.join(sorted(table.column_names))})")
        op, operand = parse_condition(cond)
        arr = table.column(col)
        try:
            if op == "in":
                hit = pc.is_in(arr, value_set=pa.array(operand, type=arr.type))
            else:
                fn = {"==": pc.equal, "!=": pc.not_equal, ">=": pc.greater_equal, "<=": pc.less_equal,
                      ">": pc.greater, "<": pc.less}[op]
                hit = fn(arr, pa.scalar(operand).cast(arr.type) if op in ("==", "!=") else operand)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise BlendError(f"{key}.where.{col}: cannot compare column {col!r} ({arr.type}) with {cond!r}: {e}") from None
        mask &= np.asarray(hit.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
    return mask


def dup_copies(table: pa.Table, schedule: int | str | dict[str, int], key: str) -> np.ndarray:
    """Copies per epoch of each row by its dup_count (a missing count is 1), as `schedule` says
    (a cap K: min(dup_count, K); a table or preset: the entry of the cluster size)."""
    if "dup_count" not in table.column_names:
        raise BlendError(f"{key}.dup_upsample_cap: the curated data has no dup_count column "
                         "(curate with dedup, which records each kept document's cluster size)")
    counts = np.maximum(table.column("dup_count").fill_null(1).to_numpy(zero_copy_only=False).astype(np.int64), 1)
    if isinstance(schedule, int):
        return np.minimum(counts, schedule)
    bounds, copies = dup_schedule(schedule)
    return copies[np.searchsorted(bounds, counts, side="right") - 1]


# ---- phase streams -----------------------------------------------------------------------------

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

    def source_tokens(self, start: int, end: int) -> np.ndarray:
        """Tokens of each source in stream positions [start, end)."""
        begins = np.concatenate([[0], self.ends[:-1]])
        overlap = np.clip(np.minimum(self.ends, end) - np.maximum(begins, start), 0, None)
        return np.bincount(self.docs_source, weights=overlap, minlength=len(self.sources)).astype(np.int64)


def source_passes(src: SourceData, need: int, order: str, seed: int, phase_idx: int) -> np.ndarray:
    """`src`'s documents for one phase: passes (per epoch, and per dup_count round within it), each
    shuffled or sorted easy → hard, until `need` tokens are covered (the last pass is a random
    sample of the pass, then ordered like the others)."""
    lens_all = src.train.doc_len
    copies = src.copies if src.copies is not None else np.ones(len(src.train_docs), dtype=np.int64)
    rounds = int(copies.max()) if len(copies) else 1
    picked, taken, n = [], 0, 0
    while taken < need:
        epoch, rnd = divmod(n, rounds)
        docs = src.train_docs[copies > rnd]
        n += 1
        if len(docs) == 0:
            continue
        rng = np.random.default_rng([seed, phase_idx, _stable(src.name), epoch, rnd])
        docs = docs[rng.permutation(len(docs))]
        cum = np.cumsum(lens_all[docs])
        cut = min(int(np.searchsorted(cum, need - taken, side="left")) + 1, len(docs))
        docs = docs[:cut]        # a cut pass is a random sample: the curriculum orders it, it does not pick the easy ones
        if order == "ppl_wayra":   # stable: ties keep the random order
            docs = docs[np.argsort(src.train.doc_ppl[docs], kind="stable")]
        picked.append(docs)
        taken += int(cum[cut - 1])
    return np.concatenate(picked) if picked else np.zeros(0, np.int64)


def interleave(lengths: list[np.ndarray], shares: np.ndarray) -> np.ndarray:
    """Merge the sources' document lists so that each keeps its share of tokens along the stream:
    a document is placed at (tokens of its source before it) / share (start-time fair queueing).
    Returns the stream order as a permutation of the concatenated lists."""
    keys = np.concatenate([(np.cumsum(lens) - lens) / shares[i] for i, lens in enumerate(lengths)])
    src = np.concatenate([np.full(len(lens), i, dtype=np.int32) for i, lens in enumerate(lengths)])
    return np.lexsort((src, keys))


def build_phase(name: str, spec: PhaseSpec, sources: list[SourceData], start: int, end: int,
                tokens_per_step: int, seq_len: int, seed: int, phase_idx: int) -> PhaseStream:
    budget = (end - start) * tokens_per_step + 1
    sizes = np.array([s.epoch_tokens for s in sources], dtype=np.float64)
    if spec.sources[0].weight is not None:
        shares = np.array([s.weight for s in spec.sources])
    else:
        e = np.array([s.epochs for s in spec.sources]) * sizes
        shares = e / e.sum()
    lists, report = [], []
    for si, (src, spec_s, share) in enumerate(zip(sources, spec.sources, shares)):
        docs = source_passes(src, math.ceil(share * budget), spec.order, seed, phase_idx)
        lists.append(docs)
        distinct = src.train_tokens
        report.append({"phase": name, "source": src.name, "dataset": spec_s.dataset, "versions": spec_s.versions,
                       "where": spec_s.where or None, "weight": spec_s.weight, "epochs": spec_s.epochs,
                       "dup_upsample_cap": spec_s.dup_upsample_cap, "documents": int(len(src.train_docs)),
                       "available_tokens": distinct, "epoch_tokens": int(sizes[si]), "share": round(float(share), 6),
                       "tokens": int(share * budget),
                       "repetitions": round(float(share * budget / distinct), 4) if distinct else None})
    lens = [src.train.doc_len[d] for src, d in zip(sources, lists)]
    order = interleave(lens, shares)
    which = np.concatenate([np.full(len(d), si, dtype=np.int32) for si, d in enumerate(lists)])[order]
    idx = np.concatenate(lists)[order]
    return PhaseStream(name, start, end, seq_len, which, idx, np.cumsum(np.concatenate(lens)[order]),
                       list(sources), report)


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

    def tokens_until(self, step: int) -> int:
        """Training tokens in steps [0, step) (phases may differ in seq_len)."""
        return sum(max(0, min(step, p.end_step) - p.start_step) * p.seq_len * self.rows_per_step for p in self.phases)

    def _window(self, p: PhaseStream, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens [j·L, j·L+L+1) of the phase stream and a flag per token: 1 where a document starts."""
        L = p.seq_len
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


def present_sources(spec: PhaseSpec, present: set[str], where: str) -> tuple[PhaseSpec, list[dict]]:
    """`spec` with only the sources in `present` (those with documents in this data), weights
    rescaled to sum to 1, and a blend-report row for each source left out (`when_empty:
    redistribute`); a phase left with no source is an error."""
    kept = [s for s in spec.sources if s.key in present]
    gone = [s for s in spec.sources if s.key not in present]
    if not gone:
        return spec, []
    if not kept:
        raise BlendError(f"{where}: none of its sources ({', '.join(s.key for s in spec.sources)}) has documents in "
                         "this data; curate data they select, or add a source that this data holds")
    if kept[0].weight is not None:
        total = sum(s.weight for s in kept)
        kept = [s.model_copy(update={"weight": s.weight / total}) for s in kept]
    rows = [{"phase": spec.name, "source": s.key, "dataset": s.dataset, "versions": s.versions, "where": s.where or None,
             "weight": 0.0 if s.weight is not None else None, "configured_weight": s.weight, "epochs": s.epochs,
             "dup_upsample_cap": s.dup_upsample_cap, "documents": 0, "available_tokens": 0, "epoch_tokens": 0,
             "share": 0.0, "tokens": 0, "repetitions": None, "absent": True} for s in gone]
    return spec.model_copy(update={"sources": kept}), rows


def blend_report(phases: list[PhaseStream]) -> list[dict]:
    return [r | {"start_step": p.start_step, "end_step": p.end_step} for p in phases for r in p.report]


MAX_EPOCHS = 4   # more repeats of the same tokens than this and they stop helping (the seeds' limit)


def format_blend_report(rows: list[dict]) -> str:
    """The blend table printed before training: per phase and source the tokens available (after
    `where`), the configured weight (or epochs multiplier), the share, the tokens it contributes and
    how many epochs that is; a warning for every source repeated more than MAX_EPOCHS times."""
    head = (f"{'phase':<12} {'source':<28} {'steps':>13} {'avail tok':>12} {'weight':>7} {'share':>7} "
            f"{'tokens':>12} {'epochs':>7}")
    lines, warnings = [head, "-" * len(head)], []
    for r in rows:
        weight = format(r["weight"], ".3g") if r["weight"] is not None else f"x{r['epochs']:g}"
        reps = r["repetitions"]
        lines.append(f"{r['phase']:<12.12} {r['source']:<28.28} {str(r['start_step']) + '-' + str(r['end_step']):>13} "
                     f"{r['available_tokens']:>12,} {weight:>7} {r['share']:>7.3f} {r['tokens']:>12,} "
                     f"{'-' if reps is None else format(reps, '.2f'):>7}")
        if r.get("absent"):
            moved = (f"its weight {r['configured_weight']:g} goes to the phase's other sources in proportion"
                     if r["configured_weight"] is not None else "the other sources' epochs set the shares")
            warnings.append(f"NOTE: phase {r['phase']!r}, source {r['source']!r}: fewer than 2 documents in this data, "
                            f"trained without it; {moved} (when_empty: redistribute)")
        elif reps is not None and reps > MAX_EPOCHS:
            warnings.append(f"WARNING: phase {r['phase']!r}, source {r['source']!r}: {reps:.1f} epochs over its "
                            f"{r['available_tokens']:,} tokens (more than {MAX_EPOCHS}: repeated data stops helping; "
                            "lower its weight, add data, or train fewer steps)")
    return "\n".join(lines + warnings)
