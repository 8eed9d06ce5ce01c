"""The engine's per-sample norms and weighted sums against a plain loop (one backward per sample)."""

import pytest
import torch
from torch import nn

from dpgrid.models import autoencoder, bag_of_words, cnn
from dpgrid.persample import FuncEngine


def small_cnn():  # the CNN's layer types (Conv2d with padding, MaxPool2d stride 1) at test size
    return nn.Sequential(nn.Conv2d(1, 3, 4, padding=1), nn.ReLU(), nn.MaxPool2d(2, stride=1),
                         nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, 6), nn.ReLU(),
                         nn.Linear(6, 3))


def loop_reference(model, x, y, task):
    grads = []
    for xi, yi in zip(x, y):
        model.zero_grad()
        out = model(xi.unsqueeze(0))
        loss = (nn.functional.cross_entropy(out, yi.unsqueeze(0)) if task == "classification"
                else nn.functional.mse_loss(out, yi.unsqueeze(0)))
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    return torch.stack(grads)


@pytest.mark.parametrize("build, x_shape, task", [
    (small_cnn, (5, 1, 9, 9), "classification"),
    (lambda: bag_of_words(2, 50), (5, 100), "classification"),
    (lambda: nn.Sequential(*list(autoencoder())[:2], *list(autoencoder())[-2:]), (5, 1, 6, 6), "reconstruction"),
])
def test_func_engine_matches_loop(build, x_shape, task):
    torch.manual_seed(0)
    model = build().double()
    x = torch.rand(x_shape, dtype=torch.float64)
    y = x if task == "reconstruction" else torch.randint(0, 3, (len(x),))
    reference = loop_reference(model, x, y, task)
    grads = FuncEngine(model, task)(x, y)
    torch.testing.assert_close(grads.norms, reference.norm(dim=1), rtol=1e-10, atol=0)
    w = torch.rand(len(x), dtype=torch.float64)
    flat = torch.cat([t.flatten() for t in grads.weighted_sum(w)])
    torch.testing.assert_close(flat, w @ reference, rtol=1e-10, atol=1e-14)


def test_full_size_models_run_through_the_engine():
    for model, x, y, task in [(cnn(), torch.rand(2, 1, 28, 28), torch.tensor([1, 2]), "classification"),
                              (autoencoder(), torch.rand(2, 1, 28, 28), None, "reconstruction")]:
        grads = FuncEngine(model, task)(x, x if y is None else y)
        assert grads.norms.shape == (2,) and torch.isfinite(grads.norms).all()
        assert [t.shape for t in grads.weighted_sum(torch.ones(2))] == [p.shape for p in model.parameters()]


def test_empty_batch_gives_zero_sums():
    model = bag_of_words(2, 50)
    grads = FuncEngine(model, "classification")(torch.zeros(0, 100), torch.zeros(0, dtype=torch.long))
    assert grads.norms.shape == (0,)
    assert all((t == 0).all() for t in grads.weighted_sum(torch.zeros(0)))
