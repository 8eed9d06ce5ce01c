"""Privacy plan of one grid (SPEC §3): one noise multiplier for K configurations x T steps.

Poisson sampling with rate q = B / N; the grid composes K * T subsampled Gaussian mechanisms and
the noise multiplier nu is the smallest one whose RDP (moments accountant) epsilon at delta is at
most the target. The accounting itself is Opacus's RDP analysis; this module only searches it.
"""

import math
import warnings
from dataclasses import asdict, dataclass, field

from opacus.accountants import RDPAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

from . import DpgridError

MAX_NOISE_MULTIPLIER = 1e4  # beyond this the target epsilon is treated as unreachable


def rdp_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float, orders=None) -> float:
    """epsilon of `steps` compositions of the Poisson-subsampled Gaussian mechanism (Opacus RDP)."""
    # Opacus's default orders, plus large ones that matter for small epsilon or many steps.
    orders = orders or RDPAccountant.DEFAULT_ALPHAS + [80, 96, 128, 256, 512]
    rdp = compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=steps, orders=orders)
    return float(get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0])


def calibrate(epsilon: float, sample_rate: float, steps: int, delta: float, rtol: float = 1e-4) -> float:
    """Smallest noise multiplier (to relative precision rtol) with rdp_epsilon(...) <= epsilon."""
    spent = lambda nu: rdp_epsilon(sample_rate, nu, steps, delta)  # noqa: E731
    low, high = 0.0, 1.0
    while spent(high) > epsilon:
        low, high = high, 2 * high
        if high > MAX_NOISE_MULTIPLIER:
            raise DpgridError(f"privacy.epsilon={epsilon} is unreachable for {steps} steps at sampling rate "
                              f"{sample_rate:.4g} and delta={delta} (noise multiplier would exceed "
                              f"{MAX_NOISE_MULTIPLIER:g}); raise epsilon or shrink the grid")
    while high - low > rtol * high:
        mid = (low + high) / 2
        low, high = (low, mid) if spent(mid) <= epsilon else (mid, high)
    return high


@dataclass
class Plan:
    dataset: str
    strategy: str
    k: int
    n_configs: int
    n_train: int
    batch_size: int
    epochs: int
    steps: int                # T, per run
    sample_rate: float        # q = B / N
    epsilon: float            # the grid's target
    delta: float
    seeds: int
    account_seeds: bool
    composed_runs: int        # K, or K * seeds when seeds are accounted
    noise_multiplier: float   # nu of one step's (joint) Gaussian mechanism; 0 for nodp
    per_query: dict = field(default_factory=dict)  # the strategy's split of nu (online, fixed_quantile)
    epsilon_spent: float = None  # recomputed from the composition with the final nu; None for nodp
    model_parameters: int = 0
    configurations: list = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("per_query"))
        return d


def make_plan(cfg, n_train: int, strategy_cls, configs: list, model_parameters: int) -> Plan:
    p, t = cfg.privacy, cfg.train
    check_inputs(cfg, n_train)
    batch_size, epochs = int(t.batch_size), int(t.epochs)
    steps = math.ceil(epochs * n_train / batch_size)
    sample_rate = batch_size / n_train
    composed = len(configs) * (int(t.seeds) if p.account_seeds else 1)
    plan = Plan(dataset=cfg.dataset.name, strategy=cfg.strategy.name, k=int(cfg.grid.k), n_configs=len(configs),
                n_train=n_train, batch_size=batch_size, epochs=epochs, steps=steps, sample_rate=sample_rate,
                epsilon=float(p.epsilon), delta=float(p.delta), seeds=int(t.seeds),
                account_seeds=bool(p.account_seeds), composed_runs=composed, noise_multiplier=0.0,
                model_parameters=model_parameters, configurations=configs)
    if strategy_cls.private:
        nu = calibrate(plan.epsilon, sample_rate, composed * steps, plan.delta)
        plan.noise_multiplier = nu
        plan.per_query = strategy_cls.split_noise(nu, cfg.strategy, batch_size)
        plan.epsilon_spent = rdp_epsilon(sample_rate, nu, composed * steps, plan.delta)
        assert plan.epsilon_spent <= plan.epsilon, (plan.epsilon_spent, plan.epsilon)
    return plan


def check_inputs(cfg, n_train: int) -> None:
    """Refuse values with no meaning before anything runs or is written (one clear line each)."""
    p, t = cfg.privacy, cfg.train
    if not float(p.epsilon) > 0:
        raise DpgridError(f"privacy.epsilon must be > 0, got {p.epsilon}")
    if not 0 < float(p.delta) < 1:
        raise DpgridError(f"privacy.delta must lie in (0, 1), got {p.delta}")
    if float(p.delta) >= 1 / n_train:
        warnings.warn(f"privacy.delta={p.delta} is not below 1/N = {1 / n_train:.3g}: a weak guarantee")
    if int(cfg.grid.k) < 2:
        raise DpgridError(f"grid.k must be at least 2, got {cfg.grid.k}")
    if not 0 < int(t.batch_size) <= n_train:
        raise DpgridError(f"train.batch_size must lie in 1..{n_train} (the training-set size), got {t.batch_size}")
    if int(t.epochs) <= 0:
        raise DpgridError(f"train.epochs must be > 0, got {t.epochs}")
    if int(t.seeds) <= 0:
        raise DpgridError(f"train.seeds must be > 0, got {t.seeds}")
    if int(t.eval_every) <= 0:
        raise DpgridError(f"train.eval_every must be > 0, got {t.eval_every}")
