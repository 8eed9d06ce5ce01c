"""dpgrid's SLURM launcher for Hydra (hydra/launcher=slurm): Hydra takes launchers from this namespace only.
The class is the submitit plugin's, with its launch handed to dpgrid.launchers.launch (one-line errors, why
jobs are pending, what Ctrl-C leaves queued). Without dpgrid[cluster] there is nothing to define."""

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
except ImportError:  # hydra-submitit-launcher not installed: hydra/launcher=slurm is refused by Hydra itself
    SubmititSlurmLauncher = None

if SubmititSlurmLauncher is not None:
    class SlurmLauncher(SubmititSlurmLauncher):
        def launch(self, job_overrides, initial_job_idx):
            from dpgrid.launchers import launch

            return launch(self, job_overrides, initial_job_idx)
