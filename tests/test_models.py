import pytest
import torch

from dpgrid.models import autoencoder, bag_of_words, cnn, count_parameters, mlp


@pytest.mark.parametrize("build, expected, x, out_shape", [
    (cnn, 551_322, torch.zeros(3, 1, 28, 28), (3, 10)),
    (autoencoder, 48_705, torch.zeros(3, 1, 28, 28), (3, 1, 28, 28)),
    (bag_of_words, 113_156, torch.zeros(3, 750), (3, 4)),
    (mlp, 2_410, torch.zeros(3, 64), (3, 10)),
])
def test_parameter_counts_and_shapes(build, expected, x, out_shape):
    model = build()
    assert count_parameters(model) == expected  # paper Table 1
    assert tuple(model(x).shape) == out_shape


def test_bag_of_words_width_follows_max_words():
    assert count_parameters(bag_of_words(25)) == 25 * 50 * 128 + 128 + 128 * 128 + 128 + 128 * 4 + 4


def test_fast_inference_maxpool_equals_maxpool():
    from dpgrid.models import MaxPool2x2Stride1
    x = torch.relu(torch.randn(3, 4, 9, 9))
    reference = torch.nn.MaxPool2d(2, stride=1)(x)
    assert torch.equal(MaxPool2x2Stride1()(x), reference)
    with torch.inference_mode():
        assert torch.equal(MaxPool2x2Stride1()(x), reference)


def test_autoencoder_output_is_a_probability_image():
    out = autoencoder()(torch.randn(2, 1, 28, 28) * 10)
    assert out.min() >= 0 and out.max() <= 1
