"""Strategies by name, and the resolution of the Trainer's accelerator / devices / strategy arguments.

Everything here is pure configuration: it checks the machine (how many CUDA devices exist) but starts
nothing, so every mistake is reported before a process or file is created.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from tandem.strategies.checkpoint_io import AsyncCheckpointIO
from tandem.strategies.environments.cluster_environment import ClusterEnvironment
from tandem.strategies.layer_sync import TorchSyncBatchNorm
from tandem.strategies.precision import Precision
from tandem.utilities.exceptions import TandemConfigError, bad_choice, incompatible, out_of_range
from tandem.utilities.rank_zero import rank_zero_info

if TYPE_CHECKING:
    from tandem.strategies.strategy import Strategy

ACCELERATORS = ("auto", "cpu", "cuda", "gpu")
_ACCEPTED_PLUGINS = (
    "a tandem.strategies.Precision (e.g. Precision('bf16-true')), a cluster environment from "
    "tandem.strategies.environments (e.g. SLURMEnvironment(auto_requeue=False)), "
    "tandem.strategies.layer_sync.TorchSyncBatchNorm(), or tandem.strategies.AsyncCheckpointIO()"
)


@dataclass(frozen=True)
class _Entry:
    cls: type
    description: str
    init_kwargs: dict[str, Any] = field(default_factory=dict)


_REGISTRY: dict[str, _Entry] = {}
# The built-in names and the module that registers each: imported on the first lookup of the name, so that
# `import tandem` loads no strategy a run does not ask for.
_BUILT_IN = {
    "single_device": "tandem.strategies.single_device",
    "dp": "tandem.strategies.data_parallel",
    "ddp": "tandem.strategies.ddp",
    "ddp_spawn": "tandem.strategies.ddp",
    "ddp_fork": "tandem.strategies.ddp",
    "ddp_notebook": "tandem.strategies.ddp",
    "ddp_find_unused_parameters_true": "tandem.strategies.ddp",
    "fsdp": "tandem.strategies.fsdp",
    "ddp_ft": "tandem.strategies.ddp_ft",
}


def register_strategy(name: str, cls: type, description: str, **init_kwargs: Any) -> None:
    """Make ``Trainer(strategy=name)`` build ``cls(**init_kwargs)``."""
    built_in = _BUILT_IN.get(name)
    if built_in is not None and cls.__module__ != built_in:  # a user's entry replaces the built-in, as before
        importlib.import_module(built_in)  # the built-in registers first, so it cannot overwrite the user's later
    _REGISTRY[name] = _Entry(cls, description, init_kwargs)


def available_strategies() -> list[str]:
    return sorted(set(_REGISTRY) | set(_BUILT_IN))


def _lookup(name: str) -> _Entry | None:
    """The registered entry for ``name``, importing the built-in strategy's module on first use."""
    if name not in _REGISTRY and name in _BUILT_IN:
        importlib.import_module(_BUILT_IN[name])  # its module-level register_strategy call fills the entry
    return _REGISTRY.get(name)


def resolve_accelerator(accelerator: str) -> str:
    if accelerator not in ACCELERATORS:
        raise bad_choice("accelerator", accelerator, ACCELERATORS)
    if accelerator == "gpu":
        accelerator = "cuda"
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if accelerator == "cuda" and not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise TandemConfigError(
            f"accelerator='cuda' was requested but no CUDA device is available (torch {torch.__version__}, {build}). "
            "Use accelerator='cpu' or 'auto', or install a CUDA build of torch on a machine with a GPU."
        )
    return accelerator


def resolve_devices(accelerator: str, devices: Any) -> list[torch.device]:
    """Turn ``devices`` ("auto", an int, a list of indices, or "0,1") into the devices of this node."""
    available = torch.cuda.device_count() if accelerator == "cuda" else None
    if devices == "auto":
        count = available if available is not None else 1  # counted for CUDA
        indices = list(range(count))
    elif isinstance(devices, str):
        try:
            parsed = [int(p) for p in devices.split(",") if p.strip()]
        except ValueError:
            raise out_of_range(
                "devices", devices, "'auto', an int, a list of device indices or a string like '0,1'"
            ) from None
        return resolve_devices(accelerator, parsed[0] if len(parsed) == 1 and "," not in devices else parsed)
    elif isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise out_of_range("devices", devices, "'auto', an int, or a list of CUDA device indices")
    elif isinstance(devices, int):
        if devices == -1:
            devices = available if available is not None else 1  # counted for CUDA
        if devices < 1:
            raise out_of_range(
                "devices",
                devices,
                "at least 1 (or -1 for all)",
                "To train on the CPU, use accelerator='cpu' with devices=1.",
            )
        if available is not None and devices > available:
            raise out_of_range(
                "devices",
                devices,
                f"at most {available}, the CUDA devices visible here",
                "Lower devices, or check CUDA_VISIBLE_DEVICES.",
            )
        indices = list(range(devices))
    else:
        if accelerator != "cuda":
            raise TandemConfigError(
                f"devices={list(devices)!r} lists device indices, which only CUDA has; on the CPU pass the number "
                "of processes, e.g. devices=2 with strategy='ddp'."
            )
        assert available is not None  # counted for CUDA
        indices = list(devices)
        bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < available]
        if not indices or bad or len(set(indices)) != len(indices):
            raise out_of_range("devices", list(devices), f"distinct indices in 0..{available - 1}")
    if accelerator == "cuda":
        if not indices:
            raise TandemConfigError("accelerator='cuda' found no CUDA devices; use accelerator='cpu'.")
        return [torch.device("cuda", i) for i in indices]
    return [torch.device("cpu")] * len(indices)


@dataclass(frozen=True)
class Plugins:
    """``Trainer(plugins=...)`` sorted by kind, as Lightning sorts them (at most one of each kind)."""

    precision: Precision | None = None
    cluster_environment: ClusterEnvironment | None = None
    sync_batchnorm: bool = False
    checkpoint_io: AsyncCheckpointIO | None = None


def sort_plugins(plugins: Any) -> Plugins:
    """Sort ``Trainer(plugins=...)`` (one plugin, a list of them, or None) into a ``Plugins``; anything
    tandem has no plugin for is an error naming what it accepts."""
    if plugins is None:
        return Plugins()
    found: dict[str, Any] = {}
    for plugin in plugins if isinstance(plugins, (list, tuple)) else [plugins]:
        if isinstance(plugin, Precision):
            kind = "precision"
        elif isinstance(plugin, ClusterEnvironment):
            kind = "cluster_environment"
        elif isinstance(plugin, TorchSyncBatchNorm):
            kind = "sync_batchnorm"
        elif isinstance(plugin, AsyncCheckpointIO):
            kind = "checkpoint_io"
        else:
            raise _refused_plugin(plugin)
        if kind in found:
            raise TandemConfigError(
                f"Trainer(plugins=[...]) got two {kind.replace('_', ' ')} plugins: {found[kind]!r} and "
                f"{plugin!r}. Give at most one of each kind."
            )
        found[kind] = plugin
    return Plugins(
        found.get("precision"), found.get("cluster_environment"), "sync_batchnorm" in found, found.get("checkpoint_io")
    )


def _refused_plugin(plugin: Any) -> TandemConfigError:
    kind = type(plugin).__name__
    if isinstance(plugin, str):
        return TandemConfigError(
            f"Trainer(plugins={plugin!r}): plugins are objects, not names. For a precision write "
            f"Trainer(precision={plugin!r}); otherwise pass {_ACCEPTED_PLUGINS}."
        )
    if all(callable(getattr(plugin, m, None)) for m in ("save_checkpoint", "load_checkpoint", "remove_checkpoint")):
        return TandemConfigError(
            f"Trainer(plugins=[{kind}(...)]) looks like a checkpoint IO plugin; tandem has one, "
            "tandem.strategies.AsyncCheckpointIO() (writes in the background). Otherwise the strategy writes "
            "checkpoints (atomically, on global rank 0): to change how, subclass the strategy and override its "
            "save_checkpoint / load_checkpoint / remove_checkpoint, and pass it as strategy=."
        )
    return TandemConfigError(
        f"Trainer(plugins=[{kind}(...)]) is not a plugin tandem knows. Expected {_ACCEPTED_PLUGINS}. "
        "(Lightning's own plugin classes do not work with tandem; use tandem's of the same name.)"
    )


def resolve_strategy(
    strategy: str | Strategy,
    accelerator: str,
    devices: Any,
    num_nodes: int,
    precision: Any,
    *,
    use_distributed_sampler: bool = True,
    data_order: str = "sampler",
    sync_batchnorm: bool = False,
    plugins: Any = None,
) -> Strategy:
    """Build (or complete) the Strategy the Trainer's arguments describe, in one phase: nothing is set on it
    afterwards.

    Args:
        strategy: a registered name ("auto" picks one from the devices) or an instance the user built.
        accelerator, devices, num_nodes, precision: the Trainer's arguments of the same names.
        use_distributed_sampler, sync_batchnorm: the Trainer's arguments. They fill in what an instance left
            open (None); an instance built with another value than a Trainer argument that is not its
            default is refused (say it in one place).
        data_order: the Trainer's ``data_order`` ("sampler" or "global"), how training data is ordered.
        plugins: the Trainer's ``plugins`` (see ``sort_plugins``): a ``Precision`` takes the place of
            ``precision`` (giving both is an error, as is a strategy instance built with its own precision), a
            cluster environment that of the strategy's ``cluster_environment``, ``TorchSyncBatchNorm()``
            means ``sync_batchnorm=True``, and ``AsyncCheckpointIO()`` has checkpoints written in the background.

    Example:
        ```python
        strategy = resolve_strategy("ddp", "cpu", 2, 1, "32-true", use_distributed_sampler=False)
        ```
    """
    from tandem.strategies.strategy import Strategy  # the registry is imported by strategy modules

    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise out_of_range("num_nodes", num_nodes, "an int >= 1")
    sorted_plugins = sort_plugins(plugins)
    accelerator = resolve_accelerator(accelerator)
    if isinstance(strategy, Strategy):
        instance = strategy
    elif isinstance(strategy, str):
        name = strategy
        if name == "auto":
            single = len(resolve_devices(accelerator, devices)) == 1 and num_nodes == 1
            name = "single_device" if single else "ddp"
        entry = _lookup(name)
        if entry is None:
            raise bad_choice("strategy", strategy, ["auto", *available_strategies()])
        instance = entry.cls(**entry.init_kwargs)
    else:
        names = ", ".join(["auto", *available_strategies()])
        raise TandemConfigError(f"strategy={strategy!r} must be a name ({names}) or a Strategy instance.")
    device_list = instance.parallel_devices
    if device_list is None:  # the instance leaves the devices to the Trainer's arguments
        device_list = resolve_devices(accelerator, devices)
        type(instance)._check_devices(accelerator, len(device_list))
        if devices == "auto" and accelerator == "cpu" and instance.max_devices != 1 and num_nodes == 1:
            _say_one_cpu_process(strategy if isinstance(strategy, str) else instance.name)
    if sorted_plugins.precision is not None:
        precision = _precision_plugin(sorted_plugins.precision, precision, instance)
    instance._configure(
        device_list,
        num_nodes,
        precision,
        use_distributed_sampler,
        sync_batchnorm or sorted_plugins.sync_batchnorm,
        sorted_plugins.cluster_environment,
        sorted_plugins.checkpoint_io,
        data_order,
    )
    return instance


def _say_one_cpu_process(name: str) -> None:
    """``devices="auto"`` counts one CPU device (Lightning's count, kept): a strategy of several processes then runs
    one, which the user may not expect from ``strategy="ddp"``. One info line says so, and how to start N."""
    rank_zero_info(
        f"strategy={name!r} with devices='auto' on the CPU runs 1 process: 'auto' counts one CPU device, as in "
        f"Lightning. To train with N processes on the CPU, pass devices=N (e.g. Trainer(accelerator='cpu', "
        f"strategy={name!r}, devices=4))."
    )


def _precision_plugin(plugin: Precision, precision: Any, strategy: Strategy) -> Precision:
    """The precision plugin, unless the precision is also given elsewhere (as Lightning, an error)."""
    named = precision.precision if isinstance(precision, Precision) else Precision(precision).precision
    if named != "32-true":
        raise incompatible(
            f"Trainer(precision={precision!r}, plugins=[Precision({plugin.precision!r})])",
            "both set the precision",
            "Choose one: precision='...' or a Precision in plugins.",
        )
    if strategy._given["precision"] is not None:
        raise incompatible(
            f"Trainer(plugins=[Precision({plugin.precision!r})]) with a strategy built with "
            f"precision={strategy._given['precision']!r}",
            "both set the precision",
            "Choose one: the strategy's precision argument or a Precision in plugins.",
        )
    return plugin
