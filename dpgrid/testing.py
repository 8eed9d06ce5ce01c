"""Checks a plugin's own tests call: that a strategy which says `stacks = True` gives every run, trained in a stacked
group, the numbers it gets trained alone; that one which says `captures = True` gets them on batches padded as a CUDA
graph needs them.

    from dpgrid.testing import check_padded, check_stacked

    def test_my_strategy_stacks():
        check_stacked("my_strategy", "hydra.searchpath=[pkg://my_plugins.conf]")

    def test_my_strategy_pads():
        check_padded("my_strategy", "hydra.searchpath=[pkg://my_plugins.conf]")

The grid is small (digits, k = 2, 2 seeds, 12 steps, validated every 3) and trains in float64, where stacking changes
nothing but float rounding far below what a step written for one run would get wrong (a statistic pooled over the
group's runs, a clip or learning rate read as one number, a padded row counted), or what a step that counts the rows it
is handed would get wrong on a padded batch.
"""

import math

from dpgrid import DpgridError


def check_stacked(strategy: str, *overrides: str, rtol: float = 1e-9) -> int:
    """Train `strategy`'s small grid (`overrides`: Hydra overrides, its search path among them) one run at a time and
    as one stacked group; AssertionError naming the run, the validation and the value that differ. Returns how many
    values were compared."""
    from dpgrid.runner import train_together

    spec, data = small_grid(strategy, overrides)
    if not spec.strategy_cls.stacks:
        raise DpgridError(f"strategy={strategy}: {spec.strategy_cls.__name__} does not say `stacks = True`; nothing "
                          "to check")
    runs = [(c, s) for c in spec.plan.configurations for s in range(spec.plan.seeds)]
    alone = [train_together(spec, data, [run])[0] for run in runs]
    return same_numbers(runs, alone, train_together(spec, data, runs), "alone", "stacked", rtol)


def check_padded(strategy: str, *overrides: str, rtol: float = 1e-9) -> int:
    """Train `strategy`'s small grid on its batches as drawn and padded as a CUDA graph needs them (each Poisson batch
    to its capacity, dpgrid.training.graphs: here on the CPU), one run at a time and, where it stacks, as one stacked
    group; AssertionError naming the run, the validation and the value that differ. What `captures = True` asks of a
    strategy's step beyond reading no number on the host: a padded row (norm inf, mask 0) changes nothing. Returns how
    many values were compared."""
    from dpgrid.runner import train_together
    from dpgrid.training.graphs import says_captures

    spec, data = small_grid(strategy, overrides)
    if not says_captures(spec.strategy_cls):
        raise DpgridError(f"strategy={strategy}: {spec.strategy_cls.__name__} does not say `captures = True`; nothing "
                          "to check")
    runs = [(c, s) for c in spec.plan.configurations for s in range(spec.plan.seeds)]
    drawn = [train_together(spec, data, [run], padded=False)[0] for run in runs]
    padded = [train_together(spec, data, [run], padded=True)[0] for run in runs]
    compared = same_numbers(runs, drawn, padded, "as drawn", "padded", rtol)
    if spec.strategy_cls.stacks:
        compared += same_numbers(runs, drawn, train_together(spec, data, runs, padded=True), "alone as drawn",
                                 "stacked and padded", rtol)
    return compared


def small_grid(strategy: str, overrides: tuple) -> tuple:
    """(spec, data) of the checks' small grid: digits, k = 2, 2 seeds, one epoch validated every 3 steps, float64."""
    from dpgrid.config.compose import compose
    from dpgrid.config import check_loaded, compile
    from dpgrid.data import load

    spec = compile(compose([f"strategy={strategy}", "dataset=digits", "train.float64=true", "train.epochs=1",
                            "train.eval_every=3", "train.seeds=2", "grid.k=2", *overrides]))
    data = load(spec.dataset, spec.data_root, "cpu").in_float64()
    check_loaded(spec, data.n_train)
    return spec, data


def same_numbers(runs: list, first: list, second: list, how_first: str, how_second: str, rtol: float) -> int:
    """How many curve values of two trainings of `runs` were compared; AssertionError at the first that differs."""
    compared = 0
    for (config, seed), a, b in zip(runs, first, second):
        where = f"{config['config_id']} seed {seed}"
        assert (a.steps, a.diverged, len(a.curve)) == (b.steps, b.diverged, len(b.curve)), \
            f"{where}: {how_first} {a.steps} steps (diverged {a.diverged}), {how_second} {b.steps} (diverged {b.diverged})"
        for ca, cb in zip(a.curve, b.curve):
            for key in ca:
                same = ca[key] == cb.get(key) or math.isclose(ca[key], cb.get(key, math.nan), rel_tol=rtol,
                                                              abs_tol=1e-12) or (ca[key] != ca[key] and cb[key] != cb[key])
                assert same, f"{where}, step {ca['step']}: {key} is {ca[key]!r} {how_first}, {cb.get(key)!r} {how_second}"
                compared += 1
    return compared


def check_rule(module, inputs, *, runs: int = 3, rtol: float = 1e-9) -> int:
    """Check the fast engine's rule for `module`'s type (dpgrid.training.rules) against per-sample autograd, in
    float64: each sample's squared gradient norm over the module's parameters that train, weighted sums (two
    overlapping rows, and two with disjoint supports as online asks for them), the batch whole and in two chunks,
    every form the rule offers (MethodChoice) forced in turn, with output gradients that are zero at the first and last
    positions of every sample (or at all but one: a rule may drop such positions) as well as dense ones, and where the
    rule says `stacks` (and every parameter trains), `runs` copies of the module stacked. `inputs`: a batch (b, ...)
    the module takes. AssertionError naming what differs; returns how many values were compared.

        from dpgrid.testing import check_rule

        def test_my_layer_rule():
            check_rule(MyLayer(8), torch.randn(6, 5, 8))
    """
    import copy
    import itertools

    import torch

    from dpgrid.training.rules import MethodChoice, disjoint_subsets, rule_for, why_unserved

    module = copy.deepcopy(module).double()
    rule = rule_for(module)
    assert rule is not None, f"no rule is registered for {type(module).__name__} (dpgrid.training.rules.register_rule)"
    assert not why_unserved(module), why_unserved(module)
    a = inputs.double() if inputs.is_floating_point() else inputs
    names = tuple(name for name, p in module.named_parameters(recurse=False) if p.requires_grad)
    assert names, f"{type(module).__name__} has no parameter that trains"
    params = [getattr(module, name) for name in names]
    generator = torch.Generator().manual_seed(0)
    g = torch.randn(module(a).shape, generator=generator, dtype=torch.float64)
    gradients = [("", g)]
    if g.dim() >= 3 and g.shape[1] >= 3:  # zero along dim 1 (a sequence's positions) in every sample
        ends, one = g.clone(), torch.zeros_like(g)
        ends[:, 0], ends[:, -1], ends[0, 1] = 0, 0, 0
        one[:, 1] = g[:, 1]
        gradients += [(" (dead first and last positions)", ends), (" (one live position)", one)]
    b = len(a)

    def per_sample(g):
        return torch.stack([torch.cat([t.flatten() for t in torch.autograd.grad((module(a[i:i + 1]) * g[i:i + 1]).sum(),
                                                                                params)]) for i in range(b)])

    owns = [(what, g, per_sample(g)) for what, g in gradients]
    dense = torch.rand((2, b), generator=generator, dtype=torch.float64)
    disjoint = torch.zeros((2, b), dtype=torch.float64)
    disjoint[0, ::2], disjoint[1, 1::2] = dense[0, ::2], dense[1, 1::2]
    compared = 0

    def close(got, want, what):
        nonlocal compared
        assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        error = float((got - want).detach().norm() / want.detach().norm().clamp_min(1e-300))
        assert error <= rtol, f"{what}: relative error {error:.2e} against per-sample autograd"
        compared += want.numel()

    def flat(sums):
        return torch.cat([s.flatten(1) for s in sums], 1)

    def check(choice, form):
        half = b // 2
        for (rows, part), (dead, g, own) in itertools.product(
                ((slice(0, b), "the whole batch"), (slice(0, half), "the first chunk"),
                 (slice(half, b), "the second chunk")), owns):
            # what the engine records of the forward (rule.recorded), and the bare input where that is more
            recorded = rule.recorded(module, (a[rows],), module(a[rows]))
            for kept, how in [(recorded, "")] + ([(recorded[:1], ", bare input")] if len(recorded) > 1 else []):
                what = part + dead + how
                computed = rule.from_recorded(module, kept, g[rows], choice, names)
                close(computed.sq_norms(), own[rows].pow(2).sum(1), f"{form}, {what}: squared norms")
                for w, kind in ((dense, "dense"), (disjoint, "disjoint")):
                    w = w[:, rows]
                    close(flat(computed.weighted_sum(w, disjoint_subsets(w))), w @ own[rows],
                          f"{form}, {what}: weighted sums ({kind} rows)")

    choice = MethodChoice("auto")
    check(choice, "auto")
    forms = [name for _, _, times in choice.chosen.values() for name in times]
    for form in dict.fromkeys(forms):
        check(MethodChoice(form), form)
    if rule.stacks and len(names) == len(list(module.parameters(recurse=False))):  # a frozen part never stacks
        copies = [copy.deepcopy(module) for _ in range(runs)]
        for copied in copies[1:]:
            for p in copied.parameters():
                p.data.add_(torch.randn(p.shape, generator=generator, dtype=torch.float64))
        stacked = [torch.stack([getattr(c, name).detach() for c in copies]) for name in names]
        x = torch.stack([a] * runs)
        out = rule.stacked_forward(module, x, stacked)
        for run, copied in enumerate(copies):
            close(out[run], copied(a), f"stacked forward, run {run}")
        gs = torch.randn(out.shape, generator=generator, dtype=torch.float64)
        w = torch.rand((2, runs, b), generator=generator, dtype=torch.float64)
        pers = []
        for run, copied in enumerate(copies):
            ps = [getattr(copied, name) for name in names]
            pers.append(torch.stack([torch.cat([t.flatten() for t in torch.autograd.grad(
                (copied(a[i:i + 1]) * gs[run, i:i + 1]).sum(), ps)]) for i in range(b)]))
        for choice, form in [(MethodChoice("auto"), "auto")] + [(MethodChoice(f), f) for f in dict.fromkeys(forms)]:
            computed = rule(module, x, gs, choice, names, stacked=True)
            sums = computed.weighted_sum(w)
            for run, per in enumerate(pers):
                close(computed.sq_norms()[run], per.pow(2).sum(1), f"stacked ({form}), run {run}: squared norms")
                close(torch.cat([s[:, run].flatten(1) for s in sums], 1), w[:, run] @ per,
                      f"stacked ({form}), run {run}: sums")
    return compared
