"""A ``Trainer(strategy="ddp")`` fit, started however the test chooses: tandem's own launcher, torchrun
(one node or two), or a simulated srun. Each rank writes what it saw to ``--out``.

Modes:
    fit       train 12 steps; each rank saves rank{global_rank}.pt (weights, ranks, environment, threads)
    crash     rank --crash-rank raises at step 3 (-1: every rank); each rank first writes its pid to pid{rank}; what
              fit raised goes to raised{rank}, and its finally block writes finally{rank}; rank 0 writes how the ranks
              it started ended to ended0
    exit1     rank 1 calls sys.exit(0) at step 3, while rank 0 goes on into the step's gradient all-reduce
    short1    rank 1 has max_epochs=1: its fit returns and its script ends while rank 0 trains on into epoch 1
    gather0   rank 0 alone calls self.all_gather at step 3 (the collective check's stall timeout is 2 s)
    wait      after 2 steps each rank writes its pid to ready{rank}, then trains slowly until a signal ends it;
              rank 0 writes how the ranks it started ended to ended0
    spin      as wait, at full speed (most of each step inside torch's backward and collectives)
    barrier0  rank 0 alone calls torch.distributed.barrier() in on_train_epoch_end (a user's collective on one
              rank); the collective check's stall timeout is 3 s
    restart   fit(ckpt_path="last") with a step ModelCheckpoint in the default run folder; on the first attempt
              (no marker file yet) rank 1 SIGKILLs itself after step 7; then like fit
    late      rank 1 sleeps before fit, so rank 0 waits for it in init_process_group until --timeout seconds
    save0     rank 0 alone calls trainer.save_checkpoint at step 3 (under is_global_zero, the classic mistake);
              the collective check's stall timeout is 3 s
    test0     after the fit, rank 0 alone calls trainer.test; rank 1's script ends
    test0_validate1  after the fit, rank 0 calls trainer.test while rank 1 calls trainer.validate
    slow_exit1  rank 1 raises ValueError("bad sample in rank 1") in on_train_epoch_end, where rank 0 goes on into the
              epoch end's checked collective; its script's exit then takes 8 s more (an atexit handler), so its process
              is still running when rank 0 learns of the failure
    none1     rank 1's training_step returns None at batch 1 while rank 0 runs backward (a skip on one rank only)
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import tandem
from tandem.callbacks.model_checkpoint import ModelCheckpoint
from tandem.strategies.ddp import DDPStrategy
from tandem.strategies.launchers import script as script_launcher

STEPS = 12  # 8 batches per rank and epoch: the fit crosses an epoch boundary
MODE = ""


class Classifier(tandem.TrainingModule):
    """Dropout, Adam and a shuffled loader: exact resume needs the RNG states and the sampler's order."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.2), nn.ReLU(), nn.Linear(16, 3))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        if MODE == "none1" and self.trainer.global_rank == 1 and batch_idx == 1:
            return None  # the mistake: a skip on one rank only
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self.test_step(batch, batch_idx)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("loss", F.cross_entropy(self.net(x), y), sync_dist=True)

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if MODE == "gather0" and self.trainer.global_step == 3 and self.trainer.is_global_zero:
            self.all_gather(torch.ones(1))  # the mistake: a collective on one rank

    def on_train_epoch_end(self) -> None:
        if MODE == "barrier0" and self.trainer.is_global_zero:
            dist.barrier()  # the mistake: a collective on one rank
        if MODE == "slow_exit1" and self.trainer.global_rank == 1:
            raise ValueError("bad sample in rank 1")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.01)


class Probe(tandem.Callback):
    """Records the step the fit started from; writes pid files; crashes, sleeps or dies where asked."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.out = Path(args.out)
        self.start_step = -1

    def on_train_start(self, trainer: tandem.Trainer, module: tandem.TrainingModule) -> None:
        self.start_step = trainer.global_step
        (self.out / f"pid{trainer.global_rank}").write_text(str(os.getpid()))

    def on_train_batch_start(self, trainer: tandem.Trainer, module: tandem.TrainingModule, batch, batch_idx) -> None:
        if self.args.mode == "crash" and trainer.global_step == 3 and self.args.crash_rank in (trainer.global_rank, -1):
            raise RuntimeError(f"boom at step 3 on rank {trainer.global_rank}" if self.args.crash_rank >= 0 else "boom")
        if self.args.mode == "exit1" and trainer.global_step == 3 and trainer.global_rank == 1:
            sys.exit(0)  # the mistake: this rank's script ends while the others train

    def on_train_batch_end(
        self, trainer: tandem.Trainer, module: tandem.TrainingModule, outputs, batch, batch_idx
    ) -> None:
        if self.args.mode == "save0" and trainer.global_step == 3 and trainer.is_global_zero:
            trainer.save_checkpoint(self.out / "mistake.ckpt")  # every rank must call it
        if self.args.mode in ("wait", "spin"):
            if trainer.global_step == 2:
                (self.out / f"ready{trainer.global_rank}").write_text(str(os.getpid()))
            if self.args.mode == "wait":
                time.sleep(0.05)
        marker = self.out / "killed"  # the first attempt only: torchrun restarts every worker
        if (
            self.args.mode == "restart"
            and trainer.global_step == 7
            and trainer.global_rank == 1
            and not marker.exists()
        ):
            marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


def data() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = ((x[:, 0] > 0).long() + (x[:, 1] > 0).long()) % 3
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True)


def main(args: argparse.Namespace) -> None:
    out = Path(args.out)
    if args.mode == "late" and os.environ.get("LOCAL_RANK") == "1":
        time.sleep(120)  # never joins: rank 0's init_process_group times out first
    if args.mode == "slow_exit1" and os.environ.get("LOCAL_RANK") == "1":
        atexit.register(time.sleep, 8)  # registered first, so it runs last: after tandem's own exit handlers
    tandem.seed_everything(7)
    strategy = DDPStrategy(timeout=datetime.timedelta(seconds=args.timeout)) if args.timeout else "ddp"
    if args.mode in ("save0", "gather0", "barrier0"):
        strategy = DDPStrategy(collective_check_timeout=datetime.timedelta(seconds=2 if args.mode == "gather0" else 3))
    steps = args.steps if args.mode not in ("wait", "spin") else 100_000
    epochs = 1 if args.mode == "short1" and int(os.environ.get("RANK", "0")) == 1 else None  # the mistake: a limit
    root = out / f"root-{datetime.datetime.now():%H%M%S%f}" if args.per_rank_root else out  # differs per rank
    probe = Probe(args)
    callbacks: list[tandem.Callback] = [probe]
    if args.mode == "restart":  # the recipe in README: torchrun --max-restarts=N, ckpt_path="last"
        callbacks.append(ModelCheckpoint(every_n_train_steps=2, save_last=True, save_top_k=0))
    trainer = tandem.Trainer(
        accelerator="cpu",
        strategy=strategy,
        devices=args.devices,
        num_nodes=args.num_nodes,
        max_steps=steps,
        max_epochs=epochs,
        callbacks=callbacks,
        default_root_dir=root,
        logger=args.mode == "restart" or args.per_rank_root,
        enable_checkpointing=args.mode == "restart" or args.per_rank_root,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(Classifier(), data(), ckpt_path="last" if args.mode == "restart" else None)
    except BaseException as err:
        (out / f"raised{trainer.global_rank}").write_text(f"{type(err).__name__}: {err}")
        if script_launcher.processes_started():  # how the ranks it started ended: a teardown ends them at once
            children = script_launcher._WATCHDOG.children
            (out / "ended0").write_text(repr([child.proc.returncode for child in children]))
        raise
    finally:
        (out / f"finally{trainer.global_rank}").write_text("ran")
    if args.mode in ("test0", "test0_validate1"):
        (out / f"fitted{trainer.global_rank}").write_text(str(os.getpid()))
        if trainer.is_global_zero:
            trainer.test(Classifier(), data())  # the mistake: every rank must call it
        elif args.mode == "test0_validate1":
            trainer.validate(Classifier(), data())
    # code after fit runs on every rank: each writes its own file
    result = {
        "weights": {k: v.clone() for k, v in trainer.training_module.state_dict().items()},
        "global_rank": trainer.global_rank,
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "world_size": trainer.world_size,
        "global_step": trainer.global_step,
        "start_step": probe.start_step,
        "environment": type(trainer.strategy.environment).__name__,
        "started_ranks": script_launcher.processes_started(),
        "launcher": type(trainer.strategy.launcher).__name__,
        "threads": torch.get_num_threads(),
        "restart_count": os.environ.get("TORCHELASTIC_RESTART_COUNT"),
        "last_ckpt": trainer.checkpoint_callback.last_model_path if trainer.checkpoint_callback else None,
        "ckpt_dir": trainer.checkpoint_callback.dirpath if trainer.checkpoint_callback else None,
        "log_dir": trainer.log_dir,
        "default_root_dir": trainer.default_root_dir,
    }
    torch.save(result, out / f"rank{trainer.global_rank}.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "mode",
        choices=[
            "fit",
            "crash",
            "wait",
            "restart",
            "late",
            "save0",
            "test0",
            "test0_validate1",
            "exit1",
            "short1",
            "gather0",
            "spin",
            "barrier0",
            "slow_exit1",
            "none1",
        ],
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--crash-rank", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=0.0, help="process-group timeout in seconds (0: default)")
    parser.add_argument("--per-rank-root", action="store_true", help="default_root_dir from each rank's clock")
    arguments = parser.parse_args()
    MODE = arguments.mode
    main(arguments)
    sys.exit(0)
