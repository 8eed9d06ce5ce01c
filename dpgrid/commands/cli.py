"""`dpgrid run | plan`: the command line. `run` hands its arguments to Hydra (so multirun `-m`,
`hydra.run.dir=...` and launchers work as in any Hydra app); `plan` composes the same config and
prints the grid's privacy plan without training. User errors: one line on stderr, exit code 2."""

import contextlib
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

from dpgrid.commands.signals import FINISHED, RECEIVED, on_signal, stopped

def fail(message, code: int = None) -> None:
    """One line on stderr; exit code 2 (bad input or results), 1 for an environment fault (the error's own)."""
    print(f"dpgrid: error: {message}", file=sys.stderr)
    raise SystemExit(code or getattr(message, "exit_code", 2))


def config_dir() -> str:
    from dpgrid.config.groups import config_dir as installed

    return installed()


def plan_command(args: list) -> None:
    from dpgrid.config.compose import compose

    as_json, compare = "--json" in args, "--compare" in args
    cfg = compose([a for a in args if a not in ("--json", "--compare")], with_hydra=True)
    from dpgrid.config import compile
    from dpgrid.reporting.describe import print_plan

    start = time.perf_counter()
    spec = compile(cfg).announce()
    if as_json:
        print(json.dumps(spec.plan.to_dict(), indent=2))
        return
    print_plan(spec, compare, start)
    from dpgrid.reporting.console import previous_edge

    if previous_edge(Path(cfg.hydra.run.dir), spec.plan):  # the last run of this grid: was its best on an edge?
        print(f"dpgrid: warning: in {cfg.hydra.run.dir}: {previous_edge(Path(cfg.hydra.run.dir), spec.plan)}",
              file=sys.stderr)


def run_command(args: list) -> None:
    """One grid: the config is composed once, checked before any directory exists, and run as Hydra runs
    a job. A sweep (-m) is Hydra's own, so that launchers work; every job's config is checked first."""
    import hydra

    from dpgrid.commands.sweep import check_sweep
    from dpgrid.commands.jobs import launch
    from dpgrid.config import register
    from dpgrid.config.renamed import as_written_now
    from dpgrid.results.files import directory_setting, outermost_missing

    args = as_written_now(args)
    if {"-m", "--multirun"} & set(args):
        overrides = [a for a in args if a not in ("-m", "--multirun")]
        with directory_setting("hydra.sweep.dir=..."):
            checked = check_sweep(overrides)  # every job checked first; each job compiles again and must agree
            created = {out: outermost_missing(out) for out in checked}
            register()  # the schema and resolvers Hydra's own composition needs
            register_launcher()
            sys.argv = ["dpgrid run", *args]
            from dpgrid import tracking
            from dpgrid.config.compose import compose, sweep_jobs

            first = compose(sweep_jobs(overrides)[0], with_hydra=True)  # the sweep's tracker and folder
            with kept_if_nothing_queued(overrides), launcher_errors_raised(), \
                    tracking.sweep(first.get("tracker"), first.hydra.sweep.dir, overrides):
                hydra.main(version_base="1.3", config_path=config_dir(), config_name="config")(
                    grid_job(created, checked=checked))()
        FINISHED.append(True)
        return
    from dpgrid.config.compose import compose

    cfg = compose(args, with_hydra=True)  # bad names and syntax refused here; bad values by compile, before torch
    from dpgrid.config import compile

    from dpgrid.results.claim import check_run

    # compiled once, before Hydra writes anything, the job trains this spec; a run directory holding another
    # config's results is refused before the plan, and torch, are made
    spec = compile(cfg, before_plan=lambda unplanned: check_run(unplanned, cfg.hydra.run.dir)).announce()
    out = Path(cfg.hydra.run.dir).absolute()
    created = outermost_missing(out)
    try:
        launch(cfg, grid_job({out: created}, spec))
    except BaseException as e:  # a signal before the job's own handling began (Hydra made the folder), or after it
        if stopped(e) and out.is_dir():
            from dpgrid.results.files import locked, remove_created

            with contextlib.suppress(BaseException), locked(out):
                remove_created(out, created)
        raise


def register_launcher() -> None:
    """dpgrid's default launcher (hydra/launcher=dpgrid) made known to Hydra here: its plugin discovery does not see
    the hydra_plugins namespace of an editable install (setuptools' default mode), and a sweep must run wherever
    dpgrid does."""
    from hydra.core.plugins import Plugins
    from hydra_plugins.dpgrid_launcher import LocalLauncher

    Plugins.instance().register(LocalLauncher)


@contextlib.contextmanager
def launcher_errors_raised():
    """Hydra prints an error its launcher raises, with a traceback, and exits 1; HYDRA_FULL_ERROR makes it raise it
    instead, so that a launcher's DpgridError reaches `main` and is its one line and exit code."""
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["HYDRA_FULL_ERROR"]
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


@contextlib.contextmanager
def kept_if_nothing_queued(overrides: list):
    """A SLURM sweep refused before any job was queued changes no file of an existing sweep folder: Hydra writes the
    sweep's multirun.yaml before the launcher submits, and it is put back as it was."""
    from dpgrid import DpgridError
    from dpgrid.config.compose import compose, sweep_jobs

    first = next(iter(sweep_jobs(overrides)), None)
    cfg = compose(first, with_hydra=True) if first is not None else None
    slurm = cfg is not None and "dpgrid_launcher" in str(cfg.hydra.launcher.get("_target_", ""))
    folder = Path(str(cfg.hydra.sweep.dir)) if slurm else None
    record, jobs = (folder / "multirun.yaml", folder / ".submitit" / "dpgrid_jobs.json") if slurm else (None, None)
    before = (record.read_bytes() if record.is_file() else None, jobs.read_bytes() if jobs.is_file() else None) \
        if slurm else (None, None)
    try:
        yield
    except (SystemExit, DpgridError):
        if slurm and before[0] is not None and (jobs.read_bytes() if jobs.is_file() else None) == before[1]:
            from dpgrid.results.files import write_atomic

            record.parent.mkdir(parents=True, exist_ok=True)  # (a folder that held nothing else was cleared)
            write_atomic(record, before[0])  # nothing of this command was queued: its record goes too
        raise


def grid_job(created: dict, spec=None, checked: dict = None):
    """Hydra's task: train the grid into the job's output directory and say where the results are.
    `created`: per run directory, the outermost folder this command creates for it (None: none);
    `spec`: the grid this command compiled and checked already (one run; a sweep's jobs compile their own, and
    `checked` holds the config hash the sweep checked for each directory, which the job's must equal)."""
    def task(cfg) -> None:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        from dpgrid import DpgridError
        from dpgrid.config import compile
        from dpgrid.results.files import locked, remove_created
        from dpgrid.commands.jobs import hydra_record, parallel_jobs, run_log
        from dpgrid.reporting.console import chance_warning, describe_best, edge_warning
        from dpgrid.runner import train

        out = Path(HydraConfig.get().runtime.output_dir).absolute()
        if os.environ.get("SLURM_JOB_ID"):  # a SLURM job: scancel (SIGTERM) stops it between two writes within
            signal.signal(signal.SIGTERM, on_signal)  # seconds; submitit would bypass it until SLURM's KillWait
        try:
            try:
                grid = spec or compile(cfg).announce()
                if checked and checked.get(out, grid.config_hash) != grid.config_hash:
                    raise DpgridError(f"the job for {out} composed another config (hash {grid.config_hash}) than the "
                                      f"sweep checked ({checked[out]}); nothing was trained: run the sweep again")
            except DpgridError:
                with contextlib.suppress(DpgridError), locked(out):  # Busy: another grid's; left alone
                    remove_created(out, created.get(out))  # the job's folder, which Hydra made
                raise
            with run_log(out / "cli.log"):
                trained = train(grid, out, on_lock=hydra_record(OmegaConf.to_yaml(cfg)), created=created.get(out),
                                parallel_jobs=parallel_jobs(HydraConfig.get().launcher), tracked_from=tracked_from())
        except DpgridError as e:  # refused: nothing written into another grid's directory (files.Busy)
            fail(e)
        except BaseException as e:
            if not stopped(e):
                raise
            with contextlib.suppress(BaseException), locked(out):  # a grid that had not started leaves nothing
                remove_created(out, created.get(out))
            name, code = stopped(e)
            fail(f"{name}: the grid in {out} is incomplete; the same command resumes it", code)
        print(describe_best(trained.summary, grid.dataset.task, trained.releases_best_only, trained.final))
        for warning in (edge_warning(trained.summary, grid.plan),
                        chance_warning(trained.summary, grid.dataset.task, grid.dataset.classes)):
            if warning:
                print(f"dpgrid: warning: {warning}", file=sys.stderr)
        if trained.release:
            print(trained.release)
        print(f"results: {out}", flush=True)
        if spec is not None:  # one grid: the command is done (a sweep is once its last job is)
            FINISHED.append(out)
    return task


def tracked_from():
    """Where a job's tracker follows its grid from: the outputs' root (hydra.sweep.dir, the local store's folder) and,
    in a sweep, the sweep's folder (its parent run)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from dpgrid.tracking import Place

    hydra_cfg = HydraConfig.get()
    root = Path(str(hydra_cfg.sweep.dir)).absolute()
    return Place(root, root if hydra_cfg.mode == RunMode.MULTIRUN else None)


def taken(args: list, flag: str, usage: str) -> list:
    """The values of every `flag VALUE` in args, each pair taken out of args; a flag without its value: the usage."""
    values = []
    while flag in args:
        at = args.index(flag)
        if at + 1 >= len(args):
            fail(usage)
        values.append(args.pop(at + 1))
        args.pop(at)
    return values


def tables_command(args: list) -> None:
    usage = "usage: dpgrid tables [--mix-budgets] [--out DIR] [RESULTS_DIR]"
    if {"-h", "--help"} & set(args):
        print(f"{usage}\n\npaper-style tables and figures of every grid under RESULTS_DIR (default outputs) into "
              "DIR (default RESULTS_DIR/tables: a read-only or shared results tree is tabled elsewhere with --out); "
              "--mix-budgets puts grids of different budgets (per_grid, per_run, selection) in one table")
        return
    from dpgrid.reporting.tables import write_tables
    from dpgrid.results.files import directory_setting

    mix = "--mix-budgets" in args
    args = [a for a in args if a != "--mix-budgets"]
    out = next((Path(value) for value in taken(args, "--out", usage)[-1:]), None)
    if len(args) > 1 or any(a.startswith("-") for a in args):
        fail(usage)
    results = Path(args[0] if args else "outputs")
    if not results.is_dir():
        fail(f"no results directory {results}; run a grid first (dpgrid run) or name the directory")
    with directory_setting("--out DIR"):
        written = write_tables(results, mix_budgets=mix, out=out, report=lambda line: print(f"dpgrid: warning: {line}",
                                                                                            file=sys.stderr))
    print(f"wrote {len(written)} files to {out or results / 'tables'}")


def model_command(args: list) -> None:
    """What a run directory released: the model's configuration, seeds and test values, the epsilon that covers
    it; with --out FILE, a copy of one seed's weights that carries that statement in its own metadata."""
    usage = ("usage: dpgrid model RUN_DIR [--seed S] [--out FILE] [--trust TARGET] "
             "[hydra.searchpath=[pkg://its_package.conf]]")
    if {"-h", "--help"} & set(args):
        print(f"{usage}\n\nthe model a grid released (RUN_DIR/model/), what epsilon covers it and why, checked against "
              "its seal, its plan and its files' checksums; --seed: which released seed (default: the best on the test "
              "set); --out FILE: a copy of its weights whose metadata holds that statement (never inside a run "
              "directory); a plugin's model is built only from its config on hydra.searchpath, or a _target_ you "
              "--trust by name")
        return
    rest = list(args)
    seed, out, trust = (taken(rest, flag, usage) for flag in ("--seed", "--out", "--trust"))
    searchpath = [a.partition("=")[2] for a in rest if a.partition("=")[0].lstrip("+") == "hydra.searchpath"]
    rest = [a for a in rest if a.partition("=")[0].lstrip("+") != "hydra.searchpath"]
    if len(rest) != 1 or rest[0].startswith("-") or not (seed[-1:] or ["0"])[0].isdigit():
        fail(usage)
    run_dir, seed, out, searchpath = rest[0], (seed[-1:] or [None])[0], (out[-1:] or [None])[0], (searchpath or [None])[-1]
    from dpgrid.results.models import export, export_target, load_model
    from dpgrid.results.seal import check as check_sealed

    if out:  # refused before anything is printed
        export_target(out, run_dir)
    check_sealed(Path(run_dir))  # the grid's results beside its model, as it wrote them
    model = load_model(run_dir, None if seed is None else int(seed), searchpath=searchpath, trust=trust)
    seed = model.statement["default_seed"] if seed is None else int(seed)
    from dpgrid.reporting.describe import print_release

    print_release(model, run_dir, seed)
    if out:
        replaced = Path(out).exists()
        print(f"wrote {export(run_dir, seed, out)} (seed {seed}; its metadata holds model.json)"
              + (" (it replaced the file that was there)" if replaced else ""))


def budget_command(args: list) -> None:
    from dpgrid.commands.budget import budget_command as budget

    budget(args)


def audit_command(args: list) -> None:
    from dpgrid.commands.audit import audit_command as audit

    code = audit(args)
    if code:  # the mechanism differs from the plan, or the bound exceeds the claim: a plugin's CI gates on it
        raise SystemExit(code)


def main(argv=None) -> None:
    """The command line. It leaves the process as it found it (warning filters and format, the SIGTERM
    handler, sys.argv, the log handlers a Hydra job adds), so that it can be called again from Python or a test."""
    import logging

    root = logging.getLogger()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for s in handlers:  # first: a signal at any later moment is one line
        signal.signal(s, on_signal)
    RECEIVED.clear()
    FINISHED.clear()
    saved = warnings.formatwarning, sys.argv[:], root.handlers[:], root.level
    try:
        with warnings.catch_warnings(), quiet_broken_pipe():
            warnings.filterwarnings("ignore", module="opacus")  # opacus warns about secure RNG at import time
            warnings.formatwarning = lambda message, *args, **kwargs: f"dpgrid: warning: {message}\n"
            dispatch(sys.argv[1:] if argv is None else list(argv))
    finally:
        for s, handler in handlers.items():  # the `dpgrid` process, once done, ignores what arrives as it exits
            signal.signal(s, signal.SIG_IGN if FINISHED and argv is None else handler)
        warnings.formatwarning = saved[0]
        sys.argv[:] = saved[1]
        for handler in [h for h in root.handlers if h not in saved[2]]:  # cli.log's: Hydra's job replaced them
            handler.close()
        root.handlers[:], root.level = saved[2], saved[3]


@contextlib.contextmanager
def quiet_broken_pipe():
    """`dpgrid plan | head`: the reader went away; end quietly, as other command-line tools do."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit fails silently
        raise SystemExit(141) from None  # 128 + SIGPIPE, as a process killed by the broken pipe


def dispatch(argv: list) -> None:
    if not argv or argv[0] in ("-h", "--help", "help"):
        from dpgrid.config.documented import usage
        print(usage(argv[1:]))
        return
    if argv[0] in ("--version", "version"):
        from importlib.metadata import PackageNotFoundError, version

        from dpgrid import __version__
        try:
            installed = version("dpgrid")
        except PackageNotFoundError:  # a source checkout on the path
            installed = __version__
        print(f"dpgrid {installed} (torch, opacus, hydra: pip show them)")
        return
    if argv[0] in ("run", "plan") and ({"-h", "--help"} & set(argv[1:])):
        from dpgrid.config.documented import command_help
        print(command_help(argv[0], argv[1:]))
        return
    command, args = argv[0], argv[1:]
    commands = {"run": run_command, "plan": plan_command, "tables": tables_command, "model": model_command,
                "audit": audit_command, "budget": budget_command}
    if command not in commands:
        fail(f"unknown command {command!r}; valid: {', '.join(commands)}")
    from dpgrid import DpgridError

    try:
        commands[command](args)
    except DpgridError as e:  # every refusal, wherever it is raised: one line, its exit code
        fail(e)
    except BaseException as e:  # before a grid started (once one runs, its task says how to resume)
        if not stopped(e):
            raise
        name, code = stopped(e)
        fail(f"{name}: dpgrid {command} stopped before it finished; the same command starts it again", code)


if __name__ == "__main__":
    main()
