"""How `dpgrid plan` prints a plan: the budget, the noise, what the tables' seeds cost, a selection's or a
schedule's figures, and the same (epsilon, delta) under the other accountants and accounting methods."""

import sys
import time


def print_plan(spec, compare: bool, start: float) -> None:
    """`dpgrid plan`: the grid's figures, its budget and noise (or its schedule, or that it is not private), the
    same (epsilon, delta) under the other accounting methods (and accountants, with `compare`) and its
    configurations; `start`: when planning began (perf_counter), for the timing line."""
    plan, seconds = spec.plan, time.perf_counter() - start
    print(f"{plan.strategy} on {plan.dataset}: K = {plan.n_configs} configurations x {plan.seeds} seeds, "
          f"k = {plan.k}, {plan.model_parameters:,} parameters")
    print(f"  N = {plan.n_train}, B = {plan.batch_size}, q = {plan.sample_rate:.5g}, "
          f"T = {plan.steps} steps per run, {plan.epochs:g} epoch{'s' if plan.epochs != 1 else ''}")
    if not spec.start.is_default:
        print(f"  {start_line(spec.start)}")
    from dpgrid.results.procedure import procedure_of

    procedure = procedure_of(plan.method)  # what the grid's procedure says of itself
    print(f"  accounted by {plan.method.name}" + (f" (privacy.selection={plan.selection})"
                                                 if plan.selection != plan.method.name else "")
          + (f"; neighbouring datasets: {plan.method.adjacency.words}" if plan.private else ""))
    print_expected_time(spec, procedure.expected_runs(plan, len(spec.to_train) * spec.train.seeds))
    if plan.statistics:
        print(f"  {statistics_line(plan)}")
    print("\n".join(procedure.describe(plan)))  # the budget, the noise, the configurations
    if plan.epsilon_spent is not None and not plan.noise_per_run:  # one noise for the grid: its alternatives
        for name, value in plan.per_query.items():
            print(f"  {name} = {value:.5g}")
        print_alternatives(plan, spec.privacy)
        if compare:
            print_comparison(plan)
            print_selection_comparison(plan)
            seconds = time.perf_counter() - start  # the timing line covers the comparison too
    print(f"  (planned in {seconds:.2f} s)")


def statistics_line(plan) -> str:
    """What the model estimates of the private data before training, and that every epsilon composes it."""
    from dpgrid.privacy import statistics_words

    return (f"the model's private statistics (its data normalisation), once for the grid: "
            f"{statistics_words(plan.statistics)}; every epsilon below composes them")


def print_expected_time(spec, runs: int) -> None:
    """How long the runs this command trains take, one at a time and in the groups train.parallel_runs makes, from
    the dataset's measured step times (dataset.seconds_per_step, one run; dataset.stacked_seconds_per_step, one
    run's share of a stacked step). `runs`: the accounting method's expectation (a selection trains a random
    number of candidates)."""
    plan, seconds_per_step = spec.plan, spec.dataset.seconds_per_step
    group, why = grouping(spec, max(1, round(runs)))
    print(f"  train.parallel_runs={spec.train.parallel_runs}: " + (f"groups of up to {group} runs trained together"
                                                                  if group > 1 else f"one run at a time{why}"))
    if not seconds_per_step:
        return
    alone = runs * plan.steps * float(seconds_per_step)
    print(f"  expected time: {runs:,g} runs x {plan.steps:,} steps at {float(seconds_per_step):g} s per step "
          f"(dataset.seconds_per_step, measured on a 2-core CPU) = about {duration(alone)} of training, one run at a time")
    stacked = spec.dataset.stacked_seconds_per_step
    if group > 1 and stacked:
        print(f"    stacked: about {duration(runs * plan.steps * float(stacked))} ({float(stacked):g} s per run and step "
              "in a group, dataset.stacked_seconds_per_step)")


def grouping(spec, runs: int) -> tuple:
    """(group size, '' or ': why one at a time') for `runs` runs of this grid on its device."""
    import torch

    from dpgrid.models import starting_model
    from dpgrid.training.stacked import group_size

    # no data is read to plan: the sizes are the layers' widths (exact for Linear layers; auto stacks no convolution)
    size, why = group_size(spec.train.parallel_runs, starting_model(spec), spec.strategy_cls, runs,
                           spec.plan.batch_size, torch.device(spec.train.device))
    return size, f": {why}" if why else ""


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:,.1f} h"


def print_alternatives(plan, privacy: dict) -> None:
    """nu for the same (eps, delta) under composition and each stopping rule (privacy: the privacy settings)."""
    from dpgrid.privacy import ACCOUNTANTS, alternatives

    mean = privacy.get("stopping_mean")
    found = alternatives(plan, float(privacy["stopping_eta"]), float(mean) if mean is not None else plan.n_configs)
    composition = plan.accountant if plan.accountant in ACCOUNTANTS else "rdp"
    print(f"  nu for the same (eps, delta) (composition by {composition}, random stopping by its Renyi theorems):")
    for name, nu in found.items():
        print(f"    {name:<62} {f'{nu:.4f}' if nu else 'unreachable'}")


def print_comparison(plan) -> None:
    """nu for this grid under every accountant and budget mode, side by side."""
    from dpgrid.privacy import ACCOUNTANTS

    per_config = plan.seeds if plan.account_seeds else 1
    print(f"  {'accountant':<11}{'per_grid nu':>13}{'per_run nu':>13}", flush=True)
    for accountant in ACCOUNTANTS:
        start = time.perf_counter()  # PLD and PRV calibrations take seconds to minutes: say what is running
        print(f"  ({accountant}: calibrating...)", file=sys.stderr, flush=True)
        prior = {"prior": plan.statistics} if plan.statistics else {}  # a model's private statistics compose too
        nus = [side_noise(plan, runs * plan.steps, accountant, prior) for runs in (plan.composed_runs, per_config)]
        print(f"  {accountant:<11}{nus[0]:>13}{nus[1]:>13}   ({time.perf_counter() - start:.1f} s)", flush=True)


def side_noise(plan, steps: int, accountant: str, prior: dict) -> str:
    """nu for the plan's (epsilon, delta) over `steps` under another accountant, as a comparison prints it:
    'unreachable' where that accountant cannot reach the target (a comparison, never a refusal of the grid)."""
    from dpgrid import DpgridError
    from dpgrid.privacy import calibrate

    try:
        return f"{calibrate(plan.epsilon, plan.sample_rate, steps, plan.delta, accountant=accountant, **prior):.4f}"
    except DpgridError:
        return "unreachable"


def print_selection_comparison(plan) -> None:
    """nu for this grid's (eps, delta) by random stopping among E[K] = K candidates, per stopping rule, under the
    Renyi analysis and the profile bound (a binomial of 2K rounds: the Renyi theorems do not cover it)."""
    from dpgrid import DpgridError
    from dpgrid.privacy.random_stopping import COVERS, parameters, selection_noise

    recorded = plan.to_dict()["stopping"]  # a selection's rule (plan.json's), {} for a composition grid
    mean = recorded.get("mean", plan.n_configs)
    if mean <= 1:
        return
    eta = recorded.get("eta", 0.0)
    steps = plan.seeds * plan.steps
    print(f"  random stopping, E[K] = {mean:g} candidates of {plan.seeds} runs:{'rdp nu':>12}{'profile nu':>12}", flush=True)
    for rule in COVERS["profile"]:  # the rules both analyses are compared on (RDP: "-" for the binomial)
        stopping = parameters(rule, eta, mean, plan.delta, rounds=int(2 * mean))
        start, nus = time.perf_counter(), []
        print(f"  ({rule}: calibrating...)", file=sys.stderr, flush=True)
        for analysis in ("rdp", "profile"):
            try:
                served = rule in COVERS[analysis] and not (plan.statistics and analysis != "rdp")
                prior = {"prior": plan.statistics} if plan.statistics else {}
                nu = selection_noise(plan.sample_rate, steps, plan.epsilon, plan.delta, stopping, analysis,
                                     **prior) if served else None
                nus.append(f"{nu:.4f}" if served else "-")
            except DpgridError:
                nus.append("unreachable")
        name = {"truncated_negative_binomial": f"truncated neg. binomial (eta {eta:g})",
                "binomial": f"binomial ({int(2 * mean)} rounds)"}.get(rule, rule)
        print(f"    {name:<43}{nus[0]:>12}{nus[1]:>12}   ({time.perf_counter() - start:.1f} s)", flush=True)


def print_release(model, run_dir, seed: int) -> None:
    """`dpgrid model`: the released configuration, its score and each seed's, what covers it and why, how it was
    trained and chosen, and how to load it."""
    record = model.statement
    config = record["configuration"]
    values = ", ".join(f"seed {e['seed']}: {e['test_value']:.4g}" for e in record["models"]
                       if isinstance(e["test_value"], (int, float)))
    score = record.get("score") or {}
    print(f"{record['dataset']} {record['strategy']} {config['config_id']} ("
          + ", ".join(f"{k}={v:.4g}" for k, v in config.items() if k != "config_id") + ")")
    halves = any("selection_value" in e for e in record["models"])  # data.validation=test_half
    if isinstance(score.get("value"), (int, float)):
        print(f"  score {score['value']:.4g} ({record['metric']}): " + (
            "the mean over its seeds on the report half of the test set, which chose nothing (the selection half "
            "chose it)" if halves else "the mean over its seeds of each run's best validation, what chose it"))
    print(f"  final models' test {record['metric']}{' on the report half' if halves else ''}: {values or 'none'}")
    covered = record["covered_by"]
    print(f"covered by: epsilon = {covered['epsilon']:.4g}, delta = {covered['delta']:g}" if covered
          else "covered by: no epsilon")
    print(f"  {record['why']}")
    privacy = record.get("privacy") or {}
    if privacy.get("method"):
        print(f"  accounted by {privacy['method']} ({privacy.get('accountant')} accountant, {privacy.get('budget')})")
    if record.get("covers"):
        print(f"  its epsilon covers {record['covers']}")
    training = record.get("training") or {}
    if training:
        print(f"  trained: N = {training['n_train']:,}, B = {training['batch_size']:g} expected, q = "
              f"{training['sample_rate']:.4g}, T = {training['steps']:,} steps, {training['epochs']:g} "
              f"epoch{'s' if training['epochs'] != 1 else ''}"
              + (f"; neighbouring datasets: {adjacency_words(privacy['adjacency'])}" if privacy.get("adjacency") else ""))
    if record.get("chosen_by"):
        print(f"  chosen: {record['chosen_by']}")
    print(f"randomness: {record['randomness']}")
    print(f"load: dpgrid.load_model({run_dir!r}, seed={seed})  # {type(model).__name__}, eval mode")


def adjacency_words(adjacency) -> str:
    """A statement's neighbouring relation in words (an earlier dpgrid's statement holds the words alone)."""
    return adjacency.get("words", "") if isinstance(adjacency, dict) else str(adjacency)


def start_line(start) -> str:
    """What a fine-tuning grid's runs start from and train, in one line (dpgrid plan, the plan header)."""
    provenance = start.init_provenance
    parts = [f"from {start.init} (sha256 {start.init_sha256[:12]}, {provenance.words() if provenance is not None else 'public'}"
             + (("; declared disjoint from this grid's data (model.init_disjoint=true): each epsilon covers its own"
                 if start.init_disjoint else "; the release is covered by both grids together "
                 "(model.init_disjoint=true declares the two datasets disjoint)") if provenance is not None
                and provenance.private else "") + ")" if start.init else "from the model's random start"]
    if start.lora_rank:
        parts.append(f"LoRA rank {start.lora_rank}, alpha {start.lora_alpha:g} on {', '.join(start.lora_targets)} "
                     "(released merged)")
    if start.trainable != ("*",):
        parts.append(f"train.trainable={list(start.trainable)}")
    return "; ".join(parts) + (f"; {start.trainable_parameters:,} parameters train"
                               if start.trainable_parameters is not None else "")

