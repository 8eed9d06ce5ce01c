"""MLflow (`tracker=mlflow`, `pip install "dpgrid[mlflow]"`): a parent run per sweep, a child run per grid, and a
nested run per configuration x seed, in the experiment `tracker.experiment`.

The tracking URI is `tracker.uri`, else MLflow's own MLFLOW_TRACKING_URI, else a local store beside the outputs:
sqlite:///<hydra.sweep.dir>/mlflow.db, artifacts in <hydra.sweep.dir>/mlartifacts (`mlflow ui --backend-store-uri
sqlite:///outputs/mlflow.db` shows them). Credentials stay in MLflow's own variables (MLFLOW_TRACKING_USERNAME, ...),
never in the config: a run directory records its config.

A grid's run is found again by its directory and config hash (tags dpgrid.folder, dpgrid.config_hash): a resumed
grid takes it up, and its nested runs are the runs logged whole (a run's metrics, parameters and end in one go; one
caught half-logged by a kill is deleted and logged again). Each run records the process that holds it (host, pid,
start): a run left RUNNING by a process that died (kill -9) is ended FAILED by the next tracked command on that host,
and a sweep ends FAILED whatever its jobs left RUNNING (a SLURM job killed on its node). Every write names one run
that one process holds, so a sweep's workers never write into the same run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from pathlib import Path

from dpgrid.tracking import FAILED, FINISHED, Tracker
from dpgrid.tracking.published import Audit, Grid, Logged, Release, Run, Sweep

RUNNING = "RUNNING"
KIND, FOLDER, HASH = "dpgrid.kind", "dpgrid.folder", "dpgrid.config_hash"
PROCESS, HOST = "dpgrid.process", "dpgrid.host"
PARENT, NAME = "mlflow.parentRunId", "mlflow.runName"
PARAM_LENGTH, TAG_LENGTH = 500, 5000  # what every MLflow server keeps (older ones: 500 and 5000)
BATCH = 1000                           # entities per log_batch (MLflow's limit)
LOCKED_WAIT_S = 60.0                   # how long a write waits for a sqlite store that another process is writing


class MlflowTracker(Tracker):
    package, extra = "mlflow", "mlflow"

    def __init__(self, root, uri: str = None, experiment: str = "dpgrid"):
        super().__init__(root)
        for name in ("mlflow", "alembic"):  # the store's set-up lines (tables, migrations) stay off the console
            logging.getLogger(name).setLevel(logging.WARNING)
        from mlflow.tracking import MlflowClient

        given = uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not given:
            local_store(self.root / "mlflow.db")
        self.uri = given or f"sqlite:///{self.root / 'mlflow.db'}"
        self.client = Patient(MlflowClient(tracking_uri=self.uri))
        self.experiment_id = experiment_id(self.client, experiment,
                                           None if given else (self.root / "mlartifacts").as_uri())
        self.grid_run = self.sweep_run = None
        end_orphans(self.client, self.experiment_id)

    @classmethod
    def prepare(cls) -> None:
        import mlflow.tracking  # noqa: F401  (the client)
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401  (the sqlite store's)

    # --- a sweep -------------------------------------------------------------------------------------------------

    def start_sweep(self, sweep: Sweep) -> None:
        found = [r for r in self.runs(f"tags.`{KIND}` = 'sweep'")
                 if r.data.tags.get(FOLDER) == sweep.folder and r.data.tags.get("dpgrid.overrides") == sweep.overrides]
        tags = {KIND: "sweep", FOLDER: sweep.folder, "dpgrid.overrides": sweep.overrides[:TAG_LENGTH]}
        self.sweep_run = self.open(found[0] if found else None, tags, f"sweep {sweep.overrides}"[:250])

    def end_sweep(self, status: str) -> None:
        if self.sweep_run is None:
            return
        for grid in self.runs(f"tags.`{PARENT}` = '{self.sweep_run}' and attributes.status = '{RUNNING}'"):
            end_with_children(self.client, self.experiment_id, grid.info.run_id)  # its job ended without ending it
        self.client.set_terminated(self.sweep_run, status)

    # --- a grid --------------------------------------------------------------------------------------------------

    def start_grid(self, grid: Grid, sweep: Path = None) -> Logged:
        found = self.grid_runs(grid)
        parent = self.parent_of(sweep) if sweep is not None and not found else None
        tags = {KIND: "grid", FOLDER: grid.folder, HASH: grid.config_hash, "dpgrid.covers": grid.covers[:TAG_LENGTH],
                "dpgrid.metric": grid.metric, **({PARENT: parent} if parent else {})}
        self.grid_run = self.open(found[0] if found else None, tags, grid.name)
        held = self.client.get_run(self.grid_run).data.params
        self.log(self.grid_run, params={k: v for k, v in grid.params.items() if k not in held})
        logged = Logged()
        for run in self.runs(f"tags.`{PARENT}` = '{self.grid_run}' and tags.`{KIND}` = 'run'"):
            key = (run.data.tags.get("dpgrid.config_id"), int(run.data.tags.get("dpgrid.seed", -1)))
            if run.info.status == FINISHED and key not in logged.runs:
                logged.runs.add(key)
            else:  # caught half-logged (or twice): logged again whole
                self.client.delete_run(run.info.run_id)
        return logged

    def log_run(self, run: Run) -> None:
        from mlflow.entities import Metric

        tags = {KIND: "run", PARENT: self.grid_run, "dpgrid.config_id": run.config_id, "dpgrid.seed": str(run.seed),
                "dpgrid.diverged": str(run.diverged).lower(), **process_tags(self.holder)}
        run_id = self.client.create_run(self.experiment_id, tags=tags,
                                        run_name=f"{run.config_id} seed{run.seed}").info.run_id
        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for step, values in run.curve for key, value in values.items()]
        metrics += [Metric(key, value, now, 0) for key, value in run.values.items()]
        self.log(run_id, metrics=metrics, params=run.params)
        self.client.set_terminated(run_id, FINISHED)

    def end_grid(self, status: str, release: Release = None, best: dict = None, seconds: float = None) -> None:
        if self.grid_run is None:
            return
        from mlflow.entities import Metric

        now, best = int(time.time() * 1000), dict(best or {})
        metrics = [Metric(k, v, now, 0) for k, v in best.items() if k != "config_id"]
        tags = {"dpgrid.best_config": best["config_id"]} if "config_id" in best else {}
        if seconds is not None:
            metrics.append(Metric("seconds", float(seconds), now, self.commands()))
        if release is not None:
            metrics += [Metric(k, v, now, 0) for k, v in release.values.items()]
            held = self.client.get_run(self.grid_run).data.params
            tags.update({"dpgrid.release.covers": release.covers[:TAG_LENGTH],
                         "dpgrid.release.model": "logged: artifacts model/" if release.folder else release.withheld})
            self.log(self.grid_run, params={k: v for k, v in release.params.items() if k not in held})
            if release.folder is not None:
                self.client.log_artifacts(self.grid_run, str(release.folder), "model")
        self.log(self.grid_run, metrics=metrics, tags=tags)
        self.client.set_terminated(self.grid_run, status)

    def log_audit(self, grid: Grid, audit: Audit) -> None:
        found = self.grid_runs(grid)
        if not found:
            return
        from mlflow.entities import Metric

        run_id, now = found[0].info.run_id, int(time.time() * 1000)
        held = self.client.get_run(run_id).data.params
        self.log(run_id, metrics=[Metric(k, v, now, 0) for k, v in audit.values.items()],
                 params={k: v for k, v in audit.params.items() if k not in held},
                 tags={"dpgrid.audit.mechanism": audit.verdict} if audit.verdict else {})

    # --- helpers --------------------------------------------------------------------------------------------------

    def grid_runs(self, grid: Grid) -> list:
        """The grid's runs (by its directory and config hash), latest first."""
        return [r for r in self.runs(f"tags.`{KIND}` = 'grid' and tags.`{HASH}` = '{grid.config_hash}'")
                if r.data.tags.get(FOLDER) == grid.folder]

    def parent_of(self, sweep: Path) -> str | None:
        """The running sweep's run that this grid is a job of (its folder's), or None."""
        folder = str(Path(sweep).absolute())
        found = [r for r in self.runs(f"tags.`{KIND}` = 'sweep' and attributes.status = '{RUNNING}'")
                 if r.data.tags.get(FOLDER) == folder]
        return found[0].info.run_id if found else None

    def open(self, found, tags: dict, name: str) -> str:
        """A run taken up (RUNNING again, held by this process) or created."""
        if found is not None:
            run_id = found.info.run_id
            self.client.update_run(run_id, status=RUNNING)
            self.log(run_id, tags=process_tags(self.holder))
            return run_id
        tags = {**tags, **process_tags(self.holder)}
        return self.client.create_run(self.experiment_id, tags=tags, run_name=name).info.run_id

    def runs(self, where: str) -> list:
        return search(self.client, self.experiment_id, where)

    def commands(self) -> int:
        """How many commands have ended this grid's run before (the step of its `seconds`)."""
        return len(self.client.get_metric_history(self.grid_run, "seconds"))

    def log(self, run_id: str, metrics=(), params: dict = None, tags: dict = None) -> None:
        from mlflow.entities import Param, RunTag

        entities = [*metrics, *(Param(k, str(v)[:PARAM_LENGTH]) for k, v in (params or {}).items()),
                    *(RunTag(k, str(v)[:TAG_LENGTH]) for k, v in (tags or {}).items())]
        for start in range(0, len(entities), BATCH):
            chunk = entities[start:start + BATCH]
            self.client.log_batch(run_id, metrics=[e for e in chunk if type(e).__name__ == "Metric"],
                                  params=[e for e in chunk if isinstance(e, Param)],
                                  tags=[e for e in chunk if isinstance(e, RunTag)])


def local_store(path: Path) -> None:
    """dpgrid's own local store (no URI given): a sqlite file in write-ahead-log mode, whose commits this process makes
    without waiting for the disk (synchronous=NORMAL: a crash of the machine may lose the last writes, never the
    file's consistency; a killed process loses nothing). Several processes of one machine (a sweep's local workers)
    write it side by side; like any sqlite file, it is not for a network file system (a SLURM sweep's nodes: give
    MLflow a tracking server, MLFLOW_TRACKING_URI)."""
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.closing(sqlite3.connect(path, timeout=LOCKED_WAIT_S)) as connection:
        connection.execute("PRAGMA journal_mode=WAL")  # kept by the file

    def unsynced(connection, record) -> None:
        if isinstance(connection, sqlite3.Connection) and \
                connection.execute("PRAGMA database_list").fetchone()[2] == str(path):
            connection.execute("PRAGMA synchronous=NORMAL")

    if not event.contains(Engine, "connect", LOCAL_STORES.setdefault(str(path), unsynced)):
        event.listen(Engine, "connect", LOCAL_STORES[str(path)])


LOCAL_STORES = {}  # path -> its connections' set-up, listened to once per process


def experiment_id(client, name: str, artifacts: str = None) -> str:
    """The experiment's id, made where it is missing (a sweep's workers may race to make it: the loser reads it)."""
    from mlflow.exceptions import MlflowException

    from dpgrid import DpgridError

    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name, artifact_location=artifacts)
        except MlflowException:
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if found.lifecycle_stage != "active":
        raise DpgridError(f"tracker.experiment={name} is deleted in MLflow: restore it (mlflow experiments restore) or "
                          "choose another name")
    return found.experiment_id


def search(client, experiment: str, where: str) -> list:
    """Every active run of the experiment that `where` selects, latest first."""
    found, token = [], None
    while True:
        page = client.search_runs([experiment], where, max_results=1000, order_by=["attributes.start_time DESC"],
                                  page_token=token)
        found += list(page)
        token = page.token
        if not token:
            return found


def process_tags(holder: dict = None) -> dict:
    """The tags that say which process holds a run (`holder`: dpgrid.tracking.holder()'s, else this process's)."""
    from dpgrid.tracking import holder as this_process

    holder = holder or this_process()
    return {HOST: holder["host"], PROCESS: f"{holder['pid']}:{holder['start']}"}


def end_orphans(client, experiment: str) -> None:
    """Runs this host's processes left RUNNING when they died (kill -9 of a grid and its worker): ended FAILED."""
    from dpgrid.tracking import alive

    host = socket.gethostname()
    for run in search(client, experiment, f"attributes.status = '{RUNNING}' and tags.`{HOST}` = '{host}'"):
        pid, _, start = run.data.tags.get(PROCESS, "").partition(":")
        if pid.isdigit() and not alive(int(pid), start):
            client.set_terminated(run.info.run_id, FAILED)


def end_with_children(client, experiment: str, run_id: str) -> None:
    for child in search(client, experiment, f"tags.`{PARENT}` = '{run_id}' and attributes.status = '{RUNNING}'"):
        client.set_terminated(child.info.run_id, FAILED)
    client.set_terminated(run_id, FAILED)


class Patient:
    """MlflowClient whose calls wait while a local sqlite store is locked by another process's write (a sweep's
    workers on one machine), for up to LOCKED_WAIT_S."""

    def __init__(self, client):
        self.client = client

    def __getattr__(self, name: str):
        method = getattr(self.client, name)

        def call(*args, **kwargs):
            deadline, pause = time.monotonic() + LOCKED_WAIT_S, 0.05
            while True:
                try:
                    return method(*args, **kwargs)
                except Exception as e:  # noqa: BLE001  (sqlalchemy's OperationalError, as MLflow wraps it)
                    if "database is locked" not in str(e) or time.monotonic() > deadline:
                        raise
                    time.sleep(pause)
                    pause = min(1.0, pause * 2)
        return call
