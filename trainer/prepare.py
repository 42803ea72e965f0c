"""Before training: find each source's dataset versions in the catalog, build the tokenizer,
tokenize every curated shard (cached by content), and describe it all in `RUN_DIR/prepared.json`.

`prepared.json` is what the training process (one or many ranks under torchrun) reads: the
tokenizer folder, per selection (a dataset and its versions) the token-shard markers, and every
curated shard read, by path, with its dataset, version and sha256. Each step is resumable and
skipped when its output is already there (tokenizer fingerprint, per-shard token markers).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from quipu.catalog.files import write_json_atomic
from quipu.catalog.versions import select_versions
from quipu.trainer.data import URL_COLUMNS, BlendError, DataConfig, SourceData, SourceSpec, dup_copies, split_heldout, where_mask
from quipu.trainer.tokenize import TokenShards, register_tokens, summarize, tokenize_shards
from quipu.trainer.tokenizer import TextTokenizer, TokenizerConfig, fertility, is_heldout, iter_texts, prepare_tokenizer


def resolve_sources(data: DataConfig, pinned: dict[str, list[int]] | None = None) -> dict[str, list[dict]]:
    """The curated shards of every selection (dataset + versions), as catalog rows with `path`,
    `sha256`, `rows`, `dataset`, `version`; an unknown dataset or version, a missing shard or a
    `where` column the data does not have is an error naming the config key. `pinned`: selection ->
    the versions to use (a plain `--resume` keeps the versions its run started with)."""
    out: dict[str, list[dict]] = {}
    for i, phase in enumerate(data.phases):
        for j, s in enumerate(phase.sources):
            key = f"data.phases[{i}].sources[{j}]"
            if s.selection not in out:
                out[s.selection] = _selection_shards(s, key, (pinned or {}).get(s.selection))
            check_columns(s, out[s.selection], key)
    return out


def _selection_shards(s: SourceSpec, key: str, pinned: list[int] | None) -> list[dict]:
    from quipu.catalog import registry
    versions = select_versions(s.dataset, s.versions)
    if pinned is not None:
        versions = [v for v in versions if v["version"] in set(pinned)]
    if not versions:
        if not registry.dataset_versions(s.dataset):
            known = sorted({d["name"] for d in registry.list_datasets(kind="curated")})
            raise BlendError(f"{key}.dataset: no curated dataset named {s.dataset!r} in the catalog "
                             f"(known: {', '.join(known) or 'none; run `quipu curate` first'})")
        have = [v["version"] for v in registry.dataset_versions(s.dataset)]
        raise BlendError(f"{key}.versions: dataset {s.dataset!r} has no version {s.versions!r} (it has {have})")
    shards = [{"path": sh["path"], "sha256": sh["sha256"], "rows": sh["rows"], "dataset": s.dataset,
               "version": v["version"]} for v in versions for sh in v["shards"]]
    missing = [sh["path"] for sh in shards if not Path(sh["path"]).exists()]
    if not shards or missing:
        raise BlendError(f"{key}.dataset: dataset {s.dataset!r} has {'no shards' if not shards else 'missing shard ' + missing[0]}")
    return shards


def check_columns(s: SourceSpec, shards: list[dict], key: str) -> None:
    """Every `where` column (and dup_count when upsampling) in every shard's schema, before any work."""
    for sh in shards:
        names = set(pq.read_schema(sh["path"]).names)
        if "url" in names:
            names |= set(URL_COLUMNS)          # derived from the url when the shard predates them
        for col in s.where:
            if col not in names:
                raise BlendError(f"{key}.where.{col}: no column {col!r} in {sh['path']} (dataset {s.dataset!r} "
                                 f"v{sh['version']}; columns: {', '.join(sorted(names))})")
        if s.dup_upsample_cap is not None and "dup_count" not in names:
            raise BlendError(f"{key}.dup_upsample_cap: {sh['path']} (dataset {s.dataset!r} v{sh['version']}) has no "
                             "dup_count column (curate with dedup, which records each kept document's cluster size)")


def tokens_dir(run_dir: Path, data: DataConfig) -> Path:
    return Path(data.tokens_dir) if data.tokens_dir else run_dir / "tokens"


def build_tokenizer(cfg: TokenizerConfig, sources: dict[str, list[dict]], run_dir: Path,
                    keep: bool = False) -> tuple[TextTokenizer, dict]:
    """The run's tokenizer. `keep` (resuming or continuing a run): the one it was trained with,
    whatever data has arrived since (a BPE retrained on new versions would change the ids)."""
    all_paths = sorted({sh["path"] for shards in sources.values() for sh in shards})
    folder = run_dir / "tokenizer"
    if keep and (folder / "tokenizer_meta.json").exists():
        tok = TextTokenizer.load(folder)
    else:
        tok = prepare_tokenizer(cfg, all_paths, folder)
    # a fixed tokenizer never saw this data: every document is held-out text for it
    fert = fertility(tok, all_paths, cfg.heldout_every if cfg.kind == "bpe" else 1)
    write_json_atomic(run_dir / "tokenizer" / "fertility.json", fert)
    return tok, fert


def blend_languages(data: DataConfig, required_only: bool = False) -> set[str]:
    """The languages a blend selects by name (`where: {lang: pt}` or `{lang: [es, pt]}`);
    `required_only`: those of sources that must have documents (not `when_empty: redistribute`)."""
    from quipu.trainer.data import parse_condition
    out: set[str] = set()
    for spec in data.source_specs().values():
        if "lang" in spec.where and not (required_only and spec.when_empty == "redistribute"):
            op, value = parse_condition(spec.where["lang"])
            out |= {value} if op == "==" else set(value) if op == "in" else set()
    return {str(x) for x in out}


def words_per_language(shard_paths: list[str], heldout_every: int) -> dict[str, int]:
    """Whitespace words of the documents a BPE would be trained on (held-out ones left out), per language."""
    words: dict[str, int] = {}
    for row in iter_texts(shard_paths):
        if not is_heldout(str(row.get("id")), heldout_every):
            lang = row.get("lang") or "und"
            words[lang] = words.get(lang, 0) + len(row["text"].split())
    return words


def tokenizer_text_shortfall(cfg: TokenizerConfig, data: DataConfig, sources: dict[str, list[dict]]) -> list[str]:
    """kind=bpe: the blend languages with less training text than `min_words_per_language`, as
    "pt: 1,203 of 20,000 words" (empty: enough text, or a fixed tokenizer)."""
    if cfg.kind != "bpe" or not cfg.min_words_per_language:
        return []
    words = words_per_language(sorted({sh["path"] for shards in sources.values() for sh in shards}), cfg.heldout_every)
    return [f"{lang}: {words.get(lang, 0):,} of {cfg.min_words_per_language:,} words"
            for lang in sorted(blend_languages(data)) if words.get(lang, 0) < cfg.min_words_per_language]


def fertility_problems(fert: dict, languages: set[str], limit: float, required: set[str] | None = None) -> list[str]:
    """A blend language without held-out text (of `required`, default all: a language the blend
    may go without is no problem when absent), or above `limit` tokens per word on it."""
    out = []
    for lang in sorted(languages):
        tpw = (fert.get(lang) or {}).get("tokens_per_word")
        if tpw is None and required is not None and lang not in required:
            continue
        if tpw is None:
            out.append(f"{lang}: no held-out text to measure the tokenizer on")
        elif tpw > limit:
            out.append(f"{lang}: {tpw:.2f} tokens per word, above tokenizer.max_tokens_per_word {limit:g}")
    return out


def tokenize_source(name: str, shards: list[dict], tok: TextTokenizer, run_dir: Path, data: DataConfig,
                    run_id: str | None = None) -> list[dict]:
    """Token markers of one selection's shards (in order); each marker says its curated shard."""
    out = tokens_dir(run_dir, data) / tok.sha256[:12]
    markers = tokenize_shards(shards, out, tok, data.workers)
    for m, sh in zip(markers, shards):
        m.update(dataset=sh["dataset"], version=sh["version"], input_sha256=sh["sha256"])
    register_tokens(name.replace("@", ".v").replace("..", "-") + ".tokens", out, markers, tok.sha256, run_id)   # cc.v2-4.tokens
    return markers


def write_prepared(run_dir: Path, tok: TextTokenizer, markers: dict[str, list[dict]], fert: dict) -> dict:
    prepared = {"tokenizer": str(tok.path.parent), "vocab_size": tok.vocab_size,
                "sources": {n: m for n, m in markers.items()},
                "versions": {n: sorted({x["version"] for x in m}) for n, m in markers.items()},
                "curated_shards": [{"selection": n, "dataset": x["dataset"], "version": x["version"],
                                    "path": x["input"], "sha256": x["input_sha256"], "docs": x["docs"],
                                    "tokens": x["tokens"], "reused": bool(x.get("reused"))}
                                   for n, m in markers.items() for x in m],
                "summary": {n: summarize(m) for n, m in markers.items()}, "fertility": fert}
    write_json_atomic(run_dir / "prepared.json", prepared)
    return prepared


def prepare(tokenizer_cfg: TokenizerConfig, data: DataConfig, run_dir: str | Path, run_id: str | None = None,
            pinned: dict[str, list[int]] | None = None, resume: bool = False) -> dict:
    """The whole preparation in one process (torchrun rank 0, tests); the flow runs the same steps
    as tasks. `resume`: keep the run's tokenizer; `pinned`: the versions per selection to keep."""
    run_dir = Path(run_dir)
    sources = resolve_sources(data, pinned)
    tok, fert = build_tokenizer(tokenizer_cfg, sources, run_dir, keep=resume)
    markers = {n: tokenize_source(n, p, tok, run_dir, data, run_id) for n, p in sources.items()}
    return write_prepared(run_dir, tok, markers, fert)


def load_prepared(run_dir: str | Path) -> dict:
    p = Path(run_dir) / "prepared.json"
    if not p.exists():
        raise FileNotFoundError(f"{p}: data not prepared (run `quipu train`, which tokenizes first)")
    return json.loads(p.read_text())


def pinned_versions(run_dir: str | Path) -> dict[str, list[int]] | None:
    """The versions a run was prepared with (None before its first preparation)."""
    p = Path(run_dir) / "prepared.json"
    return json.loads(p.read_text()).get("versions") if p.exists() else None


# ---- the sources the trainer reads ---------------------------------------------------------------

def load_sources(data: DataConfig, prepared: dict, seed: int) -> list[SourceData]:
    """Every source of the blend: its selection's token shards (opened once per selection), the
    documents its `where` keeps, their dup_count copies, and a held-out split."""
    shards: dict[str, TokenShards] = {}
    sources = []
    for key, spec in data.source_specs().items():
        if spec.selection not in prepared["sources"]:
            raise BlendError(f"source {key!r} was not prepared (prepared.json lists {sorted(prepared['sources'])})")
        markers = prepared["sources"][spec.selection]
        if spec.selection not in shards:
            shards[spec.selection] = TokenShards.open(markers)
        tokens = shards[spec.selection]
        selected, copies = None, None
        if spec.where or spec.dup_upsample_cap is not None:
            table = document_columns(markers, [*spec.where, *(["dup_count"] if spec.dup_upsample_cap is not None else [])])
            if table.num_rows != tokens.num_docs:
                raise BlendError(f"source {key!r}: curated shards have {table.num_rows} rows, tokens {tokens.num_docs} documents")
            mask = where_mask(table, spec.where, f"source {key!r}")
            selected = np.flatnonzero(mask)
            if spec.dup_upsample_cap is not None:
                copies = dup_copies(table, spec.dup_upsample_cap, f"source {key!r}")[mask]
        if spec.when_empty == "redistribute" and (tokens.num_docs if selected is None else len(selected)) < 2:
            continue     # absent from this data: plan_data shares its weight among the phase's others
        src = split_heldout(key, tokens, data.eval_docs_per_source, seed, selected, copies)
        src.eval_lang = document_langs(markers, tokens, src.eval_docs)
        sources.append(src)
    return sources


def document_langs(markers: list[dict], tokens: TokenShards, docs: np.ndarray) -> list[str]:
    """The curated `lang` of documents `docs` (token-shard order), reading the column of only the
    shards that hold them (one at a time); "und" where a shard has none."""
    first = np.searchsorted(tokens.doc_shard, np.arange(len(markers)))   # each shard's first document
    langs: dict[int, str] = {}
    for shard in np.unique(tokens.doc_shard[docs]).tolist():
        path = markers[shard]["input"]
        if "lang" not in pq.read_schema(path).names:
            continue
        column = pq.read_table(path, columns=["lang"]).column("lang")
        for i in docs[tokens.doc_shard[docs] == shard].tolist():
            langs[i] = column[i - int(first[shard])].as_py()
    return [str(langs.get(int(i)) or "und") for i in docs]


def document_columns(markers: list[dict], columns: list[str]):
    """`columns` of every document, in token-shard order, read from the curated shards; `domain`
    and `tld` are derived from `url` where a shard predates them."""
    import pyarrow as pa
    columns = list(dict.fromkeys(columns))
    tables = []
    for m in markers:
        names = set(pq.read_schema(m["input"]).names)
        derive = [c for c in columns if c in URL_COLUMNS and c not in names]
        t = pq.read_table(m["input"], columns=[c for c in columns if c in names] + (["url"] if derive else []))
        if derive:
            from quipu.tasks.urls import url_domains
            domains, tlds = url_domains(t.column("url").to_pylist())
            for c, values in (("domain", domains), ("tld", tlds)):
                if c in derive:
                    t = t.append_column(c, pa.array(values, pa.string()))
        tables.append(t.select(columns))
    return pa.concat_tables(tables, promote_options="permissive")
