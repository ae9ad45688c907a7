"""An example metrics exporter for MLflow (torchjob.trainer.exporters.Exporter): rank 0 logs
each record's values as MLflow metrics at its step, and the trainer's options as parameters.
Not a dependency: mlflow is imported when the exporter starts, on the workers. Use it with
``exporters: [torchjob.jobs.examples.mlflow_exporter:MLflowExporter]`` (where the workers can
import it: a checkout or an image that holds it) and MLflow's usual MLFLOW_TRACKING_URI env.
"""

from __future__ import annotations

import os
from typing import Any

from torchjob.trainer.exporters import Run, scalars


class MLflowExporter:
    def __init__(self) -> None:
        self.mlflow: Any = None

    def start(self, run: Run) -> None:
        try:
            import mlflow
        except ImportError:
            raise ImportError("the MLflow exporter needs mlflow: pip install mlflow") from None
        self.mlflow = mlflow
        mlflow.start_run(run_name=run.run_id or os.path.basename(run.run_dir))
        mlflow.log_params({key: value for key, value in run.config.items() if value != ""})

    def record(self, record: dict[str, Any]) -> None:
        values = {tag.replace("/", "_"): value for tag, value in scalars(record).items()}
        self.mlflow.log_metrics(values, step=record["step"])

    def close(self) -> None:
        if self.mlflow is not None:
            self.mlflow.end_run()
            self.mlflow = None
