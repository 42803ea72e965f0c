"""scoring/gguf_cache.py: a GGUF de-quantized once into the cache folder gives the same numbers as
the GGUF itself, and an entry that does not hash to its name is rebuilt, never trusted."""
from __future__ import annotations

import pytest

from quipu.scoring import gguf_cache


@pytest.mark.slow
def test_the_cached_smollm2_gives_the_logits_and_tokens_of_the_gguf():
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quipu.trainer.tokenizer import SMOLLM2_GGUF, reference_tokenizer, smollm2_dir
    gguf = smollm2_dir() / SMOLLM2_GGUF
    folder = gguf_cache.gguf_as_hf_folder(gguf)   # the session's cache: later SmolLM2 loads reuse it
    assert gguf_cache.gguf_as_hf_folder(gguf) == folder
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    cached = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    text = "El río Amazonas atraviesa Brasil. The river crosses the forest; o rio é longo."
    ids = reference_tokenizer().encode(text).ids   # the GGUF's tokenizer (cached as tokenizer.json)
    assert AutoTokenizer.from_pretrained(str(folder)).backend_tokenizer.encode(text).ids == ids
    with torch.no_grad():
        x = torch.tensor([[1] + ids])
        assert torch.equal(direct(x).logits, cached(x).logits)


def _fake_convert(calls):
    def convert(gguf, folder):
        calls.append(gguf)
        (folder / "config.json").write_text('{"model_type": "llama"}')
        (folder / "model.safetensors").write_bytes(gguf.read_bytes() * 3)
    return convert


def test_a_damaged_or_truncated_cache_entry_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("QUIPU_CACHE", str(tmp_path / "cache"))
    calls: list = []
    monkeypatch.setattr(gguf_cache, "_convert", _fake_convert(calls))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)))
    first = gguf_cache.gguf_as_hf_folder(gguf)
    assert gguf_cache.gguf_as_hf_folder(gguf) == first and len(calls) == 1
    weights = first / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 1
    weights.write_bytes(bytes(data))   # one bit flipped
    again = gguf_cache.gguf_as_hf_folder(gguf)
    assert len(calls) == 2 and again.is_dir() and (again / "model.safetensors").read_bytes() == gguf.read_bytes() * 3
    with open(again / "model.safetensors", "r+b") as fh:
        fh.truncate(10)
    gguf_cache.gguf_as_hf_folder(gguf)
    assert len(calls) == 3
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir()] == [again.name]   # no leftovers
    # another GGUF (another key) gets its own entry
    other = tmp_path / "n.gguf"
    other.write_bytes(b"GGUF other")
    assert gguf_cache.gguf_as_hf_folder(other) != again and len(calls) == 4


def test_two_builders_of_one_entry_both_get_it(tmp_path, monkeypatch):
    """A second process that finishes building an entry another renamed into place first uses that one."""
    monkeypatch.setenv("QUIPU_CACHE", str(tmp_path / "cache"))
    calls: list = []
    monkeypatch.setattr(gguf_cache, "_convert", _fake_convert(calls))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF 1")
    root = tmp_path / "cache" / "gguf"
    key = gguf_cache.sha256_file(gguf)[:32]
    first = gguf_cache._build(gguf, root, key)
    assert gguf_cache._build(gguf, root, key) == first   # the rename onto a full folder fails: theirs is kept
    assert [p.name for p in root.iterdir()] == [first.name] and len(calls) == 2
