"""Fluent-looking junk made from real prose of a language: what rules cannot see and the fluency
judge (tasks/fluency.py) must remove.

    spun       each sentence's words reordered (article spinners, scrambled copies)
    generated  text sampled from a word n-gram model (order 2-4) trained on prose of the language
    doorway    templated SEO doorway pages: one paragraph template filled with keywords and places

`fluent_junk(lang, prose, n, seed)` gives `n` documents spread over the three kinds, built from the
given prose texts (which should be other text than the prose a check keeps: a generator trained on
the very documents it is mixed with copies them). Deterministic for a seed.
"""
from __future__ import annotations

import random

from quipu.tasks.fluency import NgramGenerator, sentences, spin  # noqa: F401  (spin: one of the kinds)

KINDS = ("spun", "generated", "doorway")

DOORWAY = {
    "en": {"kw": ["plumber", "dentist", "car insurance", "cheap flights", "personal loans", "lawyer", "locksmith",
                  "roof repair", "moving company", "wedding photographer"],
           "place": ["Chicago", "Houston", "Phoenix", "Denver", "Boston", "Seattle", "Austin", "Miami", "Dallas"],
           "tpl": ["Looking for the best {kw} in {place}? Our {kw} in {place} is the number one choice for {kw} services.",
                   "We offer {kw} in {place} at the best price. Call our {kw} team in {place} today.",
                   "Our {kw} experts serve {place} and the whole {place} area with professional {kw}.",
                   "Find affordable {kw} near {place}. The top rated {kw} in {place} is here for you.",
                   "Why choose our {kw} in {place}? Because we are the most trusted {kw} company in {place}.",
                   "Get a free quote for {kw} in {place} now and save on {kw} near you."]},
    "es": {"kw": ["fontanero", "dentista", "seguro de coche", "vuelos baratos", "préstamos rápidos", "abogado",
                  "cerrajero", "reformas", "mudanzas", "fotógrafo de bodas"],
           "place": ["Madrid", "Barcelona", "Valencia", "Sevilla", "Bilbao", "Málaga", "Zaragoza", "Murcia", "Lima"],
           "tpl": ["¿Buscas el mejor {kw} en {place}? Nuestro servicio de {kw} en {place} es la mejor opción de {kw}.",
                   "Ofrecemos {kw} en {place} al mejor precio. Llama hoy a nuestro equipo de {kw} en {place}.",
                   "Nuestros expertos en {kw} atienden {place} y toda la zona de {place} con {kw} profesional.",
                   "Encuentra {kw} barato cerca de {place}. El {kw} mejor valorado de {place} está aquí.",
                   "¿Por qué elegir nuestro {kw} en {place}? Porque somos la empresa de {kw} de confianza en {place}.",
                   "Pide ahora un presupuesto gratis de {kw} en {place} y ahorra en {kw} cerca de ti."]},
    "pt": {"kw": ["encanador", "dentista", "seguro auto", "passagens baratas", "empréstimo rápido", "advogado",
                  "chaveiro", "reformas", "mudanças", "fotógrafo de casamento"],
           "place": ["São Paulo", "Rio de Janeiro", "Curitiba", "Recife", "Salvador", "Lisboa", "Porto", "Manaus"],
           "tpl": ["Procurando o melhor {kw} em {place}? Nosso serviço de {kw} em {place} é a melhor escolha de {kw}.",
                   "Oferecemos {kw} em {place} pelo melhor preço. Ligue hoje para a nossa equipe de {kw} em {place}.",
                   "Nossos especialistas em {kw} atendem {place} e toda a região de {place} com {kw} profissional.",
                   "Encontre {kw} barato perto de {place}. O {kw} mais bem avaliado de {place} está aqui.",
                   "Por que escolher o nosso {kw} em {place}? Porque somos a empresa de {kw} mais confiável de {place}.",
                   "Peça agora um orçamento grátis de {kw} em {place} e economize em {kw} perto de você."]},
}


def doorway(lang: str, rng: random.Random) -> str:
    w = DOORWAY[lang]
    kw, place = rng.choice(w["kw"]), rng.choice(w["place"])
    paras = []
    for _ in range(rng.randint(2, 4)):
        tpls = rng.sample(w["tpl"], rng.randint(3, len(w["tpl"])))
        paras.append(" ".join(t.format(kw=kw, place=place) for t in tpls))
        if rng.random() < 0.5:
            place = rng.choice(w["place"])
    return "\n\n".join(paras)


def fluent_junk(lang: str, prose: list[str], n: int, seed: int = 0) -> list[dict]:
    """`n` junk documents (id, text, lang, kind) in turn spun, generated (orders 2, 3, 4) and doorway."""
    rng = random.Random(f"{seed}-{lang}")
    long = [t for t in prose if len(sentences(t)) >= 3 and len(t.split()) >= 50] or prose
    generators = {k: NgramGenerator(prose, k) for k in (2, 3, 4)}
    docs = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        if kind == "spun":
            text = spin(rng.choice(long), rng)
        elif kind == "generated":
            text = generators[2 + (i // len(KINDS)) % 3].generate(rng, rng.randint(60, 250))
        else:
            text = doorway(lang, rng)
        docs.append({"id": f"fluent-{lang}-{seed}-{i}", "text": text, "lang": lang, "kind": kind})
    return docs


class BackoffSentenceGenerator:
    """A second generator of another kind than `NgramGenerator`, so a judge is not tuned to one: a
    Witten-Bell backoff model over word AND punctuation tokens (tasks/fluency.py's TOKEN), sampled
    sentence by sentence from `<s>` to `</s>` (sentence ends are the model's, not a stop rule), backing
    off to shorter contexts with the held-out mass, so it also writes n-grams no reference text has;
    detokenised (no space before , . ; : ! ? ) » or after ( ¿ ¡ «). Deterministic for an rng."""

    def __init__(self, texts: list[str], order: int):
        from collections import Counter, defaultdict as dd
        from quipu.tasks.fluency import TOKEN
        self.order = order
        self.next: dict[tuple, Counter] = dd(Counter)
        for t in texts:
            for s in sentences(t):
                toks = ["<s>"] * (order - 1) + TOKEN.findall(s) + ["</s>"]
                for i in range(order - 1, len(toks)):
                    for k in range(order):          # every context length 0..order-1
                        self.next[tuple(toks[i - k:i])][toks[i]] += 1
        self.tables = {ctx: (list(c), list(c.values()), len(c) / (len(c) + sum(c.values())))
                       for ctx, c in self.next.items()}

    def _token(self, history: list[str], rng: random.Random) -> str:
        for k in range(self.order - 1, -1, -1):
            table = self.tables.get(tuple(history[len(history) - k:]) if k else ())
            if table and (k == 0 or rng.random() >= table[2]):   # back off with Witten-Bell's held-out mass
                return rng.choices(table[0], weights=table[1])[0]
        return "</s>"

    def sentence(self, rng: random.Random) -> str:
        history = ["<s>"] * (self.order - 1)
        while len(history) < self.order - 1 + 80:
            tok = self._token(history, rng)
            if tok == "</s>":
                break
            history.append(tok)
        text = " ".join(history[self.order - 1:])
        for p in (",", ".", ";", ":", "!", "?", ")", "»", "%"):
            text = text.replace(" " + p, p)
        for p in ("(", "¿", "¡", "«"):
            text = text.replace(p + " ", p)
        return text

    def generate(self, rng: random.Random, min_words: int) -> str:
        out: list[str] = []
        while sum(len(s.split()) for s in out) < min_words:
            s = self.sentence(rng)
            if len(s.split()) >= 3:
                out.append(s if s[-1:] in ".!?" else s + ".")
        return " ".join(out)
