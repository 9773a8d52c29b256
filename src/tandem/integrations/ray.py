"""Ray Train: report tandem's metrics and checkpoints to Ray.

Ray's ``TorchTrainer`` starts the workers and initialises the process group; ``strategy="ddp"`` joins that
group (devices = workers per node, num_nodes = nodes) and never destroys it. Add
[`RayTrainReportCallback`][tandem.integrations.ray.RayTrainReportCallback] so that Ray sees the metrics and checkpoints
(its ``Result``, Ray Tune).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from tandem.callbacks.callback import Callback


class RayTrainReportCallback(Callback):
    """At the end of each training epoch (after its validation), report ``trainer.callback_metrics`` (plus
    ``epoch`` and ``step``) and a checkpoint to Ray Train with ``ray.train.report``. Every rank reports (Ray
    expects it); rank 0 attaches the checkpoint, a directory holding ``checkpoint.ckpt``.

    Example:
        ```python
        def train_loop_per_worker(config):
            trainer = Trainer(strategy="ddp", devices=2, callbacks=[RayTrainReportCallback()])
            trainer.fit(model, loader)

        TorchTrainer(train_loop_per_worker, scaling_config=ScalingConfig(num_workers=2)).fit()
        ```
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        import ray.train

        metrics = {name: float(value) for name, value in trainer.callback_metrics.items() if value.numel() == 1}
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step)
        folder = tempfile.mkdtemp(prefix="tandem-ray-")
        try:
            path = os.path.join(folder, self.CHECKPOINT_NAME)
            trainer.save_checkpoint(path)  # every rank builds the state; rank 0 writes it
            checkpoint = ray.train.Checkpoint.from_directory(folder) if trainer.is_global_zero else None
            ray.train.report(metrics, checkpoint=checkpoint)  # Ray copies the folder to its storage here
        finally:
            shutil.rmtree(folder, ignore_errors=True)
