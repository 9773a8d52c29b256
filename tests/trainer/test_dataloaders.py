"""Where data comes from and how it is run: several evaluation loaders, DataModules passed positionally, the
module's own data hooks, batch transfer hooks, and evaluating without a model after a fit."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import tandem
from helpers import TinyModule, loader, make_data, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError

pytestmark = pytest.mark.timeout(60)


class PerLoader(TinyModule):
    """Logs a per-batch loss and a per-loader constant from the evaluation steps; records hook arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))
        self.log(f"marker_{dataloader_idx}", float(dataloader_idx), add_dataloader_idx=False)  # a name per loader
        self.calls.append(("step", batch_idx, dataloader_idx))

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.calls.append(("end", batch_idx, dataloader_idx))

    def on_validation_epoch_end(self):
        self.log("epoch_value", 7.0)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return (dataloader_idx, batch[0].shape[0])


class HookArgs(tandem.Callback):
    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        self.seen.append((batch_idx, dataloader_idx))


def _single_loss(model: TinyModule, data: DataLoader) -> float:
    (result,) = quiet_trainer().validate(model, data, verbose=False)
    return result["val_loss"]


def test_several_validation_loaders_get_dataloader_idx_and_suffixed_metrics():
    model, callback = PerLoader(), HookArgs()
    loaders = [loader(48, 16), loader(20, 8)]
    trainer = quiet_trainer(callbacks=[callback])
    results = trainer.validate(model, loaders, verbose=False)
    assert trainer.num_val_batches == [3, 3]
    assert [c for c in model.calls if c[0] == "step"] == [("step", i, 0) for i in range(3)] + [
        ("step", i, 1) for i in range(3)
    ]
    assert callback.seen == [(i, 0) for i in range(3)] + [(i, 1) for i in range(3)]
    assert len(results) == 2
    # add_dataloader_idx=False: the user's names, in the results of the loader they were logged from (Lightning's)
    assert set(results[0]) == {"val_loss/dataloader_idx_0", "marker_0", "epoch_value"}
    assert set(results[1]) == {"val_loss/dataloader_idx_1", "marker_1", "epoch_value"}
    assert results[1]["marker_1"] == 1.0
    for i, data in enumerate(loaders):  # each loader's metric is its own: as if validated alone
        assert math.isclose(results[i][f"val_loss/dataloader_idx_{i}"], _single_loss(model, data), rel_tol=1e-6)
    assert trainer.val_dataloaders[1] is not None and isinstance(trainer.val_dataloaders, list)


def test_a_dict_of_loaders_and_limits_per_loader():
    trainer = quiet_trainer(limit_test_batches=2)
    results = trainer.test(PerLoader(), {"clean": loader(48, 8), "small": loader(8, 8)}, verbose=False)
    assert trainer.num_test_batches == [2, 1]
    assert set(trainer.test_dataloaders) == {"clean", "small"}
    assert [set(r) for r in results] == [{"test_loss/dataloader_idx_0"}, {"test_loss/dataloader_idx_1"}]


def test_fit_validates_every_loader_and_the_sanity_check_runs_each():
    model = PerLoader()
    trainer = quiet_trainer(max_epochs=1, num_sanity_val_steps=1)
    trainer.fit(model, loader(32, 16), [loader(32, 16), loader(16, 16)])
    steps = [c for c in model.calls if c[0] == "step"]
    assert steps[:2] == [("step", 0, 0), ("step", 0, 1)]  # sanity check: 1 batch of each loader
    assert steps[2:] == [("step", 0, 0), ("step", 1, 0), ("step", 0, 1)]
    assert {"val_loss/dataloader_idx_0", "val_loss/dataloader_idx_1"} <= set(trainer.callback_metrics)


def test_predict_returns_one_list_per_loader_and_nothing_when_asked():
    trainer = quiet_trainer()
    predictions = trainer.predict(PerLoader(), [loader(32, 16), loader(8, 4)])
    assert predictions == [[(0, 16), (0, 16)], [(1, 4), (1, 4)]]
    assert trainer.predict(PerLoader(), loader(32, 16)) == [(0, 16), (0, 16)]
    assert trainer.predict(PerLoader(), loader(32, 16), return_predictions=False) is None


def test_a_step_without_dataloader_idx_and_several_loaders_is_a_clear_error():
    with pytest.raises(
        TandemUserCodeError, match=r"several val dataloaders.*validation_step\(\) has no dataloader_idx"
    ):
        quiet_trainer().validate(TinyModule(), [loader(), loader()])

    class Requires(TinyModule):
        def validation_step(self, batch, batch_idx, dataloader_idx):
            pass

    with pytest.raises(TandemUserCodeError, match=r"one val dataloader.*requires dataloader_idx"):
        quiet_trainer().validate(Requires(), loader())


def test_training_step_without_batch_idx():
    class NoIndex(TinyModule):
        def training_step(self, batch):
            return super().training_step(batch, 0)

        def validation_step(self, batch):
            super().validation_step(batch, 0)

    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(NoIndex(), loader(32, 16), loader(32, 16))
    assert trainer.global_step == 2 and "val_loss" in trainer.callback_metrics


# ---------------------------------------------------------------------------------------------- where data comes from
class OwnsData(TinyModule):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def prepare_data(self):
        self.events.append("prepare_data")

    def setup(self, stage):
        self.events.append(f"setup:{stage}:{self.net[0].weight.device.type}")

    def teardown(self, stage):
        self.events.append(f"teardown:{stage}")

    def train_dataloader(self):
        self.events.append("train_dataloader")
        return loader(32, 16)

    def val_dataloader(self):
        return loader(32, 16)

    def test_dataloader(self):
        return [loader(16, 16), loader(16, 8)]

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("test_loss", F.cross_entropy(self(batch[0]), batch[1]))


def test_fit_without_loaders_uses_the_module_data_hooks_and_calls_setup_and_teardown():
    model = OwnsData()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model)
    assert trainer.global_step == 2 and "val_loss" in trainer.callback_metrics
    assert model.events == ["prepare_data", "setup:fit:cpu", "train_dataloader", "teardown:fit"]
    results = trainer.test(model, verbose=False)
    assert len(results) == 2 and model.events[-2:] == ["setup:test:cpu", "teardown:test"]


class Data(tandem.DataModule):
    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.stages: list[str] = []

    def setup(self, stage):
        self.stages.append(stage)

    def train_dataloader(self):
        return loader(32, self.hparams.batch_size)

    def val_dataloader(self):
        return loader(32, self.hparams.batch_size)


def test_a_datamodule_passed_positionally_is_recognised():
    data = Data()
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(TinyModule(), data)
    assert trainer.datamodule is data and data.trainer is trainer and trainer.global_step == 2
    assert trainer.validate(TinyModule(), data, verbose=False)[0].keys() == {"val_loss", "val_acc"}
    assert data.stages == ["fit", "validate"]
    with pytest.raises(TandemConfigError, match="both dataloaders and a datamodule"):
        trainer.fit(TinyModule(), loader(), datamodule=data)


def test_datamodule_hyperparameters_and_from_datasets(tmp_path):
    data = Data(batch_size=8)
    assert data.hparams == {"batch_size": 8} and data.hparams.batch_size == 8
    trainer = quiet_trainer(max_epochs=1, default_root_dir=tmp_path)
    trainer.fit(TinyModule(), data)
    trainer.save_checkpoint(tmp_path / "with_data.ckpt")
    restored = Data.load_from_checkpoint(tmp_path / "with_data.ckpt")
    assert isinstance(restored, Data) and restored.hparams.batch_size == 8
    assert Data.load_from_checkpoint(tmp_path / "with_data.ckpt", batch_size=4).hparams.batch_size == 4

    train, val = make_data(48), make_data(20, seed=2)
    from_sets = tandem.DataModule.from_datasets(train, [val, val], batch_size=8)
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(PerLoader(), from_sets)
    assert trainer.num_training_batches == 6 and trainer.num_val_batches == [3, 3]


# ---------------------------------------------------------------------------------------------- batch transfer hooks
def test_transfer_hooks_run_in_order_with_the_dataloader_index():
    calls = []

    class Transfers(PerLoader):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            calls.append(("before", dataloader_idx))
            x, y = batch
            return x * 0, y  # visible in the step: the loss of an all-zero input

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            calls.append(("transfer", device.type))
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

        def on_after_batch_transfer(self, batch, dataloader_idx):
            calls.append(("after", dataloader_idx))
            return batch

    model = Transfers()
    results = quiet_trainer().validate(model, [loader(16, 16), loader(16, 16)], verbose=False)
    assert calls == [("before", 0), ("transfer", "cpu"), ("after", 0), ("before", 1), ("transfer", "cpu"), ("after", 1)]
    zero_loss = F.cross_entropy(model(torch.zeros(16, 8)), make_data(16).tensors[1]).item()
    assert math.isclose(results[0]["val_loss/dataloader_idx_0"], zero_loss, rel_tol=1e-6)


def test_a_datamodule_transfer_hook_wins():
    class Doubling(Data):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            return batch[0] * 2, batch[1]

    class Recording(TinyModule):
        inputs: list[torch.Tensor] = []

        def on_before_batch_transfer(self, batch, dataloader_idx):
            raise AssertionError("the DataModule's hook should be used")

        def training_step(self, batch, batch_idx):
            self.inputs.append(batch[0])
            return super().training_step(batch, batch_idx)

    model = Recording()
    quiet_trainer(max_steps=1).fit(model, Doubling())
    assert torch.equal(model.inputs[0], make_data(32).tensors[0][:16] * 2)


# ---------------------------------------------------------------------------------------------- after a fit
def test_evaluating_without_a_model_uses_the_fitted_one_and_its_best_checkpoint(tmp_path):
    model = TinyModule()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=1)
    trainer = quiet_trainer(max_epochs=3, callbacks=[checkpoint], enable_checkpointing=True)
    trainer.fit(model, loader(64, 16, shuffle=True), loader(32, 16))
    best_model = TinyModule.load_from_checkpoint(checkpoint.best_model_path)
    expected = quiet_trainer().test(best_model, loader(32, 16), verbose=False)
    with pytest.warns(UserWarning, match=r"without a model: the best checkpoint of the previous fit"):
        got = trainer.test(dataloaders=loader(32, 16), verbose=False)
    assert got == expected
    with pytest.raises(TandemConfigError, match=r"got no model and no earlier run has one"):
        quiet_trainer().validate()


def test_ckpt_path_best_without_a_monitor_is_the_latest_checkpoint(tmp_path):
    """As Lightning: without a monitor best_model_path names the latest checkpoint, and "best" loads it (quietly:
    that is the meaning of the default ModelCheckpoint's best_model_path)."""
    trainer = quiet_trainer(max_epochs=2, enable_checkpointing=True, default_root_dir=tmp_path)
    model = TinyModule()
    trainer.fit(model, loader(32, 16), loader(32, 16))
    (result,) = trainer.validate(model, loader(32, 16), ckpt_path="best", verbose=False)
    assert trainer.ckpt_path == str(tmp_path / "checkpoints" / "epoch=1-step=4.ckpt")
    assert math.isclose(result["val_loss"], _single_loss(model, loader(32, 16)), rel_tol=1e-6)
    with pytest.raises(TandemConfigError, match=r"ckpt_path='best'\) needs a ModelCheckpoint"):
        quiet_trainer().validate(model, loader(), ckpt_path="best")


# ---------------------------------------------------------------------------------------------- DDP


@pytest.mark.timeout(150)
def test_each_loader_is_sharded_exactly_under_ddp_and_metrics_equal_one_process(core_ddp, scripts_on_path):
    import manual_modules

    rank0, rank1 = core_ddp["loaders"]
    assert rank0["num_val_batches"] == [6, 3] and rank1["num_val_batches"] == [5, 3]  # 51 + 50, 19 + 18 samples
    assert {k: rank0["seen"][k] + rank1["seen"][k] for k in (0, 1)} == {0: 101, 1: 37}  # no sample twice
    model = manual_modules.Evaluated()
    model.load_state_dict(rank0["weights"])
    expected_val = quiet_trainer().validate(model, manual_modules.eval_loaders(), verbose=False)
    expected_test = quiet_trainer().test(model, manual_modules.eval_loaders(), verbose=False)
    expected_predict = quiet_trainer().predict(model, manual_modules.eval_loaders())
    for result in (rank0, rank1):
        for got, expected in ((result["validate"], expected_val), (result["test"], expected_test)):
            assert [set(g) for g in got] == [set(e) for e in expected]
            for g, e in zip(got, expected):
                for name, value in e.items():
                    assert math.isclose(g[name], value, rel_tol=1e-6, abs_tol=1e-7), (name, g[name], value)
        for got, expected in zip(result["predict"], expected_predict):  # every sample, in order, on every rank
            assert torch.equal(torch.cat([p["x0"] for p in got]), torch.cat([p["x0"] for p in expected]))
            torch.testing.assert_close(
                torch.cat([p["logits"] for p in got]), torch.cat([p["logits"] for p in expected])
            )


# ---------------------------------------------------------------------- setup(stage) and the loader hooks
class FitOnlyData(tandem.DataModule):
    """Builds the training and validation data for "fit" only."""

    def setup(self, stage):
        if stage == "fit":
            self.train_ds, self.val_ds = make_data(32), make_data(16)

    def train_dataloader(self):
        return DataLoader(self.train_ds, batch_size=16)

    def val_dataloader(self):
        return DataLoader(self.val_ds, batch_size=16)

    def test_dataloader(self):
        return DataLoader(self.test_ds, batch_size=16)


def test_a_setup_without_stage_is_refused_before_anything_runs_naming_the_signature():
    class NoStage(FitOnlyData):
        def setup(self):
            self.train_ds = make_data(32)

    with pytest.raises(TandemUserCodeError, match=r"NoStage.setup\(\) cannot be called as setup\(stage\)") as caught:
        quiet_trainer(max_epochs=1).fit(TinyModule(), datamodule=NoStage())
    assert "'fit', 'validate', 'test' or 'predict'" in str(caught.value)
    assert "def setup(self, stage: str)" in str(caught.value)

    class OldCallback(tandem.Callback):
        def teardown(self, trainer, pl_module):
            pass

    with pytest.raises(TandemUserCodeError, match=r"OldCallback.teardown\(trainer, pl_module\) cannot be called"):
        quiet_trainer(max_epochs=1, callbacks=[OldCallback()]).fit(TinyModule(), datamodule=FitOnlyData())


def test_a_loader_hook_reading_what_setup_did_not_build_for_the_stage_names_the_stage():
    """``setup`` builds only the "fit" data, then ``trainer.test``: Python said only "no attribute 'test_ds'"."""
    trainer, model, data = quiet_trainer(max_epochs=1), TinyModule(), FitOnlyData()
    trainer.fit(model, datamodule=data)
    with pytest.raises(AttributeError, match=r"FitOnlyData.test_dataloader\(\) reads self.test_ds") as caught:
        trainer.test(model, datamodule=data)
    message = str(caught.value)
    assert "setup('test') ran just before it and did not create it" in message
    assert "Create self.test_ds in setup when stage == 'test'" in message


def test_setup_comparing_stage_with_train_names_the_stages_and_the_one_that_ran():
    """``stage == "train"`` never holds: Python suggested "Did you mean: 'trainer'?"."""

    class TrainTypo(FitOnlyData):
        def setup(self, stage):  # the string is in setup's own code, where tandem looks for it
            if stage == "train":
                self.train_ds, self.val_ds = make_data(32), make_data(16)

    with pytest.raises(AttributeError, match=r"TrainTypo.train_dataloader\(\) reads self.train_ds") as caught:
        quiet_trainer(max_epochs=1).fit(TinyModule(), datamodule=TrainTypo())
    message = str(caught.value)
    assert "one of 'fit' (trainer.fit, which validates too), 'validate', 'test' or 'predict'" in message
    assert "this run's is 'fit'" in message and "if it tests stage == 'train', test stage == 'fit'" in message


def test_an_attribute_error_about_another_object_in_a_loader_hook_is_left_alone():
    class Broken(FitOnlyData):
        def train_dataloader(self):
            return self.train_ds.no_such_thing

    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'") as caught:
        quiet_trainer(max_epochs=1).fit(TinyModule(), datamodule=Broken())
    assert type(caught.value) is AttributeError


class LocalRankOne(tandem.strategies.SingleDeviceStrategy):
    """One process that plays local rank 1 of a node, where ``prepare_data`` does not run."""

    @property
    def local_rank(self) -> int:
        return 1


@pytest.mark.parametrize("reads_in", ["setup", "train_dataloader"])
def test_state_assigned_in_prepare_data_and_read_on_another_process_names_prepare_data_and_setup(reads_in):
    """prepare_data runs on local rank 0 only: its ``self.vocab`` is missing on rank 1, which before ended in an
    AttributeError inside the collective-mismatch report of the other ranks."""

    class Prepared(FitOnlyData):
        def prepare_data(self):
            self.vocab = {"a": 0}

        def setup(self, stage):
            self.train_ds, self.val_ds = make_data(32), make_data(16)
            if reads_in == "setup":
                self.size = len(self.vocab)

        def train_dataloader(self):
            return DataLoader(self.train_ds, batch_size=len(self.vocab) * 16)

    with pytest.raises(AttributeError, match=rf"Prepared.{reads_in}\(\) reads self.vocab") as caught:
        quiet_trainer(max_epochs=1, strategy=LocalRankOne("cpu")).fit(TinyModule(), datamodule=Prepared())
    message = str(caught.value)
    assert "does not exist on this process (global rank 0, local rank 1)" in message
    assert "Prepared.prepare_data assigns self.vocab, but prepare_data runs on one process per node" in message
    assert "assign state (self.vocab = ...) in setup(stage), which runs on every process" in message
    data = Prepared()
    quiet_trainer(max_epochs=1).fit(TinyModule(), datamodule=data)  # on local rank 0 it runs
    assert data.vocab == {"a": 0}


# ---------------------------------------------------------------------------------------------- evaluation loaders as Lightning's
class EpochsSeen(torch.utils.data.SequentialSampler):
    """Records each ``set_epoch`` it gets."""

    def __init__(self, data, seen: list[int]) -> None:
        super().__init__(data)
        self.seen = seen

    def set_epoch(self, epoch: int) -> None:
        self.seen.append(epoch)


def test_evaluation_samplers_get_the_epoch_as_lightning_gives_it():
    # measured with Lightning 2.6.6 (the same program): fit [0, 0, 1], then validate 2, test 2, a new Trainer's test 0
    data, val_seen, test_seen, fresh_seen = make_data(32), [], [], []
    val = DataLoader(data, batch_size=16, sampler=EpochsSeen(data, val_seen))
    model, trainer = TinyModule(), quiet_trainer(max_epochs=2, num_sanity_val_steps=1)
    trainer.fit(model, loader(32), val)
    assert val_seen == [0, 0, 1]  # the sanity check's pass, then each epoch's
    trainer.validate(model, val, verbose=False)
    trainer.test(model, DataLoader(data, batch_size=16, sampler=EpochsSeen(data, test_seen)), verbose=False)
    assert val_seen == [0, 0, 1, 2] and test_seen == [2]  # once, with the fit's epoch
    quiet_trainer().test(model, DataLoader(data, batch_size=16, sampler=EpochsSeen(data, fresh_seen)), verbose=False)
    assert fresh_seen == [0]


def test_the_trainer_exposes_the_loaders_it_was_given():
    train, val = loader(32), [loader(16), loader(16)]
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(TinyModuleWithIdx(), train, val)
    assert trainer.train_dataloader is train  # one process: the loader passed, as Lightning's
    assert isinstance(trainer.val_dataloaders, list) and all(a is b for a, b in zip(trainer.val_dataloaders, val))


class TinyModuleWithIdx(TinyModule):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))


@pytest.mark.parametrize(("limit", "batches"), [(2.0, 2), (1e50, 4)])
def test_a_whole_float_limit_above_one_counts_batches(limit, batches):
    trainer = quiet_trainer(limit_val_batches=limit, limit_test_batches=limit)
    assert trainer.limit_val_batches == int(limit) and isinstance(trainer.limit_val_batches, int)
    trainer.validate(TinyModule(), loader(64, 16), verbose=False)
    assert trainer.num_val_batches == [batches]


def test_a_fractional_limit_above_one_is_refused():
    with pytest.raises(TandemConfigError, match=r"limit_val_batches=1\.5"):
        quiet_trainer(limit_val_batches=1.5)


class _WithEvaluation(TinyModule):
    """A module with its own loaders, for turning one stage off on the instance."""

    def train_dataloader(self):
        return loader(32)

    def val_dataloader(self):
        raise AssertionError("turned off: never requested")

    def test_dataloader(self):
        return loader(16)


@pytest.mark.parametrize("off", ["val_dataloader", "validation_step"])
def test_a_stage_set_to_none_on_the_instance_is_turned_off(off):
    """Lightning's idiom ``model.val_dataloader = None`` / ``model.validation_step = None``: no validation this run."""
    model = _WithEvaluation()
    setattr(model, off, None)
    if off == "validation_step":
        model.val_dataloader = lambda: loader(16)
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2)
    if off == "val_dataloader":
        with pytest.warns(tandem.utilities.PossibleUserWarning, match="no validation data"):
            trainer.fit(model)
    else:
        with pytest.warns(UserWarning, match="has no validation_step"):
            trainer.fit(model)
    assert trainer.num_val_batches in ([], [0]) and "val_loss" not in trainer.callback_metrics


def test_a_step_set_to_none_on_the_instance_is_missing_for_its_entry_point():
    model = _WithEvaluation()
    model.test_step = None
    with pytest.raises(TandemUserCodeError, match="test_step"):
        quiet_trainer().test(model, verbose=False)


class CountingData(torch.utils.data.Dataset):
    """Counts the items read: a dataset whose items depend on the training state (or draw from the RNG) sees exactly
    the reads Lightning makes."""

    def __init__(self, n: int = 64) -> None:
        self.data, self.reads = make_data(n), 0

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        self.reads += 1
        return self.data[index]


def test_the_batch_past_a_limit_train_batches_count_is_never_read():
    data = CountingData()
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=3)
    trainer.fit(TinyModule(), DataLoader(data, batch_size=4, shuffle=True))
    assert data.reads == 2 * 3 * 4  # Lightning's count: not a fourth batch each epoch


class LoaderOrder(TinyModule):
    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls

    def train_dataloader(self):
        self.calls.append("train_dataloader")
        return loader(32)

    def val_dataloader(self):
        self.calls.append("val_dataloader")
        return loader(16)

    def on_train_start(self):
        self.calls.append("on_train_start")

    def on_train_epoch_start(self):
        self.calls.append(f"on_train_epoch_start({self.current_epoch})")


def test_the_training_iterator_is_made_with_its_loader_as_in_lightning(monkeypatch):
    """Lightning makes the first epoch's iterator as soon as it has the loader (before asking for the validation
    loader and on_train_start), a later epoch's after on_train_epoch_start, and after a reload both (the one made
    with the loader is dropped): the base seeds it draws fall at the same points of the RNG sequence."""
    calls: list[str] = []
    made = torch.utils.data.dataloader._BaseDataLoaderIter.__init__

    def making(iterator, loader):  # making an iterator draws the DataLoader's base seed from torch's RNG
        calls.append("iter(train)" if len(loader.dataset) == 32 else "iter(val)")
        made(iterator, loader)

    monkeypatch.setattr(torch.utils.data.dataloader._BaseDataLoaderIter, "__init__", making)
    quiet_trainer(max_epochs=2).fit(LoaderOrder(calls))
    assert calls == [
        "train_dataloader",
        "iter(train)",
        "val_dataloader",
        "on_train_start",
        "on_train_epoch_start(0)",
        "iter(val)",
        "on_train_epoch_start(1)",
        "iter(train)",
        "iter(val)",
    ]
    del calls[:]
    quiet_trainer(max_epochs=2, reload_dataloaders_every_n_epochs=1, limit_val_batches=0).fit(LoaderOrder(calls))
    assert calls == [
        "train_dataloader",
        "iter(train)",
        "on_train_start",
        "on_train_epoch_start(0)",
        "train_dataloader",
        "iter(train)",
        "on_train_epoch_start(1)",
        "iter(train)",
    ]
