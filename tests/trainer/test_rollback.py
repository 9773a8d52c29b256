"""``Trainer(on_nonfinite="rollback")``: every rank goes back to the last clean state and trains on without the
bad batch. Each run is checked against a hand-written loop over the same batches that leaves that batch out. The
two-process run is ``scripts/core_ddp_runs.py``'s scenario ``rollback`` (the shared launch)."""

from __future__ import annotations

import csv
import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import tandem
from helpers import TinyModule, make_data, max_abs_diff, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.loggers import CSVLogger
from tandem.trainer import Rollback
from tandem.utilities.exceptions import NonFiniteError, TandemConfigError, TandemWarning

pytestmark = pytest.mark.timeout(60)

BATCH = 8  # 64 samples: 8 batches an epoch


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _finite(state_dict: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in state_dict.values() if v.is_floating_point())


def test_a_loss_spike_rolls_back_and_training_matches_a_loop_without_that_batch(tmp_path):
    # Batch 6 of every epoch is scaled x1000. SGD with momentum and a StepLR: the optimizer's and the scheduler's
    # state must come back too. Checks every 2 steps, a save at every step.
    x, y = make_data(64).tensors
    x = x.clone()
    x[6 * BATCH : 7 * BATCH] *= 1000
    data = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    torch.manual_seed(0)
    module = TinyModule(scheduler=True)
    initial = _weights(module)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=1, save_top_k=-1, save_last=True)
    trainer = quiet_trainer(
        max_epochs=2,
        log_every_n_steps=2,
        on_nonfinite=Rollback(spike_zscore=6.0, spike_window=4),
        logger=CSVLogger(tmp_path),
        callbacks=[checkpoint],
        enable_checkpointing=True,
    )
    with pytest.warns(TandemWarning, match="rolled back: found at global step") as caught:
        trainer.fit(module, data)
    found = [
        str(w.message).split("rolled back: ")[1].split(":")[0] for w in caught if "rolled back: " in str(w.message)
    ]
    assert found == ["found at global step 8 (epoch 0)", "found at global step 14 (epoch 1)"]

    reference = TinyModule(scheduler=True)
    reference.load_state_dict(initial)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for _ in range(2):
        for index in range(8):
            if index == 6:
                continue
            batch = slice(index * BATCH, (index + 1) * BATCH)
            loss = F.cross_entropy(reference(x[batch]), y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
    assert max_abs_diff(_weights(module), _weights(reference)) <= 1e-6
    assert trainer.global_step == 14
    assert [(r.epoch, r.batch_idx, r.spike, r.restored_step, r.skipped) for r in trainer.rollbacks] == [
        (0, 6, True, 6, (6,)),
        (1, 6, True, 12, (6,)),
    ]
    for name in os.listdir(checkpoint.dirpath):
        assert _finite(torch.load(os.path.join(checkpoint.dirpath, name))["state_dict"]), name
    with open(trainer.logger.log_dir + "/metrics.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get("rollback/skipped_batch")]
    assert [(row["rollback/skipped_batch"], row["rollback/spike"], row["epoch"]) for row in rows] == [
        ("6.0", "1.0", "0"),
        ("6.0", "1.0", "1"),
    ]


class NaNFrom(TinyModule):
    """Its loss is NaN from optimizer step ``start`` on, whatever the batch."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start = start

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * math.nan if self.global_step >= self.start else loss


def test_rollbacks_in_a_row_end_the_run_listing_them():
    trainer = quiet_trainer(max_epochs=1, log_every_n_steps=2, on_nonfinite="rollback")
    with pytest.raises(NonFiniteError) as caught, pytest.warns(TandemWarning, match="rolled back") as warned:
        trainer.fit(NaNFrom(4), DataLoader(make_data(64), batch_size=BATCH))
    assert len([w for w in warned if "rolled back" in str(w.message)]) == 2  # two rollbacks; the third is the error
    message = str(caught.value)
    assert message.startswith(
        "Training rolled back 3 times in a row without a clean check between them (Rollback(max_in_a_row=3)): "
        "1. found at global step 6 (epoch 0): the loss of batch 4 was nan; back to step 4, replaying without "
        "batch(es) 4; 2. "
    )
    assert "a lower learning rate" in message
    assert [r.skipped for r in trainer.rollbacks] == [(4,), (4, 5), (4, 5, 6)]


def test_rollback_settings_are_checked_eagerly():
    assert tandem.Trainer(on_nonfinite=Rollback(spike_zscore=4.0), logger=False).on_nonfinite == "rollback"
    assert tandem.Trainer(logger=False).rollbacks == []
    with pytest.raises(TandemConfigError, match=r"Rollback\(spike_zscore\)=0 is out of range; expected a number > 0"):
        Rollback(spike_zscore=0)
    with pytest.raises(TandemConfigError, match=r"Rollback\(every_n_checks\)=0 is out of range; expected an int >= 1"):
        Rollback(every_n_checks=0)
    with pytest.raises(TandemConfigError, match=r"on_nonfinite='rollback' with log_every_n_steps=0: a rollback"):
        tandem.Trainer(on_nonfinite="rollback", log_every_n_steps=0, logger=False)


# ---------------------------------------------------------------------------------------------- two processes


@pytest.mark.timeout(150)
def test_ddp_ranks_roll_back_alike_past_a_nan_on_one_rank(core_ddp, scripts_on_path):
    # Rank 1's batches 4 and 7 hold a NaN sample in each epoch (rank 0's are finite); the all-reduced gradients
    # spoil both ranks' weights. Batch 4 is found at the check of step 6, batch 7 at the epoch's end.
    import core_ddp_runs
    import manual_modules

    rank0, rank1 = core_ddp["rollback"]
    expected = [
        (6, 0, 4, 3, (4,), "the loss of batch 4 was nan on rank(s) [1]"),
        (7, 0, 7, 6, (7,), "the loss of batch 7 was nan on rank(s) [1]"),
        (12, 1, 4, 9, (4,), "the loss of batch 4 was nan on rank(s) [1]"),
        (13, 1, 7, 12, (7,), "the loss of batch 7 was nan on rank(s) [1]"),
    ]
    assert rank0["rollbacks"] == rank1["rollbacks"] == expected
    assert rank0["step"] == rank1["step"] == 12
    assert max_abs_diff(rank0["final"], rank1["final"]) == 0
    # The same global order by hand (each global batch is both ranks' 4 samples), without batches 4 and 7.
    x = manual_modules.dataset().tensors[0]
    assert all(2 * (i // 2) + 1 == i for i in core_ddp_runs.ROLLBACK_NAN_SAMPLES)  # rank 1's samples
    net = torch.nn.Linear(manual_modules.FEATURES, 1)
    net.load_state_dict({k.removeprefix("net."): v for k, v in rank0["initial"].items()})
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    for _ in range(2):
        for index in (0, 1, 2, 3, 5, 6):
            loss = (net(x[index * 8 : (index + 1) * 8]) - 1.0).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert max_abs_diff(rank0["final"], {f"net.{k}": v for k, v in net.state_dict().items()}) <= 1e-6
    # No checkpoint holds a NaN: the save after batch 4 met NaN weights and was skipped (once said).
    assert rank0["files_finite"] and rank1["files_finite"]
    assert "epoch=0-step=5.ckpt" in rank0["files"]  # written again after the rollback, from finite weights
    skipped = [w for w in rank0["warnings"] if "parameters hold NaN or inf" in w]
    assert len(skipped) == 1 and "Checkpoint" in skipped[0] and "was not written" in skipped[0]
    assert len([w for w in rank0["warnings"] if "rolled back" in w]) == 4 and rank1["warnings"] == []
