"""DataParallel: one process drives several CUDA devices; each step's batch is split across them.

The data flow of one step, in [`DataParallelStrategy.run_step`][tandem.strategies.DataParallelStrategy.run_step]:

1. **Split** the batch along dim 0 into one chunk per device with ``split_batch`` (tensors inside
   tuples, lists, dicts and dataclasses; other values are copied to every chunk). Chunk sizes differ by
   at most one: a batch of 10 on 4 devices gives 3, 3, 2, 2.
2. **Replicate** the module onto the devices (torch's ``replicate``; the replicas' parameters are views
   of the module's, so their gradients flow back to it).
3. **Apply** the step method (``training_step``, ``validation_step``, ``test_step``, ``predict_step``)
   in each replica, in one thread per device, under the precision's autocast. ``self.log`` calls made
   there are buffered per replica (``tandem.utilities.logged_values.replica_log_buffer``).
4. **Combine** on the first device with ``combine_outputs``: scalars (the loss) as the mean weighted
   by chunk size, so the gradient is exactly the single-device gradient of the whole batch; per-sample
   tensors concatenated in order. Each logged name is combined the same way (or by its ``reduce_fx``)
   and logged once from the main thread.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import nn
from torch.nn.parallel import replicate

from tandem.strategies.precision import Precision
from tandem.strategies.registry import register_strategy
from tandem.strategies.strategy import Strategy
from tandem.utilities.exceptions import TandemConfigError, TandemUserCodeError, add_note
from tandem.utilities.logged_values import is_metric, replica_log_buffer
from tandem.utilities.rank_zero import rank_zero_warn

if TYPE_CHECKING:
    from tandem.module import TrainingModule

#: values that are copied to every chunk instead of being split
_REPLICATED = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, enum.Enum)
_MUTATION_CHECKS = 5  # steps of each kind (training, validation, ...) checked for buffers changed in forward
_DEVICE_ERROR = re.compile(r"same device|expected device|different devices|device mismatch", re.IGNORECASE)


def _needs_cuda() -> TandemConfigError:
    return TandemConfigError(
        "strategy='dp' needs CUDA devices; on CPU use strategy='ddp', which runs one process per CPU device "
        "(e.g. Trainer(strategy='ddp', accelerator='cpu', devices=2))."
    )


class DataParallelStrategy(Strategy):
    """One process, several CUDA devices: each batch is split across replicas of the module.

    **Where the update happens.** The parameters live on the first device, and only there. Every step,
    the module is copied to the other devices (replicas whose parameters are views of the originals),
    each replica runs the step on its chunk of the batch, and the loss is combined on the first device.
    ``backward`` sends every replica's gradient back to the one set of parameters, and the optimizer
    steps once, on the first device. The replicas are thrown away and rebuilt from the updated
    parameters at the next forward, so they never drift apart.

    **Trade-offs against ``strategy="ddp"``** (one process per device), which is faster on more than one
    GPU and recommended by PyTorch: the replicas run in Python threads and contend for the GIL; the
    module is copied to every device at every step; the first device holds the gathered outputs, the
    loss, the gradients and the optimizer state, so it uses more memory and works more than the others.
    DataParallel's advantages: one process, nothing to launch, and code after ``fit()`` runs once.

    **What a replica cannot do.** Replicas are copies made for one step. In-place changes that the
    replica on the first device makes to buffers (BatchNorm's running statistics, a counter) reach the
    module; changes made on the other devices, and attribute assignments (``self.x = ...``), are lost
    (a warning says so; the first steps of each kind are checked by the tensors' version counters). torchmetrics ``Metric`` objects must be updated on the main module: return
    predictions and targets from the step and update the metric in ``on_*_batch_end``, which runs once
    with the outputs gathered from all replicas.

    Args:
        devices: CUDA devices (indices, ``"cuda:1"``, or ``torch.device``); None: the Trainer's ``devices``.
            CPU devices (``["cpu"] * 4``) run the same data flow on CPU copies, for tests and debugging only.
        precision: see [`Precision`][tandem.strategies.Precision].
        parallel: run the replicas in threads (default); False runs them one after another in the calling
            thread (same results; easier to debug with pdb).

    Example:
        ```python
        trainer = Trainer(strategy="dp", accelerator="cuda", devices=4)  # batch_size=256 -> 64 per GPU
        ```
    """

    name = "dp"
    supported_accelerators = ("cuda",)
    max_devices = None
    supports_manual_optimization = False  # the step runs once per replica
    supports_compile = False  # replicas rebuilt in threads every step; Lightning refuses it too

    def __init__(
        self,
        devices: Sequence[int | str | torch.device] | None = None,
        precision: str | Precision | None = None,
        parallel: bool = True,
    ) -> None:
        normalized = None if devices is None else [_as_device(d) for d in devices]
        super().__init__(devices=normalized, precision=precision)
        self.parallel = parallel
        self._warned: set[str] = set()
        self._metric_names: list[str] = []
        self._mutation_checks: dict[str, int] = {}  # step method -> steps checked for changed buffers

    @classmethod
    def _check_devices(cls, accelerator: str, count: int) -> None:
        if accelerator != "cuda":
            raise _needs_cuda()

    def _check_configuration(self) -> None:
        super()._check_configuration()
        if self.num_nodes != 1:
            raise TandemConfigError(
                f"strategy='dp' runs in one process on one machine; got num_nodes={self.num_nodes}. "
                "Use strategy='ddp' for several machines."
            )
        devices = self.parallel_devices
        assert devices is not None  # _configure sets them before this check
        types = {d.type for d in devices}
        if types not in ({"cuda"}, {"cpu"}):
            raise _needs_cuda()
        if types == {"cpu"}:
            rank_zero_warn(
                "DataParallelStrategy on CPU devices runs dp's data flow on CPU copies, for tests and debugging; "
                "it is not faster. Train on CPU with strategy='ddp'."
            )
        if len(devices) == 1:
            rank_zero_warn(
                f"strategy='dp' with one device ({devices[0]}) runs as a single device: no "
                "replicas, no splitting. Pass devices=N (N > 1) to split batches across N GPUs."
            )

    @property
    def devices_per_process(self) -> int:
        """Devices this one process drives (what a throughput per device divides by)."""
        assert self.parallel_devices is not None  # read once configured
        return len(self.parallel_devices)

    def _setup(self, module: nn.Module) -> None:
        super()._setup(module)
        self._metric_names = [name for name, m in self.module.named_modules() if is_metric(m)]

    # ------------------------------------------------------------------ steps
    def run_step(self, method: str, *args: Any) -> Any:
        """Split the batch, run ``method`` in one replica per chunk, and combine the outputs and logs."""
        devices, module = self.parallel_devices, self._module
        assert devices is not None and module is not None  # configured and set up before any step
        if len(devices) == 1 or not args:
            return super().run_step(method, *args)
        batch, rest = args[0], args[1:]
        chunks, sizes = split_batch(batch, len(devices))
        if len(chunks) < len(devices):
            self._warn_once(
                "small_batch",
                f"A batch of {sum(sizes)} samples was split across {len(devices)} devices: only {len(chunks)} of "
                "them work on it. Use a batch size of at least the number of devices (better: a multiple of "
                "it), or strategy='ddp'. (Said once; the last batch of an epoch is often smaller.)",
            )
        if len(chunks) == 1:
            return super().run_step(method, *args)
        devices = devices[: len(chunks)]
        inputs = [(_to_device(chunk, d), *rest) for chunk, d in zip(chunks, devices)]
        replicas = _replicate(module, devices, detach=not torch.is_grad_enabled())
        checked = self._mutation_checks.get(method, 0)
        watch = checked < _MUTATION_CHECKS and "mutation" not in self._warned
        self._mutation_checks[method] = checked + watch
        watched = [_tensor_states(r) for r in replicas] if watch else []
        outputs, logs = self._apply(replicas, method, inputs, devices)
        self._check_mutations(replicas, watched, method)
        if method == "training_step" and any(o is None for o in outputs) and any(o is not None for o in outputs):
            self._warn_once(
                "partial_none",
                "training_step returned None for some chunks of a batch and a loss for others: the loss is the "
                "mean over the chunks that returned one. With strategy='dp', skip a batch for all chunks or none.",
            )
        output = combine_outputs(outputs, sizes, devices[0])
        self._log_combined(logs, sizes, devices[0], method)
        return output

    def _apply(
        self, replicas: list[nn.Module], method: str, inputs: list[tuple[Any, ...]], devices: list[torch.device]
    ) -> tuple[list[Any], list[list[tuple[str, Any, dict[str, Any]]]]]:
        """Run ``method`` in each replica with its inputs: one thread each, or in turn when not ``parallel``."""
        n = len(replicas)
        outputs: list[Any] = [None] * n
        logs: list[list[tuple[str, Any, dict[str, Any]]]] = [[] for _ in range(n)]
        errors: list[BaseException | None] = [None] * n
        grad_enabled = torch.is_grad_enabled()
        streams = [torch.cuda.current_stream(d) if d.type == "cuda" else None for d in devices]

        def work(i: int) -> None:
            try:
                torch.set_grad_enabled(grad_enabled)  # grad mode and autocast are per thread
                with (
                    _on_device(devices[i], streams[i]),
                    replica_log_buffer() as buffer,
                    self.precision.forward_context(),
                ):
                    outputs[i] = getattr(replicas[i], method)(*inputs[i])
                logs[i] = buffer
            except BaseException as err:  # re-raised in the calling thread
                errors[i] = err

        if self.parallel:
            threads = [threading.Thread(target=work, args=(i,), name=f"tandem-dp-{i}") for i in range(n)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:
            for i in range(n):
                work(i)
        for i, err in enumerate(errors):
            if err is not None:
                self._check_metrics(replicas, method)  # a metric updated on another device fails there
                explained = _explain(err, method, i, devices[i])
                if explained is err:
                    raise err  # its traceback still shows the replica's frames
                raise explained from err
        self._check_metrics(replicas, method)
        return outputs, logs

    def _check_metrics(self, replicas: list[nn.Module], method: str) -> None:
        for name in self._metric_names:
            original = self.module.get_submodule(name)
            if any(r.get_submodule(name)._update_count != original._update_count for r in replicas):
                raise _metric_in_replica(name, method)

    def _check_mutations(self, replicas: list[nn.Module], watched: list[list[tuple]], method: str) -> None:
        changed = sorted({qualname for states in watched for qualname, *state in states if _changed(*state)})
        if changed:
            shown = ", ".join(changed[:6]) + (", ..." if len(changed) > 6 else "")
            self._warn_once(
                "mutation",
                f"{type(self._module).__name__}.{method} changed its own buffers or parameters ({shown}), e.g. "
                "BatchNorm running statistics or a counter. Under strategy='dp' the step runs in replicas, copies "
                "made for each step: in-place changes made on the first device reach the module, but those made "
                f"on the other {len(replicas) - 1} device(s) and reassignments (self.x = ...) are lost, so such "
                "statistics see only the first chunk of each batch. If that matters, use strategy='ddp' (with "
                "DDPStrategy(sync_batchnorm=True) for BatchNorm).",
            )

    def _log_combined(
        self, logs: list[list[tuple[str, Any, dict[str, Any]]]], sizes: list[int], device: torch.device, method: str
    ) -> None:
        """Combine each name's values across replicas (by its ``reduce_fx``) and log it once, here."""
        module = cast("TrainingModule", self._module)  # logs only from a TrainingModule's steps
        groups: dict[tuple[str, int], list[tuple[torch.Tensor, int, dict[str, Any]]]] = {}
        for buffer, size in zip(logs, sizes):
            seen: dict[str, int] = {}
            for name, value, options in buffer:
                if is_metric(value):
                    raise _metric_in_replica(name, method)
                occurrence = seen[name] = seen.get(name, -1) + 1  # a name logged twice in a step: two entries
                weight = options["batch_size"] if options["batch_size"] is not None else size
                groups.setdefault((name, occurrence), []).append((value, weight, options))
        for (name, _), items in groups.items():
            values = torch.stack([v.to(device) for v, _, _ in items])
            weights = [w for _, w, _ in items]
            options = dict(items[0][2], batch_size=sum(weights))
            fx = options["reduce_fx"]
            if fx == "mean":
                values = values.to(torch.promote_types(values.dtype, torch.float32))
                weight = torch.tensor(weights, dtype=values.dtype, device=device)
                combined = (values * weight).sum() / weight.sum()
            else:
                reducers: dict[str, Callable[[], torch.Tensor]] = {
                    "sum": values.sum,
                    "max": values.max,
                    "min": values.min,
                }
                combined = reducers[fx]()
            module.log(name, combined, **options)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message)


# ====================================================================== splitting the batch
def split_sizes(total: int, parts: int) -> list[int]:
    """Sizes of ``min(total, parts)`` chunks that differ by at most one, larger first: (10, 4) -> [3, 3, 2, 2]."""
    parts = max(1, min(total, parts))
    q, r = divmod(total, parts)
    return [q + 1] * r + [q] * (parts - r)


def split_batch(batch: Any, parts: int) -> tuple[list[Any], list[int]]:
    """Split ``batch`` along dim 0 into at most ``parts`` chunks of near-equal size.

    Tensors (with at least one dim) are sliced, also inside tuples, lists, named tuples, mappings and
    dataclasses; numbers, strings, None, dtypes and devices are copied to every chunk. Fewer chunks than
    ``parts`` come back when the batch has fewer samples. Returns the chunks and their sizes.

    Raises:
        TandemUserCodeError: an object that cannot be split (named with its type and place in the batch),
            tensors whose dim 0 differ, or a batch with no tensor at all.
    """
    lengths: list[tuple[str, int]] = []
    _scan(batch, "batch", lengths)
    if not lengths:
        raise TandemUserCodeError(
            f"strategy='dp' splits each batch along dim 0 of its tensors, but this batch ({type(batch).__name__}) "
            "holds none. Return tensors from the dataloader (its default collate does), or use strategy='ddp'."
        )
    total = lengths[0][1]
    different = [(path, n) for path, n in lengths if n != total]
    if different:
        path, n = different[0]
        raise TandemUserCodeError(
            f"strategy='dp' splits every tensor of the batch along dim 0, so they must have the same length; "
            f"{lengths[0][0]} has {total} rows but {path} has {n}. Keep per-batch values out of tensors (plain "
            "Python values are copied to every chunk), or use strategy='ddp', which passes batches as they are."
        )
    sizes = split_sizes(total, parts)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [_slice(batch, start, start + size) for start, size in zip(starts, sizes)], sizes


def _scan(obj: Any, path: str, lengths: list[tuple[str, int]]) -> None:
    """Record the dim-0 length of every tensor; fail on anything that is neither splittable nor copyable."""
    if isinstance(obj, torch.Tensor):
        if obj.ndim == 0:
            raise _unsplittable(path, "a 0-dim tensor", "Give it a batch dimension, or pass it as a Python number.")
        lengths.append((path, obj.shape[0]))
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            _scan(value, f"{path}[{key!r}]", lengths)
    elif isinstance(obj, (tuple, list)):
        for i, value in enumerate(obj):
            _scan(value, f"{path}[{i}]", lengths)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            _scan(getattr(obj, f.name), f"{path}.{f.name}", lengths)
    elif not isinstance(obj, _REPLICATED):
        raise _unsplittable(
            path,
            f"a {type(obj).__module__}.{type(obj).__qualname__}",
            "Put tensors in tuples, lists, dicts or dataclasses (Python numbers and strings are copied to "
            "every chunk), convert it to a tensor, or use strategy='ddp', which passes batches as they are.",
        )


def _unsplittable(path: str, what: str, fix: str) -> TandemUserCodeError:
    return TandemUserCodeError(f"strategy='dp' cannot split {path}, {what}, along dim 0 across devices. {fix}")


def _slice(obj: Any, start: int, stop: int) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj[start:stop]
    if isinstance(obj, Mapping):
        items = [(k, _slice(v, start, stop)) for k, v in obj.items()]
        mapping_type: Callable[..., Mapping[Any, Any]] = type(obj)  # most are built from pairs
        try:
            return mapping_type(items)
        except TypeError:  # a mapping type that cannot be built from pairs
            return dict(items)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return type(obj)(*(_slice(v, start, stop) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_slice(v, start, stop) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = copy.copy(obj)
        for f in dataclasses.fields(obj):
            object.__setattr__(out, f.name, _slice(getattr(obj, f.name), start, stop))  # frozen ones too
        return out
    return obj  # a replicated value


def _to_device(chunk: Any, device: torch.device) -> Any:
    return apply_to_collection(chunk, torch.Tensor, lambda t: t.to(device, non_blocking=True))


# ====================================================================== combining outputs
def combine_outputs(outputs: list[Any], sizes: list[int], device: torch.device) -> Any:
    """Combine the replicas' step outputs on ``device``, as if one step had seen the whole batch.

    A scalar tensor (the loss, a batch mean) becomes the mean weighted by chunk size, so its gradient is
    the whole batch's. A tensor whose dim 0 is its chunk's size (predictions, per-sample values) is
    concatenated in batch order. Other tensors are stacked along a new dim 0, one row per replica.
    Dicts, tuples and lists are combined item by item; equal plain values are kept, differing ones
    become a list. Replicas that returned None are left out.
    """
    present = [(o, s) for o, s in zip(outputs, sizes) if o is not None]
    if not present:
        return None
    values, weights = [o for o, _ in present], [s for _, s in present]
    first = values[0]
    if isinstance(first, torch.Tensor) and all(isinstance(v, torch.Tensor) for v in values):
        moved = [v.to(device) for v in values]
        if first.ndim > 0 and all(v.ndim > 0 and v.shape[0] == s for v, s in zip(values, weights)):
            return torch.cat(moved)
        if all(v.numel() == 1 for v in values):
            stacked = torch.stack([v.reshape(()) for v in moved])
            stacked = stacked if stacked.is_floating_point() or stacked.is_complex() else stacked.double()
            w = torch.tensor(weights, dtype=stacked.real.dtype, device=device) / sum(weights)
            return (stacked * w).sum().reshape(first.shape)
        return torch.stack(moved)
    if isinstance(first, Mapping) and all(isinstance(v, Mapping) for v in values):
        keys = list(dict.fromkeys(k for v in values for k in v))
        items = [(k, combine_outputs([v.get(k) for v in values], weights, device)) for k in keys]
        mapping_type: Callable[..., Mapping[Any, Any]] = type(first)  # most are built from pairs
        try:
            return mapping_type(items)
        except TypeError:
            return dict(items)
    if isinstance(first, (tuple, list)) and all(type(v) is type(first) and len(v) == len(first) for v in values):
        items = [combine_outputs([v[i] for v in values], weights, device) for i in range(len(first))]
        return type(first)(*items) if hasattr(first, "_fields") else type(first)(items)
    try:
        if all(v == first for v in values[1:]):
            return first
    except (TypeError, ValueError, RuntimeError):  # values that do not compare to a bool
        pass
    return values


# ====================================================================== replicas
def _replicate(module: nn.Module, devices: list[torch.device], detach: bool) -> list[nn.Module]:
    if devices[0].type == "cuda":
        return replicate(module, devices, detach=detach)
    return [_cpu_replica(module, first=i == 0, detach=detach) for i in range(len(devices))]


def _cpu_replica(network: nn.Module, first: bool, detach: bool) -> nn.Module:
    """torch's ``replicate`` needs CUDA to broadcast; on CPU devices a replica is built the same way.

    As on CUDA, the first replica shares the module's tensors (in-place changes to its buffers reach the
    module) and the others hold copies; parameters are differentiable views or copies of the module's.
    """
    modules = list(network.modules())
    copies = [m._replicate_for_data_parallel() for m in modules]
    index = {m: i for i, m in enumerate(modules)}
    for m, replica in zip(modules, copies):
        replica._former_parameters = OrderedDict()
        for key, child in m._modules.items():
            replica._modules[key] = None if child is None else copies[index[child]]
        for key, param in m._parameters.items():
            if param is None:
                replica._parameters[key] = None
                continue
            tensor = param.detach() if detach else param
            tensor = tensor.view_as(tensor) if first else tensor.clone()
            setattr(replica, key, tensor)  # not a leaf Parameter any more: a plain attribute, as in torch
            replica._former_parameters[key] = tensor
        for key, buf in m._buffers.items():
            if buf is not None and not first:
                replica._buffers[key] = buf.clone() if buf.requires_grad and not detach else buf.detach().clone()
    return copies[0]


def _tensor_states(replica: nn.Module) -> list[tuple[str, nn.Module, str, torch.Tensor, int]]:
    """``(name, owner, attribute, tensor, version)`` for every buffer and parameter copy of a replica."""
    states = []
    for prefix, m in replica.named_modules():
        dot = f"{prefix}." if prefix else ""
        for key, buf in m._buffers.items():
            if buf is not None:
                states.append((dot + key, m, key, buf, buf._version))
        for key, param in getattr(m, "_former_parameters", {}).items():
            states.append((dot + key, m, key, param, param._version))
    return states


def _changed(owner: nn.Module, key: str, tensor: torch.Tensor, version: int) -> bool:
    current = owner._buffers[key] if key in owner._buffers else getattr(owner, key, None)
    return current is not tensor or tensor._version != version


@contextlib.contextmanager
def _on_device(device: torch.device, stream: Any) -> Iterator[None]:
    """The CUDA device and stream a replica runs on (nothing to do for CPU)."""
    if device.type != "cuda":
        yield
        return
    with torch.cuda.device(device), torch.cuda.stream(stream):
        yield


# ====================================================================== errors
def _explain(err: BaseException, method: str, replica: int, device: torch.device) -> BaseException:
    """A replica's error, with the fix for the classic one: a tensor made on the wrong device."""
    if isinstance(err, RuntimeError) and _DEVICE_ERROR.search(str(err)):
        return TandemUserCodeError(
            f"{method} mixed tensors on different devices in the replica on {device} (replica {replica}): {err}\n"
            "Under strategy='dp' every replica runs on its own device, with its chunk of the batch already moved "
            "there by tandem. Do not move tensors yourself (.cuda(), .to('cuda:0'), device='cuda'); create new "
            "tensors on the device of an input instead: torch.zeros(n, device=x.device), x.new_zeros(n), "
            "torch.zeros_like(x)."
        )
    add_note(err, f"(raised in {method} in the DataParallel replica on {device}, replica {replica})")
    return err


def _metric_in_replica(name: str, method: str) -> TandemUserCodeError:
    return TandemUserCodeError(
        f"The torchmetrics Metric {name!r} was updated or logged in {method}, which strategy='dp' runs in "
        "replicas: copies of the module made for one step, whose metric states are thrown away after it. "
        "Update metrics on the main module: return the predictions and targets from the step (e.g. "
        "{'loss': loss, 'preds': logits, 'target': y}) and update and log the metric in on_train_batch_end / "
        "on_validation_batch_end / on_test_batch_end(self, outputs, batch, batch_idx), which run once with the "
        "outputs of all replicas concatenated: self.acc(outputs['preds'], outputs['target']); "
        "self.log('acc', self.acc)."
    )


def _as_device(device: int | str | torch.device) -> torch.device:
    return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)


register_strategy("dp", DataParallelStrategy, "one process, the batch split across several CUDA devices")
