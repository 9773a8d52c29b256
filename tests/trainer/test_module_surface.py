"""The rest of Lightning's module surface: dtype, on_gpu, print, hparams_initial, strict_loading, TorchScript and ONNX
export, on_train_batch_start returning -1, all_gather(sync_grads=True)."""

from __future__ import annotations

import pytest
import torch

import tandem
from helpers import TinyModule, loader, quiet_trainer

pytestmark = pytest.mark.timeout(60)


class Exportable(TinyModule):
    def __init__(self):
        super().__init__()
        self.example_input_array = torch.randn(2, 8)


def test_dtype_on_gpu_and_hparams_initial():
    model = TinyModule(lr=0.5)
    assert model.dtype == torch.float32 and not model.on_gpu
    assert model.double().dtype == torch.float64
    model.hparams.lr = 0.1  # later changes stay out of hparams_initial
    assert model.hparams_initial.lr == 0.5 and model.hparams.lr == 0.1
    model.hparams_initial.lr = 7.0  # a copy
    assert model.hparams_initial.lr == 0.5


def test_print_goes_out_once_from_module_and_trainer(capsys):
    model, trainer = TinyModule(), quiet_trainer()
    model.print("from the module")
    trainer.print("from the trainer", end="!\n")
    assert capsys.readouterr().out == "from the module\nfrom the trainer!\n"


def test_strict_loading_false_lets_a_resume_skip_missing_keys(tmp_path):
    trainer = quiet_trainer(max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    trainer.fit(TinyModule(), loader(32, 16))
    path = trainer.checkpoint_callback.best_model_path  # the default checkpoint's file (Lightning's: no last.ckpt)

    class Bigger(TinyModule):
        def __init__(self, strict: bool):
            super().__init__()
            self.register_buffer("extra", torch.zeros(2))  # not in the checkpoint
            self.strict_loading = strict

    with pytest.raises(tandem.utilities.exceptions.TandemUserCodeError, match="does not fit"):
        quiet_trainer(max_epochs=2).fit(Bigger(True), loader(32, 16), ckpt_path=path)
    resumed = quiet_trainer(max_epochs=2)
    resumed.fit(Bigger(False), loader(32, 16), ckpt_path=path)
    assert resumed.current_epoch == 2


def test_to_torchscript_scripts_or_traces_and_saves(tmp_path):
    model = Exportable().train()
    x = model.example_input_array
    for method in ("script", "trace"):
        compiled = model.to_torchscript(tmp_path / f"{method}.pt", method=method)
        assert model.training  # the mode comes back
        loaded = torch.jit.load(str(tmp_path / f"{method}.pt"))
        assert torch.allclose(loaded(x), model.eval()(x)) and torch.allclose(compiled(x), model(x))
        model.train()
    with pytest.raises(tandem.utilities.exceptions.TandemConfigError, match="example_input_array"):
        TinyModule().to_torchscript(method="trace")


def test_to_onnx_writes_a_model_onnx_checks(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxscript")
    model = Exportable()
    model.to_onnx(tmp_path / "model.onnx")
    onnx.checker.check_model(onnx.load(str(tmp_path / "model.onnx")))
    with pytest.raises(tandem.utilities.exceptions.TandemConfigError, match="input sample"):
        TinyModule().to_onnx(tmp_path / "none.onnx")


def test_on_train_batch_start_returning_minus_one_ends_the_epoch():
    seen: list[tuple[int, int]] = []

    class Skips(TinyModule):
        def on_train_batch_start(self, batch, batch_idx):
            seen.append((self.current_epoch, batch_idx))
            return -1 if batch_idx == 2 else None

    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(Skips(), loader(80, 16))  # 5 batches an epoch: batches 0 and 1 train, 2 ends the epoch
    assert seen == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert trainer.global_step == 4 and trainer.current_epoch == 2


def test_all_gather_with_sync_grads_carries_gradients_to_every_rank(core_ddp):
    for result in core_ddp["gathers"]:
        assert result["gathered"].flatten().tolist() == [1.0, 2.0]
        assert result["grad"].tolist() == [3.0]  # d/dx_r of sum over ranks k of (k + 1) * sum(gathered)
