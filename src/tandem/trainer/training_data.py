"""The fit loop's state and its training data: the training record, built where Lightning builds its loader and
built again every ``reload_dataloaders_every_n_epochs``; the place in it that checkpoints save (``state_dict``);
and each epoch's batches as the loop reads them (a resume's skip, a rollback's replay, the ranks' agreement on a
loader of unknown length). ``TrainingData`` is the base of the fit loop's classes (see ``tandem.trainer.loops``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tandem.trainer.elastic import continue_from, data_layout, follow_order, order_sampler
from tandem.trainer.optimization.base import Optimization
from tandem.trainer.profiling import TRAIN_NEXT_BATCH, timed_batches
from tandem.trainer.replicas import ReplicaCheck
from tandem.trainer.state import TRAIN, BatchPlan, LoopState, StageData
from tandem.trainer.validation_clock import ValidationClock
from tandem.utilities.data import has_len
from tandem.utilities.exceptions import PossibleUserWarning
from tandem.utilities.rank_zero import rank_zero_warn
from tandem.utilities.seed import capture_rng_state, restore_rng_state

if TYPE_CHECKING:
    from tandem.trainer.evaluation import EvaluationLoop
    from tandem.trainer.loops import LoopContext
    from tandem.trainer.rollback import RollbackRecord


class TrainingData:
    """The fit loop's constructor and state, its training data and its place in them (the base of ``FitLoop``,
    which documents the arguments)."""

    def __init__(
        self, context: LoopContext, evaluation: EvaluationLoop, preempt: Callable[[], None], state: LoopState
    ) -> None:
        self.context, self.evaluation, self._preempt = context, evaluation, preempt
        self.state = state  # also read by the log sink (the loggers' step)
        self.data = StageData(TRAIN)
        self.optimization = Optimization()  # the fit's (set when a fit starts)
        self.batch_transfer: Any = None  # the batch-transfer hooks of the module or DataModule, when overridden
        self.replicas = ReplicaCheck()  # DDP: the ranks' parameters alike, their data not
        self._load: Callable[[], StageData] | None = None  # builds the fit's training record (set per fit)
        self.validates = False  # the fit has validation (data, validation_step, limit_val_batches != 0)
        self._loaded_at: float = -math.inf  # the epoch the training loader was built in (-inf: not yet this fit)
        self._pending_layout: tuple[dict[str, Any], bool] | None = None  # a checkpoint's, until the loader is built
        # the training loader's iterator made where Lightning makes it (with the loader), and the RNG state before
        # it: the first epoch reads it (see _epoch_batches)
        self._early: tuple[Iterator[Any], dict[str, Any]] | None = None
        self._stop_agreed = False  # every process knows that one asked to stop (several processes)
        self.plan = BatchPlan.FULL  # the fit's batch path (composed when a fit starts, see _compose)
        self._store_ready = False  # the training values' store was emptied for the coming epoch
        self.empty_batch: tuple[int, int, int] | None = None  # (rank, epoch, batch_idx) not yet acted on (ddp)
        self._bad: RollbackRecord | None = None  # on_nonfinite="rollback": a publishing check found a bad batch
        self.clock: ValidationClock | None = None  # a time-based val_check_interval's (set per fit); None: off
        # training_step(self, dataloader_iter): the steps take the batches (decided once per fit); steps_done counts
        # the epoch's steps, batches_done the batches they took
        self.steps_take_batches = False
        self.steps_done = 0

    def __getstate__(self) -> dict[str, Any]:  # ddp_spawn pickles the Trainer, which binds ``preempt`` again
        return {**self.__dict__, "_preempt": None, "_load": None, "plan": BatchPlan.FULL}

    # ------------------------------------------------------------------ the training data
    def attach(self, load: Callable[[], StageData], validates: bool) -> None:
        """A fit's source of training data (``load`` builds its record, asking for the loader) and whether it
        validates; nothing is asked for yet."""
        self._load, self.validates = load, validates
        self.data, self._loaded_at, self._pending_layout = StageData(TRAIN), -math.inf, None
        seconds = self.context.config.val_check_time
        self.clock = None if seconds is None else ValidationClock(seconds)

    def detach(self) -> None:
        """The run is over: no loader source (it holds the module) outlives it. ``validates`` stays the latest fit's
        (``trainer.enable_validation``)."""
        self._load = None

    @property
    def needs_training_data(self) -> bool:
        """The fit's training loader has not been asked for yet."""
        return self._load is not None and self._loaded_at == -math.inf

    def load_training(self) -> None:
        """Ask for the training loader where Lightning does: once the sanity check is over (or earlier, for
        ``estimated_stepping_batches``), and again at the start of every ``reload_dataloaders_every_n_epochs``-th
        epoch after the one it was built in."""
        every, epoch = self.context.config.reload_dataloaders_every_n_epochs, self.state.epoch
        if self._load is None or not (self.needs_training_data or every and epoch - self._loaded_at >= every):
            return
        self.reload_training()

    def forget_training(self) -> None:
        """The training loader is asked for again where the fit next needs it (after a search built its own)."""
        if self._load is not None:
            self.data, self._loaded_at, self._early = StageData(TRAIN), -math.inf, None

    def reload_training(self) -> None:
        """Build the training record again now; a resumed run's order (the checkpoint's) carries over."""
        assert self._load is not None
        self.data, self._loaded_at, loop = self._load(), self.state.epoch, self.state
        self._warn_short_epoch()
        if self.clock is not None:  # Lightning's: training starts (again) with its loader, and so does the time
            self.clock.restart()
        if self._pending_layout is not None:  # restored before the loader existed: the checkpoint's place in it
            (saved, announce), self._pending_layout = self._pending_layout, None
            now = self._data_layout()
            if now is not None:
                continue_from(saved, now, loop, self.data, announce)
            return
        if loop.order is not None:  # a resumed run keeps the checkpoint's order
            follow_order(self.data, loop.order)
        # As Lightning: the loader's iterator is made with the loader, before the validation loader is asked for
        # and on_train_start, so that the base seed a DataLoader draws comes at Lightning's point in the RNG
        # sequence. Only the first epoch reads it (a reload's is dropped, as Lightning's); a resumed run's RNG
        # comes back from the checkpoint later, so it makes its iterator then.
        self._early = None
        if self.data.loaders and not (
            loop.batches_done or loop.resume_rng is not None or loop.resume_start is not None
        ):
            rng = capture_rng_state()
            self._early = (iter(self.data.loaders[0]), rng)

    def _warn_short_epoch(self) -> None:
        """Lightning's warning when the loggers would get no training row in an epoch: fewer batches than
        ``log_every_n_steps`` (not under ``fast_dev_run``, nor for an epoch with no batches, which is said apart)."""
        config = self.context.config
        batches = self.data.num_batches[0] if self.data.num_batches else 0
        if self.context.sink.loggers and 0 < batches < config.log_every_n_steps and not config.fast_dev_run:
            rank_zero_warn(
                f"The number of training batches ({batches}) is smaller than the logging interval"
                f" Trainer(log_every_n_steps={config.log_every_n_steps}). Set a lower value for log_every_n_steps if"
                " you want to see logs for the training epoch.",
                category=PossibleUserWarning,
            )

    def bind_preemption_stop(self, preempt: Callable[[], None]) -> None:
        """What to call at the agreed pre-emption stop (the Trainer's save and exit)."""
        self._preempt = preempt

    # ------------------------------------------------------------------ checkpoint state
    def state_dict(self) -> dict[str, Any]:
        """Where training is (``checkpoint["loops"]``), with the data layout that place is counted in. Saved at an
        epoch's end before its schedulers stepped (a checkpoint in ``on_train_epoch_end``), it also records that step
        and the values of the plateau schedulers' monitors, for the resume to take it."""
        state = self.state.state_dict()
        layout = self._data_layout()
        if layout is not None:
            state["data"] = layout
        if self.state.schedulers_pending:
            state["epoch_schedulers"] = self.optimization.monitored_values()
        if self.steps_take_batches:  # the epoch's steps, where they differ from its batches
            state["steps_done"] = self.steps_done
        return state

    def _data_layout(self) -> dict[str, Any] | None:
        accumulate = self.context.config.accumulate_grad_batches
        return data_layout(self.data, self.context.strategy.world_size, accumulate)

    def load_state_dict(
        self,
        state: dict[str, Any],
        train_metrics: dict[str, Any] | None = None,
        rng: dict[str, Any] | None = None,
        announce: bool = True,
    ) -> None:
        """Continue from ``state``; a mid-epoch one also gets back the epoch's partial metric sums and, where
        the loop reaches the point they belong to, the RNG states. ``announce=False``: a search's trial coming back
        to where it started, not a resume (no lines about another data layout)."""
        loop = self.state
        loop.load_state_dict(state)
        loop.resume_train_metrics = train_metrics if loop.batches_done else None
        loop.resume_rng = rng
        loop.resume_schedulers = state.get("epoch_schedulers")
        self.steps_done = state.get("steps_done", loop.batches_done)
        now = self._data_layout()
        if "data" in state and now is not None:  # another device count or batch size: the same place
            continue_from(state["data"], now, loop, self.data, announce)
        elif "data" in state and self._load is not None:  # the loader is asked for later: its place then
            self._pending_layout = (state["data"], announce)

    def _read_batches(self, batches: Iterator[Any], loader: Any) -> Iterator[Any]:
        """The epoch's batches as the loop reads them: timed when profiling, and, for a loader of unknown length
        whose steps are collectives or accumulate, or whose epoch has no limit, agreed batch by batch, and read one
        batch ahead where the epoch's length is unknown (``_agreed_batches``). That is Lightning's order: it
        reads batch ``i + 1`` before ``training_step`` runs on batch ``i`` when the length is unknown, and never
        reads ahead when it is known (a sized loader, or a ``limit_train_batches`` count), so a dataset whose items
        depend on the training state (episodes played with the current policy) yields the same sequence."""
        context = self.context
        if context.profiler is not None:
            batches = timed_batches(batches, context.profiler, TRAIN_NEXT_BATCH)
        several = context.strategy.world_size > 1  # only then is there a collective per step
        limit = self.data.num_batches[0]
        if (several or context.config.accumulate_grad_batches > 1 or limit == math.inf) and not has_len(loader):
            batches = self._agreed_batches(batches, limit)
        return batches

    # ------------------------------------------------------------------ the epoch's batches
    def _epoch_batches(self, replay: bool = False) -> Iterator[Any]:
        """The epoch's batches. A mid-epoch resume replays the order from the epoch's recorded RNG state and
        skips the done batches' indices without loading them; so does a ``replay`` after a rollback (then from
        any point of the epoch, its start included)."""
        loop, loader = self.state, self.data.loaders[0]
        skip = loop.batches_done
        if loop.resume_start is not None and not replay:  # an elastic resume begins inside one of this run's batches
            sampler = order_sampler(self.data)
            assert sampler is not None  # elastic.continue_from starts inside a batch only through a global-order one
            sampler.start, loop.resume_start, skip = loop.resume_start, None, 0
            replay = True  # the epoch's RNG replayed all the same
        early, self._early = self._early, None
        if not skip and not replay:
            if early is not None and loop.epoch == 0:  # made with the loader (Lightning's first epoch)
                iterator, loop.epoch_start_rng = early
                loop.epoch_order_rng = capture_rng_state()  # where the epoch's order is drawn, for a replay
                return iterator
            loop.epoch_start_rng, loop.epoch_order_rng = capture_rng_state(), None
            return iter(loader)
        skippable = self.data.skippable
        if skippable is None:
            if replay:  # read again from the start: the same sequence if the dataset yields it again
                if loop.epoch_start_rng is not None:
                    restore_rng_state(loop.epoch_start_rng)
            else:
                rank_zero_warn(
                    f"Resuming in the middle of an epoch from a dataloader that cannot skip ahead (an iterable "
                    f"dataset or a custom loader): tandem reads and discards its first {skip} batches to continue "
                    "where the checkpoint stopped. The order matches only if the dataset yields the same sequence "
                    "each time."
                )
            iterator = iter(loader)
            if loop.epoch_order_rng is not None:
                restore_rng_state(loop.epoch_order_rng)
            for _ in range(skip):
                next(iterator, None)
        else:
            if loop.epoch_start_rng is not None:
                restore_rng_state(loop.epoch_start_rng)
            skippable.skip = skip
            iterator = iter(loader)
            if loop.epoch_order_rng is not None:  # the iterator was made earlier than the order was drawn
                restore_rng_state(loop.epoch_order_rng)
            skippable.start()  # draw the epoch's order now, before the checkpoint's RNG state returns
        if loop.resume_rng is not None:
            restore_rng_state(loop.resume_rng)
            loop.resume_rng = None
        return iterator

    def _agreed_batches(self, batches: Iterator[Any], limit: int | float) -> Iterator[Any]:
        """An epoch from a loader of unknown length, read a batch ahead so that the loop knows its last batch (an
        accumulation window cut short steps there, as in Lightning); with a ``limit`` count the last batch is known,
        and each batch is read as its step comes (Lightning's order). When the steps are collectives (several processes), the
        ranks agree on each batch that every one of them has it (one small all-reduce; one process asks nobody),
        so every rank ends the epoch at the same batch, at the same ``global_step``. A rank's batches beyond the
        first one another rank lacks are not trained on."""
        loop, strategy = self.state, self.context.strategy

        def agreed(index: int) -> Any:
            """Batch ``index`` of the epoch if every rank has one, else ``_END`` (on every rank)."""
            if index >= limit:  # the same limit on every rank: no need to ask
                return _END
            batch = next(batches, _END)
            have = strategy.ranks_with_batch(batch is not _END)
            if all(have):
                return batch
            if any(have) and not loop.uneven_warned:
                loop.uneven_warned = True
                _warn_uneven(loop.epoch, index, have)
            return _END

        index = loop.batches_done
        if limit != math.inf:  # a known length (a limit_train_batches count): each batch read as its step comes, as
            while (batch := agreed(index)) is not _END:  # Lightning reads them then; the last one is known already
                yield batch
                index += 1
            return
        batch = agreed(index)
        while batch is not _END:
            following = agreed(index + 1)
            if following is _END:
                loop.epoch_batches = index + 1  # the last batch of the epoch, on every rank
            yield batch
            batch, index = following, index + 1


_END = object()


def _warn_uneven(epoch: int, count: int, have: list[bool]) -> None:
    out = [rank for rank, has in enumerate(have) if not has]
    more = [rank for rank, has in enumerate(have) if has]
    rank_zero_warn(
        "The ranks got different numbers of training batches from a dataloader of unknown length: in epoch "
        f"{epoch}, rank(s) {out} had {count} batches and rank(s) {more} had more. Every rank ends each such "
        f"epoch at the first batch one of them lacks (here after {count}), so all stay at the same global_step; "
        "the other ranks' further batches are not trained on. To train on all of them, give every rank the "
        "same number of batches (e.g. the same number of samples per rank in your IterableDataset), or use a "
        "map-style dataset with a sampler that has __len__, which tandem shards evenly. (Shown once.)"
    )
