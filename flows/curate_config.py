"""The curate config: `CurateSettings` (inputs, output, dataset, parallelism) and one block per
stage of the pipeline definition. Apart from the flow (flows/curate.py) so that reading or showing
a config (`quipu config show curate`, the CLI's checks before a run) does not import Prefect."""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator, model_validator

from quipu.catalog.names import check_name
from quipu.flows.runners import RunnerConfig
from quipu.tasks import languages
from quipu.tasks.driver import StageRef
from quipu.tasks.extract import ExtractConfig
from quipu.tasks.output import OutputConfig
from quipu.tasks.pipeline import REMOVED_SCHEMA, STAGES, stage_ref
from quipu.tasks.stage import RunContext


class CurateSettings(BaseModel):
    """What a curate run is besides its stages: inputs, output, dataset name, parallelism."""
    model_config = ConfigDict(extra="forbid")
    input: list[str] = Field(default_factory=list, description="paths, globs or fsspec URLs (.warc[.gz], .jsonl[.gz|.zst], .parquet)")
    output: str = Field("runs/curate", description="run directory")
    dataset: str | None = Field(None, description="catalog name of the curated dataset (default: the output directory's name); also names the dedup index")
    workers: int = Field(2, ge=1, le=256, description="parallel shard tasks (threads)")
    artifact_prefix: str = Field("curate", pattern=r"^[a-z0-9-]+$", description="prefix of the Prefect artifact keys")
    runner: RunnerConfig = Field(default_factory=RunnerConfig, description="where shard tasks run: threads, or Dask (LocalCluster or a scheduler address)")
    fuse: bool = Field(True, description="run consecutive per-document stages in one pass per shard (false: one pass per stage, each writing its kept rows)")
    keep_intermediate: bool = Field(False, description="keep every stage's kept rows (<stage>/kept/) after the run; by default only curated/ holds the result")
    keep_work_files: bool = Field(False, description="keep the global stages' work files (signatures, counts, plans) after the run")
    extract: ExtractConfig = Field(default_factory=ExtractConfig)

    @field_validator("dataset")
    @classmethod
    def _safe_dataset(cls, v):
        return None if v is None else check_name(v, "dataset name")

    @field_validator("input", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v

    @field_validator("extract")
    @classmethod
    def _extract_on(cls, v: ExtractConfig):
        if not v.enabled:
            raise ValueError("the extract stage reads the inputs and cannot be switched off")
        return v

    @model_validator(mode="after")
    def _languages_in_table(self):
        """A kept language the heuristics stage has no lists for is refused before any work: its documents
        would otherwise all be removed (or, before the language table, judged with the English lists)."""
        langid, heuristics = getattr(self, "langid", None), getattr(self, "heuristics", None)
        if langid is not None and heuristics is not None and langid.enabled and heuristics.enabled:
            if unknown := languages.missing(langid.languages):
                raise ValueError(languages.missing_message("langid.languages", unknown, "heuristics"))
        return self

    def context(self, run_id: str | None = None) -> RunContext:
        """The run as its stages see it: the output folder, the dataset (naming the dedup index)."""
        return RunContext(run_dir=str(Path(self.output).resolve()), dataset=self.dataset, run_id=run_id,
                          removed_schema=REMOVED_SCHEMA)

    def stage_ref(self, name: str, run_id: str | None = None) -> StageRef:
        return stage_ref(name, getattr(self, name), self.context(run_id))


# One block per stage of the pipeline definition, named as the stage, then the curated output.
CurateConfig = create_model(
    "CurateConfig", __base__=CurateSettings, __doc__="One block per stage, named as the stage; every block has `enabled`.",
    **{s.name: (s.Config, Field(default_factory=s.Config)) for s in STAGES},
    curated=(OutputConfig, Field(default_factory=OutputConfig)))


def enabled_stages(config: CurateSettings) -> list[str]:
    return [s.name for s in STAGES if getattr(config, s.name).enabled]


# ---- the curate deployment's form ------------------------------------------------------------
# Prefect's UI draws a flow parameter's JSON schema as one form, every nested model inline (189
# fields for CurateConfig), and collapses nothing; an `anyOf` is drawn as tabs showing only the
# tab its value selects. So the deployment holds a short form: a config file (every block, read
# where the run executes) with the run's own fields on top, and each block as tabs "as in
# config_file" (null: collapsed) | "change" (the block's fields, empty: only those filled in go
# on top of the file). Runs from Python pass a CurateConfig; a form is resolved by `from_form`.

CONFIG_FILE = "config_file"
AS_IN_FILE = "as in config_file"
FORM_FIRST = ("input", "output", "dataset", CONFIG_FILE)   # the form's order: these, then the rest


def _inline(schema, defs: dict):
    """`schema` with every `$ref` replaced by its definition, `default` and `required` dropped: a
    field left empty is absent from the form's value, so the config file's value stays. A switch
    cannot be empty (it would show "off" for a value the file may have on): a boolean is drawn
    as a choice of true / false, empty until chosen."""
    if isinstance(schema, list):
        return [_inline(s, defs) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return _inline({**defs[schema["$ref"].split("/")[-1]], **rest}, defs)
    out = {k: _inline(v, defs) for k, v in schema.items()
           if k not in ("default", "required", "$defs") and not (k == "title" and isinstance(v, dict))}
    return {**out, "enum": [True, False]} if out.get("type") == "boolean" else out


def _about(block: str) -> str:
    """What a block is: the first sentence of its module's docstring."""
    import sys
    modules = {s.name: s.__module__ for s in STAGES} | {"extract": ExtractConfig.__module__, "curated": OutputConfig.__module__}
    doc = (sys.modules[modules[block]].__doc__ or block).strip().split("\n\n")[0].replace("\n", " ")
    return doc.split(". ")[0].rstrip(".") + "."


def form_schema() -> dict:
    """The JSON schema the curate deployment's form is drawn from (see above)."""
    full = CurateConfig.model_json_schema()
    defs = full.get("$defs", {})
    props: dict[str, dict] = {CONFIG_FILE: {
        "type": "string", "title": "config file",
        "description": "YAML with every setting (configs/curate/*.yaml), read in the run's working directory "
                       "(QUIPU_ROOT); the fields of this form go on top. Empty: the built-in defaults"}}
    for name, prop in full["properties"].items():
        if "$ref" in prop or prop.get("type") == "object":      # a block: collapsed unless changed
            block = _inline(prop, defs)
            block["title"] = "change"
            about = prop.get("description") or _about(name)
            block.pop("description", None)
            props[name] = {"title": name, "description": about,
                           "anyOf": [{"type": "null", "title": AS_IN_FILE}, block], "default": None}
        else:   # the run's own fields, empty unless set: a nullable one is drawn as its type
            field = _inline(prop, defs)
            kinds = [k for k in field.pop("anyOf", []) if k.get("type") != "null"]
            props[name] = {**(kinds[0] if len(kinds) == 1 else {}), **field}
    blocks = [n for n in props if "anyOf" in props[n]]
    order = [*FORM_FIRST, *(n for n in props if n not in FORM_FIRST and n not in blocks), *blocks]
    return {"type": "object", "title": "config", "additionalProperties": False,
            "description": "The run's inputs, output and dataset; every other setting comes from config_file, "
                           "and a block changed here goes on top of it",
            "properties": {n: {**props[n], "position": i} for i, n in enumerate(order)}}


def from_form(form: dict, root: str | Path | None = None) -> CurateConfig:
    """The config a form asks for: `config_file` (relative to `root`, default the working
    directory), then the form's values on top. Errors name the file or the key."""
    from pydantic import ValidationError

    from quipu.flows.config import ConfigError, deep_merge, format_validation_error, read_yaml
    values = {k: v for k, v in form.items() if k != CONFIG_FILE and v is not None}
    path = form.get(CONFIG_FILE)
    base = {}
    if path:
        full = Path(root or ".") / path
        try:
            base = read_yaml(full)
        except ConfigError as e:
            raise ConfigError(f"{CONFIG_FILE}: {e} (relative paths are read from {Path(root or '.').resolve()})") from None
    try:
        return CurateConfig.model_validate(deep_merge(base, values))
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, f"config (on {path})" if path else "config", CurateConfig)) from None
