"""Each command's --help is its own, with the defaults as its overrides compose them, and costs no torch import; the
console names the engine a grid proved; an audit says in words whether the claim and the mechanism stand."""

import subprocess
import sys

import pytest

from .command import dpgrid

COMMANDS = ("run", "plan", "tables", "model", "audit")


@pytest.mark.parametrize("command", COMMANDS)
def test_each_commands_help_is_its_own(command):
    r = dpgrid(command, "--help")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith(f"usage: dpgrid {command} ")
    others = [c for c in COMMANDS if c != command]
    assert not any(f"dpgrid {other} " in r.stdout for other in others), r.stdout[:400]


@pytest.mark.parametrize("command", ["run", "plan"])
def test_run_and_plan_help_show_the_defaults_as_composed(command):
    from dpgrid.config.compose import compose

    r = dpgrid(command, "--help")
    assert "${" not in r.stdout  # no raw interpolation
    digits = compose([])
    assert f"  privacy.epsilon = {digits.privacy.epsilon:g}: " in r.stdout
    assert f"  train.epochs = {digits.train.epochs}: " in r.stdout and "default with dataset=digits" in r.stdout
    mnist = compose(["dataset=mnist"])
    r = dpgrid(command, "--help", "dataset=mnist")  # the defaults of the dataset the overrides name
    assert f"  train.epochs = {mnist.train.epochs}: " in r.stdout and "default with dataset=mnist" in r.stdout
    assert mnist.train.epochs != digits.train.epochs  # (so that the line above tells them apart)


def test_help_with_an_override_that_does_not_compose_still_prints():
    r = dpgrid("run", "--help", "dataset=nope")
    assert r.returncode == 0 and "as conf/config.yaml writes it; the overrides given do not compose" in r.stdout
    assert "no dataset named 'nope'" in r.stdout and "${oc.select:dataset.default_epsilon,3}" in r.stdout


def test_audit_help_names_both_reasons_to_exit_1():
    text = dpgrid("audit", "--help").stdout
    assert "exits 1" in text and "the claim is falsified" in text and "differing from the plan" in text


def test_help_imports_no_torch():
    """`--help` answers at once: the audit's imported the training loop, torch and the bounds first (2.6 s)."""
    code = ("import sys, io, contextlib\nfrom dpgrid.commands.cli import main\n"
            "for command in %r:\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        main([command, '--help'])\n"
            "print('torch' in sys.modules)") % (COMMANDS,)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


def test_the_audits_verdict_is_said_in_words():
    from dpgrid.audit.verdict import verdict_line

    record = {"epsilon_claimed": 2.0, "epsilon_lower_bound": 0.4, "confidence": 0.95,
              "mechanism": {"verdict": "as planned"}}
    line = verdict_line(record)
    assert line.startswith("verdict: the claim stands") and "the mechanism stands" in line and "exit 1" not in line
    line = verdict_line({**record, "epsilon_lower_bound": 2.5})
    assert "the claim does NOT stand: the lower bound 2.5 exceeds the claimed epsilon 2" in line and line.endswith(
        "(exit 1)")
    line = verdict_line({**record, "mechanism": {"verdict": "differs"}})
    assert "the claim stands" in line and "the mechanism does NOT stand" in line and line.endswith("(exit 1)")
    line = verdict_line({**record, "mechanism": None})
    assert "the mechanism was not tested" in line and "--threat white_box" in line


@pytest.mark.slow  # trains a grid
def test_the_console_names_the_proved_engine_in_one_line(tmp_path):
    r = dpgrid("run", "grid.k=2", "train.seeds=1", "train.epochs=1", f"hydra.run.dir={tmp_path / 'grid'}")
    assert r.returncode == 0, r.stderr
    engine = [line for line in r.stderr.splitlines() if line.startswith("per-sample engine: ")]
    assert len(engine) == 1 and "proved against per-sample autograd" in engine[0] and "in train mode" in engine[0]
    assert engine[0] in (tmp_path / "grid" / "cli.log").read_text()
