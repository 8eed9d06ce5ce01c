"""Full-batch noisy gradient descent with a noise schedule: the family of the PUR paper's strategies."""

from __future__ import annotations

import math

from dpgrid.lazy import lazy_import
from dpgrid.privacy import noise_schedule as zcdp
from dpgrid.strategies.base import Strategy, no_grad

torch = lazy_import("torch")


class NoisyGD(Strategy):
    """Noisy gradient descent on the whole training set (the PUR paper, Eq. 2):

        theta_{t+1} = theta_t - eta (grad F(theta_t) + zeta_t),   zeta_t ~ N(0, sigma_t^2 I),   eta = 1 / (2M)

    with F the regularised empirical risk: grad F = the mean of the examples' loss gradients + lambda theta.
    Each example's loss gradient is clipped to Z, a no-op when ||z|| <= Z as the loaders ensure, so that the
    sensitivity 2L/N holds whatever the iterates do. Subclasses give the schedule sigma_t (`sigmas`); the
    plan (dpgrid.privacy.noise_schedule) fits the schedule into the budget, and a run stops at the last step
    within it.

    Problem constants (from the dataset config, all public): N, d, lambda (`l2`), Z (`feature_bound`),
    R (`radius`; for lambda > 0 it is sqrt(2 log 2 / lambda), which bounds ||theta_0 - theta*|| since
    F(0) = log 2), L = lambda R + Z and M = lambda + Z^2 / 4.
    """

    label = "NoisyGD"
    uses_momentum = False  # the paper's noisy gradient descent: theta <- theta - eta (grad F + z)
    oracle = False  # True: the schedule reads the data (not private); no epsilon is claimed
    accounting = "noise_schedule"  # each run's schedule is fitted into the budget (dpgrid.privacy)

    tasks = ("logistic",)  # binary logistic regression
    full_batch = True

    @staticmethod
    def problem(dataset, n_train: int) -> dict:
        """The public problem constants its accounting and its steps use, read from the dataset config."""
        d = dataset.whole("features")
        l2 = dataset.real("l2", "a finite number >= 0 (lambda)", lambda v: v >= 0)
        z = dataset.positive("feature_bound")
        given = dataset.positive("radius") if dataset.has("radius") or l2 == 0 else None  # needed when lambda = 0
        radius = math.sqrt(2 * math.log(2) / l2) if l2 > 0 else given
        return {"n": n_train, "d": d, "l2": l2, "feature_bound": z, "radius": radius,
                "lipschitz": l2 * radius + z, "smoothness": l2 + z * z / 4}

    @classmethod
    def sigmas(cls, hp: dict, problem: dict):
        """sigma_1, sigma_2, ...: the data-independent schedule of configuration `hp`."""
        raise NotImplementedError

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        p = self.p = self.noise.problem  # the plan's public problem constants (L, M, eta, the rho budget, ...)
        self.eta = float(p["eta"])  # exact; self.lr (a float32 tensor) is what curves record
        self.lr.fill_(self.eta)
        self.clip.fill_(p["feature_bound"])
        self.t, self.rho, self.finished, self.grad_norm = 0, 0.0, False, math.nan
        self.schedule = None if self.oracle else iter(self.sigmas(self.hp, p))

    def sigma(self, gradient_norm) -> float:
        return next(self.schedule)  # data-independent: the norm (a tensor on the device) is not read

    @no_grad
    def step(self, grads) -> None:
        n = self.batch_size
        sums = grads.weighted_sum(self.clip_weights(grads.norms))
        gradient = [s / n + self.p["l2"] * w for s, w in zip(sums, self.params)]  # grad F(theta_t)
        self.grad_norm = torch.sqrt(sum(g.pow(2).sum() for g in gradient))  # on the device until a validation reads it
        sigma = self.sigma(self.grad_norm)
        cost = zcdp.step_rho(sigma, self.p["lipschitz"], n)
        if self.rho + cost > self.p["rho_budget"]:  # the next step would exceed the budget: stop before it
            self.finished = True
            return
        self.t, self.rho = self.t + 1, self.rho + cost
        noisy = self.noisy_mean([torch.zeros_like(g) for g in gradient], sigma * n)  # N(0, sigma^2 I)
        for p, g, z in zip(self.params, gradient, noisy):
            p.add_(g + z, alpha=-self.eta)

    def curve_values(self) -> dict:
        """Recorded with every validation: ||grad F|| at the last step's start and the epsilon its schedule has
        spent (for the oracle: what it would have spent were the gradient norm free). Both are evaluations on the
        training data for the paper's Figure 1; no epsilon covers them."""
        return {"grad_norm": float(self.grad_norm),
                "epsilon": zcdp.epsilon(self.rho, self.noise.delta, self.noise.accountant)}
