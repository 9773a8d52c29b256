"""The profiler that runs ``torch.profiler`` over the steps: operator times on the CPU and GPU, and traces
that TensorBoard and Chrome open (Lightning's ``PyTorchProfiler``)."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.autograd.profiler import EventList, record_function
from torch.profiler import ProfilerAction, ProfilerActivity, tensorboard_trace_handler

from tandem.profilers.profiler import Profiler
from tandem.utilities.exceptions import TandemConfigError, bad_choice
from tandem.utilities.rank_zero import WarningCache, rank_zero_warn

if TYPE_CHECKING:
    from tandem.trainer.trainer import Trainer

_warnings = WarningCache()
_STEP_KINDS = ("training_step", "validation_step", "test_step", "predict_step")


class RegisterRecordFunction:
    """Labels each submodule's forward in the profile with its name (``[pl][module]<class>: <name>``), through
    forward hooks added on entering and removed on leaving the block.

    Example:
        ```python
        with torch.profiler.profile() as prof, RegisterRecordFunction(model):
            model(batch)
        ```
    """

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._records: dict[str, record_function] = {}
        self._handles: list[Any] = []

    def _start(self, module: nn.Module, args: Any, record_name: str) -> None:
        record = record_function("[pl][module]" + record_name)
        record.__enter__()
        self._records[record_name] = record

    def _stop(self, module: nn.Module, args: Any, output: Any, record_name: str) -> None:
        record = self._records.pop(record_name, None)
        if record is not None:
            record.__exit__(None, None, None)

    def __enter__(self) -> None:
        for name, module in self._model.named_modules():
            if name:
                record_name = f"{type(module).__module__}.{type(module).__name__}: {name}"
                self._handles.append(
                    module.register_forward_pre_hook(functools.partial(self._start, record_name=record_name))
                )
                self._handles.append(
                    module.register_forward_hook(functools.partial(self._stop, record_name=record_name))
                )

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class ScheduleWrapper:
    """Runs the user's ``torch.profiler.schedule`` on each kind of step separately (training, validation, test,
    predict), so that a validation inside the fit neither advances nor disturbs the training steps' schedule;
    a kind stops being recorded once its schedule said ``RECORD_AND_SAVE``."""

    def __init__(self, schedule: Callable[[int], ProfilerAction]) -> None:
        self._schedule = schedule
        self.reset()

    def reset(self) -> None:
        self._steps = dict.fromkeys(_STEP_KINDS, 0)
        self._ended: set[str] = set()
        self._kind: str | None = None  # the kind of the step that just ended
        self._previous: ProfilerAction | None = None
        self._fitting = False

    def setup(self, fitting: bool) -> None:
        """A run starts; ``fitting``: it is a fit (whose sanity-check validation steps are not counted)."""
        self._fitting = fitting

    def pre_step(self, current_action: str) -> None:
        self._kind = next((k for k in _STEP_KINDS if current_action.endswith(k)), None)

    @property
    def kind(self) -> str | None:
        return self._kind

    @property
    def num_step(self) -> int:
        return self._steps.get(self._kind, 0) if self._kind else 0

    def __call__(self, num_step: int) -> ProfilerAction:  # torch's step count is ignored: ours is per kind
        kind = self._kind
        if kind is None or kind in self._ended:
            return ProfilerAction.NONE
        # validation during a fit starts counting with the training (not in the sanity check)
        if kind != "validation_step" or not self._fitting or self._steps["training_step"] > 0:
            self._steps[kind] += 1
        action = self._schedule(max(self._steps[kind], 0))
        if self._previous == ProfilerAction.RECORD and action == ProfilerAction.WARMUP:
            action = ProfilerAction.RECORD  # torch refuses RECORD -> WARMUP (validation recording, training warming)
        if action == ProfilerAction.RECORD_AND_SAVE:
            self._ended.add(kind)
        self._previous = action
        return action


class PyTorchProfiler(Profiler):
    r"""Runs ``torch.profiler.profile`` from the first action to the end of the run, labels every action of the
    Trainer's (``[pl][profile]<action>``) and every submodule's forward, and steps the profiler's schedule at
    each ``training_step`` / ``validation_step`` / ``test_step`` / ``predict_step``. The report is the
    operator table (``key_averages().table``); with ``export_to_chrome`` each recorded window is written as a
    ``<dirpath>/<stage>-<filename>-<action>.<time>.pt.trace.json`` that TensorBoard's profiler plugin and
    ``chrome://tracing`` open.

    Args:
        dirpath: the folder of the report and the traces (None: the Trainer's ``log_dir``).
        filename: write the report to ``<dirpath>/<stage>-<filename>.txt`` instead of printing it.
        group_by_input_shapes: group the table's operators by input shape (needs ``record_shapes=True``).
        emit_nvtx: emit an NVTX range for every autograd operation instead (for ``nsys`` / ``nvprof``; CUDA).
        export_to_chrome: write the traces (``torch.profiler.tensorboard_trace_handler``).
        row_limit: rows of the table (-1: all).
        sort_by_key: the table's order, one of ``AVAILABLE_SORT_KEYS`` (default ``"cuda_time_total"`` when
            CUDA is profiled, else ``"cpu_time_total"``).
        record_module_names: label each submodule's forward with its name.
        table_kwargs: more arguments of ``EventList.table`` (not ``sort_by`` / ``row_limit``).
        \**profiler_kwargs: arguments of ``torch.profiler.profile`` (``activities``, ``schedule``,
            ``record_shapes``, ``profile_memory``, ``with_stack``, ``on_trace_ready``, ...). The default schedule
            is ``torch.profiler.schedule(wait=1, warmup=1, active=3)``; with fewer than 5 steps every step
            is recorded instead.

    Raises:
        TandemConfigError: ``sort_by_key`` is not one of ``AVAILABLE_SORT_KEYS``, ``schedule`` is not a
            callable returning a ``torch.profiler.ProfilerAction``, or a ``table_kwargs`` key is not one of
            ``EventList.table``'s.

    Example:
        ```python
        profiler = PyTorchProfiler(filename="perf", schedule=torch.profiler.schedule(wait=2, warmup=1, active=5))
        trainer = Trainer(profiler=profiler)  # open the log folder with tensorboard --logdir
        ```
    """

    STEP_FUNCTIONS = set(_STEP_KINDS)
    AVAILABLE_SORT_KEYS = {
        "cpu_time",
        "cuda_time",
        "cpu_time_total",
        "cuda_time_total",
        "cpu_memory_usage",
        "cuda_memory_usage",
        "self_cpu_memory_usage",
        "self_cuda_memory_usage",
        "count",
    }

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str | None = None,
        group_by_input_shapes: bool = False,
        emit_nvtx: bool = False,
        export_to_chrome: bool = True,
        row_limit: int = 20,
        sort_by_key: str | None = None,
        record_module_names: bool = True,
        table_kwargs: dict[str, Any] | None = None,
        **profiler_kwargs: Any,
    ) -> None:
        self._group_by_input_shapes = group_by_input_shapes and profiler_kwargs.get("record_shapes", False)
        self._emit_nvtx = emit_nvtx
        self._export_to_chrome = export_to_chrome
        self._row_limit = row_limit
        self._sort_by_key = sort_by_key or _default_sort_by_key(profiler_kwargs)
        self._record_module_names = record_module_names
        self._table_kwargs = dict(table_kwargs or {})
        self._profiler_kwargs = profiler_kwargs
        #: the module whose submodules' forward calls are labelled, and whose Trainer says how many steps a
        #: stage has; set by the Trainer when a run starts
        self.module: nn.Module | None = None
        self.profiler: Any = None
        self.function_events: EventList | None = None
        self._register: RegisterRecordFunction | None = None
        self._parent_profiler: Any = None
        self._recording_map: dict[str, record_function] = {}

        if self._sort_by_key not in self.AVAILABLE_SORT_KEYS:
            raise bad_choice("PyTorchProfiler(sort_by_key)", self._sort_by_key, sorted(self.AVAILABLE_SORT_KEYS))
        table_keys = set(inspect.signature(EventList.table).parameters) - {"self", "sort_by", "row_limit"}
        for key in self._table_kwargs:
            if key not in table_keys:
                fix = " (it is an argument of PyTorchProfiler itself)" if key in ("sort_by", "row_limit") else ""
                raise TandemConfigError(
                    f"PyTorchProfiler(table_kwargs={{{key!r}: ...}}): {key!r} is not an argument of "
                    f"EventList.table{fix}; expected one of: {', '.join(sorted(table_keys))}."
                )
        schedule = profiler_kwargs.get("schedule")
        if schedule is not None:
            if not callable(schedule):
                raise TandemConfigError(
                    f"PyTorchProfiler(schedule={schedule!r}): expected a callable such as "
                    "torch.profiler.schedule(wait=1, warmup=1, active=3)."
                )
            action = schedule(0)
            if not isinstance(action, ProfilerAction):
                raise TandemConfigError(
                    f"PyTorchProfiler(schedule=...) returned {action!r} for step 0; a schedule returns a "
                    "torch.profiler.ProfilerAction (build it with torch.profiler.schedule(...))."
                )
        super().__init__(dirpath=dirpath, filename=filename)  # after the checks: __del__ tears down only a built one
        self._user_schedule = schedule is not None
        self._schedule = ScheduleWrapper(schedule or _default_schedule())
        self._record_all = False  # this run has too few steps for the default schedule: every step is recorded
        self._profiler_kwargs["schedule"] = self._schedule
        self._profiler_kwargs["activities"] = profiler_kwargs.get("activities") or _default_activities()
        self._has_on_trace_ready = "on_trace_ready" in profiler_kwargs
        self._export_to_flame_graph = profiler_kwargs.get("export_to_flame_graph", False)
        self._metric = profiler_kwargs.get("metric", "self_cpu_time_total")
        self._profiler_kwargs["with_stack"] = profiler_kwargs.get("with_stack", False) or self._export_to_flame_graph

    def start(self, action_name: str) -> None:
        if self.profiler is None:
            if torch.autograd._profiler_enabled():  # an earlier profiler that never described: close it
                torch.autograd._disable_profiler()
            self._schedule.setup(fitting=self._stage == "fit")
            entered = self._create_profilers().__enter__()
            if entered is not None:
                self.profiler = entered
            if self._parent_profiler is not None:
                self._parent_profiler.__enter__()
        if self.module is not None and self._register is None and self._record_module_names:
            self._register = RegisterRecordFunction(self.module)
            self._register.__enter__()
        if self.profiler is not None and action_name not in self._recording_map:
            recording = record_function("[pl][profile]" + action_name)
            recording.__enter__()
            self._recording_map[action_name] = recording

    def stop(self, action_name: str) -> None:
        recording = self._recording_map.pop(action_name, None)
        if recording is not None:
            recording.__exit__(None, None, None)
        if self._emit_nvtx or self.profiler is None or not action_name.endswith(tuple(self.STEP_FUNCTIONS)):
            return
        if not self._record_all:
            self._schedule.pre_step(action_name)
            if not self._user_schedule and self._total_steps() < 5:
                # the default schedule (wait=1, warmup=1, active=3) would record nothing: record every step
                _warnings.warn(
                    "The PyTorchProfiler default schedule will be overridden as there is not enough steps to "
                    "properly record traces."
                )
                self._record_all = True
                self.profiler.schedule = torch.profiler.profiler._default_schedule_fn
        if not self._has_on_trace_ready:
            self.profiler.on_trace_ready = functools.partial(self._on_trace_ready, action_name=action_name)
        if not self._record_all:
            self.profiler.step_num = self._schedule.num_step
        self.profiler.step()
        self.profiler.add_metadata("Framework", "tandem")

    def _on_trace_ready(self, profiler: Any, action_name: str) -> None:
        if self.dirpath is None:
            rank_zero_warn(
                "The PyTorchProfiler wrote no trace: it has no folder. Pass PyTorchProfiler(dirpath=...), or use it "
                "with a Trainer (its log folder)."
            )
            return
        if self._export_to_chrome:
            name = self._prepare_filename(action_name=action_name, extension="")
            tensorboard_trace_handler(str(self.dirpath), name)(profiler)
        if self._export_to_flame_graph:
            path = os.path.join(self.dirpath, self._prepare_filename(action_name=action_name, extension=".stack"))
            profiler.export_stacks(path, metric=self._metric)

    def _total_steps(self) -> int | float:
        """The steps of the kind now stepping that the Trainer's current run takes (its sanity check included)."""
        kind = self._schedule.kind
        trainer: Trainer | None
        try:
            trainer = getattr(self.module, "trainer", None)  # a plain nn.Module has none
        except RuntimeError:  # a TrainingModule of no Trainer
            trainer = None
        if trainer is None or kind is None:
            return float("inf")  # unknown: keep the schedule
        if kind == "training_step":
            return trainer.num_training_batches
        if kind == "validation_step":
            return sum(trainer.num_val_batches) + sum(trainer.num_sanity_val_batches)
        if kind == "test_step":
            return sum(trainer.num_test_batches)
        return sum(trainer.num_predict_batches)

    def summary(self) -> str:
        if not self._profiler_kwargs.get("enabled", True) or self._emit_nvtx:
            return ""
        self._delete_profilers()
        if not self.function_events:
            return ""
        data = self.function_events.key_averages(group_by_input_shapes=self._group_by_input_shapes)
        table = data.table(sort_by=self._sort_by_key, row_limit=self._row_limit, **self._table_kwargs)
        return self._stats_to_str({"records": table})

    def _create_profilers(self) -> Any:
        """Create ``profiler`` (not entered yet) and return it."""
        if self._emit_nvtx:
            if self._parent_profiler is None:
                self._parent_profiler = torch.cuda.profiler.profile()
            self.profiler = self._create_profiler(torch.autograd.profiler.emit_nvtx)
        else:
            self._parent_profiler = None
            self.profiler = self._create_profiler(torch.profiler.profile)
        return self.profiler

    def _create_profiler(self, profiler: type) -> Any:
        accepted = inspect.signature(profiler).parameters
        return profiler(**{k: v for k, v in self._profiler_kwargs.items() if k in accepted})

    def _delete_profilers(self) -> None:
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            if not self._emit_nvtx:
                self.function_events = self.profiler.events()
            self.profiler = None
        self._schedule.reset()
        self._record_all = False
        if self._parent_profiler is not None:
            self._parent_profiler.__exit__(None, None, None)
            self._parent_profiler = None
        if self._register is not None:
            self._register.__exit__(None, None, None)
            self._register = None

    def teardown(self, stage: str | None) -> None:
        self._delete_profilers()
        for action in list(self._recording_map):
            self.stop(action)
        self._recording_map = {}
        self.module = None
        super().teardown(stage=stage)


@functools.lru_cache(1)
def _default_schedule() -> Callable[[int], ProfilerAction]:
    """Negligible overhead over a long run: skip a step, warm up on one, record three."""
    return torch.profiler.schedule(wait=1, warmup=1, active=3)


def _default_activities() -> list[ProfilerActivity]:
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return activities


def _default_sort_by_key(profiler_kwargs: dict[str, Any]) -> str:
    activities = profiler_kwargs.get("activities") or []
    cuda = ProfilerActivity.CUDA in activities or (not activities and torch.cuda.is_available())
    return f"{'cuda' if cuda else 'cpu'}_time_total"
