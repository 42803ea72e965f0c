"""`quipu ppl eval`: how well a distilled student (quipu.scoring.wayra) and KenLM rank documents as the
teacher LLM does, and how fast each is, measured in one run on held-out documents.

`evaluate` gives Spearman/Pearson of the student's (and KenLM's) log-perplexity with the teacher's,
overall, per language and per `source`; the CCNet bucket agreement (`bucket_agreement`); and the
docs/s of teacher, student and KenLM. No Prefect here: flows/ppl_cli.py calls it.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from quipu.catalog.errors import UserError
from quipu.trainer.teacher import TeacherConfig, load_teacher
from quipu.trainer.text_source import read_documents


def bucket_agreement(pred: list[float], truth: list[float], langs: list[str], head: float = 30.0,
                     tail: float = 60.0) -> dict:
    """How often the student puts a document in the teacher's CCNet bucket (head <= 30th percentile <
    middle <= 60th < tail, percentiles per language over these documents, as the stage computes them):
    the fraction in the same bucket, overall and per language, and the teacher x student counts."""
    import numpy as np
    same, total, by_lang, matrix = 0, 0, {}, {}
    names = ("head", "middle", "tail")
    for lang in sorted(set(langs)):
        ix = [i for i, g in enumerate(langs) if g == lang]
        if len(ix) < 3:
            continue
        p, t = np.asarray([pred[i] for i in ix]), np.asarray([truth[i] for i in ix])
        bp = np.digitize(p, np.percentile(p, [head, tail]), right=True)
        bt = np.digitize(t, np.percentile(t, [head, tail]), right=True)
        agree = int((bp == bt).sum())
        by_lang[lang] = {"n": len(ix), "same_bucket": round(agree / len(ix), 4),
                         "tail_recall": round(float(((bp == 2) & (bt == 2)).sum() / max(1, (bt == 2).sum())), 4)}
        for a, b in zip(bt, bp):
            key = f"{names[a]}->{names[b]}"
            matrix[key] = matrix.get(key, 0) + 1
        same += agree
        total += len(ix)
    return {"same_bucket": round(same / total, 4) if total else None, "by_lang": by_lang,
            "teacher_to_student": dict(sorted(matrix.items())), "percentiles": [head, tail]}


def student_window(student_dir: str) -> int | None:
    """The teacher window (tokens) a student was distilled on, from its config.json: the
    `teacher_max_tokens` distillation wrote, else (`head: token`) what it reads after BOS."""
    from quipu.catalog.files import read_json
    try:
        cfg = read_json(Path(student_dir) / "config.json")
        if cfg.get("teacher_max_tokens"):
            return int(cfg["teacher_max_tokens"])
        arch = cfg.get("arch") or {}
        return int(arch["max_len"]) - 1 if arch.get("head") == "token" else None
    except Exception:   # a missing or bad config is reported by WayraStudent.load, naming the path
        return None


def evaluate(student_dir: str, input_path: str, teacher_cfg: TeacherConfig, kenlm: str | None = None,
             timing_docs: int = 64, quantize: bool = False, threads: int | None = None, batch_size: int = 16,
             log=print, device: str = "cpu", rounds: int = 3, student_max_len: int | None = None,
             predictions_out: str | None = None) -> dict:
    """Correlations with the teacher on held-out documents (overall, per language, per `source` when the
    documents have one), CCNet bucket agreement, and docs/s of teacher, student and KenLM measured in the
    same run: `rounds` alternating rounds (teacher on a share of `timing_docs` documents, then the student
    on all documents), the ratio is the median of the rounds' ratios (robust to load on a shared machine).
    `student_max_len`: the student reads fewer tokens than it was trained on (window measurements)."""
    import statistics

    import torch

    from quipu.scoring.kenlm_model import KenLMError, load_kenlm, resolve_kenlm
    from quipu.trainer.teacher import LabelCache
    from quipu.scoring.wayra import StudentError, WayraStudent
    from quipu.trainer.wayra_train import pearson, spearman
    if threads:
        torch.set_num_threads(threads)
    try:  # every model first: a bad path fails before any document is read
        student = WayraStudent.load(student_dir, quantize=quantize, device=device)
        kenlm_models = {lang: load_kenlm(p) for lang, p in resolve_kenlm(kenlm).items()} if kenlm else {}
    except (StudentError, KenLMError) as e:
        raise UserError(str(e)) from None
    teacher = load_teacher(teacher_cfg)
    docs = read_documents([input_path])
    if not docs:
        raise UserError(f"no documents in {input_path}")
    texts = [d["text"] for d in docs]
    truth, label_stats = LabelCache(teacher).label(texts, log=log)
    keep = [i for i, y in enumerate(truth) if not math.isnan(y)]
    # teacher speed: a spread sample, computed afresh (labels may have come from the cache)
    step = max(1, len(texts) // max(1, timing_docs))
    timing = [texts[i] for i in range(0, len(texts), step)][:timing_docs]
    cuda_tokens = teacher_cfg.cuda_batch_tokens if student.device.type == "cuda" else None
    student_batch = batch_size if cuda_tokens is None else 1 << 20
    student.predict_log_ppl(texts[:batch_size], student_batch, student_max_len, cuda_tokens)    # warm-up
    rounds = max(1, min(rounds, len(timing)))
    pred, teacher_s, student_s, ratios = timed_rounds(teacher, timing, rounds,
                                                      lambda: student.predict_log_ppl(texts, student_batch, student_max_len, cuda_tokens))
    kp, kt = [pred[i] for i in keep], [truth[i] for i in keep]
    result = {"n": len(keep),
              "spearman_student": round(spearman(kp, kt), 4),
              "spearman_kenlm": None,
              "pearson_student": round(pearson(kp, kt), 4),
              "teacher_docs_per_s": round(len(timing) / teacher_s, 3),
              "student_docs_per_s": round(rounds * len(texts) / student_s, 3),
              "kenlm_docs_per_s": None}
    if kenlm_models:
        result.update(kenlm_correlation(kenlm_models, docs, keep, truth))
    result.update(group_correlations(docs, keep, pred, truth))
    result["buckets"] = bucket_agreement(kp, kt, [docs[i]["lang"] for i in keep])
    result["speedup_student_vs_teacher"] = round(result["student_docs_per_s"] / result["teacher_docs_per_s"], 1)
    result["speedup_rounds"] = [round(x, 1) for x in ratios]
    result["speedup_median_of_rounds"] = round(statistics.median(ratios), 1)
    result["teacher"] = str(teacher.path)
    result["teacher_max_tokens"] = teacher_cfg.max_tokens
    result["teacher_timing_docs"] = len(timing)
    result["student"] = str(Path(student_dir).resolve())
    result["student_max_len"] = student_max_len or student.arch.max_len
    result["student_params"] = student.n_params()
    result["student_batch_size"] = batch_size
    result["device"] = student.device.type
    result["threads"] = torch.get_num_threads()
    result["labels"] = label_stats
    if predictions_out:
        from quipu.catalog.files import write_bytes_atomic
        lines = "".join(json.dumps({"id": docs[i]["id"], "lang": docs[i]["lang"], "source": docs[i]["source"],
                                    "teacher": float(truth[i]), "student": float(pred[i])}) + "\n" for i in keep)
        write_bytes_atomic(predictions_out, lines.encode())
    return result


def timed_rounds(teacher, timing: list[str], rounds: int, predict) -> tuple[list[float], float, float, list[float]]:
    """`rounds` alternating rounds (the teacher on a share of the timing documents, then `predict`,
    the student on every document): the student's predictions, both total times and each round's
    docs/s ratio."""
    teacher_s = student_s = 0.0
    ratios, pred = [], []
    for r in range(rounds):
        part = timing[r::rounds]
        t0 = time.perf_counter()
        teacher.log_ppl(part)
        ts = time.perf_counter() - t0
        t0 = time.perf_counter()
        pred = predict()
        ss = time.perf_counter() - t0
        teacher_s += ts
        student_s += ss
        ratios.append((len(pred) / ss) / (len(part) / ts))
    return pred, teacher_s, student_s, ratios


def kenlm_correlation(kenlm_models: dict, docs: list[dict], keep: list[int], truth: list[float]) -> dict:
    """KenLM's Spearman with the teacher (documents of a language without a model left out) and docs/s."""
    from quipu.trainer.wayra_train import spearman
    t0 = time.perf_counter()
    klp = []
    for d in docs:
        lm = kenlm_models.get(d["lang"]) or kenlm_models.get("*")
        klp.append(lm.log_ppl(d["text"]) if lm is not None else math.nan)
    kenlm_s = time.perf_counter() - t0
    kk = [i for i in keep if not math.isnan(klp[i])]
    return {"spearman_kenlm": round(spearman([klp[i] for i in kk], [truth[i] for i in kk]), 4),
            "kenlm_docs_per_s": round(len(docs) / kenlm_s, 1), "kenlm_n": len(kk)}


def group_correlations(docs: list[dict], keep: list[int], pred: list[float], truth: list[float]) -> dict:
    """The student's Spearman per language, and per `source` when the documents name one."""
    from quipu.trainer.wayra_train import spearman
    out = {}
    for field in ("lang", "source"):
        groups = sorted({docs[i][field] for i in keep if docs[i][field]})
        if field == "source" and not groups:
            continue
        out[f"by_{field}"] = {g: {"n": len(ix := [i for i in keep if docs[i][field] == g]),
                                  "spearman_student": round(spearman([pred[i] for i in ix], [truth[i] for i in ix]), 4)}
                              for g in groups}
    return out
