"""The language table: everything quipu knows about a language, in one entry per language.

Every stage that needs something of a language reads it here: langid's label is the entry's key,
heuristics takes its datatrove tokeniser, Gopher stop words, abbreviations and cookie/legal lines
(quipu.tasks.heuristics, quipu.tasks.language_rules), the PDF reader its Tesseract code and OCR
function words (quipu.tasks.reading.pdf), pii its phone regions (quipu.tasks.pii). Adding a language is one
entry here plus `quipu calibrate` for its thresholds (docs/languages.md, "Adding a language").

A language with no entry gets no other language's lists: a curate config that keeps one
(`langid.languages`) while a stage that needs its lists is on is refused, naming it
(`missing_message`), and a document that reaches heuristics in such a language anyway (no langid
in the run, a `lang` column from elsewhere) is removed with the reason
`heuristics:no_language_entry:<lang>`, counted in the stage's report.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Language:
    code: str                    # fastText lid.176's label (what stage langid writes to `lang`)
    name: str
    tokenizer: str               # datatrove's word-tokeniser language (ISO 639-3), for `compat: datatrove`
    tesseract: str               # Tesseract's traineddata name (`extract.pdf.ocr_languages`)
    stop_words: tuple[str, ...]  # Gopher's stop-word rule: the 8 most frequent function words
    abbreviations: str           # end in a period inside a sentence; lower-cased, without the final period
    ends_sentence: str           # those of `abbreviations` that also end a sentence before a capital
    policy_lines: tuple[str, ...]  # C4's policy lines (cookie banners, legal footers), lower-cased
    ocr_function_words: str      # the ~50 commonest words: real prose has a fifth or more among them
    phone_regions: tuple[str, ...]  # ISO 3166 countries whose phone formats the language's pages use first

    def __post_init__(self):
        stray = set(self.ends_sentence.split()) - set(self.abbreviations.split())
        if stray:
            raise ValueError(f"language {self.code}: ends_sentence {sorted(stray)} are not among its abbreviations")


LANGUAGES: dict[str, Language] = {lang.code: lang for lang in (
    Language(
        "en", "English", tokenizer="eng", tesseract="eng",
        stop_words=("the", "be", "to", "of", "and", "that", "have", "with"),      # Gopher's own list
        abbreviations="mr mrs ms dr prof sr jr st mt vs etc e.g i.e approx dept est fig no nos vol vols p pp ed eds "
                      "jan feb mar apr jun jul aug sep sept oct nov dec gen col lt sgt capt rev gov sen rep inc ltd co corp "
                      "u.s u.k a.m p.m ph.d b.a m.a ca cf al op",
        ends_sentence="etc inc ltd co a.m p.m u.s u.k",
        # datatrove's C4 list (c4_filters.POLICY_SUBSTRINGS), then ours
        policy_lines=("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies",
                      "all rights reserved", "accept all cookies", "cookie settings"),
        ocr_function_words="the of and to a in is that for it as was with be by on not he this are or his from at which but "
                           "have an they you were her she there been has their one all we if its will would can may more",
        phone_regions=("US",)),
    Language(
        "es", "Spanish", tokenizer="spa", tesseract="spa",
        stop_words=("de", "la", "que", "el", "en", "y", "a", "los"),
        abbreviations="sr sra sres sras srta d dña dr dra dres lic lda ing arq prof profa sto sta ud uds vd vds "
                      "pág págs p pp etc ej ee uu ee.uu cía av avda c/ nº núm art arts cap caps fig vol vols ed "
                      "aprox apdo tel dpto depto admón gral excmo excma ilmo ilma rvdo mons pza ctra km mín máx "
                      "a.c d.c a.m p.m s.a s.l ss pl vs cf op cit ib ibid id",
        ends_sentence="etc uu ee.uu a.c d.c a.m p.m s.a s.l",
        policy_lines=("política de privacidad", "política de cookies", "utilizamos cookies", "usamos cookies",
                      "uso de cookies", "utiliza cookies", "usa cookies", "aviso legal", "condiciones de uso",
                      "términos de uso", "derechos reservados", "configurar cookies", "aceptar cookies"),
        ocr_function_words="de la que el en y a los del se las por un para con no una su al lo como más o pero sus le ha "
                           "me si sin sobre este ya entre cuando todo esta ser son dos también fue había era muy años "
                           "hasta desde está",
        phone_regions=("ES", "MX", "AR", "CO", "CL", "US")),
    Language(
        "pt", "Portuguese", tokenizer="por", tesseract="por",
        stop_words=("de", "a", "o", "que", "e", "do", "da", "em"),
        abbreviations="sr sra srs sras srta dr dra drs dras prof profa eng arq exmo exma ilmo ilma v.exa d "
                      "pág págs p pp etc ex ver cia av r n nº núm art arts cap caps fig vol vols ed aprox tel "
                      "dept depto gov min máx a.c d.c a.m p.m s.a ltda jan fev mar abr mai jun jul ago set out nov dez "
                      "cf op cit ib ibid id",
        ends_sentence="etc ltda cia a.c d.c a.m p.m s.a",
        policy_lines=("política de privacidade", "política de cookies", "utilizamos cookies", "usamos cookies",
                      "uso de cookies", "utiliza cookies", "usa cookies", "termos de uso", "termos e condições",
                      "direitos reservados", "configurar cookies", "aceitar cookies"),
        ocr_function_words="de a o que e do da em um para é com não uma os no se na por mais as dos como mas foi ao ele "
                           "das tem à seu sua ou ser quando muito há nos já está também só pelo pela até isso entre era "
                           "depois sem",
        phone_regions=("BR", "PT")),
    Language(
        "ca", "Catalan", tokenizer="cat", tesseract="cat",
        stop_words=("de", "la", "a", "el", "en", "del", "per", "i"),   # the 8 commonest of the calibration reference
        abbreviations="sr sra srs sres srta dr dra drs dres prof profa sant st sta mn pàg pàgs p pp etc ex núm nº "
                      "art arts cap caps fig vol vols ed aprox tel av avda c/ pl pça ctra km mín màx dept adm gral "
                      "excm excma il·lm il·lma a.c d.c a.m p.m s.a s.l ss cf op cit ib ibid id vs",
        ends_sentence="etc a.c d.c a.m p.m s.a s.l",
        policy_lines=("política de privadesa", "política de privacitat", "política de galetes", "política de cookies",
                      "utilitzem galetes", "utilitza galetes", "fem servir galetes", "ús de galetes", "utilitzem cookies",
                      "avís legal", "condicions d'ús", "termes d'ús", "drets reservats", "configurar galetes",
                      "acceptar galetes", "acceptar cookies"),
        ocr_function_words="de la i el a que en les els del per un una és amb no es al com més o però seu seva li ha se "
                           "si sense sobre aquest ja entre quan tot aquesta ser són dos també va era molt anys fins des "
                           "està hi ho l d",
        phone_regions=("ES", "AD")),
)}


def language(code: str | None) -> Language | None:
    """The entry of a language (lid.176 code), or None when the table has none."""
    return LANGUAGES.get(code) if code is not None else None


def missing(codes) -> list[str]:
    """The codes among `codes` with no entry, in order."""
    return [c for c in codes if c not in LANGUAGES]


def missing_message(key: str, codes: list[str], needed_by: str) -> str:
    """One line for a config that names languages with no entry (`key`: where it names them)."""
    return (f"{key}: {', '.join(codes)} has no entry in the language table (quipu.tasks.languages; "
            f"known: {', '.join(LANGUAGES)}): {needed_by} would have no stop words, abbreviations or cookie "
            f"lines for it; add its entry and calibrate it (docs/languages.md, 'Adding a language') or drop it")


@lru_cache(maxsize=64)
def by_tesseract(code: str) -> Language | None:
    """The entry whose Tesseract code is `code` (`extract.pdf.ocr_languages`), or None."""
    return next((lang for lang in LANGUAGES.values() if lang.tesseract == code), None)
