"""What every strategy shares: the Gaussian mechanism on a sum, and the (momentum) SGD step."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from dpgrid.lazy import lazy_import
from dpgrid.privacy.randomness import SecureRandom, standard_normal  # noqa: F401  (strategies draw through it)

torch = lazy_import("torch")  # loaded at first use: checking a config does not load it


def no_grad(step):
    """torch.no_grad() for a method, named without loading torch when the class is defined."""
    @functools.wraps(step)
    def wrapped(*args, **kwargs):
        with torch.no_grad():
            return step(*args, **kwargs)
    return wrapped


@dataclass
class Progress:
    """Where a run is in its training, for a rule that depends on it (a clip or learning-rate schedule). T, N and B
    are public (the plan's); the training loop sets `step` before each call of Strategy.step, and a strategy only
    reads it."""
    steps: int = None       # T: the steps the run takes at most (a strategy that sets `finished` may stop sooner)
    n_train: int = None     # N: the training set's size, as loaded
    batch_size: int = None  # B: the expected batch size
    step: int = 0           # t: the step being taken, 1..T (0 before the first)

    @property
    def epoch(self) -> float:
        """Passes over the training data once step t is taken (in expectation under Poisson sampling): t B / N."""
        return self.step * self.batch_size / self.n_train


@dataclass(frozen=True)
class Noise:
    """What a strategy is told of its privacy, each with one meaning (the plan's): the noise multiplier nu of one
    step's joint Gaussian mechanism, its split among the step's queries (`split_noise`'s names, e.g.
    noise_multiplier_g), the delta and the accountant of the grid's (epsilon, delta), and the public problem
    constants its accounting uses (a noise schedule's L, M, rho budget; none for DP-SGD)."""
    noise_multiplier: float
    queries: Mapping = field(default_factory=lambda: MappingProxyType({}))
    delta: float = None
    accountant: str = None
    problem: Mapping = field(default_factory=lambda: MappingProxyType({}))


class Strategy:
    """One run's optimiser state. Subclasses implement `step(grads)` from the paper's equations.

    Built with keywords only: `hp` the configuration (e.g. {"lr": 0.3, "clip": 1.0}); `noise` what the plan says
    of its privacy (a Noise: nu, its split among the step's queries, delta, the accountant, problem constants); `batch_size`
    the EXPECTED batch size B, the divisor of every noisy sum (the realised size is private and never used);
    `options` the strategy config's own keys as a plain dict (e.g. {"clip0": 0.1, ...}); `generator` the
    run's noise source (a seeded torch.Generator or a SecureRandom); `momentum` the heavy-ball coefficient
    (0 when the strategy says `uses_momentum = False`); `progress` where the run is (T, the step t, N, B and the
    epoch: a Progress the training loop keeps up to date).

    Stacked runs (train.parallel_runs): a strategy that says `stacks = True` also trains G runs at once. It is
    then built with `generator` a list of the G runs' own sources, `hp` values as G-tuples, and each parameter
    stacked as (G, *shape); per-sample norms are (G, b) and sums (G, *shape). `self.lr`, `self.clip` are then
    (G,): the helpers below (per_run, dot, normal, noisy_mean, clip_weights, descend) serve both forms, so a
    step written with them is one code for one run and for G.
    """

    label = ""       # its name in tables and figures (the config's `label`, then this, then its `name`)
    private = True   # False: no clipping, no noise, no epsilon (the non-private baseline)
    adapts = ()      # which of "clip", "lr" change during a run (reported as final_clip / final_lr)
    uses_momentum = True  # False: its update has its own moments (Adam) or none; train.momentum is not applied
    accounting = "composition"  # how its grid is accounted: a key of dpgrid.privacy.ACCOUNTING
    finished = False  # set True in `step` to end the run before that step (e.g. its budget is spent)
    tasks = None      # the dataset tasks it runs on (e.g. ("logistic",)); None: any
    full_batch = False  # True: every step uses the whole training set (train.batch_size must be N)
    stacks = False    # True: `step` also serves G runs stacked (see above); a group then trains as one model
    gradient_query = None  # the key of noise.queries that is the gradient's multiplier (None: noise_multiplier)
    captures = False  # True: on CUDA its step may be replayed as a CUDA graph (dpgrid.training.graphs): it reads no
    # number on the host, keeps its state in tensors made by the first step, and counts a padded batch through the mask;
    # a subclass that writes its own `step` says it again (it is not inherited past a new step)

    @classmethod
    def check_options(cls, options) -> None:
        """Refuse this strategy's own keys when out of range. `options` reads them, each checked as it is
        read (dpgrid.plugins.Reader: options.positive("clip0"), .real, .fraction, .whole, .numbers, .choice):
        a bad value is a DpgridError naming strategy.<key> and what is valid."""

    @staticmethod
    def problem(dataset, n_train: int) -> dict:
        """Public constants of the problem that its accounting needs (a noise schedule's L, M, ...), read
        from the dataset config through `dataset` (a Reader of its keys, as in check_options); none here."""
        return {}

    @staticmethod
    def split_noise(noise_multiplier: float, options: dict, batch_size: int) -> dict:
        """Per-query multipliers when a step releases more than one noisy query (recorded in plan)."""
        return {}

    def __init__(self, params, *, hp: dict, batch_size: int, options: dict, generator, noise: Noise,
                 momentum: float = 0.0, progress: Progress = None):
        self.params = list(params)
        self.noise = noise
        self.hp, self.batch_size, self.options = hp, batch_size, options
        self.generator = generator
        self.stacked = isinstance(generator, (list, tuple))  # G runs, each with its own source
        self.momentum = momentum
        self.progress = progress or Progress(batch_size=batch_size)
        self._velocity = None
        self.lr, self.clip = self.per_run_value(hp.get("lr", 0.0)), self.per_run_value(hp.get("clip", float("nan")))

    def per_run_value(self, value):
        """A hyperparameter as a tensor in the parameters' precision: () for one run, (G,) for stacked runs
        (`value` one number for all, or G of them)."""
        p = self.params[0]
        value = torch.tensor(value, device=p.device, dtype=p.dtype)
        return value.expand(len(self.generator)).clone() if self.stacked and not value.dim() else value

    def run_state(self, run: int = 0) -> tuple:
        """(parameters, clip, lr) of run `run` of a stacked strategy, of the one run otherwise: what a validation
        reads."""
        if not self.stacked:
            return self.params, self.clip, self.lr
        return [p[run] for p in self.params], self.clip[run], self.lr[run]

    @staticmethod
    def per_run(value, like):
        """`value` (a number, a () or (G,) tensor) shaped to broadcast against `like` ((G, ...) when stacked)."""
        if torch.is_tensor(value) and value.dim():
            return value.view(*value.shape, *[1] * (like.dim() - value.dim()))
        return value

    @staticmethod
    def dot(a, b):
        """The dot product of flat vectors, per run: () for one run, (G,) for stacked (G, P) vectors."""
        return torch.dot(a, b) if a.dim() == 1 else torch.linalg.vecdot(a, b)

    def normal(self, shape, like):
        """N(0, 1) numbers of `shape` from the run's source; stacked: (G, *shape), run r's from its own."""
        if not self.stacked:
            return standard_normal(shape, self.generator, like.device, like.dtype)
        return torch.stack([standard_normal(shape, g, like.device, like.dtype) for g in self.generator])

    def noisy_mean(self, sums: list, std) -> list:
        """Gaussian mechanism: (sum + N(0, std^2 I)) / B, with B the expected batch size."""
        return self.noisy_mean_flat(sums, std)[1]

    def noisy_mean_flat(self, sums: list, std):
        """noisy_mean as one flat vector and per-parameter views of it (a dot product is then one op).
        The noise is drawn sum by sum: the same numbers as one standard_normal per sum."""
        flat, views = flat_like(sums, self.stacked)
        for run, generator in enumerate(self.generator) if self.stacked else [(None, self.generator)]:
            if isinstance(generator, SecureRandom):  # not reproducible anyway: one draw (and one copy) per run
                whole = flat if run is None else flat[run]
                standard_normal(whole.shape, generator, flat.device, flat.dtype, out=whole)
                continue
            for view in views:  # a run's draws in the same order whether it trains alone or stacked
                out = view if run is None else view[run]
                standard_normal(out.shape, generator, flat.device, flat.dtype, out=out)
        flat.mul_(self.per_run(std / self.batch_size, flat))
        torch._foreach_add_(views, sums, alpha=1 / self.batch_size)  # each view.add_(s): on CUDA one or few kernels
        return flat, views

    def flatten(self, tensors: list) -> torch.Tensor:
        """The tensors as one flat vector per run: (P,) for one run, (G, P) stacked."""
        return flatten(tensors, self.stacked)

    def clip_weights(self, norms: torch.Tensor) -> torch.Tensor:
        """w_i = min(1, C / n_i), so that ||w_i g_i|| <= C (Eq. 4)."""
        return torch.clamp(self.per_run(self.clip, norms) / norms.clamp_min(1e-12), max=1.0)

    @no_grad
    def descend(self, direction: list, lr) -> None:
        """theta <- theta - lr * v, v = momentum * v + direction (heavy ball; v = direction when 0)."""
        if self.momentum:
            if self._velocity is None:
                self._velocity = [torch.zeros_like(d) for d in direction]
            # v.mul_(momentum).add_(d) for each parameter, the same numbers; on CUDA a few kernels for all of them
            torch._foreach_mul_(self._velocity, self.momentum)
            torch._foreach_add_(self._velocity, direction)
            direction = self._velocity
        for p, d in zip(self.params, direction):
            p.addcmul_(d, self.per_run(lr, p), value=-1)  # no lr * d temporary; lr stays a tensor (no host sync)

    def step(self, grads) -> None:
        raise NotImplementedError

    def linear_step(self):
        """How the step about to be taken turns its noisy mean gradient g_tilde into moves, when it is linear:
        (mu, a) such that every parameter moves by d = -a v, v = mu v_prev + g_tilde (v_prev: the previous step's
        v, 0 before the first). `descend`'s heavy ball is (momentum, lr); Adam's first moment is of this form too.
        None: no such pair (a per-coordinate normalisation, Adam's second moment). `dpgrid audit` reads the noise
        and the clipped contributions off the moves through it (dpgrid.audit.mechanism); a strategy whose update is
        not `descend` says its own. One run (an audit trains one at a time)."""
        return float(self.momentum), float(self.lr)

    def curve_values(self) -> dict:
        """Extra columns recorded with every validation in curves.csv (e.g. {"grad_norm": ...}): numbers, or () tensors;
        stacked, a (G,) tensor holds a value per run (a number is every run's). None here."""
        return {}


def flat_like(tensors: list, stacked: bool = False):
    """An uninitialised flat vector as long as `tensors` together, and its consecutive pieces as views
    shaped like them; stacked: (G, P) and (G, *shape) views, run by run."""
    runs = tensors[0].shape[:1] if stacked else ()
    lengths = [t[0].numel() if stacked else t.numel() for t in tensors]
    flat = tensors[0].new_empty((*runs, sum(lengths)))
    views, start = [], 0
    for t, length in zip(tensors, lengths):
        views.append(flat[..., start:start + length].view(t.shape))
        start += length
    return flat, views


def flatten(tensors: list, stacked: bool = False) -> torch.Tensor:
    """The tensors concatenated into one flat vector (one copy, whatever their strides); stacked: (G, P)."""
    flat, views = flat_like(tensors, stacked)
    for view, t in zip(views, tensors):
        view.copy_(t)
    return flat
