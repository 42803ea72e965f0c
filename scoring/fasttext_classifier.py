"""A fastText document classifier (DCLM style): the text normalisation shared by training and
scoring, loading (checked, cached per process) and batched scoring.

One family for every such model, told apart by its catalog kind: the quality classifier
(`quality-fasttext`, the `quality` stage, quipu.tasks.quality) is the first; any other (a topic
or register classifier) is the same code with another kind and labels. Trained by
quipu.trainer.classifier_train (`quipu quality train CONFIG`; the config's `kind` says which);
applied by a `FastTextFilter` stage (quipu.tasks.fasttext_filter). The normalisation settings,
labels and kind travel with the model in its sidecar `<model>.json`.
"""
from __future__ import annotations

import os
import re
import threading
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from quipu.catalog.errors import UserError
from quipu.catalog.files import read_json, sha256_file

POSITIVE = "hq"
NEGATIVE = "lq"
FASTTEXT_MAGIC = 793712314    # first int32 of every fastText .bin/.ftz file


# ---- the one text normalisation ---------------------------------------------------------------

class Normalization(BaseModel):
    """How text is turned into one fastText input line; stored with the model, used by both sides."""
    model_config = ConfigDict(extra="forbid")
    lowercase: bool = Field(True, description="fold case (some sources are all lower case: case alone must not decide)")
    split_punctuation: bool = Field(True, description="put spaces around punctuation so 'end.' and 'end' are one word")
    max_chars: int = Field(10_000, gt=0, description="characters of each document the classifier sees")


_PUNCT = re.compile(r"([^\w\s])")


def normalize_text(text: str, norm: Normalization) -> str:
    """One line of whitespace-separated tokens: what fastText trains on and predicts from."""
    text = (text or "")[: norm.max_chars]
    if norm.lowercase:
        text = text.lower()
    if norm.split_punctuation:
        text = _PUNCT.sub(r" \1 ", text)
    return " ".join(text.split())   # also removes newlines: fastText reads one line per example


# ---- the classifier ---------------------------------------------------------------------------

class ClassifierModelError(UserError, ValueError):
    """A classifier model that cannot be found or loaded; the message names the path or name."""


def model_sidecar(model_path: str | Path) -> Path:
    """`model.bin` -> `model.json`: the normalisation, labels and training config of the model."""
    return Path(model_path).with_suffix(".json")


class FastTextClassifier:
    """A loaded fastText classifier plus the normalisation it was trained with; `score` is batched."""

    def __init__(self, path: str, positive_label: str | None = None):
        self.path = str(path)
        if not os.path.isfile(self.path):
            raise ClassifierModelError(f"classifier model file not found: {self.path}")
        with open(self.path, "rb") as fh:
            head = fh.read(4)
        if len(head) < 4 or int.from_bytes(head, "little", signed=True) != FASTTEXT_MAGIC:
            raise ClassifierModelError(f"classifier model {self.path} is not a fastText model file (corrupt or wrong file)")
        sidecar = model_sidecar(self.path)
        try:   # a model without a sidecar (trained elsewhere) gets the default normalisation
            meta = read_json(sidecar) if sidecar.is_file() else {}
            self.normalization = Normalization(**meta.get("normalization", {}))
        except Exception as e:
            raise ClassifierModelError(f"classifier model sidecar {sidecar} is unreadable: {e}") from None
        self.kind = meta.get("kind")
        self.positive_label = positive_label or meta.get("positive_label") or POSITIVE
        self.negative_label = meta.get("negative_label") or NEGATIVE
        self.positive = "__label__" + self.positive_label
        self.sha256 = sha256_file(self.path)
        from quipu.scoring.model_files import ModelFileError, load_fasttext
        try:   # layout, a load in a child process (a crash there is one line), the probe set's scores, the load
            self.model = load_fasttext(self.path, self.positive)
        except ModelFileError as e:
            raise ClassifierModelError(str(e)) from None
        labels = list(self.model.labels)
        if self.positive not in labels:
            raise ClassifierModelError(f"classifier model {self.path} has no label {self.positive} (labels: {', '.join(labels)})")
        self.n_labels = len(labels)

    def score(self, texts: list[str]) -> list[float]:
        """Probability of the positive label for each text, in one batched call.

        The binding's `multilinePredict`: fasttext 0.9.3's Python `predict` breaks under numpy 2.
        Each line ends in "\n" as in training (and as fastText's own `predict` does): the newline is
        the end-of-sentence token `</s>` the model was trained with; without it scores differ.
        """
        if not texts:
            return []
        return self.score_lines([normalize_text(t, self.normalization) + "\n" for t in texts])

    def score_lines(self, lines: list[str]) -> list[float]:
        """Scores of already normalised lines, each ending in "\n"."""
        labels, probs = self.model.f.multilinePredict(lines, self.n_labels, 0.0, "strict")
        pos = self.positive
        out = []
        for ls, ps in zip(labels, probs):
            p = 0.0
            for label, prob in zip(ls, ps):
                if label == pos:
                    p = float(prob)
                    break
            out.append(min(1.0, max(0.0, p)))  # fastText adds 1e-5 before exp: clip to a probability
        return out


_load_lock = threading.Lock()


@lru_cache(maxsize=4)
def _load_cached(path: str, mtime_ns: int, size: int, positive_label: str | None) -> FastTextClassifier:
    return FastTextClassifier(path, positive_label)


def load_classifier(path: str, positive_label: str | None = None) -> FastTextClassifier:
    """Load once per process (threads share it); a changed file on disk is loaded again."""
    try:
        st = os.stat(path)
    except OSError:
        raise ClassifierModelError(f"classifier model file not found: {path}") from None
    with _load_lock:
        return _load_cached(str(path), st.st_mtime_ns, st.st_size, positive_label)
