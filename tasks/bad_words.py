"""Stage `bad_words`: remove documents in which listed adult or toxic words and phrases are a large
share of the words, with one list per language. Off by default: the lists contain ordinary words
too ("drogas", "aborto"), so a single hit proves nothing (C4's one-word rule removed much medical
and LGBTQ text); a ratio and a minimum number of hits do not have that bias.

Lists come from the `safetext` package (maintained lists for en, es, pt and a dozen more languages;
installed without its language-detector dependency, only its word files are read) and from user
files per language (one word or phrase per line, `#` comments), which are added to the package's.
A document in a language with no list is kept, and the report counts it under `no_list`.
"""
from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
from pydantic import Field, field_validator

from quipu.catalog.files import sha256_file
from quipu.tasks.stage import Outcome, Stage, StageConfig, langs_of, split_by_mask

WORD = re.compile(r"\w+")


class BadWordsConfig(StageConfig):
    enabled: bool = False
    max_ratio: float = Field(0.01, gt=0, le=1, description="remove when listed words are more than this share of the document's words")
    min_matches: int = Field(3, ge=1, description="... and at least this many listed words or phrases were found")
    package_lists: bool = Field(True, description="use the lists shipped in the `safetext` package")
    word_lists: dict[str, list[str]] = Field(default_factory=dict, description="language -> files of extra words or phrases, e.g. {es: [lists/es.txt]}")

    @field_validator("word_lists")
    @classmethod
    def _files_exist(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for lang, paths in v.items():
            for p in paths:
                if not Path(p).is_file():
                    raise ValueError(f"{lang}: word list not found: {p}")
        return v


def package_list_dir() -> Path | None:
    """safetext's `languages/` folder, found without importing safetext (its import loads a language
    detector we do not install)."""
    spec = importlib.util.find_spec("safetext")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "languages"


def _phrases(lines) -> set[str]:
    out = set()
    for line in lines:
        words = WORD.findall(line.split("#", 1)[0].lower())
        if words:
            out.add(" ".join(words))
    return out


@lru_cache(maxsize=32)
def automaton(lang: str, package: bool, files: tuple[str, ...]):
    """An Aho-Corasick automaton of ` phrase ` for one language, or None when it has no list."""
    import ahocorasick
    phrases: set[str] = set()
    folder = package_list_dir() if package else None
    if folder is not None and (folder / lang / "words.txt").is_file():
        phrases |= _phrases((folder / lang / "words.txt").read_text(encoding="utf-8").splitlines())
    for f in files:
        phrases |= _phrases(Path(f).read_text(encoding="utf-8", errors="replace").splitlines())
    if not phrases:
        return None
    a = ahocorasick.Automaton()
    for p in sorted(phrases):
        a.add_word(f" {p} ", p)
    a.make_automaton()
    return a


def count_matches(text: str, auto) -> tuple[int, int]:
    """(listed words or phrases found, words in the text), on whole words only."""
    words = WORD.findall(text.lower())
    if not words:
        return 0, 0
    return sum(1 for _ in auto.iter(" " + " ".join(words) + " ")), len(words)


class BadWordsFilter(Stage):
    name = "bad_words"
    Config = BadWordsConfig

    def check(self) -> None:
        if self.config.package_lists and package_list_dir() is None:
            raise ValueError("bad_words.package_lists: the `safetext` package is not installed "
                             "(pip install --no-deps safetext), or set package_lists: false and give word_lists")

    def automaton_for(self, lang: str):
        return automaton(lang, self.config.package_lists, tuple(self.config.word_lists.get(lang, [])))

    def fingerprint(self, shard_plan) -> dict:
        files = [p for paths in self.config.word_lists.values() for p in paths]
        return {"lists": [sha256_file(p) for p in files], "package": str(package_list_dir())}

    def process(self, batch: pa.Table, shard_plan=None) -> Outcome:
        cfg = self.config
        keep, reasons = [], []
        no_list: dict[str, int] = {}
        matched: dict[str, int] = {}
        for text, lang in zip(batch.column("text").to_pylist(), langs_of(batch)):
            auto = self.automaton_for(lang)
            if auto is None:
                no_list[lang] = no_list.get(lang, 0) + 1
                keep.append(True); reasons.append(None)
                continue
            hits, words = count_matches(text, auto)
            if hits:
                matched[lang] = matched.get(lang, 0) + 1
            bad = hits >= cfg.min_matches and hits > cfg.max_ratio * words
            keep.append(not bad)
            reasons.append("bad_words:ratio" if bad else None)
        kept, removed = split_by_mask(batch, keep, reasons)
        return Outcome(kept, removed, {"no_list": no_list, "docs_with_matches": matched})
