"""The study's whole cost (dpgrid.results.study): every grid that trains on a dataset is entered once in that dataset's
ledger; `dpgrid budget` composes them (checked against dp-accounting's RDP accountant, which dpgrid did not write);
privacy.study_budget refuses a grid that would take the study past it, before anything is written; concurrent
grids lose no entry and a resumed or killed one is not counted twice."""

import json
import math
import multiprocessing
import signal

import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from dpgrid import DpgridError
from dpgrid.config import compile
from dpgrid.results import study
from dpgrid.runner import train

from .command import dpgrid
from .conftest import load_cfg

SMALL = {"grid.k": 2, "train.seeds": 1, "train.epochs": 1}


def spec_of(strategy="fixed_threshold", ledger=None, **extra):
    settings = {**SMALL, **extra}
    if ledger is not None:
        settings["privacy.study_ledger"] = str(ledger)
    return compile(load_cfg("digits", strategy, **settings))


def entries(ledger) -> list:
    return [e for folder in sorted(ledger.iterdir()) if folder.is_dir() for e in study.read_entries(folder)]


def independent(events, delta):
    """dp-accounting's RDP accountant over [(q, nu, steps)]."""
    accountant = rdp_privacy_accountant.RdpAccountant()
    for q, nu, steps in events:
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(nu)), steps)
    return accountant.get_epsilon(delta)


def test_each_grid_is_entered_once_and_resumed_or_split_grids_are_not_counted_twice(tmp_path):
    ledger = tmp_path / "ledger"
    first = spec_of(ledger=ledger)
    train(first, tmp_path / "a", progress=False)
    train(first, tmp_path / "a", progress=False)  # resumed: nothing to train, no second entry
    online = spec_of("online", ledger=ledger)
    train(online, tmp_path / "b", progress=False)
    split = [spec_of(ledger=ledger, **{"privacy.epsilon": 5, "grid.only": f"[{c}]"}) for c in ("lr0_clip0", "lr1_clip1")]
    for part in split:  # one grid, split across two jobs into one run directory: one entry
        train(part, tmp_path / "c", progress=False)
    found = entries(ledger)
    assert len(found) == 3 and {e["grid"] for e in found} == {str((tmp_path / n).absolute()) for n in "abc"}
    assert len({e["data"] for e in found}) == 1  # one dataset, whatever the grid
    entry = next(e for e in found if e["grid"].endswith("/b"))
    assert entry["epsilon"] == pytest.approx(online.plan.epsilon_with_seeds) and entry["strategy"] == "online"
    assert entry["events"] == [[online.plan.sample_rate, online.plan.noise_multiplier,
                                online.plan.n_configs * online.plan.seeds * online.plan.steps]]


def test_the_composition_is_dp_accountings_over_every_grids_steps(tmp_path):
    ledger = tmp_path / "ledger"
    specs = [spec_of(s, ledger=ledger) for s in ("fixed_threshold", "online")]
    for n, spec in enumerate(specs):
        train(spec, tmp_path / str(n), progress=False)
    (folder,) = [p for p in ledger.iterdir() if p.is_dir()]
    total = study.composed(study.accounts_of(study.read_entries(folder)), 1e-5)
    events = [(s.plan.sample_rate, s.plan.noise_multiplier, s.plan.n_configs * s.plan.seeds * s.plan.steps)
              for s in specs]
    assert total["rdp"] == pytest.approx(independent(events, 1e-5), rel=0.01)
    assert total["pld"] <= total["rdp"] and total["pld"] > max(s.plan.epsilon_with_seeds for s in specs)
    assert total["rdp"] < sum(s.plan.epsilon_with_seeds for s in specs)  # tighter than adding them


def test_a_selection_adds_its_epsilon_and_a_non_private_grid_makes_the_study_infinite():
    accounts = [{"epsilon": 2.0, "delta": 1e-5, "events": [[0.1, 1.5, 100]]}, {"epsilon": 1.0, "delta": 1e-6,
                                                                                "events": None}]
    total = study.composed(accounts, 1e-5)
    assert total["rdp"] == pytest.approx(independent([(0.1, 1.5, 100)], 1e-5) + 1.0, rel=0.01)
    assert total["delta"] == pytest.approx(1e-5 + 1e-6) and total["pld"] is None
    assert math.isinf(study.composed([*accounts, {"epsilon": None, "delta": 0.0, "events": None}], 1e-5)["rdp"])


def test_a_study_budget_refuses_the_grid_that_would_pass_it_before_anything_is_written(tmp_path):
    ledger = tmp_path / "ledger"
    train(spec_of(ledger=ledger, **{"privacy.study": "s1"}), tmp_path / "a", progress=False)
    over = spec_of("online", ledger=ledger, **{"privacy.study": "s1", "privacy.study_budget": 3.5})
    with pytest.raises(DpgridError, match=r"^privacy.study_budget=3.5: 1 grid\(s\) on digits have spent "
                                          r"epsilon = 3 .*this grid would take it to 3\.\d+ \(delta = 1e-05\), past the budget \(0\.5\d* left\)"
                       ) as refused:
        train(over, tmp_path / "b", progress=False)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "b").exists() and len(entries(ledger)) == 1
    other = spec_of("online", ledger=ledger, **{"privacy.study": "s2", "privacy.study_budget": 3.5})
    with pytest.raises(DpgridError, match=r"^privacy.study_budget=3.5: 1 grid\(s\) on digits"):
        train(other, tmp_path / "c", progress=False)  # another study's name: the same data, the same budget
    roomy = spec_of("online", ledger=ledger, **{"privacy.study": "s2", "privacy.study_budget": 5})
    train(roomy, tmp_path / "c", progress=False)
    assert len(entries(ledger)) == 2


def test_a_fine_tuned_grid_counts_its_checkpoint_once(tmp_path):
    ledger = tmp_path / "ledger"
    base = spec_of(ledger=ledger)
    train(base, tmp_path / "base", progress=False)
    tuned = spec_of(ledger=ledger, **{"model.init": str(tmp_path / "base" / "model" / "seed0.safetensors")})
    train(tuned, tmp_path / "tuned", progress=False)
    (folder,) = [p for p in ledger.iterdir() if p.is_dir()]
    found = study.read_entries(folder)
    assert len(study.accounts_of(found)) == 2  # the checkpoint's grid is in the ledger: its accounts not again
    alone = [e for e in found if e["grid"].endswith("tuned")]
    assert len(study.accounts_of(alone)) == 2  # its checkpoint's grid forgotten: the checkpoint's accounts count


def enter_one(args):
    """A process entering one grid in the ledger (a sweep's job: each its own grid, here by its epsilon)."""
    ledger, out, budget, epsilon = args
    spec = spec_of(ledger=ledger, **{"privacy.epsilon": epsilon, **({"privacy.study_budget": budget} if budget else {})})
    try:
        study.enter(spec, out, {})
        return "entered"
    except DpgridError:
        return "refused"


@pytest.mark.slow
def test_concurrent_grids_lose_no_entry_and_a_budget_admits_exactly_what_fits(tmp_path):
    """Eight processes enter eight grids (epsilons a millionth apart: other grids, the same cost) at once: eight entries. Then eight more at once under a budget that two more
    grids fit: exactly two are admitted (the check and the entry are one step, under the dataset's lock)."""
    ledger = tmp_path / "ledger"
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        assert pool.map(enter_one, [(ledger, tmp_path / f"g{n}", None, 3 + n * 1e-6) for n in range(8)]) == ["entered"] * 8
        assert len(entries(ledger)) == 8
        spec = spec_of(ledger=ledger)
        one = spec.plan.epsilon_with_seeds
        (folder,) = [p for p in ledger.iterdir() if p.is_dir()]
        events = [e for entry in study.read_entries(folder) for e in entry["events"]]
        ten = study.composed([{"epsilon": one, "delta": 1e-5, "events": events + 2 * spec_events(spec)}], 1e-5)["rdp"]
        eleven = study.composed([{"epsilon": one, "delta": 1e-5, "events": events + 3 * spec_events(spec)}], 1e-5)["rdp"]
        budget = (ten + eleven) / 2
        said = pool.map(enter_one, [(ledger, tmp_path / f"h{n}", budget, 3 + (8 + n) * 1e-6)
                                      for n in range(8)])
    assert said.count("entered") == 2 and len(entries(ledger)) == 10


def spec_events(spec) -> list:
    return [[spec.plan.sample_rate, spec.plan.noise_multiplier, spec.plan.n_configs * spec.plan.seeds * spec.plan.steps]]


@pytest.mark.slow
def test_a_grid_killed_after_its_entry_is_counted_once_when_it_resumes(tmp_path):
    from .command import start_paused

    ledger = tmp_path / "ledger"
    args = ["run", "strategy=fixed_threshold", "grid.k=2", "train.seeds=1", "train.epochs=1",
            f"privacy.study_ledger={ledger}", f"hydra.run.dir={tmp_path / 'grid'}"]
    proc, go = start_paused(args, after=1, folder=tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(entries(ledger)) == 1  # entered before it trained: a killed grid has spent what it trained
    r = dpgrid(*args)
    assert r.returncode == 0, r.stderr
    assert len(entries(ledger)) == 1


@pytest.mark.slow
def test_dpgrid_budget_lists_composes_and_forgets_only_when_asked(tmp_path):
    ledger = tmp_path / "ledger"
    for strategy, name in (("fixed_threshold", "a"), ("online", "b")):
        r = dpgrid("run", f"strategy={strategy}", "grid.k=2", "train.seeds=1", "train.epochs=1", "privacy.study=mine",
                   f"privacy.study_ledger={ledger}", f"hydra.run.dir={tmp_path / name}")
        assert r.returncode == 0, r.stderr
    shown = dpgrid("budget", "--ledger", ledger)
    assert shown.returncode == 0, shown.stderr
    assert "digits (data " in shown.stdout and shown.stdout.count("epsilon = 3,") == 2
    assert "composed, every grid above together: epsilon = " in shown.stdout and "(RDP, Opacus)" in shown.stdout
    as_json = json.loads(dpgrid("budget", "--ledger", ledger, "--json").stdout)
    assert len(as_json["datasets"][0]["grids"]) == 2
    assert dpgrid("budget", "--ledger", ledger, "--study", "other").stdout.startswith("no grid in the ledger")
    refused = dpgrid("budget", "--ledger", ledger, "--before", "2020-01-01")
    assert refused.returncode == 2 and "--before chooses what --forget forgets" in refused.stderr
    assert len(entries(ledger)) == 2  # nothing forgotten without --forget
    forgot = dpgrid("budget", "--ledger", ledger, "--forget", "--study", "mine")
    assert forgot.returncode == 0 and forgot.stdout.startswith("forgot 2 grid(s) on digits") and \
        "the data were used all the same" in forgot.stdout
    assert entries(ledger) == []
