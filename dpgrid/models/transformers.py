"""Small transformers written from the layers the fast engine has rules for (dpgrid.training.rules): Embedding,
LayerNorm and Linear on sequences. A text encoder for AG News token ids (dataset=ag_news_tokens) and a vision
transformer for 28 x 28 images (MNIST, FashionMNIST).

Both are pre-LayerNorm encoders (Xiong et al. 2020), x + Attention(LN(x)), then x + MLP(LN(x)), read out at a
class position. Multi-head self-attention is two Linear layers around softmax(q k^T / sqrt(d)) v, written out
(nn.MultiheadAttention keeps its projection as bare parameters, which only the torch.func engine reaches; the
written-out product also runs batched under torch.func, where the fused attention kernels fall back to a loop). The class
position is position 0 of the position embedding, added to a zero vector: a class token that is an Embedding row,
so that every parameter sits in a layer with a rule (a bare nn.Parameter on the model would leave the fast engine).
"""

import torch
from torch import nn
from torch.nn import functional as F


class SelfAttention(nn.Module):
    """Multi-head self-attention: qkv = Linear(x), softmax(q k^T / sqrt(d_head)) v per head, out = Linear(heads).
    `keep` (b, 1, 1, T) bool: the keys each sample attends to (its padding is left out)."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x, keep=None):
        b, positions, width = x.shape
        q, k, v = self.qkv(x).view(b, positions, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) * (width // self.heads) ** -0.5
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        mixed = scores.softmax(-1) @ v
        return self.out(mixed.transpose(1, 2).reshape(b, positions, width))


class Block(nn.Module):
    """One pre-LayerNorm encoder block: x + Attention(LN(x)), then x + MLP(LN(x)) (MLP: Linear, GELU, Linear)."""

    def __init__(self, width: int, heads: int, mlp_ratio: int):
        super().__init__()
        self.norm1, self.attention = nn.LayerNorm(width), SelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width))

    def forward(self, x, keep=None):
        x = x + self.attention(self.norm1(x), keep)
        return x + self.mlp(self.norm2(x))


class Encoder(nn.Module):
    """Position embeddings (position 0: the class position), the blocks, a final LayerNorm and a Linear head on the
    class position."""

    def __init__(self, positions: int, width: int, depth: int, heads: int, mlp_ratio: int, classes: int):
        super().__init__()
        self.positions = nn.Embedding(positions + 1, width)
        self.blocks = nn.ModuleList(Block(width, heads, mlp_ratio) for _ in range(depth))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, classes)

    def forward(self, x, keep=None):
        """x (b, T, width): the embedded inputs; keep (b, T) bool or None -> logits (b, classes)."""
        b, count, width = x.shape
        x = torch.cat([x.new_zeros(b, 1, width), x], 1)
        x = x + self.positions(torch.arange(count + 1, device=x.device).repeat(b, 1))
        if keep is not None:
            keep = torch.cat([keep.new_ones(b, 1), keep], 1)[:, None, None, :]
        for block in self.blocks:
            x = block(x, keep)
        return self.head(self.norm(x[:, 0]))


class TextTransformer(nn.Module):
    """Token ids (b, T) (0: padding, 1: a word outside the vocabulary) -> logits. Padding is attended by no one."""

    def __init__(self, vocabulary: int, max_tokens: int, width: int, depth: int, heads: int, mlp_ratio: int,
                 classes: int):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary + 2, width, padding_idx=0)
        self.encoder = Encoder(max_tokens, width, depth, heads, mlp_ratio, classes)

    def forward(self, ids):
        return self.encoder(self.tokens(ids), ids != 0)


class Patches(nn.Module):
    """(b, C, H, W) images -> (b, H W / p^2, C p^2) non-overlapping p x p patches, flattened (no parameters)."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def forward(self, images):
        return F.unfold(images, self.size, stride=self.size).transpose(1, 2)


class VisionTransformer(nn.Module):
    """Images -> patches -> Linear patch embedding -> Encoder (Dosovitskiy et al. 2021, at 28 x 28)."""

    def __init__(self, image: int, channels: int, patch: int, width: int, depth: int, heads: int, mlp_ratio: int,
                 classes: int):
        super().__init__()
        self.patches = Patches(patch)
        self.embed = nn.Linear(channels * patch * patch, width)
        self.encoder = Encoder((image // patch) ** 2, width, depth, heads, mlp_ratio, classes)

    def forward(self, images):
        return self.encoder(self.embed(self.patches(images)))


def _check(where: str, **values) -> None:
    from dpgrid import DpgridError

    for key, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise DpgridError(f"model.{key} must be a whole number >= 1, got {value!r}")
    if values["width"] % values["heads"]:
        raise DpgridError(f"model.heads must divide model.width ({values['width']}), got {values['heads']}")
    if where == "vit" and values["image"] % values["patch"]:
        raise DpgridError(f"model.patch must divide the image side ({values['image']}), got {values['patch']}")


def transformer(vocabulary: int = 20000, max_tokens: int = 32, width: int = 64, depth: int = 2, heads: int = 4,
                mlp_ratio: int = 2, classes: int = 4) -> TextTransformer:
    """A text transformer encoder over `vocabulary` words (dataset.load.vocabulary) and at most `max_tokens` tokens:
    1,349,572 parameters at the defaults, 1,280,128 of them the token embedding."""
    _check("transformer", vocabulary=vocabulary, max_tokens=max_tokens, width=width, depth=depth, heads=heads,
           mlp_ratio=mlp_ratio, classes=classes)
    return TextTransformer(vocabulary, max_tokens, width, depth, heads, mlp_ratio, classes)


def vit(image: int = 28, channels: int = 1, patch: int = 7, width: int = 64, depth: int = 2, heads: int = 4,
        mlp_ratio: int = 2, classes: int = 10) -> VisionTransformer:
    """A vision transformer for image x image pictures in p x p patches: 16 patches of 7 x 7 at 28 x 28, 72,010
    parameters at the defaults."""
    _check("vit", image=image, channels=channels, patch=patch, width=width, depth=depth, heads=heads,
           mlp_ratio=mlp_ratio, classes=classes)
    return VisionTransformer(image, channels, patch, width, depth, heads, mlp_ratio, classes)
