"""metrics.jsonl (one JSON object per logged step, rewritten atomically) and loss.png (train and
held-out loss; held-out bits per byte per source and language)."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

from quipu.catalog.files import atomic_path


class Metrics:
    """metrics.jsonl, rewritten atomically at each flush (a resume truncates it to the checkpoint)."""

    def __init__(self, run_dir: Path, keep_until_step: int | None):
        self.path = run_dir / "metrics.jsonl"
        self.rows: list[dict] = []
        if keep_until_step is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):
                    r = json.loads(line)
                    if r.get("step", 0) <= keep_until_step:
                        self.rows.append(r)

    def add(self, row: dict) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        with atomic_path(self.path) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in self.rows))

    def plot(self, path: Path) -> Path | None:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return None
        tr = [(r["step"], r["loss"]) for r in self.rows if r.get("loss") is not None]
        ev = [(r["step"], r["eval_loss"]) for r in self.rows if r.get("eval_loss") is not None]
        groups = [r for r in self.rows if "eval_by_source" in r]
        fig, axes = plt.subplots(1, 2 if groups else 1, figsize=(12 if groups else 7, 4), squeeze=False)
        ax = axes[0][0]
        if tr:
            ax.plot(*zip(*tr), label="train loss", lw=1)
        if ev:
            ax.plot(*zip(*ev), "o-", label="held-out loss", ms=3)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/token)")
        ax.grid(alpha=0.3)
        ax.legend()
        if groups:   # held-out bits per byte per source (solid) and per language (dashed)
            bx = axes[0][1]
            for key, style in (("eval_by_source", "o-"), ("eval_by_lang", "s--")):
                for name in sorted({k for r in groups for k in r[key]}):
                    pts = [(r["step"], r[key][name]["bpb"]) for r in groups if name in r[key]]
                    bx.plot(*zip(*pts), style, ms=3, label=("" if key == "eval_by_source" else "lang ") + name)
            bx.set_xlabel("step")
            bx.set_ylabel("held-out bits per byte")
            bx.grid(alpha=0.3)
            bx.legend(fontsize=8)
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)
        return path


def last_eval_by_group(rows: list[dict]) -> dict:
    for r in reversed(rows):
        if "eval_bpb" in r:
            return {k: r[k] for k in ("eval_bpb", "eval_by_source", "eval_by_lang", "eval_tasks") if k in r}
    return {}
