"""The ``dataloader_iter`` flavour of a step (Lightning's): ``training_step(self, dataloader_iter)`` and the evaluation
steps take their batches with ``next(dataloader_iter)``; the batch hooks, the epoch's end, the limits, the exact resume
in the middle of an epoch, and the combinations refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import tandem
from helpers import max_abs_diff, quiet_trainer
from tandem.callbacks import BasePredictionWriter, ModelCheckpoint
from tandem.utilities.exceptions import MisconfigurationException, PossibleUserWarning, TandemConfigError

pytestmark = pytest.mark.filterwarnings(
    "ignore:Found `dataloader_iter` argument:tandem.utilities.exceptions.PossibleUserWarning"
)


def marked(n: int, seed: int = 0) -> TensorDataset:
    """``n`` samples whose first feature names them (``i / 1000``), with random targets."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    x[:, 0] = torch.arange(n) / 1000
    return TensorDataset(x, torch.randn(n, 1, generator=g))


def names(batch) -> list[int]:
    return [round(float(v) * 1000) for v in batch[0][:, 0]]


class Taking(tandem.TrainingModule):
    """Takes ``per_step`` batches a step (the ``StopIteration`` of a used-up iterator let out unless ``catch``);
    records the steps' batches and what the batch hooks got."""

    def __init__(self, per_step: int = 1, catch: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        self.per_step, self.catch = per_step, catch
        self.steps: list[tuple[int, list[list[int]]]] = []  # (epoch, the ids of each batch taken)
        self.starts: list[tuple[object, int]] = []
        self.ends: list[tuple[object, int]] = []
        self.epoch_ends = 0

    def training_step(self, dataloader_iter):
        taken = []
        for _ in range(self.per_step):
            if self.catch:
                try:
                    taken.append(next(dataloader_iter))
                except StopIteration:
                    break
            else:
                taken.append(next(dataloader_iter))
        self.steps.append((self.current_epoch, [names(batch) for batch, _, _ in taken]))
        if not taken:
            return None
        return sum(F.mse_loss(self.net(batch[0]), batch[1]) for batch, _, _ in taken)

    def on_train_batch_start(self, batch, batch_idx):
        self.starts.append((None if batch is None else names(batch), batch_idx))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.ends.append((names(batch), batch_idx))

    def on_train_epoch_end(self):
        self.epoch_ends += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def fit(model: Taking, data, **kwargs) -> tandem.Trainer:
    trainer = quiet_trainer(**{"max_epochs": 1, **kwargs})
    trainer.fit(model, data)
    return trainer


# ---------------------------------------------------------------------- training
def test_a_training_step_takes_its_batches_and_the_hooks_get_the_last_taken():
    """Lightning's order: on_train_batch_start gets the batch the previous step took last (None first, index 0),
    on_train_batch_end the one this step took last; next() gives (batch, batch_idx, 0)."""
    model = Taking()
    trainer = fit(model, DataLoader(marked(6), batch_size=2))
    assert [ids for _, ids in model.steps] == [[[0, 1]], [[2, 3]], [[4, 5]]]
    assert model.starts == [(None, 0), ([0, 1], 0), ([2, 3], 1)]
    assert model.ends == [([0, 1], 0), ([2, 3], 1), ([4, 5], 2)]
    assert trainer.global_step == 3


def test_several_training_loaders_give_their_combined_batch():
    seen = []

    class Combined(Taking):
        def training_step(self, dataloader_iter):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            seen.append(({key: names(part) for key, part in batch.items()}, batch_idx, dataloader_idx))
            return sum(F.mse_loss(self.net(part[0]), part[1]) for part in batch.values())

        def on_train_batch_start(self, batch, batch_idx): ...

        def on_train_batch_end(self, outputs, batch, batch_idx): ...

    loaders = {"a": DataLoader(marked(4), batch_size=2), "b": DataLoader(marked(6, 1), batch_size=2)}
    fit(Combined(), loaders)  # max_size_cycle: 3 batches, "a" starting over
    assert seen == [
        ({"a": [0, 1], "b": [0, 1]}, 0, 0),
        ({"a": [2, 3], "b": [2, 3]}, 1, 0),
        ({"a": [0, 1], "b": [4, 5]}, 2, 0),
    ]


def test_a_step_taking_two_batches_halves_the_steps_and_the_limit_counts_batches():
    model = Taking(per_step=2)
    trainer = fit(model, DataLoader(marked(16), batch_size=2))  # 8 batches: 4 steps
    assert len(model.steps) == 4 and trainer.global_step == 4
    assert model.ends[-1] == ([14, 15], 7)

    model = Taking(per_step=2, catch=True)
    trainer = fit(model, DataLoader(marked(16), batch_size=2), limit_train_batches=5)
    assert [len(ids) for _, ids in model.steps] == [2, 2, 1]  # the third step found the end after one batch
    assert trainer.global_step == 3


def test_a_stop_iteration_out_of_the_step_ends_the_epoch_and_the_next_starts_again():
    """The third step of each epoch meets the end of the 5 batches: its StopIteration ends the epoch (no step, no
    on_train_batch_end), the epoch's end runs, and the next epoch takes the batches from the start."""
    model = Taking(per_step=2)
    trainer = fit(model, DataLoader(marked(10), batch_size=2), max_epochs=2)
    assert [epoch for epoch, _ in model.steps] == [0, 0, 1, 1]
    assert model.steps[2] == (1, [[0, 1], [2, 3]])
    assert model.epoch_ends == 2 and len(model.ends) == 4
    assert trainer.global_step == 4


class Stream(IterableDataset):
    def __iter__(self):
        data = marked(6)
        for i in range(0, 6, 2):
            yield data[i : i + 2]


def test_a_loader_of_unknown_length_ends_where_a_step_finds_its_end():
    model = Taking(catch=True)
    with pytest.warns(tandem.utilities.exceptions.TandemWarning, match="training_step` returned `None`"):
        trainer = fit(model, DataLoader(Stream(), batch_size=None), max_epochs=2)
    # 3 batches, then a fourth step that finds the end (it takes nothing and returns no loss)
    assert [ids for _, ids in model.steps] == [[[0, 1]], [[2, 3]], [[4, 5]], []] * 2
    assert trainer.global_step == 8  # a step that returned None steps all the same (Lightning's)


def test_validation_inside_the_epoch_counts_steps():
    runs = []

    class Validating(Taking):
        def validation_step(self, batch, batch_idx):
            runs.append((self.trainer.global_step, batch_idx))

    model = Validating(per_step=2)
    trainer = quiet_trainer(max_epochs=1, val_check_interval=2, limit_val_batches=1)
    trainer.fit(model, DataLoader(marked(16), batch_size=2), DataLoader(marked(4), batch_size=2))
    assert runs == [(2, 0), (4, 0)]  # after the second step and at the epoch's end (the fourth)


def test_self_log_in_training_needs_a_batch_size():
    class Logging(Taking):
        def training_step(self, dataloader_iter):
            loss = super().training_step(dataloader_iter)
            self.log("with_size", loss, batch_size=2)
            self.log("loss", loss)
            return loss

    model = Logging()
    with pytest.raises(MisconfigurationException, match=r"dataloader_iter.*batch_size") as caught:
        fit(model, DataLoader(marked(4), batch_size=2))
    assert "self.log('loss'" in str(caught.value)
    assert model.trainer.callback_metrics["with_size"].ndim == 0  # given a batch size, it logs


def test_rolling_back_past_a_bad_batch_is_refused():
    with pytest.raises(TandemConfigError, match=r"on_nonfinite='rollback'.*dataloader_iter"):
        fit(Taking(), DataLoader(marked(4), batch_size=2), on_nonfinite="rollback")


def test_the_flavour_is_announced_as_lightning_does():
    with pytest.warns(PossibleUserWarning, match="Found `dataloader_iter` argument in the `training_step`"):
        fit(Taking(), DataLoader(marked(4), batch_size=2))


def test_a_mid_epoch_resume_continues_where_the_iterator_stood(tmp_path):
    """Two batches a step from a shuffled loader, with dropout: the checkpoint after the third step stands at batch
    6 of 10; the resumed run takes the same batches and ends with the same weights."""
    data = marked(20)

    def loader() -> DataLoader:
        return DataLoader(data, batch_size=2, shuffle=True)

    tandem.seed_everything(5)
    full = Taking(per_step=2, catch=True)
    fit(full, loader(), max_epochs=2)
    weights = {k: v.clone() for k, v in full.state_dict().items()}

    tandem.seed_everything(5)
    saving = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, save_top_k=-1, filename="{step}")
    fit(Taking(per_step=2, catch=True), loader(), max_epochs=2, max_steps=3, callbacks=[saving])
    saved = torch.load(tmp_path / "step=3.ckpt", weights_only=False)
    assert (saved["loops"]["batches_done"], saved["loops"]["steps_done"]) == (6, 3)

    tandem.seed_everything(123)  # the resume brings its own RNG state back
    resumed = Taking(per_step=2, catch=True)
    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(resumed, loader(), ckpt_path=tmp_path / "step=3.ckpt")
    assert resumed.steps == full.steps[3:]
    assert max_abs_diff(resumed.state_dict(), weights) == 0.0


# ---------------------------------------------------------------------- evaluation
class Evaluating(tandem.TrainingModule):
    """Evaluation steps that take ``per_step`` batches; records what the steps and the batch hooks got."""

    def __init__(self, per_step: int = 1) -> None:
        super().__init__()
        self.per_step = per_step
        self.taken: list[list[tuple[int, int, int]]] = []
        self.starts: list[tuple[object, int, int]] = []
        self.ends: list[tuple[object, int, int]] = []

    def _take(self, dataloader_iter):
        taken = []
        for _ in range(self.per_step):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            taken.append((int(batch), batch_idx, dataloader_idx))
        self.taken.append(taken)
        return [value for value, _, _ in taken]

    def validation_step(self, dataloader_iter):
        self.log("value", float(self._take(dataloader_iter)[0]), batch_size=1)

    def test_step(self, dataloader_iter):
        self._take(dataloader_iter)

    def predict_step(self, dataloader_iter):
        return self._take(dataloader_iter)

    def on_validation_batch_start(self, batch, batch_idx, dataloader_idx=0):
        self.starts.append((None if batch is None else int(batch), batch_idx, dataloader_idx))

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.ends.append((int(batch), batch_idx, dataloader_idx))


def test_validation_over_several_loaders_runs_one_pass_in_turn():
    """Lightning's: the steps take the loaders' batches one loader after the other; the hooks get dataloader_idx
    and the step's values go under the loader of the batch before it."""
    model = Evaluating()
    trainer = quiet_trainer(limit_val_batches=1)
    results = trainer.validate(model, {"a": [0, 1], "b": [2, 3]}, verbose=False)
    assert model.taken == [[(0, 0, 0)], [(2, 0, 1)]]
    assert model.starts == [(None, 0, 0), (0, 0, 0)]
    assert model.ends == [(0, 0, 0), (2, 0, 1)]
    assert results == [{"value/dataloader_idx_0": 1.0}]  # both steps began in loader 0: its name, its results


def test_a_step_may_take_batches_across_a_loaders_end():
    model = Evaluating(per_step=2)
    trainer = quiet_trainer()
    predictions = trainer.predict(model, [[0, 1, 2], [3, 4, 5]])
    assert model.taken == [[(0, 0, 0), (1, 1, 0)], [(2, 2, 0), (3, 0, 1)], [(4, 1, 1), (5, 2, 1)]]
    assert predictions == [[[0, 1]], [[2, 3], [4, 5]]]  # by the loader of the step's last batch

    model = Evaluating(per_step=2)
    quiet_trainer(limit_test_batches=2).test(model, [[0, 1, 2], [3, 4, 5]], verbose=False)
    assert model.taken == [[(0, 0, 0), (1, 1, 0)], [(3, 0, 1), (4, 1, 1)]]


def test_an_evaluation_ends_where_a_step_lets_the_end_out():
    model = Evaluating(per_step=2)
    quiet_trainer().test(model, [[0, 1, 2]], verbose=False)
    assert model.taken == [[(0, 0, 0), (1, 1, 0)]]  # the second step took 2, then found the end: no record


def test_a_prediction_writer_is_refused():
    class Writer(BasePredictionWriter):
        def write_on_batch_end(self, *args): ...

    with pytest.raises(NotImplementedError, match="does not support using `dataloader_iter`"):
        quiet_trainer(callbacks=[Writer()]).predict(Evaluating(), [[0, 1]])
