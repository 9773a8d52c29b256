import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tandem
from helpers import loader, max_abs_diff, quiet_trainer
from tandem.callbacks import BackboneFinetuning, BaseFinetuning, ModelCheckpoint
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(60)


class WithBackbone(tandem.TrainingModule):
    """A backbone and a head; records each epoch's learning rates and backbone weights at its first step."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU())
        self.head = nn.Linear(16, 3)
        self.lrs, self.backbone_weights = [], []

    def training_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.lrs.append([g["lr"] for g in self.trainer.optimizers[0].param_groups])
            self.backbone_weights.append(self.backbone[0].weight.detach().clone())
        x, y = batch
        return F.cross_entropy(self.head(self.backbone(x)), y)

    def configure_optimizers(self):
        return torch.optim.Adam(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1)


def test_backbone_is_frozen_until_its_epoch_then_trained_at_a_growing_ratio_rate():
    model = WithBackbone()
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=2, backbone_initial_ratio_lr=0.1, train_bn=True)
    quiet_trainer(max_epochs=7, callbacks=[finetuning]).fit(model, loader(64, 16))
    # the first group keeps 0.1; the backbone's joins at epoch 2 with 0.1 * 0.1, doubles, then is capped at 0.1
    expected = [[0.1], [0.1], [0.1, 0.01], [0.1, 0.02], [0.1, 0.04], [0.1, 0.08], [0.1, 0.1]]
    assert [lr == pytest.approx(e) for lr, e in zip(model.lrs, expected)] == [True] * 7
    weights = model.backbone_weights
    assert torch.equal(weights[0], weights[1]) and torch.equal(weights[1], weights[2])  # frozen in epochs 0, 1
    assert not torch.equal(weights[2], weights[3])  # trained from epoch 2
    assert model.backbone[1].weight.requires_grad  # train_bn: BatchNorm trainable throughout


def _run(root, epochs, resume=False):
    tandem.seed_everything(2)
    model = WithBackbone()
    finetuning = BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda epoch: 1.5, train_bn=False)
    checkpoint = ModelCheckpoint(dirpath=root, save_last=True, save_top_k=0)
    trainer = quiet_trainer(max_epochs=epochs, callbacks=[checkpoint, finetuning], enable_checkpointing=True)
    trainer.fit(model, loader(64, 16, shuffle=True), ckpt_path=root / "last.ckpt" if resume else None)
    return model, trainer


def test_resume_after_the_unfreeze_restores_the_param_groups_and_what_is_frozen(tmp_path):
    whole, _ = _run(tmp_path / "whole", 4)
    _run(tmp_path / "halves", 2)  # the backbone's group was added at epoch 1
    saved = torch.load(tmp_path / "halves" / "last.ckpt")["callbacks"]["BackboneFinetuning"]
    assert [len(g["params"]) for g in saved["internal_optimizer_metadata"][0]] == [4, 2]  # head and BatchNorm; Linear
    resumed, trainer = _run(tmp_path / "halves", 4, resume=True)
    assert [len(g["params"]) for g in trainer.optimizers[0].param_groups] == [4, 2]
    assert resumed.lrs[0] == pytest.approx([0.1, 0.01 * 1.5]) and resumed.lrs[1] == pytest.approx([0.1, 0.01 * 1.5**2])
    assert resumed.backbone[0].weight.requires_grad  # frozen again by setup, unfrozen by the checkpoint
    assert max_abs_diff(resumed.state_dict(), whole.state_dict()) == 0.0


def test_helpers_freeze_filter_and_add_groups_as_lightnings():
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2), nn.Sequential(nn.Linear(2, 2)))
    BaseFinetuning.freeze(net, train_bn=True)
    assert [p.requires_grad for p in net.parameters()] == [False, False, True, True, False, False]
    assert len(BaseFinetuning.flatten_modules(net)) == 3
    assert len(list(BaseFinetuning.filter_params(net, train_bn=False, requires_grad=False))) == 4
    optimizer = torch.optim.SGD([*net[1].parameters(), net[0].bias], lr=0.5)  # a frozen bias among them
    with pytest.warns(UserWarning, match="1 of the parameters to unfreeze are in a group of the optimizer already"):
        BaseFinetuning.unfreeze_and_add_param_group(net, optimizer)  # lr: 0.5 / initial_denom_lr
    assert all(p.requires_grad for p in net.parameters())
    assert len(optimizer.param_groups[1]["params"]) == 3 and optimizer.param_groups[1]["lr"] == pytest.approx(0.05)


def test_a_module_without_backbone_and_bad_arguments_are_refused():
    class NoBackbone(tandem.TrainingModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(8, 3)

    with pytest.raises(TandemConfigError, match="NoBackbone has no nn.Module attribute `backbone`"):
        quiet_trainer(max_epochs=1, callbacks=[BackboneFinetuning()]).fit(NoBackbone(), loader(16, 16))
    with pytest.raises(TandemConfigError, match="unfreeze_backbone_at_epoch=-1 is out of range"):
        BackboneFinetuning(unfreeze_backbone_at_epoch=-1)
    with pytest.raises(TandemConfigError, match="backbone_initial_lr=0 is out of range"):
        BackboneFinetuning(backbone_initial_lr=0)
