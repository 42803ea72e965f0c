"""What each ablation variant trains on when it selects: the curated documents matching its `where:`
(e.g. `{quality_tier: '>= 3'}`), and with `equal_tokens` the same number of tokens per language in
every variant, so that arms differ in which documents they hold, never in how much of each language.

Per language the budget is the fewest tokens (in the ablation's one tokenizer) any variant's
selection holds; each variant takes its selected documents in a random order fixed by `sample_seed`
(a hash of seed and id: independent of file order) until it reaches the budget, so a variant
exceeds it by less than one document. The selection is written as the variant's curated data.
The ablation draws one sample per training seed (`resample_per_seed`, its default: order fixed by
`sample_seed` and the training seed), so that the spread it reports over seeds includes the sample's:
which documents fill a small budget moves held-out BPB as much as the training seed does.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from quipu.tasks.stage import Shard, langs_of, write_table
from quipu.trainer.data import where_mask


def read_selection(parts: list[Shard], where: dict, key: str) -> pa.Table:
    """The curated documents of a variant matching `where` (every one when it is empty)."""
    tables = [pq.read_table(p.path) for p in parts if p.rows]
    if not tables:
        return pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())})
    table = pa.concat_tables(tables, promote_options="default")
    return table.filter(pa.array(where_mask(table, where, key))) if where else table


def sample_order(ids: list, seed: int | str) -> np.ndarray:
    """Row indices in a random order fixed by `seed` and the ids alone."""
    keys = [hashlib.blake2b(f"{seed}:{i}".encode(), digest_size=8).digest() for i in ids]
    return np.array(sorted(range(len(ids)), key=lambda r: (keys[r], str(ids[r]))), dtype=np.int64)


def tokens_by_lang(langs: list[str], tokens: np.ndarray) -> dict[str, int]:
    out: dict[str, int] = {}
    for lang, n in zip(langs, tokens.tolist()):
        out[lang] = out.get(lang, 0) + int(n)
    return out


def take_budget(ids: list, langs: list[str], tokens: np.ndarray, budget: dict[str, int], seed: int | str) -> np.ndarray:
    """A mask taking, per language, documents in the seeded order until the language's budget is met."""
    mask = np.zeros(len(ids), dtype=bool)
    got: dict[str, int] = {}
    for r in sample_order(ids, seed):
        lang = langs[r]
        if got.get(lang, 0) < budget.get(lang, 0):
            mask[r] = True
            got[lang] = got.get(lang, 0) + int(tokens[r])
    return mask


def select_draws(curated: dict[str, list[Shard]], wheres: dict[str, dict], equal_tokens: bool,
                 draws: list[tuple[int | str, str]], tokenizer, out: Path) -> list[dict[str, dict]]:
    """Each variant's selection, once per draw (sampling order, folder), written to `out/<variant>/<folder>/`:
    per draw {variant: {"parts", "tokens_by_lang", "selected_tokens_by_lang", "budget"}}. The ablation draws
    once, or once per training seed ("<sample_seed>:<training seed>") when it resamples per seed; the
    selections are read and tokenized once, and only the draw is repeated."""
    tables, tokens = {}, {}
    for v, parts in curated.items():
        tables[v] = read_selection(parts, wheres.get(v) or {}, f"variants.{v}")
        texts = tables[v].column("text").to_pylist()
        tokens[v] = np.array([len(ids) for ids in tokenizer.encode_docs(texts)], dtype=np.int64) if texts else \
            np.zeros(0, dtype=np.int64)
    available = {v: tokens_by_lang(langs_of(t), tokens[v]) for v, t in tables.items()}
    budget = None
    if equal_tokens:
        langs = set.intersection(*(set(a) for a in available.values())) if available else set()
        budget = {lang: min(a[lang] for a in available.values()) for lang in sorted(langs)}
    results = []
    for seed, folder in draws:
        result = {}
        for v, table in tables.items():
            if budget is not None:
                mask = take_budget(table.column("id").to_pylist(), langs_of(table), tokens[v], budget, seed)
                table, kept_tokens = table.filter(pa.array(mask)), tokens[v][mask]
            else:
                kept_tokens = tokens[v]
            part = write_table(out / v / folder / "part-00000.parquet", table)
            result[v] = {"parts": [part], "tokens_by_lang": tokens_by_lang(langs_of(table), kept_tokens),
                         "selected_tokens_by_lang": available[v], "budget": budget}
        results.append(result)
    return results
