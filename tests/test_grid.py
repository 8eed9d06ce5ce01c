import numpy as np
import pytest
from omegaconf import OmegaConf

from dpgrid import DpgridError
from dpgrid.config.grid import configurations, select

GRID = OmegaConf.create(dict(k=7, lr_range=[-2.5, 1.5], clip_range=[-2, 2], quantiles=[0.1, 0.3, 0.5, 0.7, 0.9]))


def strategy(*axes):
    return OmegaConf.create(dict(grid=list(axes)))


def test_k7_values_are_the_papers():
    configs = configurations(strategy("lr", "clip"), GRID)
    lrs = sorted({c["lr"] for c in configs})
    clips = sorted({c["clip"] for c in configs})
    np.testing.assert_allclose(lrs, [0.003162, 0.01468, 0.06813, 0.3162, 1.468, 6.813, 31.62], rtol=1e-3)
    np.testing.assert_allclose(clips, [0.01, 0.04642, 0.2154, 1, 4.642, 21.54, 100], rtol=1e-3)


@pytest.mark.parametrize("axes, k, size", [
    (("lr",), 5, 5), (("lr", "clip"), 7, 49), (("lr", "quantile"), 9, 45), (("clip",), 9, 9)])
def test_grid_sizes(axes, k, size):
    configs = configurations(strategy(*axes), OmegaConf.merge(GRID, {"k": k}))
    assert len(configs) == size
    assert len({c["config_id"] for c in configs}) == size


def test_ids_are_stable_and_selectable():
    configs = configurations(strategy("lr", "quantile"), GRID)
    assert configs[0]["config_id"] == "lr0_q0" and configs[-1]["config_id"] == "lr6_q4"
    chosen = select(configs, ["lr3_q2"])
    assert chosen == [{"config_id": "lr3_q2", "lr": pytest.approx(0.316228, rel=1e-5), "quantile": 0.5}]
    with pytest.raises(DpgridError, match="unknown configuration"):
        select(configs, ["lr9_q0"])
