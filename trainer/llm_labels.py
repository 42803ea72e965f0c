"""LLM labels, FineWeb-Edu style: an instruction model behind any OpenAI-compatible endpoint (vLLM,
llama.cpp's server, TGI, `quipu serve-labeller`) rates each document's educational value 0-5 with a
prompt written in the document's language; the labels then train judges (a fastText classifier,
configs/quality/edu.yaml; a head on frozen SmolLM2 layers, quipu.trainer.label_head).

`quipu label CONFIG` (flows/label.py) runs `label_documents`:

- resumable: every answer goes to an append-only store (`labels.jsonl`, one JSON line per answer,
  written with one `write` on an O_APPEND descriptor and flushed; a torn last line from a kill is cut
  off when the store is opened), keyed by the labeller (model, prompts, document window) and the
  document text's hash: a killed run continues where it stopped, a document is never asked twice;
- bounded concurrency (`concurrency` requests in flight), a timeout per request, retries with
  exponential backoff on connection errors, timeouts, HTTP 429 and 5xx (a `Retry-After` is honoured);
- nothing lost: a refusal, an answer with no score or one out of range is stored with its reason and
  the answer's start; a request that still fails after the retries is stored as `error:` and asked
  again by the next run;
- cost: tokens in and out from each answer's `usage`, seconds, documents per second, and per 1,000
  documents (with a price when `price_per_million_tokens` is given); progress lines while it runs.

The output, `labelled.jsonl` (every input document in input order: id, text, lang, `llm_edu_score`,
`edu_class` hq/lq/none, reason), is written atomically at the end from the store; it is what the
judges train on.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from quipu.catalog.errors import UserError
from quipu.catalog.files import sha256_json, write_bytes_atomic, write_json_atomic
from quipu.trainer.text_source import TextSource, read_source

STORE = "labels.jsonl"
LABELLED = "labelled.jsonl"
REPORT = "label_report.json"
ANSWER_CHARS = 300        # of each answer kept in the store (the reason of a refusal or garbage)

# FineWeb-Edu's additive 5-point prompt (Penedo et al. 2024, "The FineWeb datasets"), shortened, written
# in the document's language: a model answers better in the language it reads.
PROMPTS = {
    "en": """Below is an extract from a web page. Evaluate whether the page has a high educational value and could be useful in an educational setting for teaching from primary school to grade school levels, using the additive 5-point scoring system described below. Points are accumulated based on the satisfaction of each criterion:
- Add 1 point if the extract provides some basic information relevant to educational topics, even if it includes some irrelevant or non-academic content like advertisements and promotional material.
- Add another point if the extract addresses certain elements pertinent to education but does not align closely with educational standards.
- Award a third point if the extract is appropriate for educational use and introduces key concepts relevant to school curricula.
- Grant a fourth point if the extract is highly relevant and beneficial for educational purposes, with a clear and consistent writing style.
- Bestow a fifth point if the extract is outstanding in its educational value, perfectly suited for teaching.

The extract:
{text}

After examining the extract, briefly justify your total score in up to 100 words, then conclude with the score using the format: "Educational score: <total points>\"""",
    "es": """A continuación hay un extracto de una página web. Evalúa si la página tiene un alto valor educativo y podría ser útil en un entorno educativo, desde la escuela primaria hasta la secundaria, con el sistema aditivo de 5 puntos descrito abajo. Los puntos se acumulan según se cumpla cada criterio:
- Suma 1 punto si el extracto ofrece información básica relacionada con temas educativos, aunque incluya contenido irrelevante o no académico, como anuncios o material promocional.
- Suma otro punto si el extracto trata elementos pertinentes para la educación, aunque no se ajuste de cerca a los estándares educativos.
- Concede un tercer punto si el extracto es adecuado para uso educativo e introduce conceptos clave de los planes de estudio escolares.
- Otorga un cuarto punto si el extracto es muy relevante y útil para la enseñanza, con un estilo de escritura claro y coherente.
- Concede un quinto punto si el extracto es sobresaliente por su valor educativo y perfectamente adecuado para enseñar.

El extracto:
{text}

Tras examinar el extracto, justifica brevemente tu puntuación total en un máximo de 100 palabras y termina con la puntuación en el formato: "Puntuación educativa: <puntos totales>\"""",
    "pt": """A seguir está um trecho de uma página da web. Avalie se a página tem alto valor educacional e poderia ser útil em um contexto educacional, do ensino fundamental ao médio, usando o sistema aditivo de 5 pontos descrito abaixo. Os pontos se acumulam conforme cada critério é atendido:
- Some 1 ponto se o trecho oferece alguma informação básica relacionada a temas educacionais, mesmo que inclua conteúdo irrelevante ou não acadêmico, como anúncios ou material promocional.
- Some mais um ponto se o trecho trata de elementos pertinentes à educação, mas não se alinha de perto aos padrões educacionais.
- Conceda um terceiro ponto se o trecho é adequado para uso educacional e apresenta conceitos-chave dos currículos escolares.
- Conceda um quarto ponto se o trecho é muito relevante e útil para fins educacionais, com um estilo de escrita claro e coerente.
- Conceda um quinto ponto se o trecho é excepcional em seu valor educacional e perfeitamente adequado para o ensino.

O trecho:
{text}

Depois de examinar o trecho, justifique brevemente sua pontuação total em até 100 palavras e conclua com a pontuação no formato: "Pontuação educacional: <total de pontos>\"""",
}

# "Educational score: 3", "Puntuación educativa: 4/5", "Pontuação educacional: **2**", "score = 3"
SCORE_LINE = re.compile(r"(?:educational\s+score|puntuaci[oó]n\s+educativa|pontua[cç][aã]o\s+educacional|"
                        r"score|puntuaci[oó]n|pontua[cç][aã]o|nota)\s*[:=]?\s*\**\s*(-?\d+(?:[.,]\d+)?)", re.I)
BARE_NUMBER = re.compile(r"^\W*(-?\d+(?:[.,]\d+)?)\W*$")
REFUSAL = re.compile(r"\b(i can(?:no|')t|i am unable|i'm unable|i won't|as an ai|no puedo|no es posible|"
                     r"lo siento|não posso|desculpe|sinto muito)\b", re.I)


class LabelError(UserError, ValueError):
    """A labelling run that cannot start (no endpoint, no input); the message says what to fix."""


class LabelConfig(BaseModel):
    """`quipu label CONFIG`: rate documents 0-5 for educational value with an LLM."""
    model_config = ConfigDict(extra="forbid")
    endpoint: str = Field("http://127.0.0.1:8080/v1", description="OpenAI-compatible base URL (…/v1): "
                                                                   "POST {endpoint}/chat/completions")
    model: str = Field("default", description="the `model` the endpoint serves (vLLM: its name; llama.cpp: any)")
    api_key_env: str | None = Field(None, description="environment variable holding the API key, if the endpoint needs one")
    input: list[TextSource] = Field(..., min_length=1, description="documents to label (globs, datasets, run folders)")
    output: str = Field("runs/label", description="folder of labels.jsonl (the store), labelled.jsonl, label_report.json")
    languages: list[str] = Field(["es", "pt", "en"], min_length=1, description="label these languages; others are skipped (counted)")
    prompts: dict[str, str] = Field(default_factory=dict, description="a prompt per language replacing the shipped "
                                                                       "one; `{text}` marks where the document goes")
    max_chars: int = Field(4000, ge=100, description="characters of each document put in the prompt")
    max_tokens: int = Field(256, ge=1, le=8192, description="answer tokens asked for")
    temperature: float = Field(0.0, ge=0, le=2)
    concurrency: int = Field(4, ge=1, le=256, description="requests in flight at once")
    timeout_s: float = Field(120, gt=0, description="seconds one request may take")
    retries: int = Field(4, ge=0, le=20, description="further tries of a request that failed in transit (5xx, 429, timeout)")
    backoff_s: float = Field(1.0, ge=0, description="first wait before a retry; doubles each try (capped at 60 s)")
    hq_threshold: float = Field(3.0, description="edu_class hq when edu_score >= this (FineWeb-Edu: 3)")
    limit: int | None = Field(None, gt=0, description="label at most this many documents (the first, in input order)")
    price_per_million_tokens: tuple[float, float] | None = Field(
        None, description="[input, output] price per million tokens: the report gives the cost per 1,000 documents")
    progress_every_s: float = Field(10.0, gt=0, description="seconds between progress lines")

    @field_validator("input", mode="before")
    @classmethod
    def _paths(cls, v):
        v = [v] if isinstance(v, (str, dict)) else v
        return [{"path": s} if isinstance(s, str) else s for s in v]

    @field_validator("prompts")
    @classmethod
    def _has_text(cls, v):
        for lang, p in v.items():
            if "{text}" not in p:
                raise ValueError(f"prompts.{lang}: has no `{{text}}` (where the document goes)")
        return v

    @field_validator("endpoint")
    @classmethod
    def _url(cls, v):
        if not re.match(r"^https?://", v):
            raise ValueError(f"{v!r} is not an http(s) URL, e.g. http://127.0.0.1:8080/v1")
        return v.rstrip("/")

    def prompt(self, lang: str) -> str:
        return self.prompts.get(lang) or PROMPTS.get(lang) or PROMPTS["en"]

    def labeller(self) -> str:
        """What a label depends on besides the text: a changed model or prompt labels again."""
        return sha256_json({"model": self.model, "prompts": {l: self.prompt(l) for l in sorted(self.languages)},
                            "max_chars": self.max_chars, "temperature": self.temperature,
                            "max_tokens": self.max_tokens})[:16]


# ---- parsing an answer -------------------------------------------------------------------------

def parse_score(answer: str | None) -> tuple[float | None, str | None]:
    """(score, None) from a model's answer, or (None, reason): `refusal`, `no_score`, `out_of_range`,
    `empty`. The last "score: N" line counts (the prompt asks for it at the end); a bare number too."""
    text = (answer or "").strip()
    if not text:
        return None, "empty"
    found = SCORE_LINE.findall(text) or BARE_NUMBER.findall(text)
    if not found:
        return None, "refusal" if REFUSAL.search(text) else "no_score"
    value = float(found[-1].replace(",", "."))
    if not 0 <= value <= 5:
        return None, "out_of_range"
    return value, None


# ---- the store ---------------------------------------------------------------------------------

def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class LabelStore:
    """Append-only JSON lines; the latest record of a key wins. Opening cuts a torn last line."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records: dict[str, dict] = {}
        self.torn = 0
        if self.path.exists():
            data = self.path.read_bytes()
            end = data.rfind(b"\n") + 1
            if end < len(data):          # killed mid-line: drop the partial record
                self.torn = 1
                with open(self.path, "r+b") as fh:
                    fh.truncate(end)
            for line in data[:end].split(b"\n"):
                if line:
                    rec = json.loads(line)
                    self.records[rec["key"]] = rec
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def get(self, key: str) -> dict | None:
        rec = self.records.get(key)
        return None if rec is None or str(rec.get("reason") or "").startswith("error") else rec

    def add(self, rec: dict) -> None:
        line = (json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)     # one write on O_APPEND: records never interleave
            self.records[rec["key"]] = rec

    def close(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)


# ---- one request -------------------------------------------------------------------------------

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


def ask(client, cfg: LabelConfig, prompt: str, key: str, sleep: Callable[[float], None] = time.sleep) -> dict:
    """One document's answer: {score, reason, answer, tokens_in, tokens_out, seconds, attempts}."""
    import httpx
    body = {"model": cfg.model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": cfg.max_tokens, "temperature": cfg.temperature}
    rng = random.Random(key)      # jitter from the document: reruns wait alike
    t0 = time.perf_counter()
    last = ""
    for attempt in range(cfg.retries + 1):
        wait = None
        try:
            r = client.post(f"{cfg.endpoint}/chat/completions", json=body, timeout=cfg.timeout_s)
            if r.status_code == 200:
                return answer_record(r.json(), attempt + 1, time.perf_counter() - t0)
            last = f"http {r.status_code}: {r.text[:120]}"
            if r.status_code not in RETRY_STATUS:
                break
            wait = _retry_after(r.headers.get("retry-after"))
        except (httpx.TransportError, ValueError, KeyError, TypeError, IndexError) as e:
            last = f"{type(e).__name__}: {str(e)[:120]}"
        if attempt < cfg.retries:
            sleep(min(60.0, wait if wait is not None else cfg.backoff_s * 2 ** attempt * (0.5 + rng.random())))
    return {"score": None, "reason": f"error: {last}", "answer": None, "tokens_in": 0, "tokens_out": 0,
            "seconds": round(time.perf_counter() - t0, 3), "attempts": cfg.retries + 1}


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def answer_record(resp: dict, attempts: int, seconds: float) -> dict:
    """The parsed answer of a chat-completions response (a malformed response raises: retried)."""
    content = resp["choices"][0]["message"]["content"]
    usage = resp.get("usage") or {}
    score, reason = parse_score(content)
    return {"score": score, "reason": reason, "answer": (content or "")[:ANSWER_CHARS],
            "tokens_in": int(usage.get("prompt_tokens") or 0), "tokens_out": int(usage.get("completion_tokens") or 0),
            "seconds": round(seconds, 3), "attempts": attempts}


# ---- the run -----------------------------------------------------------------------------------

def read_inputs(cfg: LabelConfig) -> tuple[list[dict], dict]:
    """The documents to label, in input order (at most `limit`), and what was skipped."""
    docs, skipped = [], {"other_language": 0, "empty": 0}
    for src in cfg.input:
        for d in read_source(src):
            if d["lang"] not in cfg.languages:
                skipped["other_language"] += 1
            elif not d["text"].strip():
                skipped["empty"] += 1
            else:
                docs.append(d)
    return docs[:cfg.limit] if cfg.limit else docs, skipped


class Progress:
    """A line every `every` seconds: done, rate, ETA, and what went wrong so far."""

    def __init__(self, total: int, every: float, log: Callable[[str], None]):
        self.total, self.every, self.log = total, every, log
        self.done = 0
        self.reasons: dict[str, int] = {}
        self.t0 = self.last = time.perf_counter()

    def add(self, rec: dict) -> None:
        self.done += 1
        if rec["reason"]:
            r = rec["reason"].split(":")[0]
            self.reasons[r] = self.reasons.get(r, 0) + 1
        now = time.perf_counter()
        if now - self.last >= self.every or self.done == self.total:
            self.last = now
            rate = self.done / max(now - self.t0, 1e-9)
            eta = (self.total - self.done) / rate if rate else 0
            self.log(f"labelled {self.done}/{self.total} ({rate:.2f} docs/s, ETA {eta / 60:.1f} min"
                     + "".join(f", {k} {v}" for k, v in sorted(self.reasons.items())) + ")")


def label_documents(cfg: LabelConfig, log: Callable[[str], None] = print) -> dict:
    """Label what the store lacks, then write labelled.jsonl and the report; returns the report."""
    import httpx
    out = Path(cfg.output)
    docs, skipped = read_inputs(cfg)
    if not docs:
        raise LabelError(f"no document in {', '.join(cfg.languages)} to label in {[s.describe() for s in cfg.input]}")
    labeller = cfg.labeller()
    store = LabelStore(out / STORE)
    keys = [f"{labeller}:{text_hash(d['text'])}" for d in docs]
    todo = {k: d for k, d in zip(keys, docs) if store.get(k) is None}
    log(f"{len(docs)} documents, {len(docs) - len(todo)} labelled before (store {store.path}), "
        f"{len(todo)} to ask {cfg.endpoint} ({cfg.concurrency} at a time)")
    headers = {}
    if cfg.api_key_env:
        if not os.environ.get(cfg.api_key_env):
            raise LabelError(f"api_key_env: environment variable {cfg.api_key_env} is not set (it should hold the endpoint's API key)")
        headers["Authorization"] = f"Bearer {os.environ[cfg.api_key_env]}"
    progress = Progress(len(todo), cfg.progress_every_s, log)
    t0 = time.perf_counter()
    fresh: list[dict] = []
    try:
        with httpx.Client(headers=headers, limits=httpx.Limits(max_connections=cfg.concurrency)) as client, \
                ThreadPoolExecutor(cfg.concurrency, thread_name_prefix="label") as pool:
            pending = iter(todo.items())
            running = {}
            while True:
                while len(running) < cfg.concurrency * 2 and (nxt := next(pending, None)):
                    k, d = nxt
                    prompt = cfg.prompt(d["lang"]).replace("{text}", d["text"][:cfg.max_chars])
                    running[pool.submit(ask, client, cfg, prompt, k)] = (k, d)
                if not running:
                    break
                done = next(as_completed(running))
                k, d = running.pop(done)
                rec = {"key": k, "lang": d["lang"], "labeller": labeller, "model": cfg.model, **done.result()}
                store.add(rec)
                fresh.append(rec)
                progress.add(rec)
    finally:
        store.close()
    report = write_outputs(cfg, docs, keys, store, fresh, time.perf_counter() - t0, skipped)
    return report


def cost(records: list[dict], seconds: float | None, price: tuple[float, float] | None) -> dict:
    """Tokens, seconds and (with a price) money per 1,000 documents, from the answers' `usage`;
    seconds None: the requests' own seconds summed (as if asked one at a time)."""
    n = len(records)
    seconds = sum(r["seconds"] for r in records) if seconds is None else seconds
    t_in, t_out = sum(r["tokens_in"] for r in records), sum(r["tokens_out"] for r in records)
    per = lambda x: round(x * 1000 / n, 2) if n else None
    out = {"documents": n, "tokens_in": t_in, "tokens_out": t_out, "seconds": round(seconds, 2),
           "docs_per_s": round(n / seconds, 3) if n and seconds > 0 else None,
           "per_1000_docs": {"tokens_in": per(t_in), "tokens_out": per(t_out), "seconds": per(seconds)}}
    if price is not None and n:
        out["per_1000_docs"]["cost"] = round((t_in * price[0] + t_out * price[1]) / 1e6 * 1000 / n, 4)
    return out


def write_outputs(cfg: LabelConfig, docs, keys, store: LabelStore, fresh, seconds: float, skipped: dict) -> dict:
    """labelled.jsonl (every document, input order) and label_report.json, both atomic."""
    lines, by_lang = [], {}
    for d, k in zip(docs, keys):
        rec = store.records.get(k) or {"score": None, "reason": "error: not asked"}
        score = rec["score"]
        cls = "none" if score is None else "hq" if score >= cfg.hq_threshold else "lq"
        lines.append(json.dumps({"id": d["id"], "lang": d["lang"], "llm_edu_score": score, "edu_class": cls,
                                 "reason": rec["reason"], "text": d["text"]}, ensure_ascii=False) + "\n")
        s = by_lang.setdefault(d["lang"], {"documents": 0, "scored": 0, "reasons": {}, "scores": {}})
        s["documents"] += 1
        if score is None:
            r = rec["reason"].split(":")[0]
            s["reasons"][r] = s["reasons"].get(r, 0) + 1
        else:
            s["scored"] += 1
            s["scores"][str(round(score))] = s["scores"].get(str(round(score)), 0) + 1
    write_bytes_atomic(Path(cfg.output) / LABELLED, "".join(lines).encode())
    report = {"endpoint": cfg.endpoint, "model": cfg.model, "labeller": cfg.labeller(), "documents": len(docs),
              "asked_this_run": len(fresh), "from_store": len(docs) - len(fresh), "skipped": skipped,
              "torn_store_lines": store.torn, "by_lang": dict(sorted(by_lang.items())),
              "this_run": cost(fresh, seconds, cfg.price_per_million_tokens),
              "all_answers": cost([r for r in (store.records.get(k) for k in dict.fromkeys(keys)) if r], None,
                                  cfg.price_per_million_tokens),
              "store": str(store.path), "labelled": str(Path(cfg.output) / LABELLED)}
    write_json_atomic(Path(cfg.output) / REPORT, report)
    return report
