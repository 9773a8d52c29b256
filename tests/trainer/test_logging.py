"""What self.log collects: defaults, naming, epoch aggregation by sums and counts, torchmetrics, routing."""

from __future__ import annotations

import functools
import math
import random
import re
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import tandem
from helpers import TinyModule, loader, quiet_trainer
from tandem.loggers.logger import Logger
from tandem.trainer.hooks import running_hook
from tandem.trainer.logging.collector import MetricCollector
from tandem.trainer.state import TrainerState
from tandem.utilities.exceptions import MisconfigurationException, PossibleUserWarning, TandemUserCodeError

pytestmark = pytest.mark.timeout(30)


class RecordingLogger(Logger):
    def __init__(self):
        super().__init__(".", name="recording", version=0)
        self.records: list[tuple[int, dict[str, float]]] = []
        self.hparams = None

    def log_metrics(self, metrics, step):
        self.records.append((step, dict(metrics)))

    def log_hyperparams(self, params):
        self.hparams = dict(params)

    def save(self):
        pass

    def finalize(self, status):
        self.status = status


def test_defaults_and_names_for_step_and_epoch_values():
    class Logs(TinyModule):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("both", float(batch_idx), on_step=True, on_epoch=True, reduce_fx="max")
            self.log("epoch_sum", 1.0, on_epoch=True, on_step=False, reduce_fx="sum")
            return loss

        def on_train_epoch_end(self):
            self.log("at_end", 7.0)  # epoch-end hooks default to on_epoch

    logger = RecordingLogger()
    trainer = quiet_trainer(max_epochs=2, logger=logger, log_every_n_steps=2)
    trainer.fit(Logs(lr=0.01), loader(64, 16), loader(32, 16))
    metrics = trainer.callback_metrics
    assert float(metrics["both_epoch"]) == 3.0 and float(metrics["both"]) == 3.0
    assert float(metrics["epoch_sum"]) == 4.0
    assert float(metrics["at_end"]) == 7.0
    steps = [(s, set(m)) for s, m in logger.records if "train_loss" in m]
    assert [s for s, _ in steps] == [1, 3, 5, 7]  # Lightning's: the stepped batches before the logging one
    assert all(keys == {"train_loss", "both_step", "epoch"} for _, keys in steps)
    assert [m["epoch"] for _, m in logger.records if "train_loss" in m] == [0, 0, 1, 1]  # every row names its epoch
    epoch_records = [m for _, m in logger.records if "both_epoch" in m]
    assert [m["epoch"] for m in epoch_records] == [0, 1]
    # the epoch's values at its last batch's step, as its validation's (Lightning 2.6.6 writes both at 3 and 7)
    assert [s for s, m in logger.records if "both_epoch" in m] == [3, 7]
    assert [s for s, m in logger.records if "val_loss" in m] == [3, 7]  # validation at the last batch's step
    assert {"both_epoch", "epoch_sum", "at_end"} <= set(epoch_records[0])
    val_records = [m for _, m in logger.records if "val_loss" in m]
    assert len(val_records) == 2  # validation epoch values, once per epoch (not during the sanity check)
    assert logger.hparams == {"lr": 0.01, "optimizer": "sgd", "dropout": 0.0, "scheduler": False}
    assert logger.status == "success"
    assert "epoch" not in trainer.logged_metrics  # as Lightning: the loggers' rows get it, logged_metrics does not
    assert "train_loss" in trainer.progress_bar_metrics


def test_epoch_mean_is_weighted_by_batch_size():
    values = torch.arange(10, dtype=torch.float32)

    class Mean(TinyModule):
        def validation_step(self, batch, batch_idx):
            self.log("mean_x", batch[0].mean())

    data = DataLoader(TensorDataset(values, values), batch_size=4)  # batches of 4, 4, 2
    (result,) = quiet_trainer().validate(Mean(), data)
    assert result["mean_x"] == pytest.approx(4.5)  # a mean of batch means would give 5.0


def test_torchmetrics_metric_is_computed_at_epoch_end():
    torchmetrics = pytest.importorskip("torchmetrics")

    class WithMetric(TinyModule):
        def __init__(self):
            super().__init__()
            self.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.acc(self(x), y)
            self.log("acc", self.acc)
            self.log("plain_acc", (self(x).argmax(1) == y).float().mean())

    (result,) = quiet_trainer().validate(WithMetric(), loader(50, 16))
    assert result["acc"] == pytest.approx(result["plain_acc"], abs=1e-6)


def test_collector_reduces_sums_and_counts_across_processes():
    """With sync_dist, the epoch mean is (sum of weighted sums) / (sum of counts), not a mean of means."""
    flags = (False, True, False, True)
    strategy = TwoRanks({"epoch/m": ("mean", True, flags)}, {"epoch/m": (30.0, 10.0)})  # rank 1: 3 over 10 samples
    collector = MetricCollector(strategy, TrainerState(stage="validate"))
    with running_hook("validation_step"):
        collector.log(
            "m",
            torch.tensor(2.0),  # rank 0: mean 2 over 2 samples
            on_step=None,
            on_epoch=None,
            prog_bar=False,
            logger=True,
            sync_dist=True,
            reduce_fx="mean",
            batch_size=2,
        )
    values = collector.epoch_metrics()
    assert values["m"].item() == pytest.approx(34.0 / 12.0)


def test_logged_values_hold_no_graph_and_a_value_without_one_is_kept_as_it_is():
    """A value with a graph is kept detached (the step's graph is freed after backward, and an epoch sum builds none);
    one without a graph (evaluation, torch.no_grad) is kept as it is, with no copy."""
    collector = MetricCollector(SimpleNamespace(world_size=1, replica_groups=None), TrainerState(stage="train"))
    weight = torch.tensor(3.0, requires_grad=True)
    with_graph, plain = weight * 2, torch.tensor(5.0)
    options = dict(prog_bar=False, logger=True, sync_dist=False, reduce_fx="sum", batch_size=1)
    with running_hook("training_step"):
        collector.log("with_graph", with_graph, on_step=True, on_epoch=True, **options)
        collector.log("plain", plain, on_step=True, on_epoch=False, **options)
    kept = collector.callback_metrics["with_graph_step"]
    assert not kept.requires_grad and kept.grad_fn is None and kept.item() == 6.0
    assert collector.callback_metrics["plain"] is plain
    epoch = collector.epoch_metrics()["with_graph_epoch"]
    assert not epoch.requires_grad and epoch.item() == 6.0


def test_epoch_values_without_sync_dist_under_several_processes_warn_once():
    """As Lightning: an epoch value each process aggregates alone is rank 0's share; say so, naming sync_dist."""
    options = dict(on_step=None, on_epoch=None, prog_bar=False, logger=True, reduce_fx="mean", batch_size=2)
    collector = MetricCollector(TwoRanks({}), TrainerState(stage="validate"))
    with running_hook("validation_step"):
        collector.log("alone", torch.tensor(1.0), sync_dist=False, **options)
        collector.log("synced", torch.tensor(1.0), sync_dist=True, **options)
        collector.log("rank0", torch.tensor(1.0), sync_dist=False, rank_zero_only=True, **options)
    with pytest.warns(UserWarning, match=r"without sync_dist=True under 2 processes: \['alone'\].*sync_dist=True"):
        collector.epoch_metrics()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collector.epoch_metrics()  # once


def test_log_outside_a_trainer_is_ignored_with_one_warning(monkeypatch):
    from tandem.module import logging as module_logging

    monkeypatch.setattr(module_logging, "_LOG_WITHOUT_TRAINER_WARNED", False)
    module = TinyModule()
    x, y = next(iter(loader()))
    with pytest.warns(UserWarning, match=r"self.log\('train_loss', ...\).*not attached to a Trainer") as record:
        module.training_step((x, y), 0)  # must not raise without a trainer
        module.training_step((x, y), 1)
    assert len([w for w in record if "not attached to a Trainer" in str(w.message)]) == 1


def two_loaders():
    return [loader(32, 16), loader(16, 16)]


def test_one_name_from_two_loaders_with_add_dataloader_idx_false_is_an_error():
    class Shared(TinyModule):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("val_loss", float(dataloader_idx), add_dataloader_idx=False)

    with pytest.raises(TandemUserCodeError, match=r"dataloader 1, but 'val_loss' was already logged from dataloader 0"):
        quiet_trainer().validate(Shared(), two_loaders())

    class OwnNames(TinyModule):  # the fix the message names
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.log(f"val_loss_{dataloader_idx}", float(dataloader_idx), add_dataloader_idx=False)

        def on_validation_epoch_end(self):
            self.log("val_loss", 5.0, add_dataloader_idx=False)  # no loader runs here: one value, no mix-up

    first, second = quiet_trainer().validate(OwnNames(), two_loaders())
    assert first["val_loss_0"] == 0.0 and second["val_loss_1"] == 1.0 and first["val_loss"] == 5.0


def test_each_loaders_results_hold_its_own_add_dataloader_idx_false_values():
    """As Lightning splits them: a name logged without the suffix belongs to the loader it was logged from; what the
    epoch-end hook logs (no loader) belongs to every loader's results."""

    class OwnNames(TinyModule):
        def test_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("shared", 1.0 + dataloader_idx)
            self.log(f"only_{dataloader_idx}", 10.0 * (dataloader_idx + 1), add_dataloader_idx=False)

        def on_test_epoch_end(self):
            self.log("everywhere", 3.0)

    first, second = quiet_trainer().test(OwnNames(), two_loaders())
    assert first == {"shared/dataloader_idx_0": 1.0, "only_0": 10.0, "everywhere": 3.0}
    assert second == {"shared/dataloader_idx_1": 2.0, "only_1": 20.0, "everywhere": 3.0}


def test_loggers_get_the_rows_by_keyword_as_lightning_calls_them():
    class KeywordOnly(RecordingLogger):
        def log_metrics(self, *, metrics, step):  # Lightning calls logger.log_metrics(metrics=..., step=...)
            self.records.append((step, dict(metrics)))

    logger = KeywordOnly()
    quiet_trainer(max_epochs=1, logger=logger, log_every_n_steps=1).fit(TinyModule(), loader(32, 16))
    assert [step for step, _ in logger.records] == [0, 1]


@pytest.mark.parametrize(
    ("hook", "options"),
    [
        ("on_train_epoch_end", {"on_step": True}),
        ("on_validation_epoch_end", {"on_step": True}),
        ("on_train_epoch_start", {"on_epoch": False}),
        ("on_train_start", {"on_step": True, "on_epoch": False}),
    ],
)
def test_step_values_in_once_per_epoch_hooks_are_an_error(hook, options):
    def log(self):
        self.log("x", 1.0, **options)

    module = type("Logs", (TinyModule,), {hook: log})()
    with pytest.raises(TandemUserCodeError, match=rf"inside {hook}: this hook runs once, not per step"):
        quiet_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1).fit(module, loader(), loader(16))


@pytest.mark.parametrize(
    ("hook", "where"),
    [
        ("predict_step", "inside predict_step"),
        ("on_predict_epoch_end", "inside on_predict_epoch_end"),
        ("on_fit_start", "inside on_fit_start"),
        ("on_train_end", "inside on_train_end"),
        ("on_validation_end", "inside on_validation_end"),
        ("setup", "outside the hooks the Trainer runs"),
        ("configure_optimizers", "outside the hooks the Trainer runs"),
    ],
)
def test_log_where_the_value_would_go_nowhere_is_an_error(hook, where):
    def method(self, *args, **kwargs):
        self.log("x", 1.0)
        return getattr(TinyModule, hook)(self, *args, **kwargs)

    module = type("Logs", (TinyModule,), {hook: method})()
    trainer = quiet_trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    with pytest.raises(TandemUserCodeError, match=rf"self.log\('x', ...\) was called {where}.*, where logging is not"):
        if hook.startswith(("predict", "on_predict")):
            trainer.predict(module, loader(16))
        else:
            trainer.fit(module, loader(), loader(16))


def test_values_logged_in_on_train_start_reach_the_first_epoch():
    class AtStart(TinyModule):
        def on_train_start(self):
            self.log("at_start", 3.0)

    logger = RecordingLogger()
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=2, logger=logger)
    trainer.fit(AtStart(), loader())
    assert float(trainer.callback_metrics["at_start"]) == 3.0
    assert [m["epoch"] for _, m in logger.records if "at_start" in m] == [0]  # the first epoch's, once


def test_a_name_holding_the_dataloader_suffix_is_an_error():
    class Suffixed(TinyModule):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.log(f"val_loss/dataloader_idx_{dataloader_idx}", 1.0)

    with pytest.raises(MisconfigurationException, match="`self.log` with the key `val_loss/dataloader_idx_0`"):
        quiet_trainer().validate(Suffixed(), two_loaders())


def test_hparams_from_init_arguments():
    module = TinyModule(lr=0.5, optimizer="adam")
    assert module.hparams == {"lr": 0.5, "optimizer": "adam", "dropout": 0.0, "scheduler": False}
    assert module.hparams.lr == 0.5


def test_hparams_merge_base_and_subclass_init_arguments():
    class Child(TinyModule):
        def __init__(self, depth: int = 3):
            super().__init__(lr=0.5)

    assert Child().hparams == {"depth": 3, "lr": 0.5, "optimizer": "sgd", "dropout": 0.0, "scheduler": False}


class TwoRanks:
    """A stand-in strategy for two processes, to check the pairing logic without processes (the real
    thing runs in tests/strategies/test_ddp_trainer.py).

    ``all_gather_object`` returns this rank's object and the other rank's: its names ``theirs`` and its values
    ``their_values`` (name -> value, weight as floats), with this rank's note."""

    world_size = 2

    def __init__(self, theirs=None, their_values=None):
        self.theirs = theirs
        self.their_values = their_values or {}

    def reduce_if_agreed(self, layout, flags, sums, maxes):  # the names differ: the collector gathers them
        return None

    def all_gather_object(self, obj):  # the collector sends (names, note, values)
        mine, note, values = obj
        return [obj, (self.theirs, note, self.their_values)]


def test_sync_dist_names_with_different_reduce_fx_on_two_ranks_are_an_error():
    from tandem.trainer.logging.reduction import _agree

    flags = (False, True, False, True)
    with pytest.raises(Exception, match=r"reduce_fx='sum' on rank 0 and reduce_fx='max' on rank 1.*same reduce_fx"):
        _agree([{"epoch/x": ("sum", True, flags)}, {"epoch/x": ("max", False, flags)}])


def test_combine_by_name_leaves_out_a_rank_without_the_value_on_every_rank_alike():
    from tandem.trainer.logging.reduction import _as_local, as_floats, combine_by_name

    t = torch.tensor
    # rank 0 has a max "a", a mean "m" (sum 10 over 2), no "s"; rank 1 no "a", "m" (sum 2 over 2), "s" = 7, and an
    # integer max "i" (5 here, 9 there) and a max "n" that is NaN on rank 1
    local = {"a": (t(3.0), None), "m": (t(10.0), t(2.0)), "i": (t(5), None), "n": (t(1.0), None)}
    wanted = {name: (op, None) for name, op in (("a", "max"), ("m", "mean"), ("s", "sum"), ("i", "max"), ("n", "max"))}
    theirs = {"m": (2.0, 2.0), "s": (7.0, None), "i": (9.0, None), "n": (float("nan"), None)}
    out = combine_by_name(wanted, [as_floats(local), theirs])
    assert out["a"] == 3.0 and out["m"] == 3.0 and out["s"] == 7.0 and out["i"] == 9.0
    assert math.isnan(out["n"])
    assert combine_by_name({"z": ("sum", None)}, [{}, {}]) == {"z": None}  # logged by no rank
    # as this rank's tensors: its dtype (an integer max stays one), float32 where it sent nothing
    assert _as_local(out["m"], "mean", local["m"][0]).dtype == torch.float32
    assert _as_local(out["i"], "max", local["i"][0]).dtype == torch.int64 and int(out["i"]) == 9
    assert _as_local(out["s"], "sum", None).dtype == torch.float32


def _packed_reduction(packs):
    """What the ranks' :func:`pack` results come back as from ``Strategy.reduce_if_agreed``: sums added and flags and
    maxima taken in rank order (as the backend would, in some order)."""
    flags = torch.stack([p[2] for p in packs]).amax(0)
    sums = functools.reduce(torch.add, [p[3] for p in packs])
    maxes = torch.stack([p[4] for p in packs]).amax(0)
    return flags, sums.tolist(), maxes.tolist()


@pytest.mark.parametrize("ranks", [2, 3])
def test_packed_reduction_gives_the_gatherings_results(ranks):
    """When every rank sends the same names, the packed sums and maxima give what the gathering gives: bit for bit on
    two ranks (a sum of two is the same either way round), to the last bits on more; absent values, NaN, integers,
    min through a negated max, and the ranks' mean losses of a rollback window."""
    from tandem.trainer.logging.reduction import combine_by_name, pack, unpack

    flags = (True, True, False, True)
    ops = {"step/m": "mean", "epoch/w": "mean", "epoch/s": "sum", "step/x": "max", "step/n": "min", "epoch/i": "max"}
    mine = {key: (op, True, flags) for key, op in ops.items()}
    mine["metric/acc"] = ("metric", True, flags)
    mine["epoch/idle"] = ("sum", False, flags)  # not wanted by anyone this time
    generator = random.Random(ranks)
    everyone = []
    for rank in range(ranks):
        floats = {
            "step/m": (generator.uniform(-1, 1), None),
            "epoch/w": (generator.uniform(0, 9), float(generator.randint(1, 5))),
            "epoch/s": (None, None) if rank == 1 else (generator.uniform(-3, 3), 2.0),  # rank 1 had none
            "step/x": (math.nan if rank == ranks - 1 else generator.uniform(-1, 1), None),
            "step/n": (generator.uniform(-1, 1), None),
            "epoch/i": (float(generator.randint(0, 99)), None),
            "epoch/idle": (1.0, 1.0),
        }
        everyone.append(floats)
    windows = [[(4, generator.uniform(0, 2)), (5, None if rank == 0 else generator.uniform(0, 2))] for rank in range(2)]
    windows += [[(4, 1.0), (5, 2.0)]] * (ranks - 2)
    packs = [pack(mine, everyone[r], (True, r == 1, None, windows[r])) for r in range(ranks)]
    assert len({p[0] for p in packs}) == 1  # the same layout: the values may travel packed
    wanted = packs[0][1]
    assert list(wanted) == sorted(key for key in mine if key != "epoch/idle")
    reduced_flags, sums, maxes = _packed_reduction(packs)
    assert reduced_flags.tolist() == [0, 1, 0, 0]  # rank 1 asked to stop; every loss finite, no empty batch
    results, means = unpack(wanted, sums, maxes, windows[0])
    expected = combine_by_name(wanted, everyone)
    assert set(results) == set(expected) == set(ops)
    assert math.isnan(results["step/x"]) and math.isnan(expected["step/x"])
    for key in ops.keys() - {"step/x"}:
        if ranks == 2:
            assert results[key] == expected[key], key
        else:
            assert results[key] == pytest.approx(expected[key], rel=1e-15), key
    second = [w[1][1] for w in windows if w[1][1] is not None]
    assert means == [
        (4, pytest.approx(sum(w[0][1] for w in windows) / ranks)),
        (5, pytest.approx(sum(second) / len(second))),
    ]


def test_the_layout_of_a_packed_reduction_follows_the_names_and_options_not_their_order():
    from tandem.trainer.logging.reduction import pack

    flags = (True, False, False, True)
    mine = {"step/a": ("mean", True, flags), "step/b": ("max", True, flags)}
    floats = {"step/a": (1.0, None), "step/b": (2.0, None)}
    layout = pack(mine, floats)[0]
    assert pack(dict(reversed(mine.items())), {"step/a": (5.0, None), "step/b": (6.0, None)})[0] == layout
    assert pack({**mine, "step/c": ("mean", True, flags)}, floats)[0] != layout  # a name more
    assert pack({**mine, "step/b": ("min", True, flags)}, floats)[0] != layout  # another reduce_fx
    assert pack({**mine, "step/b": ("max", True, (True, False, True, True))}, floats)[0] != layout  # prog_bar
    note = (True, False, None, [(0, 1.0)])
    assert pack(mine, floats, note)[0] != layout  # a window to reduce
    assert pack(mine, floats, (True, False, None, [(0, None)]))[0] == pack(mine, floats, note)[0]  # a None loss
    assert pack(mine, floats, (True, False, None, [(1, 1.0)]))[0] != pack(mine, floats, note)[0]  # other batches
    # the notes that make every rank gather (to name the ranks) are flags, not layout
    assert pack(mine, floats, (False, False, "empty", [(0, math.nan)]))[2].tolist() == [1, 0, 1, 1]


def test_as_floats_reads_each_value_exactly_whatever_its_dtype():
    """Values sent for a reduction by name are read without rounding: float32 and 16-bit floats through float32 (exact
    in a Python float), float64 sums and large integer counts through float64."""
    from tandem.trainer.logging.reduction import as_floats

    third = 1 / 3
    narrow = {"f32": (torch.tensor(third), torch.tensor(3.0)), "bf16": (torch.tensor(0.1, dtype=torch.bfloat16), None)}
    assert as_floats(narrow) == {
        "f32": (torch.tensor(third).double().item(), 3.0),
        "bf16": (torch.tensor(0.1, dtype=torch.bfloat16).double().item(), None),
    }
    wide = {"f64": (torch.tensor(third, dtype=torch.float64), None), "f32": (torch.tensor(third), None)}
    wide["count"] = (torch.tensor(2**24 + 1, dtype=torch.int64), None)  # not exact in float32
    floats = as_floats(wide)
    assert floats["f64"] == (third, None) and floats["count"] == (float(2**24 + 1), None)
    assert floats["f32"] == (torch.tensor(third).double().item(), None)


def test_validation_step_values_logged_on_step_reach_the_loggers_at_each_loaders_batch_count():
    class StepLogs(TinyModule):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("val_x", float(batch_idx), on_step=True, on_epoch=False)
            self.log("val_both", 1.0, on_step=True, on_epoch=True)

    logger = RecordingLogger()
    trainer = quiet_trainer(max_epochs=2, logger=logger, log_every_n_steps=50, num_sanity_val_steps=1)
    trainer.fit(StepLogs(), loader(32, 16), [loader(32, 16), loader(16, 16)])
    first = [(s, m) for s, m in logger.records if "val_x/dataloader_idx_0" in m]
    second = [(s, m) for s, m in logger.records if "val_x/dataloader_idx_1" in m]
    # Lightning's steps: each loader's batches counted across the fit's validations, the sanity check not counted
    assert [s for s, _ in first] == [0, 1, 2, 3] and [m["val_x/dataloader_idx_0"] for _, m in first] == [0, 1, 0, 1]
    assert [s for s, _ in second] == [0, 1]
    assert all("val_both_step/dataloader_idx_0" in m and "epoch" not in m for _, m in first)
    trainer.validate(StepLogs(), loader(32, 16))  # a new entry point counts from 0 again
    assert [s for s, m in logger.records if "val_x" in m] == [0, 1]


def test_values_logged_in_on_train_batch_end_are_in_the_same_steps_row():
    """As Lightning: a logging step publishes after on_train_batch_end (the module's and the callbacks'), so what
    they log lands in that step's row, not in the next logging step's."""

    class AtBatchEnd(TinyModule):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            self.log("module_idx", float(batch_idx))

    class Callback(tandem.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            module.log("callback_idx", float(batch_idx))

    logger = RecordingLogger()
    trainer = quiet_trainer(max_epochs=1, logger=logger, log_every_n_steps=2, callbacks=[Callback()])
    trainer.fit(AtBatchEnd(), loader(64, 8))
    rows = [(step, m) for step, m in logger.records if "module_idx" in m]
    assert [step for step, _ in rows] == [1, 3, 5, 7]
    assert all(m["module_idx"] == m["callback_idx"] == step for step, m in rows), rows


def test_a_validations_values_are_written_before_on_validation_end():
    """As Lightning: the validation's epoch values reach the loggers (and trainer.logged_metrics) before the
    on_validation_end hooks, so a callback there reads this validation's, not the one before."""
    seen = []

    class Epochs(TinyModule):
        def validation_step(self, batch, batch_idx):
            self.log("val_epoch", float(self.current_epoch))

    class Reader(tandem.Callback):
        def on_validation_end(self, trainer, module):
            if not trainer.sanity_checking:
                seen.append(float(trainer.logged_metrics.get("val_epoch", -1)))

    quiet_trainer(max_epochs=2, logger=RecordingLogger(), callbacks=[Reader()]).fit(Epochs(), loader(), loader())
    assert seen == [0.0, 1.0]


def test_logged_metrics_hold_the_latest_training_step_values_written_or_not():
    """As Lightning, which updates ``logged_metrics`` after every training batch: after the fit it holds the last
    batch's step values, not the last publishing step's."""

    class Indexed(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("idx", float(batch_idx))
            return super().training_step(batch, batch_idx)

    trainer = quiet_trainer(max_epochs=1, logger=RecordingLogger(), log_every_n_steps=3)
    trainer.fit(Indexed(), loader(64, 8))  # 8 batches: written at batches 2 and 5
    assert [m["idx"] for _, m in trainer.logger.records if "idx" in m] == [2.0, 5.0]
    assert trainer.logged_metrics["idx"] == 7.0


def test_evaluation_step_values_are_not_callback_metrics():
    """As Lightning: an evaluation step value goes to the loggers (and the progress bar), but callback_metrics hold only
    evaluation epoch values."""

    class Both(TinyModule):
        def validation_step(self, batch, batch_idx):
            self.log("val_step_only", 1.0, on_step=True, on_epoch=False)
            self.log("val_both", 2.0, on_step=True, on_epoch=True)

    logger = RecordingLogger()
    trainer = quiet_trainer(logger=logger)
    trainer.validate(Both(), loader(32, 16))
    assert {"val_both", "val_both_epoch"} <= set(trainer.callback_metrics)
    assert not {"val_step_only", "val_both_step"} & set(trainer.callback_metrics)
    assert [m["val_step_only"] for _, m in logger.records if "val_step_only" in m] == [1.0, 1.0]


def test_rows_of_self_log_values_name_their_epoch_and_the_callbacks_rows_do_not():
    """As Lightning: a row of self.log values has an ``epoch`` value; a callback's own row (LearningRateMonitor's,
    through trainer.log_metrics) is the values alone, as Lightning's monitors write straight to the loggers."""
    from tandem.callbacks import LearningRateMonitor

    logger = RecordingLogger()
    trainer = quiet_trainer(max_epochs=1, logger=logger, log_every_n_steps=2, callbacks=[LearningRateMonitor()])
    trainer.fit(TinyModule(), loader(64, 16))
    rates = [m for _, m in logger.records if "lr-SGD" in m]
    losses = [m for _, m in logger.records if "train_loss" in m]
    assert rates and len(losses) == 2
    assert all("epoch" not in m for m in rates) and all(m["epoch"] == 0 for m in losses)


def test_each_entry_point_starts_with_its_own_callback_metrics():
    class Staged(TinyModule):
        def test_step(self, batch, batch_idx):
            self.log("test_only", 1.0)

    trainer = quiet_trainer(max_epochs=1)
    model = Staged()
    trainer.fit(model, loader(32, 16), loader(32, 16))
    assert {"train_loss", "val_loss"} <= set(trainer.callback_metrics)
    trainer.test(model, loader(32, 16))
    assert set(trainer.callback_metrics) == {"test_only"}  # as Lightning: fit's values are gone
    trainer.validate(model, loader(32, 16))
    assert "test_only" not in trainer.callback_metrics and "val_loss" in trainer.callback_metrics
    trainer.predict(model, loader(32, 16))
    assert trainer.callback_metrics == {} and trainer.logged_metrics == {} and trainer.progress_bar_metrics == {}


def test_training_metric_objects_stay_readable_through_the_epoch_end_validation_and_hooks():
    """As Lightning: the epoch's torchmetrics objects are computed and reset after the epoch-end validation and after
    on_train_epoch_end, so a callback reading ``compute()`` there gets the epoch's value (not 0 with torchmetrics'
    "compute before update" warning), and the next epoch starts from a reset object."""
    torchmetrics = pytest.importorskip("torchmetrics")

    class WithTrainAccuracy(TinyModule):
        def __init__(self):
            super().__init__()
            self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=3, average="micro")
            self.correct = self.total = 0

        def on_train_epoch_start(self):
            self.correct = self.total = 0

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self(x)
            self.train_acc(logits, y)
            self.correct += int((logits.argmax(1) == y).sum())
            self.total += len(y)
            self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
            return F.cross_entropy(logits, y)

    class Reader(tandem.Callback):
        def __init__(self):
            self.read: dict[str, list[float]] = {"on_validation_epoch_end": [], "on_train_epoch_end": []}
            self.expected: list[float] = []

        def on_validation_epoch_end(self, trainer, module):
            if not trainer.sanity_checking:
                self.read["on_validation_epoch_end"].append(float(module.train_acc.compute()))

        def on_train_epoch_end(self, trainer, module):
            self.read["on_train_epoch_end"].append(float(module.train_acc.compute()))
            self.expected.append(module.correct / module.total)
            assert float(trainer.callback_metrics["train_acc"]) == pytest.approx(self.expected[-1], abs=1e-6)

    reader = Reader()
    model = WithTrainAccuracy()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*compute.*before.*update.*")
        quiet_trainer(max_epochs=3, callbacks=[reader]).fit(model, loader(48, 16, shuffle=True), loader(32, 16))
    for hook, values in reader.read.items():
        assert values == pytest.approx(reader.expected, abs=1e-6), hook
    assert model.train_acc.update_count == 0  # reset once the epoch's value was logged


def test_logged_metrics_fill_at_logging_steps_without_a_logger():
    """As in Lightning, ``trainer.logged_metrics`` holds the values published at logging steps whether or not there
    is a logger (one process published nothing without one, so it stayed empty)."""
    trainer = quiet_trainer(max_steps=4, log_every_n_steps=2)
    trainer.fit(TinyModule(), loader(64, batch_size=4))
    assert set(trainer.logged_metrics) == {"train_loss"} and math.isfinite(trainer.logged_metrics["train_loss"])


def test_logged_metrics_get_evaluation_step_values_without_a_logger():
    """As in Lightning, an evaluation value logged per step reaches ``trainer.logged_metrics`` without a logger too."""

    class PerStep(TinyModule):
        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_step_loss", F.cross_entropy(self(x), y), on_step=True, on_epoch=False)

    trainer = quiet_trainer()
    trainer.validate(PerStep(), loader(16, batch_size=4))
    assert set(trainer.logged_metrics) == {"val_step_loss"}


# ---------------------------------------------------------------------- Lightning's types of the published values


class _LogsKinds(TinyModule):
    """Logs a tensor, a Python number and an integer tensor per step, a value both per step and per epoch, and an
    epoch-end value (the shapes compared with Lightning in test_logged_and_progress_bar_metrics_hold_lightnings_types)."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("b_first", loss * 2, prog_bar=True)
        self.log("a", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.log("n", 3)
        self.log("i", torch.tensor(4))
        return loss

    def on_train_epoch_end(self):
        self.log("z_epoch_end", 1.5)


def test_logged_and_progress_bar_metrics_hold_lightnings_types():
    """As Lightning 2.6.6 holds them (the same module run on Lightning, printed with each value's type):
    logged_metrics float32 tensors (an integer tensor too) in the order first logged; progress_bar_metrics floats;
    callback_metrics tensors, the plain name of a value logged per step and per epoch before its _step name."""
    trainer = quiet_trainer(max_epochs=2, limit_train_batches=3, log_every_n_steps=1)
    trainer.fit(_LogsKinds(), loader(48, 16))
    logged = trainer.logged_metrics
    assert list(logged) == ["train_loss", "b_first", "a_step", "n", "i", "a_epoch", "z_epoch_end"]
    assert all(type(v) is torch.Tensor and v.dtype == torch.float32 and v.ndim == 0 for v in logged.values())
    assert logged["i"].item() == 4.0 and logged["z_epoch_end"].item() == 1.5
    bar = trainer.progress_bar_metrics
    assert list(bar) == ["train_loss", "b_first", "a_step", "a_epoch"] and all(type(v) is float for v in bar.values())
    assert bar["a_epoch"] == logged["a_epoch"].item()
    assert list(trainer.callback_metrics)[:4] == ["train_loss", "b_first", "a", "a_step"]


def test_fast_dev_run_is_kept_as_given_and_the_logger_is_a_dummy(tmp_path):
    """Lightning's: trainer.fast_dev_run is the value given (1 reads as True), and a Trainer that had loggers gets a
    DummyLogger (save_dir None, version and name "", an experiment that takes any call) that writes nothing."""
    from tandem.loggers import DummyLogger

    for given, expected in ((True, True), (1, True), (False, False), (0, 0), (3, 3)):
        trainer = tandem.Trainer(default_root_dir=tmp_path, fast_dev_run=given, enable_progress_bar=False)
        assert trainer.fast_dev_run is expected or (type(expected) is int and trainer.fast_dev_run == expected)
        assert type(trainer.fast_dev_run) is type(expected)
        assert isinstance(trainer.logger, DummyLogger) == bool(given)
    assert tandem.Trainer(default_root_dir=tmp_path, fast_dev_run=True, logger=False).loggers == []

    class DrawsImages(TinyModule):
        def training_step(self, batch, batch_idx):
            self.logger.experiment.add_image("x", batch[0][:1])
            self.logger[0].experiment.add_histogram("w", self.net[0].weight)
            self.logger.log_metrics({"m": 1.0}, step=0)
            return super().training_step(batch, batch_idx)

    trainer = tandem.Trainer(default_root_dir=tmp_path, fast_dev_run=2, enable_progress_bar=False)
    logger = trainer.logger
    assert (logger.save_dir, logger.version, logger.name) == (None, "", "")
    trainer.fit(DrawsImages(), loader(64, 16), loader(32, 16))
    assert trainer.global_step == 2
    assert not (tmp_path / "lightning_logs").exists() and not (tmp_path / "tandem_logs").exists()


@pytest.mark.parametrize("value", [None, {"a": None}, {"a": 1}, "foo", [1, 2, 3], (1, 2, 3)])
def test_a_value_self_log_cannot_take_is_a_value_error(value):
    """Lightning raises ValueError; tandem's error is one (and still a TandemUserCodeError)."""

    class Logs(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("foo", value)
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match=re.escape(f"`self.log(foo, {value})` was called")) as caught:
        quiet_trainer(fast_dev_run=1).fit(Logs(), loader(32, 16))
    assert isinstance(caught.value, TandemUserCodeError)

    class Several(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("foo", torch.ones(2))
            return super().training_step(batch, batch_idx)

    with pytest.raises(ValueError, match="the tensor must have a single element"):
        quiet_trainer(fast_dev_run=1).fit(Several(), loader(32, 16))


def test_self_log_misuse_is_a_misconfiguration_exception_as_lightnings():
    """Lightning's MisconfigurationException for a hook that cannot log, a value published nowhere, and one name
    logged twice in a hook with different arguments."""

    class InFitStart(TinyModule):
        def on_fit_start(self):
            self.log("x", 1.0)

    with pytest.raises(MisconfigurationException, match="inside on_fit_start"):
        quiet_trainer(fast_dev_run=1).fit(InFitStart(), loader(32, 16))

    class Nowhere(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("x", 1.0, on_step=False, on_epoch=False)
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationException, match="is not useful"):
        quiet_trainer(fast_dev_run=1).fit(Nowhere(), loader(32, 16))

    class Twice(TinyModule):
        def training_step(self, batch, batch_idx):
            self.log("foo", -1, prog_bar=False)
            self.log("foo", -1, prog_bar=True)
            return super().training_step(batch, batch_idx)

    with pytest.raises(MisconfigurationException, match=r"self.log\(foo, ...\)` twice in `training_step`"):
        quiet_trainer(fast_dev_run=1).fit(Twice(), loader(32, 16))


class CountingHparams(RecordingLogger):
    def __init__(self):
        super().__init__()
        self.calls = []

    def log_hyperparams(self, params):
        self.calls.append(dict(params))


def test_hyperparameters_go_to_the_loggers_of_every_run_once_saved_for_them():
    class Saved(TinyModule):  # save_hyperparameters() in TinyModule's __init__
        pass

    class Unsaved(tandem.TrainingModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 3)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def validation_step(self, batch, batch_idx):
            pass

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Private(TinyModule):
        def __init__(self, lr: float = 0.1, optimizer: str = "sgd", scheduler: bool = False):
            super().__init__()
            self.save_hyperparameters(logger=False)  # checkpoints only

    class Data(tandem.DataModule):
        def __init__(self, batch_size: int = 16, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            return loader(32, self.hparams.batch_size)

    for module, datamodule, expected in [
        (Saved(lr=0.5), None, [{"lr": 0.5, "optimizer": "sgd", "dropout": 0.0, "scheduler": False}] * 2),
        (Unsaved(), None, []),
        (Private(), None, []),
        (Unsaved(), Data(), [{"batch_size": 16, "lr": 0.1}]),  # validate has no DataModule here
    ]:
        logger = CountingHparams()
        trainer = quiet_trainer(max_epochs=1, logger=logger)
        data = {"datamodule": datamodule} if datamodule is not None else {"train_dataloaders": loader(32, 16)}
        trainer.fit(module, **data)
        trainer.validate(module, loader(16), verbose=False)  # every entry point logs them, as Lightning's
        assert logger.calls == expected


def test_module_and_datamodule_hyperparameters_that_clash_are_an_error():
    class Data(tandem.DataModule):
        def __init__(self, lr: float = 0.01):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            return loader(32, 16)

    with pytest.raises(RuntimeError, match=r"Error while merging hparams: the keys \['lr'\]"):
        quiet_trainer(max_epochs=1, logger=CountingHparams()).fit(TinyModule(lr=0.1), datamodule=Data())
    # the same value on both sides is one hyperparameter
    quiet_trainer(max_epochs=1, logger=CountingHparams()).fit(TinyModule(lr=0.01), datamodule=Data())


def test_an_epoch_shorter_than_log_every_n_steps_warns_as_lightning():
    def fit(**kwargs):
        quiet_trainer(max_epochs=1, **kwargs).fit(TinyModule(), loader(64, 16))  # 4 batches

    with pytest.warns(PossibleUserWarning, match=r"The number of training batches \(4\) is smaller than the logging"):
        fit(logger=RecordingLogger(), log_every_n_steps=5)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="The number of training batches")
        fit(logger=RecordingLogger(), log_every_n_steps=4)  # one row an epoch
        fit(logger=False, log_every_n_steps=5)  # no logger: no row is missed
        fit(logger=RecordingLogger(), log_every_n_steps=5, fast_dev_run=True)
