"""Private fine-tuning: every run starts from a checkpoint (`model.init`), trains a chosen part of the model
(`train.trainable`: parameter-name globs) and, with `model.lora.rank > 0`, low-rank adapters on chosen Linear layers
(Hu et al. 2022; privately, Yu et al. 2022).

A checkpoint's privacy travels with it (dpgrid.privacy.provenance). dpgrid's own release carries its statement in its metadata
(what covers it, on which data, and the Poisson-subsampled Gaussian steps that spent it): a grid fine-tuned from it
is a second mechanism on that data, and its release is covered by both together (composed by the
accountant where both record their steps, else by basic composition, epsilons and deltas added); on other data each
dataset is named with its own epsilon. A file without such a statement is public by assumption, and the statement
says so; `model.init_covered_by` declares a checkpoint's privacy where its file does not carry it ({epsilon, delta,
dataset}), or declares a file public (refused where the file's own statement says otherwise: metadata is never
dropped in silence). The noise of every step is calibrated to the parameters that train, which alone see the private
data. A frozen parameter gets no per-sample work (the engines serve `requires_grad` parameters only) and no
noise. LoRA: W x + (alpha / r) B A x, A (r x in) drawn from the run's seed, B (out x r) zero, W frozen; the adapters
are plain Linear layers, so the fast engine serves them. A released model has its adapters merged (W + (alpha / r)
B A, exact up to rounding): it is the base architecture, loaded as any other.
"""

import fnmatch
from pathlib import Path

import torch
from torch import nn

from dpgrid import DpgridError


class LoRALinear(nn.Module):
    """A frozen Linear layer `base` plus (alpha / r) up(down(x)): down (r x in) and up (out x r, zero at the start) are
    Linear layers without bias, trained."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        super().__init__()
        self.base, self.scale = base, alpha / rank
        kind = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.down = nn.Linear(base.in_features, rank, bias=False, **kind)
        self.up = nn.Linear(rank, base.out_features, bias=False, **kind)
        nn.init.zeros_(self.up.weight)

    def forward(self, x):
        return self.base(x) + self.scale * self.up(self.down(x))

    def merged(self) -> tuple:
        """(weight, bias) of the one Linear layer this is: W + scale B A."""
        return self.base.weight + self.scale * self.up.weight @ self.down.weight, self.base.bias


def read_checkpoint(path: str, sha256: str = None) -> dict:
    """The state dict a .safetensors file holds; DpgridError in one line when there is none, or when its bytes are not
    those of `sha256` (the checksum the grid was planned with: every run starts from the file the identity names)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    from dpgrid.privacy.provenance import checksum

    if not Path(path).is_file():
        raise DpgridError(f"model.init: no file {path}")
    data = Path(path).read_bytes()
    if sha256 is not None and checksum(data) != sha256:
        raise DpgridError(f"model.init: {path} changed since the grid was planned (its checksum is the grid's "
                          "identity): restore it, or run the grid again with the new file")
    try:
        return load(data)
    except (SafetensorError, OSError, ValueError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DpgridError(f"model.init: {path} is not a safetensors file ({reason})") from None


def load_checkpoint(model: nn.Module, path: str, where: str, sha256: str = None, tensors: dict = None) -> None:
    """The checkpoint's tensors into the model (`tensors`: read already, once for a grid's runs), every name, shape,
    kind and value checked: DpgridError naming the first mismatch (a missing or an unexpected name, a shape, integers
    where the model has floats, a value that is not finite)."""
    tensors, own = tensors if tensors is not None else read_checkpoint(path, sha256), model.state_dict()
    missing = [name for name in own if name not in tensors]
    unexpected = [name for name in tensors if name not in own]
    shapes = [name for name in own if name in tensors and tuple(tensors[name].shape) != tuple(own[name].shape)]
    kinds = [name for name in own if name in tensors and own[name].is_floating_point()
             and not tensors[name].is_floating_point()]
    broken = [name for name in own if name in tensors and tensors[name].is_floating_point()
              and not bool(torch.isfinite(tensors[name]).all())]
    if missing:
        why = f"{missing[0]} is missing from it"
    elif unexpected:
        why = f"it has {unexpected[0]}, which {where} has not"
    elif shapes:
        why = f"{shapes[0]} is {tuple(tensors[shapes[0]].shape)} there, {tuple(own[shapes[0]].shape)} in {where}"
    elif kinds:
        why = f"{kinds[0]} holds {tensors[kinds[0]].dtype} numbers where {where} has floats (not a cast dpgrid makes)"
    elif broken:
        why = f"{broken[0]} holds NaN or infinite values (every run would diverge, its epsilon spent)"
    else:
        with torch.no_grad():
            for name, value in own.items():
                value.copy_(tensors[name].to(value.dtype))
        return
    raise DpgridError(f"model.init: {path} does not fit {where}: {why}")


def add_adapters(model: nn.Module, rank: int, alpha: float, targets: tuple, where: str) -> None:
    """Wrap each Linear layer whose module name matches a glob of `targets` in a LoRALinear (in place)."""
    modules = {name: m for name, m in model.named_modules() if name}
    for pattern in targets:
        matched = [name for name in modules if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise DpgridError(f"model.lora.targets: {pattern!r} matches no module of {where} (its modules: "
                              f"{', '.join(list(modules)[:8])}{', ...' if len(modules) > 8 else ''})")
        other = next((name for name in matched if type(modules[name]) is not nn.Linear), None)
        if other is not None:
            raise DpgridError(f"model.lora.targets: {pattern!r} matches {other}, a {type(modules[other]).__name__}, "
                              "not a Linear layer")
    for name in [n for n in modules if any(fnmatch.fnmatchcase(n, p) for p in targets)]:
        layer = modules[name]
        if rank > min(layer.in_features, layer.out_features):
            raise DpgridError(f"model.lora.rank={rank} is above the dimensions of {name} ({layer.in_features} -> "
                              f"{layer.out_features}): a rank above min(in, out) = "
                              f"{min(layer.in_features, layer.out_features)} adds parameters and no capacity")
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, LoRALinear(modules[name], rank, alpha))


def choose_trainable(model: nn.Module, patterns: tuple, where: str) -> None:
    """The adapters always train (model.lora.rank > 0); among the other parameters, requires_grad on those whose names
    match a glob of `patterns`, off on the rest (an adapted layer's base always off). DpgridError for a glob that
    matches none of those parameters, or when nothing trains."""
    adapted = [name for name, m in model.named_modules() if isinstance(m, LoRALinear)]
    adapters = {f"{name}.{part}.weight" for name in adapted for part in ("down", "up")}
    bases = tuple(f"{name}.base." for name in adapted)
    named = dict(model.named_parameters())
    chosen = {name: p for name, p in named.items() if name not in adapters and not name.startswith(bases)}
    for pattern in patterns:
        if pattern != "*" and not any(fnmatch.fnmatchcase(name, pattern) for name in chosen):
            among = "its parameters" + (" other than the adapters and the layers they adapt" if adapted else "")
            raise DpgridError(f"train.trainable: {pattern!r} matches none of {among} ({where}: "
                              f"{', '.join(list(chosen)[:8])}{', ...' if len(chosen) > 8 else ''})")
    for name, p in named.items():
        p.requires_grad_(name in adapters or (name in chosen and any(fnmatch.fnmatchcase(name, pattern)
                                                                    for pattern in patterns)))
    if not any(p.requires_grad for p in named.values()):
        raise DpgridError(f"train.trainable={list(patterns)} leaves no parameter of {where} to train")


def prepare(model: nn.Module, start, where: str, checkpoint: dict = None) -> nn.Module:
    """The model as a run starts it (`start`: the grid's dpgrid.specs.Start): the checkpoint loaded (`checkpoint`: its
    tensors, read once for the grid; None: read here), the adapters added (their A from torch's current random state:
    the run's seed), the chosen part trainable. `where`: the model's name in messages."""
    if start.init:
        load_checkpoint(model, start.init, where, start.init_sha256, checkpoint)
    if start.lora_rank:
        add_adapters(model, start.lora_rank, start.lora_alpha, start.lora_targets, where)
    choose_trainable(model, start.trainable, where)
    return model


def merged_state(model: nn.Module) -> dict:
    """The model's state dict with every adapter merged into its Linear layer (the base architecture's names)."""
    state = dict(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            for key in [k for k in state if k.startswith(f"{name}.")]:
                del state[key]
            weight, bias = module.merged()
            state[f"{name}.weight"] = weight.detach()
            if bias is not None:
                state[f"{name}.bias"] = bias.detach()
    return state
