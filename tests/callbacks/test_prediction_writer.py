import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import TinyModule, quiet_trainer
from tandem.callbacks import BasePredictionWriter
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(60)

DATA = TensorDataset(torch.arange(25.0).unsqueeze(1).repeat(1, 8), torch.zeros(25, dtype=torch.long))


class Ids(TinyModule):
    def predict_step(self, batch, batch_idx):
        return batch[0][:, 0].long()  # each sample's own index


class Recorder(BasePredictionWriter):
    def __init__(self, write_interval):
        super().__init__(write_interval)
        self.batches, self.epochs = [], []

    def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.batches.append((prediction.tolist(), batch_indices, batch_idx, dataloader_idx))

    def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
        self.epochs.append(([p.tolist() for p in predictions], batch_indices))


def test_batch_and_epoch_writes_get_each_batchs_dataset_indices():
    writer = Recorder("batch_and_epoch")
    returned = quiet_trainer(callbacks=[writer]).predict(Ids(), DataLoader(DATA, batch_size=10))
    expected = [list(range(0, 10)), list(range(10, 20)), list(range(20, 25))]
    assert [(b[0], b[1], b[2], b[3]) for b in writer.batches] == [(ids, ids, i, 0) for i, ids in enumerate(expected)]
    assert writer.epochs == [(expected, [expected])]  # predictions of the one loader; indices per loader
    assert [p.tolist() for p in returned] == expected  # the Trainer still returns them


def test_only_the_chosen_interval_is_written_and_a_limit_is_respected():
    batch_only, epoch_only = Recorder("batch"), Recorder("epoch")
    trainer = quiet_trainer(callbacks=[batch_only, epoch_only], limit_predict_batches=2)
    trainer.predict(Ids(), DataLoader(DATA, batch_size=10))
    assert len(batch_only.batches) == 2 and batch_only.epochs == []
    assert epoch_only.batches == [] and epoch_only.epochs[0][1] == [[list(range(10)), list(range(10, 20))]]


def test_without_batching_each_batch_is_one_index():
    writer = Recorder("epoch")

    class One(TinyModule):
        def predict_step(self, batch, batch_idx):
            return batch[0][:1].long()

    quiet_trainer(callbacks=[writer]).predict(One(), DataLoader(DATA, batch_size=None, sampler=[3, 1, 4]))
    assert writer.epochs == [([[3], [1], [4]], [[[3], [1], [4]]])]


def test_a_shuffling_predict_loader_is_refused_with_the_fix():
    with pytest.raises(TandemConfigError, match=r"draws a new random order each time \(RandomSampler\).*shuffle=False"):
        quiet_trainer(callbacks=[Recorder("batch")]).predict(Ids(), DataLoader(DATA, batch_size=10, shuffle=True))


def test_bad_interval_and_a_missing_override():
    with pytest.raises(TandemConfigError, match="write_interval='step' is not valid"):
        Recorder("step")

    class EpochOnly(BasePredictionWriter):
        def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
            pass

    with pytest.raises(
        NotImplementedError, match=r"EpochOnly\(write_interval='batch'\) must define write_on_batch_end"
    ):
        quiet_trainer(callbacks=[EpochOnly()]).predict(Ids(), DataLoader(DATA, batch_size=10))
