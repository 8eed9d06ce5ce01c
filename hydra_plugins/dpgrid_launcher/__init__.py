"""dpgrid's SLURM launcher for Hydra (hydra/launcher=slurm): Hydra takes launchers from this namespace only.
The class is the submitit plugin's, with its launch handed to dpgrid.commands.launchers.launch (one-line errors, why
jobs are pending, what Ctrl-C leaves queued, several grids per job). Its config is the plugin's with
`grids_per_job` added (registered here, as the plugin registers its own, when Hydra discovers its plugins).
Without dpgrid[cluster] there is nothing to define."""

from dataclasses import dataclass

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
