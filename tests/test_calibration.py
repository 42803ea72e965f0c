"""Per-language thresholds, statistics that mean the same in every language, `quipu calibrate`, and
configs/curate/default.yaml as shipped on prose and junk it was not calibrated on."""
from __future__ import annotations

import io
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.synthetic.junk import KINDS, junk_documents
from quipu.flows.config import ConfigError, load_config
from quipu.tasks.heuristics import HeuristicFilters, HeuristicsConfig
from tests.conftest import ROOT, quipu_main
from tests.textgen import make_docs, write_jsonl

DEFAULT = ROOT / "configs" / "curate" / "default.yaml"
SENTENCE = re.compile(r"[.!?…]+(?:\s|$)")


def is_prose(text: str) -> bool:
    """The issue's prose: at least 3 sentences and 50 words."""
    return len(text.split()) >= 50 and len([s for s in SENTENCE.split(text) if s.strip()]) >= 3


def verdicts(config: HeuristicsConfig, texts: list[str], langs: list[str]) -> dict[str, str | None]:
    batch = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts, "lang": langs})
    out = HeuristicFilters(config).process(batch)
    removed = dict(zip(out.removed.column("id").to_pylist(), out.removed.column("reason").to_pylist()))
    return {str(i): removed.get(str(i)) for i in range(len(texts))}


# ---- per-language thresholds ----------------------------------------------------------------------

EUROPEAN_PT = (
    "O ministro — que falou aos jornalistas à saída do Conselho — disse que «não há razões» para adiar a decisão. "
    "A oposição (PSD e CDS) pediu esclarecimentos ; o Governo respondeu que o calendário se mantém . "
    "Segundo o jornal , a proposta « será votada » em Janeiro – e , se aprovada , entra em vigor no mês seguinte . "
    "Os sindicatos ( CGTP e UGT ) convocaram uma greve , mas a ministra afirmou : « O diálogo continua . » "
    "A medida abrange cerca de 200 mil trabalhadores , de acordo com os números do próprio ministério .")


def test_a_threshold_per_language_and_off_for_one_language():
    english = ["the", "be", "to", "of", "and", "that", "have", "with"]
    cfg = HeuristicsConfig.model_validate({
        "gopher_quality": {"min_doc_words": {"default": 50, "pt": 100000}, "max_non_alpha_words_ratio": "off"},
        "c4": {"min_num_sentences": {"default": 1000, "es": "off"}},
        "stop_words": {"en": english, "es": english, "pt": english}})
    assert cfg.filter_config("gopher_quality", "pt").min_doc_words == 100000
    assert cfg.filter_config("gopher_quality", "es").min_doc_words == 50
    assert cfg.filter_config("c4", "es").min_num_sentences == -1          # datatrove's "off"
    text = make_docs(1, seed=7, paras_per_doc=3)[0]["text"]
    got = verdicts(cfg, [text, text, text], ["es", "pt", "en"])
    assert got == {"0": None, "1": "gopher_quality:gopher_short_doc", "2": "c4:too_few_sentences"}


def test_a_bad_per_language_value_names_the_key_and_what_was_expected():
    for bad, expected in [({"fineweb": {"line_punct_thr": {"pt": 0.07}}}, "needs a `default` key"),
                          ({"fineweb": {"line_punct_thr": {"default": "x"}}}, "expected a number, `off`"),
                          ({"fineweb": {"line_punct_thr": {"default": 0.1, "portugues": 0.07}}}, "not a language code")]:
        with pytest.raises(ConfigError) as e:
            load_config(HeuristicsConfig, data=bad)
        assert "fineweb.line_punct_thr" in str(e.value) and expected in str(e.value), str(e.value)


def test_scalar_configs_build_the_same_datatrove_filters():
    """A config without per-language values resolves to itself: datatrove gets the same arguments."""
    cfg = HeuristicsConfig()
    for name in ("gopher_repetition", "gopher_quality", "c4", "fineweb"):
        assert cfg.filter_config(name, "pt") is getattr(cfg, name)


def test_lines_limit_per_language_and_decisions_per_language_in_the_report(tmp_path):
    """Each boilerplate line is in 24 documents: above es's limit (10), below pt's (30)."""
    from quipu.tasks.pipeline import run_local
    from quipu.tasks.lines import LinesConfig
    from tests.test_cleaning_stages import BOILER, _shards, _site_docs
    docs = _site_docs(24, 4, "mixed.example.org")
    for i, d in enumerate(docs):
        d["lang"] = "es" if i % 2 else "pt"
    results, report = run_local("lines", LinesConfig(max_line_count={"default": 10, "pt": 30}),
                                _shards(tmp_path, [docs]), tmp_path / "run")
    kept = pa.concat_tables([pq.read_table(r.kept.path) for r in results]).to_pylist()
    assert all((BOILER[0] in d["text"]) == (d["lang"] == "pt") for d in kept) and len(kept) == 24
    assert report["stats"]["by_language"] == {"es": {"kept": 12, "removed": 0, "by_reason": {}},
                                              "pt": {"kept": 12, "removed": 0, "by_reason": {}}}


# ---- statistics that mean the same in every language ---------------------------------------------

def test_punctuation_tokens_are_not_words_for_the_alpha_rule():
    """European Portuguese journalism with «», dashes and spaced punctuation: datatrove's alpha rule
    counts every punctuation token as a word and removes it; quipu's statistic does not."""
    dt = verdicts(HeuristicsConfig(), [EUROPEAN_PT], ["pt"])["0"]
    ours = verdicts(HeuristicsConfig(compat="quipu", c4={"min_num_sentences": 2}), [EUROPEAN_PT], ["pt"])["0"]
    assert dt == "gopher_quality:gopher_below_alpha_threshold"
    assert ours is None


def test_sentences_know_the_languages_abbreviations():
    from quipu.tasks.language_rules import count_sentences
    assert count_sentences("El Sr. García y la Dra. Pérez leyeron la pág. 5 del informe. Después se fueron a casa.", "es") == 2
    assert count_sentences("O Sr. Silva chegou às 3 p.m. ao escritório. Trouxe livros, cadernos, etc. Depois saiu.", "pt") == 3
    assert count_sentences("Mr. Smith paid $3.50 for it. Then he left.", "en") == 2
    assert count_sentences("Inicio | Noticias | Deportes", "es") == 0      # a menu line is no sentence


# ---- calibration ------------------------------------------------------------------------------------

def _english_reference(tmp_path, n=80):
    return write_jsonl(tmp_path / "ref" / "en.jsonl", make_docs(n, seed=3, paras_per_doc=3))


def test_calibrate_refuses_empty_small_and_foreign_references_in_one_line(tmp_path):
    from quipu.flows.calibrate import CalibrateError, run_calibration
    demo = str(ROOT / "configs" / "curate" / "demo.yaml")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    small = write_jsonl(tmp_path / "small.jsonl", make_docs(10, seed=1))
    ref = _english_reference(tmp_path)
    for glob, lang, expected in [(str(empty), "en", "no documents"), (str(small), "en", "needs at least 50"),
                                 (str(ref), "es", "only 0 of 80 documents are identified as es")]:
        with pytest.raises(CalibrateError) as e:
            run_calibration(demo, [glob], lang, output=str(tmp_path / "out.yaml"))
        assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "out.yaml").exists()


def test_calibrate_refuses_a_crawl_sample_of_html_it_would_read_as_nothing(tmp_path):
    """A WARC of HTML pages as `--crawl` gave no text (extraction's work, not calibrate's) and was
    reported as an empty sample; now it is refused naming the option and what to give instead."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    from quipu.flows.calibrate import CalibrateError, run_calibration
    warc = tmp_path / "sample.warc.gz"
    with open(warc, "wb") as fh:
        writer = WARCWriter(fh, gzip=True)
        for i in range(3):
            page = f"<html><body><p>Page {i} of a crawl, with a sentence or two of prose.</p></body></html>".encode()
            http = StatusAndHeaders("200 OK", [("Content-Type", "text/html")], protocol="HTTP/1.1")
            writer.write_record(writer.create_warc_record(f"https://example.org/{i}", "response",
                                                          payload=io.BytesIO(page), http_headers=http))
    with pytest.raises(CalibrateError) as e:
        run_calibration(str(ROOT / "configs" / "curate" / "demo.yaml"), [str(_english_reference(tmp_path))], "en",
                        output=str(tmp_path / "out.yaml"), crawl=[str(warc)])
    assert str(e.value).startswith("--crawl: 3 HTML or PDF records") and "keep_intermediate" in str(e.value), str(e.value)
    assert not (tmp_path / "out.yaml").exists()


def test_calibrate_is_deterministic_and_its_report_agrees_with_the_stage(tmp_path):
    """Two runs write the same config and report bytes; every calibrated threshold carries its
    comment; and what the report says the config removes is what the stages remove."""
    from quipu.flows.calibrate import run_calibration
    from quipu.flows.curate import CurateConfig
    from quipu.tasks.langid import LanguageId
    docs = make_docs(80, seed=3, paras_per_doc=3)
    # pages whose many one-word lines (share buttons) C4 drops before FineWeb measures short lines:
    # the report must measure FineWeb on the text C4 left, as the stage does
    for i, d in enumerate(make_docs(6, seed=9, paras_per_doc=3)):
        paras = d["text"].split("\n\n")
        docs.append({"id": f"share-{i}", "text": "\n".join(["Share", "Tweet", "Email", "Print", "Save", "Like", "Follow", "Comments", "Top", "Menu"] + paras)})
    ref = write_jsonl(tmp_path / "ref" / "en.jsonl", docs)
    junk = write_jsonl(tmp_path / "junk.jsonl", junk_documents("en", 48, seed=5))
    demo = str(ROOT / "configs" / "curate" / "demo.yaml")
    outs = []
    out = tmp_path / "run0" / "en.yaml"
    model = tmp_path / "run0" / "fluency-en.json"
    for _ in range(2):
        report = run_calibration(demo, [str(ref)], "en", [str(junk)], keep=0.97, output=str(out), fluency_model=str(model))
        outs.append((out.read_bytes(), open(report["files"]["json"], "rb").read(), model.read_bytes(),
                     open(report["files"]["html"], "rb").read()))
    assert outs[0] == outs[1]
    # the fluency judges were fitted too: model, cut-offs with their comments, histograms in the report
    config = load_config(CurateConfig, out)
    assert config.fluency.enabled and config.fluency.model_paths["en"] == str(model)
    assert isinstance(config.fluency.min_burstiness["en"], float) and isinstance(config.fluency.min_word_order["en"], float)
    assert "cut-off from held-out folds of 86 en reference docs" in outs[0][0].decode()
    rows = {r["rule"]: r for r in json.loads(outs[0][1])["languages"]["en"]["rules"]}
    assert sum(rows["fluency.min_burstiness"]["reference_hist"]) > 20 and "junk_hist" in rows["fluency.min_word_order"]
    text = outs[0][0].decode()
    calibrated = [line for line in text.splitlines() if re.match(r"^\s+en: ", line)]
    assert len(calibrated) >= 15 and all("reference docs" in line or "n=" in line for line in calibrated)
    ev = json.loads(outs[0][1])["languages"]["en"]
    config = load_config(CurateConfig, tmp_path / "run0" / "en.yaml")
    texts = [json.loads(line)["text"] for line in open(junk)] + [json.loads(line)["text"] for line in open(ref)]
    batch = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts})
    after_lid = LanguageId(config.langid).process(batch).kept
    after_lid = after_lid.filter(pa.array([x == "en" for x in after_lid.column("lang").to_pylist()]))
    kept = HeuristicFilters(config.heuristics).process(after_lid).kept
    kept_ids = set(kept.column("id").to_pylist())
    junk_removed = 1 - sum(1 for i in range(48) if str(i) in kept_ids) / 48
    ref_removed = 1 - sum(1 for i in range(48, len(texts)) if str(i) in kept_ids) / (len(texts) - 48)
    # the report's "removed by all rules together" treats every document as --lang (en here)
    assert ev["junk_removed"] == pytest.approx(junk_removed, abs=1e-3)
    assert ev["reference_removed"] == pytest.approx(ref_removed, abs=1e-3)
    assert ev["junk_removed"] >= 0.95


@pytest.mark.slow
def test_calibrate_command_writes_config_html_and_json(tmp_path, prefect_server, capsys):
    ref = _english_reference(tmp_path)
    out = tmp_path / "cal.yaml"
    assert quipu_main("calibrate", str(ROOT / "configs" / "curate" / "demo.yaml"), "--reference", str(ref), "--lang", "en",
                      "--output", str(out), "--flow") == 0
    assert out.is_file() and (tmp_path / "cal.calibration.html").is_file()
    html = (tmp_path / "cal.calibration.html").read_text()
    assert "data:image/png;base64," in html and "fineweb.line_punct_thr" in html
    removed = re.search(r"en: 80 reference documents, ([0-9.]+ %) removed", capsys.readouterr().out).group(1)
    assert quipu_main("calibrate", "--check", str(out), "--reference", str(ref), "--lang", "en",
                      "--report", str(tmp_path / "check")) == 0
    # the report card of the written config says what calibration said it would remove
    check = capsys.readouterr().out
    assert f"80 reference documents, {removed} removed" in check, check
    assert json.loads((tmp_path / "check.calibration.json").read_text())["mode"] == "check"


# ---- the shipped config, as shipped, on prose and junk it never saw ---------------------------------

LEFT_OUT = {"es": ["es_nltk_cess_esp_news.jsonl", "es_nltk_conll2002_efe_news.jsonl"],
            "pt": ["pt_fakebr_news.jsonl"],
            "en": ["en_nltk_abc_news.jsonl", "en_ud_ewt_web.jsonl"]}


@pytest.mark.slow
def test_default_config_keeps_prose_and_removes_junk_per_language(shared_data, tmp_path, prefect_server):
    """`quipu curate configs/curate/default.yaml` (every stage as shipped) on prose of sources no
    calibration saw (bench/calibrate_default.py) and on junk of every kind (another seed than the
    calibration report's): >= 95 % of the prose kept and >= 95 % of the junk removed, per language."""
    inputs = tmp_path / "in"
    docs: dict[str, dict] = {}
    for lang, files in LEFT_OUT.items():
        for name in files:
            n = 0
            for line in open(shared_data / "text" / name, encoding="utf-8"):
                d = json.loads(line)
                if d.get("lang") == lang and is_prose(d["text"]) and n < 70:
                    docs[d["id"]] = {"id": d["id"], "text": d["text"], "lang": lang, "kind": "prose"}
                    n += 1
        for d in junk_documents(lang, 64, seed=11):
            docs[d["id"]] = d
    write_jsonl(inputs / "mix.jsonl", [{"id": d["id"], "text": d["text"]} for d in docs.values()])
    out = tmp_path / "curated-default"
    assert quipu_main("curate", str(DEFAULT), "--input", str(inputs / "*.jsonl"), "--output", str(out),
                      "--set", "dataset=default-acceptance") == 0
    kept = set(pq.read_table(out / "curated", columns=["id"]).column("id").to_pylist())
    for lang in LEFT_OUT:
        prose = [i for i, d in docs.items() if d["lang"] == lang and d["kind"] == "prose"]
        junk = [i for i, d in docs.items() if d["lang"] == lang and d["kind"] != "prose"]
        kept_prose = sum(i in kept for i in prose) / len(prose)
        removed_junk = 1 - sum(i in kept for i in junk) / len(junk)
        survivors = sorted({docs[i]["kind"] for i in junk if i in kept})
        print(f"{lang}: prose kept {kept_prose:.1%} of {len(prose)}, junk removed {removed_junk:.1%} of {len(junk)}")
        assert kept_prose >= 0.95, f"{lang}: {kept_prose:.1%} of {len(prose)} prose documents kept"
        assert removed_junk >= 0.95, f"{lang}: {removed_junk:.1%} of {len(junk)} junk documents removed (kept: {survivors})"
    run = json.loads((out / "run.json").read_text())
    heur = next(s for s in run["stages"] if s["name"] == "heuristics")
    assert set(heur["by_language"]) == {"en", "es", "pt"}     # decisions per language in run.json
    assert len({d["kind"] for d in docs.values()}) == len(KINDS) + 1


def test_lid_tau_is_median_minus_sigma_inside_its_bounds():
    """FineWeb-2's rule, max(0.3, min(0.9, median - sigma)): spread scores land between the bounds,
    where a flipped sign (median + sigma) gives another value; the bounds hold at both ends."""
    from quipu.tasks.calibration import lid_tau
    scores = np.array([0.5, 0.6, 0.7, 0.8, 0.9])               # median 0.7, sigma 0.1414
    assert lid_tau(scores) == pytest.approx(0.7 - np.std(scores))
    assert lid_tau(scores) < float(np.median(scores))          # a threshold below the typical score
    assert lid_tau(np.array([0.99, 0.98, 0.995, 0.97])) == 0.9  # confident language: the 0.9 cap
    assert lid_tau(np.array([0.1, 0.2, 0.5, 0.3])) == 0.3       # unconfident: the 0.3 floor

def test_calibrate_takes_lid_tau_from_the_crawl_sample(tmp_path):
    """With --crawl, tau = max(0.3, min(0.9, median - sigma)) of the crawl documents langid labels
    --lang (FineWeb-2's way), not of the clean reference; the comment says so."""
    import numpy as np
    from quipu.flows.calibrate import run_calibration
    from quipu.flows.curate import CurateConfig
    from quipu.tasks import calibration as cal
    ref = _english_reference(tmp_path)
    crawl_docs = make_docs(30, seed=4, paras_per_doc=1) + junk_documents("en", 30, seed=2)
    crawl = write_jsonl(tmp_path / "crawl.jsonl", crawl_docs)
    demo = str(ROOT / "configs" / "curate" / "demo.yaml")
    out = tmp_path / "en.yaml"
    run_calibration(demo, [str(ref)], "en", output=str(out), crawl=[str(crawl)])
    labels, scores, _ = cal.lid_scores([d["text"] for d in crawl_docs], "en", load_config(CurateConfig, demo).langid)
    expected = round(cal.lid_tau(np.array([s for l, s in zip(labels, scores) if l == "en"])), 3)
    config = load_config(CurateConfig, out)
    assert config.langid.min_score["en"] == pytest.approx(expected) and expected < 0.9
    assert "of the crawl sample (FineWeb-2)" in out.read_text()
    # the report card draws the crawl sample's LID scores beside the reference's, on the same bins
    lid_row = json.loads((tmp_path / "en.calibration.json").read_text())["languages"]["en"]["rules"][0]
    assert lid_row["rule"] == "langid.min_score" and sum(lid_row["crawl_hist"]) == sum(l == "en" for l in labels)


def test_a_reference_that_moves_nothing_says_so_and_clipped_values_are_marked():
    """The old and new values side by side: a new value at an end of its rule's plausible range is
    marked clipped, and a reference that set no threshold inside its range is told so in one line."""
    from quipu.flows.calibrate import comparison_html, moved_sentence
    from quipu.flows.curate import CurateConfig
    from quipu.tasks import calibration as cal
    config = load_config(CurateConfig, DEFAULT)
    rules = {r.key: r for r in cal.RULES if r.bounds is not None}
    at_bound = {key: {"rule": r, "value": r.bounds[0], "how": "p"} for key, r in rules.items()}
    rows = cal.side_by_side(at_bound, config.heuristics, config.langid, "es")
    assert all(r["clipped"] for r in rows)
    assert [r["old"] for r in rows if r["rule"] == "gopher_quality.max_symbol_word_ratio"] == [0.1141]   # the shipped es value
    summary = {"rows": rows, **cal.moved(rows), "earlier_reference_docs": 661, "reference_docs": 54, "written": False}
    line = moved_sentence(summary)
    assert "moved no heuristic threshold" in line and "661" in line and "NOT written" in line and "\n" not in line
    inside = dict(at_bound, **{"gopher_quality.max_symbol_word_ratio": {
        "rule": rules["gopher_quality.max_symbol_word_ratio"], "value": 0.15, "how": "p"}})
    rows = cal.side_by_side(inside, config.heuristics, config.langid, "es")
    summary = {"rows": rows, **cal.moved(rows), "earlier_reference_docs": None, "reference_docs": 54, "written": True}
    assert summary["inside_range"] == ["gopher_quality.max_symbol_word_ratio"]
    assert "moved no" not in moved_sentence(summary) and "1 heuristic threshold(s) set inside" in moved_sentence(summary)
    html = "".join(comparison_html(summary))
    assert html.count("<td class=\"\">clipped</td>") == len(rows) - 1


def test_calibrate_never_silently_replaces_a_calibration_made_on_more_documents(tmp_path):
    """The shipped default's en thresholds come from 768 documents: 60 do not replace them without
    --replace (one line naming the flag; the side-by-side report is still written); with it, they do."""
    from quipu.flows.calibrate import CalibrateError, parse_lid_tau, run_calibration
    from quipu.flows.curate import CurateConfig
    ref = _english_reference(tmp_path, n=60)
    out = tmp_path / "en.yaml"
    with pytest.raises(CalibrateError) as e:
        run_calibration(str(DEFAULT), [str(ref)], "en", output=str(out), report_path=str(tmp_path / "r"))
    assert "768" in str(e.value) and "--replace" in str(e.value) and "\n" not in str(e.value)
    assert not out.exists()
    report = json.loads((tmp_path / "r.calibration.json").read_text())
    comparison = report["comparison"]
    assert comparison["written"] is False and comparison["earlier_reference_docs"] == 768
    old = {r["rule"]: r["old"] for r in comparison["rows"]}
    assert old["langid.min_score"] == 0.65 and old["c4.min_num_sentences"] == 2     # the shipped en values
    assert "Old and new" in (tmp_path / "r.calibration.html").read_text()
    run_calibration(str(DEFAULT), [str(ref)], "en", output=str(out), replace=True, lid_tau=parse_lid_tau("0.8=a crawl"))
    text = out.read_text()
    assert "# calibrated en: --keep 0.97, 60 reference documents" in text
    assert load_config(CurateConfig, out).langid.min_score["en"] == 0.8
    assert "LID scores over a crawl" in text


@pytest.mark.parametrize("lang", ["pt", "es", "en"])
def test_the_shipped_lid_tau_is_what_the_documented_command_writes(lang):
    """configs/curate/default.yaml is built by bench/calibrate_default.py: its tau per language is the one
    that script passes (FineWeb-2's for es and pt, FineWeb's for en), comment included."""
    from bench.calibrate_default import PUBLISHED_TAU
    tau, how = PUBLISHED_TAU[lang]
    lines = DEFAULT.read_text().split("\nbad_words:")[0].splitlines()
    assert [line for line in lines if line.startswith(f"    {lang}: ")] == [f"    {lang}: {tau:g}   # {how}"]
