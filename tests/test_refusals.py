"""Every failure is one line, naming what to write instead, and leaves nothing it created behind: overrides that
add what nothing reads or set what is there, list settings given a bare value, a model that does not fit its data,
loaders that return the wrong dtypes, absurd thread counts, broken symbolic links, a full disk while logging."""

import re
import errno
import os

import pytest
import torch

from dpgrid import DpgridError, EnvironmentFault
from dpgrid.api import compose
from dpgrid.config import compile

from .command import dpgrid, one_line


@pytest.mark.parametrize("overrides, message", [
    (["+train.epochs=2"], "train.epochs is a setting already: write train.epochs=2 without the +"),
    (["+train.epoch=2"], "no setting 'train.epoch' (+ adds keys only to a dataset, strategy or model); did you mean "
                         "train.epochs?"),
    (["grid.only=lr3"], "grid.only takes a list: write grid.only=[lr3]"),
    (["+strategy.clip0=1"], "strategy.clip0 is there already: write strategy.clip0=1 without the +"),
    (["strategy=fixed_threshold", "+strategy.clip0=1"], "strategy=fixed_threshold reads no key 'clip0': a strategy reads "
                                                        "its own config's keys, here name, grid"),
    (["+dataset.foo=1"], "dataset=digits: nothing reads a dataset key 'foo'"),
    (["model=logistic"], "model.inputs: Interpolation key 'dataset.features' not found"),
])
def test_overrides_that_cannot_mean_what_they_say_are_one_line(overrides, message):
    with pytest.raises(DpgridError) as refused:
        compose(overrides)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    typed = overrides[-1].partition("=")[0].lstrip("+")
    assert f"did you mean {typed}?" not in str(refused.value)  # never the key as typed


def test_double_plus_sets_a_setting_either_way():
    assert compose(["++train.epochs=2"]).train.epochs == 2


@pytest.mark.parametrize("key, message", [("+model.foo=1", "model.foo: dpgrid.models.mlp takes no argument 'foo'"),
                                          ("+dataset.load.foo=1", "dataset.load.foo: dpgrid.data.datasets.load_digits takes "
                                                                  "no argument 'foo'")])
def test_an_argument_a_model_or_loader_does_not_take_is_refused_at_compile(key, message):
    with pytest.raises(DpgridError, match=message):
        compile(compose([key]))


def test_an_empty_grid_only_is_refused_by_plan_and_run_alike():
    for plan in (False, True):
        with pytest.raises(DpgridError, match=r"grid.only must name at least one configuration"):
            compile(compose(["grid.only=[]"]), plan=plan)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["cnn", "autoencoder", "bag_of_words", "logistic"])
def test_a_model_that_does_not_fit_its_data_writes_nothing(model, tmp_path):
    out = tmp_path / "grid"
    r = dpgrid("run", f"model={model}", "grid.k=2", "train.epochs=1", f"hydra.run.dir={out}")
    assert r.returncode == 2 and one_line(r.stderr), r.stderr
    assert ("does not fit dataset=digits" in r.stderr) or ("dataset.features" in r.stderr)
    assert not out.exists()


@pytest.mark.parametrize("features, labels, message", [
    (torch.float64, torch.int64, "returned features of dtype float64; task classification needs float32 or int64 (x.float()"),
    (torch.int16, torch.int64, "returned features of dtype int16; task classification needs float32 or int64"),
    (torch.float32, torch.float32, "returned labels of dtype float32; task classification needs int64 (y.long()"),
])
def test_a_loaders_dtypes_are_checked_at_load(features, labels, message, monkeypatch, tmp_path):
    from dpgrid.data import datasets
    from dpgrid.runner import train

    real = datasets.load_digits

    def wrong(root=None):
        data = real(root)
        data.x_train, data.x_test = data.x_train.to(features), data.x_test.to(features)
        data.y_train, data.y_test = data.y_train.to(labels), data.y_test.to(labels)
        return data

    monkeypatch.setattr(datasets, "load_digits", wrong)
    spec = compile(compose(["grid.k=2", "train.epochs=1", "train.seeds=1"]))
    with pytest.raises(DpgridError) as refused:
        train(spec, tmp_path / "grid", progress=False)
    assert message in str(refused.value)
    assert not (tmp_path / "grid").exists()


def test_more_threads_than_cores_are_capped_with_one_line():
    from dpgrid.training.threads import available_cores, choose

    for asked in ("100000", "999999999999999999999"):
        with pytest.warns(UserWarning, match=rf"train.threads={asked} is more than the {available_cores()} core"):
            assert choose(asked, 10 ** 6) == available_cores()


def test_broken_symbolic_links_in_the_run_directory_are_one_line(tmp_path):
    from dpgrid.results.files import check_writable

    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for folder in (tmp_path / "dangling", tmp_path / "loop" / "below"):
        with pytest.raises(EnvironmentFault, match="is a symbolic link to a missing folder"):
            check_writable(folder)


def test_a_folder_where_a_file_goes_is_named_as_the_file(tmp_path):
    from dpgrid.results.files import write_atomic

    (tmp_path / "config.yaml").mkdir()
    with pytest.raises(EnvironmentFault) as refused:
        write_atomic(tmp_path / "config.yaml", "x")
    assert str(refused.value).startswith(f"cannot write {tmp_path / 'config.yaml'}: a folder stands where a file")
    assert ".tmp" not in str(refused.value)


@pytest.mark.slow
def test_a_full_disk_while_logging_is_one_line(tmp_path, monkeypatch):
    from dpgrid.commands import jobs

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def flush(self):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def close(self):
            pass

    monkeypatch.setattr(jobs.LogFile, "_open", lambda self: Full())
    r = dpgrid("run", "strategy=fixed_threshold", "grid.k=2", "train.epochs=1", "train.seeds=1",
               f"hydra.run.dir={tmp_path / 'grid'}")
    assert r.returncode == 1 and one_line(r.stderr), r.stderr
    assert "cli.log: no space left on the device" in r.stderr


def test_a_launcher_whose_plugin_is_missing_says_how_to_install_it():
    from dpgrid.config.compose import readable

    line = readable("In 'hydra/launcher/local': Could not load 'hydra/launcher/joblib'.", [])
    assert "pip install 'dpgrid[cluster]'" in line


@pytest.mark.slow
def test_version_and_the_help_of_a_search_path():
    from .plugin import EXAMPLES, SEARCHPATH

    r = dpgrid("--version")
    assert r.returncode == 0 and r.stdout.startswith("dpgrid ")
    r = dpgrid("run", "--help", SEARCHPATH)
    strategies = next(line for line in r.stdout.splitlines() if line.startswith("strategy:"))
    assert "automatic" in strategies and "online" in strategies
    assert "wdbc" in next(line for line in r.stdout.splitlines() if line.startswith("dataset:"))
    assert (EXAMPLES / "dpgrid_example" / "conf" / "dataset" / "wdbc.yaml").exists()


@pytest.mark.slow
def test_a_resume_on_another_device_type_is_refused_naming_it(tmp_path):
    """A grid records its device (plan.json, every row); a seeded run's streams are the device's generator's, so a
    resume or a grid.only split on another device type is refused."""
    import json

    import pandas as pd

    out = tmp_path / "grid"
    args = ["strategy=fixed_threshold", "grid.k=2", "train.seeds=1", "train.epochs=1", f"hydra.run.dir={out}"]
    assert dpgrid("run", *args, "grid.only=[lr0_clip0]").returncode == 0
    assert json.loads((out / "plan.json").read_text())["device"] == "cpu"
    assert set(pd.read_csv(out / "runs.csv").device) == {"cpu"}
    plan = json.loads((out / "plan.json").read_text())
    (out / "plan.json").write_text(json.dumps({**plan, "device": "cuda:0"}))  # as if run on a GPU
    r = dpgrid("run", *args)
    assert r.returncode == 2 and one_line(r.stderr), r.stderr
    assert "train.device is cuda:0 there, cpu here" in r.stderr


def test_a_misspelt_hydra_or_launcher_key_names_the_closest():
    r = dpgrid("run", "hydra.run.dri=x")
    assert r.returncode == 2 and one_line(r.stderr) and "did you mean hydra.run.dir?" in r.stderr, r.stderr
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    r = dpgrid("run", "-m", "hydra/launcher=slurm", "hydra.launcher.cpus_per_tsk=4", "grid.k=2")
    assert r.returncode == 2 and one_line(r.stderr), r.stderr
    assert "did you mean hydra.launcher.cpus_per_task?" in r.stderr, r.stderr


def script_help(script) -> str:
    """What `python SCRIPT --help` prints, from the script run in this process as `python` runs it (as __main__,
    its folder first on sys.path, at the width argparse gives a pipe)."""
    import contextlib
    import io
    import runpy
    import sys

    out, saved = io.StringIO(), (sys.argv[:], sys.path[:], os.environ.get("COLUMNS"))
    try:
        sys.argv, sys.path[:0] = [str(script), "--help"], [str(script.parent)]
        os.environ["COLUMNS"] = "80"
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        os.environ.pop("COLUMNS") if saved[2] is None else os.environ.update(COLUMNS=saved[2])
    return out.getvalue()


@pytest.mark.slow  # imports every script (2 s): what a script's help says changes with its docs, not after every edit
def test_every_scripts_help_describes_it_in_whole_sentences():
    from .conftest import ROOT

    for script in sorted((ROOT / "scripts").glob("*.py")):
        text = script_help(script)
        assert text.startswith("usage:"), f"{script.name}: {text[:200]!r}"
        description = text.split("\n\n")[1].strip() if text.count("\n\n") else ""
        assert description.endswith((".", ")", ":")), f"{script.name}: {description[-60:]!r}"
        lines = text.splitlines()  # every option says what it does: its help on its line or the next
        for i, line in enumerate(lines):
            option = re.match(r"^  (-[-\w]+(?: [\w.]+(?: \[[^]]*\])*)?(?:, -[-\w]+(?: [\w.]+)?)*)(\s{2,}\S.*)?$", line)
            if option and option.group(1) not in ("-h, --help",) and not option.group(2):
                follows = lines[i + 1] if i + 1 < len(lines) else ""
                assert follows.startswith(" " * 8) and follows.strip(), f"{script.name}: {option.group(1)} says nothing"
