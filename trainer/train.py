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

This module is the loop; each part it drives is a module of its own, usable alone: the config
(train_config), ranks, model and optimizer (build), checkpoints (checkpointer, checkpoint), the
spike guard (spike), metrics and plots (metrics), held-out evaluation (evaluator) and sampling.
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from quipu.catalog.files import sha256_json, write_json_atomic
from quipu.trainer.build import Dist, autocast, autocast_dtype, init_model, make_optimizer, pick_device
from quipu.trainer.checkpoint import set_rng_state
from quipu.trainer.checkpointer import Checkpointer
from quipu.trainer.data import Batcher, BlendError, blend_report, build_phase, present_sources, resolve_phase_starts
from quipu.trainer.evaluator import Evaluator
from quipu.trainer.metrics import Metrics, last_eval_by_group
from quipu.trainer.llama import ModelConfig
from quipu.trainer.sampling import sample
from quipu.trainer.spike import SpikeGuard, TrainingDiverged
from quipu.trainer.tokenizer import TextTokenizer
from quipu.trainer.train_config import TrainConfig, TrainConfigError

# what callers imported from here before the split
from quipu.trainer.build import build_model, shard_fsdp  # noqa: F401,E402
from quipu.trainer.evaluator import heldout_documents  # noqa: F401,E402
from quipu.trainer.train_config import (DistributedConfig, EvalConfig, LoopConfig, OptimConfig,  # noqa: F401,E402
                                        ScheduleConfig, SpikeConfig)


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
            raise TrainConfigError("train.batch_size", f"a multiple of train.micro_batch ({cfg.train.micro_batch}) x "
                                   f"processes ({world})", cfg.train.batch_size)
        self.accum = per_rank // cfg.train.micro_batch
        self.raw_model, self.model, self.model_cfg = init_model(cfg, self.tokenizer.vocab_size, self.device, self.dist)
        self.optimizer = make_optimizer(self.raw_model, cfg.optim, self.device)
        self.step = 0
        self.lr_scale = 1.0
        self.skip_steps = 0            # data steps skipped after a rollback
        self.rollbacks = 0
        self.guard = SpikeGuard(cfg.spike)
        self.checkpointer = Checkpointer(cfg, self.run_dir, self.dist)
        ckpt = self.checkpointer.latest()
        if ckpt is not None and not resume:
            raise TrainConfigError("output", "a folder without checkpoints (or pass --resume to continue this run)",
                                   f"{self.run_dir}, which has {ckpt.name}")
        if resume and ckpt is not None:
            self._restore(ckpt)
        self.metrics = Metrics(self.run_dir, self.step if resume else None)
        self.evaluator = Evaluator(cfg, self.model, self.raw_model, self.tokenizer, self.sources, self.device, self.amp)
        self.train_model = torch.compile(self.model) if cfg.train.compile else self.model

    # -- state

    def _restore(self, path: Path) -> None:
        """Model, optimizer and trainer state from a checkpoint of either format, saved by any number of ranks."""
        ck = self.checkpointer.load(path, self.raw_model, self.optimizer, lambda s: self.model_cfg_at(s).model_dump(mode="json"))
        t = ck["trainer"]
        self.step, self.lr_scale, self.skip_steps = ck["step"], t["lr_scale"], t["skip_steps"]
        self.rollbacks = t.get("rollbacks", 0)
        self.guard.history = t["grad_norm_history"]
        set_rng_state(ck["rng"])

    def _trainer_state(self) -> dict:
        """Everything but model and optimizer: plain data, the same in both formats."""
        return {"model_config": self.model_cfg_at(self.step).model_dump(mode="json"),
                "trainer": {"lr_scale": self.lr_scale, "skip_steps": self.skip_steps, "rollbacks": self.rollbacks,
                            "grad_norm_history": self.guard.history,
                            "data_position": {"step": self.step, "skip_steps": self.skip_steps}},
                "config": self.cfg.model_dump(mode="json"), "config_hash": sha256_json(self.cfg.model_dump(mode="json"))}

    def save(self) -> Path | None:
        path = self.checkpointer.save(self.step, self.raw_model, self.optimizer, self._trainer_state())
        if self.dist.main:
            self.metrics.flush()
        return path

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
        return autocast(self.device, self.amp)

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

    def _rollback(self) -> bool:
        self.checkpointer.finish_pending()
        ckpt = self.checkpointer.latest()
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
                m |= self.evaluator.row()
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
        self.checkpointer.finish_pending()
        last_eval_step = max((r["step"] for r in self.metrics.rows if "eval_loss" in r), default=None)
        if last_eval_step != self.step and self.step > 0:
            row = self.evaluator.row()   # the summary always reports the held-out loss of the final weights
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
                   "checkpoint": str(self.checkpointer.latest() or "")}
        e = self.cfg.eval    # sampled on every rank: an FSDP forward needs all of them
        summary["sample"] = sample(self.raw_model, self.tokenizer, e.sample_prompt, e.sample_tokens, self.cfg.seed, self.device)
        if self.dist.main:
            png = self.metrics.plot(self.run_dir / "loss.png")
            summary["loss_curve"] = str(png) if png else None
            write_json_atomic(self.run_dir / "summary.json", summary)
        return summary


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
        if trainer.dist.owns_group:
            dist.destroy_process_group()
    return summary

