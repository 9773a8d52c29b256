"""DDP that keeps training when a replica group dies: ``strategy="ddp_ft"``, on torchft.

The job is made of **replica groups**, each a normal tandem DDP job (one or more processes, started by tandem's
launcher or torchrun, under a restart loop of its own), and a **lighthouse** that holds the quorum. The groups
all-reduce their gradients over torchft's fault-tolerant process group; when one dies (SIGKILL, OOM, a lost node) the
others go on at the next step with the groups that remain, and when it is started again it takes the current state
from a healthy group and joins the next step. Nothing restarts from a checkpoint, and no healthy group stops.

What tandem promises, and how it holds under ``ddp_ft``:

- **every sample once an epoch**: each step's global batch (``NUM_REPLICA_GROUPS x processes x batch_size`` items of
  tandem's epoch order) is shared by the groups that take part in it, decided after the step's quorum; a step a group
  left in the middle of is run again (`step_shares`, `tandem.trainer.step_retry`);
- **a joining group continues the run**: it takes a healthy group's whole live state (weights, optimizers,
  schedulers, the loop's place in the epoch, logged sums, callbacks), so its steps, logs and checkpoints continue the
  run's (`replica_groups`);
- ``self.log(..., sync_dist=True)`` reduces over the current quorum (within the group first);
- **checkpoints** are built by every group and written by the first group of the current quorum (give the groups one
  ``ModelCheckpoint(dirpath=...)``; their loggers each their own folder);
- tandem's collective check, hang watch and replica check stay within each group, where a dead rank is a real fault:
  a group that loses a rank stops, and its restart joins again. A group leaving is a membership change, not an error.

Each group evaluates its validation data in full (split over its own processes), on weights equal to every other's.
Needs: automatic optimization, a map-style training DataLoader that tandem orders (shuffle=True or False), no
DataLoader workers for training, ``accumulate_grad_batches=1``. Run it on one machine with
``python -m tandem.strategies.ft_launch --groups 2 train.py`` (`tandem.strategies.ft_launch`).
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import torch
from torch.optim import Optimizer
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from tandem.strategies.ddp import DDPStrategy
from tandem.strategies.environments.cluster_environment import ClusterEnvironment
from tandem.strategies.environments.replica_group import ReplicaGroupEnvironment
from tandem.strategies.precision import Precision
from tandem.strategies.registry import register_strategy
from tandem.strategies.replica_groups import (
    FaultToleranceOptions,
    ReplicaGroups,
    all_reduce_gradients,
    require_torchft,
)
from tandem.strategies.samplers import GlobalOrderSampler
from tandem.strategies.step_shares import StepShares
from tandem.utilities.data import InOrderSampler, is_iterable_style, rebuild_dataloader
from tandem.utilities.exceptions import StepNotCommitted, TandemConfigError, incompatible, out_of_range
from tandem.utilities.seed import global_seed


class DDPFTStrategy(DDPStrategy):
    """DDP within each replica group, torchft between the groups (see the module's docstring).

    Args:
        lighthouse: the lighthouse's address; None reads ``TORCHFT_LIGHTHOUSE``.
        replica_group_id: this group's id, 0 .. ``num_replica_groups`` - 1; None reads ``REPLICA_GROUP_ID`` (else 0).
        num_replica_groups: the most groups the job has (each step's data is that many shares); None reads
            ``NUM_REPLICA_GROUPS`` (else 1).
        min_replicas: the fewest groups a step commits with; keep it the lighthouse's ``--min_replicas`` (which makes
            a quorum wait for that many), or a smaller quorum forms and fails every step until more groups join.
        step_timeout: how long a step's all-reduce between the groups, its commit and a joining group's transfer of
            the state may take (torchft's ``timeout``).
        quorum_timeout: how long a quorum may take to form.
        connect_timeout: how long reaching the lighthouse and the other groups' managers may take.
        max_retries: steps in a row that may fail to commit before the fit fails (None: no limit).
        use_distributed_sampler: must stay True (None: the Trainer's): ddp_ft orders and shares the training data.
        devices: as [`DDPStrategy`][tandem.strategies.DDPStrategy]'s, within the group; so are `precision`,
            `process_group_backend`, `timeout`, `sync_batchnorm`, `cluster_environment`, `collective_check_timeout` and
            `hang_timeout` (``hang_timeout`` must be longer than ``quorum_timeout`` + ``step_timeout``: a wait for the
            other groups is bounded by those).

    Example:
        ```python
        # started with: python -m tandem.strategies.ft_launch --groups 2 train.py
        trainer = Trainer(strategy="ddp_ft", accelerator="cpu", devices=1, max_epochs=2)
        ```
    """

    name = "ddp_ft"
    replica_groups: ReplicaGroups
    supports_manual_optimization = False  # one quorum and one commit per step: the Trainer steps
    supports_compile = False

    def __init__(
        self,
        devices: list[torch.device] | None = None,
        precision: str | Precision | None = None,
        *,
        lighthouse: str | None = None,
        replica_group_id: int | None = None,
        num_replica_groups: int | None = None,
        min_replicas: int = 1,
        step_timeout: datetime.timedelta = datetime.timedelta(seconds=60),
        quorum_timeout: datetime.timedelta = datetime.timedelta(seconds=60),
        connect_timeout: datetime.timedelta = datetime.timedelta(seconds=60),
        max_retries: int | None = None,
        process_group_backend: str | None = None,
        timeout: datetime.timedelta = datetime.timedelta(minutes=30),
        sync_batchnorm: bool | None = None,
        use_distributed_sampler: bool | None = None,
        collective_check_timeout: datetime.timedelta | None = datetime.timedelta(seconds=60),
        hang_timeout: datetime.timedelta | None = datetime.timedelta(minutes=5),
        cluster_environment: ClusterEnvironment | None = None,
    ) -> None:
        require_torchft("strategy='ddp_ft'")
        for what, value in (("step_timeout", step_timeout), ("quorum_timeout", quorum_timeout)):
            if not isinstance(value, datetime.timedelta) or value.total_seconds() <= 0:
                raise out_of_range(what, value, "a positive datetime.timedelta, e.g. timedelta(seconds=60)")
        if not isinstance(connect_timeout, datetime.timedelta) or connect_timeout.total_seconds() <= 0:
            raise out_of_range("connect_timeout", connect_timeout, "a positive datetime.timedelta")
        if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 1:
            raise out_of_range("min_replicas", min_replicas, "an int >= 1")
        if max_retries is not None and (isinstance(max_retries, bool) or not isinstance(max_retries, int)):
            raise out_of_range("max_retries", max_retries, "an int >= 0, or None for no limit")
        for name, number in (("replica_group_id", replica_group_id), ("num_replica_groups", num_replica_groups)):
            if number is not None and (isinstance(number, bool) or not isinstance(number, int) or number < 0):
                raise out_of_range(name, number, "an int >= 0, or None to read it from the environment")
        waits = quorum_timeout + step_timeout
        if hang_timeout is not None and isinstance(hang_timeout, datetime.timedelta) and hang_timeout <= waits:
            raise incompatible(
                f"DDPFTStrategy(hang_timeout={hang_timeout}) with quorum_timeout + step_timeout = {waits}",
                "a wait for the other replica groups (a quorum, a step's all-reduce) may last that long, and the hang "
                "watch would report it as a hang",
                "Give a hang_timeout longer than quorum_timeout + step_timeout, or None to turn the watch off.",
            )
        self.replica_groups = ReplicaGroups()
        super().__init__(
            devices=devices,
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,
            find_unused_parameters=True,  # as torchft's DDP: DDP never rebuilds its buckets, so every group's match
            ddp_comm_hook=all_reduce_gradients,
            ddp_comm_state=self.replica_groups,
            sync_batchnorm=sync_batchnorm,
            use_distributed_sampler=use_distributed_sampler,
            collective_check_timeout=collective_check_timeout,
            hang_timeout=hang_timeout,
            cluster_environment=cluster_environment,
        )
        self.lighthouse, self.replica_group_id, self.num_replica_groups = (
            lighthouse,
            replica_group_id,
            num_replica_groups,
        )
        self.min_replicas, self.max_retries = min_replicas, max_retries
        self.step_timeout, self.quorum_timeout, self.connect_timeout = step_timeout, quorum_timeout, connect_timeout

    def fault_tolerance_options(self) -> FaultToleranceOptions:
        """The options, completed from torchft's environment variables (`ReplicaGroupEnvironment`)."""
        env = ReplicaGroupEnvironment()
        lighthouse = self.lighthouse or env.lighthouse
        if lighthouse is None:
            raise TandemConfigError(
                "strategy='ddp_ft' needs the lighthouse's address: none was given and TORCHFT_LIGHTHOUSE is not set. "
                "Start the job with python -m tandem.strategies.ft_launch --groups N train.py (it starts a lighthouse "
                "and sets it), or pass DDPFTStrategy(lighthouse='http://host:29510') to a lighthouse you started "
                "(torchft_lighthouse --min_replicas 1)."
            )
        group_id = self.replica_group_id if self.replica_group_id is not None else env.group_id
        groups = self.num_replica_groups if self.num_replica_groups is not None else env.num_groups
        if not 0 <= group_id < groups:
            raise out_of_range(
                "the replica group id",
                group_id,
                f"0 .. {groups - 1} (NUM_REPLICA_GROUPS / num_replica_groups is {groups})",
                "Set REPLICA_GROUP_ID and NUM_REPLICA_GROUPS for every group (the launch command does), or pass "
                "DDPFTStrategy(replica_group_id=..., num_replica_groups=...).",
            )
        return FaultToleranceOptions(
            lighthouse,
            group_id,
            groups,
            self.min_replicas,
            self.step_timeout,
            self.quorum_timeout,
            self.connect_timeout,
            self.max_retries,
        )

    # ------------------------------------------------------------------ set-up
    def setup_environment(self) -> None:
        """Join the group's own process group (as ``ddp``), then the other groups through torchft (once a process)."""
        options = self.fault_tolerance_options()  # checked before any process group is joined
        super().setup_environment()
        if not self.replica_groups.connected:
            environment = self.environment
            store = (environment.main_address, environment.main_port)
            self.replica_groups.connect(options, store, self.global_rank, self.world_size)

    def teardown(self) -> None:
        """Drop the wrapper and leave the other groups (a later fit joins again)."""
        super().teardown()
        self.replica_groups.disconnect()

    # ------------------------------------------------------------------ data
    def _process_dataloader(self, dataloader: DataLoader, stage: str) -> DataLoader:
        """The training loader draws each step's share of this rank (`StepShares`); evaluation loaders are
        split over the group's processes, as under ``ddp`` (every group evaluates all of its data)."""
        if stage != "fit":
            return super()._process_dataloader(dataloader, stage)
        loader = _check_training_loader(dataloader, self.use_distributed_sampler)
        order = GlobalOrderSampler(
            loader.dataset,
            num_replicas=1,
            rank=0,
            shuffle=type(loader.sampler) is RandomSampler,
            seed=self.broadcast(global_seed()),  # rank 0's; a joining group takes the run's from its state
        )
        groups = self.replica_groups
        assert groups.options is not None and loader.batch_size is not None
        shares = StepShares(
            order,
            loader.batch_size,
            groups.options.num_groups,
            self.world_size,
            self.global_rank,
            groups.begin_step,
            loader.drop_last,
        )
        processed = rebuild_dataloader(loader, batch_sampler=shares)
        groups.shares, groups.loader = shares, processed
        return processed

    # ------------------------------------------------------------------ steps
    def optimizer_step(self, optimizer: Optimizer, closure: Any = None, **kwargs: Any) -> bool:
        """Step only when every group of the quorum committed the step (after its backward, whose all-reduce a
        group that left makes fail); otherwise clear the gradients and raise
        `StepNotCommitted`: the loop runs the step again."""
        if closure is not None:  # the module's optimizer_step passes the forward and backward in: run them first
            closure()
        if not self.replica_groups.commit():
            optimizer.zero_grad(set_to_none=True)
            raise StepNotCommitted("a replica group left during the step; it runs again under the next quorum")
        return self.precision.optimizer_step(optimizer, None, **kwargs)

    # ------------------------------------------------------------------ collectives
    def _reduce_if_agreed(
        self, layout: int, flags: torch.Tensor, sums: torch.Tensor, maxes: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Within the group (as ``ddp``), then, once the group trains, over the quorum's groups: the layouts
        agreed on by a max all-reduce, then the sums and maxima. A group that left during it: this group's values."""
        local = super()._reduce_if_agreed(layout, flags, sums, maxes)
        groups = self.replica_groups
        if not groups.crossing:
            return local
        agreed = local is not None
        flags, sums, maxes = local if local is not None else (flags, sums, maxes)
        mine = [layout, sums.numel(), maxes.numel(), int(agreed)]
        mine += [~n for n in mine]  # the smallest of each comes back with the largest
        first = torch.cat([torch.tensor(mine, dtype=torch.int64), flags.to(torch.int64)])
        if not groups.all_reduce(first, "max"):
            return local
        if local is None or first[: len(mine)].tolist() != mine:  # some rank packed otherwise: alike everywhere
            return None
        sums, maxes = sums.to(torch.float64, copy=True), maxes.to(torch.float64, copy=True)
        for values, op in ((sums, "sum"), (maxes, "max")):
            if values.numel() and not groups.all_reduce(values, op):
                return local
        return first[len(mine) :], sums, maxes

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path) -> None:
        """Written by the first group of the current quorum (every group built it: they hold the same state)."""
        if self.replica_groups.first_in_quorum:
            super().save_checkpoint(checkpoint, path)

    def remove_checkpoint(self, path: str | Path) -> None:
        if self.replica_groups.first_in_quorum:
            super().remove_checkpoint(path)


def _check_training_loader(loader: Any, use_distributed_sampler: bool) -> DataLoader:
    """The training loader, if ``ddp_ft`` can share its steps between the groups; an error naming what to change."""
    fix = (
        "ddp_ft shares each step's samples between the replica groups that take part in it, in tandem's order: "
        "give it a torch DataLoader over a map-style dataset with shuffle=True or False (and use_distributed_sampler "
        "left True)"
    )
    if not use_distributed_sampler:
        raise incompatible("strategy='ddp_ft' with use_distributed_sampler=False", "tandem must order the data", fix)
    if not isinstance(loader, DataLoader) or is_iterable_style(loader):
        raise incompatible(
            f"strategy='ddp_ft' with a training loader of type {type(loader).__name__}",
            "an iterable dataset (or a loader that is not a DataLoader) cannot be shared by index",
            fix,
        )
    if type(loader.batch_sampler) is not BatchSampler or type(loader.sampler) not in (
        RandomSampler,
        SequentialSampler,
        InOrderSampler,
    ):
        drawn = type(loader.batch_sampler or loader.sampler).__name__
        raise incompatible(
            f"strategy='ddp_ft' with the training DataLoader's own sampler ({drawn})",
            "a sampler of your own draws an order tandem cannot split by the quorum",
            fix,
        )
    if loader.num_workers > 0:
        raise incompatible(
            f"strategy='ddp_ft' with a training DataLoader of num_workers={loader.num_workers}",
            "workers load batches ahead, before the step's quorum decides whose samples they are",
            "Use num_workers=0 for the training loader (evaluation loaders may keep their workers).",
        )
    return loader


register_strategy(
    "ddp_ft",
    DDPFTStrategy,
    "DDP in replica groups that keep training when one dies (torchft; pip install 'tandem[ft]')",
)
