"""The `tokenize-train` flow: curated datasets in the catalog → tokenizer → token shards → trained
model (+ a HF export), with progress and summary artifacts and the run registered in the catalog.

Every step is resumable: the tokenizer and each token shard are skipped when their fingerprint
matches (token shards are cached by content, so a new dataset version costs only its own shards),
and `resume=True` continues training from the newest checkpoint. The blend (sources, versions,
`where` columns, weights, phase boundaries) is validated by `preflight` before any of it runs, and
the blend table is printed before the first step.

`new_version` (set by the deployment's trigger on `quipu.curate.completed`) continues the run
from its checkpoint with the new version in the blend, or starts it (trainer/continual.py).
"""
from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from prefect import flow, get_run_logger, task

from quipu.catalog import registry
from quipu.catalog.files import remove_stale_temporaries
from quipu.catalog.ownership import output_lock
from quipu.catalog.errors import UserError
from quipu.flows.run_names import train_name
from quipu.flows.runners import checkout_warning, failed_run, in_deployment_run
from quipu.flows.progress import StepProgress, format_eval_groups, say
from quipu.trainer import continual
from quipu.trainer.continual import NewVersion
from quipu.trainer.data import blend_report, format_blend_report, resolve_phase_starts
from quipu.trainer.prepare import (blend_languages, build_tokenizer, fertility_problems, pinned_versions, resolve_sources,
                                   tokenize_source, tokenizer_text_shortfall, write_prepared)
from quipu.trainer.train import TrainConfig, load_sources, plan_data, train


def preflight(config: TrainConfig, pinned: dict[str, list[int]] | None = None) -> dict[str, list[dict]]:
    """Everything that can be checked before work starts: sources, versions and their columns
    exist, phases fit in the run. `pinned`: the versions a plain resume keeps."""
    sources = resolve_sources(config.data, pinned)
    max_steps = config.train.max_steps
    resolve_phase_starts(config.data, max_steps, lambda s: config.schedule.fraction(s, max_steps))
    return sources


@task(name="tokenizer", persist_result=False)
def tokenizer_task(config: TrainConfig, sources: dict[str, list[dict]], run_dir: str, keep: bool = False):
    tok, fert = build_tokenizer(config.tokenizer, sources, Path(run_dir), keep)
    return str(tok.path.parent), fert


@task(name="tokenize", persist_result=False)
def tokenize_task(name: str, paths: list[dict], tokenizer_dir: str, run_dir: str, config: TrainConfig, run_id: str):
    from quipu.trainer.tokenizer import TextTokenizer
    return tokenize_source(name, paths, TextTokenizer.load(tokenizer_dir), Path(run_dir), config.data, run_id)


class ProgressReporter:
    """Training progress: a line per logged step on the terminal, and an in-place Prefect progress
    artifact (rate-limited)."""

    def __init__(self, max_steps: int, key: str):
        from prefect.artifacts import create_progress_artifact
        self.max_steps = max_steps
        self.console = StepProgress(max_steps)   # the terminal's line per logged step
        self.last = 0.0
        self.eval_line = ""
        try:
            self.id = create_progress_artifact(progress=0.0, key=key, description="training steps done (%)")
        except Exception:   # artifacts are a view; training goes on without them
            self.id = None

    def __call__(self, m: dict) -> None:
        self.console(m)
        now = time.monotonic()
        if "eval_by_source" in m:
            self.eval_line = f"step {m['step']}: held-out bits/byte " + format_eval_groups(m)
        if self.id is None or (now - self.last < 2 and m["step"] < self.max_steps and "eval_by_source" not in m):
            return
        self.last = now
        from prefect.artifacts import update_progress_artifact
        try:
            update_progress_artifact(self.id, progress=100.0 * m["step"] / self.max_steps,
                                     description="training steps done (%)" + (f"; {self.eval_line}" if self.eval_line else ""))
        except Exception:
            pass


@flow(name="tokenize-train", flow_run_name=train_name, log_prints=True, persist_result=False)
def tokenize_train(config: TrainConfig, resume: bool = False, new_version: NewVersion | None = None,
                   strict: bool = False) -> dict:
    """`strict`: a blend language the tokenizer does not fit (docs/training.md) is an error, not a warning."""
    try:
        return _train_flow(config, resume, new_version, strict)
    except UserError as e:   # on a worker: one ERROR line with the fix, no traceback
        return failed_run(e)
    except Exception as e:   # on a worker, any other failure as one line too (the CLI has its own)
        if not in_deployment_run():
            raise
        return failed_run(UserError(unexpected_failure(e, Path(config.output).resolve())))


def unexpected_failure(error: Exception, run_dir: Path) -> str:
    """One line for a failure no code worded: what failed, where its traceback is kept, and the fix
    that always applies (a rerun resumes from the newest checkpoint)."""
    import traceback
    log = run_dir / "error.log"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(log, "a", encoding="utf-8", errors="backslashreplace") as f:
            f.write("".join(traceback.format_exception(error)))
    except OSError:
        log = None
    first = (str(error).strip().splitlines() or [""])[0][:300]
    return (f"training failed: {type(error).__name__}: {first}" + (f" (traceback in {log})" if log else "")
            + "; fix the cause and run the deployment again: it resumes from the newest checkpoint")


def _train_flow(config: TrainConfig, resume: bool, new_version: NewVersion | None, strict: bool) -> dict:
    if warning := checkout_warning(__file__):
        get_run_logger().warning(warning)
    run_dir = Path(config.output).resolve()
    with output_lock(run_dir):   # one training run per run folder (a killed one's lock is gone with it)
        registry.mark_stale_runs_crashed("tokenize-train", output=str(run_dir))
        pinned = pinned_versions(run_dir) if resume else None     # a plain resume keeps its data
        if new_version is not None:
            config, resume_or_reason = continual.continue_with(config, run_dir, new_version, trained_versions(run_dir))
            if config is None:
                get_run_logger().info("nothing to train: %s", resume_or_reason)
                return {"skipped": resume_or_reason}
            resume, pinned = resume_or_reason, None
        return _tokenize_train(config, resume, run_dir, pinned, new_version, strict)


def trained_versions(run_dir: Path) -> dict[str, list[int]] | None:
    """The versions the last completed training run in `run_dir` read (a failed one does not count)."""
    import json
    run = registry.latest_run("tokenize-train", "completed", str(run_dir))
    return json.loads(run["summary"]).get("versions") if run and run.get("summary") else None


def _tokenize_train(config: TrainConfig, resume: bool, run_dir: Path, pinned, new_version, strict: bool = False) -> dict:
    remove_stale_temporaries(run_dir)
    sources = preflight(config, pinned)
    has_tokenizer = resume and (run_dir / "tokenizer" / "tokenizer_meta.json").exists()
    short = [] if has_tokenizer else tokenizer_text_shortfall(config.tokenizer, config.data, sources)
    if short:
        reason = (f"not enough text to train the tokenizer ({'; '.join(short)}: tokenizer.min_words_per_language); "
                  "a BPE trained now would be kept for every later version. Curate more, or set tokenizer.kind: smollm2")
        if new_version is not None:     # the chain: wait for the versions to come
            get_run_logger().warning("nothing trained yet: %s", reason)
            return {"skipped": reason}
        if strict:
            raise UserError(reason)
        get_run_logger().warning(reason)
    run_id = registry.start_run("tokenize-train", config.model_dump(mode="json"), str(run_dir))
    try:
        tok_dir, fert = tokenizer_task(config, sources, str(run_dir), keep=resume)
        say(f"tokenizer {tok_dir}; tokens per word: " + ", ".join(f"{k} {v['tokens_per_word'] or float('nan'):.2f}"
                                                                   for k, v in fert.items()))
        unfit = fertility_problems(fert, blend_languages(config.data), config.tokenizer.max_tokens_per_word,
                                   blend_languages(config.data, required_only=True))
        if unfit:
            message = "the tokenizer does not fit the blend: " + "; ".join(unfit)
            if strict:
                raise UserError(message + " (strict)")
            get_run_logger().warning(message)
        # one selection after another (each tokenizes its shards in parallel): selections that share
        # shards (cc-main and cc-main@3) find them done
        markers = {n: tokenize_task(n, p, tok_dir, str(run_dir), config, run_id) for n, p in sources.items()}
        from quipu.trainer.tokenizer import TextTokenizer
        prepared = write_prepared(run_dir, TextTokenizer.load(tok_dir), markers, fert)
        for n, s in prepared["summary"].items():
            new = sum(1 for m in markers[n] if not m.get("reused"))
            say(f"source {n}: versions {prepared['versions'][n]}, {s['docs']:,} documents, {s['tokens']:,} tokens "
                f"({new} of {len(markers[n])} shards tokenized now)")
        step = continual.checkpoint_step(run_dir) if resume else None
        loaded = load_sources(config, prepared)
        config, steps_note = fit_steps_to_data(config, loaded, step or 0)
        if steps_note:
            get_run_logger().warning(steps_note)
        phases, _ = plan_data(config, loaded)
        rows = blend_report(phases)
        blend = format_blend_report(rows)
        say("blend:\n" + blend)   # before training, not after
        continual.record(run_dir, config, {"started": dt.datetime.now(dt.timezone.utc).isoformat(), "run_id": run_id,
                                           "from_step": step or 0, "max_steps": config.train.max_steps,
                                           "new_version": new_version.model_dump() if new_version else None,
                                           "versions": prepared["versions"]})
        summary = train(config, run_dir, resume=resume, on_log=ProgressReporter(config.train.max_steps, "train-progress"))
        if config.export_hf:
            from quipu.trainer.export import export_hf
            summary["hf"] = str(export_hf(run_dir, run_dir / "hf"))
        summary["tokens"] = prepared["summary"]
        summary["versions"] = prepared["versions"]
        summary["resumed_from_step"] = step
        summary["fertility"] = fert
        summary["blend"] = rows
        summary["data_notes"] = [steps_note] * bool(steps_note) + [ln for ln in blend.splitlines()
                                                                    if ln.startswith(("NOTE", "WARNING"))]
        registry.register_model(run_dir.name, "llm", summary.get("hf") or str(run_dir), config.model_dump(mode="json"),
                                {"eval_loss": summary["eval_loss"], "final_loss": summary["final_loss"],
                                 "step": summary["step"], "stopped_early": summary["stopped_early"]}, run_id=run_id)
        _publish(summary)
    except BaseException:
        registry.finish_run(run_id, "failed")
        raise
    registry.finish_run(run_id, "completed", summary)
    return summary


def fit_steps_to_data(config: TrainConfig, sources: list, from_step: int) -> tuple[TrainConfig, str | None]:
    """`config` with fewer steps when the phases still to train (those starting at or after
    `from_step`: every phase of a fresh run, a continuation's new one) would repeat a source's
    distinct tokens more than `data.max_epochs` times, summed over those phases, and the sentence
    that says so; (config, None) when they fit or the limit is off. Every such phase shrinks by the
    same factor, so the blend's proportions (and curriculum) stay; later phases get explicit starts."""
    data, max_steps = config.data, config.train.max_steps
    limit = data.max_epochs
    starts = resolve_phase_starts(data, max_steps, lambda s: config.schedule.fraction(s, max_steps))
    if limit is None or from_step not in starts or max_steps <= from_step:
        return config, None       # a phase still to train that started earlier: the blend table warns per source
    first = starts.index(from_step)
    worst = _worst_repetitions(config, sources, first)
    if worst["repetitions"] <= limit:
        return config, None
    steps = max_steps - from_step
    factor = limit / worst["repetitions"]
    for _ in range(3):        # rounding can leave a repetition a hair above the limit: shrink a little more
        fitted = _shrunk(config, starts, first, factor)
        again = _worst_repetitions(fitted, sources, first)["repetitions"]
        if again <= limit:
            break
        factor *= limit / again
    fit = fitted.train.max_steps - from_step
    note = (f"data.max_epochs {limit:g}: {steps} steps would repeat source {worst['source']!r} "
            f"({worst['available_tokens']:,} distinct tokens) {worst['repetitions']:.0f} times; training {fit} "
            f"step(s), to step {from_step + fit}, instead (add data, or raise data.max_epochs; null trains every step)")
    if len(starts) - first > 1:
        new_starts = resolve_phase_starts(fitted.data, fitted.train.max_steps,
                                          lambda s: fitted.schedule.fraction(s, fitted.train.max_steps))
        note += "; phases start at " + ", ".join(f"{p.name} step {b}" for p, b in
                                                 list(zip(fitted.data.phases, new_starts))[first:])
    return fitted, note


def _worst_repetitions(config: TrainConfig, sources: list, first: int) -> dict:
    """The source repeated most over phases[first:] (repetitions summed per source across them)."""
    phases, _ = plan_data(config, sources)
    total: dict[str, dict] = {}
    for phase in phases[first:]:
        for r in phase.report:
            if r["repetitions"]:
                t = total.setdefault(r["source"], {"source": r["source"], "available_tokens": r["available_tokens"],
                                                   "repetitions": 0.0})
                t["repetitions"] += r["repetitions"]
    return max(total.values(), key=lambda r: r["repetitions"], default={"repetitions": 0.0})


def _shrunk(config: TrainConfig, starts: list[int], first: int, factor: float) -> TrainConfig:
    """`config` with phases[first:] (and the run's end) shrunk by `factor` from starts[first] on,
    each phase at least one step; later phases start at explicit steps."""
    max_steps, from_step = config.train.max_steps, starts[first]
    ends = starts[1:] + [max_steps]
    dumped = config.model_dump(mode="json")
    phases, at = dumped["data"]["phases"], from_step
    for i in range(1, first):     # phases already trained keep the steps they started at
        phases[i] |= {"start_step": starts[i], "start_lr_fraction": None}
    for i in range(first, len(starts)):
        if i > 0:
            phases[i] |= {"start_step": at, "start_lr_fraction": None}
        length = max(1, int((ends[i] - starts[i]) * factor))
        if phases[i].get("warmup_steps") is not None:
            phases[i]["warmup_steps"] = min(phases[i]["warmup_steps"], max(0, length - 1))
        at += length
    dumped["train"]["max_steps"] = at
    dumped["schedule"]["warmup_steps"] = min(dumped["schedule"]["warmup_steps"], max(0, at - 1))
    return config.model_validate(dumped)


def _publish(summary: dict) -> None:
    try:
        from prefect.artifacts import create_table_artifact
        rows = [{"metric": k, "value": str(summary.get(k))} for k in
                ("step", "final_loss", "eval_loss", "eval_ppl", "params", "loss_curve", "checkpoint", "sample")]
        rows += [{"metric": "note", "value": n} for n in summary.get("data_notes") or []]
        create_table_artifact(rows, key="train-summary", description="tokenize-train: the trained model")
        blend = [{k: str(r.get(k)) for k in ("phase", "source", "documents", "available_tokens", "configured_weight",
                                              "share", "tokens", "repetitions", "absent")} for r in summary.get("blend") or []]
        if blend:
            create_table_artifact(blend, key="train-blend", description="tokenize-train: the blend as trained "
                                  "(share per source after redistribution; absent: no documents in this data)")
    except Exception:
        pass
