"""Where no terminal shows the step bar (nohup, a cluster job, CI), a run says where its steps are in a line every
few seconds; a terminal's runs say nothing of the kind."""

import re

from dpgrid.training import train


def test_the_steps_are_said_every_few_seconds_without_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(train, "PROGRESS_S", 0.0)
    ticker = train.Ticker(True, 10, 2)
    for step in range(1, 4):
        ticker(step)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines  # nothing before the first step is done
    assert re.fullmatch(r"steps 2/10 \(2 runs together\), about \d+ s left for these", lines[-1]), lines


def test_nothing_is_said_where_the_bar_is_shown_or_seconds_have_not_passed(monkeypatch, capsys):
    monkeypatch.setattr(train, "PROGRESS_S", 0.0)
    off = train.Ticker(False, 10, 1)
    for step in range(1, 5):
        off(step)
    monkeypatch.setattr(train, "PROGRESS_S", 3600.0)
    soon = train.Ticker(True, 10, 1)
    for step in range(1, 5):
        soon(step)
    assert capsys.readouterr().err == ""
