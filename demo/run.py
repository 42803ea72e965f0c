"""`quipu demo`: the whole pipeline on the embedded demo corpus, offline, its steps in about 3.5 CPU-minutes.

The demo is an ordered list of named steps (`STEPS`), each a function of one shared `DemoContext`:

    build-corpus  → [quality-train] → [ppl-distill] → curate → [train]

Steps in brackets belong to other parts of quipu and are added at the marked places below. A step
reads what earlier steps left in the context (paths, summaries) and adds what it produced, plus the
lines `quipu demo` prints at the end under "where to look".
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from quipu.demo.quality_step import DEMO_CONFIG, quality_train_step   # the quality-train step
from quipu.demo.ppl_step import ppl_distill_step         # the ppl-distill step
from quipu.demo.train_step import train_step             # the train step

REPO = Path(__file__).resolve().parents[1]


@dataclass
class DemoContext:
    data_dir: Path                      # the demo corpus: raw/ inputs, labels.jsonl, manifest.json
    run_dir: Path                       # the curate run directory
    scale: float = 1.0
    rebuild: bool = False
    label_anew: bool = False            # ppl-distill: the teacher labels every document (no shipped labels)
    overrides: list[str] = field(default_factory=list)   # --set for the curate config
    inputs: list[Path] = field(default_factory=list)
    curate_summary: dict | None = None
    where: list[tuple[str, str]] = field(default_factory=list)   # (what, where) printed at the end
    artifacts: dict[str, object] = field(default_factory=dict)   # what steps hand to later steps


@dataclass
class DemoStep:
    name: str
    run: Callable[[DemoContext], None]
    help: str


# ---- step: build the corpus ------------------------------------------------------------------------

def build_corpus_step(ctx: DemoContext) -> None:
    from quipu.synthetic.corpus import build_demo_corpus, ensure_demo_corpus

    # a package the corpus is built from that is missing raises SourceMissing, a UserError
    if ctx.rebuild:
        files, built = build_demo_corpus(ctx.data_dir, ctx.scale), True
    else:
        files, built = ensure_demo_corpus(ctx.data_dir, ctx.scale)
    ctx.inputs = files
    manifest = json.loads((ctx.data_dir / "manifest.json").read_text())
    langs = ", ".join(f"{k} {v}" for k, v in manifest["languages"].items())
    print(f"demo corpus {'built' if built else 'already built'}: {manifest['records']} records in "
          f"{len(files)} files under {ctx.data_dir / 'raw'} (documents by language: {langs})")
    ctx.where.append(("input corpus", f"{ctx.data_dir / 'raw'}  (what was planted where: {ctx.data_dir / 'labels.jsonl'})"))


# ---- step: curate ----------------------------------------------------------------------------------

def curate_step(ctx: DemoContext) -> None:
    from quipu.catalog.errors import UserError
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig, curate, preflight
    from quipu.synthetic.corpus import built_corpus
    from quipu.flows.runners import make_task_runner

    if not ctx.inputs:
        ctx.inputs = built_corpus(ctx.data_dir, ctx.scale) or []
        if not ctx.inputs:
            raise UserError(f"no demo corpus in {ctx.data_dir}: run the build-corpus step first")
    config = load_config(CurateConfig, str(DEMO_CONFIG), list(ctx.overrides))
    config = CurateConfig.model_validate({**config.model_dump(), "input": [str(p) for p in ctx.inputs],
                                          "output": str(ctx.run_dir)})
    try:  # models the enabled stages need (e.g. a quality classifier from an earlier step)
        preflight(config)
    except (ValueError, OSError) as e:
        raise UserError(str(e)) from None
    ctx.artifacts["curate_config"] = config
    # the demo's run folder is the demo's own: a run of another scale or config replaces it
    summary = curate.with_options(task_runner=make_task_runner(config.runner, config.workers))(config, overwrite=_changed(config))
    ctx.curate_summary = summary
    out = Path(summary["output"])
    ctx.where += [
        ("curated shards", f"{out / 'curated'}/  ({summary['curated']['rows']} documents)"),
        ("stage reports", f"{out}/<stage>/report.json  (Prefect UI: artifacts {config.artifact_prefix}-funnel, "
                          f"{config.artifact_prefix}-stage-<stage>)"),
        ("removed documents", f"{out}/<stage>/removed/*.parquet  (column `reason`)"),
        ("quarantine", f"{out / 'quarantine'}/  (records that could not be read, with `reason`)"),
        ("funnel again", f"quipu report {ctx.run_dir}"),
        ("catalog", f"quipu catalog ls   ·   quipu catalog show {summary['run_id']}"),
    ]


# ---- the steps, in order -----------------------------------------------------------------------------

STEPS: list[DemoStep] = [
    DemoStep("build-corpus", build_corpus_step, "write the demo corpus (WARC + JSONL) from installed packages"),
    DemoStep("quality-train", quality_train_step, "train the fastText quality classifier on a heuristics-only "
                                                  "first pass (kept vs removed), for the curate step's quality stage"),
    # before curate: the curate step's perplexity stage uses the student it distils
    DemoStep("ppl-distill", ppl_distill_step, "distil SmolLM2-135M's perplexity into a small student (and KenLM "
                                              "models when `make kenlm` built lmplz) for the curate step's perplexity stage"),
    DemoStep("curate", curate_step, "run the curate flow with configs/curate/demo.yaml into runs/demo"),
    DemoStep("train", train_step, "tokenize the curated shards and train a tiny Llama (100 steps, at most 2.5 minutes) "
                                  "(configs/train/demo.yaml); prints the loss curve and a sample"),
]


# ---- what the demo prints -------------------------------------------------------------------------

def planted_outcomes(run_dir: Path, labels_path: Path) -> dict[str, dict[str, int]]:
    """For every planted kind (labels.jsonl), where its records ended up: a stage that removed
    them, `curated`, `quarantine`, or `not a document` (WARC requests)."""
    import pyarrow.parquet as pq

    where: dict[str, str] = {}
    stages = [s["name"] for s in json.loads((run_dir / "run.json").read_text())["stages"]]
    for stage in stages:
        for f in sorted((run_dir / stage / "removed").glob("*.parquet")):
            for i in pq.read_table(f, columns=["id"]).column("id").to_pylist():
                where[i] = stage
    for f in sorted((run_dir / "curated").glob("*.parquet")):
        t = pq.read_table(f)
        spans = t.column("pii_spans").to_pylist() if "pii_spans" in t.column_names else [None] * t.num_rows
        for i, found in zip(t.column("id").to_pylist(), spans):
            where[i] = "curated, PII redacted" if found else "curated"
    quarantined: set[tuple[str, str]] = set()
    for f in sorted((run_dir / "quarantine").glob("*.parquet")):
        t = pq.read_table(f, columns=["source", "record"])
        quarantined |= {(Path(s).name, r) for s, r in zip(t.column("source").to_pylist(), t.column("record").to_pylist())}
    out: dict[str, dict[str, int]] = {}
    for line in labels_path.read_text().splitlines():
        x = json.loads(line)
        if x["kind"] == "request":
            place = "not a document"
        elif (x["file"], f"line {x.get('line')}") in quarantined:
            place = "quarantine"
        else:
            place = where.get(x["id"], "unaccounted")
        key = x["kind"] if x["kind"] != "article" else f"article ({x['lang']})"
        out.setdefault(key, {})
        out[key][place] = out[key].get(place, 0) + 1
    return out


def format_planted(outcomes: dict[str, dict[str, int]], labels_path: Path | str = "data/demo/labels.jsonl") -> str:
    lines = [f"what happened to what we planted ({labels_path})"]
    for kind in sorted(outcomes, key=lambda k: (not k.startswith("article"), k)):
        places = ", ".join(f"{p} {n}" for p, n in sorted(outcomes[kind].items(), key=lambda kv: -kv[1]))
        lines.append(f"  {kind:<22} {sum(outcomes[kind].values()):>5}  → {places}")
    return "\n".join(lines)


def run_demo(ctx: DemoContext, only: list[str] | None = None) -> int:
    from quipu.flows.reports import format_funnel

    t_all, cpu_all = time.perf_counter(), _cpu_seconds()
    timings = []
    for step in STEPS:
        if only and step.name not in only:
            continue
        print(f"\n== {step.name}: {step.help}")
        t0, cpu0 = time.perf_counter(), _cpu_seconds()
        step.run(ctx)
        timings.append((step.name, time.perf_counter() - t0, _cpu_seconds() - cpu0))
    if ctx.curate_summary is not None:
        print()
        print(format_funnel(ctx.curate_summary))
        labels = ctx.data_dir / "labels.jsonl"
        if labels.is_file():
            print()
            print(format_planted(planted_outcomes(Path(ctx.curate_summary["output"]), labels), labels))
    print("\nwhere to look")
    for what, where in ctx.where:
        print(f"  {what:<18} {where}")
    # CPU seconds beside the wall clock: on a busy machine the wall clock says little about the demo
    print("\n" + "   ".join(f"{name} {s:.0f} s" for name, s, _ in timings) + f"   total {time.perf_counter() - t_all:.0f} s"
          + "\ncpu: " + "   ".join(f"{name} {c:.0f} s" for name, _, c in timings) + f"   total {_cpu_seconds() - cpu_all:.0f} s")
    return 0


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have ended."""
    import resource
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


# ---- CLI ------------------------------------------------------------------------------------------

def cmd_demo(args) -> int:
    from quipu.catalog.errors import UserError

    names = [s.name for s in STEPS]
    only = [s.strip() for s in args.steps.split(",")] if args.steps else None
    for s in only or []:
        if s not in names:
            raise UserError(f"--steps: unknown step {s!r} (steps: {', '.join(names)})")
    if not 0 < args.scale <= 1:
        raise UserError(f"--scale must be in (0, 1], got {args.scale}")
    ctx = DemoContext(data_dir=Path(args.data), run_dir=Path(args.output), scale=args.scale,
                      rebuild=args.rebuild, overrides=list(args.overrides), label_anew=args.label_anew)
    return run_demo(ctx, only)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the whole pipeline on the embedded demo corpus (offline; its steps "
                       "take about 3.5 CPU-minutes with the shipped teacher labels)",
                       description="The whole pipeline on the embedded demo corpus, offline: " +
                       " → ".join(s.name for s in STEPS) + ". Measured on a 2-core AVX2 machine with a fresh "
                       "QUIPU_HOME: about 3.5 CPU-minutes of steps (bench/RESULTS.md, \"The demo's time\"); the train "
                       "step and the perplexity student stop on wall-clock boxes (2.5 min, 40 s). The teacher "
                       "labels ship with the demo; without them (another teacher, --label-anew) labelling adds "
                       "about 8 CPU-minutes. Prints each step's wall and CPU seconds.")
    p.add_argument("--data", default="data/demo", help="where the demo corpus is built (default: data/demo)")
    p.add_argument("--output", default="runs/demo", help="curate run directory (default: runs/demo)")
    p.add_argument("--scale", type=float, default=1.0, help="corpus size, 0 < scale <= 1 (default 1)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the corpus even if it is already there")
    p.add_argument("--label-anew", action="store_true",
                   help="ppl-distill: leave the shipped teacher labels (demo/teacher_labels.json.gz) aside and "
                        "label every document with SmolLM2-135M (about 8 more CPU-minutes on an AVX2 CPU)")
    p.add_argument("--steps", help=f"comma-separated subset of the steps ({', '.join(s.name for s in STEPS)})")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value of configs/curate/demo.yaml (dotted key, YAML value); repeatable")
    p.set_defaults(func=cmd_demo)


def _changed(config) -> bool:
    """True when the demo's run folder holds a run of other inputs or config than this one."""
    from quipu.catalog.ownership import IDENTITY_NAME, identity
    from quipu.catalog.files import read_json
    from quipu.flows.curate import NOT_IDENTITY
    from quipu.tasks.reading import expand_inputs
    ident_path = Path(config.output).resolve() / IDENTITY_NAME
    if not ident_path.exists():
        return Path(config.output).exists()
    return read_json(ident_path) != identity(expand_inputs(config.input), config.model_dump(mode="json"), NOT_IDENTITY)
