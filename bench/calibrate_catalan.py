"""Builds configs/curate/ca.yaml (Catalan, the worked example of "adding a language") with `quipu
calibrate`, and checks it on whole sources left out.

    apt-get download maint-guide-ca gimp-help-ca lilypond-doc-html-ca libreoffice-help-ca
    .venv/bin/python bench/calibrate_catalan.py --debs DIR [--write]

No Catalan text ships with a Python package this environment can install (nltk's corpora are not
downloadable at run time) and ../shared/data holds none; Debian ships Catalan translations of
software documentation. Each package is one source; a document is one page, or one section of a
long single-page manual (maint-guide), its paragraphs (`<p>`, `<li>`, `<dd>`, `<td>` text)
one per line, kept when it has >= 50 words. Pages left untranslated (English) are not removed
here: `quipu calibrate` refuses a reference that langid does not mostly label `ca`, and measures
the LID scores of what it is given.

1. `quipu calibrate configs/curate/default.yaml --lang ca --keep 0.97` on CALIBRATE (two
   manuals; no junk: demo/junk.py makes none in Catalan). With --write the config goes to configs/curate/ca.yaml.
2. The config's langid + heuristics decisions (`quipu curate`) on CHECK (two sources no calibration
   saw) and on the calibration sources, per source: documents and the share removed, by reason.

This is technical documentation only (one genre): the calibrated values are an honest start for
Catalan, not a replacement for a reference of news and literature (docs/languages.md).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CONFIG = ROOT / "configs" / "curate" / "ca.yaml"
CALIBRATE = ["maint-guide-ca", "gimp-help-ca"]    # kicad-doc-ca: its pages are English (untranslated)
CHECK = ["lilypond-doc-html-ca", "libreoffice-help-ca"]
MIN_WORDS = 50
MAX_DOCS = 600          # per source, in file order (sorted paths)
BLOCKS = ("p", "li", "dd", "td")
SECTIONS = ("h1", "h2", "h3")


def unpack(debs: Path, package: str, into: Path) -> Path:
    deb = sorted(debs.glob(f"{package}_*.deb"))
    if not deb:
        raise SystemExit(f"{package}: no .deb in {debs} (apt-get download {package})")
    out = into / package
    if not out.is_dir():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(deb[-1]), str(out)], check=True)
    return out


def page_documents(path: Path) -> list[str]:
    """The page's text, one document per top-level section when it is a long single-page manual."""
    import lxml.html
    try:
        tree = lxml.html.fromstring(path.read_bytes())
    except Exception:
        return []
    docs, lines = [], []
    for el in tree.iter(*BLOCKS, *SECTIONS):
        if el.tag in SECTIONS:
            if sum(len(x.split()) for x in lines) >= 400:    # a long page: its sections are documents
                docs.append("\n".join(lines))
                lines = []
            continue
        if any(a.tag in BLOCKS for a in el.iterancestors()):
            continue                                          # counted with its outer block
        text = " ".join(el.text_content().split())
        if text:
            lines.append(text)
    docs.append("\n".join(lines))
    return [d for d in docs if len(d.split()) >= MIN_WORDS]


def source_documents(root: Path) -> list[str]:
    docs: list[str] = []
    for page in sorted(root.rglob("*.html")):
        docs += page_documents(page)
        if len(docs) >= MAX_DOCS:
            break
    return docs[:MAX_DOCS]


def write_jsonl(path: Path, texts: list[str], source: str) -> None:
    with path.open("w", encoding="utf-8") as fh:
        for i, t in enumerate(texts):
            fh.write(json.dumps({"id": f"{source}-{i}", "text": t, "source": source}, ensure_ascii=False) + "\n")


def quipu(*args: str) -> None:
    subprocess.run([str(ROOT / ".venv" / "bin" / "quipu"), *args], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--debs", type=Path, required=True, help="folder of the downloaded .deb files")
    ap.add_argument("--write", action="store_true", help="write configs/curate/ca.yaml")
    ap.add_argument("--work", type=Path, default=None, help="where to unpack (default: a temporary folder)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="quipu-ca-"))
    ref = work / "ref"
    ref.mkdir(parents=True, exist_ok=True)
    counts = {}
    for package in CALIBRATE + CHECK:
        texts = source_documents(unpack(args.debs, package, work / "debs"))
        counts[package] = len(texts)
        write_jsonl(ref / f"{package}.jsonl", texts, package)
    print("documents per source:", counts)
    output = CONFIG if args.write else work / "ca.yaml"
    refs = [a for p in CALIBRATE for a in ("--reference", str(ref / f"{p}.jsonl"))]
    quipu("calibrate", str(ROOT / "configs" / "curate" / "default.yaml"), *refs, "--lang", "ca", "--keep", "0.97",
          "--output", str(output), "--report", str(work / "report"), "--replace")
    for package in CALIBRATE + CHECK:
        quipu("curate", str(output), "--input", str(ref / f"{package}.jsonl"), "--output", str(work / "runs" / package),
              "--set", "dedup.enabled=false", "--set", "lines.enabled=false", "--allow-empty")
    print(table(work, counts))


def table(work: Path, counts: dict[str, int]) -> str:
    """Per source: documents, those langid labels ca, and of those the share langid + heuristics remove, by reason."""
    import pyarrow.parquet as pq
    rows = ["| source | role | documents | labelled ca | ca removed | top reasons (of the ca documents) |",
            "|---|---|---|---|---|---|"]
    for package in CALIBRATE + CHECK:
        out = work / "runs" / package
        kept = [r for p in sorted((out / "curated").glob("*.parquet")) for r in pq.read_table(p, columns=["lang"]).to_pylist()]
        removed = [r for p in sorted(out.glob("*/removed/*.parquet"))
                   for r in pq.read_table(p, columns=["lang", "reason"]).to_pylist() if "lang" in pq.read_schema(p).names]
        ca_kept = sum(r["lang"] == "ca" for r in kept)
        reasons = Counter(r["reason"] for r in removed if r["lang"] == "ca")
        n_ca = ca_kept + sum(reasons.values())
        top = ", ".join(f"{r} {100 * c / max(n_ca, 1):.1f} %" for r, c in reasons.most_common(3))
        role = "calibration" if package in CALIBRATE else "left out"
        rows.append(f"| {package} | {role} | {counts[package]} | {n_ca} | {100 * sum(reasons.values()) / max(n_ca, 1):.1f} % | {top} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
