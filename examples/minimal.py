"""The smallest complete tandem program: fit a linear model to generated data, then test it."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tandem import Trainer, TrainingModule, seed_everything


class LinearRegression(TrainingModule):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.linear = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.linear(x), y)
        self.log("train_loss", loss)
        return loss

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.linear(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


if __name__ == "__main__":
    seed_everything(0)
    x = torch.randn(1024, 8)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.01 * torch.randn(1024, 1)  # y = 1*x0 + 2*x1 + ... + 8*x7
    data = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)

    trainer = Trainer(max_epochs=5, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    model = LinearRegression()
    trainer.fit(model, data)
    (result,) = trainer.test(model, DataLoader(TensorDataset(x, y), batch_size=256))
    print(f"test_loss={result['test_loss']:.4f}  weights={model.linear.weight.data.round(decimals=2).tolist()}")
