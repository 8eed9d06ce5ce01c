"""The mechanism test of a white-box audit: what each step of the audited runs actually did, measured on the audit's
extra coordinates, against what the plan's accountant assumes of every step (docs/audit.md, "The mechanism test").

The accountant assumes that step t adds to the sum of clipped gradients Gaussian noise N(0, nu^2 C_t^2 I) (nu the
plan's multiplier of the gradient query), that one example moves that sum by at most C_t, and that each example joins
a step with probability q, independently of everything else. The audit's vector holds m canary coordinates (canary i,
when its coin put it in, joins each step with probability q with a gradient of norm 10^6 on coordinate i: clipping
alone bounds its contribution, which is then exactly the threshold) and m control coordinates no example ever touches.

Reading the noisy gradient off the moves. A strategy's `linear_step()` states (mu, a_t): every parameter moves by
d_t = -a_t v_t, v_t = mu v_{t-1} + g_tilde_t (heavy ball; Adam's first moment). Then

    e_t = d_t - k_t d_{t-1},   k_t = mu a_t / a_{t-1},   equals -a_t g_tilde_t,   g_tilde_t = (sum + noise) / B,

on every coordinate: on a control coordinate e_t = -a_t sigma_t z / B (sigma_t the step's noise on the sum), on a
canary coordinate that joined e_t = -a_t (c_t + sigma_t z) / B (c_t the canary's contribution to the sum). The spread
s_t of e_t over the controls is a_t sigma_t / B, so u = -e_t / s_t on a joined canary has mean c_t / sigma_t = 1 /
nu_eff and standard deviation 1, whatever a_t, C_t and B are: nu_eff, the noise in units of what one example moved
the sum, is measured without trusting anything the strategy states but mu (a wrong mu leaves the innovations
correlated, which the independence test sees). The tests, each at (1 - confidence) / (the number run), Bonferroni:

- noise multiplier: nu_plan * mean(u) over every join of every run = nu_plan / nu_eff, two-sided against 1.
- sensitivity: -e_t B / (a_t C_t) on a joined canary, with the C_t and a_t the strategy states: its mean is the
  contribution c_t / C_t, which must not exceed 1 (one-sided). Tells a loose clip from a short noise (both move
  nu_eff).
- sampling: (1) the real examples of all batches, a binomial count of N T trials at q; (2) where a canary's signal
  appears: u on the included canaries' coordinates at the steps they did NOT join has mean 0; their sum over the sum
  at the joins is x, and the canaries join at q (1 + x) in effect (a sum reused in the next step doubles it).
- batch sizes: a Poisson batch's size b_t is Binomial(N, q), independently each step; S = sum_t (b_t - N q)^2 has
  mean T s2 and variance T (m4 - s2^2), s2 = N q (1 - q) and m4 = s2 (1 + 3 (N - 2) q (1 - q)) the binomial's central
  moments, and is compared two-sided with the Gamma law of that mean and variance (chi^2 matched to the first two
  exact moments: the binomial's kurtosis included). A fixed size has S near 0.
- overlap: given the sizes, independent Poisson batches are independent uniform subsets of them, so o_t = |B_t and
  B_{t-1}| is Hypergeometric(N, b_{t-1}, b_t), independently over t (o_{t+1} depends on B_t only through b_t).
  sum_t o_t against its exact mean sum b_{t-1} b_t / N and variance sum b_{t-1} b_t (N - b_{t-1}) (N - b_t) /
  (N^2 (N - 1)), normal (hundreds of steps), two-sided: batches cut from one permutation per epoch share nothing.
  Conditioned on the sizes, it is independent of the size test.
- Gaussian: the D'Agostino-Pearson K^2 of each step's control innovations (scale-free), summed over the steps against
  chi^2 with 2 T degrees of freedom.
- independent: the correlation of consecutive steps' standardised control innovations, two-sided against 0 (noise
  drawn once and reused has correlation 1).

The spread s_t is estimated from m controls: 1 / s_t is corrected by E[s / s_hat] = sqrt(m / 2) Gamma((m - 1) / 2)
/ Gamma(m / 2) (s_hat^2 ~ s^2 chi^2_m / m), so that mean(u) is unbiased at any m. A strategy whose update is not
linear (`linear_step()` None: DPAdam's per-coordinate normalisation) has only the real examples' sampling measured;
queries other than the gradient's (online's clipped fraction, fixed_quantile's count) are named, not measured.
"""

import math
from dataclasses import dataclass

import numpy as np
from scipy import special, stats


@dataclass(frozen=True)
class RunSteps:
    """One watched run's steps (dpgrid.audit.canaries.GradientCanaries.finish): `moves` (T, 2m) what each step moved
    the coordinates; `joins` (T, m) the canaries of each step's batch; `batch_sizes` (T,) the real examples of each;
    `overlaps` (T,) how many of those the step before's batch held too (0 at the first); `stated` (T, 3) C_t, mu, a_t
    as the strategy stated them before the step; `included` (m,) the coins; `noise_multiplier` the plan's nu of the
    run's gradient query."""
    moves: np.ndarray
    joins: np.ndarray
    batch_sizes: np.ndarray
    overlaps: np.ndarray
    stated: np.ndarray
    included: np.ndarray
    noise_multiplier: float

    @classmethod
    def load(cls, file, included, noise_multiplier: float) -> "RunSteps":
        with np.load(file) as f:
            return cls(f["moves"], f["joins"], f["batch_sizes"], f["overlaps"], f["stated"],
                       np.asarray(included, bool), float(noise_multiplier))

    @property
    def linear(self) -> bool:
        return bool(len(self.stated)) and bool(np.isfinite(self.stated[:, 1:]).all())


def innovations(run: RunSteps) -> tuple:
    """(e, s, usable): each step's innovation e_t on all 2m coordinates (module docstring), the controls' corrected
    spread s_t, and the steps where s_t is positive and everything finite."""
    m = run.joins.shape[1]
    d = run.moves.astype(np.float64)
    mu, a = run.stated[:, 1], run.stated[:, 2]
    carry = np.zeros(len(d))
    carry[1:] = np.where(a[:-1] != 0, mu[1:] * a[1:] / np.where(a[:-1] != 0, a[:-1], 1.0), 0.0)
    previous = np.vstack([np.zeros((1, d.shape[1])), d[:-1]])
    e = d - carry[:, None] * previous
    unbiased = math.exp(0.5 * math.log(m / 2) + special.gammaln((m - 1) / 2) - special.gammaln(m / 2))
    s = np.sqrt((e[:, m:] ** 2).mean(1)) / unbiased  # so that E[1 / s] is 1 / (the true spread)
    usable = np.isfinite(e).all(1) & np.isfinite(s) & (s > 0)
    return e, s, usable


@dataclass
class Pooled:
    """What every run adds to each test."""
    noise: list        # nu_plan * u at every join
    sensitivity: list  # -e B / (a C) at every join
    absent: list       # nu_plan * u on included canaries at steps they did not join
    k2: float = 0.0    # sum of the steps' K^2
    k2_steps: int = 0
    lag: float = 0.0   # sum over consecutive steps of z_t . z_{t-1} (controls)
    lag_norms: tuple = (0.0, 0.0)
    lag_terms: int = 0
    sampled: int = 0   # real examples over all batches
    trials: int = 0    # N T
    sizes: list = None     # each run's batch sizes b_t
    overlaps: list = None  # each run's (o_t, b_{t-1}, b_t) from its second step on
    kurtosis: list = None
    noiseless: int = 0  # joins that moved their canary at steps where no control moved (no noise at all)


def pool(runs: list, n_train: int, batch_size: int) -> Pooled:
    pooled = Pooled([], [], [], kurtosis=[], sizes=[], overlaps=[])
    for run in runs:
        pooled.sampled += int(run.batch_sizes.sum())
        pooled.trials += n_train * len(run.batch_sizes)
        sizes = run.batch_sizes.astype(np.int64)
        pooled.sizes.append(sizes)
        pooled.overlaps.append(np.column_stack([run.overlaps[1:], sizes[:-1], sizes[1:]]).astype(np.int64))
        if not run.linear:
            continue
        m = run.joins.shape[1]
        e, s, usable = innovations(run)
        joins, included = run.joins & run.included, run.included[None, :] & ~run.joins
        still = np.isfinite(e).all(1) & (s == 0)  # the controls did not move: no noise at those steps
        pooled.noiseless += int(((e[:, :m] != 0) & joins)[still].sum())
        u = -e[:, :m] / np.where(usable, s, 1.0)[:, None]
        nu = run.noise_multiplier
        pooled.noise.append(nu * u[usable[:, None] & joins])
        step_scale = (run.stated[:, 2] * run.stated[:, 0] / batch_size)[:, None]
        pooled.sensitivity.append((-e[:, :m] / np.where(step_scale != 0, step_scale, np.nan))[usable[:, None] & joins])
        pooled.absent.append(nu * u[usable[:, None] & included])
        controls = e[usable, m:]
        if len(controls):
            k2, _ = stats.normaltest(controls, axis=1)
            pooled.k2 += float(k2.sum())
            pooled.k2_steps += len(k2)
            z = controls / s[usable][:, None]
            pooled.kurtosis.append(z.ravel())
            together = usable[1:] & usable[:-1]  # consecutive usable steps
            zt, zp = (e[1:, m:] / s[1:, None])[together], (e[:-1, m:] / s[:-1, None])[together]
            pooled.lag += float((zt * zp).sum())
            pooled.lag_norms = (pooled.lag_norms[0] + float((zt ** 2).sum()), pooled.lag_norms[1] + float((zp ** 2).sum()))
            pooled.lag_terms += zt.size
    return pooled


def mean_test(values: np.ndarray, planned: float, significance: float, sided: str = "two") -> tuple:
    """(mean, its standard error, p-value against `planned`): normal approximation (thousands of values)."""
    mean, se = float(values.mean()), float(values.std(ddof=1) / math.sqrt(len(values)))
    z = (mean - planned) / se if se > 0 else (0.0 if mean == planned else math.copysign(math.inf, mean - planned))
    p = float(2 * stats.norm.sf(abs(z))) if sided == "two" else float(stats.norm.sf(z))
    return mean, se, p


def size_test(sizes: np.ndarray, n: int, q: float, significance: float) -> tuple:
    """(the sizes' spread over the binomial's, its interval, p-value): S = sum (b_t - N q)^2 against the Gamma law of
    its exact mean and variance under b_t ~ Binomial(N, q) (module docstring), two-sided."""
    s2 = n * q * (1 - q)
    spread = float(((sizes - n * q) ** 2).sum())
    if s2 <= 0 or not len(sizes):  # q = 1 (or no step): every batch is the whole set
        return (0.0 if s2 <= 0 else math.nan), None, float(spread == 0)
    m4 = s2 * (1 + 3 * (n - 2) * q * (1 - q))
    mean, variance = len(sizes) * s2, len(sizes) * (m4 - s2 ** 2)
    shape, scale = mean ** 2 / variance, variance / mean
    below, above = float(special.gammainc(shape, spread / scale)), float(special.gammaincc(shape, spread / scale))
    p = min(1.0, 2 * min(below, above))
    # a spread lambda times the binomial's scales S by lambda: the lambdas whose law holds S within its central range
    interval = [spread / (scale * float(special.gammainccinv(shape, significance / 2))),
                spread / (scale * float(special.gammaincinv(shape, significance / 2)))]
    return spread / mean, interval, p


def overlap_test(overlaps: np.ndarray, n: int, significance: float) -> tuple:
    """(the share of a batch's examples also in the next, its interval, p-value): rows (o_t, b_{t-1}, b_t); o_t is
    Hypergeometric(N, b_{t-1}, b_t) given the sizes, independently over t (module docstring); the sum against its
    exact mean and variance, normal with a continuity correction, two-sided."""
    o, before, after = overlaps.T.astype(np.float64)
    mean = float((before * after).sum() / n)
    variance = float((before * after * (n - before) * (n - after)).sum() / (n ** 2 * (n - 1))) if n > 1 else 0.0
    shared, out_of = float(o.sum()), float(before.sum())
    rate = shared / out_of if out_of else math.nan
    if variance <= 0:
        return rate, None, float(shared == mean)
    z = max(abs(shared - mean) - 0.5, 0.0) / math.sqrt(variance)
    half = float(stats.norm.isf(significance / 2)) * math.sqrt(variance) / out_of
    return rate, [rate - half, rate + half], float(2 * stats.norm.sf(z))


def entry(estimate, interval, planned, p: float, significance: float, what: str) -> dict:
    return {"estimate": estimate, "interval": interval, "planned": planned, "p_value": p,
            "verdict": "differs" if p < significance else "as planned", "what": what}


def measure(runs: list, n_train: int, batch_size: int, sample_rate: float, confidence: float,
            strategy_cls, queries: dict, poisson: bool = True) -> dict:
    """The mechanism test over the watched runs (RunSteps): audit.json's `mechanism`. `poisson` False: the plan's
    batches are not Poisson batches and it claims no epsilon for them (train.sampling=shuffle): their spread and
    overlap are not tested, and the record says so."""
    pooled = pool(runs, n_train, batch_size)
    linear = bool(runs) and all(run.linear for run in runs)
    sampling = ["sampling", "batch_sizes", "overlap"] if poisson else ["sampling"]
    measured = [*sampling, "noise_multiplier", "sensitivity", "canary_sampling", "gaussian", "independent"] \
        if linear else sampling
    significance = (1 - confidence) / len(measured)
    z = float(stats.norm.isf(significance / 2))
    tests = {}
    test = stats.binomtest(pooled.sampled, pooled.trials, sample_rate)
    low, high = test.proportion_ci(1 - significance, method="wilson")  # thousands of trials: exact enough, fast
    tests["sampling"] = entry(pooled.sampled / pooled.trials, [low, high], sample_rate, float(test.pvalue),
                              significance, "the rate q at which real examples joined the batches (binomial)")
    if poisson:
        spread, interval, p = size_test(np.concatenate(pooled.sizes), n_train, sample_rate, significance)
        tests["batch_sizes"] = entry(spread, interval, 1.0, p, significance,
                                     "the batch sizes' spread around N q over a Poisson batch's, the binomial "
                                     "N q (1 - q) a step (0: a fixed size)")
        rate, interval, p = overlap_test(np.concatenate(pooled.overlaps), n_train, significance)
        tests["overlap"] = entry(rate, interval, sample_rate, p, significance,
                                 "the share of a batch's examples also in the next batch (independent draws: q; one "
                                 "permutation cut into batches: 0)")
    if linear and not sum(len(v) for v in pooled.noise) and pooled.noiseless:
        tests["noise_multiplier"] = entry(0.0, [0.0, 0.0], 1.0, 0.0, significance, "nu_eff / nu_plan: the canaries "
                                          "moved and the controls never did: no noise was added")
    elif linear and sum(len(v) for v in pooled.noise):
        noise = np.concatenate(pooled.noise)
        mean, se, p = mean_test(noise, 1.0, significance)
        inverse = (lambda x: 1 / x if x > 0 else math.inf)
        tests["noise_multiplier"] = entry(inverse(mean), [inverse(mean + z * se), inverse(mean - z * se)], 1.0, p,
                                          significance, "nu_eff / nu_plan: the noise over what one example moved the "
                                          "sum, as a ratio to the plan's multiplier of the gradient query")
        contribution = np.concatenate(pooled.sensitivity)
        mean, se, p = mean_test(contribution[np.isfinite(contribution)], 1.0, significance, sided="one")
        tests["sensitivity"] = entry(mean, [mean - z * se, mean + z * se], 1.0, p, significance,
                                     "c_t / C_t: what a canary far above the threshold added to the sum, in units of "
                                     "the threshold the strategy states (at most 1)")
        absent, joined = np.concatenate(pooled.absent), noise.sum()
        extra = float(absent.sum() / joined)
        se = float(math.sqrt(len(absent)) * absent.std(ddof=1) / joined)
        p = float(2 * stats.norm.sf(abs(extra) / se)) if se > 0 else 1.0
        tests["canary_sampling"] = entry(sample_rate * (1 + extra), [sample_rate * (1 + extra - z * se),
                                                                     sample_rate * (1 + extra + z * se)],
                                         sample_rate, p, significance,
                                         "the rate at which a canary's contribution reached the moves")
        p = float(stats.chi2.sf(pooled.k2, 2 * pooled.k2_steps))
        kurtosis = float(stats.kurtosis(np.concatenate(pooled.kurtosis)))
        tests["gaussian"] = entry(kurtosis, None, 0.0, p, significance,
                                  "the noise's excess kurtosis (0 for a Gaussian); the p-value is the steps' summed "
                                  "D'Agostino-Pearson K^2")
        r = pooled.lag / math.sqrt(pooled.lag_norms[0] * pooled.lag_norms[1])
        se = 1 / math.sqrt(pooled.lag_terms)
        tests["independent"] = entry(r, [r - z * se, r + z * se], 0.0, float(2 * stats.norm.sf(abs(r) / se)),
                                     significance, "the correlation of consecutive steps' noise (0: drawn afresh)")
    gradient = strategy_cls.gradient_query or "noise_multiplier"
    others = sorted(k for k in queries if k != gradient)
    return {"verdict": "differs" if any(t["verdict"] == "differs" for t in tests.values()) else "as planned",
            "confidence": confidence, "significance_each": significance, "tests": tests,
            "query": gradient if linear else None, "not_measured_queries": others if linear else sorted([gradient, *others]),
            "not_measured": None if linear else (f"{strategy_cls.__name__}'s update is not linear in its noisy "
                                                 "gradient (linear_step() is None): only its sampling is measured"),
            "not_measured_sampling": None if poisson else ("the plan's batches are shuffled, not Poisson batches, and "
                                                           "claim no epsilon: their spread and overlap are not tested"),
            "joins": int(sum(len(v) for v in pooled.noise)), "runs": len(runs)}


NAMES = {"noise_multiplier": "noise multiplier {e:.3g}x the plan's ({lo:.3g}-{hi:.3g})",
         "sensitivity": "a canary added {e:.3g}x the stated threshold ({lo:.3g}-{hi:.3g})",
         "sampling": "real examples joined at q = {e:.4g} (plan {p:.4g})",
         "batch_sizes": "the batch sizes varied {e:.3g}x as much as Poisson batches' ({lo:.3g}-{hi:.3g})",
         "overlap": "consecutive batches shared {e:.3g} of their examples (independent draws: q = {p:.4g})",
         "canary_sampling": "canaries reached the moves at {e:.4g} (plan q = {p:.4g})",
         "gaussian": "the noise is not Gaussian (excess kurtosis {e:.3g}, p = {pv:.2g})",
         "independent": "consecutive steps' noise correlates ({e:.3g})"}


def summary_line(mechanism: dict) -> str:
    """One line: which test differs and by how much, or that each is as planned."""
    tests = mechanism["tests"]
    differing = [name for name, t in tests.items() if t["verdict"] == "differs"]

    def said(name):
        t = tests[name]
        lo, hi = t["interval"] if t["interval"] else (math.nan, math.nan)
        return NAMES[name].format(e=t["estimate"], lo=lo, hi=hi, p=t["planned"], pv=t["p_value"])

    confidence = f"{mechanism['confidence']:.0%} confidence"
    if differing:
        return f"mechanism differs from the plan at {confidence}: " + "; ".join(said(n) for n in differing)
    sampling = "Poisson sampling (rate, batch sizes, overlap)" if "overlap" in tests else "the sampling rate"
    shuffled = f"; {mechanism['not_measured_sampling']}" if mechanism.get("not_measured_sampling") else ""
    if "noise_multiplier" not in tests:
        return f"mechanism: {sampling} as planned at {confidence}; {mechanism['not_measured']}{shuffled}"
    n, c = tests["noise_multiplier"], tests["sensitivity"]
    return (f"mechanism as planned at {confidence}: noise multiplier {n['estimate']:.3g}x the plan's, a canary added "
            f"{c['estimate']:.3g}x the threshold, {sampling}, Gaussian and independent noise ({mechanism['joins']:,} "
            f"joins of {mechanism['runs']} runs){shuffled}")
