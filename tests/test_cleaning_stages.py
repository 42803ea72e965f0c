"""The safety and line-cleaning stages: urls, pii, bad_words, lines, and extract.fix_unicode."""
from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.tasks.bad_words import BadWordsConfig, BadWordsFilter
from quipu.tasks.pipeline import run_local
from quipu.tasks.lines import LinesConfig, line_hashes
from quipu.tasks.pii import PiiConfig, PiiRedaction, cpf_valid, mask
from quipu.tasks.stage import RunContext, write_table
from quipu.tasks.text_repair import repair_unicode
from quipu.tasks.urls import UrlFilter, UrlsConfig


def _table(rows: list[dict]) -> pa.Table:
    cols = {k: [r.get(k) for r in rows] for k in ("id", "text", "url", "source", "lang")}
    return pa.table(cols)


def _shards(tmp_path, parts: list[list[dict]], name: str = "in"):
    return [write_table(tmp_path / name / f"part-{n}.parquet", _table(rows)) for n, rows in enumerate(parts)]


# ---- urls -------------------------------------------------------------------------------------

def test_url_filter_names_the_list_and_the_allow_list_wins(tmp_path):
    block = tmp_path / "block.txt"
    block.write_text("# malware\nbad-host.example.net\nnews.example.org/leaked/page\n")
    allow = tmp_path / "allow.txt"
    allow.write_text("pornhub.com\n")
    stage = UrlFilter(UrlsConfig(block_lists=[str(block)], allow_lists=[str(allow)]))
    assert stage.judge("http://xvideos.com/video1")[0] == "url:blocklist:adult"
    assert stage.judge("https://cdn.bad-host.example.net/x.exe")[0] == "url:user_list"        # a subdomain
    assert stage.judge("https://www.news.example.org/leaked/page/")[0] == "url:user_list"      # scheme, www, slash ignored
    assert stage.judge("https://news.example.org/other")[0] is None
    assert stage.judge("https://example.com/free-porn-videos")[0] == "url:banned_word"
    assert stage.judge("https://www.pornhub.com/view")[0] is None                              # allowed
    assert stage.judge("https://elpais.com/politica/2020-01-01/article.html")[0] is None
    rows = [{"id": "a", "text": "x", "url": "http://xvideos.com/v"}, {"id": "b", "text": "y", "url": None},
            {"id": "c", "text": "z", "url": "https://g1.globo.com/economia/"}]
    out = stage.process(_table(rows))
    assert out.kept.column("id").to_pylist() == ["b", "c"]
    assert out.removed.column("reason").to_pylist() == ["url:blocklist:adult"]
    assert out.stats["no_url"] == 1 and out.stats["matched"] == {"domain": 1}


def test_url_lists_are_checked_before_any_work():
    with pytest.raises(ValueError, match="list file not found"):
        UrlsConfig(block_lists=["/nonexistent/list.txt"])


# ---- pii --------------------------------------------------------------------------------------

PII_CASES = [
    ("es", None, "Escriba a juan.perez@gmail.com o llame al +34 612 345 678.", {"email": 1, "phone": 1}),
    ("es", None, "Oficina: 91 234 56 78. DNI 12345678Z y NIE X1234567L.", {"phone": 1, "id": 2}),
    ("pt", "https://g1.globo.com.br/a", "Ligue (11) 98765-4321. CPF 123.456.789-09. IP 200.147.67.142.",
     {"phone": 1, "id": 1, "ip": 1}),
    ("pt", "https://www.publico.pt/a", "Telemóvel 912 345 678 ou fixo 21 234 5678.", {"phone": 2}),
    ("es", None, "CDMX (55) 1234 5678; Buenos Aires 011 4123-4567; Santiago +56 9 8765 4321.", {"phone": 3}),
    ("en", None, "Call (212) 555-0147. Server 2001:4860:4860::8888.", {"phone": 1, "ip": 1}),
    # single-digit quads: addresses unless a version word precedes them (ORDINARY: versión 2.9.0.5)
    ("en", None, "Set DNS to 8.8.8.8 or 1.1.1.1 (firmware v 2.9.0.5, release 1.0.2.3).", {"ip": 2}),
]
ORDINARY = ("El 15/03/2021 y 2021-03-15, entre 1998-2004, costó R$ 1.234.567,89; población 1.234.567; "
            "ISBN 978-84-376-0494-7; versión 2.9.0.5; año 2019; CEP 01310-100; 12:45; 3,5%; "
            "IBEX 35 10503.80 10330.90 3.02 75212 1476; router 192.168.0.1; git@github.com:owner/repo.git; "
            "build 2004-02-20-08; 2147483647 bytes; CPF 123.456.789-00 (wrong check digits).")


@pytest.mark.parametrize("lang,url,text,expected", PII_CASES)
def test_pii_finds_every_type_in_local_formats(lang, url, text, expected):
    stage = PiiRedaction(PiiConfig())
    out = stage.process(pa.table({"id": ["d"], "text": [text], "url": [url], "lang": [lang]}))
    assert out.removed.num_rows == 0
    spans = out.kept.column("pii_spans").to_pylist()[0]
    new = out.kept.column("text").to_pylist()[0]
    counts = {}
    for s in spans:
        counts[s["type"]] = counts.get(s["type"], 0) + 1
        assert new[s["start"]:s["end"]] == f"<{s['type'].upper()}>"       # spans point at the placeholders
    assert counts == expected, new
    assert not any(ch.isdigit() for ch in "".join(new.split("<")[1:]).split(">")[0])


def test_pii_tries_the_url_country_before_the_language_countries():
    """A national number valid in several countries is read as the URL's country first: the same
    digits in an English document are a US number, on a .br page a Brazilian one, and a Spanish
    number (language es) is Portuguese on a .pt page; the report counts by that country."""
    stage = PiiRedaction(PiiConfig())
    assert stage.regions_for("en", "https://loja.example.com.br/contato")[:2] == ["BR", "US"]
    assert stage.regions_for("es", "http://jornal.example.pt/")[0] == "PT"
    assert stage.regions_for("en", "https://example.zz/")[0] == "US"     # not a target country: the language's

    def region(text: str, lang: str, url: str | None) -> dict:
        stats: dict = {}
        assert [k for _, _, k in stage.find(text, lang, url, stats)] == ["phone"], (text, url)
        return stats["phones_by_region"]

    assert region("phone 212 555 0134", "en", None) == {"US": 1}
    assert region("phone 212 555 0134", "en", "https://loja.example.com.br/") == {"BR": 1}
    assert region("teléfono 912 345 678", "es", None) == {"ES": 1}
    assert region("teléfono 912 345 678", "es", "https://jornal.example.pt/") == {"PT": 1}
    batch = pa.table({"id": ["a", "b"], "text": ["phone 212 555 0134"] * 2, "lang": ["en", "en"],
                      "url": [None, "https://loja.example.com.br/"]})
    assert stage.process(batch).stats["phones_by_region"] == {"US": 1, "BR": 1}


def test_pii_keeps_private_loopback_and_documentation_addresses_unless_told_otherwise():
    """public_ips_only (default): private, loopback and documentation addresses are not personal and
    stay; public ones are replaced. Off: every address is replaced."""
    text = ("server 192.168.1.10 and 10.0.0.7, loopback 127.0.0.1, doc 192.0.2.5; "
            "visitor 81.2.69.142 and 2a03:2880:f003:c07:face:b00c::2")

    def ips(**cfg) -> list[str]:
        return [text[s:e] for s, e, k in PiiRedaction(PiiConfig(**cfg)).find(text, "en", None, {}) if k == "ip"]
    assert ips() == ["81.2.69.142", "2a03:2880:f003:c07:face:b00c::2"]
    assert ips(public_ips_only=False) == ["192.168.1.10", "10.0.0.7", "127.0.0.1", "192.0.2.5", "81.2.69.142",
                                          "2a03:2880:f003:c07:face:b00c::2"]


def test_pii_leaves_ordinary_numbers_alone():
    stage = PiiRedaction(PiiConfig())
    out = stage.process(pa.table({"id": ["d"], "text": [ORDINARY], "url": [None], "lang": ["es"]}))
    assert out.kept.column("text").to_pylist() == [ORDINARY]
    assert out.kept.column("pii_spans").to_pylist() == [[]]


def test_pii_allow_list_and_masked_report():
    stage = PiiRedaction(PiiConfig(email_allow=["info@*", "*@gob.es"]))
    text = "Info: info@empresa.com, prensa@gob.es; personal: ana.silva@gmail.com"
    out = stage.process(pa.table({"id": ["d"], "text": [text]}))
    assert out.kept.column("text").to_pylist() == ["Info: info@empresa.com, prensa@gob.es; personal: <EMAIL>"]
    assert out.stats["emails_allowed"] == 2
    assert "ana" not in json.dumps(out.stats) and out.stats["examples"][0]["masked"] == "xxx.xxxxx@xxxxx.xxx"
    assert mask("+34 612-345") == "+99 999-999"
    assert cpf_valid("12345678909") and not cpf_valid("12345678900") and not cpf_valid("11111111111")


def test_pii_config_names_unknown_countries():
    with pytest.raises(ValueError, match="'XX' is not a country code"):
        PiiConfig(phone_regions=["ES", "XX"])


# ---- bad words --------------------------------------------------------------------------------

def test_bad_words_ratio_per_language_and_languages_without_a_list(tmp_path):
    extra = tmp_path / "es.txt"
    extra.write_text("# palabras\npalabrota\nfrase muy fea\n")
    stage = BadWordsFilter(BadWordsConfig(enabled=True, package_lists=False, word_lists={"es": [str(extra)]}))
    stage.check()
    clean = "Un texto normal sobre el tiempo " * 10
    rows = [
        {"id": "bad", "text": "palabrota palabrota y una frase muy fea, otra palabrota", "lang": "es"},
        {"id": "one", "text": clean + " palabrota", "lang": "es"},        # one hit in 61 words: kept
        {"id": "fr", "text": "palabrota " * 5, "lang": "fr"},            # no French list: kept, counted
        {"id": "sub", "text": "palabrotas frasemuy fea " * 3, "lang": "es"},  # whole words only
    ]
    out = stage.process(_table(rows))
    assert out.removed.column("id").to_pylist() == ["bad"]
    assert out.removed.column("reason").to_pylist() == ["bad_words:ratio"]
    assert out.stats["no_list"] == {"fr": 1}


def test_bad_words_package_lists_cover_the_target_languages():
    stage = BadWordsFilter(BadWordsConfig(enabled=True))
    stage.check()
    assert all(stage.automaton_for(lang) is not None for lang in ("en", "es", "pt"))


# ---- unicode repair ---------------------------------------------------------------------------

def test_unicode_repair_fixes_mojibake_and_normalises_but_keeps_typography():
    assert repair_unicode("SÃ£o Paulo Ã© uma cidade") == ("São Paulo é uma cidade", "mojibake")
    assert repair_unicode("cafe\u0301") == ("café", "nfc")
    same = "“Comillas” — naïve ﬁne ＡＢＣ &amp;"
    assert repair_unicode(same) == (same, None)
    assert repair_unicode("plain ascii") == ("plain ascii", None)


def test_extract_counts_repairs(tmp_path):
    from quipu.tasks.extract import ExtractConfig, extract_file
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps({"id": str(i), "text": t}) for i, t in
                             enumerate(["SÃ£o Paulo Ã© grande", "cafe\u0301 bueno", "plain"])) + "\n")
    res = extract_file(str(src), tmp_path / "run", ExtractConfig())
    assert res.stats["unicode_repaired"] == {"mojibake": 1, "nfc": 1}
    texts = pq.read_table(res.kept_shards[0].path).column("text").to_pylist()
    assert texts == ["São Paulo é grande", "café bueno", "plain"]
    off = extract_file(str(src), tmp_path / "run-off", ExtractConfig(fix_unicode=False))
    assert pq.read_table(off.kept_shards[0].path).column("text").to_pylist()[0] == "SÃ£o Paulo Ã© grande"


# ---- line dedup -------------------------------------------------------------------------------

BOILER = ["We use cookies to improve your experience.", "Home | News | Sport | Contact", "© 2024 All rights reserved."]


def _site_docs(n: int, seed: int, host: str) -> list[dict]:
    rng = random.Random(seed)
    words = "river bridge council market school harvest rain museum train village doctor".split()
    docs = []
    for i in range(n):
        body = [" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(4)]
        docs.append({"id": f"{host}-{i}", "url": f"https://{host}/a/{i}", "source": "crawl.warc.gz",
                     "text": "\n".join([BOILER[0], BOILER[1], *body, f"Footer {i % 3}: " + BOILER[2]])})
    return docs


def test_line_normalisation_ignores_case_digits_and_punctuation():
    assert line_hashes("Home | News!\n© 2024 All rights.\n\n") == line_hashes("home news\n© 1999 all RIGHTS\n\n")
    assert line_hashes("a\n\nb")[1] == 0 and line_hashes("a")[0] != line_hashes("b")[0]


def test_lines_removes_repeated_lines_across_shards_and_keeps_the_article(tmp_path):
    docs = _site_docs(30, 1, "news.example.org")
    short = {"id": "short", "url": "https://news.example.org/x", "source": "c", "text": "\n".join(BOILER[:2] + ["Tiny."])}
    results, report = run_local("lines", LinesConfig(max_line_count=10, min_words_left=5),
                                _shards(tmp_path, [docs[:15] + [short], docs[15:]]), tmp_path / "run")
    kept = pa.concat_tables([pq.read_table(r.kept.path) for r in results]).to_pylist()
    removed = pa.concat_tables([pq.read_table(r.removed.path) for r in results]).to_pylist()
    assert report["input_docs"] == 31 and len(kept) == 30
    assert [(r["id"], r["reason"]) for r in removed] == [("short", "lines:too_short")]
    assert removed[0]["text"] == short["text"]                      # removed rows keep what the rule saw
    for doc, orig in zip(sorted(kept, key=lambda r: r["id"]), sorted(docs, key=lambda r: r["id"])):
        assert BOILER[0] not in doc["text"] and BOILER[1] not in doc["text"]
        assert orig["text"].split("\n")[2] in doc["text"]            # article lines stay
        # "Footer 0: © 2024 ..." normalises alike for every i (digits -> 0): boilerplate too
        assert "Footer" not in doc["text"]
        for span in doc["removed_line_spans"]:
            assert orig["text"][span["start"]:span["end"]].rstrip("\n") in BOILER[:2] + [orig["text"].split("\n")[-1]]
    stats = report["stats"]
    assert stats["lines_removed"] == 31 * 2 + 30 + 0 and stats["docs_edited"] == 31
    assert stats["top_removed_lines"][0]["documents"] == 31
    assert list(stats["top_domains_by_bytes_removed"]) == ["news.example.org"]


def test_lines_below_the_limit_are_kept(tmp_path):
    docs = _site_docs(10, 2, "small.example.org")          # each boilerplate line in 10 documents
    results, report = run_local("lines", LinesConfig(max_line_count=10), _shards(tmp_path, [docs]), tmp_path / "run")
    assert report["stats"]["lines_removed"] == 0 and report["kept_docs"] == 10


def test_line_index_counts_earlier_runs_and_a_rerun_replaces_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("QUIPU_HOME", str(tmp_path / "home"))
    cfg = LinesConfig(max_line_count=10)
    first = _site_docs(8, 3, "site.example.org")
    second = _site_docs(8, 4, "site.example.org")
    _, r1 = run_local("lines", cfg, _shards(tmp_path, [first], "in1"), tmp_path / "run1", dataset="cc-main")
    assert r1["stats"]["lines_removed"] == 0 and r1["stats"]["index"]["generation"] == 1
    # 8 earlier + 8 now = 16 > 10: the boilerplate goes from the second run's documents
    _, r2 = run_local("lines", cfg, _shards(tmp_path, [second], "in2"), tmp_path / "run2", dataset="cc-main")
    assert r2["stats"]["index_generations_read"] == 1 and r2["stats"]["lines_removed"] >= 16
    # re-running run2 does not count its own earlier generation: same result, same bytes
    before = sorted((tmp_path / "run2" / "lines" / "kept").glob("*.parquet"))[0].read_bytes()
    import shutil
    shutil.rmtree(tmp_path / "run2")
    _, r3 = run_local("lines", cfg, _shards(tmp_path, [second], "in2"), tmp_path / "run2", dataset="cc-main")
    assert r3["stats"]["lines_removed"] == r2["stats"]["lines_removed"]
    assert sorted((tmp_path / "run2" / "lines" / "kept").glob("*.parquet"))[0].read_bytes() == before
    manifest = json.loads((tmp_path / "home" / "lines" / "cc-main" / "manifest.json").read_text())
    assert [g["gen"] for g in manifest["generations"]] == [1, 3]
    # another dataset does not see these counts
    _, r4 = run_local("lines", cfg, _shards(tmp_path, [second], "in2"), tmp_path / "run4", dataset="other")
    assert r4["stats"]["lines_removed"] == 0


def test_lines_plan_is_the_same_in_one_or_many_partitions(tmp_path):
    docs = _site_docs(200, 5, "p.example.org") + _site_docs(200, 6, "q.example.org")   # ~1,600 distinct lines
    shards = _shards(tmp_path, [docs[:200], docs[200:]])
    _, one = run_local("lines", LinesConfig(), shards, tmp_path / "one")
    _, many = run_local("lines", LinesConfig(partition_rows=1000), shards, tmp_path / "many")
    assert many["stats"]["partitions"] > 1 and one["stats"]["partitions"] == 1
    a = [pq.read_table(p).column("text").to_pylist() for p in sorted((tmp_path / "one/lines/kept").glob("*.parquet"))]
    b = [pq.read_table(p).column("text").to_pylist() for p in sorted((tmp_path / "many/lines/kept").glob("*.parquet"))]
    assert a == b and one["stats"]["lines_removed"] == many["stats"]["lines_removed"] > 0


def test_detached_pii_and_urls_need_no_run_folder():
    # per-batch stages work on a bare table (notebooks); the global line stage needs a run folder
    from quipu.tasks.lines import LineDedup
    pii = PiiRedaction(PiiConfig()).process(pa.table({"id": ["a", "b"], "text": ["write to juan.perez@gmail.com", "x"]}))
    assert pii.kept.column("text").to_pylist()[1] == "x"
    assert "juan.perez@gmail.com" not in pii.kept.column("text").to_pylist()[0]
    urls = UrlFilter(UrlsConfig()).process(pa.table({"id": ["a", "b"], "text": ["x", "y"],
                                                     "url": ["http://xvideos.com/v", "https://g1.globo.com/economia/"]}))
    assert urls.kept.column("id").to_pylist() == ["b"]
    assert urls.removed.column("reason").to_pylist() == ["url:blocklist:adult"]
    with pytest.raises(RuntimeError, match="detached"):
        LineDedup(LinesConfig()).layout
    assert RunContext(run_dir="r").layout("lines").root.name == "lines"
