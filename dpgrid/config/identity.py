"""What identifies a grid's results: the hash of the settings that change what its runs compute, and the settings a
run directory records beside it, and the words of a refusal when they differ (dpgrid.results.claim judges a run
directory with them)."""

import copy
import hashlib
import json
from pathlib import Path

from omegaconf import OmegaConf

from dpgrid import MOVED_MODULES


# Settings that cannot change what a run computes. data.root: the data's content is recorded instead
# (plan.json's data_files), so a moved data directory resumes and a changed file is named. tracker: what follows the
# grid, which changes no result.
NOT_HASHED = ("tracker", "train.device", "train.engine", "train.per_sample_method", "train.conv_method", "train.threads", "train.parallel_runs",
              "train.cuda_graphs",
              "train.save_models", "grid.only",
              "overwrite", "grid.allow_large", "data.root", "data.check_before_queue",
              "dataset.stacked_seconds_per_step",  # a time estimate only
              "privacy.study", "privacy.study_budget", "privacy.study_ledger")  # the study's ledger: no result
# settings added after grids were recorded, hashed only when set away from these defaults: older grids keep their hash
HASHED_WHEN_SET = {"train.float64": False, "train.steps": None, "train.trainable": ["*"], "model.init": None, "model.init_covered_by": None,
                   "model.init_disjoint": False,
                   "model.lora": {"rank": 0, "alpha": 8.0, "targets": []},
                   "privacy.selection_accountant": "rdp", "privacy.stopping_rounds": None,
                   "privacy.tuning_rate": 0.1, "privacy.tuning_search": "random_stopping", "privacy.tuning_split": "shared",
                   "privacy.final_data": "full", "data.validation": "test"}


# Before the selection was a config option (conf/privacy/selection), its keys sat in `privacy` beside the others
# and every grid recorded random stopping's. Hashes, and the privacy settings a plan is made from, are of that flat
# form (`flat_privacy`), so that every grid recorded so keeps its hash.
RECORDED_BY_EVERY_GRID = {"stopping": "truncated_negative_binomial", "stopping_eta": 0.0, "stopping_mean": None,
                          "stopping_seed": 0}


def flat_privacy(privacy: dict) -> dict:
    """The privacy settings with the selection's keys among them and `selection` its name (a config recorded before
    the selection was an option is flat already)."""
    node = privacy.get("selection")
    if not isinstance(node, dict):
        return dict(privacy)
    flat = {key: value for key, value in privacy.items() if key != "selection"}
    flat.update(RECORDED_BY_EVERY_GRID)
    flat.update({key: value for key, value in node.items() if key not in ("_target_", "name")})
    return {**flat, "selection": node.get("name")}


def identity_settings(settings: dict, start) -> dict:
    """The settings as hashed: a checkpoint (model.init) by its content, not its path (a moved file is the same grid,
    a changed one another)."""
    if not start.init:
        return settings
    model = {**settings["model"], "init": f"sha256:{start.init_sha256}"}
    return {**settings, "model": model}


def config_hash(settings: dict, private: bool = True, accounts_seeds: bool = False) -> str:
    return hashlib.sha256(json.dumps(hashed(settings, private, accounts_seeds), sort_keys=True).encode()).hexdigest()[:16]


def hashed(settings: dict, private: bool = True, accounts_seeds: bool = False) -> dict:
    """The resolved config (plain values), less the settings that cannot change the results.

    train.seeds is left out unless the seeds are accounted (privacy.account_seeds, or a method that always accounts
    them: `accounts_seeds`, a selection's): seed s's run does not depend on how many seeds there are (the hashes of
    grids recorded so stay); a directory's other seed count is refused by `other_seeds`, since the epsilon of what it
    publishes depends on it.
    A non-private strategy's runs do not depend on the privacy settings, which are then left out too."""
    plain = copy.deepcopy(dict(settings))
    plain["privacy"] = flat_privacy(plain["privacy"])
    seeds_matter = plain["privacy"]["account_seeds"] or accounts_seeds
    unhashed = NOT_HASHED if seeds_matter else (*NOT_HASHED, "train.seeds")
    if not private:
        unhashed = (*unhashed, *(f"privacy.{key}" for key in plain["privacy"] if key != "secure_rng"))
    for key in unhashed:
        section, _, name = key.rpartition(".")
        (plain.get(section, {}) if section else plain).pop(name, None)
    for key, default in HASHED_WHEN_SET.items():
        section, _, name = key.rpartition(".")
        node = plain.get(section, {})
        if name in node and node[name] == default:
            node.pop(name)
    return targets_as_first_recorded(plain)


FIRST_RECORDED = {new: old for old, new in MOVED_MODULES.items()}  # a moved module's path -> the path grids recorded


def targets_as_first_recorded(tree):
    """`tree` with each `_target_` in a moved module spelt by its old path (dpgrid.MOVED_MODULES): a grid hashes the
    same whichever path its config names, so grids recorded before the move keep their hash."""
    if isinstance(tree, list):
        return [targets_as_first_recorded(value) for value in tree]
    if not isinstance(tree, dict):
        return tree
    out = {key: targets_as_first_recorded(value) for key, value in tree.items()}
    target = out.get("_target_")
    if isinstance(target, str):
        module, _, name = target.rpartition(".")
        old = FIRST_RECORDED.get(module)
        out["_target_"] = f"{old}.{name}" if old else target
    return out


def config_difference(out: Path, settings: dict, private: bool = True, accounts_seeds: bool = False) -> str:
    """The first hashed setting whose value differs between the config recorded in out/config.yaml and
    `settings`, e.g. "train.epochs is 1 there, 2 here"; '' when it cannot be told."""
    try:
        there = flat(hashed(OmegaConf.to_container(OmegaConf.load(out / "config.yaml"), resolve=False), private,
                            accounts_seeds))
    except Exception:  # a missing or damaged record: the hashes are named instead
        return ""
    here = flat(hashed(settings, private, accounts_seeds))
    for key in sorted(set(there) | set(here)):
        if there.get(key) != here.get(key):
            return f"{key} is {there.get(key, '(absent)')} there, {here.get(key, '(absent)')} here"
    return ""


def flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def other_config(out: Path, settings: dict, private: bool, recorded: str, digest: str, accounts_seeds: bool = False
                 ) -> str:
    """The refusal of a run directory whose results were made by another config (hash `recorded`)."""
    difference = config_difference(out, settings, private, accounts_seeds) or f"hash {recorded} != {digest}"
    return (f"{out} holds results of a different config ({difference}); choose another hydra.run.dir, or pass "
            "overwrite=true to delete them")


# Settings that are not hashed (older grids keep their hash) yet may not change under a directory's results: the key
# plan.json records each under, and why.
RECORDED = {"seeds": ("train.seeds", "the epsilon of what it publishes, means over its seeds, would change with it"),
            "parallel_runs": ("train.parallel_runs", "runs stacked in groups of another size round differently, so the "
                              "grid would match neither setting's numbers"),
            "device": ("train.device", "a seeded run's noise and batches come from the device's own generator, so "
                       "the grid would mix two devices' streams")}


def other_setting(out: Path, recorded: dict, spec) -> str:
    """The refusal of a run directory whose plan.json was written with another value of a RECORDED setting ('' when
    it was not)."""
    here = {"seeds": spec.train.seeds, "parallel_runs": spec.train.parallel_runs,
            "device": device_type(spec.train.device)}
    for key, (setting, why) in RECORDED.items():
        there = recorded.get(key)
        if key == "device" and (there is None or here[key] == "auto"):  # compared once the device is resolved
            continue
        if there is not None and str(device_type(there) if key == "device" else there) != str(here[key]):
            return (f"{out} holds results of a different config ({setting} is {there} there, {here[key]} here: {why}); "
                    "choose another hydra.run.dir, or pass overwrite=true to delete them")
    return ""


def device_type(device: str) -> str:
    """cpu or cuda (cuda:1 is a cuda): what a run's streams depend on."""
    return str(device).split(":")[0]
