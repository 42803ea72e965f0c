"""Trainer acceptance tests: packed attention, blend validation, exact resume, HF export, torchrun.

Tiny models (a few 100k parameters) on synthetic curated-like shards so the whole file stays fast.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from quipu.catalog import registry
from quipu.catalog.files import sha256_file
from quipu.flows.config import ConfigError, load_config
from quipu.trainer.data import BlendError, Batcher, resolve_phase_starts
from quipu.trainer.llama import Llama, ModelConfig
from quipu.trainer.prepare import prepare, resolve_sources
from quipu.trainer.train import TrainConfig, plan_data, load_sources, train
from tests.ranks import config_file, launch_ranks

ROOT = Path(__file__).resolve().parents[1]

WORDS = {
    "en": "the cat dog river house green small runs sees under over near old new bread water light city".split(),
    "es": "el gato perro río casa verde pequeño corre ve bajo sobre cerca viejo nuevo pan agua luz ciudad".split(),
    "pt": "o gato cão rio casa verde pequeno corre vê sob sobre perto velho novo pão água luz cidade".split(),
}


def synthetic_docs(n: int, seed: int, lang: str) -> list[dict]:
    rng = random.Random(seed)
    w = WORDS[lang]
    docs = []
    for i in range(n):
        sents = []
        for _ in range(rng.randint(2, 8)):
            k = rng.randint(3, 9)
            sents.append(" ".join(rng.choice(w) for _ in range(k)).capitalize() + ".")
        docs.append({"id": f"{lang}-{seed}-{i}", "text": " ".join(sents), "source": f"synthetic-{lang}",
                     "url": f"https://example.org/{lang}/{i}", "lang": lang, "lang_score": 0.99,
                     "ppl_wayra": float(rng.uniform(5, 500))})
    return docs


def write_curated(dir_: Path, name: str, docs: list[dict], parts: int = 2) -> None:
    dir_.mkdir(parents=True, exist_ok=True)
    shards = []
    for i in range(parts):
        part = docs[i::parts]
        p = dir_ / f"part-{i:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(part), p)
        shards.append({"path": str(p), "rows": len(part), "bytes": p.stat().st_size, "sha256": sha256_file(p)})
    registry.register_dataset(name, "curated", str(dir_), None, shards)


def base_config(output: Path, **over) -> dict:
    cfg = {
        "output": str(output),
        "tokenizer": {"vocab_size": 320, "train_docs": 2000},
        "data": {"seq_len": 32, "eval_docs_per_source": 4,
                 "phases": [{"name": "general", "sources": [{"dataset": "tr-en", "weight": 0.7}, {"dataset": "tr-es", "weight": 0.3}]}]},
        "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
        "optim": {"lr": 3e-3},
        "schedule": {"warmup_steps": 2},
        "train": {"max_steps": 8, "batch_size": 4, "micro_batch": 2, "threads": 1},
        "eval": {"every": 4, "rows": 4, "sample_tokens": 5},
        "checkpoint": {"every": 4, "keep_last": 2},
    }
    for k, v in over.items():
        node = cfg
        parts = k.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    return cfg


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """Two curated sources in the catalog, a BPE tokenizer and token shards, prepared once."""
    base = tmp_path_factory.mktemp("trainer")
    write_curated(base / "cur-en", "tr-en", synthetic_docs(120, 1, "en"))
    write_curated(base / "cur-es", "tr-es", synthetic_docs(80, 2, "es"))
    run = base / "prepared"
    cfg = load_config(TrainConfig, data=base_config(run))
    prepare(cfg.tokenizer, cfg.data, run)
    return run


def new_run(prepared: Path, tmp_path: Path, name: str) -> Path:
    run = tmp_path / name
    run.mkdir()
    shutil.copy(prepared / "prepared.json", run / "prepared.json")
    return run


# ---- model ---------------------------------------------------------------------------------------

def test_packed_attention_does_not_cross_documents():
    torch.manual_seed(0)
    m = Llama(ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)).eval()
    a = torch.randint(0, 64, (1, 7))
    b = torch.randint(0, 64, (1, 9))
    alone = m(b)
    packed = torch.cat([a, b], 1)
    pos = torch.cat([torch.arange(7), torch.arange(9)]).unsqueeze(0)
    seg = torch.cat([torch.zeros(7), torch.ones(9)]).long().unsqueeze(0)
    got = m(packed, pos, seg)[:, 7:]
    assert torch.allclose(got, alone, atol=1e-5), (got - alone).abs().max()
    # without the document mask the second document does see the first: the test can fail
    leaky = m(packed, pos)[:, 7:]
    assert not torch.allclose(leaky, alone, atol=1e-3)
    # and the first document is unaffected by what follows it
    assert torch.allclose(m(packed, pos, seg)[:, :7], m(a), atol=1e-5)


def test_activation_checkpointing_recomputes_blocks_with_the_same_gradients():
    torch.manual_seed(0)
    m = Llama(ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64))
    x = torch.randint(0, 64, (2, 16))
    calls = []
    m.layers[0].input_layernorm.register_forward_hook(lambda *a: calls.append(1))   # early in the block: recomputation stops once it has what the backward needs
    grads = []
    for ac in (False, True):
        m.activation_checkpointing = ac
        m.zero_grad()
        s, n = m(x, targets=x)
        (s / n).backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    assert calls == [1, 1, 1]          # plain: once; checkpointed: forward, then again in the backward
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


@pytest.mark.parametrize("tie", [True, False])
def test_fused_paths_give_the_plain_paths_loss_and_gradients(monkeypatch, tie):
    """One GEMM for q/k/v and gate/up and the chunked LM head + loss (Llama.use_fused): same loss and
    gradients as the plain modules, with ignored targets, grouped-query heads and packed rows, over
    several chunks (one shorter than the rest); the state dict keeps the per-projection names."""
    import quipu.trainer.llama as model_module
    monkeypatch.setattr(model_module, "LM_HEAD_CHUNK", 7)
    torch.manual_seed(0)
    m = Llama(ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64, tie_embeddings=tie))
    x = torch.randint(0, 64, (2, 17))
    tgt = x.roll(-1, 1)
    tgt[0, :5] = -100
    seg = (torch.arange(17) >= 9).long().expand(2, 17)
    pos = torch.where(seg == 0, torch.arange(17), torch.arange(17) - 9)
    runs = []
    for on in (False, True):
        m.use_fused(on).zero_grad()
        s, n = m(x, pos, seg, targets=tgt)
        (3 * s / n).backward()   # a scale on the loss reaches the gradients
        runs.append((s.detach(), [p.grad.clone() for p in m.parameters()]))
        with torch.no_grad():
            assert torch.allclose(m(x, pos, seg, targets=tgt)[0], s, atol=1e-5)   # the loss alone, no gradients
    (a, ga), (b, gb) = runs
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-6), (a, b)
    assert all(torch.allclose(u, v, atol=1e-6) for u, v in zip(ga, gb))
    assert any(k.endswith("self_attn.k_proj.weight") for k in m.state_dict()) and not any("qkv" in k for k in m.state_dict())


def test_pack_masks_targets_and_resets_positions():
    window = np.array([5, 6, 7, 1, 8, 9, 2], dtype=np.int64)
    starts = np.array([0, 0, 0, 1, 0, 0, 1], dtype=np.int8)   # documents start at 3 and 6
    x, y, pos, seg = Batcher.pack(window, starts)
    assert x.tolist() == [5, 6, 7, 1, 8, 9]
    assert y.tolist() == [6, 7, -100, 8, 9, -100]
    assert pos.tolist() == [0, 1, 2, 0, 1, 2]
    assert seg.tolist() == [0, 0, 0, 1, 1, 1]


# ---- tokenizer and tokens --------------------------------------------------------------------------

def test_tokenizer_and_token_shards(prepared):
    info = json.loads((prepared / "prepared.json").read_text())
    assert set(info["sources"]) == {"tr-en", "tr-es"}
    from quipu.trainer.tokenizer import TextTokenizer
    tok = TextTokenizer.load(info["tokenizer"])
    assert tok.bos_id is not None and tok.eos_id is not None
    assert set(info["fertility"]) == {"en", "es"} and all(v["tokens_per_word"] > 0 for v in info["fertility"].values())
    assert info["summary"]["tr-en"]["docs"] == 120
    from quipu.trainer.tokenize import TokenShards
    shards = TokenShards.open(info["sources"]["tr-en"])
    d0 = shards.doc(0)
    assert d0[0] == tok.bos_id and d0[-1] == tok.eos_id
    text = pq.read_table(info["sources"]["tr-en"][0]["input"]).column("text")[0].as_py()
    assert tok.decode(list(d0)) == text
    ds = registry.get_dataset("tr-en.tokens", kind="tokens")
    assert ds is not None and json.loads(ds["info"])["tokens"] == info["summary"]["tr-en"]["tokens"]
    # resumable: a second prepare reuses every shard (markers untouched)
    mtimes = [Path(m["tokens_path"]).stat().st_mtime_ns for m in info["sources"]["tr-en"]]
    cfg = load_config(TrainConfig, data=base_config(prepared))
    prepare(cfg.tokenizer, cfg.data, prepared)
    assert [Path(m["tokens_path"]).stat().st_mtime_ns for m in info["sources"]["tr-en"]] == mtimes


# ---- blends ----------------------------------------------------------------------------------------

def test_blend_weights_must_sum_to_one(tmp_path):
    bad = base_config(tmp_path, **{"data.phases": [{"sources": [{"dataset": "tr-en", "weight": 0.5}, {"dataset": "tr-es", "weight": 0.3}]}]})
    with pytest.raises(ConfigError, match=r"weights sum to 0.8, not 1"):
        load_config(TrainConfig, data=bad)


def test_blend_missing_source(prepared, tmp_path):
    cfg = load_config(TrainConfig, data=base_config(tmp_path, **{"data.phases": [{"sources": [{"dataset": "no-such-set", "weight": 1.0}]}]}))
    with pytest.raises(BlendError, match=r"data.phases\[0\].sources\[0\].dataset: no curated dataset named 'no-such-set'"):
        resolve_sources(cfg.data)


def test_phase_boundary_past_the_end(prepared, tmp_path):
    phases = [{"sources": [{"dataset": "tr-en", "weight": 1.0}]},
              {"name": "target", "start_step": 50, "sources": [{"dataset": "tr-es", "weight": 1.0}]}]
    cfg = load_config(TrainConfig, data=base_config(tmp_path, **{"data.phases": phases}))
    with pytest.raises(BlendError, match=r"data.phases\[1\] \('target'\): start_step 50 is past the end"):
        resolve_phase_starts(cfg.data, cfg.train.max_steps, lambda s: cfg.schedule.fraction(s, 8))
    phases[1] = {"name": "target", "start_lr_fraction": 0.05, "sources": [{"dataset": "tr-es", "weight": 1.0}]}
    cfg = load_config(TrainConfig, data=base_config(tmp_path, **{"data.phases": phases}))  # floor is 0.1: never reached
    with pytest.raises(BlendError, match=r"never decays to 0.05"):
        resolve_phase_starts(cfg.data, 8, lambda s: cfg.schedule.fraction(s, 8))


def measured_source_tokens(batcher: Batcher, steps: range) -> np.ndarray:
    """Tokens per source in the rows the trainer reads at `steps` (beginning at a phase start), measured
    on the tokens themselves: the rows laid end to end are the token stream (row j holds tokens
    [jL, jL+L)); a document starts where a segment starts inside a row, or at a row's first token when
    the row before masks its last target. Each document is matched to the source document it is a
    prefix of, and its tokens count for that source."""
    tokens, starts = [], []
    starts_doc = True
    for step in steps:
        x, y, _, seg = batcher.rows(step, range(batcher.rows_per_step))
        for row, row_y, row_seg in zip(x, y, seg):
            flag = np.r_[starts_doc, row_seg[1:] != row_seg[:-1]]
            tokens.append(row)
            starts.append(flag)
            starts_doc = row_y[-1] == -100
    tokens, starts = np.concatenate(tokens), np.concatenate(starts)
    bounds = np.r_[np.flatnonzero(starts), len(tokens)]
    docs = {si: [src.train.doc(int(d)).tolist() for d in src.train_docs] for si, src in enumerate(batcher.sources)}
    counts = np.zeros(len(batcher.sources), dtype=np.int64)
    for a, b in zip(bounds[:-1], bounds[1:]):
        doc = tokens[a:b].tolist()
        owners = {si for si, ds in docs.items() if any(d[:len(doc)] == doc for d in ds)}
        assert len(owners) == 1, f"a document of {len(doc)} tokens at stream position {a} matches sources {owners}"
        counts[owners.pop()] += len(doc)
    return counts


def available_tokens(src) -> int:
    return sum(len(src.train.doc(int(d))) for d in src.train_docs)


def test_continued_pretraining_phase_starts_at_lr_fraction(prepared, tmp_path):
    phases = [{"sources": [{"dataset": "tr-en", "weight": 1.0}]},
              {"name": "target", "start_lr_fraction": 0.2, "sources": [{"dataset": "tr-es", "epochs": 2.0}]}]
    cfg = load_config(TrainConfig, data=base_config(tmp_path, **{"data.phases": phases, "schedule.warmup_steps": 0,
                                                                 "schedule.min_lr_ratio": 0.0, "train.max_steps": 100}))
    starts = resolve_phase_starts(cfg.data, 100, lambda s: cfg.schedule.fraction(s, 100))
    s = starts[1]
    assert cfg.schedule.fraction(s, 100) <= 0.2 < cfg.schedule.fraction(s - 1, 100)
    info = json.loads((prepared / "prepared.json").read_text())
    phases_built, batcher = plan_data(cfg, load_sources(cfg, info))
    # measured on the rows the trainer reads: up to the boundary English only, from it Spanish only
    en_i, es_i = [src.name for src in batcher.sources].index("tr-en"), [src.name for src in batcher.sources].index("tr-es")
    before = measured_source_tokens(batcher, range(0, s))
    after = measured_source_tokens(batcher, range(s, 100))
    assert before[es_i] == 0 and before[en_i] == s * 4 * 32
    assert after[en_i] == 0 and after[es_i] == (100 - s) * 4 * 32
    # the report's repetitions of the target data are what the stream holds
    rep = phases_built[1].report[0]
    assert rep["source"] == "tr-es" and rep["share"] == 1.0
    assert rep["repetitions"] == pytest.approx(after[es_i] / available_tokens(batcher.sources[es_i]), rel=0.01)


def test_epoch_multipliers_give_shares(prepared, tmp_path):
    """`epochs: 6` against `epochs: 1`: in the token stream each Spanish token is read six times as often
    as each English one (measured on the rows, against the sources' token counts)."""
    phases = [{"sources": [{"dataset": "tr-en", "epochs": 1.0}, {"dataset": "tr-es", "epochs": 6.0}]}]
    cfg = load_config(TrainConfig, data=base_config(tmp_path, **{"data.phases": phases, "train.max_steps": 120}))
    info = json.loads((prepared / "prepared.json").read_text())
    phases_built, batcher = plan_data(cfg, load_sources(cfg, info))
    counts = measured_source_tokens(batcher, range(120))
    names = [src.name for src in batcher.sources]
    en, es = (counts[names.index(n)] / available_tokens(batcher.sources[names.index(n)]) for n in ("tr-en", "tr-es"))
    assert counts.sum() == 120 * 4 * 32
    assert es / en == pytest.approx(6.0, rel=0.1), (es, en, counts)
    # and along the stream, not only in total: the first quarter holds the same blend
    first = measured_source_tokens(batcher, range(30))
    assert first[names.index("tr-es")] / first.sum() == pytest.approx(
        counts[names.index("tr-es")] / counts.sum(), abs=0.05), (first, counts)


def test_curriculum_orders_by_ppl_and_control_shuffles(prepared, tmp_path):
    info = json.loads((prepared / "prepared.json").read_text())
    orders = {}
    for order in ("ppl_wayra", "shuffle"):
        phases = [{"order": order, "sources": [{"dataset": "tr-en", "weight": 0.5}, {"dataset": "tr-es", "weight": 0.5}]}]
        cfg = load_config(TrainConfig, data=base_config(tmp_path, **{"data.phases": phases}))
        p = plan_data(cfg, load_sources(cfg, info))[0][0]
        orders[order] = [np.array([p.sources[s].train.doc_ppl[i] for i in p.docs_index[p.docs_source == s]])
                         for s in range(len(p.sources))]
    # a curriculum sorts within each source (sources are interleaved by weight, not sorted together)
    assert all(np.all(np.diff(ppl) >= 0) for ppl in orders["ppl_wayra"])
    assert not any(np.all(np.diff(ppl) >= 0) for ppl in orders["shuffle"])
    for a, b in zip(orders["shuffle"], orders["ppl_wayra"]):
        assert sorted(a.tolist()) == b.tolist()     # same documents, other order


# ---- training ------------------------------------------------------------------------------------------

def losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if "loss" in line]


def final_weights(run: Path) -> dict:
    from quipu.trainer.checkpoint import latest_checkpoint, load_checkpoint
    return load_checkpoint(latest_checkpoint(run))["model"]


TASK_ITEMS = [{"prompt": "The cat sees the", "choices": ["river near the house.", "zqxj vvkw pfft."], "answer": 0, "lang": "en"},
              {"prompt": "El gato ve el", "choices": ["qqzx wvvk.", "río cerca de la casa."], "answer": "río cerca de la casa.", "lang": "es"},
              {"prompt": "The dog runs", "choices": ["under the old bridge.", "over the green city."], "answer": 1, "lang": "en"}]


def answer_bpb_by_hand(model, tok, items: list[dict]) -> tuple[float, float]:
    """Accuracy and answer bits per byte through the model's own loss_sum (targets masked to the answer)."""
    nll = nbytes = correct = 0
    for it in items:
        per_byte = []
        for c in it["choices"]:
            ctx, cont = tok.encode(it["prompt"], bos=True), tok.encode(c, bos=False)
            ids = torch.tensor([ctx + cont])
            y = ids[:, 1:].clone()
            y[:, :len(ctx) - 1] = -100
            with torch.no_grad():
                s, _ = model.loss_sum(ids[:, :-1], y)
            per_byte.append((float(s), len(c.encode())))
        ans = it["answer"] if isinstance(it["answer"], int) else it["choices"].index(it["answer"])
        nll += per_byte[ans][0]
        nbytes += per_byte[ans][1]
        correct += min(range(len(per_byte)), key=lambda k: per_byte[k][0] / per_byte[k][1]) == ans
    return correct / len(items), nll / math.log(2) / nbytes


def test_resume_is_exact(prepared, tmp_path):
    straight = new_run(prepared, tmp_path, "straight")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASK_ITEMS))
    cfg = load_config(TrainConfig, data=base_config(straight, **{"eval.tasks": [
        {"path": str(tasks), "name": "toy"}, {"benchmark": "humaneval", "max_items": 2, "lang": "code"}]}))
    s = train(cfg, straight)
    assert s["step"] == 8 and len(losses(straight)) == 8
    assert losses(straight)[-1] < losses(straight)[0]
    assert (straight / "loss.png").stat().st_size > 1000
    # held-out bits per byte per source and per language at every eval step (4 and 8)
    evals = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines() if "eval_bpb" in x]
    assert [r["step"] for r in evals] == [4, 8]
    for r in evals:
        assert set(r["eval_by_source"]) == {"tr-en", "tr-es"} and set(r["eval_by_lang"]) == {"en", "es"}
        assert all(0 < v["bpb"] < 10 and v["loss"] > 0 for v in r["eval_by_source"].values())
    assert evals[1]["eval_by_source"]["tr-en"]["bpb"] < evals[0]["eval_by_source"]["tr-en"]["bpb"]
    # the synthetic en and es sources are the en and es languages: same documents, same figures
    assert evals[1]["eval_by_lang"]["es"] == evals[1]["eval_by_source"]["tr-es"]
    # task files scored by log-likelihood: the final eval agrees with the model's own loss on the answers
    toy, he = evals[1]["eval_tasks"]["toy"], evals[1]["eval_tasks"]["humaneval"]
    assert toy["items"] == 3 and set(toy["by_lang"]) == {"en", "es"} and he["items"] == 2 and he["answer_bpb"] > 0
    from quipu.trainer.checkpoint import latest_checkpoint, load_checkpoint
    from quipu.trainer.tokenizer import TextTokenizer
    ck = load_checkpoint(latest_checkpoint(straight))
    model = Llama(ModelConfig.model_validate(ck["model_config"]))
    model.load_state_dict(ck["model"])
    acc, bpb = answer_bpb_by_hand(model.eval(), TextTokenizer.load(json.loads((straight / "prepared.json").read_text())["tokenizer"]), TASK_ITEMS)
    assert toy["accuracy"] == pytest.approx(acc) and toy["answer_bpb"] == pytest.approx(bpb, abs=2e-6)

    split = new_run(prepared, tmp_path, "split")
    cfg_stop = load_config(TrainConfig, data=base_config(split, **{"train.stop_at_step": 4}))
    assert train(cfg_stop, split)["stopped_early"]
    # a killed run logs steps past its last checkpoint: resume must drop them
    with open(split / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 5, "loss": 123.0}) + "\n")
    with pytest.raises(BlendError, match="pass --resume"):
        train(load_config(TrainConfig, data=base_config(split)), split)
    train(load_config(TrainConfig, data=base_config(split)), split, resume=True)
    assert losses(split) == losses(straight)
    a, b = final_weights(straight), final_weights(split)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_spike_guard_unit():
    from quipu.trainer.train import SpikeConfig, SpikeGuard
    g = SpikeGuard(SpikeConfig(factor=4, min_history=3, window=10, max_consecutive=2))
    assert [g.check(x) for x in (1.0, 1.2, 0.9)] == [None, None, None]
    assert g.check(float("nan")) == "non-finite grad norm"
    assert "median" in g.check(10.0) and g.needs_rollback
    assert g.check(3.9) is None and g.consecutive == 0
    # the median is of accepted steps only (spikes never raise it), over the last `window` of them
    g = SpikeGuard(SpikeConfig(factor=2, min_history=2, window=3, max_consecutive=9))
    assert [g.check(x) is None for x in (1.0, 1.0, 100.0, 100.0, 100.0, float("inf"))] == [True, True] + [False] * 4
    assert g.history == [1.0, 1.0] and g.consecutive == 4
    assert [g.check(x) for x in (1.5, 1.9, 1.6)] == [None] * 3 and g.history == [1.5, 1.9, 1.6]
    assert SpikeGuard(SpikeConfig(enabled=False)).check(float("nan")) is None


def test_sample_is_seeded_and_leaves_the_model_in_its_mode():
    """trainer/sampling.py: the same weights and seed give the same sample (another seed another),
    it continues the prompt, 0 tokens is "", and the model is left in the mode it was in."""
    from quipu.trainer.llama import Llama, ModelConfig
    from quipu.trainer.sampling import sample
    from quipu.trainer.tokenizer import BOS, EOS, TextTokenizer, train_bpe
    texts = ["el gato come pescado y el perro duerme en la casa"] * 50 + ["the cat eats fish and the dog sleeps"] * 50
    tok = TextTokenizer(train_bpe(texts, 300, 2), BOS, EOS, Path("unused"))
    torch.manual_seed(0)
    model = Llama(ModelConfig(vocab_size=320, dim=32, n_layers=1, n_heads=2, max_seq_len=64)).train()
    cpu = torch.device("cpu")
    a = sample(model, tok, "el gato", 12, seed=7, device=cpu)
    assert a.startswith("el gato") and len(a) > len("el gato") and model.training
    assert sample(model, tok, "el gato", 12, seed=7, device=cpu) == a != sample(model, tok, "el gato", 12, seed=8, device=cpu)
    assert not model.eval().training and sample(model, tok, "el gato", 12, seed=7, device=cpu) == a and not model.training
    assert sample(model, tok, "el gato", 0, seed=7, device=cpu) == ""


def test_spike_guard_skips_and_rolls_back(prepared, tmp_path):
    from quipu.trainer.train import Trainer
    run = new_run(prepared, tmp_path, "spiky")
    cfg = load_config(TrainConfig, data=base_config(run, **{"spike": {"max_consecutive": 2}}))

    class Poisoned(Trainer):
        """Steps 5 and 6 (first time through) produce NaN gradients."""
        def _loss_sum(self, x, y, pos, seg):
            s, n = super()._loss_sum(x, y, pos, seg)
            if self.step in (4, 5) and self.rollbacks == 0:
                return s * float("nan"), n
            return s, n

    t = Poisoned(cfg, run)
    t.run()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("skipped")] == [5, 6]
    rb = [r for r in rows if r.get("event") == "rollback"]
    assert rb == [{"step": 4, "event": "rollback", "from_step": 6, "lr_scale": 0.5}]
    assert t.step == 8 and t.skip_steps == 2 and all(math.isfinite(r["loss"]) for r in rows if r.get("loss") and r["step"] > 6)
    after = [r for r in rows if "lr" in r and r["step"] > 6]
    assert after and all(r["lr"] == pytest.approx(0.5 * cfg.optim.lr * cfg.schedule.fraction(r["step"] - 1, 8)) for r in after)


def test_persistent_spikes_end_in_one_line_naming_the_fix(prepared, tmp_path):
    from quipu.catalog.errors import UserError
    from quipu.trainer.train import Trainer, TrainingDiverged
    run = new_run(prepared, tmp_path, "diverging")
    cfg = load_config(TrainConfig, data=base_config(run, **{"spike": {"max_consecutive": 2, "max_rollbacks": 0}}))

    class Poisoned(Trainer):
        def _loss_sum(self, x, y, pos, seg):
            s, n = super()._loss_sum(x, y, pos, seg)
            return (s * float("nan"), n) if self.step >= 4 else (s, n)

    with pytest.raises(TrainingDiverged) as e:
        Poisoned(cfg, run).run()
    assert isinstance(e.value, UserError) and "\n" not in str(e.value)     # the CLI and a worker print it as one line
    assert re.search(r"loss spikes persist after 0 rollback\(s\) \(spike.max_rollbacks\); last checkpoint .*; "
                     r"fix: lower optim.lr, raise spike.factor or spike.max_rollbacks", str(e.value))


def test_any_other_training_failure_on_a_worker_is_one_line(tmp_path):
    from quipu.flows.train import unexpected_failure
    try:
        raise RuntimeError("CUDA out of memory.\nTried to allocate 2 GiB")
    except RuntimeError as e:
        line = unexpected_failure(e, tmp_path / "run")
    assert "\n" not in line and line.startswith("training failed: RuntimeError: CUDA out of memory.")
    assert f"(traceback in {tmp_path / 'run' / 'error.log'})" in line and "resumes from the newest checkpoint" in line
    assert "Traceback" in (tmp_path / "run" / "error.log").read_text()


def test_shipped_continual_run_on_es_pt_versions_neither_memorises_nor_rolls_back(prefect_server, tmp_path, capsys):
    """configs/train/default.yaml as shipped (only its dataset and output moved): a tiny es/pt
    version (no English) trains the steps its tokens bear, not 200 steps of them; the next version
    continues from that checkpoint, its guard measuring the new data, with no rollback."""
    import uuid

    from quipu.flows.train import tokenize_train
    from quipu.trainer.continual import NewVersion
    name = f"tiny-crawl-{uuid.uuid4().hex[:6]}"
    text = (ROOT / "configs/train/default.yaml").read_text().replace("dataset: crawl", f"dataset: {name}")
    shipped = __import__("yaml").safe_load(text)
    # the blend, limits, schedule and guard as shipped; a smaller model, the behaviour is under test
    cfg = load_config(TrainConfig, data=shipped | {"output": str(tmp_path / "run"), "eval": {"sample_tokens": 0},
                                                   "model": {"dim": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
                                                             "max_seq_len": 256, "tie_embeddings": True}})
    write_curated(tmp_path / "v1", name, synthetic_docs(6, 1, "es") + synthetic_docs(6, 2, "pt"))
    first = tokenize_train(cfg, new_version=NewVersion(dataset=name, version=1))
    notes = "\n".join(first["data_notes"])
    # the warning goes to the run's Prefect logger, whose handler keeps the stderr of the session's first
    # flow run (not capsys's): the sentence is checked where the artifact and the CLI summary take it from
    assert "does not fit" not in capsys.readouterr().err + notes     # no English is no problem for this blend
    assert 0 < first["step"] < cfg.train.max_steps and "data.max_epochs 4:" in notes and f"{name}[lang=en]" in notes
    assert all(r["repetitions"] <= 4 for r in first["blend"] if not r.get("absent"))
    assert {r["source"]: r["share"] for r in first["blend"]}[f"{name}[lang=en]"] == 0
    write_curated(tmp_path / "v2", name, synthetic_docs(16, 3, "es") + synthetic_docs(16, 4, "pt"))
    second = tokenize_train(cfg, new_version=NewVersion(dataset=name, version=2))
    assert second["resumed_from_step"] == first["step"] < second["step"]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in rows if r.get("event") == "rollback" or r.get("skipped")]
    from quipu.trainer.checkpoint import latest_checkpoint, load_checkpoint
    history = load_checkpoint(latest_checkpoint(tmp_path / "run"))["trainer"]["grad_norm_history"]
    assert len(history) == second["step"] - first["step"]      # the guard's median: the new version's steps only


def test_export_matches_transformers(prepared, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from quipu.trainer.export import export_hf
    run = new_run(prepared, tmp_path, "exp")
    cfg = load_config(TrainConfig, data=base_config(run, **{"train.max_steps": 4}))
    train(cfg, run)
    out = export_hf(run, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out)
    ck = final_weights(run)
    from quipu.trainer.checkpoint import latest_checkpoint, load_checkpoint
    ours = Llama(ModelConfig.model_validate(load_checkpoint(latest_checkpoint(run))["model_config"]))
    ours.load_state_dict(ck)
    ours.eval()
    ids = torch.tensor([tok("the cat sees the river near the old house")["input_ids"]])
    with torch.no_grad():
        a, b = ours(ids), hf(ids).logits
    assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (a - b).abs().max()
    gen = hf.generate(ids, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] == ids.shape[1] + 5 or tok.eos_token_id in gen[0].tolist()
    assert isinstance(tok.decode(gen[0]), str)

    # the tokenizer starts every text with BOS, as training did, and knows the model's length
    assert ids[0, 0].item() == tok.bos_token_id and tok.bos_token_id == ck_tok_bos(run)
    assert tok.model_max_length == 64
    # held-out text as training saw a document (BOS + ids + EOS): the loss transformers computes equals
    # the one our model's loss_sum (what the trainer's evaluation sums) gives, within 1e-4
    text = "la casa vieja del río tiene una ventana grande y el gato mira el agua"
    doc = torch.tensor([tok(text)["input_ids"] + [tok.eos_token_id]])
    with torch.no_grad():
        s, n = ours.loss_sum(doc[:, :-1], doc[:, 1:])
        hf_loss = hf(doc, labels=doc).loss.item()
    assert abs(float(s) / int(n) - hf_loss) < 1e-4, (float(s) / int(n), hf_loss)


def ck_tok_bos(run: Path) -> int:
    from quipu.trainer.tokenizer import TextTokenizer
    return TextTokenizer.load(json.loads((run / "prepared.json").read_text())["tokenizer"]).bos_id


@pytest.mark.slow
def test_torchrun_two_processes_match_one(prepared, tmp_path):
    """Same global batch on 1 and 2 gloo processes (DDP under torchrun, FSDP2): same loss curve
    within 1e-4 relative. (The one process runs here; FSDP2's ranks as tests/ranks.py starts them.)"""
    over = {"train.max_steps": 20, "eval.every": 100, "checkpoint.every": 100, "train.batch_size": 4, "train.micro_batch": 2}
    one = new_run(prepared, tmp_path, "one")
    train(load_config(TrainConfig, data=base_config(one, **over)), one)
    base = losses(one)
    assert len(base) == 20
    ddp, fsdp = new_run(prepared, tmp_path, "ddp2"), new_run(prepared, tmp_path, "fsdp2")
    r = torchrun(2, base_config(ddp, **over, **{"distributed.strategy": "ddp"}), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    np.testing.assert_allclose(losses(ddp), base, rtol=1e-4)
    r = launch_ranks(2, base_config(fsdp, **over, **{"distributed.strategy": "fsdp"}), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    np.testing.assert_allclose(losses(fsdp), base, rtol=1e-4)   # FSDP2 (fully_shard) as well


# ---- command line ------------------------------------------------------------------------------------

def test_cli_blend_errors_fail_before_training(prepared, tmp_path, capsys):
    from quipu.flows.cli import main
    cfg = tmp_path / "bad.json"
    cfg.write_text(json.dumps(base_config(tmp_path / "run", **{"data.phases": [{"sources": [{"dataset": "nowhere", "weight": 1.0}]}]})))
    assert main(["train", str(cfg)]) == 2
    assert "data.phases[0].sources[0].dataset: no curated dataset named 'nowhere'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert main(["train", str(cfg), "--set", "data.phases=[{sources: [{dataset: tr-en, weight: 0.6}, {dataset: tr-es, weight: 0.6}]}]"]) == 2
    assert "weights sum to 1.2, not 1" in capsys.readouterr().err
    assert main(["train", str(cfg), "--set", "data.phases=[{sources: [{dataset: tr-en, weight: 1}]}, "
                 "{name: late, start_step: 99, sources: [{dataset: tr-es, weight: 1}]}]"]) == 2
    assert "data.phases[1] ('late'): start_step 99 is past the end of training" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_plan_command(capsys):
    from quipu.flows.cli import main
    assert main(["plan", "--params", "70e9", "--tokens", "2e12", "--gpus", "256", "--peak-flops", "1.979e15", "--mfu", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "8.400e+23 FLOPs" in out and "38.38 days" in out
    from quipu.trainer.plan import chinchilla_optimal
    n, d = chinchilla_optimal(6 * 70e9 * 1.4e12)
    assert n == pytest.approx(70e9) and d == pytest.approx(1.4e12)


@pytest.mark.slow
def test_cli_train_flow_and_export(prepared, tmp_path, prefect_server, capsys):
    """`quipu train` (the tokenize-train flow, in-process against the session's server) and `quipu export`."""
    from quipu.flows.cli import main
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(base_config(tmp_path / "unused")))
    out = tmp_path / "cli-run"
    assert main(["train", str(cfg), "--output", str(out), "--max-steps", "4", "--set", "export_hf=true"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert f"loss curve: {out / 'loss.png'}" in printed and "sample:" in printed
    # per-source and per-language held-out bits per byte: in the summary (stdout) and on the eval step's line (stderr)
    groups = r"all [\d.]+ \| source tr-en [\d.]+, tr-es [\d.]+ \| lang en [\d.]+, es [\d.]+"
    assert re.search("held-out bits/byte: " + groups, printed), printed
    assert re.search(r"step +4/4 .*\n +held-out bits/byte " + groups, captured.err), captured.err[-2000:]
    assert (out / "loss.png").exists() and (out / "hf" / "config.json").exists()
    assert len(losses(out)) == 4
    assert main(["export", str(out), "--hf", str(tmp_path / "hf2")]) == 0
    assert (tmp_path / "hf2" / "model.safetensors").exists() and (tmp_path / "hf2" / "tokenizer.json").exists()
    model = registry.get_model(None, "llm")
    assert model is not None and model["path"] == str(out / "hf")
    assert main(["export", str(tmp_path / "nowhere"), "--hf", str(tmp_path / "hf3")]) == 2


# ---- sharded checkpoints (torch.distributed.checkpoint) ----------------------------------------------

def test_sharded_checkpoint_one_process_resumes_exactly_and_loads_safely(prepared, tmp_path):
    """format: sharded without torchrun: a DCP folder per checkpoint, keep_last, exact resume, and
    metadata that would unpickle code is refused."""
    from quipu.trainer.checkpoint import UnsafeCheckpoint, list_checkpoints, load_sharded
    over = {"checkpoint.format": "sharded", "checkpoint.every": 2, "checkpoint.keep_last": 2}
    straight = new_run(prepared, tmp_path, "sh-straight")
    train(load_config(TrainConfig, data=base_config(straight, **over)), straight)
    cks = list_checkpoints(straight)
    assert [p.name for p in cks] == ["step-0000006", "step-0000008"] and all(p.is_dir() for p in cks)
    split = new_run(prepared, tmp_path, "sh-split")
    train(load_config(TrainConfig, data=base_config(split, **over, **{"train.stop_at_step": 4})), split)
    train(load_config(TrainConfig, data=base_config(split, **over, **{"checkpoint.async_save": True})), split, resume=True)
    assert losses(split) == losses(straight)

    # `quipu export --hf` of a sharded checkpoint (streamed tensor by tensor): transformers' logits are ours
    from transformers import AutoModelForCausalLM

    from quipu.trainer.export import export_hf
    hf = AutoModelForCausalLM.from_pretrained(export_hf(straight, tmp_path / "hf"), dtype=torch.float32).eval()
    mcfg = ModelConfig.model_validate(torch.load(cks[-1] / "trainer.pt", weights_only=True)["model_config"])
    ours = Llama(mcfg)
    load_sharded(cks[-1], ours, None)
    ids = torch.randint(0, mcfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours.eval()(ids), atol=1e-5, rtol=1e-5)
    # the BPB scorer (ablate's) reads a sharded checkpoint as it reads a one-file one
    from quipu.trainer.bpb import HeldoutDoc, score_checkpoint, score_hf
    doc = [HeldoutDoc("s", "en", "0", "the cat sees the river near the old house")]
    tok_dir = json.loads((prepared / "prepared.json").read_text())["tokenizer"]
    assert score_checkpoint(cks[-1], tok_dir, doc, 32)[0].nll == pytest.approx(score_hf(tmp_path / "hf", doc, 32)[0].nll, rel=1e-5)

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))
    import pickle
    meta = cks[-1] / "state" / ".metadata"
    meta.write_bytes(pickle.dumps(Evil()))
    with pytest.raises(UnsafeCheckpoint, match="posix.system|os.system"):
        load_sharded(cks[-1], ours, None)


KILL_MID_SAVE = '''
import os, signal, sys
import torch.distributed.checkpoint.filesystem as fs
from quipu.trainer import checkpoint
saving = {"step": 0}
start, write_item = checkpoint.ShardedSave.start, fs._write_item
def start_(self, *a, **k):
    saving["step"] = self.step
    return start(self, *a, **k)
def write_item_(*a, **k):
    # rank 1 dies inside DCP's write of the step-%d checkpoint, its shards half written
    if saving["step"] == %d and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return write_item(*a, **k)
checkpoint.ShardedSave.start, fs._write_item = start_, write_item_
from quipu.flows.train_dist import main
sys.exit(main(sys.argv[1:]))
'''


def torchrun(nproc: int, cfg: dict, tmp_path: Path, *args: str, script: str | None = None) -> subprocess.CompletedProcess:
    cfg_path = config_file(cfg, tmp_path)
    target = [script] if script else ["-m", "quipu.flows.train_dist"]
    port = 29000 + (os.getpid() * 7 + len(cfg["output"]) * 13 + nproc) % 3000
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(port),
           *target, str(cfg_path), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_sharded_checkpoint_reshards_and_survives_a_kill(prepared, tmp_path):
    """FSDP2 on 2 gloo ranks, DCP checkpoints every 2 steps. Rank 1 is SIGKILLed while writing step 6
    (under torchrun): step 4 stays the newest checkpoint; resuming it on 2 ranks and on 1 process
    (2 -> 1), and a 1-process sharded step 4 resumed on 2 ranks (1 -> 2), all reach step 8 with the
    losses of the uninterrupted 2-rank run within 1e-5. (Ranks but the killed run's: tests/ranks.py.)"""
    from quipu.trainer.checkpoint import list_checkpoints
    over = {"train.max_steps": 8, "checkpoint.every": 2, "checkpoint.keep_last": 2, "eval.every": 100,
            "eval.sample_tokens": 0, "distributed.strategy": "fsdp"}
    straight = new_run(prepared, tmp_path, "dcp-straight")
    r = launch_ranks(2, base_config(straight, **over), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    base = losses(straight)
    assert len(base) == 8 and sorted(p.name for p in (straight / "checkpoints" / "step-0000008").iterdir()) == \
        ["rng-0.pt", "rng-1.pt", "state", "trainer.pt"]

    killed = new_run(prepared, tmp_path, "dcp-killed")
    script = tmp_path / "kill_mid_save.py"
    script.write_text(KILL_MID_SAVE % (6, 6))
    r = torchrun(2, base_config(killed, **over), tmp_path, script=str(script))
    assert r.returncode != 0 and "SIGKILL" in r.stderr + r.stdout, r.stderr[-2000:]
    assert [p.name for p in list_checkpoints(killed)] == ["step-0000002", "step-0000004"]
    partial = [p for p in (killed / "checkpoints").iterdir() if p.name.startswith(".tmp-quipu-step-0000006")]
    assert partial and (partial[0] / "state").is_dir()       # half a save, never a checkpoint
    on_one = tmp_path / "dcp-killed-1"
    shutil.copytree(killed, on_one)

    r = launch_ranks(2, base_config(killed, **over, **{"checkpoint.async_save": True}), tmp_path, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert not partial[0].exists()                            # cleaned up on the next start
    assert [p.name for p in list_checkpoints(killed)] == ["step-0000006", "step-0000008"]   # async saves, in place
    np.testing.assert_allclose(losses(killed), base, rtol=0, atol=1e-5)

    train(load_config(TrainConfig, data=base_config(on_one, **over)), on_one, resume=True)     # 2 -> 1
    np.testing.assert_allclose(losses(on_one), base, rtol=0, atol=1e-5)

    from_one = new_run(prepared, tmp_path, "dcp-from-1")                                        # 1 -> 2
    train(load_config(TrainConfig, data=base_config(from_one, **over, **{"train.stop_at_step": 4,
                                                                          "checkpoint.format": "sharded"})), from_one)
    r = launch_ranks(2, base_config(from_one, **over), tmp_path, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    np.testing.assert_allclose(losses(from_one), base, rtol=0, atol=1e-5)


INIT_FROM_PROBE = '''
import json, os, resource, sys
import torch, transformers, safetensors.torch  # imported before measuring: the load is what is measured
import torch.distributed.fsdp, torch.distributed.tensor._utils
from quipu.trainer.train import Dist, TrainConfig, init_model
folder, out = sys.argv[1], sys.argv[2]
cfg = TrainConfig.model_validate({"data": {"phases": [{"sources": [{"dataset": "unused", "weight": 1.0}]}]},
                                  "model": {"init_from": folder}, "distributed": {"strategy": "fsdp"}})
def rss_mb():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) / 1024
world = Dist(torch.device("cpu"))
before = rss_mb()
raw, model, mcfg = init_model(cfg, 0, torch.device("cpu"), world)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
ids = torch.arange(24).reshape(2, 12) * 37 % mcfg.vocab_size
with torch.no_grad():
    logits = model.eval()(ids)
if world.rank == 0:
    torch.save(logits, os.path.join(out, "logits.pt"))
with open(os.path.join(out, f"probe-{world.rank}.json"), "w") as fh:
    json.dump({"world": world.world, "rank": world.rank, "load_mb": round(peak - before, 1), "peak_mb": round(peak, 1)}, fh)
if world.enabled:
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
'''


@pytest.mark.slow
def test_init_from_loads_each_ranks_slices(tmp_path):
    """model.init_from a HF Llama folder under FSDP2 on 2 gloo ranks: built on the meta device and
    filled with each rank's slices, the logits are transformers'; the memory the load costs each rank
    is about half of what one process needs for the whole model (printed)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=12,
                                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128,
                                      tie_word_embeddings=False)).eval()
    folder = tmp_path / "hf-llama"
    hf.save_pretrained(folder, safe_serialization=True)
    size_mb = sum(p.numel() * 4 for p in hf.parameters()) / 2**20
    probe = tmp_path / "probe.py"
    probe.write_text(INIT_FROM_PROBE)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {}
    for n in (1, 2):
        out = tmp_path / f"out{n}"
        out.mkdir()
        launch = [sys.executable] if n == 1 else [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                                  "--master_port", str(29000 + (os.getpid() * 11) % 3000)]
        r = subprocess.run([*launch, str(probe), str(folder), str(out)], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        runs[n] = [json.loads((out / f"probe-{rank}.json").read_text()) for rank in range(n)]
        ids = torch.arange(24).reshape(2, 12) * 37 % 8192
        with torch.no_grad():
            torch.testing.assert_close(torch.load(out / "logits.pt"), hf(ids).logits, atol=1e-4, rtol=1e-4)
    single = runs[1][0]["load_mb"]
    per_rank = [r["load_mb"] for r in runs[2]]
    print(f"\ninit_from of a {size_mb:.0f} MiB model: load RSS one process {single} MiB, per rank of 2 {per_rank} MiB "
          f"(ratio {max(per_rank) / single:.2f}); peak RSS one process {runs[1][0]['peak_mb']} MiB, "
          f"per rank {[r['peak_mb'] for r in runs[2]]} MiB")
    assert len(per_rank) == 2 and single > 0.8 * size_mb
    assert max(per_rank) < 0.7 * single


def test_context_stages_change_rows_rope_and_schedule_and_resume_exactly(prepared, tmp_path):
    """A second phase with longer rows (64 tokens), a new RoPE base and its own warm-up: its batches
    are packed at 64 with the document mask, the rotary tables use the new base, the LR re-warms,
    the checkpoint (and so an export) records the base; a run stopped inside that phase resumes to
    the same losses."""
    from quipu.trainer.train import Trainer
    src = [{"dataset": "tr-en", "weight": 0.7}, {"dataset": "tr-es", "weight": 0.3}]
    over = {"data.phases": [{"name": "short", "sources": src},
                            {"name": "long", "start_step": 4, "sources": src, "seq_len": 64, "rope_theta": 50000.0,
                             "lr_schedule": "rewarm", "warmup_steps": 2, "lr": 1e-3}],
            "schedule.warmup_steps": 1}
    straight = new_run(prepared, tmp_path, "stages")
    cfg = load_config(TrainConfig, data=base_config(straight, **over))
    t = Trainer(cfg, straight)
    x, y, pos, seg = t.batcher.rows(5, range(2))
    assert x.shape == (2, 64) and t.batcher.rows(3, range(2))[0].shape == (2, 32)
    assert (pos[seg != seg[:, :1]] >= 0).all() and (y[:, :-1][np.diff(seg, axis=1) != 0] == -100).all()
    assert t.lr_at(4) == pytest.approx(1e-3 * 0.5) and t.lr_at(5) == pytest.approx(1e-3)   # re-warmed over 2 steps
    assert t.lr_at(3) == pytest.approx(3e-3 * cfg.schedule.fraction(3, 8))                 # the first phase's schedule
    t.run()
    assert t.raw_model.rotary.theta == 50000.0
    rows = [json.loads(r) for r in (straight / "metrics.jsonl").read_text().splitlines()]
    assert [r["tokens"] for r in rows][3:5] == [4 * 4 * 32, 4 * 4 * 32 + 4 * 64]
    from quipu.trainer.checkpoint import latest_checkpoint, load_checkpoint
    assert load_checkpoint(latest_checkpoint(straight))["model_config"]["rope_theta"] == 50000.0

    split = new_run(prepared, tmp_path, "stages-split")
    train(load_config(TrainConfig, data=base_config(split, **over, **{"train.stop_at_step": 6, "checkpoint.every": 2})), split)
    train(load_config(TrainConfig, data=base_config(split, **over)), split, resume=True)
    assert losses(split) == losses(straight)
