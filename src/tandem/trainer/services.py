"""``TrainerServices``: what programs, callbacks and modules call on the Trainer besides its entry points: write a
checkpoint, send values to the loggers, run a hook, a trial (the tuner's searches), ``print`` on rank 0, build the
module on its device. A base class of ``Trainer`` (see ``tandem.trainer.trainer``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from tandem.callbacks.callback import Callback
from tandem.module import TrainingModule
from tandem.strategies.side_channel import entry_point
from tandem.trainer import checkpointing
from tandem.trainer.hooks import HookDispatcher
from tandem.trainer.nonfinite import nonfinite_parameters
from tandem.trainer.properties import TrainerProperties
from tandem.trainer.trial import Trial, TrialParts, open_trial
from tandem.utilities.checkpoint_format import to_plain
from tandem.utilities.exceptions import add_note
from tandem.utilities.rank_zero import rank_zero_print

if TYPE_CHECKING:
    from tandem.trainer.trainer import Trainer


class TrainerServices(TrainerProperties):
    """The Trainer's calls besides its entry points (a base of ``Trainer``)."""

    # set by Trainer.__init__
    _hooks: HookDispatcher
    _module: TrainingModule | torch.nn.Module | None
    _left_out: set[tuple[str, str]]
    _fit_sources: tuple[Any, Any, Any] | None

    def _wait_for_checkpoint_write(self, exception: BaseException | None = None) -> None:
        """Wait for the checkpoint written in the background (``AsyncCheckpointIO``), raising its error; while
        ``exception`` ends the run, that error becomes a note on it instead."""
        writer = self.strategy.checkpoint_io
        if writer is None:
            return
        if exception is None:
            writer.wait()
            return
        try:
            writer.wait()
        except Exception as error:
            add_note(
                exception, f"[tandem] The background checkpoint write also failed: {type(error).__name__}: {error}"
            )

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once, on global rank 0 (as ``self.print`` in a module)."""
        rank_zero_print(*args, **kwargs)

    def init_module(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager:
        """Build the module where the strategy wants its tensors: directly on the device (in float64 under
        "64-true"), or, with ``strategy="fsdp"`` and ``empty_init=True``, without memory (meta parameters)
        so that each rank materialises only its shard.

        Args:
            empty_init: True to skip allocating (and initialising) the parameters now; FSDP then calls each
                submodule's ``reset_parameters()`` on this rank's shard. Other strategies build as for None.

        Example:
            ```python
            trainer = Trainer(strategy="fsdp", devices=4)
            with trainer.init_module(empty_init=True):
                model = LargeModel()
            ```
        """
        return self.strategy.tensor_init_context(empty_init)

    def trial(
        self,
        callbacks: Sequence[Callback] = (),
        max_steps: int = 100,
        *,
        max_epochs: int | None = None,
        restart_data: bool = False,
    ) -> contextlib.AbstractContextManager[Trial]:
        """Short training runs inside the running fit that leave no trace: the tuner's searches
        (``LearningRateFinder``, ``BatchSizeFinder``) run in one. Call it from a callback hook of a fit
        (``on_fit_start``, ``on_train_epoch_start``), on every rank.

        On entry the fit's state is saved to a temporary checkpoint in ``default_root_dir``. In the block,
        ``trial.run()`` trains from that point, at most ``max_steps`` optimizer steps and up to epoch ``max_epochs``
        (None: as many epochs as the steps need), calling only ``callbacks`` (and the module's hooks): no loggers,
        progress bar or other callbacks,
        no sanity check or validation, no lr scheduler of the module, and NaN or inf is not acted on (a range test
        drives the loss to diverge). ``trial.reload_data()`` builds the training loaders again from the module's
        or DataModule's hooks (``trial.reloadable`` says whether they come from there). On exit, error or not,
        everything comes back: settings, callbacks, loggers, and from the checkpoint the weights, optimizers,
        schedulers, callbacks' state and loop counters; the RNG states are as on entry. Loaders rebuilt in the
        block are built again with the hyperparameters the block left (e.g. the batch size found).

        ``restart_data=True`` is Lightning's LR finder: on exit the training loaders that come from the hooks are
        asked for again where the fit next needs them (after the search, with the RNG as on entry, as Lightning's
        ``setup_data`` after its ``isolate_rng``), so a search and the fit after it draw the numbers they draw on
        Lightning.

        Example:
            ```python
            class Search(Callback):
                def on_fit_start(self, trainer, module):
                    with trainer.trial([recorder], max_steps=20) as trial:
                        trial.run()
            ```
        """
        load_data, from_hooks = None, False
        if self.state.fn == "fit" and self._fit_sources is not None and self._module is not None:
            load_data = self.fit_loop.reload_training
            from_hooks = self._fit_sources[0] is None
        parts = TrialParts(
            self._config,
            self._hooks,
            self._nonfinite,
            self._evaluation,
            self._metrics,
            load_data,
            from_hooks,
        )
        return open_trial(
            cast("Trainer", self), parts, callbacks, max_steps, max_epochs=max_epochs, restart_data=restart_data
        )

    # ================================================================== hooks
    def call_hook(self, hook: str, *args: Any) -> None:
        """Run ``hook`` (a ``Callback`` hook name such as ``"on_before_backward"``) on the callbacks, then on the
        module, in Lightning's order, as the loops do; hooks nobody overrides cost nothing."""
        self._hooks.call(hook, *args)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Send ``metrics`` (name -> number or scalar tensor) to every logger, on global rank 0.

        How callbacks write their own values (e.g. learning rates). Needs no other process (it is not a
        collective). ``step`` defaults to the loggers' current step: the number of training batches that stepped
        (``global_step`` with one optimizer; under manual optimization, the batches). The row holds the values alone,
        as Lightning's callbacks write theirs (the rows of ``self.log`` values also name the epoch); the values also
        appear in ``logged_metrics``.
        """
        self._sink.log_metrics(metrics, step, epoch=False)

    # ================================================================== checkpoints
    def save_checkpoint(self, filepath: str | os.PathLike, weights_only: bool = False) -> bool:
        """Write a checkpoint. Every rank must call this (it builds the state on each); rank 0 writes it
        atomically; all ranks meet at a barrier after. With ``plugins=[AsyncCheckpointIO()]``, during a run rank 0
        copies the state and writes it in the background (the run waits for it before it returns).

        Parameters holding NaN or inf are never written: ``on_nonfinite="raise"`` raises a ``NonFiniteError``,
        ``"warn"`` skips the save with a warning and returns False (a file already at ``filepath`` stays).

        Args:
            filepath: where to write (``.ckpt``).
            weights_only: only the weights and hyperparameters (such a file cannot resume training). The
                weights are whole even under ``strategy="fsdp"`` (gathered from the shards, whatever its
                ``state_dict_type``): after an FSDP fit, this is how they leave the sharded module.

        Example:
            ```python
            trainer.fit(model, loader)
            trainer.save_checkpoint("model.ckpt", weights_only=True)  # every rank; rank 0 writes
            plain = MyModule()
            plain.load_state_dict(torch.load("model.ckpt")["state_dict"])
            ```

        Returns:
            True when the checkpoint was written.
        """
        with entry_point("save_checkpoint"):
            nonfinite = nonfinite_parameters(self.strategy.module)  # one fused pass over the parameters
            if self.strategy.reduce_boolean_decision(bool(nonfinite), all=False):  # any rank's shard: all alike
                self._nonfinite.refuse_save(nonfinite, filepath, self.global_step)
                return False
            state = to_plain(self._checkpoint_state(weights_only), self._left_out)
            self.strategy.save_checkpoint(state, os.fspath(filepath))
            if self.state.status != "running":  # outside a run nothing overlaps the write, and nothing reports it
                self._wait_for_checkpoint_write()
            return True

    def _checkpoint_state(self, weights_only: bool = False) -> dict[str, Any]:
        return checkpointing.checkpoint_state(cast("Trainer", self), weights_only)
