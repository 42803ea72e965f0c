"""The trainer's checkpoints: which format a run writes (one file, or sharded under torchrun), when a
sharded save is complete, and resuming from either format whatever wrote it: one process, DDP or
FSDP2 on any number of ranks, into one process, DDP or FSDP2 on any number of ranks (see
trainer.checkpoint for the formats themselves). The caller's own state (step, schedule, spike guard,
data position) travels as plain data in `trainer_state`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import torch

from quipu.trainer.build import Dist
from quipu.trainer.checkpoint import (ShardedSave, latest_checkpoint, load_checkpoint, load_one_file, load_sharded,
                                     read_trainer_state, remove_partial_saves, save_checkpoint, sharded_wanted)
from quipu.trainer.train_config import TrainConfig, TrainConfigError


class Checkpointer:
    def __init__(self, cfg: TrainConfig, run_dir: Path, world: Dist):
        self.cfg, self.run_dir, self.dist = cfg, run_dir, world
        self.fsdp = world.enabled and cfg.distributed.strategy == "fsdp"
        # sharded (DCP) checkpoints under torchrun, whatever the world size: they reshard to any other
        self.sharded = sharded_wanted(cfg.checkpoint, torchrun="WORLD_SIZE" in os.environ or world.enabled)
        self.pending: ShardedSave | None = None
        if world.main:
            remove_partial_saves(run_dir)    # a save killed halfway: its folder never became a checkpoint
        world.barrier()

    def latest(self) -> Path | None:
        return latest_checkpoint(self.run_dir)

    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict) -> Path | None:
        """Every rank calls it. The path written (None while an async sharded save is still writing)."""
        keep = self.cfg.checkpoint.keep_last
        if self.sharded:
            self.finish_pending()
            self.pending = ShardedSave(self.run_dir, step, keep).start(model, optimizer, trainer_state,
                                                                       asynchronous=self.cfg.checkpoint.async_save)
            return None if self.cfg.checkpoint.async_save else self.finish_pending()
        model_sd, optim_sd = self._full_state_dicts(model, optimizer)
        path = None
        if self.dist.main:
            path = save_checkpoint(self.run_dir, step, {"model": model_sd, "optimizer": optim_sd} | trainer_state, keep)
        self.dist.barrier()
        return path

    def finish_pending(self) -> Path | None:
        """Waits for a sharded save still being written (async) and puts it in place."""
        pending, self.pending = self.pending, None
        return pending.finish() if pending is not None else None

    def _full_state_dicts(self, model, optimizer) -> tuple[dict, dict]:
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
            return get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return model.state_dict(), optimizer.state_dict()

    def load(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             model_config_at: Callable[[int], dict]) -> dict:
        """Model and optimizer from a checkpoint of either format, saved by any number of ranks, after
        checking its model config against `model_config_at(its step)`. Returns the rest: step,
        `trainer` (the caller's state), `rng` (this rank's, or rank 0's for a rank the saver lacked)."""
        ck = read_trainer_state(path) if path.is_dir() else load_checkpoint(path)
        check_model_config(ck["model_config"], model_config_at(ck["step"]), path)
        if path.is_dir():
            load_sharded(path, model, optimizer)
        else:
            load_one_file(ck, model, optimizer, fsdp=self.fsdp)
        return ck


def check_model_config(saved: dict, wanted: dict, path: Path) -> None:
    """One line naming the model keys that differ between a checkpoint and this config."""
    if saved == wanted:
        return
    keys = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
    shown = ", ".join(f"model.{k} {saved.get(k)!r} (this config {wanted.get(k)!r})" for k in keys[:4])
    raise TrainConfigError("model", f"the model section {path.name} was trained with, to --resume it", shown)
