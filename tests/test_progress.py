"""flows/progress.py as its docstrings state it: `say` writes nothing under --quiet and escapes
control characters line by line (a table keeps its lines); CountProgress says a line every
`every_s` seconds and always at the end; the held-out line's format."""
from __future__ import annotations

from quipu.flows import progress


def test_say_is_silent_when_quiet_and_escapes_control_characters_per_line(monkeypatch, capsys):
    monkeypatch.setenv(progress.VERBOSITY_ENV, "quiet")
    progress.say("nothing to see")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(progress.VERBOSITY_ENV, "normal")
    progress.say("file \x1b[31mred.jsonl\nsecond\tline")
    assert capsys.readouterr().err == "file \\x1b[31mred.jsonl\nsecond\\tline\n"


def test_count_progress_says_a_line_every_every_s_and_at_the_end(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(progress, "say", lines.append)
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    p = progress.CountProgress("labelled", total=10, every_s=5.0)
    for _ in range(4):              # 4 items in 4 s: no line yet
        clock[0] += 1.0
        p.advance()
    assert lines == []
    clock[0] += 1.0                 # 5 s since the start: a line, with the rate and what is left
    p.advance()
    assert lines == ["  labelled: 5/10  1.00/s  ETA 5s"]
    for _ in range(5):              # the last item says the end even within every_s
        p.advance()
    assert lines[-1] == "  labelled: 10/10  2.00/s  ETA 0s" and len(lines) == 2


def test_eval_groups_line():
    m = {"eval_bpb": 2.31, "eval_by_source": {"en-web": {"bpb": 2.1}, "es-news": {"bpb": 2.52}},
         "eval_by_lang": {"en": {"bpb": 2.1}, "es": {"bpb": 2.52}},
         "eval_tasks": {"empty": {"items": 0}, "qa": {"items": 5, "accuracy": 0.4, "answer_bpb": 1.5}}}
    assert progress.format_eval_groups(m) == ("all 2.3100 | source en-web 2.1000, es-news 2.5200 | "
                                              "lang en 2.1000, es 2.5200 | task qa acc 0.400 answer 1.5000")
