"""The ModelSummary utility: tables and attributes equal to Lightning's, for modules of several shapes."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import tandem
from helpers import Nested, quiet_trainer
from tandem.utilities import model_summary
from tandem.utilities.exceptions import TandemConfigError
from tandem.utilities.model_summary import (
    LEFTOVER_PARAMS_NAME,
    UNKNOWN_SIZE,
    LayerSummary,
    ModelSummary,
    get_formatted_model_size,
    get_human_readable_count,
    parse_batch_shape,
    summarize,
)
from tandem.utilities.rank_zero import WarningCache


class Lit(tandem.TrainingModule):
    """Lightning's docstring example."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 512), nn.BatchNorm1d(512))
        self.example_input_array = torch.zeros(10, 256)

    def forward(self, x):
        return self.net(x)


class FrozenEval(tandem.TrainingModule):
    """Frozen weights, a submodule in eval mode, a module under two names, an unused layer, integer input."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(1000, 32)
        self.embed.weight.requires_grad_(False)
        self.norm = nn.LayerNorm(32)
        self.norm.eval()
        self.proj = nn.Linear(32, 3000)
        self.tied = self.proj
        self.unused = nn.Conv2d(1, 1, 1)
        self.example_input_array = torch.tensor([[0, 2, 1], [3, 5, 3]])

    def forward(self, x):
        return self.proj(self.norm(self.embed(x)))


class NoExample(tandem.TrainingModule):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(100, 12)
        self.b = nn.Sequential(nn.Linear(12, 1))


class Lazy(tandem.TrainingModule):
    def __init__(self):
        super().__init__()
        self.layer1 = nn.LazyLinear(5)
        self.layer2 = nn.LazyLinear(2)

    def forward(self, x):
        return self.layer2(self.layer1(x))


class LazyWithExample(Lazy):
    def __init__(self):
        super().__init__()
        self.example_input_array = torch.zeros(3, 7)


class NonLayerParams(tandem.TrainingModule):
    def __init__(self):
        super().__init__()
        self.param = nn.Parameter(torch.ones(2, 2))
        self.layer = nn.Linear(2, 2)
        self.example_input_array = torch.ones(2, 2)

    def forward(self, inp):
        return self.layer(self.param @ inp)


class MultiInput(tandem.TrainingModule):
    """Two inputs (a tuple or a dict of them), layers listed out of call order, an LSTM's nested output."""

    def __init__(self, example):
        super().__init__()
        self.layer2 = nn.Linear(10, 2)
        self.layer1 = nn.Linear(3, 5)
        self.rnn = nn.LSTM(7, 4, batch_first=True)
        self.example_input_array = example

    def forward(self, x, y):
        out = torch.cat((self.layer1(x), self.layer2(y)), 1)
        return self.rnn(out.unsqueeze(1))


class Scripted(tandem.TrainingModule):
    def __init__(self):
        super().__init__()
        with warnings.catch_warnings():  # torch's deprecation of TorchScript
            warnings.simplefilter("ignore", DeprecationWarning)
            self.layer1 = torch.jit.script(nn.Linear(5, 3))
        self.layer2 = nn.Linear(3, 2)
        self.example_input_array = torch.rand(2, 5)

    def forward(self, x):
        return self.layer2(self.layer1(x))


class Empty(tandem.TrainingModule):
    pass


MODELS = {
    "Lit": Lit,
    "Nested": Nested,
    "FrozenEval": FrozenEval,
    "NoExample": NoExample,
    "NonLayerParams": NonLayerParams,
    "MultiInput_tuple": lambda: MultiInput((torch.rand(2, 3), torch.rand(2, 10))),
    "MultiInput_dict": lambda: MultiInput({"x": torch.rand(2, 3), "y": torch.rand(2, 10)}),
    "LazyWithExample": LazyWithExample,
    "Scripted": Scripted,
    "Empty": Empty,
}

# Recorded from Lightning 2.6.6 (lightning.pytorch.utilities.model_summary.ModelSummary, torch 2.13), the same
# modules built as LightningModules: str(summary).splitlines() and the attributes. flop_counts' operators as str.
EXPECTED = {
    ("Lit", -1): {
        "table": (
            "  | Name  | Type        | Params | Mode  | FLOPs | In sizes  | Out sizes",
            "------------------------------------------------------------------------------",
            "0 | net   | Sequential  | 132 K  | train | 2.6 M | [10, 256] | [10, 512]",
            "1 | net.0 | Linear      | 131 K  | train | 2.6 M | [10, 256] | [10, 512]",
            "2 | net.1 | BatchNorm1d | 1.0 K  | train | 0     | [10, 512] | [10, 512]",
            "------------------------------------------------------------------------------",
            "132 K     Trainable params",
            "0         Non-trainable params",
            "132 K     Total params",
            "0.530     Total estimated model params size (MB)",
            "3         Modules in train mode",
            "0         Modules in eval mode",
            "2.6 M     Total Flops",
        ),
        "layer_names": ["net", "net.0", "net.1"],
        "layer_types": ["Sequential", "Linear", "BatchNorm1d"],
        "param_nums": [132608, 131584, 1024],
        "in_sizes": [[10, 256], [10, 256], [10, 512]],
        "out_sizes": [[10, 512], [10, 512], [10, 512]],
        "training_modes": [True, True, True],
        "total_training_modes": {"train": 3, "eval": 0},
        "total_parameters": 132608,
        "trainable_parameters": 132608,
        "total_layer_params": 265216,
        "model_size": 0.530432,
        "total_flops": 2621440,
        "flop_counts": {"net": {"aten.addmm": 2621440}, "net.0": {"aten.addmm": 2621440}, "net.1": {}},
    },
    ("Lit", 0): {
        "table": (
            "  | Name         | Type | Params | Mode | FLOPs | In sizes | Out sizes",
            "----------------------------------------------------------------------------",
            "  | other params | n/a  | 132 K  | n/a  | n/a   | n/a      | n/a      ",
            "----------------------------------------------------------------------------",
            "132 K     Trainable params",
            "0         Non-trainable params",
            "132 K     Total params",
            "0.530     Total estimated model params size (MB)",
            "3         Modules in train mode",
            "0         Modules in eval mode",
            "2.6 M     Total Flops",
        ),
        "layer_names": [],
        "layer_types": [],
        "param_nums": [],
        "in_sizes": [],
        "out_sizes": [],
        "training_modes": [],
        "total_training_modes": {"train": 3, "eval": 0},
        "total_parameters": 132608,
        "trainable_parameters": 132608,
        "total_layer_params": 0,
        "model_size": 0.530432,
        "total_flops": 2621440,
        "flop_counts": {},
    },
    ("Nested", 1): {
        "table": (
            "  | Name    | Type       | Params | Mode  | FLOPs | In sizes | Out sizes",
            "------------------------------------------------------------------------------",
            "0 | encoder | Sequential | 416    | train | 3.1 K | [4, 8]   | [4, 16]  ",
            "1 | head    | Linear     | 34     | train | 256   | [4, 16]  | [4, 2]   ",
            "------------------------------------------------------------------------------",
            "450       Trainable params",
            "0         Non-trainable params",
            "450       Total params",
            "0.002     Total estimated model params size (MB)",
            "7         Modules in train mode",
            "0         Modules in eval mode",
            "3.3 K     Total Flops",
        ),
        "layer_names": ["encoder", "head"],
        "layer_types": ["Sequential", "Linear"],
        "param_nums": [416, 34],
        "in_sizes": [[4, 8], [4, 16]],
        "out_sizes": [[4, 16], [4, 2]],
        "training_modes": [True, True],
        "total_training_modes": {"train": 7, "eval": 0},
        "total_parameters": 450,
        "trainable_parameters": 450,
        "total_layer_params": 450,
        "model_size": 0.0018,
        "total_flops": 3328,
        "flop_counts": {"encoder": {"aten.addmm": 3072}, "head": {"aten.addmm": 256}},
    },
    ("Nested", 2): {
        "table": (
            "  | Name      | Type       | Params | Mode  | FLOPs | In sizes | Out sizes",
            "--------------------------------------------------------------------------------",
            "0 | encoder   | Sequential | 416    | train | 3.1 K | [4, 8]   | [4, 16]  ",
            "1 | encoder.0 | Linear     | 144    | train | 1.0 K | [4, 8]   | [4, 16]  ",
            "2 | encoder.1 | ReLU       | 0      | train | 0     | [4, 16]  | [4, 16]  ",
            "3 | encoder.2 | Sequential | 272    | train | 2.0 K | [4, 16]  | [4, 16]  ",
            "4 | head      | Linear     | 34     | train | 256   | [4, 16]  | [4, 2]   ",
            "--------------------------------------------------------------------------------",
            "450       Trainable params",
            "0         Non-trainable params",
            "450       Total params",
            "0.002     Total estimated model params size (MB)",
            "7         Modules in train mode",
            "0         Modules in eval mode",
            "3.3 K     Total Flops",
        ),
        "layer_names": ["encoder", "encoder.0", "encoder.1", "encoder.2", "head"],
        "layer_types": ["Sequential", "Linear", "ReLU", "Sequential", "Linear"],
        "param_nums": [416, 144, 0, 272, 34],
        "in_sizes": [[4, 8], [4, 8], [4, 16], [4, 16], [4, 16]],
        "out_sizes": [[4, 16], [4, 16], [4, 16], [4, 16], [4, 2]],
        "training_modes": [True, True, True, True, True],
        "total_training_modes": {"train": 7, "eval": 0},
        "total_parameters": 450,
        "trainable_parameters": 450,
        "total_layer_params": 866,
        "model_size": 0.0018,
        "total_flops": 3328,
        "flop_counts": {
            "encoder": {"aten.addmm": 3072},
            "encoder.0": {"aten.addmm": 1024},
            "encoder.1": {},
            "encoder.2": {"aten.addmm": 2048},
            "head": {"aten.addmm": 256},
        },
    },
    ("Nested", -1): {
        "table": (
            "  | Name        | Type       | Params | Mode  | FLOPs | In sizes | Out sizes",
            "----------------------------------------------------------------------------------",
            "0 | encoder     | Sequential | 416    | train | 3.1 K | [4, 8]   | [4, 16]  ",
            "1 | encoder.0   | Linear     | 144    | train | 1.0 K | [4, 8]   | [4, 16]  ",
            "2 | encoder.1   | ReLU       | 0      | train | 0     | [4, 16]  | [4, 16]  ",
            "3 | encoder.2   | Sequential | 272    | train | 2.0 K | [4, 16]  | [4, 16]  ",
            "4 | encoder.2.0 | Linear     | 272    | train | 2.0 K | [4, 16]  | [4, 16]  ",
            "5 | encoder.2.1 | Dropout    | 0      | train | 0     | [4, 16]  | [4, 16]  ",
            "6 | head        | Linear     | 34     | train | 256   | [4, 16]  | [4, 2]   ",
            "----------------------------------------------------------------------------------",
            "450       Trainable params",
            "0         Non-trainable params",
            "450       Total params",
            "0.002     Total estimated model params size (MB)",
            "7         Modules in train mode",
            "0         Modules in eval mode",
            "3.3 K     Total Flops",
        ),
        "layer_names": ["encoder", "encoder.0", "encoder.1", "encoder.2", "encoder.2.0", "encoder.2.1", "head"],
        "layer_types": ["Sequential", "Linear", "ReLU", "Sequential", "Linear", "Dropout", "Linear"],
        "param_nums": [416, 144, 0, 272, 272, 0, 34],
        "in_sizes": [[4, 8], [4, 8], [4, 16], [4, 16], [4, 16], [4, 16], [4, 16]],
        "out_sizes": [[4, 16], [4, 16], [4, 16], [4, 16], [4, 16], [4, 16], [4, 2]],
        "training_modes": [True, True, True, True, True, True, True],
        "total_training_modes": {"train": 7, "eval": 0},
        "total_parameters": 450,
        "trainable_parameters": 450,
        "total_layer_params": 1138,
        "model_size": 0.0018,
        "total_flops": 3328,
        "flop_counts": {
            "encoder": {"aten.addmm": 3072},
            "encoder.0": {"aten.addmm": 1024},
            "encoder.1": {},
            "encoder.2": {"aten.addmm": 2048},
            "encoder.2.0": {"aten.addmm": 2048},
            "encoder.2.1": {},
            "head": {"aten.addmm": 256},
        },
    },
    ("FrozenEval", 1): {
        "table": (
            "  | Name   | Type      | Params | Mode  | FLOPs | In sizes   | Out sizes   ",
            "---------------------------------------------------------------------------------",
            "0 | embed  | Embedding | 32.0 K | train | 0     | [2, 3]     | [2, 3, 32]  ",
            "1 | norm   | LayerNorm | 64     | eval  | 0     | [2, 3, 32] | [2, 3, 32]  ",
            "2 | proj   | Linear    | 99.0 K | train | 1.2 M | [2, 3, 32] | [2, 3, 3000]",
            "3 | unused | Conv2d    | 2      | train | 0     | ?          | ?           ",
            "---------------------------------------------------------------------------------",
            "99.1 K    Trainable params",
            "32.0 K    Non-trainable params",
            "131 K     Total params",
            "0.524     Total estimated model params size (MB)",
            "3         Modules in train mode",
            "1         Modules in eval mode",
            "1.2 M     Total Flops",
        ),
        "layer_names": ["embed", "norm", "proj", "unused"],
        "layer_types": ["Embedding", "LayerNorm", "Linear", "Conv2d"],
        "param_nums": [32000, 64, 99000, 2],
        "in_sizes": [[2, 3], [2, 3, 32], [2, 3, 32], "?"],
        "out_sizes": [[2, 3, 32], [2, 3, 32], [2, 3, 3000], "?"],
        "training_modes": [True, False, True, True],
        "total_training_modes": {"train": 3, "eval": 1},
        "total_parameters": 131066,
        "trainable_parameters": 99066,
        "total_layer_params": 131066,
        "model_size": 0.524264,
        "total_flops": 1152000,
        "flop_counts": {"embed": {}, "norm": {}, "proj": {"aten.addmm": 1152000}, "unused": {}},
    },
    ("FrozenEval", -1): {
        "table": (
            "  | Name   | Type      | Params | Mode  | FLOPs | In sizes   | Out sizes   ",
            "---------------------------------------------------------------------------------",
            "0 | embed  | Embedding | 32.0 K | train | 0     | [2, 3]     | [2, 3, 32]  ",
            "1 | norm   | LayerNorm | 64     | eval  | 0     | [2, 3, 32] | [2, 3, 32]  ",
            "2 | proj   | Linear    | 99.0 K | train | 1.2 M | [2, 3, 32] | [2, 3, 3000]",
            "3 | unused | Conv2d    | 2      | train | 0     | ?          | ?           ",
            "---------------------------------------------------------------------------------",
            "99.1 K    Trainable params",
            "32.0 K    Non-trainable params",
            "131 K     Total params",
            "0.524     Total estimated model params size (MB)",
            "3         Modules in train mode",
            "1         Modules in eval mode",
            "1.2 M     Total Flops",
        ),
        "layer_names": ["embed", "norm", "proj", "unused"],
        "layer_types": ["Embedding", "LayerNorm", "Linear", "Conv2d"],
        "param_nums": [32000, 64, 99000, 2],
        "in_sizes": [[2, 3], [2, 3, 32], [2, 3, 32], "?"],
        "out_sizes": [[2, 3, 32], [2, 3, 32], [2, 3, 3000], "?"],
        "training_modes": [True, False, True, True],
        "total_training_modes": {"train": 3, "eval": 1},
        "total_parameters": 131066,
        "trainable_parameters": 99066,
        "total_layer_params": 131066,
        "model_size": 0.524264,
        "total_flops": 1152000,
        "flop_counts": {"embed": {}, "norm": {}, "proj": {"aten.addmm": 1152000}, "unused": {}},
    },
    ("NoExample", 1): {
        "table": (
            "  | Name | Type       | Params | Mode  | FLOPs",
            "----------------------------------------------------",
            "0 | a    | Linear     | 1.2 K  | train | 0    ",
            "1 | b    | Sequential | 13     | train | 0    ",
            "----------------------------------------------------",
            "1.2 K     Trainable params",
            "0         Non-trainable params",
            "1.2 K     Total params",
            "0.005     Total estimated model params size (MB)",
            "3         Modules in train mode",
            "0         Modules in eval mode",
            "0         Total Flops",
        ),
        "layer_names": ["a", "b"],
        "layer_types": ["Linear", "Sequential"],
        "param_nums": [1212, 13],
        "in_sizes": ["?", "?"],
        "out_sizes": ["?", "?"],
        "training_modes": [True, True],
        "total_training_modes": {"train": 3, "eval": 0},
        "total_parameters": 1225,
        "trainable_parameters": 1225,
        "total_layer_params": 1225,
        "model_size": 0.0049,
        "total_flops": 0,
        "flop_counts": {"a": {}, "b": {}},
    },
    ("LazyWithExample", 1): {
        "table": (
            "  | Name   | Type   | Params | Mode  | FLOPs | In sizes | Out sizes",
            "-------------------------------------------------------------------------",
            "0 | layer1 | Linear | 40     | train | 210   | [3, 7]   | [3, 5]   ",
            "1 | layer2 | Linear | 12     | train | 60    | [3, 5]   | [3, 2]   ",
            "-------------------------------------------------------------------------",
            "52        Trainable params",
            "0         Non-trainable params",
            "52        Total params",
            "0.000     Total estimated model params size (MB)",
            "2         Modules in train mode",
            "0         Modules in eval mode",
            "270       Total Flops",
        ),
        "layer_names": ["layer1", "layer2"],
        "layer_types": ["Linear", "Linear"],
        "param_nums": [40, 12],
        "in_sizes": [[3, 7], [3, 5]],
        "out_sizes": [[3, 5], [3, 2]],
        "training_modes": [True, True],
        "total_training_modes": {"train": 2, "eval": 0},
        "total_parameters": 52,
        "trainable_parameters": 52,
        "total_layer_params": 52,
        "model_size": 0.000208,
        "total_flops": 270,
        "flop_counts": {"layer1": {"aten.addmm": 210}, "layer2": {"aten.addmm": 60}},
    },
    ("NonLayerParams", 1): {
        "table": (
            "  | Name         | Type   | Params | Mode  | FLOPs | In sizes | Out sizes",
            "-------------------------------------------------------------------------------",
            "0 | layer        | Linear | 6      | train | 16    | [2, 2]   | [2, 2]   ",
            "  | other params | n/a    | 4      | n/a   | n/a   | n/a      | n/a      ",
            "-------------------------------------------------------------------------------",
            "10        Trainable params",
            "0         Non-trainable params",
            "10        Total params",
            "0.000     Total estimated model params size (MB)",
            "1         Modules in train mode",
            "0         Modules in eval mode",
            "32        Total Flops",
        ),
        "layer_names": ["layer"],
        "layer_types": ["Linear"],
        "param_nums": [6],
        "in_sizes": [[2, 2]],
        "out_sizes": [[2, 2]],
        "training_modes": [True],
        "total_training_modes": {"train": 1, "eval": 0},
        "total_parameters": 10,
        "trainable_parameters": 10,
        "total_layer_params": 6,
        "model_size": 3.9999999999999996e-05,
        "total_flops": 32,
        "flop_counts": {"layer": {"aten.addmm": 16}},
    },
    ("MultiInput_tuple", 1): {
        "table": (
            "  | Name   | Type   | Params | Mode  | FLOPs | In sizes  | Out sizes                          ",
            "----------------------------------------------------------------------------------------------------",
            "0 | layer2 | Linear | 22     | train | 80    | [2, 10]   | [2, 2]                             ",
            "1 | layer1 | Linear | 20     | train | 60    | [2, 3]    | [2, 5]                             ",
            "2 | rnn    | LSTM   | 208    | train | 0     | [2, 1, 7] | [[2, 1, 4], [[1, 2, 4], [1, 2, 4]]]",
            "----------------------------------------------------------------------------------------------------",
            "250       Trainable params",
            "0         Non-trainable params",
            "250       Total params",
            "0.001     Total estimated model params size (MB)",
            "3         Modules in train mode",
            "0         Modules in eval mode",
            "140       Total Flops",
        ),
        "layer_names": ["layer2", "layer1", "rnn"],
        "layer_types": ["Linear", "Linear", "LSTM"],
        "param_nums": [22, 20, 208],
        "in_sizes": [[2, 10], [2, 3], [2, 1, 7]],
        "out_sizes": [[2, 2], [2, 5], [[2, 1, 4], [[1, 2, 4], [1, 2, 4]]]],
        "training_modes": [True, True, True],
        "total_training_modes": {"train": 3, "eval": 0},
        "total_parameters": 250,
        "trainable_parameters": 250,
        "total_layer_params": 250,
        "model_size": 0.001,
        "total_flops": 140,
        "flop_counts": {"layer2": {"aten.addmm": 80}, "layer1": {"aten.addmm": 60}, "rnn": {}},
    },
    ("MultiInput_dict", 1): {
        "table": (
            "  | Name   | Type   | Params | Mode  | FLOPs | In sizes  | Out sizes                          ",
            "----------------------------------------------------------------------------------------------------",
            "0 | layer2 | Linear | 22     | train | 80    | [2, 10]   | [2, 2]                             ",
            "1 | layer1 | Linear | 20     | train | 60    | [2, 3]    | [2, 5]                             ",
            "2 | rnn    | LSTM   | 208    | train | 0     | [2, 1, 7] | [[2, 1, 4], [[1, 2, 4], [1, 2, 4]]]",
            "----------------------------------------------------------------------------------------------------",
            "250       Trainable params",
            "0         Non-trainable params",
            "250       Total params",
            "0.001     Total estimated model params size (MB)",
            "3         Modules in train mode",
            "0         Modules in eval mode",
            "140       Total Flops",
        ),
        "layer_names": ["layer2", "layer1", "rnn"],
        "layer_types": ["Linear", "Linear", "LSTM"],
        "param_nums": [22, 20, 208],
        "in_sizes": [[2, 10], [2, 3], [2, 1, 7]],
        "out_sizes": [[2, 2], [2, 5], [[2, 1, 4], [[1, 2, 4], [1, 2, 4]]]],
        "training_modes": [True, True, True],
        "total_training_modes": {"train": 3, "eval": 0},
        "total_parameters": 250,
        "trainable_parameters": 250,
        "total_layer_params": 250,
        "model_size": 0.001,
        "total_flops": 140,
        "flop_counts": {"layer2": {"aten.addmm": 80}, "layer1": {"aten.addmm": 60}, "rnn": {}},
    },
    ("Scripted", 1): {
        "table": (
            "  | Name   | Type                  | Params | Mode  | FLOPs | In sizes | Out sizes",
            "----------------------------------------------------------------------------------------",
            "0 | layer1 | RecursiveScriptModule | 18     | train | 60    | ?        | ?        ",
            "1 | layer2 | Linear                | 8      | train | 24    | [2, 3]   | [2, 2]   ",
            "----------------------------------------------------------------------------------------",
            "26        Trainable params",
            "0         Non-trainable params",
            "26        Total params",
            "0.000     Total estimated model params size (MB)",
            "2         Modules in train mode",
            "0         Modules in eval mode",
            "84        Total Flops",
        ),
        "layer_names": ["layer1", "layer2"],
        "layer_types": ["RecursiveScriptModule", "Linear"],
        "param_nums": [18, 8],
        "in_sizes": ["?", [2, 3]],
        "out_sizes": ["?", [2, 2]],
        "training_modes": [True, True],
        "total_training_modes": {"train": 2, "eval": 0},
        "total_parameters": 26,
        "trainable_parameters": 26,
        "total_layer_params": 26,
        "model_size": 0.000104,
        "total_flops": 84,
        "flop_counts": {"layer1": {"aten.addmm": 60}, "layer2": {"aten.addmm": 24}},
    },
    ("Empty", 1): {
        "table": (
            "  | Name | Type | Params | Mode | FLOPs",
            "---------------------------------------------",
            "---------------------------------------------",
            "0         Trainable params",
            "0         Non-trainable params",
            "0         Total params",
            "0.000     Total estimated model params size (MB)",
            "0         Modules in train mode",
            "0         Modules in eval mode",
            "0         Total Flops",
        ),
        "layer_names": [],
        "layer_types": [],
        "param_nums": [],
        "in_sizes": [],
        "out_sizes": [],
        "training_modes": [],
        "total_training_modes": {"train": 0, "eval": 0},
        "total_parameters": 0,
        "trainable_parameters": 0,
        "total_layer_params": 0,
        "model_size": 0.0,
        "total_flops": 0,
        "flop_counts": {},
    },
}


@pytest.mark.parametrize(("name", "max_depth"), list(EXPECTED), ids=[f"{n}-{d}" for n, d in EXPECTED])
def test_table_and_attributes_equal_lightnings(name, max_depth):
    torch.manual_seed(0)
    model = MODELS[name]()
    modes = [m.training for m in model.modules()]
    summary = ModelSummary(model, max_depth=max_depth)
    expected = dict(EXPECTED[name, max_depth])
    assert str(summary).splitlines() == list(expected.pop("table"))
    assert repr(summary) == str(summary)
    assert summary.model_size == pytest.approx(expected.pop("model_size"))
    flops = {layer: {str(op): n for op, n in ops.items()} for layer, ops in summary.flop_counts.items()}
    assert flops == expected.pop("flop_counts")
    assert {key: getattr(summary, key) for key in expected} == expected
    assert summary.max_depth == max_depth
    assert [m.training for m in model.modules()] == modes  # run in eval mode, every mode restored


def test_summarize_and_the_callback_modules_import_path():
    summary = summarize(Nested(), max_depth=2)
    assert isinstance(summary, ModelSummary) and summary.layer_names[1] == "encoder.0"
    from tandem.callbacks import model_summary as callback_module

    assert callback_module.summarize is summarize  # the callback uses the utility: one implementation


def test_other_params_row_and_leftover_count():
    columns = dict(ModelSummary(NonLayerParams()).summary_data)
    assert columns["Name"] == ["layer", LEFTOVER_PARAMS_NAME]
    assert columns["Params"][-1].strip() == "4" and columns["Mode"] == ["train", "n/a"]
    assert all(isinstance(cell, str) for cells in columns.values() for cell in cells)


def test_layer_sizes_from_the_first_forward_only_and_hooks_removed():
    model = Nested()
    summary = ModelSummary(model, max_depth=-1)
    model(torch.zeros(9, 8))  # after the summary: no hook records it
    assert summary.in_sizes[0] == [4, 8] and summary.summarize()["encoder"].in_size == [4, 8]
    layer = LayerSummary(nn.Conv2d(3, 8, 3))
    assert (layer.num_parameters, layer.layer_type, layer.in_size, layer.training) == (224, "Conv2d", "?", True)


def test_example_input_goes_through_the_batch_transfer_hooks():
    class Hooked(tandem.TrainingModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 2)
            self.example_input_array = {"x": torch.zeros(3, 8)}

        def on_before_batch_transfer(self, batch, dataloader_idx):
            return {"x": batch["x"][:, :4]}

        def on_after_batch_transfer(self, batch, dataloader_idx):
            return {"x": batch["x"][:2]}

        def forward(self, x):
            return self.layer(x)

    summary = ModelSummary(Hooked())
    assert (summary.in_sizes, summary.out_sizes, summary.total_flops) == ([[2, 4]], [[2, 2]], 32)  # as Lightning


def test_lazy_parameters_count_zero_with_one_warning(monkeypatch):
    monkeypatch.setattr(model_summary, "_warning_cache", WarningCache())  # once per process, as in Lightning
    summary = ModelSummary(Lazy())
    with pytest.warns(UserWarning, match="The total number of parameters detected may be inaccurate"):
        assert summary.total_parameters == 0
    assert summary.trainable_parameters == 0 and summary.param_nums == [0, 0]  # no second warning
    assert summary.in_sizes == [UNKNOWN_SIZE, UNKNOWN_SIZE]


@pytest.mark.parametrize("max_depth", [-2, "1", 1.5, None])
def test_invalid_max_depth(max_depth):
    with pytest.raises(ValueError, match=r"`max_depth` can be -1, 0 or > 0, got .*expected an int >= -1") as error:
        ModelSummary(Nested(), max_depth=max_depth)
    assert isinstance(error.value, TandemConfigError)


def test_model_size_follows_the_trainer_precision():
    model = Nested()
    model.example_input_array = None  # float32 input would not fit bfloat16 weights, as in Lightning
    trainer = quiet_trainer(precision="bf16-true", max_steps=1)  # kept: the module refers to it weakly
    trainer.fit(model, DataLoader(torch.zeros(4, 8), batch_size=2))
    assert summarize(model).model_size == pytest.approx(450 * 2 / 1e6)

    mixed = Nested()
    trainer = quiet_trainer(precision="bf16-mixed", max_steps=1)
    trainer.fit(mixed, DataLoader(torch.zeros(4, 8), batch_size=2))
    assert summarize(mixed).model_size == pytest.approx(450 * 4 / 1e6)  # float32 weights: no warning


def test_human_readable_counts_and_sizes():
    counts = [0, 12, 123, 999, 1000, 1234, 99_999, 100_000, 999_999, 2_000_000, 3e9, 4e14, 5e15]
    assert [get_human_readable_count(n) for n in counts] == [
        "0  ", "12  ", "123  ", "999  ", "1.0 K", "1.2 K", "100.0 K", "100 K", "999 K", "2.0 M", "3.0 B", "400 T",
        "5,000 T",
    ]  # fmt: skip
    assert (get_formatted_model_size(1234.56789), get_formatted_model_size(0.0005)) == ("1,234.568", "0.001")
    assert parse_batch_shape([torch.zeros(1), (torch.zeros(2, 2), 3)]) == [[1], [[2, 2], "?"]]


def test_plain_torch_module():
    summary = ModelSummary(nn.Sequential(nn.Linear(100, 12), nn.ReLU()))
    assert summary.layer_names == ["0", "1"] and summary.total_parameters == 1212 and summary.total_flops == 0
