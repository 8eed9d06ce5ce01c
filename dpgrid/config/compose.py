"""Hydra overrides -> the composed config (`compose`), and every refusal of them in one line: a misspelt key or
option (with the closest one, never the key as typed), a value of the wrong type, a `+` that adds what nothing
reads, a `model=` for a dataset that names no default model, a launcher whose plugin is not installed."""

import difflib
import re
import shlex

from dpgrid import DpgridError
from dpgrid.config import groups
from dpgrid.config.renamed import as_written_now
from dpgrid.config.selection import selection_keys, selection_owners
from dpgrid.plugins import wrong_type
from dpgrid.specs import MODEL_KEYS


def compose(overrides=(), with_hydra: bool = False):
    """The resolved config for Hydra `overrides` (e.g. ["strategy=online", "hydra.searchpath=[file:///my/conf]"]),
    as `dpgrid run` sees it. DpgridError with Hydra's useful part (the options available, the closest key)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.errors import HydraException, OverrideParseException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from dpgrid.config import register

    register()  # the schema and resolvers, made known to Hydra when a config is first composed
    overrides = as_written_now(overrides)
    refuse_added_settings(overrides)
    try:
        with initialize_config_dir(version_base="1.3", config_dir=groups.config_dir(), job_name="dpgrid"):
            try:
                cfg = hydra_compose("config", overrides=overrides, return_hydra_config=with_hydra)
            except HydraException as e:
                if not no_default_to_override(e):
                    raise
                # `model=tiny` for a dataset whose config names no default model: the same choice, appended
                appended = [f"+{o}" if o.split("=")[0] == "model" else o for o in overrides]
                cfg = hydra_compose("config", overrides=appended, return_hydra_config=with_hydra)
    except OverrideParseException:
        raise DpgridError(unparsable(overrides)) from None
    except (HydraException, OmegaConfBaseException) as e:
        raise refusal(e, overrides) from None
    refuse_unread_options(cfg.strategy, cfg.dataset, overrides)
    try:  # every interpolation resolves (model.inputs: ${dataset.features} of a dataset that has none)
        OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k not in ("hydra", "model")]),
                               resolve=True)
        if not OmegaConf.is_missing(cfg, "model"):
            OmegaConf.to_container(cfg.model, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "the config"
        raise DpgridError(f"{key}: {str(e).splitlines()[0]} (it reads a setting this composition does not have: "
                          f"another {key.split('.')[0]} or dataset, or set the key)") from None
    if OmegaConf.is_missing(cfg, "model") or set(cfg.model) <= set(MODEL_KEYS):  # dpgrid's keys of every model only
        searchpath = next((o.partition("=")[2] for o in overrides if o.startswith("hydra.searchpath=")), None)
        raise DpgridError(f"dataset={cfg.dataset.get('name', '?')} names no model: pass model=<name> (available: "
                          f"{', '.join(groups.options('model', searchpath))}), or give the dataset config a default model with "
                          "the defaults-list line '- /model@_global_.model: <name>'")
    return cfg


def no_default_to_override(error) -> bool:
    """Hydra's answer to `model=X` when no config of the defaults list chose a model (a minimal dataset config)."""
    return "Could not override 'model'" in str(error) and "No match in the defaults list" in str(error)


# What a dataset config may hold besides its loader (docs/extending.md, "A dataset"): `+dataset.KEY=...` adds one
# of these; any other key would be read by nothing. A strategy's own problem constants are in its datasets' configs.
DATASET_KEYS = ("name", "task", "load", "classes", "n_train", "batch_size", "epochs", "epsilons", "default_epsilon",
                "delta", "accountant", "normalize", "mean", "std", "seconds_per_step", "stacked_seconds_per_step",
                "features", "image")


def refuse_unread_options(strategy, dataset, overrides: list) -> None:
    """`+strategy.KEY` or `+dataset.KEY` that adds a key nothing reads: a strategy reads its config's own keys, a
    dataset the keys of DATASET_KEYS (a model's and a loader's keyword arguments are checked against their
    signatures when the grid is compiled, dpgrid.plugins.check_arguments)."""
    for text in overrides:
        key = text.partition("=")[0]
        if not key.startswith("+"):
            continue
        path = key.lstrip("+").split(".")
        if path[0] == "strategy" and len(path) == 2:
            own = [k for k in strategy if k not in added_keys(overrides, "strategy") and k != "_target_"]
            raise DpgridError(f"strategy={strategy.get('name', '?')} reads no key {path[1]!r}: a strategy reads "
                              f"its own config's keys, here {', '.join(own)} (write strategy.KEY=... to change one)")
        if path[0] == "dataset" and len(path) == 2 and path[1] not in DATASET_KEYS:
            raise DpgridError(f"dataset={dataset.get('name', '?')}: nothing reads a dataset key {path[1]!r}; a "
                              f"dataset config holds {', '.join(DATASET_KEYS)} (docs/extending.md)")


def added_keys(overrides: list, group: str) -> set:
    return {o.partition("=")[0].lstrip("+").split(".", 1)[1] for o in overrides
            if o.startswith("+") and o.partition("=")[0].lstrip("+").startswith(group + ".")}


def refusal(error: Exception, overrides: list) -> DpgridError:
    """Hydra's error (or the OmegaConf error under it) for `overrides`, as dpgrid's one line."""
    from omegaconf.errors import OmegaConfBaseException

    cause = error if isinstance(error, OmegaConfBaseException) and getattr(error, "full_key", None) else error.__cause__
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        first = str(cause).splitlines()[0]
        if " not in " in first:  # a misspelt key
            return DpgridError(readable(f"Could not override '{cause.full_key}'", overrides))
        if "is not a ListConfig" in first:  # grid.only=lr3
            value = next((o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+") == cause.full_key), "")
            return DpgridError(f"{cause.full_key} takes a list: write {cause.full_key}=[{value}]")
        return DpgridError(wrong_type(cause))  # a value of the wrong type
    present = re.search(r"An item is already at '([\w.]+)'", str(error))
    if present:  # +key=value for a key the config has
        value = next((o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+") == present.group(1)), "")
        return DpgridError(f"{present.group(1)} is there already: write {present.group(1)}={value} without the + "
                           "(+ adds a key the config does not have; ++ sets one either way)")
    return DpgridError(readable(str(error), overrides))


OPEN_GROUPS = ("dataset", "strategy", "model", "hydra")  # each option brings its own keys; the rest is the schema


def refuse_added_settings(overrides: list) -> None:
    """`+key=value` adds a key Hydra would otherwise refuse; outside the option groups, whose options bring their
    own keys, that is a misspelt setting (`+train.epoch=2`), refused like one, or a setting that is there already
    (`+train.epochs=2`: write it without the +). `++key=value` sets a setting either way."""
    for text in overrides:
        key, _, value = text.partition("=")
        if key.startswith("+") and key.lstrip("+").split(".")[0].split("/")[0] not in OPEN_GROUPS:
            name, known = key.lstrip("+"), known_keys([])
            if name in known and key.startswith("++"):
                continue
            if name in known:
                raise DpgridError(f"{name} is a setting already: write {name}={value} without the + (+ adds a key the "
                                  "config does not have)")
            close = closest(name, known)
            hint = f"; did you mean {close[0]}?" if close else "; conf/config.yaml lists the settings"
            raise DpgridError(f"no setting {name!r} (+ adds keys only to a dataset, strategy or model){hint}")


LAUNCHER_PLUGINS = {"joblib": "hydra-joblib-launcher", "submitit": "hydra-submitit-launcher"}


def readable(message: str, overrides: list) -> str:
    """Hydra's message in one line, keeping what helps: the available options, the closest key."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    first = lines[0]
    plugin = re.search(r"Could not load 'hydra/launcher/(joblib|submitit)", first)
    if plugin:  # dpgrid's launcher configs stand on Hydra's launcher plugins
        return (f"{first} Hydra's {plugin.group(1)} launcher is not installed: pip install 'dpgrid[cluster]' (or "
                f"{LAUNCHER_PLUGINS[plugin.group(1)]})")
    if "Could not load 'hydra/launcher/dpgrid_slurm_schema'" in first:  # Hydra did not find dpgrid's launcher plugin
        import importlib.util

        if importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None:
            return ("hydra/launcher=slurm: Hydra's submitit launcher is not installed: pip install 'dpgrid[cluster]' "
                    f"(or {LAUNCHER_PLUGINS['submitit']})")
        return ("hydra/launcher=slurm: Hydra does not find dpgrid's launcher (hydra_plugins.dpgrid_launcher), as after "
                "an editable install in setuptools' default mode; install it so that Hydra sees it: "
                "pip install -e \".[cluster]\" --config-settings editable_mode=compat")
    missing = re.search(r"Could not find '(privacy/selection|hydra/launcher|[^/']+)/([^']*)'", first)
    if missing:
        group, name = missing.groups()
        group = group.replace("privacy/", "privacy.")  # privacy/selection, as it is set: privacy.selection=NAME
        start = next((i for i, line in enumerate(lines) if line.startswith("Available options")), None)
        options = []
        for line in lines[start + 1:] if start is not None else []:
            if line.startswith("Config search path"):
                break
            if not line.endswith("_schema"):  # a structured config's schema is no option of the group
                options.append(line)
        close = closest(name, options)
        hint = f" (did you mean {group}={close[0]}?)" if close else ""
        plugin = ("" if close or not name.isidentifier() else
                  f"; a plugin's {group} joins with hydra.searchpath=[pkg://its_package.conf] (its YAML files "
                  "installed as package data) or [file:///abs/path/to/its/conf]")
        return f"no {group} named {name!r}{hint}; available: {', '.join(options) or 'none'}{plugin}"
    sweep = re.search(r"Ambiguous value for argument '([^=']+)=([^']*)'", first)
    if sweep:  # a, b: Hydra's sweep syntax, which only multirun expands
        key, values = sweep.groups()
        return (f"{key}={values} gives several values, which only a sweep takes: dpgrid run -m {key}={values} ... "
                f"runs one grid per value; dpgrid run and dpgrid plan take one value ({key}=...)")
    bad_key = re.search(r"Could not override '([\w.]+)'", first) or re.search(r"Key '(\w+)' is not in struct", message)
    if bad_key:
        key = bad_key.group(1)
        known = known_keys([o for o in overrides if not o.startswith(key + "=")], with_hydra=key.startswith("hydra."))
        group, _, name = key.partition(".")
        if group in OPEN_GROUPS and name.count(".") == 0 and name:  # an option's own key: compared with its keys
            own = sorted(k.partition(".")[2] for k in known if k.startswith(group + ".") and k.count(".") == 1
                         and not k.endswith("._target_"))
            if close := closest(name, own):
                return f"no setting {key!r}; did you mean {group}.{close[0]}?"
            others = [o for o in overrides if not o.startswith(key + "=")]
            adds = {"model": f" (+{key}=... passes its function another keyword argument)"}.get(group, "")
            return f"no setting {key!r}: {option_name(others, group)} has {', '.join(own) or 'no settings'}{adds}"
        name = key.rpartition(".")[2]
        if key.startswith("privacy.") and (owners := selection_owners(name)):  # a selection's key, not this one's
            return (f"privacy.selection.{name} is a key of {' and '.join(f'privacy.selection={o}' for o in owners)}; this "
                f"grid's is {option_name([o for o in overrides if not o.startswith(key + '=')], 'privacy.selection')}")
        if key.startswith("privacy.") and (close := closest(name, selection_keys())):
            return f"no setting {key!r}; did you mean privacy.selection.{close[0]}?"
        close = closest(key, known)
        hint = f"; did you mean {close[0]}?" if close else "; conf/config.yaml lists the settings"
        return f"no setting {key!r}{hint}"
    return first


def closest(name: str, candidates) -> list:
    """The candidate closest to a misspelt name, never the name itself (a did-you-mean that repeats what was typed
    says nothing): [] or [one]."""
    return difflib.get_close_matches(name, [c for c in candidates if c != name], n=1)


def option_name(overrides: list, group: str) -> str:
    """The option of a group that an override list selects, as `group=name` (the default's too)."""
    try:
        node = compose(overrides)
        for part in group.split("."):  # privacy.selection
            node = node[part]
        return f"{group}={node.get('name')}" if node.get("name") else f"{group} ({node.get('_target_', '?')})"
    except DpgridError:
        return group


def known_keys(overrides: list, with_hydra: bool = False) -> list:
    """Every key of the config these overrides compose (Hydra's own, hydra.launcher's included, `with_hydra`)."""
    from omegaconf import OmegaConf

    try:
        cfg = compose(overrides, with_hydra=with_hydra)
    except DpgridError:
        return []
    def walk(node, prefix=""):
        for key, value in node.items():
            yield f"{prefix}{key}"
            if isinstance(value, dict):
                yield from walk(value, f"{prefix}{key}.")
    keys = list(walk(OmegaConf.to_container(cfg, resolve=False)))
    return [k for k in keys if k.startswith("hydra.")] if with_hydra else keys


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
