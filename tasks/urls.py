"""Stage `urls`: remove documents by their URL before anything reads their text.

The lists are datatrove's, as FineWeb uses them, read from the files datatrove ships (no download):
the adult-site blocklist (`url_filterblacklistsv0_3_0.tar.gz`: 4.6 M domains and 20 k URLs),
banned words of a URL, soft-banned words (`soft_word_threshold` of them), and banned subwords of
the URL with its punctuation removed. Users add their own lists (files of domains or URLs, one per
line, `#` comments) and an allow-list that overrides every other list. Reasons name the list:
`url:blocklist:adult`, `url:banned_word`, `url:soft_banned_words`, `url:banned_subword`,
`url:user_list`. A document without a URL is kept (and counted).

datatrove's `URLFilter` is not used as is because it extracts the blocklist under the home folder
at run time, lets tldextract fetch the public-suffix list from the network, holds the 4.6 M domains
as a Python set (~0.5 GB per worker) and compares URLs *with* their scheme against a list without
one (so its URL list never matches). Here the domains are a sorted array of 64-bit hashes (36 MB),
the suffix list is tldextract's bundled snapshot, and URLs are compared without scheme or `www.`.
"""
from __future__ import annotations

import re
import tarfile
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import xxhash
from pydantic import Field, field_validator

from quipu.catalog.files import sha256_file
from quipu.tasks.stage import Outcome, RunContext, Stage, StageConfig, split_by_mask

BLOCKLIST_ARCHIVE = "url_filterblacklistsv0_3_0.tar.gz"
URL_WORD_SPLIT = re.compile(r"[^a-zA-Z0-9]+")     # datatrove's URL normaliser
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


class UrlsConfig(StageConfig):
    blocklist: bool = Field(True, description="datatrove's bundled adult-site list of domains and URLs (url:blocklist:adult)")
    banned_words: bool = Field(True, description="datatrove's banned words, soft-banned words and banned subwords of a URL")
    soft_word_threshold: int = Field(2, ge=1, description="soft-banned words in one URL that remove it (datatrove: 2)")
    block_lists: list[str] = Field(default_factory=list, description="files of domains or URLs to remove (url:user_list); a domain also blocks its subdomains")
    allow_lists: list[str] = Field(default_factory=list, description="files of domains or URLs never removed by this stage (overrides every list)")

    @field_validator("block_lists", "allow_lists")
    @classmethod
    def _files_exist(cls, paths: list[str]) -> list[str]:
        for p in paths:
            if not Path(p).is_file():
                raise ValueError(f"list file not found: {p}")
        return paths


def _hash(s: str) -> int:
    return xxhash.xxh64_intdigest(s.encode("utf-8", "replace"))


@lru_cache(maxsize=1)
def adult_lists() -> tuple[np.ndarray, frozenset[str]]:
    """(sorted xxh64 hashes of the blocklist's domains, its URLs without scheme), once per process.
    Hashing 4.6 M domains takes seconds, so the array is kept in the cache folder (db.cache_home), named by the
    archive's hash (a datatrove upgrade with a new list builds a new one)."""
    from datatrove.utils._import_utils import ASSETS_PATH
    from quipu.catalog.db import cache_home
    from quipu.tasks.dedup_index import save_npy
    archive = Path(ASSETS_PATH) / BLOCKLIST_ARCHIVE
    cached = cache_home() / f"url-blocklist-{sha256_file(archive)[:16]}.npy"
    with tarfile.open(archive, "r:gz") as tar:
        urls = tar.extractfile("urls").read().decode("utf-8", "replace").split("\n")
        if cached.exists():
            hashes = np.load(cached)
        else:
            domains = tar.extractfile("domains").read().decode("utf-8", "replace").split("\n")
            hashes = np.fromiter((_hash(d.strip().lower()) for d in domains if d.strip() and not d.startswith("#")),
                                 dtype=np.uint64)
            hashes.sort()
            save_npy(cached, hashes)
    return hashes, frozenset(u.strip().lower().rstrip("/") for u in urls if u.strip() and not u.startswith("#"))


@lru_cache(maxsize=1)
def banned_word_lists() -> tuple[frozenset[str], frozenset[str], object]:
    """datatrove's (banned words, soft-banned words, Aho-Corasick automaton of banned subwords)."""
    import ahocorasick
    from datatrove.pipeline.filters.url_filter import get_list
    from datatrove.utils._import_utils import ASSETS_PATH
    words = frozenset(get_list(ASSETS_PATH, "banned_words.txt", set()))
    soft = frozenset(get_list(ASSETS_PATH, "soft_banned_words.txt", set()))
    automaton = ahocorasick.Automaton(ahocorasick.STORE_INTS)
    for i, w in enumerate(sorted(get_list(ASSETS_PATH, "banned_subwords.txt", set()))):
        automaton.add_word(w, i)
    automaton.make_automaton()
    return words, soft, automaton


@lru_cache(maxsize=1)
def _tld_extractor():
    from tldextract import TLDExtract
    return TLDExtract(suffix_list_urls=(), cache_dir=None)   # the bundled public-suffix snapshot only


def bare_url(url: str) -> str:
    """The URL as the lists write it: lower case, no scheme, no `www.`, no trailing slash."""
    u = SCHEME.sub("", url.strip().lower()).rstrip("/")
    return u[4:] if u.startswith("www.") else u


def host_of(url: str) -> str:
    host = bare_url(url).split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    return host.rsplit("@", 1)[-1].split(":", 1)[0]


@lru_cache(maxsize=1 << 18)   # ~50 MB at most; every stage's report looks the same hosts up
def host_domain(host: str) -> tuple[str | None, str | None]:
    """(registered domain, top-level domain) of a host: `news.bbc.co.uk` -> (bbc.co.uk, uk),
    `www.folha.uol.com.br` -> (uol.com.br, br); an IP address: (the address, None); a host
    without a public suffix (`localhost`, junk): (None, None)."""
    if not host:
        return None, None
    parts = _tld_extractor()(host)
    if not parts.suffix:
        return (host, None) if parts.ipv4 or parts.ipv6 else (None, None)
    return parts.top_domain_under_public_suffix or host, parts.suffix.rsplit(".", 1)[-1]


def url_domains(urls: list[str | None]) -> tuple[list[str | None], list[str | None]]:
    """The `domain` and `tld` columns curate adds: registered domain and public suffix per URL."""
    pairs = [host_domain(host_of(u)) if u else (None, None) for u in urls]
    return [d for d, _ in pairs], [t for _, t in pairs]


URL_FIELDS = [pa.field("domain", pa.string()), pa.field("tld", pa.string())]


def with_url_columns(table: pa.Table) -> pa.Table:
    """`table` with `domain` and `tld` from its `url` (replacing any earlier ones; null without a URL)."""
    urls = table.column("url").to_pylist() if "url" in table.column_names else [None] * table.num_rows
    for f, values in zip(URL_FIELDS, url_domains(urls)):
        if f.name in table.column_names:
            table = table.drop_columns([f.name])
        table = table.append_column(f, pa.array(values, f.type))
    return table


def host_suffixes(host: str) -> list[str]:
    """`a.b.example.com` -> [a.b.example.com, b.example.com, example.com, com]."""
    parts = host.split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


class UrlList:
    """A user's file of domains and URLs: a domain matches itself and its subdomains."""

    def __init__(self, paths: list[str]):
        self.domains: set[str] = set()
        self.urls: set[str] = set()
        for p in paths:
            for line in Path(p).read_text(encoding="utf-8", errors="replace").splitlines():
                entry = line.split("#", 1)[0].strip()
                if not entry:
                    continue
                bare = bare_url(entry)
                (self.urls if "/" in bare else self.domains).add(bare)

    def matches(self, url: str, host: str) -> bool:
        return bare_url(url) in self.urls or any(s in self.domains for s in host_suffixes(host))


class UrlFilter(Stage):
    name = "urls"
    Config = UrlsConfig

    def __init__(self, config: UrlsConfig, context: RunContext | None = None):
        super().__init__(config, context)
        self.block = UrlList(config.block_lists)
        self.allow = UrlList(config.allow_lists)

    def check(self) -> None:
        if self.config.blocklist:
            adult_lists()
        if self.config.banned_words:
            banned_word_lists()

    def fingerprint(self, shard_plan) -> dict:
        return {"lists": [sha256_file(p) for p in [*self.config.block_lists, *self.config.allow_lists]]}

    def judge(self, url: str) -> tuple[str | None, str | None]:
        """(removal reason or None, which entry kind matched: domain, subdomain, url, word ...)."""
        cfg = self.config
        host = host_of(url)
        if self.allow.matches(url, host):
            return None, "allow_list"
        if self.block.matches(url, host):
            return "url:user_list", "user_list"
        if cfg.blocklist:
            hashes, adult_urls = adult_lists()
            registered = _tld_extractor()(host).top_domain_under_public_suffix
            for kind, name in (("domain", registered), ("subdomain", host)):
                if name and _in_sorted(hashes, _hash(name)):
                    return "url:blocklist:adult", kind
            if bare_url(url) in adult_urls:
                return "url:blocklist:adult", "url"
        if cfg.banned_words:
            words, soft, subwords = banned_word_lists()
            url_words = set(URL_WORD_SPLIT.split(url.lower()))
            if not url_words.isdisjoint(words):
                return "url:banned_word", "banned_word"
            if len(url_words & soft) >= cfg.soft_word_threshold:
                return "url:soft_banned_words", "soft_banned_words"
            if next(subwords.iter(URL_WORD_SPLIT.sub("", url.lower())), None) is not None:
                return "url:banned_subword", "banned_subword"
        return None, None

    def process(self, batch: pa.Table, shard_plan=None) -> Outcome:
        urls = batch.column("url").to_pylist() if "url" in batch.column_names else [None] * batch.num_rows
        keep, reasons = [], []
        matched: dict[str, int] = {}
        no_url = 0
        for url in urls:
            reason, kind = self.judge(url) if url else (None, None)
            no_url += not url
            if kind:
                matched[kind] = matched.get(kind, 0) + 1
            keep.append(reason is None)
            reasons.append(reason)
        kept, removed = split_by_mask(batch, keep, reasons)
        return Outcome(kept, removed, {"matched": matched, "no_url": no_url})


def _in_sorted(arr: np.ndarray, value: int) -> bool:
    i = int(np.searchsorted(arr, np.uint64(value)))
    return i < len(arr) and int(arr[i]) == value
