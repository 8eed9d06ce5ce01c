"""One compiled grid (dpgrid.config.GridSpec): every (configuration x seed) run, appending CSV rows; then the
summary.

Output directory: resolved `config.yaml`, `plan.json`, `runs.csv` (one row per finished run, the
commit record), `curves.csv` (every validation), `summary.csv` (per configuration, best marked).
"""

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType

import pandas as pd
import torch
from tqdm.auto import tqdm

from dpgrid import DpgridError, data as data_mod
from dpgrid.data import tasks
from dpgrid.config import check_loaded
from dpgrid.results.curves import append_curves
from dpgrid.results.files import (check_writable, environment, locked, outermost_missing, read_frame, read_json,
                                  remove_created, write_csv)
from dpgrid.models.finetuning import read_checkpoint
from dpgrid.models import build_model, default_dtype, starting_model
from dpgrid.training.rules import MethodChoice
from dpgrid.training.persample import make_engine, trainable
from dpgrid.training.apart import check_sizes
from dpgrid.training.graphs import capacity
from dpgrid.training.choice import EngineChoice, choose_engine
from dpgrid.results.procedure import Phase, procedure_of, seed_names
from dpgrid.privacy.randomness import SecureRandom, derive_seed
from dpgrid.models.inputs import front_stage, prepared, statistics_modules, with_statistics
from dpgrid.results import ledger, seal, study
from dpgrid.results.release import check_release, final_weights, keep_weights, release_when_finished
from dpgrid.reporting.console import plan_header, report_run, say, say_methods
from dpgrid.results.claim import claim
from dpgrid.results.runs import commit_run, plan_record, run_ids, write_header
from dpgrid.strategies.base import Noise, Progress
from dpgrid.results.tracked import Follower, follow
from dpgrid.training import threads
from dpgrid.training.stacked import StackedEngine, StackedModel, group_size, why_not_stacked
from dpgrid.training.train import train_runs


def initial_model(spec, seed: int, device, checkpoint: dict = None, statistics: dict = None):
    """Seed s's starting point, the same for every strategy and configuration (a selection's candidates start their
    j-th seed from seed j's: the accounting method's start_seed); `checkpoint`: model.init's tensors, read once for
    the grid (None: read here); `statistics`: what the grid estimated of its data for the model (Data.statistics)."""
    own = procedure_of(spec.plan.method).start_seed(seed, spec.plan.seeds)
    with torch.random.fork_rng(devices=[]), default_dtype(torch.float64 if spec.train.float64 else None):
        torch.manual_seed(derive_seed(spec.plan.dataset, "init", own))
        return with_statistics(starting_model(spec, checkpoint), statistics).to(device)


def prepared_inputs(spec, data, progress: bool = False):
    """The data as the grid's models read them (dpgrid.models.inputs): a fixed front stage's features, computed once
    per dataset and kept, and the statistics the model estimates privately, once per grid. Seeded: with noise named as
    the runs' noise is, so every start of the grid (a resume, a job of a split grid) draws the same and they are
    released once. Secure (privacy.secure_rng): with the operating system's noise; the grid then trains with the
    estimate it recorded first (statistics.json: dpgrid.results.ledger.recorded_statistics), never a second one."""
    model = build_model(spec.model)  # its structure: the stage and the statistics' modules
    if front_stage(model) is None and not statistics_modules(model):
        return data
    if spec.train.secure_rng:
        noise_source = SecureRandom()
    else:
        noise_source = torch.Generator(device=data.x_train.device)
        noise_source.manual_seed(derive_seed(*seed_names(spec), "statistics"))
    data, said = prepared(spec, data, model, noise_source, progress)
    for line in said:
        say(line)
    return data


def sources(spec, config: dict, seed: int, device, phase: Phase = None) -> tuple:
    """(batch sampler, noise source) of one run: its own, whichever group it trains in (named by its phase's streams
    where it has them)."""
    if spec.train.secure_rng:  # batches and noise unpredictable; such runs are not reproducible
        source = SecureRandom()
        return source, source
    # public seeds: reproducible, and predictable by anyone who knows these names
    streams = phase.streams if phase is not None else None
    names = (*seed_names(spec), config["config_id"], *((streams[0], seed - streams[1]) if streams else (seed,)))
    noise_source = torch.Generator(device=device)
    noise_source.manual_seed(derive_seed(*names, "noise"))
    return torch.Generator().manual_seed(derive_seed(*names, "sampling")), noise_source


def train_together(spec, data, runs: list, progress: bool = False, per_sample_methods: MethodChoice = None, phase: Phase = None,
                   engine: EngineChoice = None, checkpoint: dict = None, padded: bool = None) -> list:
    """The results of `runs` ((configuration, seed) pairs), all trained by one loop: one run alone, or several as
    one stacked model (the same numbers as alone, within float rounding: dpgrid.training.stacked).
    `per_sample_methods`: the grid's choice of each layer's per-sample form (train.per_sample_method, measured once
    per layer shape); `data` the phase's training data; `engine`: the engine the grid's first batch proved
    (choose_engine; None: the compiled one, unproved, for a test's runs); `padded`: pad the batches as a CUDA graph
    needs them, on any device (None: on CUDA where a graph serves; dpgrid.testing.check_padded)."""
    device = data.x_train.device
    models = [initial_model(spec, seed, device, checkpoint, data.statistics) for _, seed in runs]
    samplers, noise_sources = zip(*(sources(spec, config, seed, device, phase) for config, seed in runs))
    configs = [config for config, _ in runs]
    procedure = procedure_of(spec.plan.method)
    lengths = {procedure.run_steps(spec.plan, c["config_id"]) for c in configs}
    if len(lengths) > 1:  # only the noise schedules' T differ by configuration, and their strategies do not stack
        raise RuntimeError(f"runs of {len(lengths)} lengths cannot train stacked")
    steps = lengths.pop()
    if len(runs) == 1:
        params, hp, noise_source = trainable(models[0]), configs[0], noise_sources[0]
        chosen = engine or EngineChoice(spec.train.engine)
        engine = make_engine(models[0], data.task, chosen.name, per_sample_methods, chosen.layout)
    else:
        stack = StackedModel(models)
        params, noise_source, engine = stack.params, list(noise_sources), StackedEngine(stack, data.task, per_sample_methods)
        hp = {k: tuple(c[k] for c in configs) for k in configs[0] if k != "config_id"}
    watcher = spec.observer.watch(engine, runs[0], phase, models[0]) if spec.observer is not None else None
    if watcher is not None:  # an observed grid trains one run at a time (stacking)
        engine, params = watcher.engine, [*params, *watcher.params]
    strategy = build_strategy(spec, params, hp, noise_source, steps, phase)
    # a selection's lines say nothing that grows with the candidates drawn: no progress line without a terminal
    ticking = progress and not procedure.releases_best_only
    results = train_runs(models, engine, strategy, data, steps, spec.plan.sample_rate, spec.train.eval_every,
                         list(samplers), spec.train.sampling, progress, ticking, watcher, spec.train.cuda_graphs, padded)
    if watcher is not None:
        results[0].watcher = watcher
    return keeping_weights(spec, results, models)


def keeping_weights(spec, results: list, models: list) -> list:
    """The results with their runs' final weights, where the grid keeps them (train.save_models)."""
    if spec.train.save_models != "none":
        for result, model in zip(results, models):
            result.weights = None if result.diverged else final_weights(model)
    return results


def build_strategy(spec, params, hp: dict, noise_source, steps: int = None, phase: Phase = None):
    """The strategy of one run of the grid (or of a stacked group: hp values and noise sources one per run) of `steps`
    steps (None: the plan's T), with its phase's noise and expected batch size (None: the plan's)."""
    plan, phase = spec.plan, phase or Phase([])
    batch_size = plan.batch_size if phase.batch_size is None else phase.batch_size
    return spec.strategy_cls(params, hp={k: v for k, v in hp.items() if k != "config_id"},
                             noise=phase_noise(plan, phase), batch_size=batch_size, options=dict(spec.options),
                             generator=noise_source, momentum=spec.train.momentum,
                             progress=Progress(steps or plan.steps, phase.n_train or plan.n_train, batch_size))


def phase_noise(plan, phase: Phase) -> Noise:
    """What a phase's runs are told of their privacy: their noise (the phase's own, else the plan's), the grid's delta
    and accountant, the plan's problem constants."""
    own = phase.noise_multiplier is not None
    return Noise(phase.noise_multiplier if own else plan.noise_multiplier,
                 MappingProxyType(dict(phase.per_query or {}) if own else dict(plan.per_query)), plan.delta,
                 plan.accountant, MappingProxyType(dict(plan.problem)))


@dataclass
class Trained:
    """What training a grid leaves for the command line to say (its files hold the rest)."""
    summary: pd.DataFrame   # summary.csv's frame
    release: str            # the line saying what was released, or why nothing was ('' for none)
    releases_best_only: bool  # a selection: say only what it released
    final: dict = None      # a tuning on a subsample's final runs' score (its selection.json's), or None


def run_row(spec, config, seed, result, draw=None, n_threads=None, chosen_forms: str = "", phase: Phase = None,
            group_size: int = 1, engine: EngineChoice = None) -> dict:
    plan, procedure, phase = spec.plan, procedure_of(spec.plan.method), phase or Phase([])
    row = dict(dataset=plan.dataset, strategy=plan.strategy, metric=tasks.get(spec.dataset.task).metric,
               epsilon=plan.epsilon, delta=plan.delta, k=plan.k, config_id=config["config_id"])
    row.update({k: v for k, v in config.items() if k != "config_id"})
    row.update(procedure.run_fields(plan, seed, draw))
    row.update(phase.fields)
    told = phase_noise(plan, phase)
    row.update(seed=seed, noise_multiplier=told.noise_multiplier, **told.queries, **told.problem,
               budget=plan.budget, accountant=plan.accountant, epsilon_spent=plan.epsilon_spent,
               epsilon_grid=plan.epsilon_grid, epsilon_with_seeds=plan.epsilon_with_seeds, private=plan.private,
               seeds_accounted=plan.account_seeds,
               protocol=spec.protocol, momentum=spec.train.momentum, sampling=plan.sampling,
               normalize=spec.dataset.normalize, steps=plan.steps, epochs=plan.epochs, batch_size=plan.batch_size,
               n_train=plan.n_train, eval_every=spec.train.eval_every,
               best_value=result.best_value, best_step=result.best_step,
               **({"report_value": result.report_value} if spec.validation == "test_half" else {}))
    row.update(procedure.spent_fields(plan, config["config_id"], result))
    if "clip" in plan.adapts:
        row["final_clip"] = result.final_clip
    if "lr" in plan.adapts:
        row["final_lr"] = result.final_lr
    row.update(diverged=result.diverged, seconds=round(result.seconds, 3), eval_seconds=round(result.eval_seconds, 3),
               threads=n_threads, group_size=group_size, device=spec.train.device,
               engine=engine.name if engine else spec.train.engine,
               engine_proof=engine.error if engine else float("nan"),
               **({"conv_methods": chosen_forms} if chosen_forms else {}),  # MethodChoice.summary(); the column's recorded name
               config_hash=spec.config_hash)
    return row


def check_fit(spec, data, checkpoint: dict = None) -> None:
    """One forward pass and loss on two training examples: a model that does not fit the data (its input shape,
    its outputs against the targets) is refused in one line before anything is written."""
    model = initial_model(spec, 0, data.x_train.device, checkpoint, data.statistics)
    try:
        with torch.no_grad():
            tasks.get(spec.dataset.task).loss(model(data.x_train[:2]), data.y_train[:2])
    except Exception as e:  # whatever the model raises on data it cannot take
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DpgridError(f"model ({spec.settings['model'].get('_target_')}) does not fit dataset={spec.plan.dataset}: "
                          f"{reason} (inputs {tuple(data.x_train.shape[1:])}); choose a model for this data "
                          "(model=...)") from None


def train(spec, out_dir, progress: bool = True, on_lock=None, created="unknown", parallel_jobs: int = 1,
          tracked_from=None) -> "Trained":
    """Train the compiled grid into out_dir, resuming what is there. The directory's lock is taken before
    anything is written into it and held to the end; `on_lock(out)` writes what the caller records beside the
    grid (the command line: Hydra's record). A grid refused after taking the lock removes the folders it
    created (`created`: the outermost one, None for none; by default what did not exist when it was called).
    `parallel_jobs`: how many grids a launcher runs side by side on this machine (train.threads=auto shares
    the cores among them). `tracked_from`: where its tracker (spec.tracker) follows it from (dpgrid.tracking.Place;
    None: the folder that holds out_dir)."""
    out = Path(out_dir)
    created = outermost_missing(out) if created == "unknown" else created
    check_writable(out)
    with environment(out):
        out.mkdir(parents=True, exist_ok=True)
    with locked(out):
        try:
            with threads.using(threads.choose(spec.train.threads, spec.plan.model_parameters, parallel_jobs)), \
                    threads.exact_cuda(), threads.reusing_freed_memory(), follow(spec, out, tracked_from) as follower:
                return train_grid(spec, out, progress, on_lock, follower, parallel_jobs)
        except DpgridError:
            remove_created(out, created)
            raise


def train_grid(spec, out: Path, progress: bool, on_lock=None, follower=None, parallel_jobs: int = 1) -> "Trained":
    """train's work, with the directory's lock held. Everything that can refuse the grid is asked before
    anything is written: the data, the model on it, the directory's config, data and release. `follower`: what tells
    its tracker (dpgrid.tracking), once the grid trains, each run committed and its end. `parallel_jobs`: the grids
    a launcher placed side by side with it (they share the device's memory)."""
    follower = follower or Follower()
    data = data_mod.load(spec.dataset, spec.data_root, spec.train.device)
    check_loaded(spec, data.n_train)  # the plan's N is the data's, before an observer adds to them
    data = prepared_inputs(spec, data, progress)
    if spec.validation == "test_half":  # one half of the public test set chooses, the other reports (an audit's
        data = data_mod.test_halves(data, spec.plan.dataset)  # canaries are drawn from the choosing half)
    data = spec.observer.training_data(data) if spec.observer is not None else data
    if spec.train.float64:
        data = data.in_float64()
    checkpoint = read_checkpoint(spec.start.init, spec.start.init_sha256) if spec.start.init else None  # once a grid
    check_fit(spec, data, checkpoint)
    # the engine, proved where training runs the model (a model that mixes samples is refused here), before anything
    # is written
    engine = proved_engine(spec, data, checkpoint) if spec.to_train else None
    plan, data_files = spec.plan, data_mod.fingerprint(data.files)
    claim(out, spec, data_files)
    record = plan_record(spec, data_files)  # what plan.json holds, and what a release here must have been made with
    ledger.check(out, spec, record)
    check_release(out, spec, record)
    check_sealed(out, spec)
    # its spending on the data: privacy.study_budget asked before anything is written, the study's ledger entry
    # written with the grid's header, before it trains
    with study.entering(spec, out, study.training_files(data_files, data.train_files)) \
            if spec.to_train else contextlib.nullcontext():
        done = ledger.committed_runs(out, spec)  # before anything is rewritten: a secure grid's damage refused untouched
        if (out / "runs.csv").exists():  # as checked and repaired: what this command vouches for
            seal.seal(out)
        if on_lock:
            on_lock(out)
        write_header(out, spec, record)
    data = ledger.recorded_statistics(out, spec, data)  # checked against its ledger above: a secure grid's one estimate
    procedure = procedure_of(plan.method)
    # A selection's console and cli.log say nothing that depends on the candidates: not their number
    # (a bar's total, a line per run) nor their scores. Those stay in the private files.
    quiet = procedure.releases_best_only
    work, per_sample_methods, trained = [], MethodChoice(spec.train.per_sample_method), 0
    for number, phase in enumerate(procedure.phases(out, spec, list(spec.to_train), data)):
        if number == 0:  # after the first phase's draw, which may refuse the grid
            ledger.record_draws(out, spec)
            say(plan_header(spec))
            if engine is not None:
                say(engine.said)
            if quiet:
                say(f"{plan.selection.replace('_', ' ')}: training; its epsilon covers {plan.method.covers}")
            follower.started()
        trained += train_phase(spec, out, data, phase, done, progress, quiet, per_sample_methods, engine, checkpoint,
                               follower, parallel_jobs)
        work += phase.runs
    if not trained and work and not quiet:
        say(f"nothing to train: every run of this grid has finished ({len(work)} runs, checked against their seal)")
    runs = read_frame(out / "runs.csv") if work else None
    ended = not procedure.every_run(plan, work) - set(run_ids(runs) if runs is not None else ())
    if ledger.recorded_release(out, spec) is not None:  # a secure grid that released: that release, never another
        return Trained(read_frame(out / "summary.csv"), f"model: {out / 'model'} as this secure grid released it (it "
                       "releases once)" if (out / "model").exists() else "", quiet,
                       read_json(out / "selection.json", "").get("final") if (out / "selection.json").exists() else None)
    if ended:
        ledger.update(out, spec, released=True)  # before anything is released: a kill after it leaves no doubt
    summary, released = procedure.summarize(out, runs, plan, data.task)
    write_csv(out / "summary.csv", summary)
    seal.seal(out)
    line = release_when_finished(out, spec, runs, summary, work, record)
    if ended:
        ledger.record_release(out, spec)
    follower.ended(summary)
    return Trained(summary, line, quiet, (released or {}).get("final"))


def check_sealed(out: Path, spec) -> None:
    """Before the grid trains again in `out`: its result files are what it wrote (dpgrid.results.seal). A line changed
    or added after the seal is refused (a secure grid's with overwrite=true starts a new release); summary.csv,
    rewritten at every end, is dropped; lines lost or damaged are left to the runs' own checks, which name the line or
    train again what was lost (a seeded grid: the same runs). Where no digest covers the files (written before dpgrid
    sealed them), a seeded grid trains its runs again, a secure one is refused."""
    found = seal.problem(out, whole=False)[0]
    if not found:
        return
    if seal.recorded(out) is None:
        refuse_or_resume(out, spec, found)
        return
    bad = seal.unsealed(out)
    if "summary.csv" in bad:  # derived from runs.csv, written again at the end of this command
        with environment(out / "summary.csv"):
            (out / "summary.csv").unlink()
    edited = [name for name in bad if name in seal.LINED and seal.changed_lines(out, name)]
    if not edited:  # lines lost or damaged: the runs' own checks train again what they lost, or name the line
        return
    if "runs.csv" in edited:  # a line that is no run of this grid is named as such first (its field, its line)
        from dpgrid.results.runs import read_runs

        read_runs(out / "runs.csv", [c["config_id"] for c in spec.plan.configurations], spec.config_hash)
    refuse_or_resume(out, spec, f"{out / edited[0]} holds lines its grid did not write (a number edited or a row added "
                     f"after it was sealed: {out / seal.DIGESTS})")


def refuse_or_resume(out: Path, spec, found: str) -> None:
    """Results in `out` its grid did not write as they are (`found`, in words): a secure grid (its ledger kept) is
    refused, or starts a new release with overwrite=true; a seeded one says so and trains again what it must."""
    if ledger.kept(spec):
        ledger.start_over(out, spec, found)
    else:
        import warnings

        warnings.warn(seal.resume(out, found, spec.overwrite))


def proved_engine(spec, data, checkpoint: dict = None) -> EngineChoice:
    """The engine the grid trains with, proved on its first batch of public examples (dpgrid.training.proof) before
    anything is written; the grid says it (`said`) under its plan's header."""
    model = initial_model(spec, 0, data.x_train.device, checkpoint, data.statistics)
    could_stack = (spec.observer is None and spec.train.parallel_runs != "1"
                   and not why_not_stacked(model, spec.strategy_cls))
    setting = "func" if spec.train.engine == "func" else spec.train.engine_setting
    plan = spec.plan
    padded = data.x_train.device.type == "cuda"  # where a batch may be padded to its capacity (dpgrid.training.graphs)
    sizes = set()
    for batch_size in procedure_of(plan.method).batch_sizes(plan):
        # a phase's batch holds each of the N examples with probability q B_phase / B (a tuning set's q1, then q)
        rate = plan.sample_rate * batch_size / plan.batch_size
        sizes.update(check_sizes(batch_size, rate, plan.n_train,
                                 (lambda size, b=batch_size: capacity(size, b)) if padded else None))
    sizes = tuple(sorted(sizes))
    return choose_engine(model, data.task, data.x_test, data.y_test, setting, could_stack, spec.train.parallel_runs,
                         sizes)


def train_phase(spec, out: Path, data, phase: Phase, done: set, progress: bool, quiet: bool, per_sample_methods: MethodChoice,
                engine: EngineChoice = None, checkpoint: dict = None, follower=None, parallel_jobs: int = 1) -> int:
    """Train a phase's runs that are not `done`, committing each run's row as it finishes (and telling `follower`,
    the grid's tracker); how many it trained."""
    plan, work = spec.plan, phase.runs
    if phase.train_rows is not None:
        data = replace(data, x_train=data.x_train[phase.train_rows], y_train=data.y_train[phase.train_rows])
    todo = [(c, s) for c, s in work if (c["config_id"], s) not in done]
    ledger.check_untrained(out, spec, todo)
    total = len(work)
    budget = f"eps={plan.epsilon:g}" if plan.private else "non-private"
    bar = tqdm(total=total, initial=total - len(todo), desc=f"{plan.strategy} {plan.dataset} {budget} k={plan.k}",
               disable=None if progress and not quiet else True)
    # Groups are fixed slices of the grid's runs, whatever is done: a group with a run left trains whole and
    # commits what is left, so a resumed grid's runs get the numbers of an uninterrupted one (padding, kernels).
    size = stacking(spec, data, len(work), engine, checkpoint, parallel_jobs) if todo or quiet else 1
    finished, said = total - len(todo), 0
    for start in range(0, len(work), size):
        group = work[start:start + size]
        left = [(c, s) for c, s in group if (c["config_id"], s) not in done]
        if not left:
            continue
        # the step bar (a terminal's only, and gone when the group ends) is a selection's too: its group holds one
        # candidate's runs at most, so nothing it shows depends on how many were drawn
        results = train_together(spec, data, group, progress, per_sample_methods, phase, engine, checkpoint)
        if not quiet:  # each convolution's per-sample choice, once measured (a selection's stay in its rows)
            said = say_methods(per_sample_methods, said)
        for (config, seed), result in zip(group, results):  # each run committed on its own, as when trained alone
            if (config, seed) not in left:
                continue
            if result.weights is not None:  # before the commit: a committed run's model is never missing
                keep_weights(out, config["config_id"], seed, result.weights, spec.plan.dataset)
            if result.watcher is not None:  # an observer's (the audit's canaries): what it measured of this run
                result.watcher.finish(out, config["config_id"], seed)
            append_curves(out / "curves.csv", [dict(config_id=config["config_id"], seed=seed, **c) for c in result.curve])
            row = run_row(spec, config, seed, result, phase.draw, torch.get_num_threads(), per_sample_methods.summary(), phase,
                          len(group), engine)
            committed = commit_run(out / "runs.csv", row)
            ledger.record(out, spec, committed)
            seal.seal(out)
            if follower is not None:
                follower.committed(row, result.curve)
            finished += 1
            if not quiet:
                report_run(plan, config["config_id"], seed, result, finished, total)
            bar.update()
    bar.close()
    return len(todo)


def stacking(spec, data, runs: int, engine: EngineChoice = None, checkpoint: dict = None, side_by_side: int = 1) -> int:
    """How many of the grid's `runs` train together (train.parallel_runs), said in one line: the groups' size, or
    why one at a time when stacking was asked for or would serve and cannot. A selection says it whatever the number
    of its runs, which depends on how many candidates were drawn (and prints nothing that does)."""
    device, procedure = data.x_train.device, procedure_of(spec.plan.method)
    if spec.observer is not None:  # it watches run by run
        return 1
    if procedure.releases_best_only:  # a group holds one candidate's runs at most: asked as if there were two
        runs = 2 * spec.plan.seeds    # candidates, so that neither the group nor the line depends on how many were drawn
    size, why = group_size(spec.train.parallel_runs, initial_model(spec, 0, device, checkpoint, data.statistics),
                           spec.strategy_cls, runs, spec.plan.batch_size, device, data.x_train[:1], side_by_side)
    if engine is not None and not engine.stacks and size > 1:
        size, why = 1, "the stacked engine did not prove itself on the first batch (the per-sample engine line above)"
    size = procedure.group_limit(spec.plan.seeds, size)
    if why and runs > 1 and spec.train.parallel_runs != "1":
        say(f"train.parallel_runs: one run at a time: {why}")
    elif size > 1:
        say(f"train.parallel_runs={spec.train.parallel_runs}: groups of up to {size} runs trained together as one "
            "stacked model (each run's numbers are its own; runs.csv's group_size says each run's group)")
    return size
