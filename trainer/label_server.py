"""`quipu serve-labeller`: a small OpenAI-compatible chat-completions endpoint over a local causal LM
(the shipped SmolLM2-135M-Instruct by default, any HF causal-LM folder or .gguf file), so that
`quipu label` runs on a CPU-only machine, in tests and in the demo, with nothing downloaded.

It answers `POST /v1/chat/completions` (messages through the model's chat template, greedy decoding
up to `max_tokens`, `usage` with prompt and completion tokens), `GET /v1/models` and `GET /health`.
One request is generated at a time (a lock: the model is not thread-safe and a CPU has no spare
cores anyway); others wait in the threaded server's queue. On a GPU machine use vLLM, TGI or
llama.cpp's server instead: they batch requests.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from quipu.trainer.teacher import Teacher, TeacherSettings

MAX_NEW_TOKENS = 512


class Generator:
    """A loaded causal LM answering chat messages greedily (deterministic)."""

    def __init__(self, path: str | None = None, device: str = "auto", threads: int | None = None,
                 max_input_tokens: int = 2048):
        self.teacher = Teacher(path, TeacherSettings(device=device, threads=threads))
        self.name = self.teacher.path.name
        self.max_input_tokens = max_input_tokens
        self.lock = threading.Lock()

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        tok = self.teacher.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        else:   # a base model: the messages as plain text
            ids = tok("\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\nassistant:")["input_ids"]
        return list(ids)[-self.max_input_tokens:]

    def complete(self, messages: list[dict], max_tokens: int) -> tuple[str, int, int]:
        """(answer, prompt tokens, completion tokens)."""
        import torch
        ids = self.prompt_ids(messages)
        model, tok = self.teacher.model, self.teacher.tokenizer
        x = torch.tensor([ids], device=self.teacher.device)
        with self.lock, torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max(1, min(max_tokens, MAX_NEW_TOKENS)),
                                 do_sample=False, pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        new = out[0, len(ids):].tolist()
        return tok.decode(new, skip_special_tokens=True), len(ids), len(new)


def handler(gen: Generator):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):   # one line per request would drown the labelling run's progress
            pass

        def reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.rstrip("/") in ("/health", "/v1/health"):
                return self.reply(200, {"status": "ok"})
            if self.path.rstrip("/") == "/v1/models":
                return self.reply(200, {"object": "list", "data": [{"id": gen.name, "object": "model"}]})
            self.reply(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self):
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self.reply(404, {"error": {"message": f"no route {self.path}"}})
            try:
                req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                messages = [{"role": str(m["role"]), "content": str(m["content"])} for m in req["messages"]]
            except (ValueError, KeyError, TypeError) as e:
                return self.reply(400, {"error": {"message": f"bad request: {e}"}})
            answer, n_in, n_out = gen.complete(messages, int(req.get("max_tokens") or 256))
            self.reply(200, {"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()),
                             "model": gen.name, "choices": [{"index": 0, "finish_reason": "stop" if n_out < int(req.get("max_tokens") or 256) else "length",
                                                             "message": {"role": "assistant", "content": answer}}],
                             "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}})
    return Handler


def make_server(gen: Generator, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), handler(gen))
    server.daemon_threads = True
    return server
