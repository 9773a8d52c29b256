"""Data-parallel training with DDP: one process per device, CPUs (gloo) or GPUs (nccl), one machine or several.

The model and data are examples/digits.py's. This script is rank 0; at ``fit`` tandem starts the other ranks by
running the same command, each trains on its share of every epoch (a DistributedSampler), and backward averages
the gradients, so every rank returns from ``fit`` with the same weights. The script prints what each rank saw.

    python examples/ddp.py --accelerator cpu --devices 2            # two CPU processes over gloo
    python examples/ddp.py --accelerator cuda --devices 4           # four GPUs over nccl
    python examples/ddp.py --accelerator cpu --devices 2 --fast     # a few batches: checks the program runs
    torchrun --nproc-per-node 4 examples/ddp.py --accelerator cuda --devices 4   # torchrun starts the ranks
    srun python examples/ddp.py --accelerator cuda --devices 4 --num-nodes 2     # inside a SLURM allocation
"""

from __future__ import annotations

import argparse

import torch
from digits import DigitsCNN, DigitsData  # examples/digits.py, next to this file

from tandem import Callback, Trainer, seed_everything


class SamplesSeen(Callback):
    """Counts the training samples this rank trains on in each epoch (its share of the data)."""

    def __init__(self) -> None:
        self.per_epoch: list[int] = []

    def on_train_epoch_start(self, trainer, module) -> None:
        self.per_epoch.append(0)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.per_epoch[-1] += len(batch[0])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="auto", help="cpu, cuda (or gpu), or auto")
    parser.add_argument("--devices", type=int, default=2, help="processes per machine: one per GPU, or CPU processes")
    parser.add_argument(
        "--num-nodes", type=int, default=1, help="machines (under torchrun, srun, or MASTER_ADDR/NODE_RANK)"
    )
    parser.add_argument("--max-epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32, help="per process: the global batch is this x processes")
    parser.add_argument("--root-dir", default="runs/ddp")
    parser.add_argument("--fast", action="store_true", help="one epoch of a few batches, to check the program runs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    seed_everything(42)
    seen = SamplesSeen()
    trainer = Trainer(
        strategy="ddp",
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_epochs=1 if args.fast else args.max_epochs,
        limit_train_batches=3 if args.fast else 1.0,
        limit_val_batches=1 if args.fast else 1.0,
        callbacks=[seen],
        default_root_dir=args.root_dir,
        log_every_n_steps=1 if args.fast else 10,
        enable_progress_bar=not args.fast,
    )
    model, data = DigitsCNN(), DigitsData(batch_size=args.batch_size)
    trainer.fit(model, datamodule=data)  # every rank returns from here with the same weights

    # Every rank runs what follows: the collectives (test, all_gather) on all of them, the prints on rank 0 only.
    (results,) = trainer.test(model, datamodule=data, verbose=False)
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum()
    checksums = trainer.strategy.all_gather(checksum.to(trainer.strategy.root_device))
    samples = trainer.strategy.all_gather(torch.tensor(seen.per_epoch[0], device=trainer.strategy.root_device))
    if trainer.is_global_zero:
        print(
            f"world size: {trainer.world_size} ({trainer.strategy.root_device.type}, {trainer.strategy.process_group_backend})"
        )
        print(f"training samples in the first epoch, per rank: {samples.tolist()}")
        print(f"replicas equal after fit: {bool((checksums == checksums[0]).all())}")
        print(f"test accuracy: {results['test_acc']:.4f}")
        print(f"logs and checkpoints: {trainer.log_dir}")
        if args.fast:
            print(
                "--fast is a smoke test (3 batches): it checks that the program runs; the test accuracy means "
                "something after the full run (python examples/ddp.py without --fast, 15 epochs)."
            )


if __name__ == "__main__":
    main()
