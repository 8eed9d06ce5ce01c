"""One run: T Poisson-sampled steps of a strategy, validation every `eval_every` steps and after the
last, best value kept.

Nothing computed here from the private training data leaves the run un-noised: a run is diverged when
its parameters (a function of the released noisy updates), its clipping threshold or learning rate
(privatised too), or its validation value (the public test set) become NaN/inf. The loss recorded in
curves.csv is the test set's, not the training batches'."""

import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from dpgrid.data import tasks
from dpgrid.privacy.randomness import permutation, poisson_batch
from dpgrid.training.graphs import Steps, how_steps_run


@dataclass
class RunResult:
    best_value: float = math.nan
    best_step: int = -1
    report_value: float = math.nan  # data.validation=test_half: the report half's value at best_step
    diverged: bool = False
    final_clip: float = math.nan
    final_lr: float = math.nan
    seconds: float = 0.0
    eval_seconds: float = 0.0  # of which validation
    steps: int = 0             # steps taken (fewer than planned when the strategy stopped itself)
    curve: list = field(default_factory=list)  # dicts: step, value, clip, lr, test_loss
    weights: dict = None       # the final weights (a state dict on the CPU), where the grid keeps them
    watcher: Any = None        # what watched the run (dpgrid.training.observer), kept until its commit


def batches(n: int, sample_rate: float, batch_size: int, sampling: str, source):
    """Endless batch indices: Poisson (the analysed scheme) or fixed-size batches of a fresh random
    permutation per pass (train.sampling=shuffle, which the privacy analysis does NOT cover), drawn
    from a seeded torch.Generator or a SecureRandom (dpgrid.privacy.randomness)."""
    while True:
        if sampling == "poisson":
            yield poisson_batch(n, sample_rate, source)
            continue
        order = permutation(n, source)
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


@torch.inference_mode()
def evaluate(model, x, y, task: str, batch_size: int = 512) -> tuple:
    """(value, loss) on the whole (public) set: accuracy in % or mean squared error, and the mean
    per-sample training loss. Batches of 512 stay in cache: 18 % faster than 2048 for the MNIST CNN."""
    task = tasks.get(task)
    model.eval()
    total = torch.zeros((), device=x.device, dtype=torch.float64)
    loss = torch.zeros((), device=x.device, dtype=torch.float64)
    for i in range(0, len(x), batch_size):
        out = model(x[i:i + batch_size])
        target = y[i:i + batch_size]
        losses = task.loss(out, target).double()
        loss += losses.sum()
        total += task.score(out, target, losses)
    model.train()
    value, loss = total.item() / len(x), loss.item() / len(x)
    if hasattr(model, "penalty"):  # a regularised objective (logistic regression): risk = mean loss + penalty
        penalty = float(model.penalty())
        value, loss = value + penalty, loss + penalty
    return (task.scale * value if task.scale != 1.0 else value), loss


def train_runs(models: list, engine, strategy, data, steps: int, sample_rate: float, eval_every: int,
               sample_generators: list, sampling: str = "poisson", progress: bool = True, ticking: bool = False,
               watcher=None, cuda_graphs: bool = True, padded: bool = None) -> list:
    """The training loop of every run: G runs, each on its own batches from its own generator, one step for all
    (G = 1, or a stacked group, dpgrid.training.stacked; `engine.gradients` takes one batch per run). At most `steps`
    steps; a strategy that sets `finished` (its budget would be exceeded) ends the runs before the step it refused.
    Each run is validated every `eval_every` steps and after the last step it took; a diverged run is finished and
    left out of validation (stacked, its slice goes on computing, nothing crosses between runs, until the group
    ends). Each run's seconds are its share of the group's time. On CUDA the steps are padded and replayed as CUDA
    graphs where that serves (`cuda_graphs`, dpgrid.training.graphs); `padded` forces padding on or off."""
    results = [RunResult() for _ in models]
    for model in models:  # the mode the checks and the proof ran it in, whatever mode it was built or loaded in
        model.train()
    start = time.perf_counter()
    samplers = [batches(data.n_train, sample_rate, strategy.batch_size, sampling, g) for g in sample_generators]
    pad, captured, _ = how_steps_run(data.x_train.device, engine, strategy, sampling, watcher, cuda_graphs, padded)
    take_step = Steps(engine, strategy, data, samplers, pad, captured, watcher)
    training = list(range(len(models)))
    bar = tqdm(range(1, steps + 1), desc="steps" if len(models) == 1 else f"steps ({len(models)} runs together)",
               leave=False, disable=None if progress else True)
    said = Ticker(ticking and not sys.stderr.isatty(), steps, len(models))  # no terminal: a line every few seconds
    for step in bar:
        said(step)
        strategy.progress.step = step
        take_step(step)
        if strategy.finished:
            break
        for run in training:
            results[run].steps = step
        if step % eval_every and step != steps:
            continue  # everything above stays on the device: no host synchronisation per step
        training = [run for run in training if validate(models[run], strategy, data, step, results[run], run)]
        if not training:
            break
    for run in training:  # a strategy that stopped itself: validated where it stopped (at step 0: theta_0)
        if not results[run].curve or results[run].curve[-1]["step"] != results[run].steps:
            validate(models[run], strategy, data, results[run].steps, results[run], run)
    seconds = (time.perf_counter() - start) / len(models)
    for result in results:
        if result.diverged:
            result.best_value, result.best_step = math.nan, -1
        result.seconds = seconds
    return results


class Ticker:
    """Where the steps are, in a line on stderr every PROGRESS_S seconds, where no terminal shows a progress bar
    (nohup, a cluster job, CI): what `steps` of how many, for how many runs together, never anything of the data."""

    def __init__(self, on: bool, steps: int, runs: int):
        self.on, self.steps, self.runs, self.start = on, steps, runs, time.perf_counter()
        self.last = self.start

    def __call__(self, step: int) -> None:
        if not self.on:  # called every step: nothing more where a terminal shows the bar
            return
        now = time.perf_counter()
        if now - self.last < PROGRESS_S or step <= 1:
            return
        self.last = now
        left = (now - self.start) / (step - 1) * (self.steps - step + 1)
        together = f" ({self.runs} runs together)" if self.runs > 1 else ""
        print(f"steps {step - 1}/{self.steps}{together}, about {left:.0f} s left for these", file=sys.stderr, flush=True)


PROGRESS_S = 10.0


def validate(model, strategy, data, step: int, result: RunResult, run: int = 0) -> bool:
    """One validation of run `run` (its index in a stacked strategy) into result's curve; False when the run has
    diverged."""
    params, clip, lr = strategy.run_state(run)
    if params[0].is_cuda:  # the training queued before it is the steps' time, not the validation's
        torch.cuda.synchronize(params[0].device)
    eval_start = time.perf_counter()
    finite = bool(torch.stack([torch.isfinite(p).all() for p in params]).all())  # one wait for every parameter
    value, test_loss = evaluate(model, data.x_test, data.y_test, data.task) if finite else (math.nan, math.nan)
    report = {}
    if data.x_report is not None:  # data.validation=test_half: the report half, which chooses nothing
        report["report_value"] = evaluate(model, data.x_report, data.y_report, data.task)[0] if finite else math.nan
    clip, lr = float(clip), float(lr)
    extra = {name: float(value[run]) if torch.is_tensor(value) and value.dim() else float(value)  # stacked: one a run
             for name, value in strategy.curve_values().items()}
    result.curve.append(dict(step=step, value=value, clip=clip, lr=lr, test_loss=test_loss, **report, **extra))
    result.eval_seconds += time.perf_counter() - eval_start
    if not math.isfinite(value) or math.isinf(clip) or not math.isfinite(lr):  # nodp's clip is nan
        result.diverged = True
        return False
    if result.best_step < 0 or tasks.get(data.task).better(value, result.best_value):
        result.best_value, result.best_step = value, step
        result.report_value = report.get("report_value", math.nan)
    result.final_clip, result.final_lr = clip, lr
    return True
