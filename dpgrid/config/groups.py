"""The options of a config group, as Hydra's search path finds them: dpgrid's own conf/ and the folders a
hydra.searchpath value adds (file:// folders, pkg:// packages). `dpgrid --help` lists them; a released model is built
only from a callable one of them names (dpgrid.results.models)."""

from pathlib import Path


def config_dir() -> str:
    """conf/ as installed (package dpgrid.conf), or beside the package in a source checkout."""
    try:
        import dpgrid.conf
        return str(Path(dpgrid.conf.__file__).parent)
    except ImportError:
        return str(Path(__file__).resolve().parents[2] / "conf")


def options(group: str, searchpath: str = None) -> list:
    """The options of a config group (strategy, dataset, model): dpgrid's own and those of the folders of a
    hydra.searchpath value ("[file:///abs/conf,pkg://my_plugins.conf]"), as `compose` finds them."""
    return sorted({p.stem for p in group_files(group, searchpath)})


def group_targets(group: str, searchpath=None) -> dict:
    """{_target_: option} of a config group's options (dpgrid's and those of `searchpath`'s folders): the callables
    the user's own configuration provides."""
    from omegaconf import OmegaConf

    found = {}
    for path in group_files(group, searchpath):
        try:
            target = OmegaConf.load(path).get("_target_")
        except Exception:  # a config that does not parse names nothing
            continue
        if isinstance(target, str):
            found.setdefault(target, path.stem)
    return found


def group_files(group: str, searchpath=None) -> list:
    """The YAML files of a config group in dpgrid's conf/ and the folders of a hydra.searchpath value (its text,
    "[pkg://a.conf,file:///b]", or a list of its entries)."""
    folders = [Path(config_dir())]
    entries = searchpath if isinstance(searchpath, (list, tuple)) else (searchpath or "").strip("[]").split(",")
    for entry in entries:
        entry = entry.strip().strip("'\"")
        if entry.startswith("file://"):
            folders.append(Path(entry[len("file://"):]))
        elif entry.startswith("pkg://"):
            import importlib.util

            try:
                spec = importlib.util.find_spec(entry[len("pkg://"):])
            except ImportError:  # not installed: `compose` names it when it is used
                spec = None
            if spec is not None and spec.submodule_search_locations:
                folders += [Path(p) for p in spec.submodule_search_locations]
    return [p for folder in folders for p in sorted((folder / group).glob("*.yaml"))]
