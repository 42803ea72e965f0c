"""`quipu label`: LLM labels from an OpenAI-compatible endpoint, over real HTTP: a deliberately flaky
local server (retries, timeouts, refusals, garbage, kill and resume) and `quipu serve-labeller` over
a tiny causal LM the test builds (no download)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from quipu.trainer.llm_labels import PROMPTS, LabelConfig, LabelStore, label_documents, parse_score
from tests.conftest import ROOT


def test_scores_are_parsed_from_answers_in_every_language():
    cases = {
        "The extract is basic. Educational score: 3": (3.0, None),
        "Justificación... Puntuación educativa: **4**": (4.0, None),
        "Pontuação educacional: 2/5": (2.0, None),
        "5": (5.0, None), " 4. ": (4.0, None),
        "score: 2 at first, but on reflection Educational score: 1": (1.0, None),
        "Educational score: 7": (None, "out_of_range"),
        "I can't evaluate this content.": (None, "refusal"),
        "Lo siento, no puedo ayudar con eso.": (None, "refusal"),
        "Desculpe, não posso avaliar.": (None, "refusal"),
        "lorem ipsum dolor sit amet": (None, "no_score"),
        "": (None, "empty"), None: (None, "empty"),
    }
    for answer, want in cases.items():
        assert parse_score(answer) == want, answer
    assert all("{text}" in p for p in PROMPTS.values())
    assert "Puntuación educativa" in PROMPTS["es"] and "Pontuação educacional" in PROMPTS["pt"]


class Flaky:
    """An OpenAI-compatible endpoint whose answer depends on a marker word in the document:
    ok<N> (score N), fail500 / slow / badjson / limit429 (fail on the first request, then answer),
    refuse, garbage; every request counted per document."""

    def __init__(self, delay: float = 0.0):
        self.requests: dict[str, int] = {}
        self.delay = delay
        self.lock = threading.Lock()
        flaky = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def send(self, status, body: bytes, headers=()):
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = req["messages"][0]["content"]
                marker = next(w for w in prompt.split() if w.startswith("doc-"))
                with flaky.lock:
                    n = flaky.requests[marker] = flaky.requests.get(marker, 0) + 1
                time.sleep(flaky.delay)
                kind = marker.split("-")[2]
                if n == 1 and kind == "fail500":
                    return self.send(500, b"overloaded")
                if n == 1 and kind == "limit429":
                    return self.send(429, b"slow down", [("Retry-After", "0")])
                if n == 1 and kind == "badjson":
                    return self.send(200, b"{not json")
                if n == 1 and kind == "slow":
                    time.sleep(1.5)
                answer = {"refuse": "I can't help with rating this.", "garbage": "zzz qqq"}.get(
                    kind, f"Fine text. Educational score: {kind[2:] if kind.startswith('ok') else 2}")
                body = {"choices": [{"message": {"role": "assistant", "content": answer}}],
                        "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(answer.split())}}
                self.send(200, json.dumps(body).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


KINDS = ["ok0", "ok3", "ok5", "fail500", "limit429", "badjson", "slow", "refuse", "garbage"]


def write_docs(path: Path, kinds=KINDS, langs=("es", "pt", "en")) -> list[dict]:
    rows = [{"id": f"d{i}", "lang": langs[i % len(langs)],
             "text": f"doc-{i}-{k} Un texto con palabras. Um texto com palavras. A text with words."}
            for i, k in enumerate(kinds)]
    rows.append({"id": "fr", "lang": "fr", "text": "doc-99-ok1 Un texte."})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def config(inp: Path, out: Path, url: str, **kw) -> LabelConfig:
    return LabelConfig(endpoint=url, input=[str(inp)], output=str(out), retries=2, backoff_s=0.01, timeout_s=1.0,
                       concurrency=3, progress_every_s=0.01, **kw)


def test_flaky_endpoint_every_document_labelled_or_reasoned_then_cached(tmp_path):
    """Transient failures are retried (500, 429 with Retry-After, a body that is not JSON, a timeout);
    refusals and garbage are stored with their reason; a language not asked for is counted; usage and
    a price give the cost per 1,000 documents; a second run asks nothing and writes the same bytes."""
    server = Flaky()
    try:
        rows = write_docs(tmp_path / "in.jsonl")
        lines: list[str] = []
        r = label_documents(config(tmp_path / "in.jsonl", tmp_path / "out", server.url,
                                   price_per_million_tokens=(1.0, 2.0)), log=lines.append)
        labelled = [json.loads(x) for x in (tmp_path / "out" / "labelled.jsonl").read_text().splitlines()]
        assert [x["id"] for x in labelled] == [x["id"] for x in rows if x["lang"] != "fr"]
        got = {x["text"].split()[0].split("-")[2]: (x["llm_edu_score"], x["reason"], x["edu_class"]) for x in labelled}
        assert got["ok0"] == (0.0, None, "lq") and got["ok3"] == (3.0, None, "hq") and got["ok5"][0] == 5.0
        assert {got[k][0] for k in ("fail500", "limit429", "badjson", "slow")} == {2.0}
        assert got["refuse"] == (None, "refusal", "none") and got["garbage"] == (None, "no_score", "none")
        assert server.requests[next(k for k in server.requests if k.endswith("slow"))] == 2
        assert r["skipped"]["other_language"] == 1 and r["asked_this_run"] == 9
        c = r["this_run"]
        assert c["tokens_in"] > 9 * 100 and c["tokens_out"] > 0
        assert c["per_1000_docs"]["cost"] == round((c["tokens_in"] + 2 * c["tokens_out"]) / 1e6 * 1000 / 9, 4)
        assert any("labelled 9/9" in x for x in lines) and any("refusal 1" in x for x in lines)
        before = (tmp_path / "out" / "labelled.jsonl").read_bytes()
        asked = sum(server.requests.values())
        again = label_documents(config(tmp_path / "in.jsonl", tmp_path / "out", server.url), log=lambda m: None)
        assert again["asked_this_run"] == 0 and again["from_store"] == 9 and sum(server.requests.values()) == asked
        assert (tmp_path / "out" / "labelled.jsonl").read_bytes() == before
    finally:
        server.close()


def test_errors_after_retries_are_recorded_and_asked_again(tmp_path):
    """An endpoint that is down: each document stored as `error:` (nothing lost), asked again next run."""
    write_docs(tmp_path / "in.jsonl", ["ok1", "ok2"])
    down = "http://127.0.0.1:9/v1"      # discard port: connection refused
    r = label_documents(config(tmp_path / "in.jsonl", tmp_path / "out", down, ), log=lambda m: None)
    assert r["by_lang"]["es"]["reasons"] == {"error": 1} and r["asked_this_run"] == 2
    server = Flaky()
    try:
        r = label_documents(config(tmp_path / "in.jsonl", tmp_path / "out", server.url), log=lambda m: None)
        assert r["asked_this_run"] == 2 and sum(s["scored"] for s in r["by_lang"].values()) == 2
    finally:
        server.close()


def test_a_killed_run_continues_where_it_stopped(tmp_path):
    """SIGKILL a labelling process mid-run, tear its store's last line as a kill mid-write would: the
    next run cuts the torn line, asks only what is missing (at most the requests that were in flight
    again) and ends with every document labelled."""
    server = Flaky(delay=0.25)
    try:
        write_docs(tmp_path / "in.jsonl", [f"ok{i % 6}" for i in range(24)], langs=("es",))
        out = tmp_path / "out"
        code = ("import sys; from quipu.trainer.llm_labels import LabelConfig, label_documents; "
                f"label_documents(LabelConfig(endpoint={server.url!r}, input=[{str(tmp_path / 'in.jsonl')!r}], "
                f"output={str(out)!r}, concurrency=2, languages=['es']), log=lambda m: None)")
        p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        store = out / "labels.jsonl"
        deadline = time.time() + 60
        while time.time() < deadline and (not store.exists() or store.read_text().count("\n") < 6):
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        first = store.read_text().count("\n")
        assert 6 <= first < 24, p.stderr.read()[-500:]
        with open(store, "a") as fh:
            fh.write('{"key": "torn')
        asked = sum(server.requests.values())
        r = label_documents(LabelConfig(endpoint=server.url, input=[str(tmp_path / "in.jsonl")], output=str(out),
                                        concurrency=2, languages=["es"]), log=lambda m: None)
        assert r["torn_store_lines"] == 1 and r["from_store"] == first and r["asked_this_run"] == 24 - first
        assert sum(server.requests.values()) - asked == 24 - first
        assert max(server.requests.values()) <= 2      # only what was in flight at the kill was asked twice
        assert sum(s["scored"] for s in r["by_lang"].values()) == 24
        assert len(LabelStore(store).records) == 24
    finally:
        server.close()


def test_bad_config_is_one_line_naming_the_key(tmp_path):
    from quipu.flows.config import load_config
    with pytest.raises(Exception, match="endpoint"):
        load_config(LabelConfig, data={"input": ["x.jsonl"], "endpoint": "localhost:8080"})
    with pytest.raises(Exception, match="prompts.es"):
        load_config(LabelConfig, data={"input": ["x.jsonl"], "prompts": {"es": "sin marcador"}})


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    """A tiny random causal LM (2-layer Llama) in place of SmolLM2, whose load alone is half a minute."""
    from tests.test_perplexity import build_tiny_teacher
    return build_tiny_teacher(tmp_path_factory.mktemp("lm"))


@pytest.fixture(scope="module")
def labeller(tiny_lm):
    """`quipu serve-labeller`'s server over the tiny LM, on a free port."""
    from quipu.trainer.label_server import Generator, make_server
    gen = Generator(str(tiny_lm), device="cpu")
    server = make_server(gen, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield gen, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_serve_labeller_answers_the_shipped_config_over_http(labeller, tmp_path):
    """configs/label/edu.yaml as shipped (only the endpoint, input and output moved) against the
    serve-labeller endpoint over real HTTP: every document gets a score or a reason, and `usage`
    counts the prompt's tokens as the model's tokenizer does."""
    from quipu.flows.config import load_config
    gen, url = labeller
    rows = write_docs(tmp_path / "in.jsonl", ["a", "b", "c"])
    cfg = load_config(LabelConfig, ROOT / "configs/label/edu.yaml",
                      [f"endpoint={url}", f"output={tmp_path / 'out'}", f"input=['{tmp_path / 'in.jsonl'}']", "max_tokens=6"])
    report = label_documents(cfg, log=lambda m: None)
    store = LabelStore(tmp_path / "out" / "labels.jsonl").records.values()
    assert len(store) == 3 and all((r["score"] is None) != (r["reason"] is None) for r in store)
    prompt = PROMPTS["es"].replace("{text}", rows[0]["text"])
    want = len(gen.prompt_ids([{"role": "user", "content": prompt}]))
    assert next(r for r in store if r["lang"] == "es")["tokens_in"] == want
    assert 0 < report["this_run"]["tokens_out"] <= 3 * 6


def test_labels_train_the_fasttext_judge_as_shipped(tmp_path):
    """Labels from the endpoint -> configs/quality/edu.yaml (its inputs pointed at the labels) -> a
    fastText judge that the `edu` stage applies: the LLM's good documents score above its poor ones."""
    import random

    from quipu.flows.config import load_config
    from quipu.tasks.classifiers.quality_edu import EduConfig, EduFilter
    from quipu.trainer.classifier_train import ClassifierTrainConfig, evaluate_file, model_meta, prepare_data, train_model
    from quipu.scoring.fasttext_classifier import model_sidecar
    from quipu.catalog.files import write_json_atomic
    rng = random.Random(0)
    good = "la fotosíntesis convierte la luz en energía química en las plantas y las algas verdes".split()
    poor = "compra ahora oferta barata descuento gratis envío clic aquí mejor precio ganga".split()
    rows = [{"id": f"d{i}", "lang": "es", "text": f"doc-{i}-ok{4 if i % 2 else 1} " +
             " ".join(rng.choice(good if i % 2 else poor) for _ in range(30))} for i in range(80)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    server = Flaky()
    try:
        label_documents(config(tmp_path / "in.jsonl", tmp_path / "labels", server.url), log=lambda m: None)
    finally:
        server.close()
    labelled = str(tmp_path / "labels" / "labelled.jsonl")
    cfg = load_config(ClassifierTrainConfig, ROOT / "configs/quality/edu.yaml", [
        f"positive=[{{path: '{labelled}', where: {{edu_class: hq}}}}]",
        f"negative=[{{path: '{labelled}', where: {{edu_class: lq}}}}]", f"output={tmp_path / 'edu'}"])
    data = prepare_data(cfg, cfg.output)
    model = str(Path(cfg.output) / "model.bin")
    write_json_atomic(model_sidecar(model), model_meta(cfg, data))
    train_model(data["train"], cfg.fasttext, cfg.seed, model)
    assert evaluate_file(model, data["valid"], cfg.threshold)["roc_auc"] >= 0.9
    import pyarrow as pa
    stage = EduFilter(EduConfig(enabled=True, model=model))
    table = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows], "lang": ["es"] * 80})
    out = stage.process(table)
    scores = out.kept.column("edu_score").to_pylist() + out.removed.column("edu_score").to_pylist()
    ids = out.kept.column("id").to_pylist() + out.removed.column("id").to_pylist()
    by_id = dict(zip(ids, scores))
    assert min(by_id[f"d{i}"] for i in range(1, 80, 2)) > max(by_id[f"d{i}"] for i in range(0, 80, 2))


def test_labels_train_a_head_on_frozen_layers_that_hf_judge_applies(tiny_lm, tmp_path):
    """`quipu label-head` on a tiny Llama in place of SmolLM2 (its load alone is half a minute): a
    linear head on 1 frozen layer learns the labels (well above chance), and the folder it writes is an ordinary HF
    classifier the `hf_judge` stage scores with, to the same numbers the head's evaluation saw."""
    import random

    import pyarrow as pa

    from quipu.tasks.classifiers.transformer_judge import HfJudge, HfJudgeConfig
    from quipu.trainer.label_head import LabelHeadConfig, train_label_head
    rng = random.Random(1)
    words = "the cat sat on a mat and saw the dog run over hills".split()
    rows = []
    for i in range(120):
        score = float(i % 2 * 4 + 1)     # 1 or 5, told by the document's last words
        end = "good science lesson" if score == 5 else "buy cheap now"
        rows.append({"id": f"d{i}", "lang": "en", "llm_edu_score": score, "edu_class": "hq" if score >= 3 else "lq",
                     "text": " ".join(rng.choice(words) for _ in range(rng.randint(5, 30))) + " " + end})
    (tmp_path / "labelled.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = LabelHeadConfig(labels=str(tmp_path / "labelled.jsonl"), output=str(tmp_path / "head"),
                          teacher=str(tiny_lm), layers=1, max_tokens=64, device="cpu")
    report = train_label_head(cfg, log=lambda m: None)
    # a random 32-wide model's states tell the classes apart only partly: well above chance (0.5) is the bar
    assert report["valid"]["n"] == 24 and report["valid"]["hq_agreement"] >= 0.75 and report["valid"]["spearman"] > 0.4
    assert not (tmp_path / "head.tmp").exists() and (tmp_path / "head" / "eval.json").is_file()
    stage = HfJudge(HfJudgeConfig(enabled=True, model=str(tmp_path / "head"), device="cpu"))
    table = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows], "lang": ["en"] * 120})
    scores = dict(zip(table.column("id").to_pylist(), stage.score(table)))
    agree = sum((scores[r["id"]] >= 3) == (r["llm_edu_score"] >= 3) for r in rows) / 120
    assert abs(agree - (report["train"]["hq_agreement"] * 96 + report["valid"]["hq_agreement"] * 24) / 120) < 1e-3
