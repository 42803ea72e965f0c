"""PDF documents (issue 29): text layer and OCR against known text, running headers and page
numbers, hostile files, WARC PDF responses, the report, and the real PDFs in ../shared/data/pdf.

The born-digital and image-only PDFs are made here (quipu.synthetic.pdfs, reportlab, seeded) from real
es/pt/en prose laid out in one and two columns with running headers, page numbers and hyphenated
line ends, so the text a perfect extractor gives is known.
"""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quipu.synthetic.pdfs import FOOTERS, make_pdf, prose, token_f1
from quipu.tasks.reading import pdf
from quipu.tasks.extract import ExtractConfig, extract_file
from quipu.tasks.reading.pdf import PdfConfig, read_pdf, text_layer_problem
from quipu.tasks.reading.pdf_layout import Line, Page, document_text, is_page_number
from quipu.tasks.reading import expand_inputs, reader_kind

ROOT = Path(__file__).resolve().parents[1]
PARAGRAPHS = {lang: prose(lang, 24, seed=11) for lang in ("es", "pt", "en")}
# OCR tests check what OCR reads, not how fast: a page limit no loaded machine reaches (the shipped
# 60 s per page dropped a 300 dpi page as pdf:page_timeout at load 15); the limits have their own tests
OCR_UNHURRIED = {"ocr_dpi": 300, "page_timeout_s": 600}


def _page_number_lines(text: str, pages: int) -> list[str]:
    """Lines of `text` that are a page number in any of the footers' formats."""
    return [line for line in text.splitlines() if line.strip() and is_page_number(line)]


def _check_clean(text: str, made) -> None:
    assert made.header not in text, "a running header survived"
    assert not _page_number_lines(text, made.pages), _page_number_lines(text, made.pages)
    for n in range(1, made.pages + 1):     # no footer such as "Página 2 de 3" inside a paragraph either
        for f in FOOTERS["es"] + FOOTERS["pt"] + FOOTERS["en"]:
            if len(f) > 6:
                assert f.format(n=n, total=made.pages) not in text


@pytest.mark.parametrize("lang", ["es", "pt", "en"])
@pytest.mark.parametrize("columns", [1, 2])
def test_born_digital_text_matches_the_known_text(lang, columns):
    for seed in (1, 4):      # the seeds give different header/footer formats and paragraph styles
        made = make_pdf(PARAGRAPHS[lang], lang, columns=columns, seed=seed, title="Una prueba" if seed == 4 else None)
        got = read_pdf(made.data, PdfConfig(ocr="never"))
        assert made.pages >= 2 and got.reason is None
        f1 = token_f1(got.text, made.text)
        assert f1 >= 0.98, (lang, columns, seed, f1)
        _check_clean(got.text, made)
        # words hyphenated at line ends come back whole; paragraphs are separated by one blank line
        assert "\x02" not in got.text and "\ufffe" not in got.text and "\n\n\n" not in got.text
        paras = got.text.split("\n\n")
        assert abs(len(paras) - made.text.count("\n\n") - 1) <= 1
        assert got.metadata["pdf_pages"] == got.metadata["pdf_pages_text"] == made.pages
        assert got.stats["running_lines_removed"] + got.stats["page_numbers_removed"] >= made.pages


def test_image_only_page_is_read_by_ocr():
    """One scanned page (no text layer) in Portuguese: OCR with the document's language found on
    the way (read with spa+por+eng, this page comes back with 'náo' for 'não'), confidence recorded."""
    made = make_pdf(prose("pt", 6, seed=7), "pt", columns=1, seed=1, image_only=True)
    assert made.pages == 1
    got = read_pdf(made.data, PdfConfig(**OCR_UNHURRIED))
    assert got.reason is None, got
    assert got.metadata["pdf_pages_ocr"] == 1 and got.metadata["pdf_pages_text"] == 0
    assert got.metadata["pdf_ocr_confidence"] > 80
    f1 = token_f1(got.text, made.text)
    print(f"OCR token F1 {f1:.4f}, confidence {got.metadata['pdf_ocr_confidence']}")
    assert f1 >= 0.93
    _check_clean(got.text, made)
    # read in Portuguese alone once the first pass showed the language: its nasal vowels come back
    nasal = [w for w in re.findall(r"\w+", made.text) if "ã" in w or "õ" in w]
    found = set(re.findall(r"\w+", got.text))
    assert len(nasal) >= 3 and sum(w in found for w in nasal) >= 0.9 * len(nasal), [w for w in nasal if w not in found]


def test_ocr_language_is_the_one_whose_common_words_dominate():
    langs = ["spa", "por", "eng"]
    assert pdf.ocr_language(" ".join(PARAGRAPHS["pt"][:2]), langs) == "por"
    assert pdf.ocr_language(" ".join(PARAGRAPHS["es"][:2]), langs) == "spa"
    assert pdf.ocr_language(" ".join(PARAGRAPHS["en"][:2]), langs) == "eng"
    assert pdf.ocr_language("Tabela 3 1.250,00 2.300,50", langs) is None


@pytest.mark.slow
@pytest.mark.parametrize("lang,columns", [("es", 2), ("en", 1)])
def test_image_only_pages_with_running_headers(lang, columns):
    made = make_pdf(PARAGRAPHS[lang][:16 * columns], lang, columns=columns, seed=3, image_only=True)
    assert made.pages >= 2
    got = read_pdf(made.data, PdfConfig(**OCR_UNHURRIED))
    f1 = token_f1(got.text, made.text)
    print(f"OCR {lang} {made.pages} pages: token F1 {f1:.4f}")
    assert f1 >= 0.93
    _check_clean(got.text, made)


def test_ocr_never_drops_scanned_pages_with_a_reason(monkeypatch):
    scan = make_pdf(PARAGRAPHS["en"][:2], "en", seed=1, image_only=True, image_dpi=72)
    got = read_pdf(scan.data, PdfConfig(ocr="never"))
    assert got.reason == "pdf:needs_ocr" and got.metadata["pdf_pages_dropped"] == {"pdf:needs_ocr": 1}
    # without the tesseract binary: one warning line, and the page is dropped with its own reason
    monkeypatch.setenv("PATH", "/nonexistent")
    pdf.tesseract_setup.cache_clear()
    try:
        got = read_pdf(scan.data, PdfConfig(ocr="auto"))
    finally:
        pdf.tesseract_setup.cache_clear()
    assert got.reason == "pdf:ocr_unavailable"


def test_garbage_text_layer_is_not_used():
    cfg = PdfConfig()
    assert text_layer_problem("", cfg) == "none"
    assert text_layer_problem("%$#@ 123 456 ;;; ((( ))) !!! 789 %%% ### " * 3, cfg) == "garbage"
    assert text_layer_problem("\ufffd\ufffd\ufffd abcdef ghijk lmnop " * 5, cfg) == "garbage"
    mojibake = " ".join(["Ìçñ¿", "xqzvk", "ÞÐðßþ", "bcdfgh", "trwzqp"] * 10)   # a font without its Unicode map
    assert text_layer_problem(mojibake, cfg) == "language"
    assert text_layer_problem(" ".join(PARAGRAPHS["pt"][:2]), cfg) is None
    assert text_layer_problem("Tabela 3. Receita 1.250,00 2.300,50 4.120,75 Total 7.671,25", cfg) is None


def test_layout_rules():
    assert all(is_page_number(s) for s in ["7", "- 7 -", "Página 7 de 20", "p. vii", "Page 3 of 9", "Pág. 12", "12 / 30"])
    assert not any(is_page_number(s) for s in ["7 de septiembre de 2020", "Capítulo 7", "Artigo 5º da Lei"])

    def page(n: int, body: list[str], table: list[list[str]] = ()) -> Page:
        lines = [Line(60, 200, 30, 40, f"Gaceta Oficial {n}"), Line(290, 300, 800, 810, str(n))]
        y = 100
        for t in body:
            lines.append(Line(60, 530, y, y + 11, t))
            y += 13
        for cells in table:
            lines += [Line(60 + 150 * k, 60 + 150 * k + 40, y, y + 11, c) for k, c in enumerate(cells)]
            y += 13
        return Page(595, 842, lines)

    pages = [page(1, ["El texto de la primera página sigue en una pa\x02", "labra partida y termina aquí sin punto y"]),
             page(2, ["continúa en la página siguiente con un guion de corte de pala-", "bra normal."],
                  [["Región", "Total", "Votos"], ["Norte", "1.200", "800"]])]
    text, counts = document_text(pages)
    assert text.split("\n\n") == [
        "El texto de la primera página sigue en una palabra partida y termina aquí sin punto y "
        "continúa en la página siguiente con un guion de corte de palabra normal.",
        "Región Total Votos", "Norte 1.200 800"]
    assert counts == {"running_lines": 2, "page_numbers": 2}

    # a compound's own hyphen at a line end stays when the document writes it with one elsewhere
    compound = Page(595, 842, [Line(60, 530, 100 + 13 * k, 111 + 13 * k, t) for k, t in enumerate(
        ["An open-domain reader for long docu\x02", "ments reads the open\x02", "domain questions well and", "says so."])])
    assert document_text([compound])[0] == "An open-domain reader for long documents reads the open-domain questions well and says so."

    # one page: no repetition to go by. Small print at the top is a header; "Revista | 3" at the
    # foot carries the page number; a body line that starts "d-only" or ends "1990-2000" is text
    one = Page(595, 842, [Line(60, 200, 30, 38, "Revista de Estudios Andinos"), Line(400, 530, 800, 808, "Revista | 3"),
                          Line(60, 530, 60, 71, "d-only attributes are read in the years 1990-2000"),
                          *[Line(60, 530, 73 + 13 * k, 84 + 13 * k, f"body line {k} of the page") for k in range(6)]])
    text, counts = document_text([one])
    assert text.startswith("d-only attributes are read in the years 1990-2000 body line 0")
    assert counts == {"running_lines": 1, "page_numbers": 1}


def _encrypted(user: str, owner: str) -> bytes:
    from reportlab.lib.pdfencrypt import StandardEncryption
    from reportlab.pdfgen import canvas
    buf = io.BytesIO()
    c = canvas.Canvas(buf, encrypt=StandardEncryption(user, owner, strength=128))
    c.drawString(72, 700, "Texto protegido de la gaceta oficial de la provincia.")
    c.showPage()
    c.save()
    return buf.getvalue()


def _bomb_pdf(mib: int = 512) -> bytes:
    """One page whose content stream inflates to `mib` MiB of spaces (a decompression bomb). After a
    full flush deflate starts afresh, so 1 MiB compressed once is repeated (its checksum is wrong:
    a hostile file anyway)."""
    comp = zlib.compressobj(9)
    chunk = b" " * (1 << 20)
    first = comp.compress(chunk) + comp.flush(zlib.Z_FULL_FLUSH)
    again = comp.compress(chunk) + comp.flush(zlib.Z_FULL_FLUSH)
    stream = first + again * (mib - 1) + comp.flush()
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] /Contents 4 0 R >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream"]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for i, o in enumerate(objs, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % i + o + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref))
    return out.getvalue()


def test_hostile_pdfs_cost_at_most_themselves():
    cfg = PdfConfig(ocr="never", max_memory_mb=512)
    assert read_pdf(_encrypted("secret", "owner"), cfg).reason == "pdf:encrypted"
    opened = read_pdf(_encrypted("", "owner"), cfg)          # owner password only: the empty user password opens it
    assert opened.reason is None and "gaceta oficial" in opened.text
    assert read_pdf(b"%PDF-1.7\n" + bytes(range(256)) * 20, cfg).reason == "pdf:unreadable"
    assert read_pdf(b"", cfg).reason == "pdf:unreadable"
    # truncated: the pages that parse are read, the rest counted
    made = make_pdf(PARAGRAPHS["es"], "es", columns=1, seed=1)
    cut = read_pdf(made.data[: int(len(made.data) * 0.8)], cfg)
    assert cut.reason is None and cut.metadata["pdf_repaired"] and cut.text
    dropped = cut.metadata.get("pdf_pages_dropped", {})
    assert 1 <= cut.metadata["pdf_pages_text"] < made.pages == cut.metadata["pdf_pages_text"] + dropped["pdf:page_damaged"]
    # over max_pages: the first pages are read, the others counted
    few = read_pdf(made.data, PdfConfig(ocr="never", max_pages=1))
    assert few.metadata["pdf_pages_dropped"] == {"pdf:over_max_pages": made.pages - 1} and few.text
    # out of time: what is left is counted, nothing hangs
    late = read_pdf(made.data, PdfConfig(ocr="never", doc_timeout_s=1e-6))
    assert late.reason == "pdf:time_budget" and late.metadata["pdf_pages_dropped"] == {"pdf:time_budget": made.pages}
    # a 512 MiB decompression bomb in a content stream, under a 512 MB address-space limit: its page is lost
    bomb = read_pdf(_bomb_pdf(), cfg)
    assert bomb.reason == "pdf:page_error" and bomb.metadata["pdf_pages_dropped"] == {"pdf:page_error": 1}
    # the reader still works after all that
    assert read_pdf(made.data, cfg).reason is None


def test_pdf_files_and_warc_pdf_responses_through_extract(tmp_path):
    from tests.test_fault_suite import _warc
    made = make_pdf(PARAGRAPHS["en"][:6], "en", columns=2, seed=5)
    d = tmp_path / "in"
    d.mkdir()
    (d / "paper.PDF").write_bytes(made.data)
    (d / "locked.pdf").write_bytes(_encrypted("secret", "x"))
    (d / "empty.pdf").write_bytes(b"")
    _warc(d / "crawl.warc.gz", [("https://example.org/paper.pdf", "application/pdf", made.data, "response"),
                                ("https://example.org/dl", "application/octet-stream", made.data, "response")])
    assert reader_kind("x/paper.PDF") == "pdf"
    files = expand_inputs([str(d)])
    assert len(files) == 4
    totals = {"kept": 0, "removed": {}, "quarantine": []}
    for f in files:
        r = extract_file(f, tmp_path / "run", ExtractConfig(pdf=PdfConfig(ocr="never")))
        assert r.records_read == r.input_docs + r.quarantined
        for s in r.kept_shards:
            for row in pq.read_table(s.path).to_pylist():
                totals["kept"] += 1
                meta = json.loads(row["metadata"])
                assert meta["pdf_pages"] == made.pages and meta["pdf_producer"].startswith("quipu.demo.pdfs")
                assert token_f1(row["text"], made.text) >= 0.98
                assert row["url"] in (None, "https://example.org/paper.pdf", "https://example.org/dl")
        for reason, n in r.removed_by_reason.items():
            totals["removed"][reason] = totals["removed"].get(reason, 0) + n
        totals["quarantine"] += list(r.quarantine_by_reason)
        if r.stats.get("pdf"):
            assert r.stats["pdf"]["documents"] >= 1
    assert totals == {"kept": 3, "removed": {"extract:pdf:encrypted": 1}, "quarantine": ["empty file (0 bytes)"]}


def _joined_pdf(*parts: tuple[bytes, list[int] | None]) -> bytes:
    """One PDF of the given pages of other PDFs (None: all of its pages), in order."""
    import pypdfium2 as pdfium
    doc = pdfium.PdfDocument.new()
    for data, pages in parts:
        doc.import_pages(pdfium.PdfDocument(data), pages)
    buf = io.BytesIO()
    doc.save(buf)
    return buf.getvalue()


def test_pages_dropped_from_a_kept_pdf_are_rows_of_extract_removed(tmp_path):
    """A kept PDF's dropped pages (a scan under ocr: never, the pages past max_pages) are rows of
    extract/removed with their reason and page, counted apart from the documents, and shown by the
    report."""
    from quipu.flows.reports import pdf_rows
    from quipu.tasks.extract_accounts import aggregate_extract
    text = make_pdf(PARAGRAPHS["en"][:20], "en", seed=2)
    assert text.pages >= 2
    scan = make_pdf(PARAGRAPHS["en"][:2], "en", seed=1, image_only=True, image_dpi=72)
    path = tmp_path / "mixed.pdf"
    path.write_bytes(_joined_pdf((text.data, [0]), (scan.data, None), (text.data, [1, 0])))
    r = extract_file(str(path), tmp_path / "run", ExtractConfig(pdf=PdfConfig(ocr="never", max_pages=2)))
    assert (r.input_docs, r.kept_docs, r.removed_docs, r.removed_page_rows) == (1, 1, 0, 2)
    doc_id = pq.read_table(r.kept_shards[0].path).column("id")[0].as_py()
    rows = {x["id"]: x for x in pq.read_table(r.removed.path).to_pylist()}
    assert {i: (x["reason"], x["stage"], x["source"], x["text"]) for i, x in rows.items()} == {
        f"{doc_id}#page=2": ("pdf:needs_ocr", "extract", str(path), ""),
        f"{doc_id}#pages=3-4": ("pdf:over_max_pages", "extract", str(path), "")}
    assert json.loads(rows[f"{doc_id}#page=2"]["metadata"]) == {"pdf_document": doc_id, "pdf_page": 2,
                                                                "pdf_error": "text layer: none"}
    assert json.loads(rows[f"{doc_id}#pages=3-4"]["metadata"])["pdf_page_last"] == 4
    report = aggregate_extract([r])     # documents: 1 in = 1 kept + 0 removed; the page rows apart
    assert (report["removed_docs"], report["removed_by_reason"], report["removed_page_rows"]) == (0, {}, 2)
    shown = dict(pdf_rows(report["stats"]["pdf"]))
    assert shown["pages dropped: pdf:needs_ocr"] == 1 and shown["pages dropped: pdf:over_max_pages"] == 2
    assert shown["dropped-page rows in extract/removed (not documents)"] == 2


@pytest.mark.slow
def test_curate_extract_only_reports_pdf_reasons(tmp_path, prefect_server, capsys):
    """`quipu curate` with only extract on: exit 0, every file accounted, the reasons in the report;
    a 4-page PDF read as two Prefect tasks of 2 pages (pages_per_unit) is one document.
    (Slow: a `quipu curate` subprocess, 60-100 s here under load; the PDF work in it is < 1 s.)"""
    from quipu.tasks.pipeline import STAGES
    from tests.conftest import quipu_main
    d = tmp_path / "in"
    d.mkdir()
    (d / "a.pdf").write_bytes(make_pdf(PARAGRAPHS["es"][:4], "es", seed=1).data)
    (d / "b.pdf").write_bytes(_encrypted("secret", "x"))
    (d / "c.pdf").write_bytes(make_pdf(PARAGRAPHS["pt"][:2], "pt", seed=2, image_only=True, image_dpi=72).data)
    (d / "d.pdf").write_bytes(make_pdf(prose("es", 84, seed=5), "es", seed=1).data)    # 4 pages
    out = tmp_path / "run"
    off = [f"--set={s.name}.enabled=false" for s in STAGES]
    code = quipu_main("curate", str(ROOT / "configs/curate/demo.yaml"), "--input", str(d / "*.pdf"), "--output", str(out),
                      *off, "--set=extract.pdf.ocr=never", "--set=extract.pdf.pages_per_unit=2")
    assert code == 0, capsys.readouterr().err[-3000:]
    ranges = sorted(m.name.rsplit("-", 1)[1] for m in (out / "extract" / "_shards").glob("d.pdf-*-p*.json"))
    assert ranges == ["p0.json", "p2.json"]       # read as two units (tasks) of 2 pages
    run = json.loads((out / "run.json").read_text())
    assert run["records_read"] == 4 and run["stages"][0]["kept_docs"] == 2
    files = json.loads((out / "extract" / "report.json").read_text())["files"]
    assert [(f["documents"], f["kept"]) for f in files if f["source"].endswith("d.pdf")] == [(1, 1)]
    assert not (out / "extract" / "_pdf_pages").exists()     # work files, gone once the run completed
    extract = run["stages"][0]
    assert extract["removed_by_reason"] == {"extract:pdf:encrypted": 1, "extract:pdf:needs_ocr": 1}
    assert extract["pdf"]["pages_dropped"] == {"pdf:needs_ocr": 1}
    capsys.readouterr()
    assert quipu_main("report", str(out)) == 0
    report = capsys.readouterr().out
    for what in ("extract:pdf:encrypted", "extract:pdf:needs_ocr", "pages dropped: pdf:needs_ocr", "PDF pages",
                 "dropped-page rows in extract/removed"):
        assert what in report, report
    removed = pq.read_table(list((out / "extract" / "removed").glob("*.parquet"))).to_pylist()
    # the scanned PDF: its document row, and a row for its one page
    assert sorted(r["reason"] for r in removed) == ["extract:pdf:encrypted", "extract:pdf:needs_ocr", "pdf:needs_ocr"]
    assert [r["id"].rsplit("#", 1)[1] for r in removed if r["reason"] == "pdf:needs_ocr"] == ["page=1"]


# ---- the real PDFs in ../shared/data/pdf --------------------------------------------------------

def test_shared_pdfs_with_expected_text(shared_data):
    """Token F1 against the expected outputs that come with some of the shared PDFs (other tools'
    renderings, Markdown or layout-padded: a floor, not a target), and the hostile ones."""
    d = shared_data / "pdf"
    # the references keep what quipu removes on purpose (running headers and footers, the hyphen
    # halves "imple mented", a transcript's line numbers): the floors are below raw pypdfium2's
    floors = {"unstructured__multi-column-2p": 0.92, "querido-diario__38004a4b724a24c1e3c746596acf04efb0c95a58": 0.92,
              "pdfplumber__scotus-transcript-p1": 0.94, "docling__2305.03393v1-pg9": 0.97}
    cfg = PdfConfig(ocr="never")
    for name, floor in floors.items():
        got = read_pdf(str(d / f"{name}.pdf"), cfg)
        f1 = token_f1(got.text, (d / f"{name}.expected.txt").read_text())
        print(f"{name}: token F1 {f1:.4f}")
        assert f1 >= floor, (name, f1)
    assert read_pdf(str(d / "py-pdf-samples__libreoffice-writer-password.pdf"), cfg).reason == "pdf:encrypted"
    owner_only = read_pdf(str(d / "unicamp__doc_ccpg_infccpg002_2006.pdf"), cfg)
    assert owner_only.reason is None and owner_only.metadata["pdf_pages_text"] == 3
    assert "Beautiful is better than ugly" in read_pdf(str(d / "pdfminer__zen_of_python_corrupted.pdf"), cfg).text
    assert read_pdf(str(d / "docling__ocr_test.pdf"), cfg).reason == "pdf:needs_ocr"


def test_long_pdf_read_in_page_ranges_is_the_same_document(tmp_path):
    """A PDF split into units of 3 pages (pages_per_unit) is read on the workers as ranges and
    joined into the document the unsplit PDF gives, byte for byte: text (running headers and page
    numbers found across the whole document, a paragraph running on across a range boundary),
    metadata, page counts and dropped-page rows (a scan under ocr: never, the pages past max_pages);
    every page and file accounted. A PDF pdfium cannot open is planned as one unit."""
    from quipu.tasks.extract import run_extract
    from quipu.tasks.reading.pdf_ranges import plan_unit
    from quipu.tasks.stage import RunContext
    text = make_pdf(prose("es", 84, seed=5), "es", seed=1)
    scan = make_pdf(PARAGRAPHS["es"][:2], "es", seed=1, image_only=True, image_dpi=72)
    assert text.pages >= 4
    path = tmp_path / "long.pdf"      # 8 pages: 4 of text, a scan, 3 of text again
    path.write_bytes(_joined_pdf((text.data, [0, 1, 2, 3]), (scan.data, None), (text.data, [0, 1, 2])))
    runs = {}
    for ppu in (0, 3):
        cfg = ExtractConfig(pdf=PdfConfig(ocr="never", max_pages=7, pages_per_unit=ppu))
        assert len(plan_unit([str(path)], cfg.pdf)) == (1 if ppu == 0 else 3)     # pages 1-3, 4-6, 7
        results, report = run_extract([[str(path)]], RunContext(str(tmp_path / f"run{ppu}")), cfg)
        (r,) = results
        runs[ppu] = ({p.name: pq.read_table(p.path).to_pylist() for p in r.kept_shards},
                     sorted(pq.read_table(r.removed.path).to_pylist(), key=lambda x: x["id"]), r.shard,
                     {k: report[k] for k in ("records_read", "input_docs", "kept_docs", "removed_docs",
                                             "removed_page_rows", "quarantined", "files")},
                     {k: v for k, v in report["stats"]["pdf"].items() if not k.startswith("seconds")})
    assert len(list((tmp_path / "run3" / "extract" / "_pdf_pages").iterdir())) == 3
    assert runs[3] == runs[0]
    kept, removed, _, counts, stats = runs[3]
    (doc,) = next(iter(kept.values()))
    meta = json.loads(doc["metadata"])
    assert (meta["pdf_pages"], meta["pdf_pages_text"]) == (8, 6)
    assert [(x["id"].split("#")[1], x["reason"]) for x in removed] == [("page=5", "pdf:needs_ocr"),
                                                                       ("page=8", "pdf:over_max_pages")]
    assert (counts["records_read"], counts["input_docs"], counts["kept_docs"], counts["removed_page_rows"]) == (1, 1, 1, 2)
    assert stats["running_lines_removed"] + stats["page_numbers_removed"] >= 6
    _check_clean(doc["text"], text)
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 64)
    assert plan_unit([str(bad)], PdfConfig(pages_per_unit=1)) == [[str(bad)]]


def test_join_of_ranges_accounts_a_range_that_could_not_open(tmp_path):
    """A range whose reader could not open the file (a timeout on a loaded machine, a file changed
    under it) drops its own pages as pdf:page_error with the reason; none opened: the document is
    unread with the first range's reason, as an unsplit read of it."""
    from quipu.tasks.reading.pdf_ranges import PdfPagesPart, join_ranges
    from quipu.tasks.stage import Shard
    line = [60.0, 300.0, 400.0, 412.0, "Una frase con bastantes palabras para ser una línea de texto."]
    bodies = [{"first": 0, "end": 2, "info": {"pages": 3, "producer": None, "title": None, "repaired": False}, "error": None,
               "results": [[i, {"status": "text", "width": 595.0, "height": 842.0, "lines": [line]}] for i in (0, 1)]},
              {"first": 2, "end": 3, "info": None, "error": ["pdf:unreadable", "the parser timed out opening it"], "results": []}]
    parts = []
    for n, body in enumerate(bodies):
        path = tmp_path / f"p{n}.json"
        path.write_text(json.dumps(body))
        parts.append(PdfPagesPart(shard=f"p{n}", fingerprint="x", source="a.pdf", first_page=body["first"] + 1,
                                  last_page=body["end"], pages=Shard(name="p", path=str(path), sha256="", rows=0)))
    got = join_ranges(parts[::-1], PdfConfig())         # in page order whatever order they come in
    assert got.reason is None and got.text.startswith("Una frase")
    assert got.metadata["pdf_pages"] == 3 and got.metadata["pdf_pages_dropped"] == {"pdf:page_error": 1}
    assert got.lost_pages == [(3, 3, "pdf:page_error", "pdf:unreadable the parser timed out opening it")]
    unread = join_ranges(parts[1:], PdfConfig())
    assert (unread.reason, unread.metadata) == ("pdf:unreadable", {"pdf_error": "the parser timed out opening it"})
