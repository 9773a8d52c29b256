"""Strategy resolution by name and the single-device defaults: pure configuration, no processes."""

from __future__ import annotations

import pytest
import torch

import tandem
from helpers import run_python
from tandem.strategies import AsyncCheckpointIO, DDPStrategy, Precision, SingleDeviceStrategy, available_strategies
from tandem.strategies.environments import LocalEnvironment, SLURMEnvironment
from tandem.strategies.layer_sync import TorchSyncBatchNorm
from tandem.strategies.registry import resolve_strategy
from tandem.utilities.exceptions import TandemConfigError

pytestmark = pytest.mark.timeout(30)


def test_auto_resolves_to_single_device_on_cpu():
    strategy = resolve_strategy("auto", "cpu", "auto", 1, "32-true")
    assert isinstance(strategy, SingleDeviceStrategy)
    assert strategy.root_device == torch.device("cpu")
    assert strategy.distributed_sampler_kwargs is None and strategy.launcher is None
    assert "single_device" in available_strategies()


def test_ddp_with_auto_devices_on_the_cpu_runs_one_process_and_says_so(capsys):
    """Lightning's count for devices="auto" on the CPU is 1, kept; one info line says so and how to start N."""
    line = "strategy='ddp' with devices='auto' on the CPU runs 1 process"
    strategy = resolve_strategy("ddp", "cpu", "auto", 1, "32-true")
    assert isinstance(strategy, DDPStrategy) and strategy.num_processes == 1
    said = capsys.readouterr().err
    assert (
        said.count(line) == 1 and "pass devices=N (e.g. Trainer(accelerator='cpu', strategy='ddp', devices=4))" in said
    )
    resolve_strategy(DDPStrategy(), "cpu", "auto", 1, "32-true")  # an instance whose devices 'auto' chose
    assert capsys.readouterr().err.count(line) == 1
    resolve_strategy("ddp", "cpu", 2, 1, "32-true")  # the number asked for
    resolve_strategy("auto", "cpu", "auto", 1, "32-true")  # one process is what "auto" means here
    resolve_strategy(DDPStrategy(devices=[torch.device("cpu")] * 2), "cpu", "auto", 1, "32-true")
    assert capsys.readouterr().err == ""


def test_single_device_collectives_are_identities():
    strategy = SingleDeviceStrategy("cpu", precision="32-true")
    t = torch.tensor([1.0, 2.0])
    assert strategy.reduce(t, "sum") is t
    assert strategy.all_gather(t).shape == (1, 2)
    assert strategy.broadcast({"a": 1}) == {"a": 1}
    strategy.barrier()
    assert strategy.is_global_zero and strategy.world_size == 1


def test_user_instance_keeps_its_device_and_gets_the_trainer_precision():
    strategy = resolve_strategy(SingleDeviceStrategy("cpu"), "cpu", "auto", 1, "bf16-mixed")
    assert strategy.precision.precision == "bf16-mixed"


@pytest.mark.parametrize(("strategy", "devices"), [("auto", 1), ("ddp", 2)])
def test_trainer_float16_mixed_on_cpu_becomes_bf16_with_a_warning(strategy, devices):
    # Lightning's rule: no float16 AMP on the CPU (several times slower than float32 there)
    with pytest.warns(UserWarning, match=r"precision='16-mixed'\) but AMP with float16 is not supported on the CPU"):
        resolved = resolve_strategy(strategy, "cpu", devices, 1, 16)
    assert resolved.precision.precision == "bf16-mixed" and resolved.precision.scaler is None


def test_a_strategy_built_with_float16_keeps_it_on_cpu(recwarn):
    resolved = resolve_strategy(SingleDeviceStrategy("cpu", precision="16-mixed"), "cpu", "auto", 1, "32-true")
    assert resolved.precision.precision == "16-mixed" and resolved.precision.scaler is not None
    assert not [w for w in recwarn if "float16" in str(w.message)]


def test_precision_aliases_and_forward_context():
    assert Precision(16).precision == "16-mixed" and Precision("bf16").precision == "bf16-mixed"
    with Precision("bf16-mixed").forward_context():
        out = torch.nn.Linear(2, 2)(torch.randn(1, 2))
    assert out.dtype == torch.bfloat16
    with Precision("32-true").forward_context():
        assert torch.nn.Linear(2, 2)(torch.randn(1, 2)).dtype == torch.float32


# ---------------------------------------------------------------------------------------------- Trainer(plugins=...)


def test_plugins_are_sorted_by_kind():
    precision, environment = Precision("bf16-true"), LocalEnvironment()
    strategy = resolve_strategy("ddp", "cpu", 2, 1, "32-true", plugins=[precision, environment])
    assert strategy.precision is precision and strategy.cluster_environment is environment
    assert strategy.environment is environment and environment.num_processes == 2  # it learned the job's shape
    one = resolve_strategy("auto", "cpu", 1, 1, "32-true", plugins=TorchSyncBatchNorm())  # one plugin, no list
    assert one.sync_batchnorm and one.precision.precision == "32-true" and one.cluster_environment is None
    trainer = tandem.Trainer(accelerator="cpu", logger=False, plugins=[SLURMEnvironment(auto_requeue=False)])
    assert not trainer.strategy.cluster_environment.auto_requeue  # one process keeps it too (the requeue rule)
    writer = AsyncCheckpointIO()
    assert resolve_strategy("ddp", "cpu", 2, 1, "32-true", plugins=[writer]).checkpoint_io is writer
    assert one.checkpoint_io is None  # without the plugin, checkpoints are written before the save returns


def test_a_precision_plugin_is_kept_as_given_on_the_cpu(recwarn):
    # the Trainer's precision="16-mixed" becomes bf16 on the CPU; a Precision instance is an explicit choice
    strategy = resolve_strategy("auto", "cpu", 1, 1, "32-true", plugins=[Precision("16-mixed")])
    assert strategy.precision.precision == "16-mixed" and strategy.precision.scaler is not None
    assert not [w for w in recwarn if "float16" in str(w.message)]


@pytest.mark.parametrize(
    ("strategy", "precision", "plugins", "match"),
    [
        (
            "auto",
            "bf16-mixed",
            [Precision("bf16-true")],
            r"precision='bf16-mixed', plugins=\[Precision\('bf16-true'\)\]\)",
        ),
        (
            lambda: SingleDeviceStrategy("cpu", precision="64-true"),
            "32-true",
            [Precision("bf16-true")],
            "a strategy built with precision='64-true': both set the precision",
        ),
        (
            lambda: DDPStrategy(cluster_environment=LocalEnvironment()),
            "32-true",
            [SLURMEnvironment()],
            r"built with cluster_environment=LocalEnvironment\(\.\.\.\): a job has one cluster environment",
        ),
        ("auto", "32-true", [Precision("64-true"), Precision("bf16-true")], "got two precision plugins"),
        ("auto", "32-true", [LocalEnvironment(), SLURMEnvironment()], "got two cluster environment plugins"),
        ("auto", "32-true", [AsyncCheckpointIO(), AsyncCheckpointIO()], "got two checkpoint io plugins"),
    ],
    ids=[
        "precision_and_plugin",
        "strategy_precision_and_plugin",
        "two_environments",
        "two_precisions",
        "two_envs",
        "two_checkpoint_io",
    ],
)
def test_plugins_that_conflict_are_errors(strategy, precision, plugins, match):
    with pytest.raises(TandemConfigError, match=match):
        resolve_strategy(strategy if isinstance(strategy, str) else strategy(), "cpu", 2, 1, precision, plugins=plugins)


class _MyCheckpointIO:  # Lightning's CheckpointIO interface
    def save_checkpoint(self, checkpoint, path, storage_options=None): ...

    def load_checkpoint(self, path, map_location=None): ...

    def remove_checkpoint(self, path): ...


@pytest.mark.parametrize(
    ("plugin", "match"),
    [
        ("bf16-true", r"plugins are objects, not names. For a precision write Trainer\(precision='bf16-true'\)"),
        (
            _MyCheckpointIO(),
            "looks like a checkpoint IO plugin; tandem has one, tandem.strategies.AsyncCheckpointIO.*override its save_checkpoint",
        ),
        (
            object(),
            r"not a plugin tandem knows. Expected a tandem.strategies.Precision.*SLURMEnvironment.*TorchSyncBatchNorm.*AsyncCheckpointIO",
        ),
    ],
    ids=["name", "checkpoint_io", "other"],
)
def test_plugins_tandem_does_not_have_are_refused_naming_what_it_accepts(plugin, match):
    with pytest.raises(TandemConfigError, match=match):
        tandem.Trainer(accelerator="cpu", logger=False, plugins=[plugin])


def test_built_in_strategy_names_are_listed_before_their_modules_are_imported_and_resolve_on_lookup():
    script = (
        "import sys\n"
        "from tandem.strategies import available_strategies\n"
        "from tandem.strategies.registry import resolve_strategy\n"
        "names = available_strategies()\n"
        "assert {'single_device', 'dp', 'ddp', 'ddp_spawn', 'ddp_find_unused_parameters_true', 'fsdp'} <= set(names)\n"
        "assert 'tandem.strategies.ddp' not in sys.modules and 'tandem.strategies.fsdp' not in sys.modules\n"
        "strategy = resolve_strategy('ddp_spawn', 'cpu', 2, 1, '32-true')\n"
        "from tandem.strategies import DDPStrategy\n"
        "assert type(strategy) is DDPStrategy and strategy.start_method == 'spawn'\n"
        "assert 'tandem.strategies.fsdp' not in sys.modules\n"
        "print('resolved', type(strategy).__name__)\n"
    )
    result = run_python(["-c", script])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resolved DDPStrategy" in result.stdout


def test_a_strategy_registered_under_a_built_in_name_replaces_it_even_before_the_built_in_was_imported():
    script = (
        "from tandem.strategies import register_strategy\n"
        "from tandem.strategies.registry import resolve_strategy\n"
        "from tandem.strategies.single_device import SingleDeviceStrategy\n"
        "class Mine(SingleDeviceStrategy):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "register_strategy('ddp', Mine, 'mine')\n"
        "import tandem.strategies.ddp\n"
        "print('built', type(resolve_strategy('ddp', 'cpu', 1, 1, '32-true')).__name__)\n"
    )
    result = run_python(["-c", script])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "built Mine" in result.stdout
