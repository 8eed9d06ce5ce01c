"""dpgrid from Python (a notebook, a script, a test): the same calls the command line makes.

    import dpgrid
    cfg = dpgrid.compose(["strategy=fixed_threshold", "grid.k=3", "train.epochs=1"])
    spec = dpgrid.compile(cfg)                         # frozen and validated: spec.plan.noise_multiplier, ...
    result = dpgrid.run_grid(spec, "outputs/mine")    # writes and resumes exactly like `dpgrid run`
    result.summary                                     # pandas DataFrames: runs, curves, summary
    dpgrid.tables("outputs")

Every function raises DpgridError (a ValueError) on bad input, never SystemExit, and writes to disk only
where asked (run_grid's out_dir, tables' results_dir/tables).
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dpgrid import DpgridError
from dpgrid.config.checks import wrong_type

if TYPE_CHECKING:  # pandas is imported when a grid is run: `dpgrid` refuses bad input before that
    import pandas as pd


def config_dir() -> str:
    """conf/ as installed (package dpgrid.conf), or beside the package in a source checkout."""
    try:
        import dpgrid.conf
        return str(Path(dpgrid.conf.__file__).parent)
    except ImportError:
        return str(Path(__file__).resolve().parent.parent / "conf")


def compose(overrides=(), with_hydra: bool = False):
    """The resolved config for Hydra `overrides` (e.g. ["strategy=online", "hydra.searchpath=[file:///my/conf]"]),
    as `dpgrid run` sees it. DpgridError with Hydra's useful part (the options available, the closest key)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException, OverrideParseException
    from omegaconf.errors import OmegaConfBaseException

    from dpgrid.config import register

    register()  # the schema and resolvers, made known to Hydra when a config is first composed
    overrides = list(overrides)
    refuse_added_settings(overrides)
    try:
        with initialize_config_dir(version_base="1.3", config_dir=config_dir(), job_name="dpgrid"):
            return hydra_compose("config", overrides=overrides, return_hydra_config=with_hydra)
    except OverrideParseException:
        raise DpgridError(unparsable(overrides)) from None
    except (HydraException, OmegaConfBaseException) as e:
        raise refusal(e, overrides) from None


def refusal(error: Exception, overrides: list) -> DpgridError:
    """Hydra's error (or the OmegaConf error under it) for `overrides`, as dpgrid's one line."""
    from omegaconf.errors import OmegaConfBaseException

    cause = error if isinstance(error, OmegaConfBaseException) and getattr(error, "full_key", None) else error.__cause__
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        if " not in " in str(cause).splitlines()[0]:  # a misspelt key
            return DpgridError(readable(f"Could not override '{cause.full_key}'", overrides))
        return DpgridError(wrong_type(cause))  # a value of the wrong type
    return DpgridError(readable(str(error), overrides))


OPEN_GROUPS = ("dataset", "strategy", "model", "hydra")  # each option brings its own keys; the rest is the schema


def refuse_added_settings(overrides: list) -> None:
    """`+key=value` adds a key Hydra would otherwise refuse; outside the option groups, whose options bring
    their own keys, that is a misspelt setting (`+train.epoch=2`) and is refused like one."""
    for text in overrides:
        key = text.partition("=")[0]
        if key.startswith("+") and key.lstrip("+").split(".")[0].split("/")[0] not in OPEN_GROUPS:
            name = key.lstrip("+")
            close = difflib.get_close_matches(name, known_keys([]), n=1)
            hint = f"; did you mean {close[0]}?" if close else "; conf/config.yaml lists the settings"
            raise DpgridError(f"no setting {name!r} (+ adds keys only to a dataset, strategy or model){hint}")


def sweep_jobs(overrides: list) -> list:
    """The override list of every job of a sweep, as Hydra's basic sweeper expands it (the product of
    every swept key's values)."""
    import itertools

    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException:
        raise DpgridError(unparsable(overrides)) from None
    choices = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
               else [f"{o.get_key_element()}={o.get_value_element_as_str()}"] for o in parsed]
    return [list(job) for job in itertools.product(*choices)]


def check_sweep(overrides: list) -> list:
    """Every job of a sweep composed and checked in this process, before any is launched or queued; jobs
    of different configs that would write into one directory are refused, naming their overrides.
    Returns the jobs' directories."""
    from dpgrid.config import compile
    from dpgrid.results.files import check_writable

    by_dir = {}
    for job in sweep_jobs(overrides):
        try:
            cfg = compose(job, with_hydra=True)
            out = (Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir)).absolute()
            spec = compile(cfg, run_dir=out, plan=False)  # every check short of the plan, before torch
            check_writable(out)
        except DpgridError as e:
            raise type(e)(f"sweep job {' '.join(job)}: {e}") from None
        by_dir.setdefault(out, {}).setdefault(spec.config_hash, job)
    for out, jobs in by_dir.items():
        if len(jobs) > 1:
            first, second = list(jobs.values())[:2]
            differ = [o for o in second if o not in first]
            raise DpgridError(f"the sweep's jobs '{' '.join(first)}' and '{' '.join(second)}' would both write into "
                              f"{out} ({', '.join(differ)} is not part of its name); give them different "
                              "directories, e.g. add that key to hydra.sweep.subdir")
    return list(by_dir)


def readable(message: str, overrides: list) -> str:
    """Hydra's message in one line, keeping what helps: the available options, the closest key."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    first = lines[0]
    missing = re.search(r"Could not find '([^/']+)/([^']+)'", first)
    if missing:
        group, name = missing.groups()
        start = next((i for i, line in enumerate(lines) if line.startswith("Available options")), None)
        options = []
        for line in lines[start + 1:] if start is not None else []:
            if line.startswith("Config search path"):
                break
            options.append(line)
        close = difflib.get_close_matches(name, options, n=1)
        hint = f" (did you mean {group}={close[0]}?)" if close else ""
        plugin = ("" if close or not name.isidentifier() else
                  f"; a plugin's {group} joins with hydra.searchpath=[pkg://its_package.conf] (its YAML files "
                  "installed as package data) or [file:///abs/path/to/its/conf]")
        return f"no {group} named {name!r}{hint}; available: {', '.join(options) or 'none'}{plugin}"
    bad_key = re.search(r"Could not override '([\w.]+)'", first) or re.search(r"Key '(\w+)' is not in struct", message)
    if bad_key:
        key = bad_key.group(1)
        known = known_keys([o for o in overrides if not o.startswith(key + "=")])
        group, _, name = key.partition(".")
        if group in OPEN_GROUPS and name.count(".") == 0 and name:  # an option's own key: compared with its keys
            own = sorted(k.partition(".")[2] for k in known if k.startswith(group + ".") and k.count(".") == 1
                         and not k.endswith("._target_"))
            close = difflib.get_close_matches(name, own, n=1)
            if close:
                return f"no setting {key!r}; did you mean {group}.{close[0]}?"
            others = [o for o in overrides if not o.startswith(key + "=")]
            return f"no setting {key!r}: {option_name(others, group)} has {', '.join(own)} (+{key}=... adds a key)"
        close = difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else "; conf/config.yaml lists the settings"
        return f"no setting {key!r}{hint}"
    return first


def option_name(overrides: list, group: str) -> str:
    """The option of a group that an override list selects, as `group=name` (the default's too)."""
    try:
        return f"{group}={compose(overrides)[group].get('name', '?')}"
    except DpgridError:
        return group


def known_keys(overrides: list) -> list:
    from omegaconf import OmegaConf

    try:
        cfg = compose(overrides)
    except DpgridError:
        return []
    def walk(node, prefix=""):
        for key, value in node.items():
            yield f"{prefix}{key}"
            if isinstance(value, dict):
                yield from walk(value, f"{prefix}{key}.")
    return list(walk(OmegaConf.to_container(cfg, resolve=False)))


def unparsable(overrides: list) -> str:
    """Which override Hydra cannot parse, and the quoted form that it can."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for text in overrides:
        try:
            parser.parse_override(text)
        except HydraException as e:
            key, _, value = text.partition("=")
            if not any(c in value for c in "= '\"()"):
                return f"cannot parse the override {text!r}: {str(e).splitlines()[0]} (Hydra's override grammar)"
            quoted = shlex.quote(f'{key}="{value}"' if '"' not in value else f"{key}='{value}'")
            return (f"cannot parse the override {text!r}: a value with '=', spaces, quotes or parentheses must be "
                    f"quoted for Hydra; on the command line write {quoted}")
    return "cannot parse the overrides"


def options(group: str) -> list:
    """The options dpgrid ships in a config group (strategy, dataset, model); a user's own folder on
    hydra.searchpath adds more, which `compose` finds and its errors list."""
    return sorted(p.stem for p in (Path(config_dir()) / group).glob("*.yaml"))


def compile(cfg, n_train: int = None):
    """The config compiled into a frozen, validated grid (dpgrid.config.GridSpec); N as given, else the config's
    dataset.n_train, else the loaded data's."""
    from dpgrid.config import compile as compile_grid

    return compile_grid(cfg, n_train)


def plan(cfg, n_train: int = None):
    """The grid's validated privacy plan (dpgrid.privacy.Plan): compile(cfg, n_train).plan."""
    return compile(cfg, n_train).plan


@dataclass
class GridResult:
    """What a grid wrote: its directory, plan and the three CSVs as DataFrames."""
    out_dir: Path
    plan: dict
    runs: pd.DataFrame
    curves: pd.DataFrame
    summary: pd.DataFrame

    @property
    def best(self):
        return self.summary[self.summary.best].iloc[0]


def run_grid(cfg, out_dir, progress: bool = True) -> GridResult:
    """Train the grid (a composed config, or the GridSpec `compile` made of one) into out_dir, resuming what
    is there, as `dpgrid run` does."""
    import json

    from dpgrid.config import GridSpec
    from dpgrid.results.files import read_frame
    from dpgrid.runner import run_grid as run

    run((cfg if isinstance(cfg, GridSpec) else compile(cfg)).announce(), out_dir, progress)
    out = Path(out_dir)
    read = lambda name: read_frame(out / name)  # noqa: E731
    return GridResult(out, json.loads((out / "plan.json").read_text()), read("runs.csv"), read("curves.csv"),
                      read("summary.csv"))


def tables(results_dir="outputs", figures: bool = True, mix_budgets: bool = False, report=print) -> list:
    """Paper-style tables (and figures) of every grid under results_dir; returns the files written."""
    from dpgrid.reporting.tables import write_tables

    return write_tables(Path(results_dir), figures=figures, mix_budgets=mix_budgets, report=report)
