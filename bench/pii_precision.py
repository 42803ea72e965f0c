"""PII precision on real text: how many clean documents the pii stage alters, and recall on planted PII,
for the detector of an earlier commit (the anchor) and the current one, on the same documents in one run.

Documents: real en/es/pt news, fiction and web text from ../shared/data/text. Half of the sampled
documents get one planted PII item of a random type in a local format (bench/cleaning_stages.py's
generator) plus one ordinary number; the other half ("clean") get only ordinary numbers: times, dates,
verses, label:value pairs, ranges and figures with grouped thousands, prices, scores, versions, drawn
with random values (issue 32: "December 31::" became <IP>, "3.000-5.000" became <PHONE>).

- recall: planted items replaced;
- clean docs altered: clean documents whose text the stage changed at all, and (separately) how
  many of those it changed already without the planted numbers (real contact data in the text).

Usage: .venv/bin/python bench/pii_precision.py [--anchor-rev REV] [--docs N] [--shared DIR]
"""
from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cleaning_stages  # noqa: E402  (the shared-text loader and the planted-PII generator)

ROOT = Path(__file__).resolve().parents[1]
MONTHS = {"en": ["January", "March", "June", "December"], "es": ["enero", "marzo", "junio", "diciembre"],
          "pt": ["janeiro", "março", "junho", "dezembro"]}
BOOKS = {"en": ["John", "Genesis", "Psalm"], "es": ["Juan", "Génesis", "Salmo"], "pt": ["João", "Gênesis", "Salmo"]}


def grouped(n: int, sep: str) -> str:
    return f"{n:,}".replace(",", sep)


def ordinary_number(lang: str, rng: random.Random) -> str:
    """One ordinary number in a sentence-like context, drawn at random from the shapes that are not PII."""
    sep = "," if lang == "en" else "."
    a = rng.randrange(1, 900) * 10 ** rng.randrange(3, 7)
    b = a + rng.randrange(1, 900) * 10 ** rng.randrange(3, 6)
    h, m, s = rng.randrange(24), rng.randrange(60), rng.randrange(60)
    shapes = [
        f"{rng.choice(MONTHS[lang])} {rng.randrange(1, 32)}::",                      # a list header
        f"{h:02d}:{m:02d}:{s:02d}", f"{h}:{m:02d}::", f"{h:02d}:{m:02d}-{(h + 2) % 24:02d}:{m:02d}",
        f"{rng.choice(BOOKS[lang])} {rng.randrange(1, 50)}:{rng.randrange(1, 40)}::",
        f"{rng.choice(BOOKS[lang])} {rng.randrange(1, 50)}:{rng.randrange(1, 20)}-{rng.randrange(20, 40)}",
        f"{grouped(a, sep)}-{grouped(b, sep)}", f"{grouped(a, sep)} - {grouped(b, sep)}", grouped(a, sep),
        f"({grouped(rng.randrange(1000, 9999), sep)}-{grouped(rng.randrange(1000, 9999), sep)})",
        f"{rng.randrange(1, 31)}/{rng.randrange(1, 13)}/{rng.randrange(1950, 2030)}",
        f"{rng.randrange(1950, 2030)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
        f"{rng.randrange(1900, 2000)}-{rng.randrange(2000, 2030)}", f"{rng.randrange(0, 6)}-{rng.randrange(0, 6)}",
        f"ref:{rng.randrange(10, 99)}::", f"{rng.randrange(1, 9)}.{rng.randrange(10)}.{rng.randrange(10)}",
        f"US$ {grouped(a, sep)}", f"{rng.randrange(1, 99)}{',' if lang != 'en' else '.'}{rng.randrange(10)}%",
    ]
    return rng.choice(shapes)


def load_detector(rev: str | None):
    """tasks/pii.py as of `rev` (None: the working tree), imported under its own name."""
    if rev is None:
        from quipu.tasks import pii
        return pii
    src = subprocess.run(["git", "show", f"{rev}:tasks/pii.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / f"pii_{rev[:8]}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"pii_{rev[:8]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(pii, rows: list[dict], docs_per_lang: int, seed: int) -> dict:
    rng = random.Random(seed)
    stage = pii.PiiRedaction(pii.PiiConfig())
    found, planted, clean, altered, altered_as_is, missed, touched = Counter(), Counter(), 0, Counter(), 0, [], Counter()
    labels = {"en": ("Contact", "Phone"), "es": ("Contacto", "Teléfono"), "pt": ("Contato", "Telefone")}
    for lang in ("en", "es", "pt"):
        pool = [r for r in rows if r["lang"] == lang]
        for k, r in enumerate(rng.sample(pool, min(docs_per_lang, len(pool)))):
            paras = r["text"].split("\n")
            numbers = [ordinary_number(lang, rng) for _ in range(2)]
            for n in numbers:
                paras.insert(rng.randrange(len(paras) + 1), f"Nota: {n} y más.")
            if k % 2:   # a planted item as well
                kind = ["email", "phone", "ip", "id"][k // 2 % 4] if lang != "en" or k // 2 % 4 != 3 else "phone"
                item = cleaning_stages.planted_item(kind, lang, rng)
                paras.insert(rng.randrange(len(paras) + 1), f"{labels[lang][kind == 'phone']}: {item}.")
                text = "\n".join(paras)
                new, _ = pii.redact(text, stage.find(text, lang, None, {}))
                planted[(lang, kind)] += 1
                if item not in new:
                    found[(lang, kind)] += 1
                elif len(missed) < 10:
                    missed.append((lang, kind, item))
                continue
            text = "\n".join(paras)
            spans = stage.find(text, lang, None, {})
            clean += 1
            if spans:
                altered[lang] += 1
                altered_as_is += bool(stage.find(r["text"], lang, None, {}))
                for s, e, kind in spans:
                    if any(text[s:e] in n or n in text[s:e] for n in numbers) or "Nota:" in text[max(0, s - 20):s]:
                        touched[f"{kind}: {text[max(0, s - 12):e + 8]!r}"] += 1
    return {"recall": round(sum(found.values()) / sum(planted.values()), 4),
            "recall_by": {f"{la}/{ki}": round(found[(la, ki)] / n, 3) for (la, ki), n in sorted(planted.items())},
            "clean_docs": clean, "clean_altered": sum(altered.values()),
            "clean_altered_rate": round(sum(altered.values()) / clean, 4), "altered_by_lang": dict(altered),
            "altered_without_the_planted_numbers": altered_as_is,
            "ordinary_numbers_touched": dict(touched.most_common(12)), "missed": missed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--anchor-rev", default="b0e6129", help="commit whose tasks/pii.py is the anchor")
    ap.add_argument("--docs", type=int, default=1200, help="documents per language")
    ap.add_argument("--seed", type=int, default=32)
    ap.add_argument("--shared", type=Path, default=cleaning_stages.SHARED)
    args = ap.parse_args()
    cleaning_stages.SHARED = args.shared
    rows = cleaning_stages.shared_text_rows()
    if not rows:
        sys.exit(f"no documents under {args.shared}/text")
    for name, rev in (("anchor " + args.anchor_rev, args.anchor_rev), ("ours", None)):
        r = measure(load_detector(rev), rows, args.docs, args.seed)
        print(f"{name}: recall {r['recall']} ({r['recall_by']}); clean docs altered {r['clean_altered']}/{r['clean_docs']} "
              f"= {r['clean_altered_rate']:.2%} (by language {r['altered_by_lang']}; "
              f"{r['altered_without_the_planted_numbers']} of them also without the planted numbers)")
        print(f"  ordinary numbers replaced: {r['ordinary_numbers_touched']}")
        print(f"  missed: {r['missed']}")


if __name__ == "__main__":
    main()
