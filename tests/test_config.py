import pytest

from quipu.flows.cli import main
from quipu.flows.config import ConfigError, load_config
from quipu.flows.curate import CurateConfig


def test_defaults_validate():
    cfg = load_config(CurateConfig, data={})
    assert cfg.langid.languages == ["en", "es", "pt"]
    assert cfg.heuristics.enabled


def test_override_parses_yaml_values():
    cfg = load_config(CurateConfig, data={}, overrides=["heuristics.enabled=false", "langid.languages=[en,es]",
                                                        "langid.min_score=0.5"])
    assert cfg.heuristics.enabled is False
    assert cfg.langid.languages == ["en", "es"]
    assert cfg.langid.min_score == 0.5


@pytest.mark.parametrize("override,key", [
    ("langid.min_score=abc", "langid.min_score"),
    ("langid.min_scor=0.5", "langid.min_scor"),
    ("heuristics.gopher_quality.min_doc_words=[1]", "heuristics.gopher_quality.min_doc_words"),
    ("extract.enabled=false", "extract"),
    ("langid.languages=[english]", "langid.languages"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        load_config(CurateConfig, data={}, overrides=[override])
    assert key in str(e.value)


def test_per_language_override_is_validated():
    with pytest.raises(ConfigError, match="per_language"):
        load_config(CurateConfig, data={"heuristics": {"per_language": {"es": {"nope": {}}}}})
    cfg = load_config(CurateConfig, data={"heuristics": {"per_language": {"es": {"gopher_quality": {"min_doc_words": 10}}}}})
    assert cfg.heuristics.filter_config("gopher_quality", "es").min_doc_words == 10
    assert cfg.heuristics.filter_config("gopher_quality", "en").min_doc_words == 50


def test_cli_config_error_is_one_line(tmp_path, capsys):
    bad = tmp_path / "c.yaml"
    bad.write_text("langid:\n  min_score: high\n")
    assert main(["curate", str(bad), "--input", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "langid.min_score" in err and "Traceback" not in err


def test_cli_missing_input(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("{}\n")
    assert main(["curate", str(cfg), "--input", str(tmp_path / "nope/*.jsonl")]) == 2
    assert "input not found" in capsys.readouterr().err


def test_every_shipped_config_loads_with_its_model():
    """configs/<name>/*.yaml for every config name `quipu config show` knows: a key renamed in a
    model, or a new config with a typo, fails here rather than in a user's run."""
    from pathlib import Path

    from quipu.flows.config import CONFIG_MODELS, config_model
    root = Path(__file__).resolve().parents[1] / "configs"
    checked = []
    for name in CONFIG_MODELS:
        for path in sorted((root / name).glob("*.yaml")):
            load_config(config_model(name), path)
            checked.append(f"{name}/{path.name}")
    assert "ppl/smollm2-shared.yaml" in checked and "ppl/smollm2-shared-frozen16.yaml" in checked, checked
    assert len(checked) >= 10, checked
