"""flows/progress.py as its docstrings state it: `say` writes nothing under --quiet and escapes
control characters line by line (a table keeps its lines); the held-out line's format."""
from __future__ import annotations

from quipu.flows import progress


def test_say_is_silent_when_quiet_and_escapes_control_characters_per_line(monkeypatch, capsys):
    monkeypatch.setenv(progress.VERBOSITY_ENV, "quiet")
    progress.say("nothing to see")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(progress.VERBOSITY_ENV, "normal")
    progress.say("file \x1b[31mred.jsonl\nsecond\tline")
    assert capsys.readouterr().err == "file \\x1b[31mred.jsonl\nsecond\\tline\n"


def test_eval_groups_line():
    m = {"eval_bpb": 2.31, "eval_by_source": {"en-web": {"bpb": 2.1}, "es-news": {"bpb": 2.52}},
         "eval_by_lang": {"en": {"bpb": 2.1}, "es": {"bpb": 2.52}},
         "eval_tasks": {"empty": {"items": 0}, "qa": {"items": 5, "accuracy": 0.4, "answer_bpb": 1.5}}}
    assert progress.format_eval_groups(m) == ("all 2.3100 | source en-web 2.1000, es-news 2.5200 | "
                                              "lang en 2.1000, es 2.5200 | task qa acc 0.400 answer 1.5000")
