"""The curate config: `CurateSettings` (inputs, output, dataset, parallelism) and one block per
stage of the pipeline definition. Apart from the flow (flows/curate.py) so that reading or showing
a config (`quipu config show curate`, the CLI's checks before a run) does not import Prefect."""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from quipu.catalog.names import check_name
from quipu.flows.runners import RunnerConfig
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
