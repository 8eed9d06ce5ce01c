"""The README's and its docs' promises that are words, not code: they must stay stated (privacy in every mode, point 2).
The README leads with two commands and the common tasks; the rest lives in docs/ (usage, accounting, guarantees)."""

import pytest

from .conftest import ROOT


def guarantees() -> str:
    return " ".join((ROOT / "docs" / "guarantees.md").read_text().split())


def test_guarantees_say_seeded_runs_are_for_reproduction_and_point_to_secure_mode():
    g = guarantees()
    assert "the ε of a seeded run holds only against an adversary who does not know the seeds" in g
    assert "For sensitive data use `privacy.secure_rng=true`" in g


def test_guarantees_state_what_is_not_covered():
    g = guarantees()
    for topic in ("*Timing side channels.*", "*Floating-point attacks on the Gaussian sampler.*",
                  "*Composition with anything outside dpgrid.*", "*Shuffled batches.*"):
        assert topic in g, topic


def test_the_readmes_accounting_figures_are_what_dpgrid_plan_prints():
    """The README quotes per-grid RDP nu for MNIST fixed_threshold, k = 7, epsilon = 3, and the Liu-Talwar comparison:
    each must be the plan's own number at the precision quoted."""
    import dpgrid

    readme = (ROOT / "docs" / "accounting.md").read_text()
    plan = dpgrid.plan(dpgrid.compose(["dataset=mnist", "strategy=fixed_threshold", "grid.k=7"]))
    assert f"per grid RDP {plan.noise_multiplier:.3f}" in readme
    per_run = dpgrid.plan(dpgrid.compose(["dataset=mnist", "strategy=fixed_threshold", "grid.k=7",
                                          "privacy.budget=per_run"]))
    text = " ".join(readme.split())
    assert f"per run RDP {per_run.noise_multiplier:.3f}" in text and f"({per_run.epsilon_grid:.1f} for that grid" in text
    small = dpgrid.plan(dpgrid.compose(["dataset=mnist", "strategy=online", "grid.k=7"]))
    assert (f"K = 7: ν {small.noise_multiplier:.2f} vs {small.record.liu_talwar['noise_multiplier']:.2f} for LT" in readme
            and f"K = 49: {plan.noise_multiplier:.2f} vs {plan.record.liu_talwar['noise_multiplier']:.2f}" in readme)


@pytest.mark.slow  # plans every grid the protocol's reference table quotes (2 s): the docs, not the code, change it
def test_the_protocols_reference_figures_are_what_dpgrid_plan_prints():
    """docs/protocol.md §3 quotes nu for MNIST at epsilon 3 and 9: one run, online's K = 7, fixed_threshold's K = 49."""
    import dpgrid

    text = " ".join((ROOT / "docs" / "protocol.md").read_text().split())
    nu = {}
    for eps in (3, 9):
        for name, extra in (("run", ["privacy.budget=per_run"]), ("k7", ["grid.k=7"]),
                            ("k49", ["strategy=fixed_threshold", "grid.k=7"])):
            nu[eps, name] = dpgrid.plan(dpgrid.compose(["dataset=mnist", f"privacy.epsilon={eps}", *extra])).noise_multiplier
    assert (f"ε = 3 gives ν = {nu[3, 'run']:.4f} for a single run" in text and f"{nu[3, 'k7']:.4f} for online's K = 7"
            in text and f"{nu[3, 'k49']:.4f} for fixed_threshold's K = 49" in text)
    assert f"ε = 9 gives {nu[9, 'run']:.5f} and {nu[9, 'k7']:.5f}" in text


def test_the_docs_need_nothing_outside_the_repository():
    for path in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]:
        assert "../shared" not in path.read_text(), path


REFUSED_ON_PURPOSE = {"strategy.clip0=-1"}  # the README times a refusal


@pytest.mark.slow  # plans every command the docs quote (4-6 s)
def test_the_commands_the_readme_quotes_still_run():
    """Every `dpgrid run|plan ...` the README and docs/usage.md quote (beside its times and figures) still composes and compiles
    (the one refusal it times is still refused), and every `python scripts/...` still exists and takes the
    options it is quoted with."""
    import re

    from dpgrid import DpgridError
    from dpgrid.api import compose
    from dpgrid.config import compile

    text = "".join((ROOT / page).read_text() for page in ("README.md", "docs/usage.md", "docs/reproduction.md",
                                                         "docs/performance.md", "docs/accounting.md"))
    quoted = {" ".join(c.split()) for c in re.findall(r"`((?:time )?(?:dpgrid (?:run|plan)|python scripts/)[^`]*)`", text)}
    dpgrid_commands = [c for c in quoted if "dpgrid " in c and "<" not in c and "..." not in c]
    scripts = [c for c in quoted if c.startswith("python scripts/")]
    assert len(dpgrid_commands) >= 6 and len(scripts) >= 3, quoted
    import shlex

    from dpgrid.config.compose import sweep_jobs

    for command in dpgrid_commands:
        words = shlex.split(command.replace("\\", " "))  # as a shell reads it: quotes taken off
        overrides = [a for a in words[2 + command.startswith("time"):] if not a.startswith("-")]
        if set(overrides) & REFUSED_ON_PURPOSE:
            with pytest.raises(DpgridError):
                compile(compose(overrides), plan=False)
        else:
            for job in sweep_jobs(overrides) if " -m " in command else [overrides]:  # a sweep: each of its jobs
                compile(compose(job), plan=False)
    for command in scripts:  # the options its argument parser declares (running each --help costs seconds)
        script = ROOT / command.split()[1]
        assert script.exists(), command
        declared = set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", script.read_text()))
        for flag in re.findall(r"--[\w-]+", command):
            assert flag in declared, (command, flag)


def test_the_minimal_configs_of_extending_md_run_as_written(tmp_path):
    """docs/extending.md shows the smallest strategy, model and dataset configs (each YAML block that starts with
    `# conf/<group>/<name>.yaml`): as written, on the search path, they compose, compile and train; and the dataset,
    which names no default model, is refused in one line without `model=`."""
    import re

    from dpgrid import DpgridError
    from dpgrid.api import compose, run_grid
    from dpgrid.config import compile

    text = (ROOT / "docs" / "extending.md").read_text()
    blocks = re.findall(r"```yaml\n# (conf/(\w+)/(\w+)\.yaml)\n(.*?)```", text, re.S)
    assert {group for _, group, _, _ in blocks} == {"strategy", "model", "dataset"}, blocks
    names = {}
    for path, group, name, body in blocks:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(body)
        names[group] = name
    searchpath = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    chosen = [f"{group}={name}" for group, name in names.items()]
    spec = compile(compose([searchpath, *chosen, "grid.k=2", "train.epochs=1", "train.seeds=1"]))
    assert spec.plan.dataset == names["dataset"] and spec.plan.strategy == names["strategy"]
    assert len(run_grid(spec, tmp_path / "out", progress=False).summary) == 4
    with pytest.raises(DpgridError, match=r"names no model: pass model=<name>"):
        compose([searchpath, *(c for c in chosen if not c.startswith("model="))])


def test_the_clip_schedule_of_extending_md_is_the_examples_code():
    """docs/extending.md shows examples/'s clip_decay.py as it is (tests/test_plugin_strategy.py runs it)."""
    doc = (ROOT / "docs" / "extending.md").read_text()
    start = doc.index("```python\nclass ClipDecay")
    block = doc[start + len("```python\n"):doc.index("```", start + 3)]
    assert block.strip() in (ROOT / "examples" / "dpgrid_example" / "clip_decay.py").read_text()


def test_the_scattering_figures_are_the_committed_record():
    """docs/scatternet.md quotes benchmarks/scattering_cpu.json (time per 1,000 images, MNIST's features computed and
    read back): a new record changes the figures, or this fails."""
    import json

    record = json.loads((ROOT / "benchmarks" / "scattering_cpu.json").read_text())["scattering"]
    text = " ".join((ROOT / "docs" / "scatternet.md").read_text().split())
    assert (f"{record['dpgrid_s_per_1000']:.2f} s per 1,000 images against kymatio's "
            f"{record['kymatio_s_per_1000']:.2f} s") in text
    assert (f"took {record['mnist_computed_s']:.0f} s to compute and keep (peak resident memory "
            f"{record['mnist_computed_peak_mb']:,.0f} MB)") in text
    assert (f"{record['mnist_read_back_s']:.2f} s to open and read back whole in a fresh process (peak "
            f"{record['mnist_read_back_peak_mb']:,.0f} MB") in text
