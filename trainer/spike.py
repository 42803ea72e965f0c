"""The loss-spike guard: a step whose gradient norm is NaN/Inf or far above the running median of
accepted steps is skipped; several in a row roll the run back to its last checkpoint (the trainer
does that, with a lower LR and the offending data skipped), and too many rollbacks end the run.
"""
from __future__ import annotations

import math
import statistics

from quipu.catalog.errors import UserError
from quipu.trainer.train_config import SpikeConfig


class TrainingDiverged(UserError, RuntimeError):
    """Loss spikes persisted through every allowed rollback (a user error: the message names the
    settings that fix it; the CLI and a worker print it as one line)."""
    exit_code = 1


class SpikeGuard:
    """Skips steps whose gradient norm is NaN/Inf or > factor x the running median of accepted steps."""

    def __init__(self, cfg: SpikeConfig, history: list[float] | None = None):
        self.cfg = cfg
        self.history = list(history or [])
        self.consecutive = 0

    def check(self, grad_norm: float) -> str | None:
        """None to take the step, else the reason to skip it."""
        if not self.cfg.enabled:
            return None
        reason = None
        if not math.isfinite(grad_norm):
            reason = "non-finite grad norm"
        elif len(self.history) >= self.cfg.min_history:
            med = statistics.median(self.history)
            if grad_norm > self.cfg.factor * med:
                reason = f"grad norm {grad_norm:.3g} > {self.cfg.factor:g} x median {med:.3g}"
        if reason is None:
            self.history = (self.history + [grad_norm])[-self.cfg.window:]
            self.consecutive = 0
        else:
            self.consecutive += 1
        return reason

    @property
    def needs_rollback(self) -> bool:
        return self.consecutive >= self.cfg.max_consecutive
