"""Checkpoints: model, optimizer, schedule state, RNG states and the data position, written
atomically every N steps; the last K are kept. Two formats:

- one file, `RUN_DIR/checkpoints/step-0000100.pt` (one process: written by rank 0 from full state
  dicts);
- sharded, `RUN_DIR/checkpoints/step-0000100/` (torchrun): `torch.distributed.checkpoint` (DCP),
  every rank writing its own shards of model and optimizer state (`state/`), plus `trainer.pt`
  (schedule, spike guard, data position, config) and `rng-RANK.pt`. It is written under a
  temporary name and renamed by rank 0 once every rank has finished, so a save killed halfway
  leaves the previous checkpoint the newest; the half-written folder is removed on the next start.
  DCP reshards on load: a checkpoint saved by N ranks resumes on M (one process included), since
  it is addressed by parameter name and global offsets, not by rank. A one-file checkpoint resumes
  on any number of ranks too (`load_one_file`): its optimizer state is re-keyed between parameter
  index (one process, DDP) and parameter name (FSDP2) to what the new run takes.

Resuming loads the newest one and continues exactly: the data stream is indexed by step (see
trainer.data), so the step and the skip offset are the data position. Both formats load without
unpickling code: `torch.load(weights_only=True)`, and DCP's metadata through an allow-list.
"""
from __future__ import annotations

import io
import math
import os
import pickle
import random
import re
import shutil
import stat
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from quipu.catalog.errors import UserError
from quipu.catalog.files import TMP_PREFIX, atomic_path, default_mode

NAME = re.compile(r"^step-(\d{7,})(?:\.pt)?$")   # step-0000100.pt (one file) or step-0000100/ (sharded)


class CheckpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    every: int = Field(100, gt=0, description="write a checkpoint every N steps (and at the end)")
    keep_last: int = Field(3, ge=1, description="checkpoints kept; older ones are deleted")
    format: Literal["auto", "single", "sharded"] = Field(
        "auto", description="auto: sharded (DCP, a folder of per-rank shards) under torchrun, one file otherwise")
    async_save: bool = Field(False, description="sharded: write in a background thread while training goes on "
                                                "(the checkpoint becomes visible when it is complete)")


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir()
             if (m := NAME.match(p.name)) and (p.is_dir() if p.suffix != ".pt" else p.is_file())]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    cks = list_checkpoints(run_dir)
    return cks[-1] if cks else None


class UnsafeCheckpoint(UserError):
    """A checkpoint file holding more than tensors and plain data: never unpickled."""


class DamagedCheckpoint(UserError):
    """A checkpoint file that is cut short, corrupt, or points outside its folder: one line naming it."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def regular_file(path: Path) -> int:
    """The size of `path`, a regular file (a link is followed only when it stays in its folder);
    DamagedCheckpoint otherwise (missing, a device such as /dev/zero, a FIFO, a link out)."""
    real = os.path.realpath(path)
    if os.path.dirname(real) != os.path.realpath(path.parent):
        raise DamagedCheckpoint(f"refusing to load {path}: it is a link to {real}, outside its checkpoint")
    try:
        st = os.stat(real)
    except OSError as e:
        raise DamagedCheckpoint(f"cannot load {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise DamagedCheckpoint(f"refusing to load {path}: not a regular file")
    return st.st_size


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
    prune(run_dir, keep_last)
    return path


def prune(run_dir: str | Path, keep_last: int) -> None:
    for old in list_checkpoints(run_dir)[:-keep_last]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def load_checkpoint(path: str | Path) -> dict:
    """Tensors and plain data only (`weights_only=True`): a run folder may be shared and writable by
    others, and unpickling a crafted file would run its code. Anything else is refused."""
    regular_file(Path(path))
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch's message is many lines of advice to load it anyway; keep only what it found
        lines = [ln.strip() for ln in str(e).splitlines() if "WeightsUnpickler error" in ln or "Unsupported" in ln]
        first = lines[0] if lines else type(e).__name__
        raise UnsafeCheckpoint(f"refusing to load {path}: it holds objects other than tensors and plain data "
                               f"({first[:160]}); it was not written by this version of quipu, or was tampered with") from None
    except (RuntimeError, OSError, EOFError, ValueError) as e:     # cut short, corrupt: torch's message is long
        raise DamagedCheckpoint(f"cannot load {path}: damaged or truncated ({_first_line(e)})") from None


# ---- one-file checkpoints on any sharding --------------------------------------------------------

class CheckpointMismatch(UserError):
    """A checkpoint whose model or optimizer does not fit the model being trained: one line saying why."""


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The name of every parameter in the optimizer's order (the order `state_dict()` numbers them):
    a tied weight under its first name, as torch.distributed.checkpoint names it."""
    name_of = {}
    for name, p in model.named_parameters():
        name_of.setdefault(id(p), name)
    return [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]


def _rekey(sd: dict, old: list, new: list, what: str) -> dict:
    sizes = [len(g["params"]) for g in sd["param_groups"]]
    if len(old) != len(new) or sum(sizes) != len(new):
        raise CheckpointMismatch(f"the checkpoint's optimizer holds {sum(sizes)} parameters in {len(sizes)} groups, "
                                 f"this model {len(new)} ({what}): it was saved for another model")
    to = dict(zip(old, new))
    groups, i = [], 0
    for g, n in zip(sd["param_groups"], sizes):
        groups.append(g | {"params": new[i:i + n]})
        i += n
    return {"state": {to[k]: v for k, v in sd["state"].items()}, "param_groups": groups}


def optimizer_state_by_name(sd: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """`optimizer.state_dict()` (keyed 0, 1, ... as one process and DDP write it) keyed by parameter
    name instead, the form torch.distributed.checkpoint's `set_state_dict` takes (FSDP2). Each state
    tensor is checked against its parameter's (global) shape."""
    names = _param_names(model, optimizer)
    first = sd["param_groups"][0]["params"][:1] if sd["param_groups"] else []
    if first and isinstance(first[0], str):
        return sd
    out = _rekey(sd, [p for g in sd["param_groups"] for p in g["params"]], names, "by index")
    shapes = {n: p.shape for n, p in model.named_parameters()}
    for name, st in out["state"].items():
        avg = st.get("exp_avg")
        if avg is not None and name in shapes and tuple(avg.shape) != tuple(shapes[name]):
            raise CheckpointMismatch(f"the checkpoint's optimizer state for {name} is {list(avg.shape)}, "
                                     f"the parameter {list(shapes[name])}: it was saved for another model")
    return out


def optimizer_state_by_index(sd: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The inverse: a state keyed by parameter name (FSDP2's one-file checkpoints) keyed 0, 1, ... for
    `optimizer.load_state_dict` (one process, DDP)."""
    first = sd["param_groups"][0]["params"][:1] if sd["param_groups"] else []
    if not first or not isinstance(first[0], str):
        return sd
    names = _param_names(model, optimizer)
    saved = [p for g in sd["param_groups"] for p in g["params"]]
    if sorted(saved) != sorted(names):
        missing = sorted(set(names) - set(saved))[:3] or sorted(set(saved) - set(names))[:3]
        raise CheckpointMismatch(f"the checkpoint's optimizer names other parameters than this model's "
                                 f"(e.g. {', '.join(missing)}): it was saved for another model")
    if len(sd["param_groups"]) != len(optimizer.param_groups):
        raise CheckpointMismatch(f"the checkpoint's optimizer has {len(sd['param_groups'])} parameter groups, "
                                 f"this one {len(optimizer.param_groups)}")
    # numbered in this optimizer's order: load_state_dict pairs saved and current parameters by position
    index = {n: i for i, n in enumerate(names)}
    groups, i = [], 0
    for g, now in zip(sd["param_groups"], optimizer.param_groups):
        groups.append(g | {"params": list(range(i, i + len(now["params"])))})
        i += len(now["params"])
    return {"state": {index[k]: v for k, v in sd["state"].items()}, "param_groups": groups}


def load_one_file(ck: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer, fsdp: bool) -> None:
    """Model and optimizer state of a one-file checkpoint, whoever wrote it (one process, DDP's rank 0,
    FSDP2's rank 0 with the optimizer keyed by name), into `model` sharded or not. Under FSDP2 every
    rank reads the whole file and keeps its own slices."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        optim_sd = optimizer_state_by_name(ck["optimizer"], model, optimizer)
        set_state_dict(model, optimizer, model_state_dict=ck["model"], optim_state_dict=optim_sd,
                       options=StateDictOptions(full_state_dict=True))
        return
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as e:
        raise CheckpointMismatch(f"the checkpoint's weights do not fit this model ({_first_line(e)})") from None
    optimizer.load_state_dict(optimizer_state_by_index(ck["optimizer"], model, optimizer))


# ---- sharded (torch.distributed.checkpoint) ------------------------------------------------------

def sharded_wanted(cfg: CheckpointConfig, torchrun: bool) -> bool:
    return cfg.format == "sharded" or (cfg.format == "auto" and torchrun)


def remove_partial_saves(run_dir: str | Path) -> int:
    """Delete the folders of sharded saves that were killed before they completed (rank 0, at start)."""
    d = checkpoint_dir(run_dir)
    gone = 0
    if d.is_dir():
        for p in d.glob(TMP_PREFIX + "step-*"):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
                gone += 1
    return gone


def _barrier() -> None:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _no_dist() -> bool:
    import torch.distributed as dist
    return not (dist.is_available() and dist.is_initialized())


def _rank() -> int:
    import torch.distributed as dist
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


_ASYNC_GROUP = []


def _async_group():
    import torch.distributed as dist
    if _no_dist():
        return None
    if not _ASYNC_GROUP:
        _ASYNC_GROUP.append(dist.new_group(backend="gloo"))   # every rank reaches here at the same save
    return _ASYNC_GROUP[0]


class ShardedSave:
    """One sharded save in progress: `start` writes (or, async, begins writing) every rank's shards
    into a temporary folder; `finish` waits for them and renames the folder into place (rank 0),
    then keeps the last `keep_last`. Every rank calls both."""

    def __init__(self, run_dir: str | Path, step: int, keep_last: int):
        self.run_dir, self.step, self.keep_last = Path(run_dir), step, keep_last
        self.final = checkpoint_dir(run_dir) / f"step-{step:07d}"
        self.tmp = checkpoint_dir(run_dir) / f"{TMP_PREFIX}step-{step:07d}"
        self.future = None

    def start(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict,
              asynchronous: bool = False) -> "ShardedSave":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        rank = _rank()
        if rank == 0:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp.mkdir(parents=True)
        _barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)   # each rank's own shards (DTensors under FSDP2)
        state = {"model": model_sd, "optimizer": optim_sd}
        if asynchronous:
            # its own gloo group: the background thread's collectives must not interleave with training's
            self.future = dcp.async_save(state, checkpoint_id=str(self.tmp / "state"), no_dist=_no_dist(),
                                         process_group=_async_group())
        else:
            dcp.save(state, checkpoint_id=str(self.tmp / "state"), no_dist=_no_dist())
        torch.save(rng_state(), self.tmp / f"rng-{rank}.pt")
        if rank == 0:
            torch.save(trainer_state | {"step": self.step}, self.tmp / "trainer.pt")
        return self

    def finish(self) -> Path:
        if self.future is not None:
            self.future.result()
            self.future = None
        _barrier()
        if _rank() == 0:
            for root, dirs, files in os.walk(self.tmp):
                for f in files:
                    with open(os.path.join(root, f), "rb") as fh:
                        os.fsync(fh.fileno())
                os.chmod(root, default_mode(directory=True))
            os.replace(self.tmp, self.final)
            prune(self.run_dir, self.keep_last)
        _barrier()
        return self.final


# DCP's `.metadata` is a pickle of its own dataclasses: unpickled through this allow-list, never freely
_METADATA_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.planner",
                     "torch.distributed.checkpoint.filesystem", "torch.distributed.checkpoint._extension",
                     "torch.distributed.checkpoint.storage")
_METADATA_GLOBALS = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
                     ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"), ("collections", "OrderedDict")}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module.startswith(_METADATA_MODULES) or (module, name) in _METADATA_GLOBALS
                or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"Unsupported global {module}.{name} in a checkpoint's metadata")


def _safe_reader(path: Path):
    from torch.distributed.checkpoint import FileSystemReader

    inside(path)

    class SafeReader(FileSystemReader):
        reading = ""      # the shard being read: a damaged one is named

        def _slice_file(self, file, sinfo):
            self.reading = sinfo.relative_path
            return super()._slice_file(file, sinfo)

        def read_metadata(self, *args, **kwargs):
            meta_path = Path(self._get_metadata_path(kwargs.get("rank")))
            regular_file(meta_path)
            with self.fs.create_stream(meta_path, "rb") as fh:
                try:
                    metadata = _MetadataUnpickler(fh).load()
                except pickle.UnpicklingError as e:
                    raise UnsafeCheckpoint(f"refusing to load {path}: {e}") from None
                except Exception as e:     # cut short, or not a DCP metadata file at all
                    raise DamagedCheckpoint(f"cannot load {meta_path}: damaged or truncated ({_first_line(e)})") from None
            check_storage(path, metadata)
            if getattr(metadata, "storage_meta", None) is None:
                from torch.distributed.checkpoint.metadata import StorageMeta
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(path))


def inside(path: Path) -> None:
    """Refuses a sharded checkpoint's `state` folder, or its step folder, that is a link elsewhere."""
    for p in (path.parent, path):
        if os.path.realpath(p) != os.path.join(os.path.realpath(p.parent), p.name):
            raise DamagedCheckpoint(f"refusing to load {p}: it is a link to {os.path.realpath(p)}")


def check_storage(path: Path, metadata) -> None:
    """Every file DCP's metadata names is a regular file inside `path` (no '../', no absolute path, no
    link out, no device) and holds every byte range read from it, before any is read."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(storage, dict):
        raise DamagedCheckpoint(f"cannot load {path}/.metadata: it names no storage")
    root, sizes = os.path.realpath(path), {}
    for info in storage.values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(info, _StorageInfo) or not isinstance(rel, str) or not rel or "\0" in rel:
            raise DamagedCheckpoint(f"cannot load {path}/.metadata: a storage entry without a file name")
        if rel not in sizes:
            target = os.path.realpath(os.path.join(root, rel))
            if os.path.isabs(rel) or os.path.dirname(target) != root:
                raise DamagedCheckpoint(f"refusing to load {path}: its metadata points outside it ({rel[:200]!r})")
            sizes[rel] = regular_file(Path(root) / rel)
        offset, length = info.offset, info.length
        if not (isinstance(offset, int) and isinstance(length, int) and offset >= 0 and length >= 0
                and offset + length <= sizes[rel]):
            raise DamagedCheckpoint(f"cannot load {path / rel}: truncated or damaged (bytes {offset}+{length} "
                                    f"of a {sizes[rel]}-byte file)")


def dcp_load(path: Path, state: dict, no_dist: bool) -> None:
    """`dcp.load` of `path/state` (metadata checked first), a damaged shard one line naming it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException   # a BaseException
    reader = _safe_reader(path / "state")
    reader.read_metadata()    # refused here with its own message (inside dcp.load it would be wrapped)
    try:
        dcp.load(state, storage_reader=reader, planner=_safe_planner(), no_dist=no_dist)
    except UserError:
        raise
    except (Exception, CheckpointException) as e:     # DCP wraps a shard's error in a many-line one
        raise DamagedCheckpoint(f"cannot load {path / 'state' / reader.reading}: damaged ({_first_line(e)})") from None


def _safe_planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class SafePlanner(DefaultLoadPlanner):
        """Plain data (optimizer hyper-parameters) loads with `weights_only=True`, as in the one-file format."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafePlanner()


def read_trainer_state(path: Path) -> dict:
    """`trainer.pt` of a sharded checkpoint (step, schedule, config) and this rank's RNG state
    (rank 0's when this rank did not exist in the run that saved it)."""
    state = load_checkpoint(path / "trainer.pt")
    rng = path / f"rng-{_rank()}.pt"
    state["rng"] = load_checkpoint(rng if rng.exists() else path / "rng-0.pt")
    return state


def load_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict:
    """Loads a sharded checkpoint into `model` (and `optimizer`) whatever their sharding now: each
    rank reads the slices it holds. Returns the trainer state (see `read_trainer_state`)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, get_model_state_dict, set_state_dict, \
        set_model_state_dict
    if optimizer is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optimizer": optim_sd}
    else:
        state = {"model": get_model_state_dict(model)}
    dcp_load(path, state, _no_dist())
    if optimizer is not None:
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    else:
        set_model_state_dict(model, state["model"])
    return read_trainer_state(path)


def sharded_tensor_specs(path: Path, prefix: str = "model.") -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Name -> (shape, dtype) of every tensor under `prefix` in a sharded checkpoint, from its metadata."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    meta = _safe_reader(path / "state").read_metadata()
    specs = {k[len(prefix):]: (m.size, m.properties.dtype) for k, m in meta.state_dict_metadata.items()
             if k.startswith(prefix) and isinstance(m, TensorStorageMetadata)}
    stored: dict[str, int] = {}
    for index, info in meta.storage_data.items():
        stored[index.fqn] = stored.get(index.fqn, 0) + info.length
    for name, (shape, dtype) in specs.items():    # a declared shape is allocated: it must be on disk
        need = math.prod(shape) * dtype.itemsize
        if stored.get(prefix + name, 0) < need:
            raise DamagedCheckpoint(f"cannot load {path / 'state'}: tensor {name!r} is declared {list(shape)} "
                                    f"({need:,} bytes) but its shards hold {stored.get(prefix + name, 0):,} bytes")
    return specs


def read_sharded_tensor(path: Path, name: str, shape, dtype) -> torch.Tensor:
    """One full tensor of a sharded checkpoint's model (its shards joined), read without the rest."""
    t = torch.empty(shape, dtype=dtype)
    holder = {"model": {name: t}}
    dcp_load(path, holder, True)
    return holder["model"][name]
