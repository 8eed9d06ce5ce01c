"""One grid: plan, then every (configuration x seed) run, appending CSV rows; then the summary.

Output directory: resolved `config.yaml`, `plan.json`, `runs.csv` (one row per finished run, the
commit record), `curves.csv` (every validation), `summary.csv` (per configuration, best marked).
"""

import hashlib
import json
import math
import os
import re
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from . import DpgridError, data as data_mod, grid, strategies
from .checks import check_config, check_size
from .models import build_model, count_parameters
from .persample import check_model, make_engine
from .privacy import make_plan
from .randomness import SecureRandom
from .train import train_run

METRIC = {"classification": "accuracy", "reconstruction": "mse"}


def derive_seed(*parts) -> int:
    """A 63-bit seed from names only, so a run's randomness never depends on run order or job split."""
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2 ** 63 - 1)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not re.fullmatch(r"cuda(:\d+)?", name):
        raise DpgridError(f"train.device must be auto, cpu or cuda[:N], got {name!r}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(name.partition(":")[2] or 0) if name != "cpu" else 0
    if name != "cpu" and index >= count:
        valid = "auto, cpu" + (f", cuda:0..cuda:{count - 1}" if count else "")
        raise DpgridError(f"train.device={name} but this machine has {count} CUDA device(s); valid here: {valid}")
    return torch.device(name)


def validate(cfg, n_train: int):
    """Every check that needs no data and writes nothing; returns the strategy class."""
    check_config(cfg, n_train)
    resolve_device(str(cfg.train.device))
    strategy_cls = strategies.get(cfg.strategy.name)
    strategy_cls.check_config(cfg)
    n_configs = grid.size(cfg.strategy, cfg.grid)
    steps = math.ceil(int(cfg.train.epochs) * n_train / int(cfg.train.batch_size))
    check_size(n_configs, n_configs * int(cfg.train.seeds), steps, cfg.dataset.get("seconds_per_step"),
               bool(cfg.grid.allow_large))
    return strategy_cls


def plan_grid(cfg, n_train: int):
    """The validated grid: (strategy class, plan, selected configurations). Raises DpgridError."""
    strategy_cls = validate(cfg, n_train)
    configs = grid.configurations(cfg.strategy, cfg.grid)
    selected = grid.select(configs, cfg.grid.only)
    model = build_model(cfg.dataset)
    check_model(model, str(cfg.train.engine))  # before anything is written, not at the first run
    plan = make_plan(cfg, n_train, strategy_cls, configs, count_parameters(model))
    return strategy_cls, plan, selected


def check_run(cfg, out_dir) -> None:
    """Everything about a run that can be refused before any file is written (data comes later)."""
    plan_grid(cfg, int(cfg.dataset.n_train))
    claim_directory(Path(out_dir), config_hash(cfg), bool(cfg.get("overwrite", False)))


def run_one(cfg, plan, strategy_cls, data, config: dict, seed: int, progress: bool):
    grid_key = (plan.dataset, plan.strategy, plan.epsilon, plan.k)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(plan.dataset, "init", seed))  # same start for every strategy
        model = build_model(cfg.dataset).to(data.x_train.device)
    if cfg.privacy.secure_rng:  # batches and noise unpredictable; such runs are not reproducible
        sampler = noise = SecureRandom()
    else:  # public seeds: reproducible, and predictable by anyone who knows these names
        sampler = torch.Generator().manual_seed(derive_seed(*grid_key, config["config_id"], seed, "sampling"))
        noise = torch.Generator(device=data.x_train.device)
        noise.manual_seed(derive_seed(*grid_key, config["config_id"], seed, "noise"))
    hp = {k: v for k, v in config.items() if k != "config_id"}
    multipliers = {"noise_multiplier": plan.noise_multiplier, **plan.per_query}
    strategy = strategy_cls(model.parameters(), hp, multipliers, plan.batch_size, cfg.strategy, noise,
                            momentum=float(cfg.train.momentum))
    engine = make_engine(model, data.task, str(cfg.train.engine))
    return train_run(model, engine, strategy, data, plan.steps, plan.sample_rate, int(cfg.train.eval_every),
                     sampler, progress, sampling=str(cfg.train.sampling))


def append_csv(path: Path, rows: list) -> None:
    """Append complete rows and fsync (curves.csv: rows of unfinished runs are dropped on resume)."""
    frame = pd.DataFrame(rows)
    with open(path, "a", newline="") as f:
        frame.to_csv(f, header=f.tell() == 0, index=False)
        f.flush()
        os.fsync(f.fileno())


def commit_run(path: Path, row: dict) -> None:
    """Add a finished run to runs.csv by write-then-rename: the file is always whole, never torn."""
    old = pd.read_csv(path, dtype={"config_id": str}) if path.exists() else None
    frame = pd.DataFrame([row]) if old is None else pd.concat([old, pd.DataFrame([row])], ignore_index=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", newline="") as f:
        frame.to_csv(f, index=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


RESULT_FILES = ("runs.csv", "curves.csv", "summary.csv")
NOT_HASHED = ("train.device", "train.engine", "grid.only", "overwrite")  # do not change what a run computes


def config_hash(cfg) -> str:
    """Hash of the resolved config, less the settings that cannot change the results.

    train.seeds is left out unless the seeds are accounted: seed s's run does not depend on how many
    seeds there are, so a grid can be extended with more seeds in place (its resume runs only the new ones)."""
    plain = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
    unhashed = NOT_HASHED if plain["privacy"]["account_seeds"] else (*NOT_HASHED, "train.seeds")
    for key in unhashed:
        section, _, name = key.rpartition(".")
        (plain.get(section, {}) if section else plain).pop(name, None)
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]


def claim_directory(out: Path, digest: str, overwrite: bool) -> None:
    """Refuse to mix results of different configs in one directory (overwrite=true starts afresh)."""
    plan_path = out / "plan.json"
    if not (out / "runs.csv").exists() or not plan_path.exists():
        return
    previous = json.loads(plan_path.read_text()).get("config_hash")
    if previous == digest:
        return
    if not overwrite:
        raise DpgridError(f"{out} holds results of a different config (hash {previous} != {digest}); "
                          "choose another hydra.run.dir, or pass overwrite=true to delete them")
    for name in RESULT_FILES:
        (out / name).unlink(missing_ok=True)


def finished_runs(out: Path) -> set:
    """(config_id, seed) already in runs.csv; curves of unfinished runs (a killed grid) are dropped."""
    runs_path, curves_path = out / "runs.csv", out / "curves.csv"
    if not runs_path.exists():
        curves_path.unlink(missing_ok=True)
        return set()
    runs = pd.read_csv(runs_path, dtype={"config_id": str})
    done = set(zip(runs.config_id, runs.seed))
    if curves_path.exists():
        curves = pd.read_csv(curves_path, dtype={"config_id": str})
        keep = [(c, s) in done for c, s in zip(curves.config_id, curves.seed)]
        if not all(keep):
            tmp = curves_path.with_name(curves_path.name + ".tmp")
            curves[keep].to_csv(tmp, index=False)
            os.replace(tmp, curves_path)
    return done


def run_row(cfg, plan, strategy_cls, config, seed, result) -> dict:
    row = dict(dataset=plan.dataset, strategy=plan.strategy, metric=METRIC[cfg.dataset.task],
               epsilon=plan.epsilon, delta=plan.delta, k=plan.k, config_id=config["config_id"])
    row.update({k: v for k, v in config.items() if k != "config_id"})
    row.update(seed=seed, noise_multiplier=plan.noise_multiplier, **plan.per_query,
               budget=plan.budget, accountant=plan.accountant, epsilon_spent=plan.epsilon_spent,
               epsilon_grid=plan.epsilon_grid, seeds_accounted=plan.account_seeds,
               momentum=float(cfg.train.momentum), sampling=plan.sampling,
               normalize=str(cfg.dataset.get("normalize", "unit")), steps=plan.steps,
               best_value=result.best_value, best_step=result.best_step)
    if "clip" in strategy_cls.adapts:
        row["final_clip"] = result.final_clip
    if "lr" in strategy_cls.adapts:
        row["final_lr"] = result.final_lr
    row.update(diverged=result.diverged, seconds=round(result.seconds, 3), eval_seconds=round(result.eval_seconds, 3))
    return row


def summarize(runs: pd.DataFrame, axes: list, task: str) -> pd.DataFrame:
    """Per configuration: mean and std (ddof=0) of the run values over converged seeds.

    The best configuration is the best mean among those with no diverged seed (falling back to
    those with some converged seed when every configuration has a diverged one)."""
    rows = []
    for config_id, g in runs.groupby("config_id", sort=False):
        values = g.best_value[~g.diverged.astype(bool)]
        rows.append(dict(config_id=config_id, **{a: g[a].iloc[0] for a in axes},
                         mean=values.mean() if len(values) else math.nan,
                         std=values.std(ddof=0) if len(values) else math.nan,
                         n_seeds=len(g), n_diverged=int(g.diverged.astype(bool).sum())))
    summary = pd.DataFrame(rows)
    sign = -1.0 if task == "classification" else 1.0
    candidates = summary[summary["mean"].notna()]
    summary["best"] = False
    if len(candidates):
        key = candidates.assign(_any_div=candidates.n_diverged > 0, _score=sign * candidates["mean"])
        best = key.sort_values(["_any_div", "_score"], kind="stable").index[0]
        summary.loc[best, "best"] = True
    return summary


def run_grid(cfg, out_dir, progress: bool = True) -> pd.DataFrame:
    out = Path(out_dir)
    data = data_mod.load(cfg.dataset, cfg.data.root, resolve_device(str(cfg.train.device)))
    strategy_cls, plan, selected = plan_grid(cfg, data.n_train)
    digest = config_hash(cfg)
    claim_directory(out, digest, bool(cfg.get("overwrite", False)))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (out / "plan.json").write_text(json.dumps({**plan.to_dict(), "config_hash": digest}, indent=2) + "\n")
    done = finished_runs(out)
    todo = [(c, s) for c in selected for s in range(plan.seeds) if (c["config_id"], s) not in done]
    bar = tqdm(total=len(selected) * plan.seeds, initial=len(selected) * plan.seeds - len(todo),
               desc=f"{plan.strategy} {plan.dataset} eps={plan.epsilon:g} k={plan.k}", disable=None if progress else True)
    for config, seed in todo:
        result = run_one(cfg, plan, strategy_cls, data, config, seed, progress)
        append_csv(out / "curves.csv", [dict(config_id=config["config_id"], seed=seed, **c) for c in result.curve])
        commit_run(out / "runs.csv", run_row(cfg, plan, strategy_cls, config, seed, result))
        bar.update()
    bar.close()
    runs = pd.read_csv(out / "runs.csv", dtype={"config_id": str})
    summary = summarize(runs, list(cfg.strategy.grid), data.task)
    summary.to_csv(out / "summary.csv", index=False)
    return summary


def describe_best(summary: pd.DataFrame, task: str) -> str:
    if not summary.best.any():
        return "no configuration converged: every run diverged"
    b = summary[summary.best].iloc[0]
    hps = ", ".join(f"{a}={b[a]:.4g}" for a in summary.columns if a in grid.ID_PREFIX)
    unit = "accuracy %" if task == "classification" else "MSE"
    return (f"best configuration {b.config_id} ({hps}): {unit} {b['mean']:.4g} ± {b['std']:.2g} "
            f"over {b.n_seeds - b.n_diverged} seed(s)")
