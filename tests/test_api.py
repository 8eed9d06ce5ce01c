"""The Python API a notebook uses: the same calls as the command line, DpgridError instead of exits."""

from pathlib import Path

import pytest

import dpgrid
from dpgrid import DpgridError


def test_compose_raises_dpgrid_error_with_the_useful_part_of_hydras_message():
    with pytest.raises(DpgridError, match=r"no strategy named 'onlin' \(did you mean strategy=online\?\); "
                                          r"available: adamwosm, constant_noise, dpadam, fixed_quantile, fixed_threshold, nodp, online, pur, pur_oracle"):
        dpgrid.compose(["strategy=onlin"])
    with pytest.raises(DpgridError, match=r"no setting 'train.epoch'; did you mean train.epochs\?"):
        dpgrid.compose(["train.epoch=3"])
    with pytest.raises(DpgridError, match=r"no model named 'cn' \(did you mean model=cnn\?\)"):
        dpgrid.compose(["model=cn"])


def test_each_dataset_names_its_default_model_and_model_replaces_it():
    assert dpgrid.compose(["dataset=mnist"]).model._target_.endswith(".cnn")
    assert dpgrid.compose(["dataset=mnist", "model=mlp"]).model._target_.endswith(".mlp")


def test_plan_and_run_grid_from_python(tmp_path):
    cfg = dpgrid.compose(["strategy=fixed_threshold", "grid.k=2", "train.epochs=1", "train.seeds=1"])
    plan = dpgrid.plan(cfg)
    assert plan.n_configs == 4 and plan.label == "Fixed Threshold" and plan.axes == ["lr", "clip"]
    with pytest.raises(DpgridError, match="privacy.epsilon must be in"):
        dpgrid.plan(dpgrid.compose(["privacy.epsilon=0"]))
    result = dpgrid.run_grid(cfg, tmp_path / "grid", progress=False)
    assert len(result.runs) == 4 and result.plan["noise_multiplier"] == plan.noise_multiplier
    assert result.best.config_id in set(result.runs.config_id)
    again = dpgrid.run_grid(cfg, tmp_path / "grid", progress=False)  # resumes: nothing is trained again
    assert again.runs.seconds.tolist() == result.runs.seconds.tolist()
    written = dpgrid.tables(tmp_path, figures=False, report=lambda line: None)
    assert tmp_path / "tables" / "digits_k2.md" in written


def test_run_help_names_dpgrid_and_describes_every_setting(capsys):
    from dpgrid.commands.cli import main

    main(["run", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: dpgrid run") and "strategy: adamwosm, constant_noise, dpadam, fixed_quantile" in out
    settings = [line for line in out.splitlines() if line.startswith("  ") and " = " in line]
    assert len(settings) >= 20 and all(line.split(": ", 1)[1].strip() for line in settings), settings
    assert any(line.startswith("  privacy.epsilon = ") for line in settings)
    assert "protocol: literal, paper" in out and any(line.startswith("  protocol = paper: ") for line in settings)
    assert "  train.momentum = 0.9 under protocol=paper, 0.0 under protocol=literal: heavy ball on the sanitised update" \
        in out.splitlines()  # set by the protocol group, not conf/config.yaml: listed all the same
    # every config group of conf/ with options is listed, privacy/selection with its options' own keys
    from dpgrid.config.groups import config_dir

    groups = {str(p.parent.relative_to(config_dir())) for p in Path(config_dir()).rglob("*.yaml")
              if p.parent != Path(config_dir()) and "hydra" not in p.parts}
    for group in groups:
        assert any(line.startswith(f"{group.replace('/', '.')}: ") for line in out.splitlines()), group
    assert any(line.startswith("  privacy.selection = composition: ") for line in settings)
    assert any(line.startswith("  privacy.selection.stopping = ") for line in settings)
    assert any(line.startswith("  privacy.selection.tuning_rate = ") for line in settings)


def test_protocol_sets_momentum_and_an_unknown_one_lists_the_available():
    assert dpgrid.compose(["protocol=paper"]).train.momentum == 0.9
    assert dpgrid.compose(["protocol=literal"]).train.momentum == 0.0
    explicit = dpgrid.compose(["protocol=paper", "train.momentum=0.5"])  # a command-line value wins
    assert (explicit.protocol, explicit.train.momentum) == ("paper", 0.5)
    with pytest.raises(DpgridError, match=r"no protocol named 'papers' \(did you mean protocol=paper\?\); "
                                          r"available: literal, paper"):
        dpgrid.compose(["protocol=papers"])


@pytest.mark.parametrize("strategy, momentum", [("fixed_threshold", 0.9), ("adamwosm", 0.0)])
def test_rows_record_the_protocol_and_the_momentum_the_update_applied(tmp_path, strategy, momentum):
    cfg = dpgrid.compose([f"strategy={strategy}", "protocol=paper", "grid.k=2", "train.epochs=1", "train.seeds=1"])
    runs = dpgrid.run_grid(cfg, tmp_path, progress=False).runs
    assert (runs.protocol == "paper").all() and (runs.momentum == momentum).all()


def test_a_users_own_protocol_joins_from_the_search_path(tmp_path):
    folder = tmp_path / "conf" / "protocol"
    folder.mkdir(parents=True)
    (folder / "nesterov_free.yaml").write_text("# @package _global_\nprotocol: nesterov_free\ntrain:\n  momentum: 0.5\n")
    search = f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    cfg = dpgrid.compose(["protocol=nesterov_free", search])
    assert (cfg.protocol, cfg.train.momentum) == ("nesterov_free", 0.5)
    with pytest.raises(DpgridError, match=r"available: literal, nesterov_free, paper"):
        dpgrid.compose(["protocol=nope", search])


def test_the_command_line_leaves_the_process_as_it_found_it(tmp_path, capsys):
    """main() may be called again from Python: warning filters and format, the SIGTERM handler, sys.argv and
    the root logger's handlers are as before, after a refusal and after a grid."""
    import logging
    import signal
    import sys
    import warnings

    from dpgrid.commands.cli import main

    def state():
        return (warnings.formatwarning, list(warnings.filters), signal.getsignal(signal.SIGTERM), sys.argv[:],
                logging.getLogger().handlers[:])

    before = state()
    for args in (["run", "grid.k=abc"], ["run", "grid.k=2", "train.seeds=1", "train.epochs=1",
                                         f"hydra.run.dir={tmp_path / 'grid'}"]):
        try:
            main(args)
        except SystemExit:
            pass
        assert state() == before
    assert (tmp_path / "grid" / "cli.log").exists()
