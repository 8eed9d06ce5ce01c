"""The command line's usage, and the settings as conf/ documents them: `dpgrid run --help` prints every setting of conf/config.yaml with its
default and its one-line comment, and those a protocol sets. The comments in conf/ are the documentation, read
here rather than copied."""

import re
from pathlib import Path

from dpgrid.config.groups import config_dir, options


USAGE = """usage: dpgrid run [-m] [OVERRIDES...]     run one private grid (-m: Hydra multirun sweep)
       dpgrid plan [--json] [--compare] [OVERRIDES...]  the privacy plan, no training (--compare: all accountants)
       dpgrid tables [--mix-budgets] [--out DIR] [RESULTS_DIR]  tables and figures (default outputs/, into its tables/)
       dpgrid model RUN_DIR [--seed S] [--out FILE]  the model a grid released, what covers it (--out: a copy)
       dpgrid audit [--canaries M] [--threat white_box|black_box] [OVERRIDES...]  a measured lower bound on epsilon
       dpgrid budget [--dataset NAME] [--study NAME] [--forget]  what the study spent on each dataset, composed
       dpgrid --version
       dpgrid COMMAND --help   one command's own options

overrides are Hydra's: dataset=mnist strategy=fixed_threshold privacy.epsilon=3 grid.k=7 ...
your own options: hydra.searchpath=[file:///abs/path/to/conf] (see docs/extending.md)"""


# `dpgrid run --help` and `dpgrid plan --help`: each command's own usage and what it does (then the config groups'
# options and every setting)
COMMAND_USAGE = {
    "run": ("usage: dpgrid run [-m] [OVERRIDES...]\n\n"
            "trains one private grid into its run directory (hydra.run.dir, default outputs/<dataset>/<strategy>/eps<epsilon>/"
            "k<k>), says its plan first, resumes an unfinished one, and releases the chosen configuration's model with the "
            "epsilon that covers it (model/); -m: a Hydra multirun sweep, one grid per combination of comma-separated "
            "values, every job planned before the first trains (hydra/launcher=slurm submits them to SLURM)"),
    "plan": ("usage: dpgrid plan [--json] [--compare] [OVERRIDES...]\n\n"
             "the grid's privacy plan without training: the noise multiplier, what its epsilon covers, the configurations, "
             "T, B and the expected time; --json: the plan as one JSON object (plan.json's); --compare: nu under every "
             "accountant and budget, and by random stopping, side by side"),
}


def usage(args=()) -> str:
    """The usage, and the options of each config group: dpgrid's and those of the folders a
    hydra.searchpath=[...] among `args` adds."""
    return USAGE + "\n" + group_options(args)


def group_options(args=()) -> str:
    """The options of each config group: dpgrid's and those of the folders a hydra.searchpath=[...] among `args`
    adds."""
    searchpath = [a.partition("=")[2] for a in args if a.partition("=")[0].lstrip("+") == "hydra.searchpath"]
    return "\n".join(f"{group.replace('/', '.')}: {', '.join(options(group, searchpath[-1] if searchpath else None))}"
                     for group in ("dataset", "strategy", "model", "protocol", "privacy/selection", "tracker"))


def command_help(command: str, args=()) -> str:
    """`dpgrid run --help`, `dpgrid plan --help`: the command's own usage, the config groups' options and every
    setting with its default as these overrides (`args`, e.g. dataset=mnist) compose it."""
    overrides = [a for a in args if not a.startswith("-")]
    resolved, said = defaults(overrides)
    return (f"{COMMAND_USAGE[command]}\n\noverrides are Hydra's: dataset=mnist strategy=fixed_threshold "
            f"privacy.epsilon=3 grid.k=7 ...\n{group_options(args)}\n\nsettings (key = default{said}: meaning), each "
            f"a Hydra override key=value:\n{settings(resolved)}")


def defaults(overrides: list) -> tuple:
    """(the config these overrides compose, or None where they do not compose; the words saying which dataset's
    defaults the settings show)."""
    from dpgrid import DpgridError
    from dpgrid.config.compose import compose

    try:
        composed = compose(overrides)
    except DpgridError as e:  # a bad override: the help still prints, with the defaults as conf/ writes them
        return None, f" as conf/config.yaml writes it; the overrides given do not compose ({e})"
    return composed, f" with dataset={composed.dataset.name}"


def settings(composed=None) -> str:
    """Every setting of conf/config.yaml with its default and its one-line comment, then those a protocol
    sets: the comments in conf/ are the documentation, read here rather than copied. `composed`: a composed config whose
    values replace the interpolations conf/config.yaml writes (a dataset's default epsilon, its epochs)."""
    text = (Path(config_dir()) / "config.yaml").read_text()
    groups = re.findall(r"^  - ([\w/]+): (\w+)\s*#\s*(.*)$", text, re.M)  # the documented groups of the defaults list
    lines = ["  {} = {}: {}".format(group.replace("/", "."), *rest) for group, *rest in groups]
    lines += [f"  {key} = {resolved(composed, key, value)}: {comment}" for key, value, comment in documented(text)]
    return "\n".join(lines + protocol_settings(groups) + selection_settings() + tracker_settings())


def resolved(composed, key: str, written: str) -> str:
    """A setting's default as the composed config has it, where conf/ writes it as an interpolation
    (${oc.select:dataset.default_epsilon,3}); else as written."""
    if composed is None or "${" not in written:
        return written
    from omegaconf import OmegaConf

    value = OmegaConf.select(composed, key, default=written)
    return {True: "true", False: "false", None: "null"}.get(value, str(value)) if not isinstance(value, float) \
        else f"{value:g}"


def selection_settings() -> list:
    """The keys of each privacy.selection option (privacy.selection.KEY), with their defaults and comments, under the
    option that has them first."""
    lines, seen = [], set()
    for path in sorted((Path(config_dir()) / "privacy" / "selection").glob("*.yaml")):
        keys = [(k, v, c) for k, v, c in documented(path.read_text()) if k not in ("_target_", "name") and k not in seen]
        seen.update(k for k, _, _ in keys)
        lines += [f"  privacy.selection.{key} = {value}: {comment} (privacy.selection={path.stem})"
                  for key, value, comment in keys]
    return lines


def tracker_settings() -> list:
    """The keys of each tracker option (tracker.KEY), with their defaults and comments."""
    return [f"  tracker.{key} = {value}: {comment} (tracker={path.stem})"
            for path in sorted((Path(config_dir()) / "tracker").glob("*.yaml"))
            for key, value, comment in documented(path.read_text()) if key != "_target_"]


def protocol_settings(groups: list) -> list:
    """The settings a protocol sets (train.momentum), with each protocol's value and the default protocol's
    comment (up to its first colon)."""
    default = next((option for group, option, _ in groups if group == "protocol"), "")
    values, comments = {}, {}
    for path in sorted((Path(config_dir()) / "protocol").glob("*.yaml"), key=lambda p: (p.stem != default, p.stem)):
        for key, value, comment in documented(path.read_text()):
            if "." in key:  # a section's setting, not the protocol's own name
                values.setdefault(key, []).append(f"{value} under protocol={path.stem}")
                comments.setdefault(key, comment.split(":")[0])
    return [f"  {key} = {', '.join(found)}: {comments[key]}" for key, found in values.items()]


def documented(text: str):
    """(key, value, comment) of each setting of a config file, named by its dotted path (section.subsection.key);
    the defaults list and Hydra's own section are left out."""
    sections, skipping = [], False  # sections: (indent, name) of the sections the line is inside
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith(("#", "-")):
            continue
        match = re.match(r"^(\s*)(\w+):\s*([^#]*?)\s*(?:#\s*(.*))?$", raw)
        if not match:
            continue
        indent, key, value, comment = match.groups()
        if not indent:
            skipping = key in ("defaults", "hydra")
        while sections and sections[-1][0] >= len(indent):
            sections.pop()
        if skipping:
            continue
        if not value:
            sections.append((len(indent), key))
        else:
            yield ".".join([name for _, name in sections] + [key]), value, comment or ""
