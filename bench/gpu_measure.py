"""Issue 38's GPU measurements in one run on a lent GPU machine (a bare image: torch, transformers,
no quipu install, no network), each stage capped in time and its result written to --out at once:

  lm     bench/fluency_context.py's lm_gain (SmolLM2-135M, whole prefix vs the last 8 tokens, fp32) over
         texts prepared here (`fluency_context.py --lm 50 --prepare`): per-document scores -> lm_scores.jsonl,
         read back here with `fluency_context.py --table-from`
  judge  `hf_judge` (scoring/hf_classifier.py: bf16 autocast, token-budget batches) vs transformers
         `pipeline(..., device=0)` (fp32 and bf16, batch 32, input order) on a BERT-base-shape model
         (bench/judge_throughput.py builds it) over the prepared documents; scores compared
  test   tests/test_perplexity.py::test_stage_on_cuda_matches_cpu under pytest (its body here if pytest fails
         to collect it)
  label  `quipu serve-labeller` (trainer/label_server.py) on the device + `label_documents` over HTTP with
         bounded concurrency, as many documents (<= 500) as the time left allows; anchors: the same prompts
         through the same model's `generate` in-process, one at a time and in left-padded batches

Here (prepare, then the dry run with the same entry point; /work/main/.gpu is what the device gets):
    .venv/bin/python bench/fluency_context.py --lm 50 --prepare T.jsonl && gzip T.jsonl
    .venv/bin/python bench/gpu_measure.py --prepare-docs D.jsonl.gz
    python bench/gpu_measure.py --device cpu --tiny --model M.gguf --lm-texts T.jsonl.gz --docs D.jsonl.gz --out DIR
On the device:
    python3 .gpu/bench/gpu_measure.py --device cuda --model .gpu/smollm2.gguf --lm-texts ... --docs ... --out $OUT
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SUBPACKAGES = ("flows", "tasks", "trainer", "catalog", "demo", "scoring", "synthetic")
RESULTS: dict = {}


def ensure_quipu(repo: Path) -> None:
    """`import quipu.x` from the checkout `repo` whether or not it is installed (the device's bare image):
    a namespace folder of links (pyproject's package-dir map), first on sys.path and on PYTHONPATH for
    the pytest child; the checkout itself last (for `tests`)."""
    shim = Path(tempfile.mkdtemp(prefix="quipu-shim-"))
    (shim / "quipu").mkdir()
    for sub in SUBPACKAGES:
        (shim / "quipu" / sub).symlink_to(repo.resolve() / sub)
    sys.path.insert(0, str(shim))
    sys.path.append(str(repo.resolve()))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH")) if p)


def read_jsonl(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def save(out: Path, stage: str, value) -> None:
    RESULTS[stage] = value
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(RESULTS, indent=1, ensure_ascii=False))
    tmp.replace(out / "results.json")
    print(f"== {stage}: {json.dumps(value, ensure_ascii=False)[:1500]}", flush=True)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def sync(device: str) -> None:
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


# ---- the stages ----------------------------------------------------------------------------------

def stage_env(args) -> dict:
    import torch
    import transformers
    env = {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.cuda.is_available(),
           "python": sys.version.split()[0], "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True) if args.device == "cuda" else None
    env["nvidia_smi"] = smi.stdout.strip() if smi else None
    return env


def stage_lm(args, out: Path, deadline: float) -> dict:
    from bench.fluency_context import lm_scorer, score_prepared
    ns = argparse.Namespace(window=8, tokens=64 if args.tiny else 256, model=args.model, device=args.device)
    src = args.lm_texts
    if args.tiny:     # two texts a class of the first two sources
        rows, seen = [], {}
        for r in read_jsonl(src):
            group, key = (r["lang"], r["held"]), (r["lang"], r["held"], r["kind"])
            if (group in {k[:2] for k in seen} or len({k[:2] for k in seen}) < 2) and seen.get(key, 0) < 2:
                seen[key] = seen.get(key, 0) + 1
                rows.append(r)
        src = str(out / "lm_texts_tiny.jsonl")
        Path(src).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    _, t_load = timed(lambda: lm_scorer(ns.window, ns.tokens, ns.model, ns.device))
    n_texts = len(read_jsonl(src))
    groups, t = timed(lambda: score_prepared(src, str(out / "lm_scores.jsonl"), ns, deadline))
    dump = out / "lm_scores.jsonl"
    scored = sum(len(json.loads(x)[k]) for x in dump.open() for k in ("prose", "demo", "backoff")) if dump.exists() else 0
    return {"texts": n_texts, "scored": scored, "groups": groups, "tokens": ns.tokens, "load_s": round(t_load, 1),
            "seconds": round(t, 1), "docs_per_s": round(scored / max(t, 1e-9), 1), "batching": "one text a forward (2 rows)"}


def stage_judge(args, docs: list[dict], work: Path) -> dict:
    import torch
    from transformers import pipeline

    from bench.judge_throughput import bert_base_classifier
    from quipu.scoring.hf_classifier import HfClassifier
    from quipu.trainer.wayra_train import spearman
    texts = [d["text"] for d in docs]
    folder, t_build = timed(lambda: bert_base_classifier(work / "bert-base", texts))
    ours = HfClassifier(folder, device=args.device, batch_size=32)
    dev = 0 if args.device == "cuda" else -1
    pipes = {"pipeline fp32, batch 32": pipeline("text-classification", model=str(folder), tokenizer=str(folder),
                                                 device=dev, function_to_apply="none")}
    if args.device == "cuda":
        try:   # the fairer speed anchor on a GPU (hf_judge computes in bf16 there)
            pipes["pipeline bf16, batch 32"] = pipeline("text-classification", model=str(folder), tokenizer=str(folder),
                                                        device=dev, function_to_apply="none", dtype=torch.bfloat16)
        except Exception as e:
            print(f"pipeline bf16: {type(e).__name__}: {e}", flush=True)
    warm = texts[:4 if args.tiny else 64]
    ours.score(warm)
    for p in pipes.values():
        p(warm, batch_size=32, truncation=True, max_length=512)     # warm up
    sync(args.device)
    a, ta = timed(lambda: (ours.score(texts), sync(args.device))[0])
    rows = [{"scorer": f"hf_judge ({'bf16 autocast, token-budget batches' if dev == 0 else 'fp32, batches of 32'})",
             "docs": len(texts), "seconds": round(ta, 2), "docs_per_s": round(len(texts) / ta, 1)}]
    print(f"hf_judge: {len(texts)} docs in {ta:.1f} s", flush=True)
    if args.device == "cuda":   # is autocast over fp32 weights what costs hf_judge its speed on a GPU?
        ours.model.to(torch.bfloat16)
        ours.score(warm)
        sync(args.device)
        c, tc = timed(lambda: (ours.score(texts), sync(args.device))[0])
        rows.append({"scorer": "hf_judge with its weights cast to bf16 (same autocast, same batches)", "docs": len(texts),
                     "seconds": round(tc, 2), "docs_per_s": round(len(texts) / tc, 1),
                     "max_abs_diff_vs_autocast": round(max(abs(x - y) for x, y in zip(a, c)), 6),
                     "spearman_vs_autocast": round(float(spearman(a, c)), 6)})
        print(f"hf_judge bf16 weights: {len(texts)} docs in {tc:.1f} s", flush=True)
    for name, p in pipes.items():
        b, tb = timed(lambda: [r["score"] for r in p(texts, batch_size=32, truncation=True, max_length=512)])
        rows.append({"scorer": name, "docs": len(texts), "seconds": round(tb, 2), "docs_per_s": round(len(texts) / tb, 1),
                     "ours_vs_it_speed": round(tb / ta, 2), "max_abs_diff": round(max(abs(x - y) for x, y in zip(a, b)), 6),
                     "spearman": round(float(spearman(a, b)), 6), "score_sd": round(float(torch.tensor(b).std()), 4)})
        print(f"{name}: {len(texts)} docs in {tb:.1f} s", flush=True)
    return {"model": "BERT-base shape, random weights, WordPiece from the documents", "build_s": round(t_build, 1), "rows": rows}


def stage_test(args, repo: Path, out: Path, seconds: float) -> dict:
    """The GPU-only test under pytest; its body inline when pytest cannot run it."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "addopts=",
           "tests/test_perplexity.py::test_stage_on_cuda_matches_cpu"]
    r = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=max(30.0, seconds))
    (out / "test_log.txt").write_text(r.stdout[-20000:] + r.stderr[-5000:])
    tail = (r.stdout.strip().splitlines() or [""])[-1]
    res = {"pytest_rc": r.returncode, "pytest_summary": tail}
    if r.returncode not in (0, 1) or "skipped" in tail:
        res["inline"] = test_body_inline(args.device)
    return res


def test_body_inline(device: str) -> dict:
    import pyarrow as pa

    from tests.test_perplexity import noisy_texts
    from quipu.scoring.wayra import WayraArch
    from quipu.tasks.perplexity import PerplexityConfig, Scorer
    from quipu.trainer.wayra_train import DistillSettings, distill, spearman
    texts, noise = noisy_texts(160)
    arch = WayraArch(vocab_size=320, d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=48)
    student, _ = distill(texts, [1.0 + 4.0 * p for p in noise], arch,
                         DistillSettings(epochs=5, batch_size=16, lr=3e-3, threads=1), log=lambda m: None)
    d = Path(tempfile.mkdtemp(prefix="student-"))
    student.save(d, {"teacher": "noise-fraction"})
    texts = noisy_texts(300, seed=31)[0]
    t = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts, "lang": ["en"] * len(texts)})
    models = {"student": str(d), "kenlm": {}}
    dev = Scorer(PerplexityConfig(enabled=True, device=device), models)
    cpu = Scorer(PerplexityConfig(enabled=True, device="cpu"), models)
    rho = float(spearman(dev.score(t)["ppl_wayra"], cpu.score(t)["ppl_wayra"]))
    return {"device": str(dev.student.device), "spearman": round(rho, 6), "passed": dev.student.device.type == device and rho > 0.99}


def batched_generate(gen, prompts: list[list[int]], max_new: int, batch: int) -> list[tuple[str, int]]:
    """(answer, answer tokens) per prompt: left-padded greedy batches, as a batching server would run them."""
    import torch
    model, tok = gen.teacher.model, gen.teacher.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    res: dict[int, tuple[str, int]] = {}
    for s in range(0, len(order), batch):
        idx = order[s:s + batch]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i in idx], device=gen.teacher.device)
        mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in idx], device=gen.teacher.device)
        with torch.inference_mode():
            o = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False, pad_token_id=pad)
        for r, i in enumerate(idx):
            new = o[r, width:].tolist()
            n = next((k + 1 for k, t in enumerate(new) if t == tok.eos_token_id), len(new))
            res[i] = (tok.decode(new[:n], skip_special_tokens=True), n)
    return [res[i] for i in range(len(prompts))]


def stage_label(args, docs: list[dict], work: Path, seconds: float) -> dict:
    from quipu.trainer.label_server import Generator, make_server
    from quipu.trainer.llm_labels import LabelConfig, label_documents, parse_score
    gen = Generator(args.model, device=args.device)
    server = make_server(gen, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    inp = work / "label-in.jsonl"
    inp.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    cfg = LabelConfig(endpoint=f"http://127.0.0.1:{server.server_address[1]}/v1", input=[str(inp)], output=str(work / "labels"),
                      max_chars=1500, max_tokens=48, concurrency=args.concurrency, progress_every_s=15)
    msgs = [[{"role": "user", "content": cfg.prompt(d["lang"]).replace("{text}", d["text"][:cfg.max_chars])}] for d in docs]
    k = 2 if args.tiny else 8
    _, t_probe = timed(lambda: [gen.complete(m, cfg.max_tokens) for m in msgs[:k]])     # warm-up and rate
    n = max(k, min(len(docs), args.label_docs, int(k / t_probe * seconds * 0.5)))
    print(f"label: probe {k / t_probe:.2f} docs/s -> {n} documents over HTTP", flush=True)
    cfg = cfg.model_copy(update={"limit": n})
    try:
        report, t_flow = timed(lambda: label_documents(cfg, log=lambda m: print("  " + m, flush=True)))
    finally:
        server.shutdown()
        server.server_close()
    c = report["this_run"]
    m = min(n, max(k, int(n * 0.3)))
    seq, t_seq = timed(lambda: [gen.complete(x, cfg.max_tokens) for x in msgs[:m]])
    nb = min(len(docs), args.label_docs)     # batches are cheap: all the documents asked for
    ids = [gen.prompt_ids(x) for x in msgs[:nb]]
    bat, t_bat = timed(lambda: batched_generate(gen, ids, cfg.max_tokens, args.gen_batch))
    agree = sum(a == b[0] for (a, _, _), b in zip(seq, bat)) / len(seq)
    agree_score = sum(parse_score(a)[0] == parse_score(b[0])[0] for (a, _, _), b in zip(seq, bat)) / len(seq)
    answered = sum(parse_score(b[0])[0] is not None for b in bat)
    scored = sum(s["scored"] for s in report["by_lang"].values())
    tok_in = sum(len(i) for i in ids)
    return {"model": gen.name, "device": str(gen.teacher.device), "max_tokens": cfg.max_tokens, "max_chars": cfg.max_chars,
            "rows": [
                {"scorer": f"quipu label -> serve-labeller over HTTP, concurrency {cfg.concurrency}", "docs": n,
                 "seconds": round(t_flow, 1), "docs_per_s": round(n / t_flow, 2),
                 "tokens_per_s": round((c["tokens_in"] + c["tokens_out"]) / t_flow, 1),
                 "tokens_out_per_s": round(c["tokens_out"] / t_flow, 1), "per_1000_docs": c["per_1000_docs"], "scored": scored},
                {"scorer": "same prompts, model.generate in-process, one at a time (anchor)", "docs": m,
                 "seconds": round(t_seq, 1), "docs_per_s": round(m / t_seq, 2),
                 "tokens_out_per_s": round(sum(x[2] for x in seq) / t_seq, 1)},
                {"scorer": f"same prompts, model.generate in-process, left-padded batches of {args.gen_batch}", "docs": nb,
                 "seconds": round(t_bat, 1), "docs_per_s": round(nb / t_bat, 2),
                 "tokens_per_s": round((tok_in + sum(x[1] for x in bat)) / t_bat, 1),
                 "tokens_out_per_s": round(sum(x[1] for x in bat) / t_bat, 1),
                 "gpu_seconds_per_1000_docs": round(1000 * t_bat / nb, 1), "with_a_score": answered,
                 "same_answer_as_one_at_a_time": round(agree, 3), "same_score_as_one_at_a_time": round(agree_score, 3)}]}


# ---- here: the documents for `judge` and `label` --------------------------------------------------

def prepare_docs(path: str, n: int, shared: Path) -> None:
    from bench.judge_throughput import documents
    docs = documents(shared, n)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for d in docs:   # hf_judge reads <= 512 tokens, the labeller 1,500 characters
            fh.write(json.dumps({"id": d["id"], "lang": d["lang"], "text": d["text"][:3000]}, ensure_ascii=False) + "\n")
    print(f"{len(docs)} documents -> {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prepare-docs", default="", help="write the judge/label documents (gzip JSON lines) here and stop")
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a few documents a stage: the dry run on a CPU")
    ap.add_argument("--model", default="", help="SmolLM2-135M-Instruct (.gguf or HF folder)")
    ap.add_argument("--lm-texts", default="")
    ap.add_argument("--docs", default="")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/out/gpu"))
    ap.add_argument("--repo", default=".", help="the quipu checkout (imported through a shim when not installed)")
    ap.add_argument("--budget-s", type=float, default=360, help="wall seconds for all stages")
    ap.add_argument("--stages", default="lm,judge,test,label")
    ap.add_argument("--judge-docs", type=int, default=2000)
    ap.add_argument("--label-docs", type=int, default=500)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--gen-batch", type=int, default=64)
    args = ap.parse_args()
    if args.prepare_docs:
        prepare_docs(args.prepare_docs, args.judge_docs, Path(args.shared))
        return 0
    t0 = time.time()
    end = t0 + args.budget_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ensure_quipu(Path(args.repo))
    stages = args.stages.split(",")
    docs = read_jsonl(args.docs) if args.docs else []
    if args.tiny:
        args.judge_docs, args.label_docs = 12, 4
    work = Path(tempfile.mkdtemp(prefix="gpu-measure-"))
    save(out, "env", stage_env(args))
    # lm first (the decision waits for it) but capped, so that every other stage still gets its time
    plan = {"lm": lambda: stage_lm(args, out, t0 + 0.45 * args.budget_s),
            "judge": lambda: stage_judge(args, docs[:args.judge_docs], work),
            "test": lambda: stage_test(args, Path(args.repo), out, min(150.0, end - time.time() - 60)),
            "label": lambda: stage_label(args, docs, work, max(20.0, end - time.time() - 25))}
    for name in stages:
        if time.time() > end:
            save(out, name, {"error": "no time left"})
            continue
        try:
            res, t = timed(plan[name])
            save(out, name, {**res, "stage_s": round(t, 1)})
        except Exception as e:   # one stage's failure must not cost the others
            import traceback
            traceback.print_exc()
            save(out, name, {"error": f"{type(e).__name__}: {str(e)[:500]}"})
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
