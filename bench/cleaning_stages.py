"""The safety and line-cleaning stages (urls, pii, bad_words, lines, extract.fix_unicode) on real
text from ../shared/data, with planted cases:

- throughput of each stage on all of ../shared/data/text (one process = one core), in the driver
  (scan, plan, process, commit), after the stage's lists are loaded;
- urls: the 100 real article pages of web/constructed (none may go), and planted adult-list,
  banned-word and user-list URLs (all must go, with the list named);
- pii: real en/es/pt documents with one planted item of every type in local formats, and ordinary
  numbers (dates, years, prices, figures, ISBNs, versions, postcodes) planted beside them: recall,
  and the share of documents where an ordinary number was touched;
- lines: every real WARC/ARC crawl of web/ plus web/constructed, bytes removed per domain, and the
  extraction F1 of the 100 annotated pages against their human ground truth before and after.

Usage: .venv/bin/python bench/cleaning_stages.py [--out bench/out/cleaning]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def shared_text_rows() -> list[dict]:
    rows = []
    for f in sorted((SHARED / "text").glob("*.jsonl")):
        for i, line in enumerate(f.open(encoding="utf-8")):
            try:
                d = json.loads(line)
            except ValueError:
                continue
            text = d.get("text") or ""
            if text.strip():
                lang = f.stem[:2] if f.stem[:2] in ("en", "es", "pt") else "und"
                rows.append({"id": f"{f.stem}-{i}", "text": text, "source": str(f), "lang": lang,
                             "url": f"https://{f.stem.replace('_', '-')}.example.org/doc/{i}"})
    return rows


def write_shards(rows: list[dict], folder: Path, n: int = 4):
    from quipu.tasks.schema import BASE_SCHEMA
    from quipu.tasks.stage import write_table
    schema = BASE_SCHEMA.append(pa.field("lang", pa.string()))
    full = [{**{k: None for k in schema.names}, "metadata": "{}", **r} for r in rows]
    return [write_table(folder / f"s{k}.parquet", pa.Table.from_pylist(full[k::n], schema)) for k in range(n)]


def throughput(rows: list[dict], work: Path) -> list[dict]:
    from quipu.tasks.pipeline import run_local
    from quipu.tasks.pipeline import stage_class
    shards = write_shards(rows, work / "in")
    out = []
    for name, overrides in [("urls", {}), ("bad_words", {"enabled": True}), ("lines", {}), ("pii", {})]:
        cfg = stage_class(name).Config(**overrides)
        stage_class(name)(cfg).check()            # lists loaded once per process, before timing
        t0 = time.perf_counter()
        _, report = run_local(name, cfg, shards, work / f"run-{name}")
        dt = time.perf_counter() - t0
        out.append({"stage": name, "docs": len(rows), "seconds": round(dt, 2), "docs_per_s": round(len(rows) / dt),
                    "removed": report["removed_docs"], "mb_per_s": round(report["bytes_in"] / 1e6 / dt, 2)})
    t0 = time.perf_counter()
    from quipu.tasks.text_repair import repair_unicode
    kinds = Counter(repair_unicode(r["text"])[1] for r in rows)
    dt = time.perf_counter() - t0
    out.append({"stage": "extract.fix_unicode", "docs": len(rows), "seconds": round(dt, 2),
                "docs_per_s": round(len(rows) / dt), "repaired": {k: v for k, v in kinds.items() if k}})
    return out


def anchors(rows: list[dict]) -> list[dict]:
    """Each stage's batch logic against the anchor doing the same job, on the same documents:
    datatrove's URLFilter (its lists; tldextract kept offline) and PIIFormatter (e-mail and IPv4
    only, ours adds phones, ids and IPv6), and a plain in-memory Counter of normalised lines (two
    passes, no index, no out-of-core plan) for the line stage."""
    from datatrove.data import Document
    from datatrove.pipeline.filters.url_filter import URLFilter
    from datatrove.pipeline.formatters.pii import PIIFormatter
    from tldextract import TLDExtract
    from quipu.tasks.lines import line_hashes
    from quipu.tasks.pii import PiiConfig, PiiRedaction
    from quipu.tasks.urls import UrlFilter, UrlsConfig
    table = pa.Table.from_pylist([{k: r[k] for k in ("id", "text", "url", "lang")} for r in rows])
    out = []

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    dt_filter = URLFilter()
    dt_filter.tldextractor = TLDExtract(suffix_list_urls=(), cache_dir=None)
    dt_filter.download_data()
    docs = [Document(text="", id=r["id"], metadata={"url": r["url"]}) for r in rows]
    ours = UrlFilter(UrlsConfig())
    ours.check()
    a, o = timed(lambda: [dt_filter.filter(d) for d in docs]), timed(lambda: ours.process(table))
    out.append({"stage": "urls", "anchor": "datatrove URLFilter", "anchor_docs_per_s": round(len(rows) / a),
                "ours_docs_per_s": round(len(rows) / o), "ratio": round(a / o, 2)})
    pii_dt = PIIFormatter()
    pii = PiiRedaction(PiiConfig())
    a, o = timed(lambda: [pii_dt.format(r["text"]) for r in rows]), timed(lambda: pii.process(table))
    out.append({"stage": "pii", "anchor": "datatrove PIIFormatter (e-mail, IPv4)", "anchor_docs_per_s": round(len(rows) / a),
                "ours_docs_per_s": round(len(rows) / o), "ratio": round(a / o, 2)})
    no_phones = PiiRedaction(PiiConfig(phones=False, ids=False))
    o2 = timed(lambda: no_phones.process(table))
    out.append({"stage": "pii (e-mail, IP only)", "anchor": "datatrove PIIFormatter (e-mail, IPv4)",
                "anchor_docs_per_s": round(len(rows) / a), "ours_docs_per_s": round(len(rows) / o2), "ratio": round(a / o2, 2)})

    def plain_lines():
        counts = Counter()
        for r in rows:
            counts.update(set(line_hashes(r["text"])))
        return [[h for h in line_hashes(r["text"]) if counts[h] <= 10] for r in rows]
    a = timed(plain_lines)
    out.append({"stage": "lines (driver: scan, plan, process, commit, parquet I/O)", "anchor": "in-memory Counter, two passes",
                "anchor_docs_per_s": round(len(rows) / a), "ours_docs_per_s": None, "ratio": None})
    return out


# ---- urls -------------------------------------------------------------------------------------

def extract(paths: list[Path], run: Path) -> list[dict]:
    from quipu.tasks.extract import ExtractConfig, extract_file
    rows = []
    for p in paths:
        res = extract_file(str(p), run, ExtractConfig())
        for s in res.kept_shards:
            rows += pq.read_table(s.path).to_pylist()
    return rows


def url_check(constructed: list[dict], work: Path) -> dict:
    from quipu.tasks.urls import UrlFilter, UrlsConfig
    import tarfile
    from datatrove.utils._import_utils import ASSETS_PATH
    rng = random.Random(7)
    with tarfile.open(Path(ASSETS_PATH) / "url_filterblacklistsv0_3_0.tar.gz") as tar:
        domains = [d for d in tar.extractfile("domains").read().decode().split("\n") if d and not d.startswith("#")]
    adult = [f"https://{'www.' if i % 2 else ''}{d}/page/{i}" for i, d in enumerate(rng.sample(domains, 100))]
    banned = sorted(w.strip() for w in (Path(ASSETS_PATH) / "banned_words.txt").read_text().splitlines()
                    if w.strip() and not w.startswith("#"))
    words = [f"https://videos.example.com/{w}-{i}" for i, w in enumerate(rng.sample(banned, 50))]
    malware = [f"malware-{i}.example.net" for i in range(50)]
    user_list = work / "malware-domains.txt"
    user_list.write_text("# planted malware hosts\n" + "\n".join(malware) + "\n")
    malware_urls = [f"http://cdn.{d}/payload-{i}.exe" for i, d in enumerate(malware)]
    stage = UrlFilter(UrlsConfig(block_lists=[str(user_list)]))
    stage.check()
    removed_real = [(r["url"], stage.judge(r["url"])[0]) for r in constructed if r.get("url") and stage.judge(r["url"])[0]]
    planted = Counter()
    missed = []
    for group, urls in (("adult_list", adult), ("banned_word", words), ("user_list", malware_urls)):
        for u in urls:
            reason = stage.judge(u)[0]
            planted[(group, reason)] += 1
            if reason is None:
                missed.append(u)
    return {"constructed_pages": len(constructed), "constructed_removed": removed_real,
            "planted": {f"{g} -> {r}": n for (g, r), n in sorted(planted.items(), key=str)},
            "planted_missed": missed[:10]}


# ---- pii --------------------------------------------------------------------------------------

def _valid(number: str, region: str | None) -> bool:
    import phonenumbers
    try:
        return phonenumbers.is_valid_number(phonenumbers.parse(number, region))
    except phonenumbers.NumberParseException:
        return False


PHONE_FORMATS = {   # (template with # for a random digit, region it is dialled in)
    "es": [("+34 6## ### ###", None), ("6## ## ## ##", "ES"), ("91 ### ## ##", "ES"), ("(55) #### ####", "MX"),
           ("+52 55 #### ####", None), ("011 4###-####", "AR"), ("+54 9 11 4###-####", None),
           ("(601) ### ####", "CO"), ("+57 3## ### ####", None), ("+56 9 #### ####", None), ("(2) 2### ####", "CL")],
    "pt": [("(11) 9####-####", "BR"), ("+55 21 3###-####", None), ("11 3###-####", "BR"), ("+351 912 ### ###", None),
           ("21 ### ####", "PT"), ("912 ### ###", "PT")],
    "en": [("(212) ###-####", "US"), ("415-###-####", "US"), ("+1 650 ### ####", None), ("212.###.####", "US")],
}
NEGATIVES = ["15/03/2021", "2021-03-15", "1998-2004", "R$ 1.234,56", "US$ 12.500", "1.234.567 habitantes",
             "ISBN 978-84-376-0494-7", "versión 3.2.1", "en 1987", "CEP 01310-100", "a las 12:45", "subió un 3,5%",
             "pedido nº 48213", "27 de mayo de 2019", "12.345.678 votos", "temperatura de 23,5 grados",
             "del 3 al 15 de julio", "page 123", "EUR 2,500.00", "1,234,567 people"]


def _fill(template: str, rng: random.Random) -> str:
    return re.sub("#", lambda _: str(rng.randrange(10)), template)


def planted_item(kind: str, lang: str, rng: random.Random) -> str:
    if kind == "email":
        return f"{rng.choice(['ana', 'jose', 'maria', 'john', 'lucas'])}.{rng.choice(['silva', 'garcia', 'smith'])}{rng.randrange(100)}@{rng.choice(['gmail.com', 'uol.com.br', 'empresa.es', 'mail.co'])}"
    if kind == "ip":
        if rng.random() < 0.5:
            return f"{rng.randrange(23, 200)}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        return "2a00:" + ":".join(f"{rng.randrange(1, 65535):x}" for _ in range(3)) + "::" + f"{rng.randrange(1, 65535):x}"
    if kind == "id":
        from quipu.synthetic.corpus import cpf
        if lang == "pt":
            return cpf(rng)
        n = rng.randrange(10_000_000, 99_999_999)
        if rng.random() < 0.5:
            return f"{n}{'TRWAGMYFPDXBNJZSQVHLCKE'[n % 23]}"
        p, n7 = rng.randrange(3), rng.randrange(1_000_000, 9_999_999)
        return f"{'XYZ'[p]}{n7}{'TRWAGMYFPDXBNJZSQVHLCKE'[(p * 10_000_000 + n7) % 23]}"
    for _ in range(1000):
        template, region = rng.choice(PHONE_FORMATS[lang])
        number = _fill(template, rng)
        if _valid(number, region):
            return number
    raise RuntimeError(f"no valid phone number from {PHONE_FORMATS[lang]}")


def pii_check(rows: list[dict]) -> dict:
    from quipu.tasks.pii import PiiConfig, PiiRedaction, redact
    rng = random.Random(11)
    stage = PiiRedaction(PiiConfig())
    by_lang = {lang: [r for r in rows if r["lang"] == lang] for lang in ("en", "es", "pt")}
    found, planted, fp_docs, docs, examples_missed = Counter(), Counter(), 0, 0, []
    words = {"en": ("Contact", "Phone"), "es": ("Contacto", "Teléfono"), "pt": ("Contato", "Telefone")}
    for lang, pool in by_lang.items():
        for r in rng.sample(pool, min(400, len(pool))):
            kind = ["email", "phone", "ip", "id"][docs % 4] if lang != "en" or docs % 4 != 3 else "phone"
            item = planted_item(kind, lang, rng)
            negative = rng.choice(NEGATIVES)
            paras = r["text"].split("\n")
            at = rng.randrange(len(paras) + 1)
            label = words[lang][1] if kind == "phone" else words[lang][0]
            paras.insert(at, f"{label}: {item}.")
            paras.insert(rng.randrange(len(paras) + 1), f"Nota: {negative}.")
            text = "\n".join(paras)
            new, _ = redact(text, stage.find(text, lang, None, {}))
            planted[(lang, kind)] += 1
            if item not in new:
                found[(lang, kind)] += 1
            elif len(examples_missed) < 10:
                examples_missed.append((lang, kind, item))
            fp_docs += negative not in new
            docs += 1
    recall = {f"{lang}/{kind}": round(found[(lang, kind)] / n, 3) for (lang, kind), n in sorted(planted.items())}
    # what the stage finds in the real documents as they are (real contact data, or false positives)
    real = Counter()
    for r in rows:
        for _, _, kind in stage.find(r["text"], r["lang"], None, {}):
            real[(Path(r["source"]).stem, kind)] += 1
    return {"docs": docs, "recall_overall": round(sum(found.values()) / sum(planted.values()), 4),
            "recall": recall, "missed": examples_missed, "ordinary_numbers_touched_docs": fp_docs,
            "false_positive_rate_docs": round(fp_docs / docs, 4),
            "found_in_unplanted_real_text": {f"{s}/{k}": n for (s, k), n in real.most_common()}}


# ---- lines ------------------------------------------------------------------------------------

def bag_f1(pred: str, gold: str) -> float:
    p, g = Counter(re.findall(r"\w+", pred.lower())), Counter(re.findall(r"\w+", gold.lower()))
    common = sum((p & g).values())
    if not common:
        return 0.0
    pr, rc = common / sum(p.values()), common / sum(g.values())
    return 2 * pr * rc / (pr + rc)


def lines_check(web_rows: list[dict], constructed: list[dict], work: Path, max_line_count: int = 10) -> dict:
    """Line dedup over the real crawls plus the 100 annotated pages; extraction F1 of those pages
    against the human ground truth before and after. With the default count no line of the 100
    (different) sites repeats often enough to go, so the check is also run with `max_line_count` 2
    or 1: every line seen in more than 2 (or 1) documents is removed, the boilerplate the sites
    share ("Advertisement", "Share this") goes and the F1 says whether article text went with it."""
    from quipu.tasks.pipeline import run_local
    from quipu.tasks.lines import LinesConfig
    rows = web_rows + constructed
    shards = write_shards([{k: r.get(k) for k in ("id", "text", "source", "url")} for r in rows], work / f"lines-in-{max_line_count}", n=2)
    results, report = run_local("lines", LinesConfig(max_line_count=max_line_count), shards, work / f"lines-run-{max_line_count}")
    after = {}
    for res in results:
        for r in pq.read_table(res.kept.path, columns=["id", "text"]).to_pylist():
            after[r["id"]] = r["text"]
    gold = {j["url"]: j["articleBody"] for j in map(json.loads, open(SHARED / "web/constructed/article-extraction-benchmark-shared.ground_truth.jsonl"))}
    scored = [(bag_f1(r["text"], gold[r["url"]]), bag_f1(after.get(r["id"], ""), gold[r["url"]]), r["id"] in after)
              for r in constructed if r.get("url") in gold]
    n = len(scored)
    return {"max_line_count": max_line_count, "docs": len(rows), "web_docs": len(web_rows), "constructed_docs": len(constructed),
            "removed": report["removed_by_reason"], "bytes_in": report["bytes_in"], "bytes_out": report["bytes_out"],
            "lines_removed": report["stats"]["lines_removed"], "docs_edited": report["stats"]["docs_edited"],
            "top_domains_by_bytes_removed": report["stats"]["top_domains_by_bytes_removed"],
            "top_removed_lines": report["stats"]["top_removed_lines"][:8],
            "constructed_f1_before": round(sum(b for b, _, _ in scored) / n, 4),
            "constructed_f1_after": round(sum(a for _, a, _ in scored) / n, 4),
            "constructed_removed_by_lines": sum(1 for _, _, kept in scored if not kept)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/out/cleaning")
    args = ap.parse_args()
    if not (SHARED / "text").is_dir():
        print(f"needs {SHARED}", file=sys.stderr)
        return 2
    os.environ.setdefault("QUIPU_HOME", tempfile.mkdtemp(prefix="quipu-bench-home-"))
    work = Path(tempfile.mkdtemp(prefix="quipu-bench-cleaning-"))
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    rows = shared_text_rows()
    result = {"load_average": os.getloadavg()[0], "throughput": throughput(rows, work)}
    for t in result["throughput"]:
        print(t)
    result["anchors"] = anchors(rows)
    lines_rate = next(t["docs_per_s"] for t in result["throughput"] if t["stage"] == "lines")
    for t in result["anchors"]:
        if t["stage"].startswith("lines"):
            t["ours_docs_per_s"] = lines_rate
            t["ratio"] = round(lines_rate / t["anchor_docs_per_s"], 2)
        print(t)
    constructed = extract([SHARED / "web/constructed/article-extraction-benchmark-shared.warc.gz"], work / "x-constructed")
    crawls = sorted(p for p in (SHARED / "web").iterdir() if p.is_file() and re.search(r"\.(w?arc)(\.gz)?$", p.name))
    web_rows = extract(crawls, work / "x-web")
    result["urls"] = url_check(constructed, work)
    print("urls", json.dumps(result["urls"], indent=1)[:2000])
    result["pii"] = pii_check(rows)
    print("pii", json.dumps({k: v for k, v in result["pii"].items() if k != "found_in_unplanted_real_text"}, indent=1))
    print("pii in unplanted real text", result["pii"]["found_in_unplanted_real_text"])
    result["lines"] = lines_check(web_rows, constructed, work)
    print("lines", json.dumps(result["lines"], indent=1, ensure_ascii=False)[:3000])
    result["lines_aggressive"] = [lines_check(web_rows, constructed, work, k) for k in (2, 1)]
    for r in result["lines_aggressive"]:
        print("lines", {k: r[k] for k in ("max_line_count", "lines_removed", "docs_edited", "constructed_f1_before",
                                           "constructed_f1_after", "constructed_removed_by_lines")})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cleaning.json").write_text(json.dumps(result, indent=2, ensure_ascii=False, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
