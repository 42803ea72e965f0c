"""What a run is built from: the ranks (torchrun's environment, or a process group already set up),
the device and precision, the model (whole, FSDP2-sharded in place, or wrapped in DDP; from a HF
folder each rank loads only its own slices) and the optimizer. Usable alone: `init_model` and
`make_optimizer` are what bench/train_throughput.py times.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch
import torch.distributed as dist

from quipu.trainer.llama import Llama, ModelConfig, pad_vocab
from quipu.trainer.train_config import LoopConfig, OptimConfig, TrainConfig, TrainConfigError


class Dist:
    """Rank/world of a process group already set up (spawned processes that called
    `init_process_group` themselves), else from torchrun's environment; a no-op for one process."""

    def __init__(self, device: torch.device):
        if dist.is_available() and dist.is_initialized():
            self.world, self.rank = dist.get_world_size(), dist.get_rank()
        else:
            self.world = int(os.environ.get("WORLD_SIZE", "1"))
            self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.enabled = self.world > 1
        self.owns_group = self.enabled and not dist.is_initialized()   # a caller's own group is left to it
        if self.owns_group:
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


def autocast(device: torch.device, dtype: torch.dtype | None):
    """torch.autocast to `dtype` on `device`, or nothing (fp32)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def check_vocab(key: str, model_vocab: int, tokenizer_vocab: int) -> None:
    if model_vocab < tokenizer_vocab:
        raise TrainConfigError(key, f"a model vocabulary of at least the tokenizer's {tokenizer_vocab} tokens"
                               + (" (use the model's own tokenizer: tokenizer.kind=smollm2 or file)" if key == "model.init_from"
                                  else " (or 0: the tokenizer's, rounded up)"), model_vocab)


def build_model(cfg: TrainConfig, vocab_size: int) -> tuple[Llama, ModelConfig]:
    mcfg = cfg.model
    if mcfg.init_from:
        from quipu.trainer.export import load_pretrained
        mcfg, state = load_pretrained(mcfg.init_from, mcfg)
        check_vocab("model.init_from", mcfg.vocab_size, vocab_size)
        torch.manual_seed(cfg.seed)
        model = Llama(mcfg)
        model.load_state_dict(state, strict=True)
        return model, mcfg
    if mcfg.vocab_size:
        check_vocab("model.vocab_size", mcfg.vocab_size, vocab_size)
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
        check_vocab("model.init_from", mcfg.vocab_size, vocab_size)
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

