"""The canaries of an audit, inside a grid's runs.

White box (gradient canaries, Nasr et al. 2023): canary i is a training example whose gradient is G e_i on a
coordinate of its own, G far above any clipping threshold. The m coordinates form one extra parameter vector that
the model never reads, so no real example's gradient touches them and what moves them is the canaries and the noise:
the strategy clips, noises and updates it as every other parameter (it cannot tell it apart). An included canary
joins each step's batch with probability q, as a real example is sampled. The attacker sees every iterate: canary
i's score is its coordinate's descent, sum_t -(theta_{t+1} - theta_t)_i / s_t, each step scaled by the spread s_t of
that step's moves over the m coordinates (the noise's scale: it follows an adaptive threshold, learning rate or
Adam's normalisation without knowing them).

Black box (input canaries): m examples of the test split under a random wrong label, the included ones appended to
the training data; the attacker sees the released model only, and scores a canary by minus its loss there.
"""

from dataclasses import dataclass, replace

import numpy as np
import torch

from dpgrid.data import Data
from dpgrid.privacy.randomness import seeded_coins
from dpgrid.training.observer import RunObserver, Watcher
from dpgrid.training.persample import PerSampleGrads

THREATS = ("white_box", "black_box")
STEP_TRACE = ("moves", "joins", "batch_sizes", "overlaps", "stated")  # a run's steps as the mechanism test reads them
GRADIENT_NORM = 1e6  # a white-box canary's gradient norm: far above any threshold, so clipping alone bounds it


@dataclass(frozen=True)
class AuditSpec(RunObserver):
    """What an audited grid adds to its runs: the canaries and their secret coins (a RunObserver: training sees the
    hook, not the audit)."""
    threat: str
    canaries: int
    coins: tuple        # m booleans: canary i included (secret until the audit ends)
    seed: int           # the audit's draws: coins, canaries, their sampling in each run
    sample_rate: float  # q: a white-box canary's chance to join a step's batch
    classes: int = None  # the dataset's (a black-box canary's wrong label)

    @property
    def included(self) -> np.ndarray:
        return np.flatnonzero(self.coins)

    def training_data(self, data):
        return with_input_canaries(self, data, self.classes)

    def watch(self, engine, run: tuple, phase, model):
        return gradient_canaries(self, engine, [run], phase, model)


def draw_coins(canaries: int, seed: int) -> tuple:
    rng = np.random.default_rng([seed, 0])
    return tuple(bool(c) for c in rng.integers(0, 2, canaries))


def input_canaries(audit: AuditSpec, data: Data, classes: int) -> tuple:
    """(inputs, targets) of the m black-box canaries: test examples under a random wrong label (for reconstruction,
    the examples themselves)."""
    rng = np.random.default_rng([audit.seed, 1])
    pick = torch.from_numpy(rng.choice(len(data.x_test), audit.canaries, replace=False))
    x = data.x_test[pick.to(data.x_test.device)]
    if data.task != "classification":  # reconstruction: the targets are the inputs
        return x, x
    shift = torch.from_numpy(rng.integers(1, classes, audit.canaries)).to(data.y_test.device)
    return x, (data.y_test[pick.to(data.y_test.device)] + shift) % classes


def with_input_canaries(audit, data: Data, classes: int) -> Data:
    """The training data with the included black-box canaries appended (unchanged outside a black-box audit)."""
    if audit is None or audit.threat != "black_box":
        return data
    x, y = input_canaries(audit, data, classes)
    included = torch.from_numpy(audit.included).to(x.device)
    return replace(data, x_train=torch.cat([data.x_train, x[included]]), y_train=torch.cat([data.y_train, y[included]]))


def gradient_canaries(audit, engine, runs: list, phase, model) -> "GradientCanaries | None":
    """In a white-box audit, the engine of a run trained alone (`runs`: its one (config, seed)) with the canaries
    added; else None."""
    if audit is None or audit.threat != "white_box":
        return None
    (config, seed), = runs
    streams = (phase.streams or ()) if phase is not None else ()
    return GradientCanaries(engine, audit, (config["config_id"], seed, *streams), next(model.parameters()))


def keep_scores(out, config_id: str, seed: int, scores: np.ndarray) -> None:
    """A run's canary scores beside its results: what the attacker reads of it (out/audit/)."""
    (out / "audit").mkdir(exist_ok=True)
    np.save(out / "audit" / f"{config_id}_seed{seed}.npy", scores)


class GradientCanaries(Watcher):
    """A run's engine with the white-box canaries added to each batch (module docstring). `coordinates`: the extra
    parameter vector, handed to the strategy beside the model's: m canary coordinates, then m control coordinates
    that no example ever touches (what the noise alone does: the mechanism test's, dpgrid.audit.mechanism). Each
    step keeps its move of the coordinates (`moves`; the coordinates are set back to 0 after each step, so that a
    move is never lost below the rounding of a large coordinate: the model never reads them, no update depends on
    them), the canaries of its batch (`joined`), its real batch's size, how many of its real examples the step before's
    batch held too (`overlaps`: what tells independent Poisson batches from batches cut from a permutation or drawn at
    a fixed size, dpgrid.audit.mechanism) and what the strategy states it uses (`stated`: C_t, and its linear_step
    (mu, a), NaN where it has none). The sizes and overlaps are the sampler's draws, as the audit's own trace."""

    def __init__(self, engine, audit: AuditSpec, names: tuple, like: torch.Tensor):
        from dpgrid.privacy.randomness import derive_seed

        self.inner, self.audit = engine, audit
        self.coordinates = torch.zeros(2 * audit.canaries, dtype=like.dtype, device=like.device)
        self.included = torch.tensor(audit.coins, device=like.device)
        self.sampling = torch.Generator().manual_seed(derive_seed("audit", audit.seed, *names))
        self.moves, self.joined, self.batch_sizes, self.overlaps, self.stated = [], [], [], [], []
        self.previous = None  # the step before's batch (indices of the real examples)

    @property
    def engine(self):
        return self

    @property
    def params(self) -> list:
        return [self.coordinates]

    def gradients(self, data, indices: list) -> PerSampleGrads:
        batch = indices[0].cpu()
        self.batch_sizes.append(len(batch))
        self.overlaps.append(int(torch.isin(batch, self.previous).sum()) if self.previous is not None else 0)
        self.previous = batch
        base = self.inner.gradients(data, indices)
        joins = seeded_coins(self.audit.canaries, self.audit.sample_rate, self.sampling)
        rows = (joins.to(self.included.device) & self.included).nonzero().squeeze(1)
        self.joined.append(rows.cpu().numpy())
        return joined(base, rows, self.coordinates)

    def before_step(self, step: int, strategy) -> None:
        _, clip, _ = strategy.run_state(0)
        linear = strategy.linear_step()
        self.stated.append((float(clip), *(linear if linear is not None else (float("nan"),) * 2)))

    def after_step(self, step: int, strategy) -> None:
        if strategy.finished:  # refused: nothing moved, the step is not one
            for kept in (self.joined, self.batch_sizes, self.overlaps, self.stated):
                kept.pop()
            return
        with torch.no_grad():
            self.moves.append(self.coordinates.detach().to("cpu", copy=True))
            self.coordinates.zero_()

    def scores(self, moves: np.ndarray) -> np.ndarray:
        """Each canary's descent over the run, every step scaled by the spread of its moves (module docstring)."""
        descent = -moves[:, :self.audit.canaries].astype(np.float64)
        spread = descent.std(axis=1, keepdims=True)
        return np.where(spread > 0, descent / np.where(spread > 0, spread, 1.0), 0.0).sum(0)

    def finish(self, out, config_id: str, seed: int) -> None:
        """The run's canary scores (what the attacker reads) and what the mechanism test reads (the coordinates'
        moves, the joins, the real batch sizes and overlaps, what the strategy stated), beside the run's results
        (out/audit/)."""
        m = 2 * self.audit.canaries
        moves = torch.stack(self.moves).numpy() if self.moves else np.zeros((0, m), dtype=np.float32)
        keep_scores(out, config_id, seed, self.scores(moves))
        joins = np.zeros((len(self.joined), self.audit.canaries), dtype=bool)
        for step, rows in enumerate(self.joined):
            joins[step, rows] = True
        trace = dict(moves=moves, joins=joins, batch_sizes=np.array(self.batch_sizes, dtype=np.int64),
                     overlaps=np.array(self.overlaps, dtype=np.int64),
                     stated=np.array(self.stated, dtype=float).reshape(-1, 3))
        np.savez_compressed(out / "audit" / f"{config_id}_seed{seed}_steps.npz", **trace)


def joined(base: PerSampleGrads, rows: torch.Tensor, coordinates: torch.Tensor) -> PerSampleGrads:
    """`base` with one more example per entry of `rows` (canary indices), whose gradient is GRADIENT_NORM on its own
    coordinate of `coordinates` (the last parameter and the last group) and zero elsewhere; the real examples'
    gradients are zero there (and on the control coordinates, none is ever anything but zero)."""
    b, k, m = base.size, len(rows), len(coordinates)
    big = torch.full((k,), GRADIENT_NORM, dtype=coordinates.dtype, device=coordinates.device)

    def norms():
        return torch.cat([base.norms.to(big.dtype), big])

    def canary_sum(w):  # w (n, k) -> (n, m)
        out = coordinates.new_zeros((len(w), m))
        out[:, rows] = w.to(out.dtype) * GRADIENT_NORM
        return out

    def sums(w):
        return list(base._sum_fn(w[:, :b])) + [canary_sum(w[:, b:])]

    def group_norms():
        real = base.group_norms
        top = torch.cat([real, real.new_zeros((b, 1))], 1)
        bottom = torch.cat([real.new_zeros((k, real.shape[1])), big.to(real.dtype)[:, None]], 1)
        return torch.cat([top, bottom])

    def group_sums(w):  # w (b + k, L + 1)
        return list(base._group_sum_fn(w[:b, :-1])) + [canary_sum(w[b:, -1][None])[0]]

    return PerSampleGrads(b + k, norms, sums, group_norms, group_sums, device=coordinates.device)


def untraced(grid, runs) -> str:
    """The first run of `runs` (runs.csv's rows) without the trace an audited run leaves in grid/audit (its canary
    scores and its steps, with every STEP_TRACE key), in words; '' where each has it."""
    import zipfile

    for row in runs.itertuples():
        name = f"{row.config_id}_seed{row.seed}"
        scores, steps = grid / "audit" / f"{name}.npy", grid / "audit" / f"{name}_steps.npz"
        missing = [p.name for p in (scores, steps) if not p.is_file()]
        try:
            if not missing:
                with np.load(steps) as trace:
                    missing = [f"{steps.name}'s {key}" for key in STEP_TRACE if key not in trace.files]
        except (OSError, ValueError, EOFError, zipfile.BadZipFile):
            missing = [f"a readable {steps.name}"]
        if missing:
            return f"run {row.config_id} seed {row.seed} has no trace of it ({', '.join(missing)} missing in grid/audit)"
    return ""
