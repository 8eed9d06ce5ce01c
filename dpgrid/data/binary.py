"""The binary logistic-regression problems of the PUR paper ("Adaptive hyperparameter selection for
differentially private gradient descent", Section 4): labels +-1, features standardised to zero mean and
unit variance, then every feature vector scaled into the ball ||z|| <= Z (`feature_bound`), the bound the
paper's constants L = lambda R + Z and M = lambda + Z^2 / 4 assume.

The risk the paper reports is the training objective, so these loaders return the training set as the
"test" split too: the curves of these runs are evaluations on the private training data, which no epsilon
covers (as in the paper). The standardisation statistics are computed from the data (a disclosure the paper
makes too), while Z is public: a row longer than Z is shortened, never used to choose Z.
"""

import numpy as np
import torch

from dpgrid import DpgridError
from dpgrid.data import Data


def binary_data(x, positive, feature_bound: float, files=None) -> Data:
    """Data of a +-1 problem: standardised, rows bounded by Z, the training set used for evaluation too."""
    from dpgrid.plugins import Reader

    Reader({"feature_bound": feature_bound}, "dataset.load.").positive("feature_bound")  # a loader checks its keys
    x = np.asarray(x, dtype=np.float64)
    std = x.std(axis=0)
    x = (x - x.mean(axis=0)) / np.where(std > 0, std, 1.0)  # a constant feature stays 0
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x * np.minimum(1.0, feature_bound / np.maximum(norms, 1e-300))
    y = np.where(np.asarray(positive, dtype=bool), 1.0, -1.0)
    xt, yt = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    return Data(xt, yt, xt, yt, "logistic", files or {})


def load_synthetic(root=None, n: int = 10_000, d: int = 2, p: float = 0.1, seed: int = 0, feature_bound: float = 5.0):
    """z ~ N(0, Sigma) with Sigma_ii = 2, Sigma_ij = 1; y ~ Bernoulli(p) when <z, 1> <= 0, else Bernoulli(1 - p)."""
    rng = np.random.default_rng(seed)
    sigma = np.ones((d, d)) + np.eye(d)
    z = rng.multivariate_normal(np.zeros(d), sigma, size=n)
    flip = rng.random(n)
    positive = np.where(z.sum(axis=1) <= 0, flip < p, flip < 1 - p)
    return binary_data(z, positive, feature_bound)


def load_iris(root=None, feature_bound: float = 4.0):
    """scikit-learn's bundled Iris: Setosa (+1) against Versicolour and Virginica (-1), N = 150, d = 4."""
    from sklearn.datasets import load_iris as sk_iris

    x, y = sk_iris(return_X_y=True)
    return binary_data(x, y == 0, feature_bound)


def load_breast_cancer(root=None, feature_bound: float = 12.0):
    """scikit-learn's bundled Breast Cancer Wisconsin (Diagnostic): malignant (+1) against benign, N = 569, d = 30."""
    from sklearn.datasets import load_breast_cancer as sk_cancer

    x, y = sk_cancer(return_X_y=True)
    return binary_data(x, y == 0, feature_bound)  # scikit-learn codes malignant as 0


def load_mnist_binary(root, feature_bound: float = 40.0):
    """MNIST's 60,000 training images from data.root, digit 0 (+1) against the rest, d = 784."""
    from dpgrid.data.datasets import load_idx

    data = load_idx(root, "MNIST")
    return binary_data(data.x_train.flatten(1).double().numpy(), data.y_train.numpy() == 0, feature_bound,
                       data.files)


def load_kddcup99(root, n: int = 70_000, seed: int = 0, feature_bound: float = 4.0):
    """KDD Cup '99, scikit-learn's 'SF' subset (699,691 connections, 4 attributes, 0.3 % attacks), sub-sampled to
    N = 70,000 with a fixed seed; attacks are +1. The files must already be under <data.root>/kddcup99."""
    from pathlib import Path

    from sklearn.datasets import fetch_kddcup99

    home = Path(root) / "kddcup99"
    try:
        bunch = fetch_kddcup99(subset="SF", data_home=str(home), download_if_missing=False, percent10=False)
    except OSError:
        raise DpgridError(f"KDD Cup '99 is not under {home}; fetch it once where there is internet access with "
                          f"sklearn.datasets.fetch_kddcup99(subset='SF', percent10=False, data_home='{home}') "
                          "and copy that folder here") from None
    x = np.array(bunch.data, dtype=object)
    service = np.unique(x[:, 1].astype(str), return_inverse=True)[1]  # the one categorical attribute, as codes
    x = np.column_stack([x[:, 0].astype(float), service, x[:, 2].astype(float), x[:, 3].astype(float)])
    keep = np.random.default_rng(seed).choice(len(x), size=min(n, len(x)), replace=False)
    return binary_data(x[keep], np.asarray(bunch.target)[keep] != b"normal.", feature_bound)
