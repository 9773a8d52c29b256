"""ModelSummary: a module's layers with their parameter counts, modes, FLOPs and (given an example input) the
input and output sizes, as Lightning's ``lightning.pytorch.utilities.model_summary`` prints them.

The ``ModelSummary`` callback prints one when ``fit`` starts; this is the utility itself, usable on any module:

```python
from tandem.utilities.model_summary import ModelSummary

print(ModelSummary(model, max_depth=2))
```
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.hooks import RemovableHandle

from tandem.utilities.exceptions import out_of_range
from tandem.utilities.rank_zero import WarningCache

if TYPE_CHECKING:
    from tandem.trainer.trainer import Trainer

__all__ = [
    "LEFTOVER_PARAMS_NAME",
    "NOT_APPLICABLE",
    "UNKNOWN_SIZE",
    "LayerSummary",
    "ModelSummary",
    "format_summary_table",
    "get_formatted_model_size",
    "get_human_readable_count",
    "parse_batch_shape",
    "summarize",
]

UNKNOWN_SIZE = "?"
LEFTOVER_PARAMS_NAME = "other params"
NOT_APPLICABLE = "n/a"
PARAMETER_NUM_UNITS = [" ", "K", "M", "B", "T"]

#: bits per parameter for the model size, by the Trainer's precision: Lightning's table, and the mixed precisions
#: too, whose parameters stay float32 (Lightning warns there that 32 bits may be inaccurate; for them it is exact)
_PRECISION_BITS = {"64-true": 64, "32-true": 32, "16-true": 16, "bf16-true": 16, "16-mixed": 32, "bf16-mixed": 32}

_warning_cache = WarningCache()


class LayerSummary:
    """One submodule of a summary: its type, parameter count, mode, and the sizes of its first forward pass's
    input and output (``"?"`` until the module has run, or for a scripted module, which takes no hooks).

    Examples:
        >>> conv = torch.nn.Conv2d(3, 8, 3)
        >>> layer = LayerSummary(conv)
        >>> layer.num_parameters, layer.layer_type
        (224, 'Conv2d')
        >>> _ = conv(torch.rand(1, 3, 5, 5))
        >>> layer.in_size, layer.out_size
        ([1, 3, 5, 5], [1, 8, 3, 3])

    Args:
        module: the module to summarize.
    """

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self._in_size: str | list | None = None
        self._out_size: str | list | None = None
        self._handle: RemovableHandle | None = None
        if not isinstance(module, torch.jit.ScriptModule):
            self._handle = module.register_forward_hook(self._record, with_kwargs=True)

    def __del__(self) -> None:
        self.detach_hook()

    def _record(self, module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        """The first forward pass's sizes; the hook then removes itself (a module called twice keeps its first)."""
        inputs = (*args, *kwargs.values())
        self._in_size = parse_batch_shape(inputs[0] if len(inputs) == 1 else inputs)
        self._out_size = parse_batch_shape(output)
        self.detach_hook()

    def detach_hook(self) -> None:
        """Remove the forward hook (if no forward pass removed it already)."""
        if self._handle is not None:
            self._handle.remove()

    @property
    def in_size(self) -> str | list:
        return self._in_size or UNKNOWN_SIZE

    @property
    def out_size(self) -> str | list:
        return self._out_size or UNKNOWN_SIZE

    @property
    def layer_type(self) -> str:
        """The class name of the module."""
        return type(self._module).__name__

    @property
    def num_parameters(self) -> int:
        """The number of parameters in the module (lazy parameters not yet initialized count 0)."""
        return _count(self._module.parameters())

    @property
    def training(self) -> bool:
        """Whether the module is in training mode."""
        return self._module.training


class ModelSummary:
    """A summary of a module's layers: name, type, parameter count, mode (train / eval), FLOPs and, when the
    module has an ``example_input_array``, the input and output sizes of each layer; then the totals (trainable,
    non-trainable and all parameters, the estimated size in MB, the modules in train and eval mode, total FLOPs).
    ``str()`` gives Lightning's table.

    With an ``example_input_array``, the summary runs it through the module once (in eval mode and without
    gradients; the modes are restored afterwards), through the module's batch transfer hooks, to record the sizes
    and count the FLOPs. Parameters that belong to no listed layer appear in a row named ``other params``.

    Examples:
        >>> import tandem
        >>> class Net(tandem.TrainingModule):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.net = nn.Sequential(nn.Linear(256, 512), nn.BatchNorm1d(512))
        ...         self.example_input_array = torch.zeros(10, 256)
        ...
        ...     def forward(self, x):
        ...         return self.net(x)
        >>> print(ModelSummary(Net(), max_depth=-1))  # doctest: +NORMALIZE_WHITESPACE
          | Name  | Type        | Params | Mode  | FLOPs | In sizes  | Out sizes
        ------------------------------------------------------------------------------
        0 | net   | Sequential  | 132 K  | train | 2.6 M | [10, 256] | [10, 512]
        1 | net.0 | Linear      | 131 K  | train | 2.6 M | [10, 256] | [10, 512]
        2 | net.1 | BatchNorm1d | 1.0 K  | train | 0     | [10, 512] | [10, 512]
        ------------------------------------------------------------------------------
        132 K     Trainable params
        0         Non-trainable params
        132 K     Total params
        0.530     Total estimated model params size (MB)
        3         Modules in train mode
        0         Modules in eval mode
        2.6 M     Total Flops

    Args:
        model: the module to summarize (a ``TrainingModule``, or any ``nn.Module``).
        max_depth: how deep to list submodules: 1 lists the module's children, 2 their children too, -1 every
            level, 0 none (the totals only).
    """

    def __init__(self, model: nn.Module, max_depth: int = 1) -> None:
        if not isinstance(max_depth, int) or max_depth < -1:
            raise out_of_range(
                "ModelSummary: max_depth",
                max_depth,
                "an int >= -1 (-1: every level, 0: totals only)",
                lead=f"`max_depth` can be -1, 0 or > 0, got {max_depth}.",
            )
        self._model = model
        self.max_depth = max_depth
        self._flop_counter = FlopCounterMode(display=False)
        self._layer_summary = self.summarize()
        self._bytes_per_parameter = _precision_bits(_trainer_of(model)) / 8

    @property
    def named_modules(self) -> list[tuple[str, nn.Module]]:
        """The submodules the summary hooks: the children at ``max_depth=1``, none at 0, else every submodule."""
        if self.max_depth == 0:
            return []
        if self.max_depth == 1:
            return list(self._model.named_children())
        return list(self._model.named_modules())[1:]  # not the root module

    @property
    def layer_names(self) -> list[str]:
        return list(self._layer_summary)

    @property
    def layer_types(self) -> list[str]:
        return [layer.layer_type for layer in self._layer_summary.values()]

    @property
    def in_sizes(self) -> list:
        return [layer.in_size for layer in self._layer_summary.values()]

    @property
    def out_sizes(self) -> list:
        return [layer.out_size for layer in self._layer_summary.values()]

    @property
    def param_nums(self) -> list[int]:
        return [layer.num_parameters for layer in self._layer_summary.values()]

    @property
    def training_modes(self) -> list[bool]:
        return [layer.training for layer in self._layer_summary.values()]

    @property
    def total_training_modes(self) -> dict[str, int]:
        """How many submodules (the root module aside) are in train and in eval mode, as they are now."""
        modes = [module.training for module in self._model.modules()][1:]
        return {"train": modes.count(True), "eval": modes.count(False)}

    @property
    def total_parameters(self) -> int:
        return _count(self._model.parameters())

    @property
    def trainable_parameters(self) -> int:
        return _count(p for p in self._model.parameters() if p.requires_grad)

    @property
    def total_layer_params(self) -> int:
        return sum(self.param_nums)

    @property
    def model_size(self) -> float:
        """The parameters' estimated size in MB, at the attached Trainer's precision (32 bits without one)."""
        return self.total_parameters * self._bytes_per_parameter * 1e-6

    @property
    def total_flops(self) -> int:
        """FLOPs of the example input's forward pass (0 without an ``example_input_array``)."""
        return self._flop_counter.get_total_flops()

    @property
    def flop_counts(self) -> dict[str, dict[Any, int]]:
        """FLOPs per listed layer, by operator."""
        counts = self._flop_counter.get_flop_counts()
        root = type(self._model).__name__
        return {name: counts.get(f"{root}.{name}", {}) for name in self.layer_names}

    def summarize(self) -> OrderedDict[str, LayerSummary]:
        """Hook the submodules, run the example input (if any) through the module, and return the listed layers."""
        summary = OrderedDict((name, LayerSummary(module)) for name, module in self.named_modules)
        if getattr(self._model, "example_input_array", None) is not None:
            self._forward_example_input()
        for layer in summary.values():
            layer.detach_hook()
        if self.max_depth >= 1:
            for name in [name for name in summary if name.count(".") >= self.max_depth]:
                del summary[name]
        return summary

    def _forward_example_input(self) -> None:
        """The example input through the batch transfer hooks, then the module, in eval mode without gradients
        and under the Trainer's precision (if attached); the modes of all submodules are restored after."""
        model = self._model
        trainer = _trainer_of(model)
        batch = _transferred(model, model.example_input_array, trainer)
        forward_context = contextlib.nullcontext() if trainer is None else trainer.strategy.precision.forward_context()
        with _eval_mode(model), torch.no_grad(), forward_context, self._flop_counter:
            if isinstance(batch, (list, tuple)):
                model(*batch)
            elif isinstance(batch, dict):
                model(**batch)
            else:
                model(batch)

    @property
    def summary_data(self) -> list[tuple[str, list[str]]]:
        """The table's columns as (header, cells), every cell a string; what
        [`ModelSummary.summarize`][tandem.callbacks.ModelSummary.summarize] of the callback receives. A last row,
        ``other params``, holds parameters that no listed layer holds."""
        columns = [
            (" ", [str(i) for i in range(len(self._layer_summary))]),
            ("Name", self.layer_names),
            ("Type", self.layer_types),
            ("Params", [get_human_readable_count(n) for n in self.param_nums]),
            ("Mode", ["train" if training else "eval" for training in self.training_modes]),
            ("FLOPs", [get_human_readable_count(sum(ops.values())) for ops in self.flop_counts.values()]),
        ]
        if getattr(self._model, "example_input_array", None) is not None:
            columns.append(("In sizes", [str(size) for size in self.in_sizes]))
            columns.append(("Out sizes", [str(size) for size in self.out_sizes]))
        leftover = self.total_parameters - self.total_layer_params
        if leftover > 0:
            extra = {" ": " ", "Name": LEFTOVER_PARAMS_NAME, "Params": get_human_readable_count(leftover)}
            for header, cells in columns:
                cells.append(extra.get(header, NOT_APPLICABLE))
        return columns

    def __str__(self) -> str:
        return format_summary_table(
            self.total_parameters,
            self.trainable_parameters,
            self.model_size,
            self.total_training_modes,
            self.total_flops,
            *self.summary_data,
        )

    def __repr__(self) -> str:
        return str(self)


def summarize(model: nn.Module, max_depth: int = 1) -> ModelSummary:
    """The [`ModelSummary`][tandem.utilities.model_summary.ModelSummary] of ``model`` (Lightning's function).

    Args:
        model: the module to summarize.
        max_depth: how deep to list submodules (-1 every level, 0 none).
    """
    return ModelSummary(model, max_depth=max_depth)


def format_summary_table(
    total_parameters: int,
    trainable_parameters: int,
    model_size: float,
    total_training_modes: dict[str, int],
    total_flops: int,
    *columns: tuple[str, list[str]],
) -> str:
    """The summary as text: the columns (header, cells) as a table, then the totals, one a line."""
    n_rows = len(columns[0][1])
    widths = [max([len(header), *(len(str(cell)) for cell in cells)]) for header, cells in columns]
    rule = "-" * (sum(widths) + 3 * (len(columns) + 1))
    lines = [" | ".join(f"{header:<{w}}" for (header, _), w in zip(columns, widths)), rule]
    lines += [" | ".join(f"{str(cells[i]):<{w}}" for (_, cells), w in zip(columns, widths)) for i in range(n_rows)]
    lines.append(rule)
    totals = [
        (get_human_readable_count(trainable_parameters), "Trainable params"),
        (get_human_readable_count(total_parameters - trainable_parameters), "Non-trainable params"),
        (get_human_readable_count(total_parameters), "Total params"),
        (get_formatted_model_size(model_size), "Total estimated model params size (MB)"),
        (total_training_modes["train"], "Modules in train mode"),
        (total_training_modes["eval"], "Modules in eval mode"),
        (get_human_readable_count(total_flops), "Total Flops"),
    ]
    lines += [f"{value:<10}{label}" for value, label in totals]
    return "\n".join(lines)


def get_formatted_model_size(total_model_size: float) -> str:
    """A size in MB with three decimals: ``1234.5678`` -> ``'1,234.568'``."""
    return f"{total_model_size:,.3f}"


def get_human_readable_count(number: int) -> str:
    """A count abbreviated with K, M, B and T, as the summary shows it.

    Examples:
        >>> get_human_readable_count(123), get_human_readable_count(1234), get_human_readable_count(2e6)
        ('123  ', '1.2 K', '2.0 M')
        >>> get_human_readable_count(4e14), get_human_readable_count(5e15)
        ('400 T', '5,000 T')

    Args:
        number: a count, 0 or more.
    """
    if number < 0:
        raise ValueError(f"get_human_readable_count needs a count of 0 or more; got {number}.")
    digits = int(math.floor(math.log10(number)) + 1) if number > 0 else 1
    group = min(math.ceil(digits / 3), len(PARAMETER_NUM_UNITS)) - 1  # no unit above T
    scaled = number * 10 ** (-3 * group)
    if group < 1 or scaled >= 100:
        return f"{int(scaled):,d} {PARAMETER_NUM_UNITS[group]}"
    return f"{scaled:,.1f} {PARAMETER_NUM_UNITS[group]}"


def parse_batch_shape(batch: Any) -> str | list:
    """The shape of a tensor as a list, of a list or tuple as a list of shapes, of anything else ``"?"``."""
    if hasattr(batch, "shape"):
        return list(batch.shape)
    if isinstance(batch, (list, tuple)):
        return [parse_batch_shape(item) for item in batch]
    return UNKNOWN_SIZE


def _count(parameters: Iterator[nn.Parameter]) -> int:
    """Elements of ``parameters``; a lazy parameter not yet initialized counts 0, with a warning (once)."""
    total = 0
    for p in parameters:
        if isinstance(p, nn.parameter.UninitializedParameter):
            _warning_cache.warn(
                "The total number of parameters detected may be inaccurate because the model contains an instance "
                "of `UninitializedParameter`. To get an accurate number, set `self.example_input_array` in your "
                "module's __init__: the summary's forward pass then initializes the lazy layers."
            )
        else:
            total += p.numel()
    return total


def _trainer_of(model: nn.Module) -> Trainer | None:
    """The Trainer the module is attached to, if any (a plain ``nn.Module`` has none)."""
    return getattr(model, "_trainer", None)


def _precision_bits(trainer: Trainer | None) -> int:
    return 32 if trainer is None else _PRECISION_BITS.get(trainer.precision, 32)


def _transferred(model: nn.Module, batch: Any, trainer: Trainer | None) -> Any:
    """``batch`` through the batch transfer hooks a loader's batch goes through (the DataModule's where it
    overrides them), onto the module's device, in the Trainer's input precision. A plain ``nn.Module`` has no
    hooks: its batch stays as it is."""
    if not hasattr(model, "transfer_batch_to_device"):
        return batch
    datamodule = getattr(trainer, "datamodule", None)

    def hook(name: str) -> Any:
        return getattr(datamodule if _overrides(datamodule, name) else model, name)

    batch = hook("on_before_batch_transfer")(batch, 0)
    batch = hook("transfer_batch_to_device")(batch, model.device, 0)
    if trainer is not None:
        batch = trainer.strategy.precision.convert_input(batch)
    return hook("on_after_batch_transfer")(batch, 0)


def _overrides(datamodule: Any, name: str) -> bool:
    """The DataModule defines its own ``name`` (a class below the base that defines it, or its instance)."""
    if datamodule is None:
        return False
    return name in vars(datamodule) or sum(name in vars(cls) for cls in type(datamodule).__mro__) > 1


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """The whole module in eval mode inside; each submodule's own mode back after."""
    modes = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield
    finally:
        for module, training in modes.items():
            module.training = training
