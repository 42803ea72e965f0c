"""The curate deployment's form (issue 31): the parameter schema Prefect stores for the deployment
and the UI draws is short, every block of the config is in it (collapsed), what `quipu deploy`
stores fits it, and the form resolves to the config the file and the form say. No server."""
from __future__ import annotations

import pytest
import yaml
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools import ValidationError, validate

from quipu.flows.config import ConfigError, load_config
from quipu.flows.curate import curate
from quipu.flows.curate_config import AS_IN_FILE, CurateConfig, from_form
from quipu.flows.deploy import DEFAULT_FILE, ROOT, resolve
from quipu.tasks.pipeline import STAGES


@pytest.fixture(scope="module")
def schema() -> dict:
    """What `prefect deploy` stores as the deployment's parameter_openapi_schema."""
    return parameter_schema(curate).model_dump_for_openapi()


def _collapsed(prop: dict) -> bool:
    """Drawn as tabs whose first, selected by a null value, shows nothing."""
    return prop.get("anyOf", [{}])[0] == {"type": "null", "title": AS_IN_FILE} and prop.get("default", 0) is None


def _keys(node) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keys(v)}
    return {k for v in node for k in _keys(v)} if isinstance(node, list) else set()


def test_form_is_short_and_every_block_is_reachable(schema):
    assert list(schema["properties"]) == ["config", "overwrite"]
    form = schema["properties"]["config"]["properties"]
    order = sorted(form, key=lambda k: form[k]["position"])     # the UI sorts by position
    assert order[:4] == ["input", "output", "dataset", "config_file"]
    shown = [k for k in form if not _collapsed(form[k])]
    assert len(shown) <= 10, shown          # was 189 fields, every block drawn open
    assert not [k for k in shown if form[k].get("type") == "boolean" and "enum" not in form[k]]   # no false "off"
    blocks = {"runner", "extract", "curated", *(s.name for s in STAGES)}
    assert {k for k in form if _collapsed(form[k])} == blocks
    for name in blocks:   # the "change" tab holds the block's every key, none pre-filled
        change = form[name]["anyOf"][1]
        assert set(change["properties"]) == set(CurateConfig.model_fields[name].annotation.model_fields), name
        assert not {"default", "$ref", "required"} & _keys(change), name
        assert form[name]["description"]


def test_deployed_parameters_fit_the_form_and_resolve_to_the_file(schema):
    resolved, _, _ = resolve(yaml.safe_load(DEFAULT_FILE.read_text()), ROOT, ["curate"], check=False)   # as shipped
    dep = next(d for d in resolved["deployments"] if d["name"] == "curate")
    validate(dep["parameters"], schema, raise_on_error=True)          # as the server does for each run
    cfg = from_form(dep["parameters"]["config"], ROOT)
    shipped = load_config(CurateConfig, ROOT / "configs/curate/default.yaml")   # the es/pt/en config, not the demo's
    assert cfg.langid == shipped.langid and cfg.heuristics == shipped.heuristics and cfg.input == ["data/raw"]
    # a block changed in the form goes on top of the file, key by key
    changed = from_form({**dep["parameters"]["config"], "dedup": {"threshold": 0.7}, "workers": 1}, ROOT)
    assert changed.dedup.threshold == 0.7 and changed.dedup.enabled == cfg.dedup.enabled and changed.workers == 1
    assert changed.langid == cfg.langid


def test_a_bad_value_fails_naming_the_key(schema):
    with pytest.raises(ValidationError, match="config.langid.min_score"):    # the server, at submit
        validate({"config": {"langid": {"min_score": "high"}}}, schema, raise_on_error=True)
    with pytest.raises(ValidationError, match="nope"):
        validate({"config": {"dedup": {"nope": 1}}}, schema, raise_on_error=True)
    # the run, before any work (the flow turns it into one ERROR line)
    with pytest.raises(ConfigError, match=r"langid\.min_score: .*expected a number >= 0 and <= 1"):
        from_form({"config_file": "configs/curate/demo.yaml", "langid": {"min_score": 7}}, ROOT)
    with pytest.raises(ConfigError, match="config_file: config file not found: .*nope.yaml"):
        from_form({"config_file": "nope.yaml"}, ROOT)
    # Prefect's own check of the parameter keeps a form a form; a CurateConfig passes as it is
    assert isinstance(curate.validate_parameters({"config": {"config_file": "x.yaml"}})["config"], dict)
    assert isinstance(curate.validate_parameters({"config": CurateConfig()})["config"], CurateConfig)
