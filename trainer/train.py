"""The training loop: AdamW, warm-up + cosine/linear/WSD schedule to a floor (or per phase, re-warmed),
gradient clipping and accumulation, bf16 autocast where supported, optional torch.compile and
activation checkpointing, held-out loss and bits per byte per source and language, task files,
checkpoints with exact resume (one file, or sharded with DCP under torchrun, resharded on load), a
loss-spike guard, and DDP/FSDP2 through torchrun (gloo on CPU). Phases may change seq_len and the
RoPE base (stages of context); `model.init_from` a HF folder loads each rank's slices only.

    quipu train CONFIG [--resume]                                        # one process, as a Prefect flow
    torchrun --nproc_per_node 2 -m quipu.flows.train_dist CONFIG --output RUN_DIR  # data parallel (flows/train_dist.py)

The loss of a step is Σ token losses / number of target tokens in the whole global batch, whatever
the split into ranks and micro-batches, so one process and N processes train the same model.
Metrics go to RUN_DIR/metrics.jsonl (one JSON object per logged step) and RUN_DIR/loss.png.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict, Field, model_validator

from quipu.catalog.errors import UserError
from quipu.catalog.files import atomic_path, sha256_json, write_json_atomic
from quipu.trainer.checkpoint import (CheckpointConfig, ShardedSave, latest_checkpoint, load_checkpoint, load_one_file, load_sharded,
                                     read_trainer_state, remove_partial_saves, save_checkpoint, set_rng_state,
                                     sharded_wanted)
from quipu.trainer.bpb import TaskFile
from quipu.trainer.data import (Batcher, BlendError, DataConfig, blend_report, build_phase, eval_rows, present_sources,
                                resolve_phase_starts)
from quipu.trainer.model import Llama, ModelConfig, pad_vocab
from quipu.trainer.tokenizer import TextTokenizer, TokenizerConfig


# ---- config ------------------------------------------------------------------------------------

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


# ---- set-up ------------------------------------------------------------------------------------

class TrainingDiverged(UserError, RuntimeError):
    """Loss spikes persisted through every allowed rollback (a user error: the message names the
    settings that fix it; the CLI and a worker print it as one line)."""
    exit_code = 1


class Dist:
    """Rank/world from torchrun's environment; a no-op for one process."""

    def __init__(self, device: torch.device):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.enabled = self.world > 1
        if self.enabled and not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        return x

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def pick_device(cfg: LoopConfig) -> torch.device:
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def autocast_dtype(cfg: LoopConfig, device: torch.device) -> torch.dtype | None:
    if cfg.precision == "fp32":
        return None
    if cfg.precision == "bf16":
        return torch.bfloat16
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def build_model(cfg: TrainConfig, vocab_size: int) -> tuple[Llama, ModelConfig]:
    mcfg = cfg.model
    if mcfg.init_from:
        from quipu.trainer.export import load_pretrained
        mcfg, state = load_pretrained(mcfg.init_from, mcfg)
        if mcfg.vocab_size < vocab_size:
            raise BlendError(f"model.init_from: its vocabulary ({mcfg.vocab_size}) is smaller than the tokenizer's ({vocab_size}); "
                             "use the model's own tokenizer (tokenizer.kind=smollm2 or file)")
        torch.manual_seed(cfg.seed)
        model = Llama(mcfg)
        model.load_state_dict(state, strict=True)
        return model, mcfg
    if mcfg.vocab_size and mcfg.vocab_size < vocab_size:
        raise BlendError(f"model.vocab_size ({mcfg.vocab_size}) is smaller than the tokenizer's vocabulary ({vocab_size})")
    mcfg = mcfg.model_copy(update={"vocab_size": mcfg.vocab_size or pad_vocab(vocab_size)})
    torch.manual_seed(cfg.seed)
    return Llama(mcfg), mcfg


def init_model(cfg: TrainConfig, vocab_size: int, device: torch.device, world: Dist) -> tuple[Llama, torch.nn.Module, ModelConfig]:
    """(the model, what the loop calls: the model itself, FSDP2-sharded in place, or its DDP wrapper,
    the model's config).

    `model.init_from` a HF folder with safetensors: the model is built on the meta device (no
    memory), sharded, materialised empty and filled with each rank's own slices from the files, so
    continued pre-training works for models bigger than one rank's memory. Other models are built
    whole (same seed on every rank) and sharded after."""
    from quipu.trainer.export import load_slices, pretrained_config, safetensors_files
    fsdp = world.enabled and cfg.distributed.strategy == "fsdp"
    folder = cfg.model.init_from if cfg.model.init_from and cfg.model.init_from != "smollm2" else None
    if folder and Path(folder).is_dir() and safetensors_files(folder):
        mcfg = pretrained_config(folder, cfg.model)
        if mcfg.vocab_size < vocab_size:
            raise BlendError(f"model.init_from: its vocabulary ({mcfg.vocab_size}) is smaller than the tokenizer's ({vocab_size}); "
                             "use the model's own tokenizer (tokenizer.kind=smollm2 or file)")
        with torch.device("meta"):
            model = Llama(mcfg)
        if fsdp:
            shard_fsdp(model)
        model.to_empty(device=device)
        if mcfg.tie_embeddings and not fsdp:
            model.lm_head.weight = model.embed_tokens.weight    # to_empty gives every parameter its own storage
        load_slices(model, folder)
        model.rotary.reset(device)
    else:
        model, mcfg = build_model(cfg, vocab_size)
        model.to(device)
        if fsdp:
            shard_fsdp(model)
    model.activation_checkpointing = cfg.train.activation_checkpointing
    if world.enabled and not fsdp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        return model, DDP(model, device_ids=[device.index] if device.type == "cuda" else None), mcfg
    return model, model, mcfg


def shard_fsdp(model: Llama) -> None:
    """FSDP2: each block is its own unit (gathered for its forward, freed after), the rest the root."""
    from torch.distributed.fsdp import fully_shard
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)


def make_optimizer(model: torch.nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    # no weight decay on norms (1-D); the tied embedding is decayed once (parameters() de-duplicates)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=True)


class SpikeGuard:
    """Skips steps whose gradient norm is NaN/Inf or > factor x the running median of accepted steps."""

    def __init__(self, cfg: SpikeConfig, history: list[float] | None = None):
        self.cfg = cfg
        self.history = list(history or [])
        self.consecutive = 0

    def check(self, grad_norm: float) -> str | None:
        """None to take the step, else the reason to skip it."""
        if not self.cfg.enabled:
            return None
        reason = None
        if not math.isfinite(grad_norm):
            reason = "non-finite grad norm"
        elif len(self.history) >= self.cfg.min_history:
            med = statistics.median(self.history)
            if grad_norm > self.cfg.factor * med:
                reason = f"grad norm {grad_norm:.3g} > {self.cfg.factor:g} x median {med:.3g}"
        if reason is None:
            self.history = (self.history + [grad_norm])[-self.cfg.window:]
            self.consecutive = 0
        else:
            self.consecutive += 1
        return reason

    @property
    def needs_rollback(self) -> bool:
        return self.consecutive >= self.cfg.max_consecutive


# ---- metrics -----------------------------------------------------------------------------------

class Metrics:
    """metrics.jsonl, rewritten atomically at each flush (a resume truncates it to the checkpoint)."""

    def __init__(self, run_dir: Path, keep_until_step: int | None):
        self.path = run_dir / "metrics.jsonl"
        self.rows: list[dict] = []
        if keep_until_step is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    r = json.loads(line)
                    if r.get("step", 0) <= keep_until_step:
                        self.rows.append(r)

    def add(self, row: dict) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in self.rows))

    def plot(self, path: Path) -> Path | None:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        tr = [(r["step"], r["loss"]) for r in self.rows if r.get("loss") is not None]
        ev = [(r["step"], r["eval_loss"]) for r in self.rows if r.get("eval_loss") is not None]
        groups = [r for r in self.rows if "eval_by_source" in r]
        fig, axes = plt.subplots(1, 2 if groups else 1, figsize=(12 if groups else 7, 4), squeeze=False)
        ax = axes[0][0]
        if tr:
            ax.plot(*zip(*tr), label="train loss", lw=1)
        if ev:
            ax.plot(*zip(*ev), "o-", label="held-out loss", ms=3)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend()
        if groups:   # held-out bits per byte per source (solid) and per language (dashed)
            bx = axes[0][1]
            for key, style in (("eval_by_source", "o-"), ("eval_by_lang", "s--")):
                for name in sorted({k for r in groups for k in r[key]}):
                    pts = [(r["step"], r[key][name]["bpb"]) for r in groups if name in r[key]]
                    bx.plot(*zip(*pts), style, ms=3, label=("" if key == "eval_by_source" else "lang ") + name)
            bx.set_xlabel("step")
            bx.set_ylabel("held-out bits per byte")
            bx.grid(alpha=0.3)
            bx.legend(fontsize=8)
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)
        return path


# ---- the trainer -------------------------------------------------------------------------------

def heldout_documents(sources: list, tokenizer: TextTokenizer) -> list:
    """Every source's held-out documents as text (decoded from their tokens), with source and language."""
    from quipu.trainer.bpb import HeldoutDoc
    docs = []
    for s in sources:
        langs = s.eval_lang or ["und"] * len(s.eval_docs)
        for i, lang in zip(s.eval_docs, langs):
            docs.append(HeldoutDoc(s.name, lang, f"{s.name}:{int(i)}", tokenizer.decode(s.train.doc(int(i)).tolist())))
    return docs


def load_sources(cfg: TrainConfig, prepared: dict) -> list:
    from quipu.trainer.prepare import load_sources as load
    return load(cfg.data, prepared, cfg.seed)


def plan_data(cfg: TrainConfig, sources: list) -> tuple[list, Batcher]:
    """Phase boundaries and streams; every blend error is raised here, before any training."""
    max_steps = cfg.train.max_steps
    starts = resolve_phase_starts(cfg.data, max_steps, lambda s: cfg.schedule.fraction(s, max_steps))
    ends = starts[1:] + [max_steps]
    by_name = {s.name: s for s in sources}
    phases = []
    for i, (configured, a, b) in enumerate(zip(cfg.data.phases, starts, ends)):
        spec, absent = present_sources(configured, set(by_name), f"data.phases[{i}] ({configured.name!r})")
        seq_len = spec.seq_len or cfg.data.seq_len
        tokens_per_step = cfg.train.batch_size * seq_len
        srcs = [by_name[s.key] for s in spec.sources]
        if spec.order == "ppl_wayra":
            for s in srcs:
                if np.isnan(s.train.doc_ppl[s.train_docs]).any():
                    raise BlendError(f"data.phases[{i}] ({spec.name!r}): order=ppl_wayra but source {s.name!r} has documents "
                                     "without ppl_wayra (curate with the perplexity stage)")
        for s in srcs:
            if s.train_tokens == 0:
                raise BlendError(f"data.phases[{i}]: source {s.name!r} has no training tokens")
        phase = build_phase(spec.name, spec, srcs, a, b, tokens_per_step, seq_len, cfg.seed, i)
        weights = {s.key: s.weight for s in configured.sources}
        phase.report = [r | {"configured_weight": weights[r["source"]]} for r in phase.report] + absent
        phases.append(phase)
    return phases, Batcher(phases, sources, cfg.data.seq_len, cfg.train.batch_size)


class Trainer:
    def __init__(self, cfg: TrainConfig, run_dir: str | Path, resume: bool = False,
                 on_log: Callable[[dict], None] | None = None):
        from quipu.trainer.prepare import load_prepared
        self.cfg = cfg
        self.run_dir = Path(run_dir).resolve()
        self.on_log = on_log
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        self.device = pick_device(cfg.train)
        self.dist = Dist(self.device)
        self.amp = autocast_dtype(cfg.train, self.device)
        prepared = load_prepared(self.run_dir)
        self.tokenizer = TextTokenizer.load(prepared["tokenizer"])
        self.sources = load_sources(cfg, prepared)
        self.phases, self.batcher = plan_data(cfg, self.sources)
        world = self.dist.world
        per_rank = cfg.train.batch_size // world if cfg.train.batch_size % world == 0 else None
        if per_rank is None or per_rank % cfg.train.micro_batch:
            raise BlendError(f"train.batch_size ({cfg.train.batch_size}) must be a multiple of "
                             f"train.micro_batch ({cfg.train.micro_batch}) x processes ({world})")
        self.accum = per_rank // cfg.train.micro_batch
        self.raw_model, self.model, self.model_cfg = init_model(cfg, self.tokenizer.vocab_size, self.device, self.dist)
        self.optimizer = make_optimizer(self.raw_model, cfg.optim, self.device)
        self.step = 0
        self.lr_scale = 1.0
        self.skip_steps = 0            # data steps skipped after a rollback
        self.rollbacks = 0
        self.guard = SpikeGuard(cfg.spike)
        # sharded (DCP) checkpoints under torchrun, whatever the world size: they reshard to any other
        self.sharded = sharded_wanted(cfg.checkpoint, torchrun="WORLD_SIZE" in os.environ)
        self.pending_save: ShardedSave | None = None
        if self.dist.main:
            remove_partial_saves(self.run_dir)    # a save killed halfway: its folder never became a checkpoint
        self.dist.barrier()
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is not None and not resume:
            raise BlendError(f"{self.run_dir} already has checkpoints ({ckpt.name}): pass --resume to continue, "
                             "or choose another --output")
        if resume and ckpt is not None:
            self._restore(ckpt)
        self.metrics = Metrics(self.run_dir, self.step if resume else None)
        ev = eval_rows(self.sources, cfg.data.seq_len, cfg.eval.rows)
        self.eval_batch = tuple(torch.from_numpy(a) for a in ev)
        self.heldout = heldout_documents(self.sources, self.tokenizer) if cfg.eval.per_source else []
        from quipu.trainer.bpb import load_task_items
        try:
            self.tasks = {t.label(): load_task_items(t) for t in cfg.eval.tasks}
        except (ValueError, FileNotFoundError) as e:
            raise BlendError(str(e)) from None
        self.train_model = torch.compile(self.model) if cfg.train.compile else self.model

    # -- state

    def _state_dicts(self) -> tuple[dict, dict]:
        if self.dist.enabled and self.cfg.distributed.strategy == "fsdp":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
            return get_state_dict(self.raw_model, self.optimizer,
                                  options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return self.raw_model.state_dict(), self.optimizer.state_dict()

    def _restore(self, path: Path) -> None:
        """Model, optimizer and trainer state from a checkpoint of either format, saved by any number of ranks."""
        if path.is_dir():
            ck = read_trainer_state(path)
            self._check_model_config(ck)
            load_sharded(path, self.raw_model, self.optimizer)
        else:
            ck = load_checkpoint(path)
            self._check_model_config(ck)
            load_one_file(ck, self.raw_model, self.optimizer, fsdp=self.dist.enabled and self.cfg.distributed.strategy == "fsdp")
        t = ck["trainer"]
        self.step, self.lr_scale, self.skip_steps = ck["step"], t["lr_scale"], t["skip_steps"]
        self.rollbacks = t.get("rollbacks", 0)
        self.guard.history = t["grad_norm_history"]
        set_rng_state(ck["rng"])

    def _check_model_config(self, ck: dict) -> None:
        if ck["model_config"] != self.model_cfg_at(ck["step"]).model_dump(mode="json"):
            raise BlendError("--resume: the checkpoint's model config differs from this config's model section")

    def _trainer_state(self) -> dict:
        """Everything but model and optimizer: plain data, the same in both formats."""
        return {"model_config": self.model_cfg_at(self.step).model_dump(mode="json"),
                "trainer": {"lr_scale": self.lr_scale, "skip_steps": self.skip_steps, "rollbacks": self.rollbacks,
                            "grad_norm_history": self.guard.history,
                            "data_position": {"step": self.step, "skip_steps": self.skip_steps}},
                "config": self.cfg.model_dump(mode="json"), "config_hash": sha256_json(self.cfg.model_dump(mode="json"))}

    def save(self) -> Path | None:
        if self.sharded:
            self.finish_pending_save()
            pending = ShardedSave(self.run_dir, self.step, self.cfg.checkpoint.keep_last)
            self.pending_save = pending.start(self.raw_model, self.optimizer, self._trainer_state(),
                                              asynchronous=self.cfg.checkpoint.async_save)
            path = None if self.cfg.checkpoint.async_save else self.finish_pending_save()
            if self.dist.main:
                self.metrics.flush()
            return path
        model_sd, optim_sd = self._state_dicts()
        path = None
        if self.dist.main:
            path = save_checkpoint(self.run_dir, self.step, {"model": model_sd, "optimizer": optim_sd} | self._trainer_state(),
                                   self.cfg.checkpoint.keep_last)
            self.metrics.flush()
        self.dist.barrier()
        return path

    def finish_pending_save(self) -> Path | None:
        """Waits for a sharded save still being written (async) and puts it in place."""
        pending, self.pending_save = self.pending_save, None
        return pending.finish() if pending is not None else None

    # -- steps

    def lr_at(self, step: int) -> float:
        """The run's schedule, or inside a `lr_schedule: rewarm` phase the phase's own (warm-up to
        its peak, decay to its end)."""
        i = self.phase_index(step)
        spec, p = self.cfg.data.phases[i], self.phases[i]
        if spec.lr_schedule == "rewarm":
            sched = self.cfg.schedule
            if spec.warmup_steps is not None:
                sched = sched.model_copy(update={"warmup_steps": spec.warmup_steps})
            frac = sched.fraction(step - p.start_step, p.end_step - p.start_step)
            return (spec.lr or self.cfg.optim.lr) * frac * self.lr_scale
        return self.cfg.optim.lr * self.cfg.schedule.fraction(step, self.cfg.train.max_steps) * self.lr_scale

    def phase_index(self, step: int) -> int:
        """The phase `step` trains in (by schedule step: a rollback's data skip does not move phases)."""
        return max(i for i, p in enumerate(self.phases) if step >= p.start_step or i == 0)

    def model_cfg_at(self, step: int) -> ModelConfig:
        """The model config as of `step`: a phase's rope_theta replaces the model's (what a checkpoint records)."""
        theta = self.cfg.data.phases[self.phase_index(max(0, step - 1))].rope_theta if step > 0 else None
        theta = theta or self.model_cfg.rope_theta
        return self.model_cfg if theta == self.model_cfg.rope_theta else self.model_cfg.model_copy(update={"rope_theta": theta})

    def _set_rope(self, step: int) -> None:
        """The phase's RoPE base on the rotary tables (recomputed only when it changes)."""
        spec = self.cfg.data.phases[self.phase_index(step)]
        theta = spec.rope_theta or self.model_cfg.rope_theta
        if self.raw_model.rotary.theta != theta:
            self.raw_model.rotary.theta = theta
            self.raw_model.rotary.reset(self.device)

    def _autocast(self):
        if self.amp is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp)

    def _micro_batches(self, step: int) -> list[tuple[torch.Tensor, ...]]:
        mb, world, rank = self.cfg.train.micro_batch, self.dist.world, self.dist.rank
        out = []
        data_step = step + self.skip_steps
        for a in range(self.accum):
            first = (a * world + rank) * mb
            arrays = self.batcher.rows(data_step, range(first, first + mb))
            out.append(tuple(torch.from_numpy(x).to(self.device) for x in arrays))
        return out

    def _no_sync(self, last: bool):
        if last or not self.dist.enabled:
            return contextlib.nullcontext()
        if self.cfg.distributed.strategy == "fsdp":
            self.model.set_requires_gradient_sync(False)
            return contextlib.nullcontext()
        return self.model.no_sync()

    def train_step(self) -> dict:
        step = self.step
        self._set_rope(step)
        lr = self.lr_at(step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        batches = self._micro_batches(step)
        n_local = sum(int((b[1] != -100).sum()) for b in batches)
        n_global = int(self.dist.sum(torch.tensor([n_local], dtype=torch.int64)).item())
        loss_total = torch.zeros((), dtype=torch.float64)
        for i, (x, y, pos, seg) in enumerate(batches):
            last = i == len(batches) - 1
            if self.dist.enabled and self.cfg.distributed.strategy == "fsdp" and last:
                self.model.set_requires_gradient_sync(True)
            with self._no_sync(last), self._autocast():
                loss_sum, _ = self._loss_sum(x, y, pos, seg)
                # DDP/FSDP average gradients over ranks; x world turns that into the global sum
                (loss_sum * (self.dist.world / max(1, n_global))).backward()
            loss_total += loss_sum.detach().double().cpu()
        loss = float(self.dist.sum(loss_total.reshape(1)).item()) / max(1, n_global)
        clip = self.cfg.optim.grad_clip if self.cfg.optim.grad_clip > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), clip))
        if step > 0 and any(p.start_step == step for p in self.phases):
            self.guard.history = []     # new data (a phase, a continual version): measure against it, not the old
        skip = self.guard.check(grad_norm)
        if skip is None:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return {"step": self.step, "loss": loss, "lr": lr, "grad_norm": grad_norm, "skipped": skip}

    def _loss_sum(self, x, y, pos, seg):
        return self.train_model(x, pos, seg, targets=y)

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        x, y, pos, seg = (t.to(self.device) for t in self.eval_batch)
        total, count = 0.0, 0
        mb = self.cfg.train.micro_batch
        for i in range(0, len(x), mb):
            with self._autocast():
                s, n = self.raw_model.loss_sum(x[i:i + mb], y[i:i + mb], pos[i:i + mb], seg[i:i + mb])
            total += float(s)
            count += int(n)
        self.model.train()
        return total / max(1, count)

    @torch.no_grad()
    def evaluate_sources(self) -> dict:
        """Held-out bits per byte and loss per source and per language (every rank scores the same
        documents: an FSDP forward needs them all)."""
        from quipu.trainer.bpb import group_losses, score_model
        self.raw_model.eval()
        with self._autocast():
            scores = score_model(self.raw_model, self.tokenizer, self.heldout, self.cfg.data.seq_len,
                                 batch=self.cfg.train.micro_batch)
        self.raw_model.train()
        return group_losses(scores)

    def _eval_row(self) -> dict:
        eval_loss = self.evaluate()
        row = {"eval_loss": eval_loss, "eval_ppl": math.exp(min(eval_loss, 50))}
        if self.heldout:
            g = self.evaluate_sources()
            row |= {"eval_bpb": g["all"]["bpb"], "eval_by_source": g["by_source"], "eval_by_lang": g["by_lang"]}
        if self.tasks:
            row["eval_tasks"] = self.evaluate_tasks()
        return row

    @torch.no_grad()
    def evaluate_tasks(self) -> dict:
        from quipu.trainer.bpb import score_task
        self.raw_model.eval()
        with self._autocast():
            out = {name: score_task(items, self.tokenizer, lambda x: self.raw_model(x.to(self.device)),
                                    self.cfg.data.seq_len) for name, items in self.tasks.items()}
        self.raw_model.train()
        return out

    def sample(self) -> str:
        if self.cfg.eval.sample_tokens == 0:
            return ""
        ids = torch.tensor([self.tokenizer.encode(self.cfg.eval.sample_prompt)], device=self.device)
        self.raw_model.eval()
        g = torch.Generator(device=self.device).manual_seed(self.cfg.seed)
        out = self.raw_model.generate(ids, self.cfg.eval.sample_tokens, temperature=0.8, top_k=40,
                                      eos_id=self.tokenizer.eos_id, generator=g)
        self.raw_model.train()
        return self.tokenizer.decode(out[0].tolist())

    def _rollback(self) -> bool:
        self.finish_pending_save()
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            return False
        if self.rollbacks >= self.cfg.spike.max_rollbacks:
            raise TrainingDiverged(f"step {self.step}: loss spikes persist after {self.rollbacks} rollback(s) "
                                   f"(spike.max_rollbacks); last checkpoint {ckpt}; fix: lower optim.lr, raise "
                                   "spike.factor or spike.max_rollbacks, or set spike.enabled: false, then rerun "
                                   "(it resumes from that checkpoint)")
        rollbacks = self.rollbacks + 1
        skipped_to = self.step
        lr_scale = self.lr_scale * self.cfg.spike.rollback_lr_factor
        self._restore(ckpt)
        self.rollbacks = rollbacks
        # lower LR, and do not replay the data that led to the spikes
        self.lr_scale = lr_scale
        self.skip_steps += skipped_to - self.step
        self.guard.consecutive = 0
        self.metrics.add({"step": self.step, "event": "rollback", "from_step": skipped_to, "lr_scale": lr_scale})
        return True

    def run(self) -> dict:
        cfg = self.cfg
        max_steps = cfg.train.max_steps
        stop = min(max_steps, cfg.train.stop_at_step or max_steps)
        if self.dist.main:
            write_json_atomic(self.run_dir / "blend.json", blend_report(self.phases))
        self.model.train()
        t_last, steps_since = time.perf_counter(), 0
        eval_loss = None
        deadline = time.monotonic() + 60 * cfg.train.max_minutes if cfg.train.max_minutes else None
        while self.step < stop:
            m = self.train_step()
            steps_since += 1
            if m["skipped"] and self.guard.needs_rollback:
                if self.dist.main:
                    print(f"step {m['step']}: {self.guard.consecutive} spikes in a row; rolling back", file=sys.stderr)
                row = m | {"tokens": self.batcher.tokens_until(self.step)}
                if self._rollback():
                    self.metrics.rows.insert(-1, row)   # the skipped step, before the rollback event
                    continue
            time_up = deadline is not None and self._time_is_up(deadline)
            m["tokens"] = self.batcher.tokens_until(self.step)
            m["phase"] = self.batcher.phase_at(self.step - 1 + self.skip_steps).name
            if self.step % cfg.eval.every == 0 or self.step == max_steps:
                m |= self._eval_row()
                eval_loss = m["eval_loss"]
            if self.step % cfg.train.log_every == 0 or "eval_loss" in m or m["skipped"] or self.step == stop or time_up:
                now = time.perf_counter()
                tokens_per_step = cfg.train.batch_size * self.phases[self.phase_index(self.step - 1)].seq_len
                m["tokens_per_s"] = round(steps_since * tokens_per_step / max(1e-9, now - t_last), 1)
                t_last, steps_since = now, 0
                if m["skipped"] is None:
                    del m["skipped"]
                self.metrics.add(m)
                if self.dist.main:
                    self.metrics.flush()
                    if self.on_log:
                        self.on_log(m)
            if self.step % cfg.checkpoint.every == 0 or self.step == stop or time_up:
                self.save()
            if time_up:
                break
        self.finish_pending_save()
        last_eval_step = max((r["step"] for r in self.metrics.rows if "eval_loss" in r), default=None)
        if last_eval_step != self.step and self.step > 0:
            row = self._eval_row()   # the summary always reports the held-out loss of the final weights
            eval_loss = row["eval_loss"]
            if self.metrics.rows and self.metrics.rows[-1].get("step") == self.step and "loss" in self.metrics.rows[-1]:
                self.metrics.rows[-1].update(row)
                if self.dist.main:
                    self.metrics.flush()
        summary = self.finish(eval_loss, self.step < max_steps)
        return summary

    def _time_is_up(self, deadline: float) -> bool:
        up = torch.tensor([int(time.monotonic() > deadline)])
        return bool(self.dist.sum(up).item())      # all ranks stop at the same step

    def finish(self, eval_loss: float | None, interrupted: bool) -> dict:
        losses = [r["loss"] for r in self.metrics.rows if "loss" in r]
        summary = {"run_dir": str(self.run_dir), "step": self.step, "max_steps": self.cfg.train.max_steps,
                   "stopped_early": interrupted, "final_loss": losses[-1] if losses else None,
                   "eval_loss": eval_loss, "eval_ppl": math.exp(min(eval_loss, 50)) if eval_loss is not None else None,
                   **last_eval_by_group(self.metrics.rows),
                   "params": self.raw_model.num_params(), "model": self.model_cfg.model_dump(mode="json"),
                   "metrics": str(self.metrics.path), "world_size": self.dist.world,
                   "checkpoint": str(latest_checkpoint(self.run_dir) or "")}
        summary["sample"] = self.sample()   # on every rank: an FSDP forward needs all of them
        if self.dist.main:
            png = self.metrics.plot(self.run_dir / "loss.png")
            summary["loss_curve"] = str(png) if png else None
            write_json_atomic(self.run_dir / "summary.json", summary)
        return summary


def last_eval_by_group(rows: list[dict]) -> dict:
    for r in reversed(rows):
        if "eval_bpb" in r:
            return {k: r[k] for k in ("eval_bpb", "eval_by_source", "eval_by_lang", "eval_tasks") if k in r}
    return {}


def train(cfg: TrainConfig, run_dir: str | Path, resume: bool = False, on_log=None) -> dict:
    trainer = Trainer(cfg, run_dir, resume=resume, on_log=on_log)
    # On an exception the group is left alone: torchrun stops every rank, and tearing it down here
    # could hang on a peer that is still inside a collective.
    summary = trainer.run()
    if trainer.dist.enabled and dist.is_initialized():
        # Every rank leaves together. Gloo's barrier also waits out collectives still queued on its
        # worker threads (FSDP2 prefetches all-gathers); destroying the group under one of them, or
        # while a peer is still writing the summary, aborted rank 1 about once in a hundred runs.
        trainer.dist.barrier()
        dist.destroy_process_group()
    return summary
