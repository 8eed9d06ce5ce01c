"""dpgrid's launchers for Hydra: Hydra takes launchers from this namespace only.

- LocalLauncher (hydra/launcher=dpgrid, what `dpgrid run -m` uses unless told otherwise): Hydra's basic launcher, one
  grid after another in this process, except where grids go side by side (several on one GPU, or
  hydra.launcher.side_by_side=N: dpgrid.commands.placement). `dpgrid run` registers
  it with Hydra itself, so that an editable install, whose namespace Hydra's discovery does not see, finds it too.
- SlurmLauncher (hydra/launcher=slurm): the submitit plugin's, with its launch handed to
  dpgrid.commands.launchers.launch (one-line errors, why jobs are pending, what Ctrl-C leaves queued, several grids
  per job). Its config is the plugin's with `grids_per_job` added (registered here, as the plugin registers its own,
  when Hydra discovers its plugins). Without dpgrid[cluster] there is nothing to define."""

from dataclasses import dataclass

from hydra._internal.core_plugins.basic_launcher import BasicLauncher


class LocalLauncher(BasicLauncher):
    def __init__(self, side_by_side="auto"):
        super().__init__()
        self.side_by_side = side_by_side  # auto | N: grids at once (dpgrid.commands.placement)

    def launch(self, job_overrides, initial_job_idx):
        """One grid after another here (Hydra's basic launcher), or side by side where dpgrid places them so."""
        from dpgrid.commands import placement

        count, line = placement.side_by_side(self, job_overrides)
        if count <= 1:
            return super().launch(job_overrides, initial_job_idx)
        return placement.in_processes(self, job_overrides, initial_job_idx, count, line)


try:
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
except ImportError:  # hydra-submitit-launcher not installed: hydra/launcher=slurm is refused by Hydra itself
    SubmititSlurmLauncher = None

if SubmititSlurmLauncher is not None:
    from hydra.core.config_store import ConfigStore

    @dataclass
    class DpgridSlurmConf(SlurmQueueConf):
        _target_: str = "hydra_plugins.dpgrid_launcher.SlurmLauncher"
        grids_per_job: int = 1  # grids one SLURM job trains one after the other (the imports paid once)

    ConfigStore.instance().store(group="hydra/launcher", name="dpgrid_slurm_schema", node=DpgridSlurmConf(),
                                 provider="dpgrid")

    class SlurmLauncher(SubmititSlurmLauncher):
        def __init__(self, grids_per_job: int = 1, **params):
            super().__init__(**params)
            self.grids_per_job = grids_per_job

        def launch(self, job_overrides, initial_job_idx):
            from dpgrid.commands.launchers import launch

            return launch(self, job_overrides, initial_job_idx)
