"""Before training: find each source in the catalog, build the tokenizer, tokenize every source.

Writes `RUN_DIR/prepared.json` (tokenizer folder, token-shard markers per source), which the
training process (one or many ranks under torchrun) reads. Each step is resumable and skipped when
its output is already there (tokenizer fingerprint, per-shard token markers).
"""
from __future__ import annotations

import json
from pathlib import Path

from quipu.catalog import registry
from quipu.catalog.files import write_json_atomic
from quipu.trainer.data import BlendError, DataConfig
from quipu.trainer.tokenize import register_tokens, summarize, tokenize_shards
from quipu.trainer.tokenizer import TextTokenizer, TokenizerConfig, fertility, prepare_tokenizer


def resolve_sources(data: DataConfig) -> dict[str, list[str]]:
    """Curated shard paths of every source; a source missing from the catalog is an error naming it."""
    out: dict[str, list[str]] = {}
    for i, phase in enumerate(data.phases):
        for j, s in enumerate(phase.sources):
            if s.dataset in out:
                continue
            ds = registry.get_dataset(s.dataset, kind="curated")
            key = f"data.phases[{i}].sources[{j}].dataset"
            if ds is None:
                known = sorted({d["name"] for d in registry.list_datasets(kind="curated")})
                raise BlendError(f"{key}: no curated dataset named {s.dataset!r} in the catalog "
                                 f"(known: {', '.join(known) or 'none; run `quipu curate` first'})")
            paths = [sh["path"] for sh in ds["shards"]]
            missing = [p for p in paths if not Path(p).exists()]
            if not paths or missing:
                raise BlendError(f"{key}: dataset {s.dataset!r} has {'no shards' if not paths else 'missing shard ' + missing[0]}")
            out[s.dataset] = sorted(paths)
    return out


def tokens_dir(run_dir: Path, data: DataConfig) -> Path:
    return Path(data.tokens_dir) if data.tokens_dir else run_dir / "tokens"


def build_tokenizer(cfg: TokenizerConfig, sources: dict[str, list[str]], run_dir: Path) -> tuple[TextTokenizer, dict]:
    all_paths = [p for ps in sources.values() for p in ps]
    tok = prepare_tokenizer(cfg, all_paths, run_dir / "tokenizer")
    fert = fertility(tok, all_paths, cfg.heldout_every)
    write_json_atomic(run_dir / "tokenizer" / "fertility.json", fert)
    return tok, fert


def tokenize_source(name: str, paths: list[str], tok: TextTokenizer, run_dir: Path, data: DataConfig,
                    run_id: str | None = None) -> list[dict]:
    out = tokens_dir(run_dir, data) / name.replace("/", "_") / tok.sha256[:12]
    markers = tokenize_shards(paths, out, tok, data.workers)
    register_tokens(f"{name}.tokens", out, markers, tok.sha256, run_id)
    return markers


def write_prepared(run_dir: Path, tok: TextTokenizer, markers: dict[str, list[dict]], fert: dict) -> dict:
    prepared = {"tokenizer": str(tok.path.parent), "vocab_size": tok.vocab_size,
                "sources": {n: m for n, m in markers.items()},
                "summary": {n: summarize(m) for n, m in markers.items()}, "fertility": fert}
    write_json_atomic(run_dir / "prepared.json", prepared)
    return prepared


def prepare(tokenizer_cfg: TokenizerConfig, data: DataConfig, run_dir: str | Path, run_id: str | None = None) -> dict:
    """The whole preparation in one process (torchrun rank 0, tests); the flow runs the same steps as tasks."""
    run_dir = Path(run_dir)
    sources = resolve_sources(data)
    tok, fert = build_tokenizer(tokenizer_cfg, sources, run_dir)
    markers = {n: tokenize_source(n, p, tok, run_dir, data, run_id) for n, p in sources.items()}
    return write_prepared(run_dir, tok, markers, fert)


def load_prepared(run_dir: str | Path) -> dict:
    p = Path(run_dir) / "prepared.json"
    if not p.exists():
        raise FileNotFoundError(f"{p}: data not prepared (run `quipu train`, which tokenizes first)")
    return json.loads(p.read_text())
