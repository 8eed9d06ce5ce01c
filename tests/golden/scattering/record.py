"""Record kymatio's scattering transform of a few images, the reference tests/test_scatternet.py checks dpgrid's
against where kymatio is not installed:

    pip install kymatio==0.3.0 && python tests/golden/scattering/record.py

kymatio 0.3.0's `import kymatio.torch` fails with SciPy >= 1.15; its 2-D frontend imports on its own."""

from pathlib import Path

import numpy as np
import torch


def record():
    from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D

    import kymatio

    g = torch.Generator().manual_seed(0)
    x = (torch.rand(3, 1, 28, 28, generator=g) > 0.8).float() * torch.rand(3, 1, 28, 28, generator=g)
    u = torch.linspace(-1, 1, 28)
    x[0, 0] = torch.exp(-4 * (u[:, None] ** 2 + u[None, :] ** 2))
    S = ScatteringTorch2D(J=2, shape=(28, 28), L=8)(x)
    np.savez_compressed(Path(__file__).with_name("kymatio_mnist.npz"), images=x.numpy(), scattering=S.numpy(),
                        kymatio=kymatio.__version__)


if __name__ == "__main__":
    record()
