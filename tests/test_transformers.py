"""The transformers (dpgrid.models.transformers) on their data: AG News as token ids over GloVe's most frequent words, a ViT
on 28 x 28 images. Every built-in DP-SGD strategy trains both on the fast engine; a grid of each (k = 3, one epoch)
runs end to end and releases a model that loads and scores as its run did."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

import dpgrid
from dpgrid.config import check_loaded, compile
from dpgrid.data import Data, load
from dpgrid.results.files import read_frame
from dpgrid.runner import train_together
from dpgrid.training.train import evaluate

from .command import dpgrid as run_dpgrid
from .conftest import fast_layer_runs, load_cfg, strategy_class
from .test_data import make_idx_root

WORDS = ["the", ",", "stocks", "rise", "team", "wins", "game", "on", "oil", "prices", "fall", "vote"]


def write_ag_news(root, n_train=64, n_test=16, seed=0):
    """A small AG News in its CSV layout and a GloVe text file holding WORDS in their order (their ranks)."""
    rng = np.random.default_rng(seed)
    folder = root / "ag_news_csv"
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        rows = [(int(rng.integers(1, 5)), " ".join(rng.choice(WORDS + ["zzz"], 3)),
                 " ".join(rng.choice(WORDS + ["qqq"], int(rng.integers(1, 12))))) for _ in range(n)]
        pd.DataFrame(rows).to_csv(folder / f"{split}.csv", header=False, index=False)
    glove = root / "glove.txt"
    glove.write_text("".join(f"{w} " + " ".join(["0.5"] * 50) + "\n" for w in WORDS))
    return glove


def test_token_ids_follow_gloves_ranks_within_the_vocabulary(tmp_path):
    glove = write_ag_news(tmp_path)
    pd.DataFrame([(3, "The stocks, rise", "zzz oil")]).to_csv(tmp_path / "ag_news_csv" / "train.csv", header=False,
                                                              index=False)
    cfg = OmegaConf.create(dict(name="ag_news_tokens", task="classification", load={
        "_target_": "dpgrid.data.datasets.load_ag_news_tokens", "max_tokens": 8, "vocabulary": 5, "glove": str(glove)}))
    data = load(cfg, tmp_path)
    # the 0, , 1, stocks 2, rise 3 (ranks) -> + 2; zzz unknown and oil (rank 8) beyond the vocabulary of 5 -> 1
    assert data.x_train.tolist() == [[2, 4, 3, 5, 1, 1, 0, 0]] and data.x_train.dtype == torch.int64
    cfg.load.vocabulary = 0
    with pytest.raises(dpgrid.DpgridError, match="dataset.load.vocabulary must be a whole number >= 1"):
        load(cfg, tmp_path)


def tiny_data(dataset: str, n=512):
    g = torch.Generator().manual_seed(0)
    if dataset == "ag_news_tokens":
        x = torch.randint(0, 52, (n + 8, 9), generator=g)
        y = torch.randint(0, 4, (n + 8,), generator=g)
    else:
        x, y = torch.rand((n + 8, 1, 28, 28), generator=g), torch.randint(0, 10, (n + 8,), generator=g)
    return Data(x[:n], y[:n], x[n:], y[n:], "classification")


def dp_sgd_strategies():
    from dpgrid.config.groups import options

    return [name for name in sorted(options("strategy")) if strategy_class(name).accounting == "composition"]


SMALL_TRANSFORMER = {"model.vocabulary": 50, "model.max_tokens": 9, "model.width": 16, "model.depth": 1}
SMALL_VIT = {"model.width": 16, "model.depth": 1}


@pytest.mark.parametrize("strategy", fast_layer_runs(dp_sgd_strategies(), "online"))
@pytest.mark.parametrize("dataset, model", [("ag_news_tokens", SMALL_TRANSFORMER), ("mnist", {"model": "vit",
                                                                                               **SMALL_VIT})])
def test_every_strategy_trains_both_transformers(strategy, dataset, model):
    spec = compile(load_cfg(dataset, strategy, **model, **{"grid.k": 2, "train.epochs": 1, "train.eval_every": 8,
                                                           "train.batch_size": 32, "dataset.n_train": 512}))
    assert spec.train.engine == "fast" and not any("falling back" in w for w in spec.warnings)
    data = tiny_data(dataset)
    check_loaded(spec, data.n_train)
    (result,) = train_together(spec, data, [(spec.plan.configurations[0], 0)])
    assert result.steps == spec.plan.steps and len(result.curve) >= 2
    assert result.diverged or all(np.isfinite(point["value"]) for point in result.curve)


def released_model_scores_as_its_run(out, data_spec_root):
    """The released model of seed 0 loads and scores on the test set what its run's last validation recorded."""
    record = json.loads((out / "model" / "model.json").read_text())
    spec_dataset, root = data_spec_root
    data = load(spec_dataset, root)
    curves = read_frame(out / "curves.csv")
    model = dpgrid.load_model(out, seed=0)
    run = curves[(curves.config_id == record["configuration"]["config_id"]) & (curves.seed == 0)]
    value = evaluate(model, data.x_test, data.y_test, data.task)[0]
    assert value == pytest.approx(float(run.iloc[-1]["value"]), rel=1e-5, abs=1e-4)


@pytest.mark.slow
def test_a_transformer_grid_runs_end_to_end_and_releases_its_model(tmp_path):
    glove = write_ag_news(tmp_path / "data")
    args = ["dataset=ag_news_tokens", "strategy=fixed_threshold", "grid.k=3", "train.epochs=1", "train.seeds=1",
            "train.batch_size=16", "dataset.n_train=64", "train.eval_every=2", f"data.root={tmp_path / 'data'}",
            f"dataset.load.glove={glove}", "dataset.load.vocabulary=12", "dataset.load.max_tokens=16",
            "model.width=16", "model.depth=1"]
    trains_on_the_fast_engine_and_releases(tmp_path, args, runs=9)  # fixed_threshold at k = 3: 3 x 3


def trains_on_the_fast_engine_and_releases(tmp_path, args: list, runs: int) -> None:
    """`dpgrid run *args` in tmp_path/grid: no layer falls back to torch.func, each of the grid's `runs`
    configurations trains (1 seed), and the released model scores as its run did."""
    out = tmp_path / "grid"
    r = run_dpgrid("run", *args, f"hydra.run.dir={out}")
    assert r.returncode == 0 and "falling back" not in r.stderr, r.stderr
    spec = compile(dpgrid.compose(args))
    assert len(read_frame(out / "runs.csv")) == len(spec.plan.configurations) == runs
    released_model_scores_as_its_run(out, (spec.dataset, tmp_path / "data"))


@pytest.mark.slow
def test_a_vit_grid_runs_end_to_end_and_releases_its_model(tmp_path):
    make_idx_root(tmp_path / "data", n_train=64, n_test=16)
    args = ["dataset=mnist", "model=vit", "strategy=online", "grid.k=3", "train.epochs=1", "train.seeds=1",
            "train.batch_size=16", "dataset.n_train=64", "train.eval_every=2", f"data.root={tmp_path / 'data'}",
            "model.width=16", "model.depth=1"]
    trains_on_the_fast_engine_and_releases(tmp_path, args, runs=3)  # online at k = 3
