"""The language table (tasks/languages.py): one entry per language, read by every stage that needs
one; Catalan (`ca`), added as one entry plus `quipu calibrate`, used end to end; a language with no
entry refused or removed with a reason, never judged by another language's lists."""
from __future__ import annotations

import ast
import json

import pyarrow as pa
import pytest

from quipu.tasks.languages import LANGUAGES
from tests.conftest import ROOT

CA = ("La biblioteca municipal obrirà les portes dilluns després de tres mesos d'obres. Els veïns del barri "
      "podran consultar el fons antic i fer servir la nova sala d'estudi, que té capacitat per a cinquanta "
      "persones. Segons la directora, el projecte ha costat menys del previst gràcies a una subvenció de la "
      "Generalitat.\nA més, la sala infantil tindrà un horari ampliat durant l'estiu. Les activitats "
      "començaran el mes de juliol amb tallers de lectura i de còmic per als més petits. La inscripció és "
      "gratuïta i es pot fer per internet o a la mateixa biblioteca.\nEl regidor de cultura va explicar que "
      "l'objectiu és convertir l'equipament en un punt de trobada per a tot el barri, i no només en un lloc "
      "on es deixen llibres en préstec.")


def test_every_entry_is_complete_and_agrees_with_the_tools_that_read_it():
    import phonenumbers
    from datatrove.pipeline.filters.c4_filters import POLICY_SUBSTRINGS
    from quipu.tasks.per_language import LID_CODES
    for code, lang in LANGUAGES.items():
        assert code == lang.code and code in LID_CODES, code
        assert len(lang.stop_words) == 8 and len(set(lang.stop_words)) == 8, code
        assert len(lang.tesseract) == 3 and len(lang.tokenizer) == 3, code
        assert set(lang.phone_regions) <= phonenumbers.SUPPORTED_REGIONS, code
        assert len(lang.ocr_function_words.split()) >= 40 and lang.policy_lines, code
        assert all(p == p.lower() for p in lang.policy_lines), code
    assert set(POLICY_SUBSTRINGS) <= set(LANGUAGES["en"].policy_lines)    # datatrove's C4 list, kept for English


LANGUAGE_KEYS = set(LANGUAGES) | {lang.tesseract for lang in LANGUAGES.values()}
# per-language text that is no property of a language: the labelling prompts (a task's wording; a language
# without one is asked in English, which the LLM reads), the fluency models (fitted files, one per language)
NOT_LANGUAGE_TABLES = {"trainer/llm_labels.py"}


def test_no_other_module_keeps_a_table_keyed_by_language():
    """Adding a language takes one entry: no dict literal in tasks/, flows/ or trainer/ besides the table
    holds two or more of its languages as keys (the old stop-word, abbreviation, policy, OCR and phone tables)."""
    found = []
    for pkg in ("tasks", "flows", "trainer"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "tasks/languages.py" or rel in NOT_LANGUAGE_TABLES:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Dict):
                    keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
                    if len(keys & LANGUAGE_KEYS) >= 2:
                        found.append(f"{rel}:{node.lineno}")
    assert not found, f"tables keyed by language outside tasks/languages.py: {found}"


def test_catalan_entry_is_what_every_stage_reads():
    """Catalan is one entry; its stop words, abbreviations, cookie lines, OCR words and phone regions are
    what heuristics (both statistics), pdf and pii use for a `ca` document."""
    from quipu.tasks.heuristics import HeuristicFilters, HeuristicsConfig
    from quipu.tasks.language_rules import C4Rules, count_sentences
    from quipu.tasks.reading.pdf import ocr_language
    from quipu.tasks.pii import PiiConfig, PiiRedaction
    batch = pa.table({"id": ["a"], "text": [CA], "lang": ["ca"]})
    english = list(LANGUAGES["en"].stop_words)
    for compat in ("quipu", "datatrove"):
        assert HeuristicFilters(HeuristicsConfig(compat=compat)).process(batch).kept.num_rows == 1
        # the same document judged by English stop words: what a language without its entry got before
        out = HeuristicFilters(HeuristicsConfig(compat=compat, stop_words={"ca": english})).process(batch)
        assert out.removed.column("reason").to_pylist() == ["gopher_quality:gopher_enough_stop_words"], compat
    line = "Vegeu la pàg. 12 del manual i la fig. 3 de l'annex. Després continueu amb el pas següent."
    assert count_sentences(line, "ca") == 2
    banner = "Utilitzem galetes pròpies i de tercers per millorar la vostra experiència de navegació."
    assert C4Rules(language="ca", **_c4_defaults()).edit(f"{CA}\n{banner}")[0] == CA
    assert ocr_language(CA, ["eng", "cat"]) == "cat"
    pii = PiiRedaction(PiiConfig(phone_regions=["US", "AD", "ES"]))
    assert pii.regions_for("ca", None) == ["ES", "AD", "US"] and pii.regions_for("en", None)[0] == "US"


def _c4_defaults() -> dict:
    from quipu.tasks.heuristics import C4Config
    return C4Config().model_dump(exclude={"enabled"})


def test_a_document_in_a_language_with_no_entry_is_removed_with_its_reason():
    from quipu.tasks.heuristics import HeuristicFilters, HeuristicsConfig
    batch = pa.table({"id": ["a", "b"], "text": [CA, CA], "lang": ["ca", "oc"]})
    out = HeuristicFilters(HeuristicsConfig(compat="quipu")).process(batch)
    assert out.kept.column("id").to_pylist() == ["a"]
    assert out.removed.column("reason").to_pylist() == ["no_language_entry:oc"]
    assert out.stats["no_language_entry"] == {"oc": 1}


def test_a_config_keeping_a_language_with_no_entry_is_refused_naming_it():
    from quipu.flows.config import ConfigError, load_config
    from quipu.flows.curate_config import CurateConfig
    with pytest.raises(ConfigError) as e:
        load_config(CurateConfig, ROOT / "configs" / "curate" / "demo.yaml", ["langid.languages=[es, oc]"])
    assert "langid.languages: oc has no entry in the language table" in str(e.value) and "\n" not in str(e.value)
    # without heuristics nothing needs its lists
    load_config(CurateConfig, ROOT / "configs" / "curate" / "demo.yaml", ["langid.languages=[es, oc]", "heuristics.enabled=false"])
    with pytest.raises(ConfigError) as e:       # the older key: one line naming the new one
        load_config(CurateConfig, ROOT / "configs" / "curate" / "demo.yaml", ["langid.min_score_per_language={es: 0.5}"])
    assert "min_score: {default: 0.65, es: 0.84}" in str(e.value)


def test_calibrate_refuses_a_language_with_no_entry(tmp_path):
    from quipu.flows.calibrate import CalibrateError, run_calibration
    with pytest.raises(CalibrateError, match="--lang: oc has no entry"):
        run_calibration(str(ROOT / "configs" / "curate" / "default.yaml"), [str(tmp_path / "*.jsonl")], "oc",
                        output=str(tmp_path / "oc.yaml"))


def test_calibration_derives_its_rules_from_the_rules_and_builds_the_stage_chain():
    from quipu.tasks import calibration, language_rules
    from quipu.tasks.heuristics import HeuristicsConfig, build_chain
    assert calibration.RULES == [r for cls in language_rules.RULES.values() for r in cls.CALIBRATION]
    assert all(r.filter == name for name, cls in language_rules.RULES.items() for r in cls.CALIBRATION)
    heur = HeuristicsConfig()       # compat: datatrove; calibration measures quipu's statistics
    ours = calibration.rule_objects(heur, "ca")
    stage = build_chain(heur.model_copy(update={"compat": "quipu"}), "ca")
    assert [(n, type(f), f.__dict__.keys()) for n, f in ours] == [(n, type(f), f.__dict__.keys()) for n, f in stage]
    stats = calibration.statistics(CA, ours)
    assert {r.stat for r in calibration.RULES} <= set(stats)    # every declared statistic is measured
    assert stats["stop_words"] == 8        # de la a el en del per i: the entry's list, all in the text


@pytest.mark.slow
def test_shipped_catalan_config_curates_catalan(tmp_path, prefect_server):
    """configs/curate/ca.yaml as shipped (`quipu calibrate`'s output) keeps Catalan prose through every
    stage and judges it per its entry: the run's report holds Catalan decisions."""
    from tests.conftest import quipu_main
    import pyarrow.parquet as pq
    paragraphs = CA.split("\n")
    docs = [{"id": f"ca{i}", "text": "\n".join(paragraphs[i:] + paragraphs[:i])} for i in range(3)]
    docs.append({"id": "banner", "text": "Utilitzem galetes per millorar la navegació. Acceptar galetes."})
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    out = tmp_path / "out"
    assert quipu_main("curate", "configs/curate/ca.yaml", "--input", str(tmp_path / "in.jsonl"), "--output", str(out),
                      "--set", "dataset=catalan-acceptance", "--set", "dedup.enabled=false") == 0
    kept = pq.read_table(out / "curated", columns=["id", "lang"]).to_pylist()
    assert {r["id"] for r in kept} == {"ca0", "ca1", "ca2"} and {r["lang"] for r in kept} == {"ca"}
    run = json.loads((out / "run.json").read_text())
    heur = next(s for s in run["stages"] if s["name"] == "heuristics")
    assert heur["by_language"]["ca"]["kept"] == 3
