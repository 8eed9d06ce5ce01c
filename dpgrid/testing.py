"""Checks a plugin's own tests call: that a strategy which says `stacks = True` gives every run, trained in a stacked
group, the numbers it gets trained alone.

    from dpgrid.testing import check_stacked

    def test_my_strategy_stacks():
        check_stacked("my_strategy", "hydra.searchpath=[pkg://my_plugins.conf]")

The grid is small (digits, k = 2, 2 seeds, 12 steps, validated every 3) and trains in float64, where stacking changes
nothing but float rounding far below what a step written for one run would get wrong (a statistic pooled over the
group's runs, a clip or learning rate read as one number, a padded row counted).
"""

import math

from dpgrid import DpgridError


def check_stacked(strategy: str, *overrides: str, rtol: float = 1e-9) -> int:
    """Train `strategy`'s small grid (`overrides`: Hydra overrides, its search path among them) one run at a time and
    as one stacked group; AssertionError naming the run, the validation and the value that differ. Returns how many
    values were compared."""
    from dpgrid.api import compose
    from dpgrid.config import check_loaded, compile
    from dpgrid.data import load
    from dpgrid.runner import train_together

    spec = compile(compose([f"strategy={strategy}", "dataset=digits", "train.float64=true", "train.epochs=1",
                            "train.eval_every=3", "train.seeds=2", "grid.k=2", *overrides]))
    if not spec.strategy_cls.stacks:
        raise DpgridError(f"strategy={strategy}: {spec.strategy_cls.__name__} does not say `stacks = True`; nothing "
                          "to check")
    data = load(spec.dataset, spec.data_root, "cpu").in_float64()
    check_loaded(spec, data.n_train)
    runs = [(c, s) for c in spec.plan.configurations for s in range(spec.plan.seeds)]
    alone = [train_together(spec, data, [run])[0] for run in runs]
    stacked = train_together(spec, data, runs)
    compared = 0
    for (config, seed), a, b in zip(runs, alone, stacked):
        where = f"{config['config_id']} seed {seed}"
        assert (a.steps, a.diverged, len(a.curve)) == (b.steps, b.diverged, len(b.curve)), \
            f"{where}: alone {a.steps} steps (diverged {a.diverged}), stacked {b.steps} (diverged {b.diverged})"
        for ca, cb in zip(a.curve, b.curve):
            for key in ca:
                same = ca[key] == cb.get(key) or math.isclose(ca[key], cb.get(key, math.nan), rel_tol=rtol,
                                                              abs_tol=1e-12) or (ca[key] != ca[key] and cb[key] != cb[key])
                assert same, f"{where}, step {ca['step']}: {key} is {ca[key]!r} alone, {cb.get(key)!r} stacked"
                compared += 1
    return compared
