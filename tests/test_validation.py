"""Every numeric key of conf/ set to 0, -1, nan, inf, 1e300 (and 2.5 for whole numbers): refused with
one line naming the key when the value has no meaning, accepted otherwise (issue: privacy in every
mode, point 10). The keys are discovered from conf/, so a new key without an expectation here fails."""

import math
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from dpgrid import DpgridError
from dpgrid.config import compile
from dpgrid.data import load

from .command import dpgrid, one_line
from .conftest import ROOT, load_cfg

VALUES = [0, -1, math.nan, math.inf, 1e300]
F32 = 3.4e38


def whole(low=1):
    return lambda v: isinstance(v, int) and v >= low


def positive(v):
    return 0 < v <= F32


# key -> (is it a whole number, which values mean something, the key the message names)
EXPECT = {
    "privacy.epsilon": (False, lambda v: 0 < v <= 100, None),
    "privacy.delta": (False, lambda v: 0 < v < 1, None),
    "grid.k": (True, whole(2), None),
    "grid.lr_range": (False, lambda v: abs(v) <= 10 and v < 1.5, None),    # set as [v, 1.5]
    "grid.clip_range": (False, lambda v: abs(v) <= 10 and v < 2, None),    # set as [v, 2]
    "grid.quantiles": (False, lambda v: 0 < v < 1, None),                  # set as [v]
    "train.epochs": (True, whole(), None),
    "train.batch_size": (True, whole(), None),
    "train.eval_every": (True, whole(), None),
    "train.seeds": (True, whole(), None),
    "train.momentum": (False, lambda v: 0 <= v < 1, None),
    "dataset.n_train": (True, whole(), None),
    "dataset.batch_size": (True, whole(), "train.batch_size"),
    "dataset.epochs": (True, whole(), "train.epochs"),
    "dataset.default_epsilon": (False, lambda v: 0 < v <= 100, "privacy.epsilon"),
    "dataset.epsilons": (False, lambda v: 0 < v <= 100, None),             # set as [v]
    "dataset.seconds_per_step": (False, positive, None),
    "dataset.stacked_seconds_per_step": (False, positive, None),
    "dataset.load.max_words": (True, whole(), "max_words"),  # the model's width follows it: the first to refuse it
    "model.max_words": (True, whole(), None),
    "dataset.load.max_tokens": (True, whole(), "max_tokens"),    # the transformer's positions follow it
    "dataset.load.vocabulary": (True, whole(), "vocabulary"),    # and its embedding's rows
    **{f"model.{key}": (True, whole(), None) for key in ("vocabulary", "max_tokens", "width", "depth", "heads",
                                                         "mlp_ratio", "classes", "image", "channels", "patch")},
    "model.embedding_dim": (True, whole(), None),
    "model.lora.rank": (True, whole(0), None),  # > 0 needs model.lora.targets: only 0 of the values tried is valid
    "model.lora.alpha": (False, positive, None),
    "dataset.classes": (True, whole(2), None),
    "dataset.mean": (False, lambda v: 0 <= v <= 1, None),
    "dataset.std": (False, lambda v: 0 < v <= 1, None),
    "strategy.clip0": (False, positive, None),
    "strategy.clip_lr": (False, positive, None),
    "strategy.lr_lr": (False, positive, None),
    "strategy.lr": (False, positive, None),
    "strategy.count_noise_divisor": (False, positive, None),
    "strategy.grad_noise_ratio": (False, lambda v: 1 < v <= F32, None),
    "strategy.beta1": (False, lambda v: 0 <= v < 1, None),
    "strategy.beta2": (False, lambda v: 0 <= v < 1, None),
    "privacy.selection.stopping_eta": (False, lambda v: -1 < v <= 100, None),
    "privacy.selection.stopping_seed": (True, whole(0), None),
    "privacy.selection.tuning_rate": (False, lambda v: 0 < v < 1, None),
    "dataset.delta": (False, lambda v: 0 < v < 1, "privacy.delta"),
    "dataset.features": (True, whole(), None),
    "dataset.l2": (False, lambda v: 0 <= v <= F32, None),
    "dataset.feature_bound": (False, positive, None),
    "dataset.load.feature_bound": (False, positive, "feature_bound"),  # iris: dataset.feature_bound, read first
    "dataset.radius": (False, positive, None),
    "model.inputs": (True, whole(), None),
    "model.l2": (False, lambda v: 0 <= v <= F32, None),
    "strategy.axes.sigma": (False, positive, None),                        # set as [v]
    "strategy.xi": (False, lambda v: 0 <= v <= F32, None),
    "model.J": (True, lambda v: isinstance(v, int) and v in (1, 2), None),  # 2^J divides 28
    "model.L": (True, lambda v: isinstance(v, int) and 1 <= v <= 32, None),
    "model.groups": (True, lambda v: isinstance(v, int) and v >= 1 and 81 % v == 0, None),  # of 81 channels
    "model.norm_noise": (False, lambda v: 0.1 <= v <= 1e4, None),
    "dataset.image": (True, whole(), "model.image"),                        # set as [v, 32, 32]: the model reads it
    "dataset.load.mean": (False, lambda v: abs(v) <= F32, None),            # set as [v, 0.456, 0.406]
    "dataset.load.std": (False, positive, None),                            # set as [v, 0.224, 0.225]
}
# keys set as a list: the value under test first, then these (e.g. grid.lr_range=[v,1.5])
LIST_FORM = {"grid.lr_range": [1.5], "grid.clip_range": [2], "grid.quantiles": [], "dataset.epsilons": [],
             "strategy.axes.sigma": [], "dataset.image": [32, 32], "dataset.load.mean": [0.456, 0.406],
             "dataset.load.std": [0.224, 0.225]}
# where each key is tried: digits with online unless named here (mean and std are read only when standardizing);
# test_every_numeric_key_has_an_expectation holds the table to the configs as composed
WHERE = {"strategy.count_noise_divisor": ("digits", "fixed_quantile", []), "strategy.lr": ("digits", "adamwosm", []),
         "strategy.xi": ("digits", "adamwosm", []),
         "model.max_words": ("ag_news", "online", []), "model.embedding_dim": ("ag_news", "online", []),
         "dataset.load.max_words": ("ag_news", "online", []), "dataset.mean": ("mnist", "online", ["dataset.normalize=standardize"]),
         "dataset.std": ("mnist", "online", ["dataset.normalize=standardize"]),
         "privacy.selection.stopping_eta": ("digits", "online", ["privacy.selection=random_stopping"]),
         "privacy.selection.stopping_seed": ("digits", "online", ["privacy.selection=random_stopping"]),
         "privacy.selection.tuning_rate": ("digits", "online", ["privacy.selection=subsample_tuning"]),
         **{key: ("iris", "pur", []) for key in ("dataset.delta", "dataset.features", "dataset.l2", "dataset.feature_bound",
                                                 "dataset.load.feature_bound", "dataset.radius", "model.inputs", "model.l2")},
         "strategy.axes.sigma": ("iris", "constant_noise", []),
         "strategy.beta1": ("digits", "dpadam", []), "strategy.beta2": ("digits", "dpadam", []),
         **{key: ("ag_news_tokens", "online", []) for key in (
             "dataset.load.max_tokens", "dataset.load.vocabulary", "model.vocabulary", "model.max_tokens", "model.width",
             "model.depth", "model.heads", "model.mlp_ratio", "model.classes")},
         **{f"model.{key}": ("fashion_mnist_classes", "online", []) for key in ("image", "channels", "patch")},
         **{f"model.{key}": ("mnist", "online", ["model=scatternet_linear"]) for key in ("J", "L", "groups")},
         "model.norm_noise": ("mnist", "online", ["model=scatternet_linear", "model.norm=data"]),
         **{key: ("cifar10", "online", []) for key in ("dataset.image", "dataset.load.mean", "dataset.load.std")}}


def leaves(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def numeric_keys() -> set:
    """Every numeric leaf (or list of numbers) of conf/. A dataset's keys (dataset.*, model.*) do not depend on the
    strategy nor a strategy's on the dataset: the i-th dataset is composed with the i-th strategy (11 compositions,
    not 110)."""
    found = set()
    datasets = sorted(p.stem for p in (ROOT / "conf" / "dataset").glob("*.yaml"))
    strategies = sorted(p.stem for p in (ROOT / "conf" / "strategy").glob("*.yaml"))
    for i in range(max(len(datasets), len(strategies))):
        dataset, strategy = datasets[min(i, len(datasets) - 1)], strategies[min(i, len(strategies) - 1)]
        cfg = OmegaConf.to_container(load_cfg(dataset, strategy), resolve=True)
        for key, value in leaves(cfg):
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            numeric = numeric or (isinstance(value, list) and bool(value) and all(isinstance(x, (int, float)) for x in value))
            if numeric:
                found.add(key)
    return found


KEYS = {key: WHERE.get(key, ("digits", "online", [])) for key in EXPECT}  # not composed at collection: 3 s a worker


def test_every_numeric_key_has_an_expectation():
    """The table is the configs': every numeric key has an expectation, and each key of the table is in the config
    it is tried on (a key no config has any longer is dropped from EXPECT)."""
    found = numeric_keys()
    assert found <= set(EXPECT), f"add these keys to EXPECT: {sorted(found - set(EXPECT))}"
    for key, (dataset, strategy, extra) in KEYS.items():
        cfg = load_cfg(dataset, strategy, **dict(a.split("=", 1) for a in extra))
        assert OmegaConf.select(cfg, key) is not None, f"{key} is not in dataset={dataset} strategy={strategy} {extra}"


def override(key, value) -> str:
    text = {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan" if isinstance(value, float) and math.isnan(value)
                                                     else repr(value))
    if key in LIST_FORM:
        text = "[" + ",".join([text, *map(str, LIST_FORM[key])]) + "]"
    return f"{key}={text}"


def value_cases() -> list:
    """Every key with every value of VALUES (and 2.5 for a whole-number key). The fast layer tries each key with one
    value, the kinds of value in turn from key to key; the slow layer tries the rest."""
    cases = []
    for i, key in enumerate(sorted(KEYS)):
        values = VALUES + ([2.5] if EXPECT[key][0] else [])
        cases += [pytest.param(key, value, marks=() if j == i % len(values) else pytest.mark.slow)
                  for j, value in enumerate(values)]
    return cases


CASES = value_cases()


BASES = {}


def composed_with(dataset, strategy, extra, key, value):
    """The config `dpgrid run dataset=... strategy=... key=value` composes, the way Hydra applies a value
    override (OmegaConf.update onto the composed schema), onto a base composed once per option pair: a
    Hydra composition costs 0.2 s and this table has 230 cases. Refusals are translated by the same code
    as dpgrid's compose; test_the_table_path_is_the_command_lines checks that both paths agree."""
    import copy

    from omegaconf.errors import OmegaConfBaseException

    from dpgrid.config.compose import refusal

    base = (dataset, strategy, tuple(extra))
    if base not in BASES:
        BASES[base] = load_cfg(dataset, strategy, **dict(a.split("=", 1) for a in extra))
    cfg = copy.deepcopy(BASES[base])
    as_set = [value, *LIST_FORM[key]] if key in LIST_FORM else value
    try:
        OmegaConf.update(cfg, key, as_set, merge=True)
    except OmegaConfBaseException as e:
        raise refusal(e, [override(key, value)]) from None
    return cfg



def outcome(cfg_of):
    """The refusal's one line, or None when compile accepts the config."""
    try:
        cfg = cfg_of()
        compile(cfg, int(cfg.dataset.n_train) if isinstance(cfg.dataset.n_train, int) else 1)
    except DpgridError as e:
        return str(e)
    return None


@pytest.mark.parametrize("key, value", CASES, ids=[override(*case.values) for case in CASES])
def test_each_value_is_refused_with_one_line_or_accepted(key, value):
    dataset, strategy, extra = KEYS[key]
    _, meaningful, named = EXPECT[key]
    valid = not (isinstance(value, float) and not math.isfinite(value)) and meaningful(value)
    if valid:
        cfg = composed_with(dataset, strategy, extra, key, value)
        compile(cfg, int(cfg.dataset.n_train))
        return
    with pytest.raises(DpgridError) as refused:  # by the schema when composing, by compile, or by the loader
        cfg = composed_with(dataset, strategy, extra, key, value)
        compile(cfg, int(cfg.dataset.n_train) if isinstance(cfg.dataset.n_train, int) else 1)
        if key.startswith("dataset.load."):  # a loader's own key: the loader refuses it, before reading files
            load(cfg.dataset, "no-such-root")
    message = str(refused.value)
    assert "\n" not in message and (named or key) in message


@pytest.mark.slow  # composes and compiles every key twice (12 s): a check of the table's own path
def test_the_table_path_is_the_command_lines():
    """The table above applies each value to a config composed once; composing the whole override as the
    command line does gives the same outcome, word for word: every other key (each kind of key, whole, real and
    list, is among them), one value each, alternating between the kinds of refusal and acceptance."""
    for i, key in enumerate(sorted(KEYS)[::2]):
        dataset, strategy, extra = KEYS[key]
        value = [-1, 2.5 if EXPECT[key][0] else math.nan, 0][i % 3]
        args = dict(a.split("=", 1) for a in [override(key, value), *extra])
        by_command_line = outcome(lambda: load_cfg(dataset, strategy, **args))
        assert outcome(lambda: composed_with(dataset, strategy, extra, key, value)) == by_command_line, key


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["privacy.epsilon=inf"], "privacy.epsilon must be in (0, 100]"),
    (["privacy.epsilon=1e300"], "privacy.epsilon must be in (0, 100]"),
    (["privacy.epsilon=abc"], "privacy.epsilon must be a number, got 'abc'"),
    (["grid.k=-3"], "grid.k must be a whole number >= 2"),
    (["grid.k=2.5"], "grid.k must be a whole number, got '2.5'"),
    (["train.epoch=3"], "no setting 'train.epoch'; did you mean train.epochs?"),
    (["+train.epoch=3"], "no setting 'train.epoch' (+ adds keys only to a dataset, strategy or model); did you mean "
                         "train.epochs?"),
    (["+grid.kk=3"], "no setting 'grid.kk' (+ adds keys only to a dataset, strategy or model); did you mean grid.k?"),
    (["+foo=bar"], "no setting 'foo' (+ adds keys only"),
    (["strategy=automatic"], "a plugin's strategy joins with hydra.searchpath=[pkg://its_package.conf]"),
    (["privacy.secure_rng=maybe"], "privacy.secure_rng must be true or false, got 'maybe'"),
    (["strategy.grad_noise_ratio=1"], "strategy.grad_noise_ratio must be a finite number > 1"),
    (["train.momentum=1.5"], "train.momentum must be in [0, 1)"),
    (["strategy=fixed_quantile", "grid.quantiles=[0,1.5]"], "grid.quantiles must be a list of numbers in (0, 1)"),
    (["grid.lr_range=[1,-1]"], "grid.lr_range must be [low, high] with low < high"),
    ([f"train.device=cuda:{__import__('torch').cuda.device_count()}"], "train.device"),  # one past the last
    (["strategy=fixed_threshold", "grid.k=1000"], "1,000,000 configurations"),
    (["strategy=nodp", "train.epochs=1000000000"], "grid.allow_large=true"),
])
def test_the_command_line_refuses_before_anything_runs(args, message, tmp_path):
    r = dpgrid("run", *args, cwd=tmp_path)
    assert r.returncode == 2 and one_line(r.stderr) and message in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_large_grid_states_runs_steps_and_time_and_starts_when_allowed():
    cfg = load_cfg("mnist", "fixed_threshold", **{"grid.k": 1000})
    with pytest.raises(DpgridError, match=r"1,000,000 configurations, 5,000,000 runs of 1,172 steps .* days"):
        compile(cfg, 60000)
    compile(load_cfg("mnist", "fixed_threshold", **{"grid.k": 3, "grid.allow_large": "true", "train.epochs": 10 ** 5}), 60000)


@pytest.mark.slow  # two whole plans, with their side-by-side calibrations (8 s)
def test_plan_states_the_expected_training_time_of_the_runs_it_would_train():
    """From the dataset's measured step time: the runs this command trains (grid.only's configurations times
    the seeds) x T steps, one run at a time, and the groups train.parallel_runs makes of them."""
    seconds_per_step = float(load_cfg("digits", "online").dataset.seconds_per_step)
    for only, runs in (([], 7 * 5), (["grid.only=[lr1,lr4]"], 2 * 5)):
        r = dpgrid("plan", *only)
        assert f"  train.parallel_runs=auto: groups of up to {runs} runs trained together" in r.stdout.splitlines()
        line = next(line for line in r.stdout.splitlines() if "expected time:" in line)
        total = runs * 225 * seconds_per_step
        assert line.startswith(f"  expected time: {runs} runs x 225 steps at {seconds_per_step:g} s per step ") and \
            line.endswith(f"about {total:.0f} s of training, one run at a time"), line


@pytest.mark.slow
def test_an_unparsable_override_says_how_to_quote_it(tmp_path):
    run_dir = tmp_path / "outputs" / "eps=3" / "k=7"
    r = dpgrid("run", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert r.returncode == 2 and one_line(r.stderr), r.stderr
    assert f"""on the command line write 'hydra.run.dir="{run_dir}"'""" in r.stderr
    quoted = dpgrid("plan", f'hydra.run.dir="{run_dir}"', cwd=tmp_path)
    assert quoted.returncode == 0, quoted.stderr  # the quoted form is accepted


@pytest.mark.slow
def test_checks_hold_under_python_O(tmp_path):
    """`python -O` strips asserts: every guard is explicit code, so the refusals stay."""
    cases = [(["strategy.grad_noise_ratio=0.5"], "strategy.grad_noise_ratio"), (["privacy.epsilon=inf"], "privacy.epsilon")]
    script = ("import sys\nfrom dpgrid.commands.cli import main\n"
              f"for args in {[args for args, _ in cases]!r}:\n"
              "    try:\n        main(['plan', *args])\n    except SystemExit as e:\n        print(e.code)\n")
    r = subprocess.run([sys.executable, "-O", "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.stdout.split() == ["2", "2"], r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and all(message in line for line, (_, message) in zip(lines, cases)), r.stderr


def test_a_plan_that_would_overspend_is_refused(monkeypatch):
    """The guard that the calibrated noise spends at most the target (an assert before, gone under -O)."""
    from dpgrid.privacy import composition

    monkeypatch.setattr(composition, "calibrate", lambda *a, **k: 0.5)  # far too little noise for K = 7
    with pytest.raises(DpgridError, match="spends epsilon = .* > the target 3"):
        validate_and_plan(load_cfg("mnist", "online"))


def validate_and_plan(cfg):
    return compile(cfg, 60000)


def test_an_unknown_key_of_an_option_names_that_options_keys():
    from dpgrid.api import compose

    with pytest.raises(DpgridError) as refused:
        compose(["strategy.foo=1"])
    assert str(refused.value) == ("no setting 'strategy.foo': strategy=online has clip0, clip_lr, grad_noise_ratio, grid, "
                                  "lr_lr, name")
    with pytest.raises(DpgridError, match=r"did you mean strategy.clip0\?"):
        compose(["strategy.clip00=1"])  # a close key is still the suggestion
    with pytest.raises(DpgridError, match=r"strategy=fixed_threshold has grid, name$"):
        compose(["strategy=fixed_threshold", "strategy.foo=1"])


@pytest.mark.slow
def test_refusals_answer_before_torch_opacus_and_pandas_are_imported(tmp_path):
    """A bad value (a strategy's own too), a misspelt key, an unknown option, a bad grid, a bad sweep and a run
    directory holding another config's results are refused by dpgrid without loading the heavy libraries, so
    each refusal takes about as long as starting Python and Hydra. torch counts as loaded once its compiled
    core is (strategies name it at the top but load it at first use)."""
    from omegaconf import OmegaConf

    from dpgrid.api import compose
    from dpgrid.config import settings_of

    other = tmp_path / "other"  # results of train.epochs=2 (what dpgrid writes there: config.yaml, plan.json)
    other.mkdir()
    OmegaConf.save(OmegaConf.create(settings_of(compose(["train.epochs=2"]))), other / "config.yaml")
    (other / "plan.json").write_text('{"config_hash": "0123456789abcdef"}')
    (other / "runs.csv").write_text("config_id,seed\n")
    script = f"""
import sys
from dpgrid.commands.cli import main
for args in (["run", "privacy.epsilon=-1"], ["run", "train.epoch=2"], ["run", "strategy=nosuch"],
             ["plan", "dataset=mnist", "grid.k=0"], ["run", "-m", "privacy.epsilon=3,-1"],
             ["run", "strategy.clip0=-1"], ["run", "-m", "strategy=fixed_quantile", "strategy.clip0=1,-1"],
             ["run", "train.epochs=3", "hydra.run.dir={other}"]):
    try:
        main(args)
    except SystemExit as e:
        assert e.code == 2, (args, e.code)
print(sorted(m for m in ("torch._C", "opacus", "pandas") if m in sys.modules))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 8, r.stderr  # one line per refusal
    assert "strategy.clip0 must be a positive" in lines[5] and "strategy.clip0=-1: strategy.clip0 must be a positive" in lines[6], r.stderr
    assert "holds results of a different config (train.epochs is 2 there, 3 here)" in lines[7], r.stderr


def test_every_datasets_default_delta_is_below_its_own_one_over_n_or_says_why():
    """A dataset's default delta is below 1/N for its own N, except where its config says it follows a paper that
    chose delta = 1/N (the PUR track's), or reproduces the OSO paper's AG News runs (recorded at 1e-5)."""
    import re

    from dpgrid.config.groups import options

    weak = []
    for name in options("dataset"):
        text = (ROOT / "conf" / "dataset" / f"{name}.yaml").read_text()
        n = re.search(r"^n_train: (\d+)", text, re.M)
        if not n:
            continue
        stated = re.search(r"^delta: ([0-9.e-]+)", text, re.M)
        delta = float(stated.group(1)) if stated else 1e-5
        if delta >= 1 / int(n.group(1)) and "as the paper" not in text and name != "ag_news":
            weak.append(f"{name}: delta {delta:g} >= 1/{n.group(1)}")
    assert not weak, weak
