"""A GGUF causal LM as a plain HF folder, converted once: transformers parses and de-quantizes a GGUF
on every load (~35 CPU-s for SmolLM2-135M, the teacher and `init_from: smollm2`). The float32
weights, config and tokenizer are kept in the cache folder (db.cache_home), in a folder named by the
GGUF's sha256 and by the sha256 of its own files: a damaged or truncated entry is found on read and
rebuilt, never trusted. Entries are built in a private folder and renamed into place, so two
processes building the same entry at once both succeed and one of the two folders is kept."""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from quipu.catalog.db import cache_home
from quipu.catalog.files import TMP_PREFIX, default_mode, sha256_file


def gguf_as_hf_folder(gguf: str | os.PathLike) -> Path:
    """A folder `from_pretrained` loads (config, float32 safetensors, tokenizer) with the same
    weights as the GGUF de-quantized by transformers; built on first use, verified on each use."""
    gguf = Path(gguf)
    key = sha256_file(gguf)[:32]
    root = cache_home() / "gguf"
    for entry in sorted(root.glob(f"{key}.*")):
        if entry.name.split(".", 1)[1] == folder_digest(entry):
            return entry
        shutil.rmtree(entry, ignore_errors=True)   # damaged: rebuilt below
    return _build(gguf, root, key)


def folder_digest(folder: Path) -> str:
    """sha256 over the folder's file names and bytes (sorted), 32 hex digits."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + sha256_file(f).encode())
    return h.hexdigest()[:32]


def _build(gguf: Path, root: Path, key: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX + key + ".", dir=root))
    try:
        _convert(gguf, tmp)
        for f in tmp.iterdir():
            os.chmod(f, default_mode())
        os.chmod(tmp, default_mode(directory=True))
        final = root / f"{key}.{folder_digest(tmp)}"
        try:
            tmp.rename(final)
        except OSError:   # another process renamed the same bytes into place first: theirs is ours
            if not final.is_dir() or folder_digest(final) != final.name.split(".", 1)[1]:
                raise
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert(gguf: Path, folder: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from safetensors.torch import save_model
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a model flagged as GGUF-quantized; its weights are plain float32 by now
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})   # tied tensors once
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    type(model.config).from_dict(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(folder)
