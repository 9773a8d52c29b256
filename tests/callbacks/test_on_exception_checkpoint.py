import pytest
import torch

from helpers import TinyModule, loader, max_abs_diff, quiet_trainer
from tandem.callbacks import OnExceptionCheckpoint
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(60)


class FailsAtStep(TinyModule):
    def __init__(self, fail_at):
        super().__init__()
        self.fail_at = fail_at

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == self.fail_at:
            raise RuntimeError("bad batch")
        return super().training_step(batch, batch_idx)


def test_a_raising_training_step_leaves_a_checkpoint_that_resumes(tmp_path):
    model = FailsAtStep(fail_at=3)
    callback = OnExceptionCheckpoint(tmp_path, filename="crash")
    with pytest.raises(RuntimeError, match="bad batch"):
        quiet_trainer(max_epochs=2, callbacks=[callback]).fit(model, loader(64, 16))
    assert callback.ckpt_path == str(tmp_path / "crash.ckpt")
    saved = torch.load(callback.ckpt_path)
    assert saved["global_step"] == 3 and max_abs_diff(saved["state_dict"], model.state_dict()) == 0.0
    resumed = FailsAtStep(fail_at=-1)
    trainer = quiet_trainer(max_epochs=2, callbacks=[OnExceptionCheckpoint(tmp_path, filename="crash")])
    trainer.fit(resumed, loader(64, 16), ckpt_path=callback.ckpt_path)
    assert trainer.global_step == 8
    assert not (tmp_path / "crash.ckpt").exists()  # a run that finished removes the stale file, as Lightning


def test_an_empty_filename_is_refused():
    with pytest.raises(TandemConfigError, match="filename is empty"):
        OnExceptionCheckpoint(".", filename="")
