"""NaN and inf in training (``Trainer(on_nonfinite=...)``): real fits on one process. The two-process runs are
in ``scripts/core_ddp_runs.py`` (scenario ``nonfinite``), checked at the end of this file."""

from __future__ import annotations

import math
import os
import warnings

import pytest
import torch

import tandem
from helpers import TinyModule, float16_mixed, loader, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.loggers import CSVLogger
from tandem.utilities.exceptions import NonFiniteError, TandemConfigError


class NaNFrom(TinyModule):
    """Its loss is multiplied by ``value`` (NaN by default) from optimizer step ``start`` on (until ``stop``)."""

    def __init__(self, start: int, value: float = math.nan, stop: int | None = None) -> None:
        super().__init__()
        self.start, self.value, self.stop = start, value, stop

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.start <= self.global_step and (self.stop is None or self.global_step < self.stop):
            loss = loss * self.value
        return loss


def _finite(state_dict: dict[str, torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(v).all()) for v in state_dict.values() if v.is_floating_point())


def _checkpointed(tmp_path, **kwargs) -> tuple[tandem.Trainer, ModelCheckpoint]:
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=3, save_last=True, save_top_k=-1)
    kwargs = {"max_epochs": 4, "log_every_n_steps": 2, "logger": CSVLogger(tmp_path), **kwargs}
    return quiet_trainer(callbacks=[checkpoint], enable_checkpointing=True, **kwargs), checkpoint


def _files(checkpoint: ModelCheckpoint) -> list[str]:
    return sorted(os.listdir(checkpoint.dirpath))


# 8 batches per epoch; the loss is NaN from the 11th step (global_step 10 when training_step runs), the weights
# from that step's update on. The loss is read every 2 steps, saves come every 3.
BEFORE = ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt", "epoch=1-step=9.ckpt", "last.ckpt"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_loss_is_read_as_one_number_nan_and_inf_are_not_finite(dtype):
    from tandem.trainer.nonfinite import loss_is_finite

    def loss(value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=dtype, requires_grad=True) * 1  # as training_step returns it: with a graph

    assert loss_is_finite(loss(2.5)) and loss_is_finite(None)  # None: a skipped batch
    assert not loss_is_finite(loss(math.nan)) and not loss_is_finite(loss(math.inf))
    assert not loss_is_finite(loss(-math.inf))


def test_a_nan_loss_stops_the_fit_naming_the_step_and_the_last_checkpoint_stays_finite(tmp_path):
    trainer, checkpoint = _checkpointed(tmp_path)
    with pytest.raises(NonFiniteError) as caught:
        trainer.fit(NaNFrom(10), loader(64, batch_size=8))
    message = str(caught.value)
    assert message.startswith(
        "NaN or inf in training: the loss returned by training_step was NaN or inf at global step 12 (the check "
        "before, at step 10, found the loss finite; it is read every 2 steps). Logged values that were NaN or inf "
        "at step 12: train_loss."
    )
    for advice in ("a lower learning rate", "gradient_clip_val=1.0", "detect_anomaly=True", "on_nonfinite='warn'"):
        assert advice in message
    assert trainer.global_step == 12 and trainer.interrupted
    # The step-12 save never ran; the checkpoints written before are intact and load.
    assert _files(checkpoint) == BEFORE
    last = torch.load(checkpoint.last_model_path)
    assert last["global_step"] == 9 and _finite(last["state_dict"])
    restored = TinyModule.load_from_checkpoint(checkpoint.last_model_path)
    assert _finite(restored.state_dict())
    assert checkpoint.best_k_models == {}  # no monitor: no scores kept, as Lightning's
    assert checkpoint.best_model_path == str(checkpoint.dirpath) + "/" + BEFORE[2]


def test_warn_trains_on_but_never_writes_non_finite_parameters(tmp_path):
    trainer, checkpoint = _checkpointed(tmp_path, on_nonfinite="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(NaNFrom(10), loader(64, batch_size=8))
    texts = [str(w.message) for w in caught if "NaN or inf" in str(w.message)]
    assert len(texts) == 2, texts  # the finding, then the first skipped save; later skips are quiet
    assert texts[0].startswith("NaN or inf in training: the loss returned by training_step was NaN or inf at global")
    assert "Training goes on (Trainer(on_nonfinite='warn')); no checkpoint is written while" in texts[0]
    assert texts[1].startswith("on_nonfinite='warn': parameters hold NaN or inf at global step 12: net.0.weight")
    assert "epoch=1-step=12.ckpt' was not written" in texts[1]
    assert trainer.global_step == 32 and not trainer.interrupted  # all 4 epochs ran
    assert _files(checkpoint) == BEFORE  # saves at steps 12, 15, 16 (epoch end), ... were all skipped
    last = torch.load(checkpoint.last_model_path)
    assert last["global_step"] == 9 and _finite(last["state_dict"])
    assert checkpoint.best_model_path.endswith("epoch=1-step=9.ckpt")  # never a file that was not written
    # A save asked for by hand is refused the same way, and says so.
    assert trainer.save_checkpoint(tmp_path / "manual.ckpt") is False
    assert not (tmp_path / "manual.ckpt").exists()


def test_parameters_are_checked_at_each_save_even_with_logging_off(tmp_path):
    class Corrupt(tandem.Callback):  # inf in one weight at step 6, just before the save; no loss is read
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 6:
                with torch.no_grad():
                    module.net[0].weight[0, 0] = math.inf

    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_last=True, save_top_k=0)
    trainer = quiet_trainer(max_epochs=1, callbacks=[Corrupt(), checkpoint], enable_checkpointing=True)
    with pytest.raises(NonFiniteError, match="parameters hold NaN or inf at global step 6: net.0.weight. Checkpoint"):
        trainer.fit(TinyModule(), loader(64, batch_size=8))
    assert torch.load(tmp_path / "last.ckpt")["global_step"] == 3


def test_the_epoch_end_checks_the_parameters_when_nothing_else_reads_values():
    trainer = quiet_trainer(max_epochs=3)  # no logger, no checkpoints: nothing is read during the epoch
    with pytest.raises(NonFiniteError, match=r"parameters hold NaN or inf at the end of epoch 0 \(global step 4\)"):
        trainer.fit(NaNFrom(2), loader(64, batch_size=16))
    assert trainer.current_epoch == 0


def test_without_a_logger_one_process_still_reads_the_loss_at_logging_steps():
    """Nothing is published (one process, no logger), yet the loss is read at the logging steps, as with a logger:
    the error names the loss at the first check after it turned NaN, not the parameters at the epoch's end."""
    trainer = quiet_trainer(max_epochs=1, log_every_n_steps=2)
    with pytest.raises(NonFiniteError) as caught:
        trainer.fit(NaNFrom(3), loader(64, batch_size=4))  # 16 batches; NaN from the 4th step on
    assert str(caught.value).startswith(
        "NaN or inf in training: the loss returned by training_step was NaN or inf at global step 4 (the check "
        "before, at step 2, found the loss finite; it is read every 2 steps)."
    ), caught.value
    assert trainer.global_step == 4


@pytest.mark.parametrize("persistent", [False, True], ids=["one_step", "persistent"])
def test_16_mixed_acts_only_on_a_non_finite_loss_that_persists(tmp_path, persistent):
    # The GradScaler skips the steps whose gradients hold inf / NaN, so the weights stay finite: one bad step is
    # the scaler's business; a loss still non-finite at the next check is the user's.
    module = NaNFrom(3, value=math.inf, stop=None if persistent else 4)
    trainer = quiet_trainer(**float16_mixed(), max_steps=8, log_every_n_steps=1, logger=CSVLogger(tmp_path))
    if not persistent:
        trainer.fit(module, loader(64, batch_size=8))
        assert trainer.global_step == 8 and _finite(module.state_dict())
        assert trainer.strategy.precision.scaler.get_scale() == 2.0**15  # one skipped step
        return
    with pytest.raises(NonFiniteError) as caught:
        trainer.fit(module, loader(64, batch_size=8))
    assert "NaN or inf at global step 4 and again at step 5, the next step checked: the GradScaler skips" in str(
        caught.value
    )
    assert "precision='bf16-mixed' or '32-true'" in str(caught.value)
    assert _finite(module.state_dict())  # the scaler kept them finite; training just no longer progressed


def test_on_nonfinite_is_checked_eagerly():
    with pytest.raises(
        TandemConfigError, match=r"on_nonfinite='ignore' is not valid; expected one of: 'raise', 'warn'"
    ):
        tandem.Trainer(on_nonfinite="ignore")
    with pytest.raises(TandemConfigError, match=r"terminate_on_nan=True\) is a Lightning 1.x argument.*on_nonfinite"):
        tandem.Trainer(terminate_on_nan=True)
    assert tandem.Trainer(on_nonfinite="warn", logger=False).on_nonfinite == "warn"


# ---------------------------------------------------------------------------------------------- two processes


@pytest.mark.timeout(150)
def test_ddp_ranks_decide_alike_on_a_loss_that_is_nan_on_one_rank(core_ddp):
    # Rank 1's loss is NaN from step 8; the all-reduced gradients then make every rank's weights NaN. Both ranks
    # find it at the same check, from what the ranks exchanged when publishing step 8's values.
    decision = (
        "the loss returned by training_step was NaN or inf at global step 8 on rank(s) [1] (the check before, at "
        "step 6, found the loss finite; it is read every 2 steps)."
    )
    rank0, rank1 = core_ddp["nonfinite"]
    assert rank0["found"] == decision
    assert rank1["found"] == f"{decision} Logged values that were NaN or inf at step 8 on this rank: loss."
    for result in (rank0, rank1):
        assert result["step"] == 16  # under "warn" both trained on (2 epochs), through the same skipped saves
        assert result["files"] == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt", "last.ckpt"]
        assert result["last_step"] == 6 and result["last_finite"]
    assert len(rank0["warnings"]) == 2 and rank1["warnings"] == []  # the finding and the first skipped save
    assert rank0["warnings"][0].startswith(f"NaN or inf in training: {decision} Training goes on")
