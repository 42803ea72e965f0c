"""Checkpoints: model, optimizer, schedule state, RNG states and the data position in one file,
written atomically (temporary name + rename) every N steps; the last K are kept.

`RUN_DIR/checkpoints/step-0000100.pt`. Resuming loads the newest one and continues exactly: the
data stream is indexed by step (see trainer.data), so the step and the skip offset are the data
position.
"""
from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from catalog.files import atomic_path

NAME = re.compile(r"^step-(\d{7,})\.pt$")


class CheckpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    every: int = Field(100, gt=0, description="write a checkpoint every N steps (and at the end)")
    keep_last: int = Field(3, ge=1, description="checkpoints kept; older ones are deleted")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    cks = list_checkpoints(run_dir)
    return cks[-1] if cks else None


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(run_dir: str | Path, step: int, state: dict, keep_last: int) -> Path:
    """`state`: model, optimizer, trainer (schedule/spike/data position), config. Rank 0 only."""
    path = checkpoint_dir(run_dir) / f"step-{step:07d}.pt"
    with atomic_path(path) as tmp:
        torch.save(state | {"step": step, "rng": rng_state()}, tmp)
    for old in list_checkpoints(run_dir)[:-keep_last]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path) -> dict:
    # our own files, holding numpy/python RNG states as well as tensors
    return torch.load(path, map_location="cpu", weights_only=False)
