"""TensorBoard (`tracker=tensorboard`, `pip install "dpgrid[tensorboard]"`): event files under `tracker.dir` (default
<hydra.sweep.dir>/tensorboard), a folder per grid named as its run directory under the outputs, and in it a folder per
configuration and seed: `tensorboard --logdir outputs/tensorboard`.

A grid's folder holds its plan and what it covers (Text), its release and best configuration (Scalars, Text) and an
audit's bound; each run's folder its validations with their steps (Scalars) and its configuration beside its best
value (HParams), written with TensorBoard's own event writer and summaries (no torch, no TensorFlow). A run's folder is written whole under a hidden name and renamed into place: it exists once the run is
logged, so a resumed grid logs the runs whose folder is missing, and a folder a kill left half-written is removed
when its grid starts again (its lock held: no other process writes there).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from dpgrid.tracking import Tracker
from dpgrid.tracking.published import Audit, Grid, Logged, Release, Run

PARTIAL = ".partial-"  # a run's folder while it is written: .seed<s>.partial-<pid>


class TensorboardTracker(Tracker):
    package, extra = "tensorboard", "tensorboard"

    def __init__(self, root, dir: str = None):  # noqa: A002  (the config's key, as lightning-hydra-template names it)
        super().__init__(root)
        self.dir = Path(dir).absolute() if dir else self.root / "tensorboard"
        self.folder = None

    def start_grid(self, grid: Grid, sweep: Path = None) -> Logged:
        self.folder = self.dir / grid.name
        logged = Logged()
        for config in (p for p in self.folder.glob("*") if p.is_dir() and not p.name.startswith(".")):
            for run in config.iterdir():
                if run.name.startswith(".") and PARTIAL in run.name:  # a kill's half-written run
                    shutil.rmtree(run, ignore_errors=True)
                elif run.is_dir() and run.name.startswith("seed") and run.name[4:].isdigit():
                    logged.runs.add((config.name, int(run.name[4:])))
        with writer(self.folder) as w:
            w.add_text("plan", table(grid.params))
            if grid.covers:
                w.add_text("covers", grid.covers)
        return logged

    def log_run(self, run: Run) -> None:
        target = self.folder / run.config_id / f"seed{run.seed}"
        partial = target.parent / f".{target.name}{PARTIAL}{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        with writer(partial) as w:
            for step, values in run.curve:
                for key, value in values.items():
                    w.add_scalar(curve_tag(key), value, step)
            ended = {f"run/{key}": value for key, value in run.values.items()}
            ended["run/diverged"] = float(run.diverged)
            for key, value in ended.items():
                w.add_scalar(key, value, 0)
            w.add_hparams(dict(run.params), ended)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)

    def end_grid(self, status: str, release: Release = None, best: dict = None, seconds: float = None) -> None:
        if self.folder is None:
            return
        with writer(self.folder) as w:
            w.add_text("status", status)
            best = dict(best or {})
            if "config_id" in best:
                w.add_text("best_config", best.pop("config_id"))
            for key, value in best.items():
                w.add_scalar(f"grid/{key}", value, 0)
            if seconds is not None:
                w.add_scalar("grid/seconds", seconds, 0)
            if release is not None:
                for key, value in release.values.items():
                    w.add_scalar(key.replace(".", "/", 1), value, 0)  # release/epsilon: grouped as TensorBoard groups
                w.add_text("release", table({**release.params, "covers": release.covers,
                                              "model": str(release.folder) if release.folder else release.withheld}))

    def log_audit(self, grid: Grid, audit: Audit) -> None:
        with writer(self.dir / grid.name) as w:
            for key, value in audit.values.items():
                w.add_scalar(key.replace(".", "/", 1), value, 0)
            w.add_text("audit", table({**audit.params, **({"mechanism": audit.verdict} if audit.verdict else {})}))


def curve_tag(key: str) -> str:
    """A validation's scalar: test/<metric>, test/loss, and the strategy's state (clip, lr, its own)."""
    return f"test/{key[len('test_'):]}" if key.startswith("test_") else f"state/{key}"


def table(values: dict) -> str:
    """A Markdown table of name and value (TensorBoard's Text tab renders it)."""
    return "| name | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in values.items())


class writer:
    """Events into `folder`, written with TensorBoard's own event-file writer and summaries (no torch, no TensorFlow:
    a third of a second to import), flushed and closed when the block ends."""

    def __init__(self, folder: Path):
        self.folder = folder

    def __enter__(self):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.folder.mkdir(parents=True, exist_ok=True)
        self.events = EventFileWriter(str(self.folder), max_queue_size=10_000, flush_secs=3600)
        return self

    def __exit__(self, *exc):
        self.events.close()

    def add(self, summary, step: int = 0) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        self.events.add_event(Event(wall_time=time.time(), step=int(step), summary=summary))

    def add_scalar(self, tag: str, value: float, step: int = 0) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self.add(Summary(value=[Summary.Value(tag=tag, simple_value=float(value))]), step)

    def add_text(self, tag: str, text: str) -> None:
        """The Text tab's summary (TensorBoard's text plugin: a string tensor)."""
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.compat.proto.types_pb2 import DT_STRING
        from tensorboard.plugins.text.plugin_data_pb2 import TextPluginData

        tensor = TensorProto(dtype=DT_STRING, string_val=[text.encode()],
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        self.add(Summary(value=[Summary.Value(tag=f"{tag}/text_summary", tensor=tensor,
                                              metadata=plugin_metadata("text", TextPluginData(version=0)))]))

    def add_hparams(self, params: dict, metrics) -> None:
        """The HParams tab's three summaries: the experiment (the parameters' names and types, the metrics' tags), the
        session's start (its values) and its end."""
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

        start, infos = plugin_data_pb2.SessionStartInfo(), []
        for key, value in params.items():
            kind = "STRING" if isinstance(value, str) else "BOOL" if isinstance(value, bool) else "FLOAT64"
            field = {"STRING": "string_value", "BOOL": "bool_value", "FLOAT64": "number_value"}[kind]
            setattr(start.hparams[key], field, value if kind != "FLOAT64" else float(value))
            infos.append(api_pb2.HParamInfo(name=key, type=api_pb2.DataType.Value(f"DATA_TYPE_{kind}")))
        tags = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=m)) for m in metrics]
        experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=tags)
        end = plugin_data_pb2.SessionEndInfo(status=api_pb2.Status.Value("STATUS_SUCCESS"))
        version = metadata.PLUGIN_DATA_VERSION
        for tag, content in ((metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=experiment,
                                                                                          version=version)),
                             (metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(
                                 session_start_info=start, version=version)),
                             (metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(
                                 session_end_info=end, version=version))):
            self.add(Summary(value=[Summary.Value(tag=tag, metadata=plugin_metadata(metadata.PLUGIN_NAME, content))]))


def plugin_metadata(name: str, content):
    from tensorboard.compat.proto.summary_pb2 import SummaryMetadata

    data = SummaryMetadata.PluginData(plugin_name=name, content=content.SerializeToString())
    return SummaryMetadata(plugin_data=data)
