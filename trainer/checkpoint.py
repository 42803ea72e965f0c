"""Checkpoints: model, optimizer, schedule state, RNG states and the data position in one file,
written atomically (temporary name + rename) every N steps; the last K are kept.

`RUN_DIR/checkpoints/step-0000100.pt`. Resuming loads the newest one and continues exactly: the
data stream is indexed by step (see trainer.data), so the step and the skip offset are the data
position.
"""
from __future__ import annotations

import pickle
import random
import re
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from quipu.catalog.errors import UserError
from quipu.catalog.files import atomic_path

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


class UnsafeCheckpoint(UserError):
    """A checkpoint file holding more than tensors and plain data: never unpickled."""


def rng_state() -> dict:
    """Every RNG state as tensors and plain numbers, so that checkpoints load with
    `torch.load(weights_only=True)` (python's and numpy's own state objects would need pickle)."""
    version, mt, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": {"version": version, "mt": torch.tensor(mt, dtype=torch.int64), "gauss": gauss},
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py, npy = state["python"], state["numpy"]
    random.setstate((py["version"], tuple(int(x) for x in py["mt"].tolist()), py["gauss"]))
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
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
    """Tensors and plain data only (`weights_only=True`): a run folder may be shared and writable by
    others, and unpickling a crafted file would run its code. Anything else is refused."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message is many lines of advice to load it anyway; keep only what it found
        lines = [ln.strip() for ln in str(e).splitlines() if "WeightsUnpickler error" in ln or "Unsupported" in ln]
        first = lines[0] if lines else type(e).__name__
        raise UnsafeCheckpoint(f"refusing to load {path}: it holds objects other than tensors and plain data "
                               f"({first[:160]}); it was not written by this version of quipu, or was tampered with") from None
