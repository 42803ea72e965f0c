"""Stage `pii`: replace personal data in kept text with typed placeholders.

What is found, and by what:
- e-mail addresses: datatrove's `PIIFormatter` pattern (an allow-list of patterns such as
  `info@*` keeps public contact addresses)                                        -> `<EMAIL>`
- IP addresses: datatrove's IPv4 pattern and its public-address check (`ipaddress.is_global`),
  IPv6 candidates checked the same way                                             -> `<IP>`
- phone numbers: digit runs that look like a phone number, accepted only if Google's
  libphonenumber metadata (`phonenumbers`) says the number is valid in a target country (the
  country of the URL's domain first, then those of the document's language)        -> `<PHONE>`
- national ids with a checksum: Brazilian CPF, Spanish DNI and NIE                 -> `<ID>`

Dates, years, year ranges, prices, thousands-grouped figures, ISBNs and version numbers are never
candidates (a dotted quad of single digits is a version only after a version word: `versión
2.9.0.5`; `DNS 8.8.8.8` is an address). Nothing is removed: every document is kept, with `pii_spans` (where the placeholders
are in the new text, and their type). The report counts by type and shows masked examples only.
"""
from __future__ import annotations

import fnmatch
import ipaddress
import re
from functools import lru_cache

import pyarrow as pa
from pydantic import Field, field_validator

from quipu.tasks.languages import language
from quipu.tasks.schema import set_column
from quipu.tasks.stage import Outcome, Stage, StageConfig, langs_of, split_by_mask

PLACEHOLDERS = {"email": "<EMAIL>", "phone": "<PHONE>", "ip": "<IP>", "id": "<ID>"}
PII_SPAN = pa.struct([pa.field("start", pa.int32()), pa.field("end", pa.int32()), pa.field("type", pa.string())])
PII_SPANS = pa.field("pii_spans", pa.list_(PII_SPAN))

# the countries whose phone formats matter to this project's users (where each language is written:
# its entry's phone_regions in quipu.tasks.languages)
DEFAULT_REGIONS = ["ES", "PT", "BR", "MX", "AR", "CO", "CL", "US"]


class PiiConfig(StageConfig):
    emails: bool = Field(True, description="replace e-mail addresses with <EMAIL>")
    ips: bool = Field(True, description="replace IP addresses with <IP>")
    public_ips_only: bool = Field(True, description="keep private, loopback and documentation addresses (192.168.x.x, 10.x, ::1): not personal")
    phones: bool = Field(True, description="replace phone numbers valid in one of phone_regions with <PHONE>")
    phone_regions: list[str] = Field(default_factory=lambda: list(DEFAULT_REGIONS),
                                     description="ISO 3166 country codes whose national phone formats are recognised (international +CC numbers are recognised for every country)")
    ids: bool = Field(True, description="replace national ids with a valid checksum (CPF, DNI, NIE) with <ID>")
    email_allow: list[str] = Field(default_factory=list, description="address patterns kept as they are, e.g. ['info@*', 'contacto@*', '*@gob.es']")

    @field_validator("phone_regions")
    @classmethod
    def _regions(cls, v: list[str]) -> list[str]:
        import phonenumbers
        known = phonenumbers.SUPPORTED_REGIONS
        for r in v:
            if r not in known:
                raise ValueError(f"'{r}' is not a country code phonenumbers knows (e.g. ES, BR, US)")
        return v


# ---- detectors: each returns (start, end) spans in the text ------------------------------------

@lru_cache(maxsize=1)
def _datatrove_patterns() -> tuple[re.Pattern, re.Pattern]:
    from datatrove.pipeline.formatters.pii import PIIFormatter
    f = PIIFormatter()
    return f.emails_replacer.regex, f.ip_replacer.regex


# four dotted numbers with boundaries (datatrove's IPv4 pattern has none: "1.2.3.4.5" or "v10.1.2.3"
# are not addresses); each candidate must then match datatrove's pattern whole
IPV4_CANDIDATE = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}(?!\w|\.\d)")


IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{1,4}:){1,7}(?::|(?::[0-9A-Fa-f]{1,4}){1,6}|[0-9A-Fa-f]{1,4})(?![\w:])")
# patterns start with what they match, not a look-behind: the regex engine then skips ahead fast
CPF = re.compile(r"(\d{3})\.(\d{3})\.(\d{3})-(\d{2})(?!\d)")
CPF_LABELLED = re.compile(r"\bCPF\b[\s:nº°.#-]{0,8}(\d{11})\b", re.IGNORECASE)    # unformatted, after "CPF"
DNI = re.compile(r"(\d{1,2}\.?\d{3}\.?\d{3})[ -]?([A-Za-z])(?!\w)")
NIE = re.compile(r"([XYZxyz])[ -]?(\d{7})[ -]?([A-Za-z])(?!\w)")
DNI_LETTERS = "TRWAGMYFPDXBNJZSQVHLCKE"
# a run of 7 to 15 digits with single separators, optionally +CC/00 and an area code in brackets
PHONE_CANDIDATE = re.compile(
    r"(?<![\w@/.,+-])(?:\+\s?|00)?(?:\(\s?\d{1,4}\s?\)[\s.-]?)?\d(?:[\s.\-]?\d){6,14}(?![\w@]|[.,/-]\d)")
NOT_A_PHONE = [
    re.compile(r"^(?:19|20)\d\d[-./]\d{1,2}[-./]\d{1,2}(?:\D|$)"),  # 2021-03-15, 2003-03-08-14 (build ids)
    re.compile(r"^\d{1,2}[-./]\d{1,2}[-./]\d{2,4}$"),                 # 15.03.2021
    re.compile(r"^\d{4}\s?-\s?\d{2,4}$"),                             # 1998-2004
    re.compile(r"^\d{1,3}(?:[.,]\d{3})+$"),                           # 1.234.567 (a figure, not 912 345 678)
    # a range with grouped thousands on either side: 3.000-5.000, 12.500-15.000, 2.003-2.060, 1.234-5.678
    re.compile(r"^(?:\d{1,3}(?:[.,]\d{3})+\s?[-–]\s?\d+(?:[.,]\d{3})*|\d+(?:[.,]\d{3})*\s?[-–]\s?\d{1,3}(?:[.,]\d{3})+)$"),
    re.compile(r"[.,]\d$"),                                           # 289.6: ends in a decimal
    re.compile(r"^(?:\d\s){3,}"),                                      # 2 1 0 1 4 3 4: a results table
    re.compile(r"^\d{3}\.\d{3}\.\d{3}-\d{2}$"),                          # CPF-shaped (its check digits decide)
]
NUMBER_PREFIX = re.compile(r"(?:[$€£¥]|R\$|US\$|ISBN(?:-1[03])?:?|ISSN:?|DOI:?|No\.|n\.º|nº|§|#|(?<![A-Za-z])v\.?)\s*$", re.IGNORECASE)
BARE_NUMBER = re.compile(r"^[-+]?[\d.,%:]*\d[\d.,%:]*$")     # a figure of a table: 3.02, -0.90, 12%, 1:
PHONE_WORDS = re.compile(r"(?:tel|tlf|telf|fono|fone|phone|call|cell|celular|cel|m[óo]vil|telem[óo]vel|whats\s?app|fax|"
                         r"contact[oe]?|contato|llam[ea]|ligue|n[úu]mero|number)\W{0,12}$", re.IGNORECASE)
# a dotted quad of single digits is a version where a version word precedes it (versión 2.9.0.5),
# else an address (the resolvers 8.8.8.8, 1.1.1.1, 9.9.9.9)
VERSION_LIKE = re.compile(r"^\d\.\d\.\d\.\d$")
VERSION_WORD = re.compile(r"(?:\b(?:version|versi[óo]n|vers[ãa]o|release|build|firmware|update)|(?<![A-Za-z])v\.?)\W{0,3}$",
                          re.IGNORECASE)


def _tokens_around(text: str, start: int, end: int) -> tuple[str, str]:
    before = text[max(0, start - 24):start].split()
    after = text[end:end + 24].split()
    return (before[-1] if before else ""), (after[0] if after else "")


def email_spans(text: str, allow: list[str]) -> tuple[list[tuple[int, int]], int]:
    """(spans, addresses kept by the allow-list)."""
    if "@" not in text:
        return [], 0
    spans, allowed = [], 0
    for m in _datatrove_patterns()[0].finditer(text):
        if text.startswith(":", m.end()) and not text.startswith(": ", m.end()):
            continue   # git@github.com:owner/repo.git is an SSH remote, not a mailbox
        if any(fnmatch.fnmatch(m.group(0).lower(), p.lower()) for p in allow):
            allowed += 1
        else:
            spans.append(m.span())
    return spans, allowed


def ip_spans(text: str, public_only: bool) -> list[tuple[int, int]]:
    from datatrove.pipeline.formatters.pii import public_ip_validator
    spans = []
    if "." in text:
        ipv4 = _datatrove_patterns()[1]
        spans += [m.span() for m in IPV4_CANDIDATE.finditer(text)
                  if (m.start() == 0 or not (text[m.start() - 1].isalnum() or text[m.start() - 1] in "._"))
                  and ipv4.fullmatch(m.group(0)) and public_ip_validator(m.group(0), public_only)
                  and not (VERSION_LIKE.match(m.group(0)) and VERSION_WORD.search(text[max(0, m.start() - 24):m.start()]))]
    if "::" in text or text.count(":") >= 7:
        for m in IPV6.finditer(text):
            try:
                ip = ipaddress.IPv6Address(m.group(0))
            except ValueError:
                continue
            if ipv6_like_address(m.group(0)) and (not public_only or ip.is_global):
                spans.append(m.span())
    return spans


def ipv6_like_address(candidate: str) -> bool:
    """Whether a valid IPv6 string reads as an address, not a time, date, verse or label:value that
    happens to parse ("December 31::", "10:30::", "Juan 3:16::", "ac::dc", "cafe::"): at least two
    groups, a decimal digit somewhere, and not only 1-2 digit decimal groups (clock and verse
    numbers). Real compressed addresses (2001:db8::1, fe80::1, 2a00:1450::200e) all pass."""
    groups = [g for g in candidate.split(":") if g]
    if len(groups) < 2 or not any(c.isdigit() for c in candidate):
        return False
    return not all(g.isdigit() and len(g) <= 2 for g in groups)


def cpf_valid(digits: str) -> bool:
    if len(digits) != 11 or len(set(digits)) == 1:
        return False
    d = [int(c) for c in digits]
    for n in (9, 10):
        check = sum(d[i] * (n + 1 - i) for i in range(n)) * 10 % 11 % 10
        if check != d[n]:
            return False
    return True


def id_spans(text: str) -> list[tuple[int, int]]:
    def free(m) -> bool:   # not the tail of a longer number or word
        return m.start() == 0 or not (text[m.start() - 1].isalnum() or text[m.start() - 1] in "._")

    spans = []
    if "-" in text:
        spans += [m.span() for m in CPF.finditer(text) if free(m) and cpf_valid("".join(m.groups()))]
    if "CPF" in text or "cpf" in text:
        spans += [m.span(1) for m in CPF_LABELLED.finditer(text) if cpf_valid(m.group(1))]
    for m in DNI.finditer(text):
        n = m.group(1).replace(".", "")
        if m.group(2).islower() and text[m.start(2) - 1] == " ":
            continue   # "10.200.000 y más", "3.000.000 e 4": a figure and a one-letter word, not a DNI
        if free(m) and len(n) == 8 and DNI_LETTERS[int(n) % 23] == m.group(2).upper():
            spans.append(m.span())
    for m in NIE.finditer(text):
        n = "XYZ".index(m.group(1).upper()) * 10_000_000 + int(m.group(2))
        if free(m) and DNI_LETTERS[n % 23] == m.group(3).upper():
            spans.append(m.span())
    return spans


def phone_spans(text: str, regions: list[str]) -> list[tuple[int, int, str]]:
    """(start, end, the country the number is valid in) of each phone number."""
    import phonenumbers
    spans = []
    for m in PHONE_CANDIDATE.finditer(text):
        cand = m.group(0).strip()
        if any(p.match(cand) for p in NOT_A_PHONE) or NUMBER_PREFIX.search(text[max(0, m.start() - 8):m.start()]):
            continue
        international = cand.startswith(("+", "00"))
        keyword = PHONE_WORDS.search(text[max(0, m.start() - 30):m.start()]) is not None
        if cand.isdigit() and not keyword:
            continue   # an unformatted digit run (an id, a count, 2147483647) is a phone only where text says so
        before, after = _tokens_around(text, m.start(), m.end())
        after_phone = bool(spans) and text[spans[-1][1]:m.start()].strip(" ,;/|") == ""
        if not (international or keyword or after_phone) and (BARE_NUMBER.match(before) or BARE_NUMBER.match(after)):
            continue   # a row of figures ("3.02 75212 1476"), not a phone number
        for region in ([None] if cand.startswith("+") else regions):
            try:
                num = phonenumbers.parse(cand, region)
            except phonenumbers.NumberParseException:
                continue
            if phonenumbers.is_valid_number(num):
                code = phonenumbers.region_code_for_number(num) if international else region
                spans.append((*m.span(), code or "intl"))
                break
    return spans


# ---- the stage --------------------------------------------------------------------------------

def mask(value: str) -> str:
    """What a report may show of a found value: its shape, never its content."""
    return re.sub(r"[A-Za-z0-9]", lambda c: "9" if c.group(0).isdigit() else "x", value)


def redact(text: str, found: list[tuple[int, int, str]]) -> tuple[str, list[dict]]:
    """Replace non-overlapping spans (earlier detectors win overlaps) with placeholders; returns the
    new text and the placeholders' spans in it."""
    taken: list[tuple[int, int, str]] = []
    for start, end, kind in found:   # in detector priority order
        if all(end <= s or start >= e for s, e, _ in taken):
            taken.append((start, end, kind))
    taken.sort()
    out, spans, pos, shift = [], [], 0, 0
    for start, end, kind in taken:
        out.append(text[pos:start])
        placeholder = PLACEHOLDERS[kind]
        new_start = start + shift
        spans.append({"start": new_start, "end": new_start + len(placeholder), "type": kind})
        out.append(placeholder)
        shift += len(placeholder) - (end - start)
        pos = end
    out.append(text[pos:])
    return "".join(out), spans


class PiiRedaction(Stage):
    name = "pii"
    columns = (PII_SPANS,)
    Config = PiiConfig

    def check(self) -> None:
        _datatrove_patterns()
        if self.config.phones:
            import importlib
            importlib.import_module("phonenumbers")   # a missing install fails here, before any document is read

    def regions_for(self, lang: str, url: str | None) -> list[str]:
        """The doc's URL country first (a .br page is read as Brazilian), then its language's."""
        cfg = self.config
        tld = _tld(url)
        entry = language(lang)
        order = ([tld] if tld in cfg.phone_regions else []) + (list(entry.phone_regions) if entry else cfg.phone_regions)
        return list(dict.fromkeys(r for r in order + cfg.phone_regions if r in cfg.phone_regions))

    def find(self, text: str, lang: str, url: str | None, stats: dict) -> list[tuple[int, int, str]]:
        cfg = self.config
        found: list[tuple[int, int, str]] = []
        if cfg.ids:
            found += [(s, e, "id") for s, e in id_spans(text)]
        if cfg.emails:
            spans, allowed = email_spans(text, cfg.email_allow)
            found += [(s, e, "email") for s, e in spans]
            stats["emails_allowed"] = stats.get("emails_allowed", 0) + allowed
        if cfg.ips:
            found += [(s, e, "ip") for s, e in ip_spans(text, cfg.public_ips_only)]
        if cfg.phones:
            by_region = stats.setdefault("phones_by_region", {})
            for s, e, region in phone_spans(text, self.regions_for(lang, url)):
                if all(e <= fs or s >= fe for fs, fe, _ in found):   # an id's digits are not a phone
                    found.append((s, e, "phone"))
                    by_region[region] = by_region.get(region, 0) + 1
        return found

    def process(self, batch: pa.Table, shard_plan=None) -> Outcome:
        texts = batch.column("text").to_pylist()
        ids = batch.column("id").to_pylist()
        urls = batch.column("url").to_pylist() if "url" in batch.column_names else [None] * len(texts)
        stats: dict = {"redacted": {k: 0 for k in PLACEHOLDERS}, "docs_redacted": 0, "examples": []}
        edits = stats["edits"] = {"documents redacted": 0, **{PLACEHOLDERS[k]: 0 for k in PLACEHOLDERS}}
        new_texts, all_spans = [], []
        for doc_id, text, lang, url in zip(ids, texts, langs_of(batch), urls):
            found = self.find(text, lang, url, stats)
            new_text, spans = redact(text, found) if found else (text, [])
            new_texts.append(new_text)
            all_spans.append(spans)
            if spans:
                stats["docs_redacted"] += 1
                edits["documents redacted"] += 1
                for s in spans:
                    stats["redacted"][s["type"]] += 1
                    edits[PLACEHOLDERS[s["type"]]] += 1
                if len(stats["examples"]) < 3:
                    first = min(found)
                    stats["examples"].append({"id": doc_id, "type": first[2], "masked": mask(text[first[0]:first[1]])})
        batch = set_column(batch, pa.field("text", pa.string(), nullable=False), new_texts)
        batch = set_column(batch, PII_SPANS, pa.array(all_spans, PII_SPANS.type))
        kept, removed = split_by_mask(batch, [True] * batch.num_rows, [None] * batch.num_rows)
        return Outcome(kept, removed, stats)

    def finalize(self, stats: dict, scans, plan, committed) -> dict:
        stats["examples"] = stats.get("examples", [])[:5]
        return stats


def _tld(url: str | None) -> str | None:
    if not url:
        return None
    from quipu.tasks.urls import host_of
    return host_of(url).rsplit(".", 1)[-1].upper() or None
