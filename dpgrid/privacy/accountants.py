"""The (epsilon, delta) accountants of a composition of Poisson-subsampled Gaussian mechanisms, and the
search for the smallest noise multiplier that meets a target. Keys of ACCOUNTANTS are privacy.accountant's
values for grids accounted by composition.

- rdp: Opacus's RDP analysis (the paper's moments accountant; the default);
- pld: dp-accounting's privacy loss distributions; prv: Opacus's PRV accountant. Both are tighter than RDP,
  so they calibrate less noise for the same (epsilon, delta).
"""


from dpgrid import DpgridError

MAX_NOISE_MULTIPLIER = 1e4  # beyond this the target epsilon is treated as unreachable
RDP_ORDERS_EXTRA = [80, 96, 128, 256, 512]  # beyond Opacus's defaults: they matter for small epsilon or many steps


def rdp_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float, orders=None) -> float:
    """epsilon of `steps` compositions of the Poisson-subsampled Gaussian mechanism (Opacus RDP)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent

    orders = orders or RDPAccountant.DEFAULT_ALPHAS + RDP_ORDERS_EXTRA
    rdp = compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=steps, orders=orders)
    return float(get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0])


def pld_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_event.PoissonSampledDpEvent(sample_rate, dp_event.GaussianDpEvent(noise_multiplier)), steps)
    return float(accountant.get_epsilon(delta))


def prv_epsilon(sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    from opacus.accountants import PRVAccountant

    accountant = PRVAccountant()
    accountant.history = [(noise_multiplier, sample_rate, steps)]
    return float(accountant.get_epsilon(delta=delta))


ACCOUNTANTS = {"rdp": rdp_epsilon, "pld": pld_epsilon, "prv": prv_epsilon}


def epsilon_of(accountant: str, sample_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    return ACCOUNTANTS[accountant](sample_rate, noise_multiplier, steps, delta)


def calibrate(epsilon: float, sample_rate: float, steps: int, delta: float, rtol: float = 1e-4,
              accountant: str = "rdp") -> float:
    """Smallest noise multiplier (to relative precision rtol) whose epsilon is at most the target."""
    return smallest_noise(lambda nu: epsilon_of(accountant, sample_rate, nu, steps, delta), epsilon, rtol,
                          f"for {steps} steps at sampling rate {sample_rate:.4g} and delta={delta}")


def smallest_noise(spent, epsilon: float, rtol: float, what: str) -> float:
    """Smallest nu (to relative precision rtol) with spent(nu) <= epsilon; spent falls as nu grows."""
    low, high = 0.0, 1.0
    while spent(high) > epsilon:
        low, high = high, 2 * high
        if high > MAX_NOISE_MULTIPLIER:
            floor = spent(MAX_NOISE_MULTIPLIER)
            raise DpgridError(f"privacy.epsilon={epsilon} is unreachable {what}: even noise multiplier "
                              f"{MAX_NOISE_MULTIPLIER:g} spends epsilon = {floor:.3g}; raise epsilon above that "
                              f"or shrink the grid")
    while high - low > rtol * high:
        mid = (low + high) / 2
        low, high = (low, mid) if spent(mid) <= epsilon else (mid, high)
    return high
