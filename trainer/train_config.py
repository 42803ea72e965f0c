"""The training config (`quipu train CONFIG`): optimizer, schedule, loop, evaluation, spike guard,
distribution, plus the data, model, tokenizer and checkpoint sections of their own modules. Checked
whole before any work; what can only be checked against the data or the number of processes raises
`TrainConfigError` naming the key and what it expected.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quipu.trainer.bpb import TaskFile
from quipu.trainer.checkpoint import CheckpointConfig
from quipu.trainer.data import BlendError, DataConfig
from quipu.trainer.llama import ModelConfig
from quipu.trainer.tokenizer import TokenizerConfig


class TrainConfigError(BlendError):
    """A training config that cannot run as set: `key: expected ..., got ...` on one line (the CLI
    and a worker print it without a traceback). A BlendError, which the trainer raised for these
    before, so that callers catching that still catch it."""

    def __init__(self, key: str, expected: str, got: object = None):
        self.key, self.expected, self.got = key, expected, got
        super().__init__(f"{key}: expected {expected}" + ("" if got is None else f", got {got}"))


class OptimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(3e-4, gt=0, description="peak learning rate")
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, ge=0, description="0: no clipping")


class ScheduleConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Literal["cosine", "linear", "wsd", "constant"] = "cosine"
    warmup_steps: int = Field(100, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="the floor, as a fraction of the peak")
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: the last fraction of steps that decays")

    def fraction(self, step: int, max_steps: int) -> float:
        """LR at `step` as a fraction of the peak."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        floor = self.min_lr_ratio
        span = max(1, max_steps - self.warmup_steps)
        t = min(1.0, (step - self.warmup_steps) / span)
        if self.kind == "constant":
            return 1.0
        if self.kind == "cosine":
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t))
        if self.kind == "linear":
            return floor + (1 - floor) * (1 - t)
        decay_start = max_steps - int(round(self.decay_fraction * max_steps))
        if step < decay_start:
            return 1.0
        return floor + (1 - floor) * (1 - (step - decay_start) / max(1, max_steps - decay_start))


class LoopConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_steps: int = Field(1000, gt=0)
    batch_size: int = Field(8, gt=0, description="global batch, in rows of seq_len tokens")
    micro_batch: int = Field(8, gt=0, description="rows per forward/backward on one rank (gradient accumulation makes up the rest)")
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="auto: bf16 autocast on a GPU that supports it, else fp32")
    compile: bool = False
    activation_checkpointing: bool = Field(False, description="recompute each block's activations in the backward "
                                                              "instead of keeping them: less memory, about a third more compute")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, gt=0, description="torch CPU threads (default: torch's)")
    log_every: int = Field(1, gt=0)
    stop_at_step: int | None = Field(None, gt=0, description="stop (checkpointed) after this step as if interrupted; --resume continues")
    max_minutes: float | None = Field(None, gt=0, description="stop (checkpointed) after this much training time; --resume continues")


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    every: int = Field(100, gt=0, description="held-out loss and perplexity every N steps (and at the end)")
    rows: int = Field(16, gt=0, description="held-out rows of seq_len tokens")
    per_source: bool = Field(True, description="also score every source's held-out documents: bits per byte and loss "
                                               "per source and per language (data.eval_docs_per_source documents each)")
    tasks: list[TaskFile] = Field(default_factory=list, description="task files scored by log-likelihood at every eval: "
                                                                    "accuracy and answer bits per byte, per language")
    sample_prompt: str = "The"
    sample_tokens: int = Field(40, ge=0)


class SpikeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    enabled: bool = True
    factor: float = Field(6.0, gt=1, description="skip a step whose grad norm > factor x running median")
    window: int = Field(50, gt=1)
    min_history: int = Field(10, ge=1, description="steps of history before the guard acts")
    max_consecutive: int = Field(3, ge=1, description="this many skipped steps in a row roll back to the last checkpoint")
    rollback_lr_factor: float = Field(0.5, gt=0, lt=1)
    max_rollbacks: int = Field(5, ge=0, description="more rollbacks than this stop training with an error")


class DistributedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    strategy: Literal["ddp", "fsdp"] = "ddp"


class TrainConfig(BaseModel):
    """One config for tokenize + train (`quipu train`)."""
    model_config = ConfigDict(extra="forbid")
    output: str = "runs/train"
    seed: int = 1234
    tokenizer: TokenizerConfig = TokenizerConfig()
    data: DataConfig
    model: ModelConfig = ModelConfig()
    optim: OptimConfig = OptimConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    train: LoopConfig = LoopConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    spike: SpikeConfig = SpikeConfig()
    distributed: DistributedConfig = DistributedConfig()
    export_hf: bool = Field(False, description="also write RUN_DIR/hf (a transformers folder) at the end")

    @model_validator(mode="after")
    def _batch(self):
        t = self.train
        if t.batch_size % t.micro_batch:
            raise ValueError(f"train.batch_size ({t.batch_size}) must be a multiple of train.micro_batch ({t.micro_batch})")
        if self.schedule.warmup_steps >= t.max_steps and self.schedule.kind != "constant":
            raise ValueError(f"schedule.warmup_steps ({self.schedule.warmup_steps}) must be below train.max_steps ({t.max_steps})")
        if self.data.seq_len > self.model.max_seq_len:
            raise ValueError(f"data.seq_len ({self.data.seq_len}) exceeds model.max_seq_len ({self.model.max_seq_len})")
        for i, p in enumerate(self.data.phases):
            if p.seq_len and p.seq_len > self.model.max_seq_len and not self.model.init_from:
                raise ValueError(f"data.phases[{i}].seq_len ({p.seq_len}) exceeds model.max_seq_len ({self.model.max_seq_len})")
        return self

