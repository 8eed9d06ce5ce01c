"""What a grid's Hydra job writes beside its results, once it holds the run directory's lock: Hydra's record of
the job (.hydra/) and the grid's log (cli.log). Hydra itself writes neither (conf: hydra.output_subdir is null)."""

import contextlib
from pathlib import Path


@contextlib.contextmanager
def run_log(path: Path):
    """The grid's lines (logger `dpgrid`) into its cli.log, opened at the first line: a refused job writes none.
    The logger is restored afterwards, and nothing reaches the process's other handlers."""
    import logging

    log, handler = logging.getLogger("dpgrid"), logging.FileHandler(path, delay=True)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
    saved = log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        handler.close()
        log.setLevel(saved[0])
        log.propagate = saved[1]


def hydra_record(config_yaml: str):
    """Hydra's record of the job (.hydra/config.yaml, the job's config as composed; hydra.yaml, overrides.yaml),
    written by dpgrid once it holds the run directory's lock: Hydra itself writes nothing there (conf:
    hydra.output_subdir is null)."""
    def write(out: Path) -> None:
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf

        from dpgrid.results.files import environment, write_atomic

        hydra_cfg, folder = HydraConfig.get(), out / ".hydra"
        with environment(folder):
            folder.mkdir(exist_ok=True)
        write_atomic(folder / "config.yaml", config_yaml)
        write_atomic(folder / "hydra.yaml", OmegaConf.to_yaml(OmegaConf.create({"hydra": hydra_cfg})))
        write_atomic(folder / "overrides.yaml", OmegaConf.to_yaml(hydra_cfg.overrides.task))
    return write
