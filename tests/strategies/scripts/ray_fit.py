"""The fit of existing_group.py inside Ray Train's TorchTrainer (2 CPU workers, a local Ray instance).

``python ray_fit.py OUT``: each worker fits with Trainer(strategy="ddp", devices=2) in the process group Ray
initialised and saves its weights to OUT/ray_<rank>.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import ray
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

HERE = Path(__file__).resolve().parent


def worker(config: dict) -> None:
    sys.path[:0] = [str(HERE), str(HERE.parents[1])]
    import torch.distributed as dist
    from existing_group import fit

    from tandem.integrations.ray import RayTrainReportCallback

    model = fit(callbacks=[RayTrainReportCallback()])
    torch.save(model.state_dict(), Path(config["out"]) / f"ray_{dist.get_rank()}.pt")


if __name__ == "__main__":
    out = sys.argv[1]
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    trainer = TorchTrainer(
        worker,
        train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(storage_path=str(Path(out) / "ray_results"), name="tandem"),
    )
    result = trainer.fit()
    (Path(out) / "ray_result.txt").write_text(
        f"{sorted(result.metrics)}\n{sorted(os.listdir(result.checkpoint.path)) if result.checkpoint else None}"
    )
    ray.shutdown()
