"""scikit-learn's bundled breast cancer set (569 tumours, 30 features) as binary classification,
malignant = 1. Features go through log1p, a fixed transform: no statistic of the (private) training
data is computed. A fixed stratified 80/20 split."""

import numpy as np
import torch

from dpgrid import DpgridError
from dpgrid.data import Data


def load_breast_cancer(root=None, test_fraction: float = 0.2, split_seed: int = 0) -> Data:
    if not 0 < float(test_fraction) < 1:  # a plugin refuses bad input in one line: dpgrid prints it, exit 2
        raise DpgridError(f"dataset.load.test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.datasets import load_breast_cancer as sk_load
    from sklearn.model_selection import train_test_split

    x, y = sk_load(return_X_y=True)
    y = 1 - y  # scikit-learn codes malignant as 0
    x_tr, x_te, y_tr, y_te = train_test_split(np.log1p(x), y, test_size=test_fraction, random_state=split_seed,
                                              stratify=y)
    f32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    i64 = lambda a: torch.tensor(a, dtype=torch.int64)  # noqa: E731
    return Data(f32(x_tr), i64(y_tr), f32(x_te), i64(y_te), "classification")
