"""How many documents a change of the fluency stage (models or cut-offs) decides differently, on finished
curate runs: every document that reached a run's `fluency` stage (its removed rows plus everything the
later stages saw: their removed rows and the curated output) judged by the old and by the new fluency
config. Text redacted by a later stage (pii) is judged as redacted.

    git show BASE:configs/curate/default.yaml > /tmp/old.yaml
    mkdir -p /tmp/old-models && for l in en es pt; do git show BASE:tasks/fluency_models/$l.json > /tmp/old-models/$l.json; done
    .venv/bin/python bench/fluency_decisions.py RUN [RUN ...] --old-config /tmp/old.yaml --old-models /tmp/old-models
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def reached_fluency(run: Path):
    """(id, text, lang) of every document the run's fluency stage judged."""
    import pyarrow.parquet as pq
    stages = [s["name"] for s in json.loads((run / "run.json").read_text())["stages"]]
    later = stages[stages.index("fluency"):]
    files = [f for s in later for f in sorted((run / s / "removed").glob("*.parquet"))]
    files += sorted((run / "curated").glob("*.parquet"))
    seen = set()
    for f in files:
        t = pq.read_table(f, columns=["id", "text", "lang"])
        for i, text, lang in zip(*(t.column(c).to_pylist() for c in ("id", "text", "lang"))):
            if i not in seen:
                seen.add(i)
                yield i, text, lang


def stage(config_path: str, models: str | None):
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig
    from quipu.tasks.fluency import FluencyFilter
    config = load_config(CurateConfig, config_path).fluency
    if models:
        config = config.model_copy(update={"model_paths": {lang: str(Path(models) / f"{lang}.json") for lang in config.languages}})
    return FluencyFilter(config)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--old-config", required=True)
    ap.add_argument("--old-models", required=True)
    ap.add_argument("--new-config", default=str(ROOT / "configs" / "curate" / "default.yaml"))
    args = ap.parse_args()
    old, new = stage(args.old_config, args.old_models), stage(args.new_config, None)
    for run in map(Path, args.runs):
        changes, total = Counter(), Counter()
        for _, text, lang in reached_fluency(run):
            a, b = old.judge(text or "", lang)[0], new.judge(text or "", lang)[0]
            total[lang] += 1
            if (a is None) != (b is None):
                changes[lang, "now removed" if b else "now kept", (b or a).split("<")[0]] += 1
        print(f"{run}: {sum(total.values())} documents reached fluency ({dict(total)}); decision changed: "
              + (", ".join(f"{lang} {what} ({why}) {n}" for (lang, what, why), n in sorted(changes.items())) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
