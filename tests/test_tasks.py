"""A task is defined once (dpgrid.data.tasks) and asked everywhere: loss, metric, direction, table scale."""

import pytest
import torch

from dpgrid import DpgridError
from dpgrid.data import tasks
from dpgrid.reporting.cells import fmt_value
from dpgrid.training.train import evaluate


def test_a_task_is_found_by_its_name_or_its_metric():
    assert tasks.get("reconstruction") is tasks.get("mse") and tasks.get("accuracy").higher_is_better
    with pytest.raises(DpgridError, match="unknown task 'ranking'; valid: classification, reconstruction"):
        tasks.get("ranking")


def test_evaluate_and_tables_follow_the_task():
    model = torch.nn.Identity()
    logits, labels = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]]), torch.tensor([0, 0, 0])
    accuracy, loss = evaluate(model, logits, labels, "classification")
    assert accuracy == pytest.approx(200 / 3)
    assert loss == pytest.approx(torch.nn.functional.cross_entropy(logits, labels).item())
    images, targets = torch.zeros(2, 1, 2, 2), torch.ones(2, 1, 2, 2)
    assert evaluate(model, images, targets, "reconstruction") == pytest.approx((1.0, 1.0))
    assert fmt_value(0.0257, "mse") == "2.57" and fmt_value(91.5, "accuracy") == "91.50"
    assert tasks.get("mse").better(0.1, 0.2) and tasks.get("accuracy").better(0.2, 0.1)
