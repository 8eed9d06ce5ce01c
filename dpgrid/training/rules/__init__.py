"""Per-layer rules of the fast engine (dpgrid.training.persample.FastEngine): a registry, one module per layer type,
as Opacus registers its grad samplers.

A rule serves one parametrised layer type. Built from the layer, its input a and the gradient G of the loss sum with
respect to its output (one backward, no weight gradients), it gives each sample's squared gradient norm over the
layer's parameters that train, and the weighted sums sum_i w_i g_i of those parameters' per-sample gradients, without
materialising per-sample gradients where a cheaper exact form exists (ghost norms, Li et al. 2022; book-keeping, Bu
et al. 2023). Where two exact forms compete (a convolution's kernels, a Linear layer on sequences: Gram matrices or
per-sample gradients), the cheaper for the layer's shape is measured on the first batch (MethodChoice).

    @register_rule(MyLayer)
    class MyLayerRule(LayerRule):
        def sq_norms(self): ...                # (b,)  (self.a: the layer's input, self.g: its output gradient)
        def weighted_sum(self, w, subsets=None): ...   # w (m, b) -> one (m, *p.shape) tensor per parameter that trains

A layer type with no rule makes the engine fall back to the exact torch.func engine, with one warning. The built-in
rules register when this package is imported; a user's own rule when its module is (docs/extending.md).
"""

import time

RULES = {}  # layer type -> its rule class


def register_rule(*layer_types):
    """Class decorator: the rule serves these layer types, exactly: a subclass may compute something else in its
    forward (a LoRA Linear, a quantised one), so it needs a rule of its own, or `register_rule(Sub)(Rule)` where
    the parent's rule holds for it."""
    def register(rule):
        from dpgrid.plugins import check_hooks

        check_hooks(rule, LayerRule, f"register_rule({', '.join(t.__name__ for t in layer_types)})")
        for layer_type in layer_types:
            RULES[layer_type] = rule
        return rule
    return register


def rule_for(module):
    """The rule registered for the module's type, or None."""
    return RULES.get(type(module))


def why_unserved(module) -> str:
    """Why the fast engine cannot serve this parametrised module ('' when it can)."""
    rule = rule_for(module)
    if rule is None:
        return f"{type(module).__name__} has no rule (dpgrid.training.rules.register_rule)"
    return rule.unsupported(module)


class LayerRule:
    """One layer's per-sample information in a batch. `params`: the names of its parameters that train (in its own
    order); the sums are theirs, in that order, and the norms cover them alone (a frozen parameter costs nothing).
    `stacked`: a and g carry a leading run dimension (G runs stacked, dpgrid.training.stacked); only a rule whose
    `stacks` is True is built so."""

    stacks = False  # it has a stacked form (G runs' parameters stacked as (G, *shape), StackedModel)
    auto_stacks = True  # train.parallel_runs=auto stacks a model of this layer (where `stacks`); False: only when asked

    @staticmethod
    def stacked_forward(layer, x, params):
        """(G, b, ...) outputs of G runs' copies of `layer` on inputs x (G, b, ...), from their stacked parameters
        `params` (the layer's own order, (G, *shape) each). Required where `stacks` is True."""
        raise NotImplementedError

    def __init__(self, module, a, g, choice, params: tuple, stacked: bool = False):
        self.module, self.a, self.g, self.choice, self.params, self.stacked = module, a, g, choice, params, stacked
        self.dtype = g.dtype

    @staticmethod
    def recorded(module, inputs, output) -> tuple:
        """What the engine keeps of the layer's forward call: (the layer's input, *what else the rule reuses). The
        input reaches the rule as `a`; anything after it as the keyword `saved` (a rule that keeps more than the input
        takes `saved=()` in its __init__: a normalisation's statistics, which autograd saved). Stacked runs hand every
        rule the input alone."""
        return (inputs[0].detach(),)

    @classmethod
    def from_recorded(cls, module, recorded: tuple, g, choice, params):
        """The rule of one batch from what `recorded` kept of its forward call: the input as `a`, the rest as `saved`."""
        a, *saved = recorded
        return cls(module, a, g, choice, params, **({"saved": tuple(saved)} if saved else {}))

    @staticmethod
    def unsupported(module) -> str:
        """Why this module of the rule's type is not served ('' when it is): a configuration the rule does not
        cover falls back to the torch.func engine."""
        return ""

    def sq_norms(self):
        """(b,) each sample's squared gradient norm over `params` ((G, b) stacked)."""
        raise NotImplementedError

    def weighted_sum(self, w, subsets=None) -> list:
        """w (m, b) -> [sum_i w_mi g_i of each parameter of `params`, (m, *shape)] ((m, G, ...) stacked); `subsets`: the
        rows' disjoint supports where the engine found them (disjoint_subsets), for a rule that can use them."""
        raise NotImplementedError


def disjoint_subsets(w):
    """When the m rows of w have disjoint supports (each sample weighted in one row at most, e.g. online's unclipped
    samples and its q_i), each row's support as sample indices, None standing for every sample; None when m = 1 or
    the rows overlap. Found once per batch for all layers. CPU only: on CUDA the test would synchronise with the host
    every step."""
    if len(w) == 1 or w.is_cuda:
        return None
    owner = w != 0
    if bool((owner.sum(0) > 1).any()):
        return None
    return [None if count == w.shape[1] else owner[k].nonzero().squeeze(1)
            for k, count in enumerate(owner.sum(1).tolist())]


class MethodChoice:
    """Where two exact forms of a rule compete, the cheaper for the layer's shape and device: `setting`
    (train.per_sample_method) forces one where the rule offers it (a rule that does not takes its first); `auto` times every offered form on the first batch that
    reaches a shape (one warm-up and two timed calls each, synchronised on CUDA), keeps the fastest and reuses it, as
    cuDNN's benchmark mode does. The forms are exact; they differ in speed and float rounding only. One choice serves
    a whole grid."""

    def __init__(self, setting: str = "auto"):
        self.setting, self.chosen = setting, {}  # {key: (description, name, {name: seconds})}

    def pick(self, key, description: str, forms: dict, device=None, costs: dict = None):
        """The result of the chosen form (`forms`: {name: a function of no argument}) for `key`; `costs`: what to
        time in each form's place, where the form's own work depends on the batch's data (a time a log prints must
        depend on the layer's shape alone)."""
        if key not in self.chosen:
            if self.setting != "auto":  # forced: a form the layer does not offer gives way to its first
                name = self.setting if self.setting in forms else next(iter(forms))
                self.chosen[key] = (description, name, {})
            else:
                times = self.measure(costs or forms, device)
                self.chosen[key] = (description, min(times, key=times.get), times)
        return forms[self.chosen[key][1]]()

    @staticmethod
    def measure(forms: dict, device=None) -> dict:
        """{name: seconds} of each form, timed."""
        return {name: timed(form, device) for name, form in forms.items()}

    def describe(self) -> list:
        """One line per layer shape: its form, and what each candidate took when measured."""
        lines = []
        for description, name, times in self.chosen.values():
            measured = ", ".join(f"{m} {t * 1e3:.1f} ms" for m, t in sorted(times.items(), key=lambda kv: kv[1]))
            lines.append(f"{description}: {name}" + (f" ({measured}, measured on the first batch)" if times else
                                                     " (train.per_sample_method)"))
        return lines

    def summary(self) -> str:
        """The forms chosen, layer shape by layer shape, for runs.csv (e.g. "grouped,ghost")."""
        return ",".join(name for _, name, _ in self.chosen.values())


def timed(form, device=None) -> float:
    """The best of two timed calls of `form`, after one warm-up (synchronised on CUDA)."""
    import torch

    def sync():
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)

    form()
    sync()
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        form()
        sync()
        best = min(best, time.perf_counter() - start)
    return best


from dpgrid.training.rules import convolution, embedding, linear, normalization  # noqa: E402,F401  (they register)
