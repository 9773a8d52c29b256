"""The fit loop's reading of the training batches: when each batch is read relative to ``training_step`` is
Lightning's, so a dataset whose items depend on the training state (reinforcement learning collecting episodes with
the current policy in an IterableDataset) yields the same sequence under both."""

from __future__ import annotations

import importlib.util
import itertools
import time
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest

import tandem
from helpers import TinyModule, loader, quiet_trainer

SCRIPT = Path(__file__).parent / "scripts" / "lookahead_program.py"

# The items training_step saw under Lightning 2.6.6 (torch 2.13.0 CPU), per setting (see the script): each is
# (10 * rank + index in the epoch, steps run when the dataset produced it). Recorded with
#   cd /tmp && python tests/trainer/scripts/lookahead_program.py lightning      # one process
#   cd /tmp && OMP_NUM_THREADS=1 python tests/trainer/scripts/lookahead_program.py lightning 2   # ddp, 2 ranks
# (python: a venv with lightning==2.6.6). Unknown length: batch i + 1 is read before the step on batch i (so
# items 0 and 1 both come before the first step); a limit_train_batches count makes the length known and nothing
# is read ahead. Under ddp each rank reads as one process does.
ONE_AHEAD = [[0, 0], [1, 0], [2, 1], [3, 2], [4, 3], [0, 5], [1, 5], [2, 6], [3, 7], [4, 8]]
NONE_AHEAD = [[0, 0], [1, 1], [2, 2], [3, 3], [0, 4], [1, 5], [2, 6], [3, 7]]
LIGHTNING = {"unknown_length": ONE_AHEAD, "limit_train_batches": NONE_AHEAD, "accumulate": ONE_AHEAD}


def _on_rank(rank: int, seen: list[list[int]]) -> list[list[int]]:
    return [[10 * rank + i, steps] for i, steps in seen]


def _program():
    spec = importlib.util.spec_from_file_location("lookahead_program", SCRIPT)
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    return program


def test_training_batches_are_read_when_lightning_reads_them():
    assert _program().run("tandem") == LIGHTNING


def test_under_ddp_each_rank_reads_as_lightnings_ranks(core_ddp):
    """The program under ``strategy="ddp", devices=2``: the ``lookahead`` scenario of the trainer tests' shared
    launch."""
    got = {k: v for rank in core_ddp["lookahead"] for k, v in rank["seen"].items()}
    want = {f"rank{rank}/{name}": _on_rank(rank, seen) for rank in (0, 1) for name, seen in LIGHTNING.items()}
    assert got == want


# ====================================================================== when the fit validates
class _Validations(tandem.Callback):
    """Validations that ran per training epoch (not the sanity check's)."""

    def __init__(self):
        self.per_epoch, self.count = [], 0

    def on_validation_end(self, trainer, module):
        self.count += not trainer.sanity_checking

    def on_train_epoch_end(self, trainer, module):
        self.per_epoch.append(self.count)
        self.count = 0


class _SimulatedTime(TinyModule):
    """Reads the clock after each batch of an epoch that does not validate, as Lightning's test does (time passes)."""

    def on_train_batch_end(self, outputs, batch, batch_idx):
        every = self.trainer.check_val_every_n_epoch
        if every is not None and every > 1 and (self.trainer.current_epoch + 1) % every:
            time.monotonic()


def _validations_on_a_fake_clock(tick: int, **kwargs) -> list[int]:
    """Per-epoch validations of a fit whose clock (``time.monotonic``) moves ``tick`` seconds at each read."""
    reads = itertools.count(step=tick)
    seen = _Validations()
    with mock.patch("time.monotonic", side_effect=lambda: next(reads)):
        trainer = quiet_trainer(num_sanity_val_steps=2, limit_val_batches=1, callbacks=[seen], **kwargs)
        trainer.fit(_SimulatedTime(), loader(64, 4), loader(16, 4))
    return seen.per_epoch


# Lightning 2.6.6's validations per epoch for the same fits (the cases of its tests_pytorch/trainer/flags/
# test_val_check_interval.py::test_time_based_val_check_interval and test_time_and_epoch_gated_val_check, whose
# counts they assert), measured by running these fits written for Lightning (lightning==2.6.6, its BoringModel,
# the same fake clock, callback and arguments) and reading the callback's counts: validation is due after a training batch once the interval has passed since the
# last validation ended (or since training started), in the epochs check_val_every_n_epoch allows; a stop that
# ends the fit validates without asking the clock; an epoch's end validates only when its time has come.
@pytest.mark.parametrize("interval", ["00:00:00:02", {"seconds": 2}, timedelta(seconds=2)])
def test_a_time_based_val_check_interval_validates_when_its_time_has_passed(interval):
    assert _validations_on_a_fake_clock(2, max_epochs=1, max_steps=5, val_check_interval=interval) == [5]


@pytest.mark.parametrize(
    ("every", "interval", "batches", "lightning"),
    [
        (None, "00:00:00:04", 2, [0, 1, 0, 1, 0]),  # the timer alone, across epochs
        (1, "00:00:00:06", 8, [1, 1, 2, 1, 1]),
        (2, "00:00:00:06", 9, [0, 2, 0, 2, 0]),  # gated by the epoch, timer shorter than an epoch
        (2, "00:00:00:03", 9, [0, 3, 0, 3, 0]),
        (2, "00:00:00:20", 9, [0, 0, 0, 1, 0]),  # timer longer than an epoch
    ],
)
def test_a_time_based_val_check_interval_is_gated_by_check_val_every_n_epoch(every, interval, batches, lightning):
    kwargs = dict(max_epochs=5, max_steps=5 * batches, limit_train_batches=batches, check_val_every_n_epoch=every)
    assert _validations_on_a_fake_clock(1, val_check_interval=interval, **kwargs) == lightning


# Lightning 2.6.6 (BoringModel, limit_train_batches=10): max_steps=3 -> 1 validation, max_steps=6 -> 2
@pytest.mark.parametrize(("max_steps", "lightning"), [(3, 1), (6, 2)])
def test_a_fit_that_stops_on_a_validation_batch_validates_there_once(max_steps, lightning):
    seen = _Validations()
    trainer = quiet_trainer(max_steps=max_steps, val_check_interval=3, limit_train_batches=10, callbacks=[seen])
    trainer.fit(TinyModule(), loader(64, 4), loader(16, 4))
    assert seen.per_epoch == [lightning]
