"""The embedded demo corpus: real text from installed packages (synthetic/sources.py), packaged as
a small web crawl (WARC) and two text dumps (JSONL), with the junk real inputs bring.

`build_demo_corpus(out_dir)` writes, deterministically (fixed seed, fixed WARC dates and record ids,
gzip without timestamps: the same bytes on every build with the same installed packages):

    raw/crawl-0000{0,1,2}.warc.gz   HTTP responses (HTML pages with navigation, cookie banner,
                                    sidebar and footer around the article; images, JSON, CSS;
                                    redirects), one request record, a warcinfo record per file
    raw/text-dump-a.jsonl           plain-text documents: id, url, text, date + extra fields,
                                    and the malformed lines
    raw/text-dump-b.jsonl.gz        the same kind, gzip
    raw/pdf/*.pdf                   PDFs made here from the same real text (synthetic/pdfs.py, reportlab):
                                    a Spanish report in two columns and a Portuguese bulletin in one,
                                    with running headers, page numbers and hyphenation; an English
                                    page scanned (image only: OCR); one locked with a password
    labels.jsonl                    what we planted: one line per record (file, id, kind, lang,
                                    origin), outside raw/ so it is never curated

Kinds of records (`labels.jsonl` `kind`): `article` (real text in en/es/pt), `foreign` (fr, de,
it, nl, gl, ca), `near_duplicate` (an article with a few words changed), `exact_duplicate` (the same
text again under another URL or id), `boilerplate_only` (navigation and footer, no content),
`redirect`, `not_html` (image, JSON, CSS), `keyboard_noise`, `spam` (repeated lines, keyword
stuffing), `short`, `word_salad` (real words in random order), `benchmark_leak` (HumanEval
prompts quoted in a blog post), `binary_junk`, `empty`, `pii` (an article with a contact paragraph:
e-mail, phone, IP, DNI/CPF), `blocked_url` (an article under a URL of datatrove's adult blocklist or
with a banned word), and for the JSONL dumps `malformed_json`, `invalid_utf8`, `missing_text`;
the PDFs are `pdf` (born-digital), `pdf_scan` (image only) and `pdf_encrypted`.
Pages of the help sites (and their copies and stubs) end with the site's feedback line, the
boilerplate that survives extraction and that line-level dedup removes.
"""
from __future__ import annotations

import gzip
import html
import io
import json
import random
import re
import struct
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from quipu.catalog.files import atomic_path, read_json, sha256_file, write_json_atomic
from quipu.synthetic import sources as src
from quipu.synthetic.sources import Article, Block

SEED = 20261122
CORPUS_VERSION = 7                      # bump when the builder changes what it writes
CRAWL_START = datetime(2026, 10, 5, 6, 0, 0)
WARC_FILES = 3
MANIFEST = "manifest.json"

# How many of each planted kind, at scale 1.0 (each at least 1 at any scale).
JUNK_COUNTS = {
    "boilerplate_only": 60, "redirect": 12, "not_html": 45, "keyboard_noise": 40, "spam": 45, "short": 60,
    "word_salad": 40, "benchmark_leak": 12, "binary_junk": 4, "empty": 6, "near_duplicate": 90,
    "exact_duplicate": 80, "malformed_json": 6, "invalid_utf8": 1, "missing_text": 2,
    "pii": 24, "blocked_url": 9,
}
# Floors at small scales, so that a small build (tests) still gives dedup and decontam their cases.
JUNK_MIN = {"near_duplicate": 6, "exact_duplicate": 6, "benchmark_leak": 4, "pii": 6, "blocked_url": 3}
JSONL_SHARE = 0.3                       # share of documents that go to the JSONL dumps


# ---- sites: the boilerplate around the articles ---------------------------------------------------

@dataclass(frozen=True)
class Site:
    host: str
    name: str
    lang: str
    section: str

    @property
    def base(self) -> str:
        return f"https://{self.host}"


BOILERPLATE = {
    "en": dict(home="Home", nav=["Docs", "Tutorials", "Blog", "Community", "Download", "About"],
               cookie="We use cookies to improve your experience. By continuing to browse you agree to our use of cookies.",
               accept="Accept", related="Related pages", rights="All rights reserved.",
               legal=["Privacy policy", "Terms of use", "Cookie settings", "Contact"], search="Search",
               newsletter="Subscribe to our newsletter", login="Log in", password="Password", user="User name",
               tags="Browse by tag", notfound="Sign in to continue",
               helpful="Was this page helpful? Tell us what to improve through the feedback form."),
    "es": dict(home="Inicio", nav=["Ayuda", "Guías", "Blog", "Comunidad", "Descargas", "Quiénes somos"],
               cookie="Utilizamos cookies propias y de terceros para mejorar nuestros servicios. Si continúa navegando, consideramos que acepta su uso.",
               accept="Aceptar", related="Artículos relacionados", rights="Todos los derechos reservados.",
               legal=["Aviso legal", "Política de privacidad", "Política de cookies", "Contacto"], search="Buscar",
               newsletter="Suscríbase a nuestro boletín", login="Iniciar sesión", password="Contraseña",
               user="Usuario", tags="Explorar por etiqueta", notfound="Inicie sesión para continuar",
               helpful="¿Le resultó útil este artículo? Cuéntenos qué mejorar en el formulario de comentarios."),
    "pt": dict(home="Início", nav=["Ajuda", "Guias", "Blog", "Comunidade", "Downloads", "Sobre nós"],
               cookie="Usamos cookies para melhorar a sua experiência. Ao continuar navegando, você concorda com a nossa política.",
               accept="Aceitar", related="Artigos relacionados", rights="Todos os direitos reservados.",
               legal=["Termos de uso", "Política de privacidade", "Cookies", "Fale conosco"], search="Buscar",
               newsletter="Assine a nossa newsletter", login="Entrar", password="Senha", user="Usuário",
               tags="Navegar por etiqueta", notfound="Entre para continuar",
               helpful="Este artigo foi útil? Conte-nos o que melhorar no formulário de comentários."),
}
for _lang, _words in {"fr": ("Accueil", "Aide", "Tous droits réservés."), "de": ("Startseite", "Hilfe", "Alle Rechte vorbehalten."),
                      "it": ("Home", "Aiuto", "Tutti i diritti riservati."), "nl": ("Home", "Hulp", "Alle rechten voorbehouden."),
                      "gl": ("Inicio", "Axuda", "Todos os dereitos reservados."), "ca": ("Inici", "Ajuda", "Tots els drets reservats.")}.items():
    BOILERPLATE[_lang] = {**BOILERPLATE["en"], "home": _words[0], "nav": [_words[1], "Blog", "Forum"], "rights": _words[2]}

SITES = {
    "pydoc": Site("docs.pyref.example.org", "PyRef", "en", "reference"),
    "readme": Site("packages.example.com", "Package Index Mirror", "en", "project"),
    "licence": Site("packages.example.com", "Package Index Mirror", "en", "licence"),
    "mirror": Site("mirror.devdocs.example.net", "DevDocs Mirror", "en", "mirror"),
    "blog": Site("blog.codenotes.example.net", "Code Notes", "en", "posts"),
    "spam": Site("best-deals-online.example.com", "Best Deals", "en", "offers"),
    "es": Site("ayuda.portal.example.org", "Portal de ayuda", "es", "articulos"),
    "pt": Site("ajuda.portal.example.org", "Central de ajuda", "pt", "artigos"),
    **{lang: Site(f"{lang}.help.example.org", "Help", lang, "docs") for lang in ("fr", "de", "it", "nl", "gl", "ca")},
}


def slug(text: str, n: int = 60) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower().encode("ascii", "ignore").decode()).strip("-")
    return s[:n].strip("-") or "page"


# ---- documents ------------------------------------------------------------------------------------

@dataclass
class Doc:
    """One planted record before packaging."""
    kind: str
    lang: str
    title: str
    blocks: list[Block]
    site: Site
    path: str
    origin: str
    channel: str = "warc"                 # warc | jsonl
    body: bytes | None = None             # raw payload for non-HTML records and odd JSONL lines
    content_type: str = "text/html; charset=utf-8"
    status: str = "200 OK"
    extra_headers: list[tuple[str, str]] = field(default_factory=list)
    boilerplate_only: bool = False
    id: str = ""
    url: str = ""

    def plain(self) -> str:
        return "\n\n".join(b.plain() for b in self.blocks)


class DocumentPlan:
    """Chooses, from the real articles, what goes into the corpus and plants the junk. Seeded."""

    def __init__(self, scale: float, seed: int):
        self.scale = scale
        self.rng = random.Random(seed)

    def n(self, kind: str) -> int:
        return max(JUNK_MIN.get(kind, 1), round(JUNK_COUNTS[kind] * self.scale))

    def take(self, items: list, fraction: float | None = None) -> list:
        k = max(1, round(len(items) * (self.scale if fraction is None else fraction)))
        return self.rng.sample(items, min(k, len(items)))

    def build(self) -> list[Doc]:
        rng = self.rng
        docs: list[Doc] = []
        # all of Python's reference, half of the READMEs: enough English, and curate stays under 2 min
        english = [(a, SITES["pydoc"]) for a in self.take(src.python_reference_articles())]
        english += [(a, SITES["readme"]) for a in self.take(src.readme_articles(), fraction=0.5 * self.scale)]
        licences = src.licence_articles()
        articles = [self._article(a, site, "article") for a, site in english]
        articles += [self._article(a, SITES["licence"], "article") for a in self.take(licences)]
        for lang in ("es", "pt"):
            articles += [self._article(a, SITES[lang], "article") for a in self.take(src.catalogue_articles(lang))]
        docs += articles
        for lang in ("fr", "de", "it", "nl", "gl", "ca"):
            arts = src.catalogue_articles(lang)
            docs += [self._article(a, SITES[lang], "foreign") for a in self.take(arts, fraction=0.5 * self.scale)]
        long_articles = [d for d in articles if len(d.plain().split()) >= 150]
        near_sources = rng.sample(long_articles, min(self.n("near_duplicate"), len(long_articles)))
        exact_sources = rng.sample(articles, min(self.n("exact_duplicate"), len(articles)))
        docs += [self._near_duplicate(d) for d in near_sources]
        docs += [self._exact_duplicate(d) for d in exact_sources]
        copied = near_sources + exact_sources
        docs += [self._boilerplate_only(i) for i in range(self.n("boilerplate_only"))]
        docs += [self._redirect(rng.choice(articles), i) for i in range(self.n("redirect"))]
        docs += [self._not_html(i) for i in range(self.n("not_html"))]
        docs += [self._keyboard_noise(i) for i in range(self.n("keyboard_noise"))]
        docs += [self._spam(i) for i in range(self.n("spam"))]
        docs += [self._short(rng.choice(articles), i) for i in range(self.n("short"))]
        docs += [self._word_salad(rng.choice(long_articles or articles), i) for i in range(self.n("word_salad"))]
        problems = [p for p in src.humaneval_prompts() if len(humaneval_statement(p["prompt"]).split()) >= 25]
        docs += [self._benchmark_leak(p) for p in rng.sample(problems, min(self.n("benchmark_leak"), len(problems)))]
        docs += [self._binary_junk(i) for i in range(self.n("binary_junk"))]
        # personal data in articles nobody copied (a copy would be removed by dedup before redaction shows)
        originals = [d for d in long_articles if d.site is not SITES["licence"] and all(d is not c for c in copied)]
        for i, d in enumerate(rng.sample(originals, min(self.n("pii"), len(originals)))):
            self._plant_pii(d, i)
        docs += [self._blocked_url(rng.choice(articles), i) for i in range(self.n("blocked_url"))]
        for d in docs:
            if d.channel == "warc" and d.kind not in ("not_html", "redirect", "boilerplate_only", "binary_junk") \
                    and rng.random() < JSONL_SHARE:
                d.channel = "jsonl"
        docs += [self._empty(i) for i in range(self.n("empty"))]
        docs += [self._bad_line(kind, i) for kind in ("malformed_json", "invalid_utf8", "missing_text")
                 for i in range(self.n(kind))]
        rng.shuffle(docs)
        self._dedupe_urls(docs)
        return docs

    # -- real text

    def _article(self, a: Article, site: Site, kind: str) -> Doc:
        return Doc(kind, a.lang, a.title, list(a.blocks) + signoff(site), site, f"/{site.section}/{slug(a.title)}", a.origin)

    def _near_duplicate(self, d: Doc) -> Doc:
        """The same article re-published elsewhere with 1-3 words changed (a typo fixed, a date bumped)."""
        blocks = [Block(b.tag, b.text, list(b.items)) for b in d.blocks]
        paras = [b for b in blocks if b.tag == "p" and len(b.text.split()) >= 8]
        for _ in range(self.rng.randint(1, 3)):
            if not paras:
                break
            b = self.rng.choice(paras)
            words = b.text.split()
            i = self.rng.randrange(len(words))
            j = self.rng.randrange(len(words))
            words[i] = words[j]
            b.text = " ".join(words)
        site = SITES["mirror"] if d.lang == "en" else d.site
        return Doc("near_duplicate", d.lang, d.title, blocks, site, f"/{site.section}{d.path}-copy", f"near-duplicate of {d.origin}")

    def _exact_duplicate(self, d: Doc) -> Doc:
        site = SITES["mirror"] if d.lang == "en" else d.site
        return Doc("exact_duplicate", d.lang, d.title, list(d.blocks), site, f"/archive{d.path}", f"copy of {d.origin}")

    def _short(self, d: Doc, i: int) -> Doc:
        text = next((b.text for b in d.blocks if b.tag == "p"), d.title)
        sentence = re.split(r"(?<=[.!?])\s", text)[0][:200]
        return Doc("short", d.lang, d.title, [Block("p", sentence)] + signoff(d.site), d.site, f"{d.path}/comment-{i}",
                   f"first sentence of {d.origin}")

    def _word_salad(self, d: Doc, i: int) -> Doc:
        """Real words of a real article in random order: passes simple counts, reads as nonsense."""
        words = d.plain().replace("\n- ", " ").split()
        self.rng.shuffle(words)
        n = min(len(words), 220)
        sentences, pos = [], 0
        while pos < n:
            k = self.rng.randint(8, 16)
            chunk = words[pos:pos + k]
            sentences.append(" ".join(chunk).capitalize().rstrip(".,;:") + ".")
            pos += k
        paras = [" ".join(sentences[j:j + 5]) for j in range(0, len(sentences), 5)]
        site = SITES["spam"] if d.lang == "en" else d.site
        return Doc("word_salad", d.lang, d.title, [Block("p", p) for p in paras], site,
                   f"/{site.section}/article-{i}", f"shuffled words of {d.origin}")

    def _benchmark_leak(self, problem: dict) -> Doc:
        """A blog post that quotes a HumanEval task statement word for word (and its solution)."""
        name = problem["entry_point"]
        statement = humaneval_statement(problem["prompt"])
        blocks = [
            Block("p", f"Today's practice problem is called {name}. I liked it because the statement is short "
                       "but the edge cases are easy to miss, so it is a good warm-up before an interview. "
                       "As usual, I will first restate the task and then explain how I approached it."),
            Block("p", f"Here is the task exactly as it was given to me: {statement}"),
            Block("p", "My first attempt was too clever and failed on the empty input, so the version below "
                       "is the plain one. Read the statement again before you look at it, and try it on your "
                       "own first; the point of these exercises is the thinking, not the answer."),
            Block("pre", problem["canonical_solution"].strip("\n")),
            Block("p", "If you found this useful, the other posts in this series walk through similar problems "
                       "step by step, and the comments are open for questions and better solutions."),
        ]
        return Doc("benchmark_leak", "en", f"Coding practice: {name}", blocks, SITES["blog"],
                   f"/posts/coding-practice-{slug(name)}", f"human_eval:{problem['task_id']}")

    def _plant_pii(self, d: Doc, i: int) -> None:
        """Adds a contact paragraph to an article: e-mail, phone, IP, national id (kind `pii`)."""
        r = self.rng
        user = r.choice(["maria.silva", "jgarcia", "ana_souza", "pedro.lopez", "jsmith", "l.martins"]) + str(r.randrange(10, 99))
        email = f"{user}@{r.choice(['gmail.com', 'hotmail.com', 'uol.com.br', 'yahoo.es', 'outlook.com'])}"
        ip = f"{r.randrange(23, 220)}.{r.randrange(1, 255)}.{r.randrange(1, 255)}.{r.randrange(1, 255)}"
        if d.lang == "es":
            n = r.randrange(10_000_000, 99_999_999)
            text = (f"Para más información escriba a {email} o llame al +34 6{r.randrange(10, 99)} {r.randrange(100, 999)} "
                    f"{r.randrange(100, 999)}. Titular: DNI {n}{'TRWAGMYFPDXBNJZSQVHLCKE'[n % 23]}. Conexión registrada desde {ip}.")
        elif d.lang == "pt":
            text = (f"Contato: {email}, telefone (11) 9{r.randrange(1000, 9999)}-{r.randrange(1000, 9999)}. "
                    f"CPF do responsável: {cpf(r)}. Acesso registrado a partir do IP {ip}.")
        else:
            text = (f"Questions? Write to {email} or call (212) {r.randrange(201, 989)}-{r.randrange(1000, 9999)}. "
                    f"Last edited from {ip}.")
        d.kind = "pii"
        d.blocks = list(d.blocks) + [Block("p", text)]
        d.origin = f"{d.origin} with a planted contact paragraph"

    # datatrove's adult-site blocklist names these domains; the last one is caught by a banned word in the path
    BLOCKED_URLS = ["https://www.pornhub.com/view_video-{i}", "http://xvideos.com/video{i}/article",
                    "https://blog.codenotes.example.net/posts/xxx-videos-{i}"]

    def _blocked_url(self, d: Doc, i: int) -> Doc:
        doc = Doc("blocked_url", d.lang, d.title, list(d.blocks), SITES["blog"], "", f"{d.origin} under a blocklisted URL")
        doc.url = self.BLOCKED_URLS[i % len(self.BLOCKED_URLS)].format(i=i)
        return doc

    # -- junk

    def _boilerplate_only(self, i: int) -> Doc:
        lang = self.rng.choice(["en", "en", "es", "pt"])
        site = {"en": SITES["readme"], "es": SITES["es"], "pt": SITES["pt"]}[lang]
        d = Doc("boilerplate_only", lang, BOILERPLATE[lang]["tags"], [], site, f"/tags/page-{i + 1}",
                "navigation, cookie banner and footer only", boilerplate_only=True)
        return d

    def _redirect(self, target: Doc, i: int) -> Doc:
        d = Doc("redirect", target.lang, "", [], target.site, f"/go/{i}", f"redirect to {target.path}",
                body=b"", status="301 Moved Permanently")
        d.extra_headers = [("Location", target.site.base + target.path)]
        return d

    def _not_html(self, i: int) -> Doc:
        kind = i % 3
        site = SITES["readme"]
        if kind == 0:
            body, ctype, path = _png(self.rng, 16 + i % 16, 16), "image/png", f"/static/img/icon-{i}.png"
        elif kind == 1:
            obj = {"project": f"pkg-{i}", "releases": [{"version": f"1.{j}.0", "downloads": self.rng.randrange(10**6)}
                                                        for j in range(self.rng.randint(2, 6))], "page": i}
            body, ctype, path = json.dumps(obj).encode(), "application/json", f"/api/v1/projects/{i}"
        else:
            body = "\n".join(f".c{j} {{ margin: {j}px; color: #{self.rng.randrange(16**6):06x}; }}"
                             for j in range(20)).encode()
            ctype, path = "text/css", f"/static/css/site-{i}.css"
        return Doc("not_html", "xx", "", [], site, path, "generated", body=body, content_type=ctype)

    def _keyboard_noise(self, i: int) -> Doc:
        rows = ["qwertyuiop", "asdfghjkl", "zxcvbnm", "1234567890", "qwertzuiop", "ñlkjhgf"]
        words = []
        for _ in range(self.rng.randint(30, 120)):
            row = self.rng.choice(rows)
            a = self.rng.randrange(len(row) - 2)
            words.append(row[a:a + self.rng.randint(2, len(row) - a)] * self.rng.randint(1, 2))
        lines = [" ".join(words[j:j + 9]) for j in range(0, len(words), 9)]
        lang = self.rng.choice(["en", "es", "pt"])
        return Doc("keyboard_noise", lang, "re: re: test", [Block("p", ln) for ln in lines],
                   SITES["es"] if lang == "es" else SITES["pt"] if lang == "pt" else SITES["blog"],
                   f"/forum/thread-{1000 + i}", "generated keyboard mashing")

    SPAM_LINES = ["BUY CHEAP WATCHES ONLINE BEST PRICE GUARANTEED", "Click here for the best deals!!!",
                  "Limited offer - free shipping today only", "casino bonus free spins no deposit",
                  "replica watches cheap replica watches best replica", "Call now: 1-800-000-0000",
                  "Compra ya con descuento del 90% envío gratis", "Ganhe dinheiro rápido sem sair de casa"]

    def _spam(self, i: int) -> Doc:
        line = self.SPAM_LINES[i % len(self.SPAM_LINES)]
        other = self.SPAM_LINES[(i + 3) % len(self.SPAM_LINES)]
        lines = [line] * self.rng.randint(8, 25) + [other] * self.rng.randint(3, 8)
        self.rng.shuffle(lines)
        return Doc("spam", "en", line.title()[:60], [Block("p", ln) for ln in lines], SITES["spam"],
                   f"/offers/{slug(line)}-{i}", "generated spam")

    def _binary_junk(self, i: int) -> Doc:
        noise = bytes(self.rng.randrange(0, 32) for _ in range(400)).decode("latin-1")
        text = "Attachment preview:\n" + noise
        d = Doc("binary_junk", "xx", "attachment", [Block("p", text)], SITES["blog"], f"/files/attachment-{i}.txt",
                "generated control characters", content_type="text/plain; charset=utf-8")
        d.body = text.encode("utf-8")
        return d

    def _empty(self, i: int) -> Doc:
        return Doc("empty", "xx", "", [Block("p", " " * (i % 3))], SITES["blog"], f"/forum/deleted-{i}",
                   "a deleted post", channel="jsonl")

    def _bad_line(self, kind: str, i: int) -> Doc:
        if kind == "malformed_json":
            variants = [b'{"id": "post-trunc-%d", "text": "The connection was reset while writ' % i,
                        b"{'id': 'post-single-quotes-%d', 'text': 'Python repr, not JSON'}" % i,
                        b'{"id": "post-%d", "text": "unescaped "quotes" inside"}' % i,
                        b'["an", "array", "not", "an", "object", %d]' % i]
            body = variants[i % len(variants)]
        elif kind == "invalid_utf8":
            body = ('{"id": "post-latin1-%d", "text": "Política de privacidad y protección de datos"}' % i).encode("latin-1")
        else:
            body = b'{"id": "post-notext-%d", "url": "https://forum.example.org/t/%d", "title": "no body"}' % (i, i)
        return Doc(kind, "xx", "", [], SITES["blog"], f"/bad/{kind}-{i}", "generated", channel="jsonl", body=body)

    @staticmethod
    def _dedupe_urls(docs: list[Doc]) -> None:
        seen: dict[str, int] = {}
        for d in docs:
            url = d.url or d.site.base + d.path     # a planted URL (blocked_url) is kept as it is
            if url in seen:
                seen[url] += 1
                url = f"{url}-{seen[url]}"
            else:
                seen[url] = 0
            d.url = url


# The help sites' article template ends every page with a feedback line inside the article, where
# extraction keeps it: the site-wide line that line-level dedup is there to remove (and a stub page
# of one sentence plus that line is left too short: lines:too_short).
SIGNOFF_SITES = {"pydoc", "readme", "licence", "es", "pt"}


def signoff(site: Site) -> list[Block]:
    if not any(site is SITES[k] for k in SIGNOFF_SITES):
        return []
    return [Block("p", BOILERPLATE[site.lang]["helpful"])]


def cpf(rng: random.Random) -> str:
    """A Brazilian CPF number with valid check digits, formatted 000.000.000-00."""
    d = [rng.randrange(10) for _ in range(9)]
    for n in (9, 10):
        d.append(sum(d[i] * (n + 1 - i) for i in range(n)) * 10 % 11 % 10)
    s = "".join(map(str, d))
    return f"{s[:3]}.{s[3:6]}.{s[6:9]}-{s[9:]}"


def humaneval_statement(prompt: str) -> str:
    """The natural-language part of a HumanEval prompt: its docstring up to the examples."""
    m = re.search(r'("""|\'\'\')(.*?)(\1|$)', prompt, re.S)
    text = m.group(2) if m else prompt
    text = re.split(r">>>|\bfor example\b|\bexamples?\b:?", text, flags=re.I)[0]
    return " ".join(text.split())


def _png(rng: random.Random, w: int, h: int) -> bytes:
    raw = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(w * 3)) for _ in range(h))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


# ---- HTML -----------------------------------------------------------------------------------------

class PageRenderer:
    """A page of a site: head with scripts, cookie banner, header/nav, breadcrumbs, the article,
    a sidebar of related links, a footer. The article may be absent (boilerplate-only pages)."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def render(self, d: Doc, related: list[Doc]) -> bytes:
        bp = BOILERPLATE.get(d.lang, BOILERPLATE["en"])
        e = html.escape
        nav = "".join(f'<li><a href="/{slug(x)}/">{e(x)}</a></li>' for x in bp["nav"])
        rel = "".join(f'<li><a href="{e(r.path)}">{e(r.title)}</a></li>' for r in related if r.title)
        legal = " | ".join(f'<a href="/legal/{slug(x)}">{e(x)}</a>' for x in bp["legal"])
        parts = [
            "<!DOCTYPE html>", f'<html lang="{e(d.lang if d.lang != "xx" else "en")}">', "<head>",
            '<meta charset="utf-8">', '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{e(d.title)} | {e(d.site.name)}</title>",
            '<link rel="stylesheet" href="/static/css/site.css">',
            "<script>window.dataLayer=window.dataLayer||[];function gtag(){dataLayer.push(arguments);}"
            "gtag('js',new Date());gtag('config','G-DEMO0000');</script>",
            "</head>", "<body>",
            f'<div id="cookie-banner" class="banner"><p>{e(bp["cookie"])}</p><button>{e(bp["accept"])}</button></div>',
            f'<header class="site-header"><a class="logo" href="/">{e(d.site.name)}</a>',
            f'<nav class="main-nav"><ul><li><a href="/">{e(bp["home"])}</a></li>{nav}</ul></nav>',
            f'<form class="search" action="/search"><input name="q" placeholder="{e(bp["search"])}"></form>',
            f'<a class="login" href="/login">{e(bp["login"])}</a></header>',
        ]
        if d.boilerplate_only:
            tags = "".join(f'<li><a href="/tags/{slug(r.title)}">{e(r.title[:30])}</a></li>' for r in related)
            parts += [f'<div class="tag-cloud"><h3>{e(bp["tags"])}</h3><ul>{tags}</ul></div>',
                      f'<form class="login-form"><label>{e(bp["user"])}</label><input name="u">'
                      f'<label>{e(bp["password"])}</label><input name="p" type="password">'
                      f'<button>{e(bp["login"])}</button></form>']
        else:
            crumbs = f'<div class="breadcrumbs"><a href="/">{e(bp["home"])}</a> › <a href="/{d.site.section}/">{e(d.site.section.title())}</a> › {e(d.title[:40])}</div>'
            day = CRAWL_START - timedelta(days=self.rng.randrange(30, 900))
            body = "".join(self._block(b) for b in d.blocks)
            parts += [crumbs, "<main>", '<article class="post">', f"<h1>{e(d.title)}</h1>",
                      f'<p class="byline"><time datetime="{day:%Y-%m-%d}">{day:%Y-%m-%d}</time></p>',
                      body, "</article>",
                      f'<aside class="sidebar"><h3>{e(bp["related"])}</h3><ul>{rel}</ul></aside>', "</main>"]
        parts += [f'<footer class="site-footer"><p>© 2026 {e(d.site.name)}. {e(bp["rights"])}</p>',
                  f'<p class="legal">{legal}</p>',
                  f'<form class="newsletter"><label>{e(bp["newsletter"])}</label><input name="email" type="email"></form>',
                  "</footer>", '<script src="/static/js/app.js" defer></script>', "</body>", "</html>"]
        return "\n".join(parts).encode("utf-8")

    @staticmethod
    def _block(b: Block) -> str:
        e = html.escape
        if b.tag == "h2":
            return f"<h2>{e(b.text)}</h2>\n"
        if b.tag == "pre":
            return f"<pre><code>{e(b.text)}</code></pre>\n"
        if b.tag == "ul":
            return "<ul>" + "".join(f"<li>{e(i)}</li>" for i in b.items) + "</ul>\n"
        return f"<p>{e(b.text)}</p>\n"


# ---- packaging ------------------------------------------------------------------------------------

class WarcPackager:
    """Writes documents as HTTP response records with warcio, fixed dates and record ids."""

    def __init__(self, rng: random.Random, renderer: PageRenderer):
        self.rng = rng
        self.renderer = renderer
        self.clock = CRAWL_START

    def record_id(self) -> str:
        return f"<urn:uuid:{uuid.UUID(int=self.rng.getrandbits(128), version=4)}>"

    def tick(self) -> str:
        self.clock += timedelta(seconds=self.rng.randint(1, 40))
        return self.clock.strftime("%Y-%m-%dT%H:%M:%SZ")

    def write(self, path: Path, docs: list[Doc], pool: list[Doc], with_request: bool) -> list[dict]:
        from warcio.statusandheaders import StatusAndHeaders
        from warcio.warcwriter import WARCWriter

        labels = []
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            w = WARCWriter(fh, gzip=True)
            info = (f"software: quipu demo corpus builder v{CORPUS_VERSION}\r\nformat: WARC File Format 1.1\r\n"
                    f"description: quipu demo crawl (real text from installed packages)\r\n").encode()
            w.write_record(w.create_warc_record("", "warcinfo", payload=io.BytesIO(info), length=len(info),
                                                warc_content_type="application/warc-fields",
                                                warc_headers_dict={"WARC-Record-ID": self.record_id(),
                                                                   "WARC-Date": self.tick(),
                                                                   "WARC-Filename": path.name}))
            for k, d in enumerate(docs):
                date = self.tick()
                rid = self.record_id()
                if with_request and k == 0:
                    req = (f"GET {d.path} HTTP/1.1\r\nHost: {d.site.host}\r\nUser-Agent: quipu-demo-crawler/1.0\r\n"
                           f"Accept: text/html\r\n\r\n").encode()
                    w.write_record(w.create_warc_record(d.url, "request", payload=io.BytesIO(req), length=len(req),
                                                        warc_headers_dict={"WARC-Record-ID": self.record_id(),
                                                                           "WARC-Date": date,
                                                                           "WARC-Concurrent-To": rid}))
                    labels.append({"file": path.name, "id": "", "kind": "request", "lang": "xx", "url": d.url,
                                   "origin": "request for the next response"})
                if d.body is not None:
                    body = d.body
                else:
                    same_site = [p for p in pool if p.site.host == d.site.host and p is not d] or pool
                    related = self.rng.sample(same_site, min(6, len(same_site)))
                    body = self.renderer.render(d, related)
                headers = [("Content-Type", d.content_type), ("Content-Length", str(len(body))),
                           ("Date", date), ("Server", "nginx"), *d.extra_headers]
                http = StatusAndHeaders(d.status, headers, protocol="HTTP/1.1")
                rec = w.create_warc_record(d.url, "response", payload=io.BytesIO(body), length=len(body),
                                           http_headers=http,
                                           warc_headers_dict={"WARC-Record-ID": rid, "WARC-Date": date,
                                                              "WARC-IP-Address": "192.0.2.%d" % (1 + k % 250)})
                w.write_record(rec)
                d.id = rid.strip("<>").split(":")[-1]
                labels.append(_label(path.name, d))
        return labels


class JsonlPackager:
    """Writes documents as JSON lines (id, url, text, date + extra fields); `.gz` without timestamps."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def write(self, path: Path, docs: list[Doc], prefix: str) -> list[dict]:
        labels = []
        lines = []
        for k, d in enumerate(docs):
            d.id = f"dump-{prefix}-{k:05d}"
            if d.body is not None:
                line = d.body
                if d.kind == "missing_text":
                    d.id = json.loads(d.body)["id"]
                elif d.kind == "invalid_utf8":
                    d.id = ""
                else:
                    d.id = ""
            else:
                day = CRAWL_START - timedelta(days=self.rng.randrange(1, 700), minutes=self.rng.randrange(1440))
                obj = {"id": d.id, "url": d.url, "title": d.title, "text": d.plain(), "date": day.strftime("%Y-%m-%dT%H:%M:%SZ"),
                       "site": d.site.host, "section": d.site.section, "lang_hint": d.site.lang,
                       "tags": sorted({d.site.section, d.kind if d.kind in ("article", "foreign") else "misc"}),
                       "votes": self.rng.randint(0, 250)}
                line = json.dumps(obj, ensure_ascii=False).encode("utf-8")
            lines.append(line)
            labels.append({**_label(path.name, d), "line": k + 1})
        data = b"\n".join(lines) + b"\n"
        with atomic_path(path) as tmp:
            if path.suffix == ".gz":
                with open(tmp, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
                    gz.write(data)
            else:
                tmp.write_bytes(data)
        return labels


def _label(file: str, d: Doc) -> dict:
    return {"file": file, "id": d.id, "kind": d.kind, "lang": d.lang, "url": d.url, "origin": d.origin}


# ---- the builder ----------------------------------------------------------------------------------

def build_demo_corpus(out_dir: str | Path = "data/demo", scale: float = 1.0, seed: int = SEED) -> list[Path]:
    """Write the demo corpus under `out_dir` (raw/ inputs, labels.jsonl, manifest.json) and return
    the input files. `scale` < 1 makes a smaller corpus with every kind still present (tests)."""
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    out = Path(out_dir)
    raw = out / "raw"
    rng = random.Random(seed)
    docs = DocumentPlan(scale, rng.randrange(2**32)).build()
    pool = [d for d in docs if d.kind in ("article", "foreign")]
    warc_docs = [d for d in docs if d.channel == "warc"]
    jsonl_docs = [d for d in docs if d.channel == "jsonl"]
    # keep the malformed lines in the plain file where they are easy to see; the rest split in two
    bad = [d for d in jsonl_docs if d.body is not None]
    good = [d for d in jsonl_docs if d.body is None]
    half = len(good) // 2
    dump_a = good[:half] + bad
    random.Random(seed + 1).shuffle(dump_a)
    dump_b = good[half:]

    packer = WarcPackager(random.Random(seed + 2), PageRenderer(random.Random(seed + 3)))
    files, labels = [], []
    for i in range(WARC_FILES):
        path = raw / f"crawl-{i:05d}.warc.gz"
        labels += packer.write(path, warc_docs[i::WARC_FILES], pool, with_request=(i == 0))
        files.append(path)
    jp = JsonlPackager(random.Random(seed + 4))
    for path, part, prefix in ((raw / "text-dump-a.jsonl", dump_a, "a"), (raw / "text-dump-b.jsonl.gz", dump_b, "b")):
        labels += jp.write(path, part, prefix)
        files.append(path)

    for path, label in write_pdfs(raw / "pdf", seed):
        labels.append(label)
        files.append(path)

    with atomic_path(out / "labels.jsonl") as tmp:
        tmp.write_text("".join(json.dumps(x, ensure_ascii=False, sort_keys=True) + "\n" for x in labels))
    counts: dict[str, int] = {}
    for x in labels:
        counts[x["kind"]] = counts.get(x["kind"], 0) + 1
    write_json_atomic(out / MANIFEST, {
        "version": CORPUS_VERSION, "seed": seed, "scale": scale,
        "files": {p.relative_to(raw).as_posix(): sha256_file(p) for p in files},
        "records": len(labels), "kinds": dict(sorted(counts.items())),
        "languages": _lang_counts(labels),
        "sources": sorted({x["origin"].split(":")[0] for x in labels if x["kind"] == "article"}),
    })
    return files


# (file name, kind, lang, columns, paragraphs): few and small, the scan one page (OCR takes seconds)
DEMO_PDFS = (("informe-regional-es.pdf", "pdf", "es", 2, 14), ("boletim-pt.pdf", "pdf", "pt", 1, 10),
             ("scan-en.pdf", "pdf_scan", "en", 1, 3), ("locked-es.pdf", "pdf_encrypted", "es", 1, 2))


def write_pdfs(out: Path, seed: int) -> list[tuple[Path, dict]]:
    """The demo's PDFs (deterministic bytes: reportlab's invariant mode) and their labels; a PDF's
    id is the one extract gives a file read whole (`stable_id(name, "file")`)."""
    from quipu.synthetic.pdfs import make_pdf, prose
    from quipu.tasks.reading.records import stable_id
    written = []
    for k, (name, kind, lang, columns, n) in enumerate(DEMO_PDFS):
        paras = prose(lang, n, seed=seed + k)
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if kind == "pdf_encrypted":
            data = _locked_pdf(paras)
        else:
            data = make_pdf(paras, lang, columns=columns, seed=seed + k, image_only=kind == "pdf_scan").data
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
        written.append((path, {"file": f"pdf/{name}", "id": stable_id(name, "file"), "kind": kind, "lang": lang,
                               "url": None, "origin": "demo.pdfs:" + ("python-reference" if lang == "en" else "catalogues")}))
    return written


def _locked_pdf(paragraphs: list[str]) -> bytes:
    """A PDF that opens only with a user password (extract removes it: extract:pdf:encrypted)."""
    from reportlab import rl_config
    from reportlab.lib.pdfencrypt import StandardEncryption
    from reportlab.pdfgen import canvas
    rl_config.invariant = 1
    buf = io.BytesIO()
    c = canvas.Canvas(buf, encrypt=StandardEncryption("demo-secret", "demo-owner", strength=128))
    y = 780
    for p in paragraphs:
        c.drawString(72, y, p[:90].encode("cp1252", "ignore").decode("cp1252"))
        y -= 16
    c.showPage()
    c.save()
    return buf.getvalue()


def _lang_counts(labels: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in labels:
        if x["kind"] in ("article", "foreign", "near_duplicate", "exact_duplicate"):
            out[x["lang"]] = out.get(x["lang"], 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def built_corpus(out_dir: str | Path = "data/demo", scale: float = 1.0, seed: int = SEED) -> list[Path] | None:
    """The corpus's input files if `out_dir` already holds this version, scale and seed intact."""
    out = Path(out_dir)
    try:
        m = read_json(out / MANIFEST)
    except (FileNotFoundError, ValueError):
        return None
    if (m.get("version"), m.get("scale"), m.get("seed")) != (CORPUS_VERSION, scale, seed):
        return None
    files = [out / "raw" / name for name in m["files"]]
    if all(p.is_file() and sha256_file(p) == h for p, h in zip(files, m["files"].values())):
        return files
    return None


def ensure_demo_corpus(out_dir: str | Path = "data/demo", scale: float = 1.0, seed: int = SEED) -> tuple[list[Path], bool]:
    """(input files, whether they were built now)."""
    files = built_corpus(out_dir, scale, seed)
    if files is not None:
        return files, False
    return build_demo_corpus(out_dir, scale, seed), True
