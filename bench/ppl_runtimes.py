"""Does another CPU runtime make a deep student fast enough? (issue 20, "int8 or ONNX Runtime
inference if it is really faster here"; bench/RESULTS.md, "Runtimes for the deep student").

One process, one thread, the same documents in the same length batches, alternating rounds: the
teacher (what `quipu ppl label` runs: bf16 autocast), the student as quipu runs it (bf16 weights), and
the same student under torch fp32, torch int8 dynamic quantisation (`quipu ppl eval --quantize`),
torch.compile (bf16), ONNX Runtime fp32 and ONNX Runtime int8 (dynamic, QInt8 weights). Prints docs/s,
the ratio to the teacher (median of the rounds) and each runtime's fidelity to the bf16 student
(Spearman and largest difference of the standardised prediction).

ONNX Runtime is not a quipu dependency: `pip install onnxruntime onnxscript` for those two rows
(they are reported as skipped otherwise).

    QUIPU_HOME=... python bench/ppl_runtimes.py --student runs/ppl-loso-t12-frozen-0 \
        [--input bench/out/ppl/timing-600.jsonl] [--teacher-docs 48] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from quipu.trainer.teacher import TeacherConfig, load_teacher
from quipu.scoring.wayra import WayraStudent, length_batches, pad_batch
from quipu.trainer.wayra_train import spearman

BATCH = 16      # quipu's default scoring batch


class DocPrediction(nn.Module):
    """The student's standardised document prediction only: what an exported graph returns."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(ids, mask)[0]


def fp32_student(path: str) -> WayraStudent:
    s = WayraStudent.load(path)
    s.model.float()
    s.model.arch = s.model.arch.model_copy(update={"bf16": False})
    return s


def batched(student: WayraStudent, texts: list[str], forward) -> list[float]:
    """`forward(ids, mask) -> standardised predictions` over quipu's length batches; the texts are
    tokenised in every run, as `quipu ppl eval` times the student (the teacher's time includes its own)."""
    seqs = student.encode(texts)
    out = [0.0] * len(seqs)
    for idx in length_batches([len(s) for s in seqs], BATCH):
        ids, mask = pad_batch([seqs[i] for i in idx], student.pad_id)
        for i, v in zip(idx, forward(ids, mask)):
            out[i] = float(v)
    return out


def torch_runner(student: WayraStudent, texts, module=None):
    module = module if module is not None else DocPrediction(student.model).eval()

    def run():
        with torch.inference_mode(), student.model.precision():
            return batched(student, texts, lambda i, m: module(i, m).float().tolist())
    return run


def onnx_runners(path: str, texts, workdir: Path) -> dict:
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        return {"ort fp32": f"skipped: {e}", "ort int8": f"skipped: {e}"}
    student = fp32_student(path)
    ids, mask = pad_batch(student.encode(texts[:BATCH]), student.pad_id)
    batch, seq = torch.export.Dim("batch", min=1, max=4096), torch.export.Dim("seq", min=2, max=student.arch.max_len)
    fp32, int8 = workdir / "student.onnx", workdir / "student-int8.onnx"
    torch.onnx.export(DocPrediction(student.model).eval(), (ids, mask), str(fp32), dynamo=True, optimize=True,
                      input_names=["ids", "mask"], output_names=["pred"],
                      dynamic_shapes={"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}})
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)

    def runner(model_path: Path):
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        return lambda: batched(student, texts, lambda i, m: session.run(None, {"ids": i.numpy(), "mask": m.numpy()})[0])
    return {"ort fp32": runner(fp32), "ort int8": runner(int8)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--student", required=True)
    ap.add_argument("--input", default="bench/out/ppl/timing-600.jsonl")
    ap.add_argument("--teacher-docs", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None, help="JSON report (default: bench/out/ppl/runtimes-<student>.json)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    texts = [json.loads(line)["text"] for line in open(args.input)]
    bf16 = WayraStudent.load(args.student)
    teacher = load_teacher(TeacherConfig(max_tokens=bf16.arch.max_len - 1, threads=1, device="cpu"))
    timing = texts[::max(1, len(texts) // args.teacher_docs)][:args.teacher_docs]

    runners: dict = {"student, torch bf16 (quipu)": torch_runner(bf16, texts)}
    fp32 = fp32_student(args.student)
    runners["torch fp32"] = torch_runner(fp32, texts)
    runners["torch int8 (quipu --quantize)"] = torch_runner(WayraStudent.load(args.student, quantize=True), texts)
    try:
        compiled = torch.compile(DocPrediction(WayraStudent.load(args.student).model).eval(), dynamic=True)
        runners["torch.compile bf16"] = torch_runner(bf16, texts, compiled)
    except Exception as e:       # no compiler on the machine: say so, measure the rest
        runners["torch.compile bf16"] = f"skipped: {str(e)[:200]}"
    with tempfile.TemporaryDirectory() as tmp:
        runners.update(onnx_runners(args.student, texts, Path(tmp)))
        report: dict = {"student": args.student, "documents": len(texts), "teacher_docs": len(timing),
                        "threads": 1, "batch": BATCH, "runtimes": {}}
        live = {}
        for name, run in runners.items():
            if isinstance(run, str):
                report["runtimes"][name] = run
                continue
            t0 = time.perf_counter()
            try:
                live[name] = (run, run())       # warm-up (compilation, session start) and the predictions
            except Exception as e:
                report["runtimes"][name] = f"failed: {type(e).__name__}: {str(e)[:200]}"
            print(f"{name}: ready in {time.perf_counter() - t0:.0f}s", flush=True)
        teacher.log_ppl(timing[:2])
        seconds = {name: [] for name in live}
        teacher_s = []
        for r in range(args.rounds):
            part = timing[r::args.rounds]
            t0 = time.perf_counter()
            teacher.log_ppl(part)
            teacher_s.append((time.perf_counter() - t0) / len(part))
            for name, (run, _) in live.items():
                t0 = time.perf_counter()
                run()
                seconds[name].append((time.perf_counter() - t0) / len(texts))
    base = np.array(live["student, torch bf16 (quipu)"][1])
    report["teacher_docs_per_s"] = round(1 / statistics.median(teacher_s), 2)
    for name, (_, pred) in live.items():
        ratios = [t / s for t, s in zip(teacher_s, seconds[name])]
        report["runtimes"][name] = {
            "docs_per_s": round(1 / statistics.median(seconds[name]), 1),
            "x_teacher": round(statistics.median(ratios), 1), "x_teacher_rounds": [round(x, 1) for x in ratios],
            "spearman_vs_bf16_student": round(spearman(pred, base.tolist()), 4),
            "max_abs_diff_vs_bf16_student": round(float(np.max(np.abs(np.array(pred) - base))), 4)}
    out = Path(args.out or f"bench/out/ppl/runtimes-{Path(args.student).name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"teacher: {report['teacher_docs_per_s']} docs/s")
    for name, r in report["runtimes"].items():
        print(f"{name:32s} " + (r if isinstance(r, str) else
              f"{r['docs_per_s']:7.1f} docs/s  {r['x_teacher']:5.1f}x teacher  "
              f"Spearman vs bf16 student {r['spearman_vs_bf16_student']:.4f}  max diff {r['max_abs_diff_vs_bf16_student']:.3f}"))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
