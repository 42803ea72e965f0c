"""HTML page -> main text: resiliparse with a guard, or trafilatura. Runs inside extract's child
process (tasks/extract.py), so a page that hangs or crashes a parser costs that page only.

`fast` (the default) extracts the main content with resiliparse (Lexbor, C): about 15x
trafilatura's speed, but on its own it keeps more boilerplate (captions, bylines, headers, comment
threads). Two things close most of that gap:
- elements that are boilerplate by their class or id (caption, author, byline) and `<header>` are
  skipped while extracting: the subset of trafilatura's discard rules that paid on the pages it
  was measured on (bench/extract_throughput.py; each rule was tried alone, most did nothing or
  removed article text: a page's wrapper `<div class="...sidebar...">` holds the article);
- a guard: when little of the text is prose (lines of 8+ words that end like a sentence), the
  page is one resiliparse handles badly (listings, forums, link-heavy layouts) and trafilatura
  (its fast mode, no fallback extractors) extracts it instead. So is a page where resiliparse
  finds no text at all (when only skipping the boilerplate elements left none, the article sat
  inside one of them: resiliparse's text without the skip is used).

`trafilatura` is trafilatura alone (with its fallback extractors unless `fast`), as before.
Which path each page took is counted (`html_extractor` in extract's report).
"""
from __future__ import annotations

import re

METHODS = ("fast", "trafilatura")
BOILERPLATE_TAGS = ("div", "section", "span", "p", "ul", "ol", "li", "aside", "table")
BOILERPLATE_WORDS = ("caption", "author", "byline")
SKIP = [f'{tag}[{attr}*="{word}" i]' for tag in BOILERPLATE_TAGS for attr in ("class", "id")
        for word in BOILERPLATE_WORDS] + ["header"]
PROSE_MIN_WORDS = 8
_SENTENCE_END = re.compile(r"[.!?:;\"'\u201d\u2019\u00bb)\u2026\u3002\uff01\uff1f]\s*$")

# which path a page took (extract's report, `html_extractor`)
FAST = "resiliparse"
GUARD_LOW_PROSE = "trafilatura (guard: low prose share)"
GUARD_NO_TEXT = "trafilatura (guard: resiliparse found no text)"
TRAFILATURA = "trafilatura"


def prose_words(text: str) -> tuple[int, int]:
    """(words in prose lines: 8+ words, ending like a sentence; all words)."""
    words = prose = 0
    for line in text.splitlines():
        n = len(line.split())
        words += n
        if n >= PROSE_MIN_WORDS and _SENTENCE_END.search(line):
            prose += n
    return prose, words


def prose_share(text: str) -> float:
    prose, words = prose_words(text)
    return prose / words if words else 0.0


def _decoded(html: bytes | str) -> str:
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding
    return html if isinstance(html, str) else bytes_to_str(html, detect_encoding(html))


def resiliparse_text(html: bytes | str, skip: list[str] | None = SKIP) -> str:
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree
    tree = HTMLTree.parse(_decoded(html))
    return extract_plain_text(tree, main_content=True, comments=False, alt_texts=False, list_bullets=False,
                              skip_elements=skip or None)


def trafilatura_text(html: bytes | str, url: str | None, opts: dict, fast: bool) -> str | None:
    import trafilatura
    return trafilatura.extract(html, url=url, no_fallback=fast, **opts)


def main_text(html: bytes | str, url: str | None, method: str, opts: dict, min_prose: float) -> tuple[str | None, str]:
    """(text or None, the path it took). `opts`: trafilatura's include_comments, include_tables,
    favor_precision, favor_recall."""
    if method == "trafilatura":
        return trafilatura_text(html, url, opts, fast=False), TRAFILATURA
    text = resiliparse_text(html)
    if not text.strip():
        text = resiliparse_text(html, skip=None)
        if not text.strip():
            return trafilatura_text(html, url, opts, fast=True), GUARD_NO_TEXT
    if prose_share(text) < min_prose:
        return trafilatura_text(html, url, opts, fast=True), GUARD_LOW_PROSE
    return text, FAST


def serve(conn) -> None:
    """The child process's loop (`child_worker.ChildWorker`): (html, url, method, opts, min_prose)
    in, ("ok", (text, path)) or ("error", message) out, in order. A thread takes the messages off
    the pipe as they come, so the parent can send a page while this one answers the one before
    (neither side ever blocks on a full pipe)."""
    import logging
    import queue
    import threading
    # trafilatura logs "lxml parsing failed: Document is empty" and the like at ERROR for pages with
    # no text; each such page is already counted as a removal with its reason (extract:no_text), so
    # its log lines are noise on the user's terminal
    logging.getLogger("trafilatura").addHandler(logging.NullHandler())
    logging.getLogger("trafilatura").propagate = False
    # both parsers imported before "ready": the parent launches this process as its unit starts
    # (`HtmlExtractor.prestart`), so these imports overlap its own start-up; a crawl's first
    # listing page needs trafilatura anyway
    import resiliparse.extract.html2text  # noqa: F401
    import trafilatura  # noqa: F401
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def take() -> None:
        while True:
            try:
                inbox.put(conn.recv())
            except (EOFError, OSError):
                inbox.put(None)
                return

    threading.Thread(target=take, daemon=True).start()
    conn.send(("ready", None))
    while (msg := inbox.get()) is not None:
        html, url, method, opts, min_prose = msg
        try:
            conn.send(("ok", main_text(html, url, method, opts, min_prose)))
        except Exception as e:  # parser errors are per-document outcomes
            conn.send(("error", f"{type(e).__name__}: {e}"[:300]))
