"""The trackers: one small class each, `write(version, scalars)`, `flush()`, `close()`. The x axis is
the policy version everywhere (wandb: a `version` step metric, since events of older versions may
arrive after newer ones and wandb's own step must only grow)."""

from __future__ import annotations

import os
import time
from pathlib import Path


class TensorBoardWriter:
    """Event files under `dir` (`tensorboard --logdir DIR`), written with tensorboard's own event-file
    writer: one event per `write` holding all its scalars (float32 scalar tensors, the scalars plugin's
    format), with a tag's metadata on its first value only. tensorboard's `Writer.add_scalar` writes one
    event per scalar with its metadata every time: on the demo's 8 versions a second, a third of the
    tracker's CPU in a profile (bench/tracking.py); 13x less per scalar this way."""

    def __init__(self, dir: Path, run: str, **_):
        from tensorboard.compat.proto import summary_pb2
        from tensorboard.plugins.scalar import metadata
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.path = Path(dir) / run
        self.path.mkdir(parents=True, exist_ok=True)
        self._w = EventFileWriter(str(self.path))
        self._meta = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=metadata.PLUGIN_NAME),
            data_class=summary_pb2.DataClass.DATA_CLASS_SCALAR)
        self._tagged: set[str] = set()

    def write(self, version: int, scalars: dict[str, float]) -> None:
        from tensorboard.compat.proto import event_pb2, tensor_pb2, types_pb2

        ev = event_pb2.Event(wall_time=time.time(), step=int(version))
        for k, v in scalars.items():
            value = ev.summary.value.add(tag=k, tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT,
                                                                              float_val=[float(v)]))
            if k not in self._tagged:
                value.metadata.CopyFrom(self._meta)
                self._tagged.add(k)
        self._w.add_event(ev)

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class WandbWriter:
    """A wandb run under `dir` (offline by default: `wandb sync DIR/wandb/offline-run-*` uploads it)."""

    def __init__(self, dir: Path, run: str, project: str = "jetrl", name: str = "", mode: str = "offline",
                 config: dict | None = None, **_):
        import wandb

        Path(dir).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(dir=str(dir), project=project, name=name or run, mode=mode, config=config or {},
                               id=None, reinit="create_new")
        self._run.define_metric("version")
        self._run.define_metric("*", step_metric="version")
        self.path = Path(self._run.dir).parent

    def write(self, version: int, scalars: dict[str, float]) -> None:
        self._run.log({"version": version, **scalars})

    def flush(self) -> None:
        pass  # wandb's own process writes as it goes

    def close(self) -> None:
        self._run.finish()


class TrackioWriter:
    """A trackio project in a local SQLite database under `dir` (`trackio show` reads it; TRACKIO_DIR is set
    to `dir` before trackio is imported, so one sink process writes one place)."""

    def __init__(self, dir: Path, run: str, project: str = "jetrl", name: str = "", config: dict | None = None, **_):
        Path(dir).mkdir(parents=True, exist_ok=True)
        os.environ["TRACKIO_DIR"] = str(Path(dir).resolve())
        import trackio
        from trackio import utils

        if Path(utils.TRACKIO_DIR).resolve() != Path(dir).resolve():
            raise RuntimeError(f"trackio was imported before its directory was set (it writes to {utils.TRACKIO_DIR},"
                               f" not {dir}): run the trackio sink in its own process (`jetrl track`)")
        self._run = trackio.init(project=project, name=name or run, config=config or {}, embed=False,
                                 auto_log_gpu=False, auto_log_cpu=False)
        self.path = Path(dir)

    def write(self, version: int, scalars: dict[str, float]) -> None:
        self._run.log(dict(scalars), step=version)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._run.finish()


WRITERS = {"tensorboard": TensorBoardWriter, "wandb": WandbWriter, "trackio": TrackioWriter}
