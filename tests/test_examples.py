"""The examples run end to end, in fresh processes, and print what they promise."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
ACCURACY_LINE = re.compile(r"^test accuracy: (\d\.\d+)$", re.MULTILINE)


def run_example(name: str, *args: str, timeout: float) -> str:
    """Run ``examples/<name>`` with ``args``; return its stdout after checking it exited 0."""
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


# Generous bounds: a loaded 2-core machine once took 140 s for the default digits run (about 40 s when idle).
@pytest.mark.timeout(130)
def test_minimal_example_fits_and_tests() -> None:
    out = run_example("minimal.py", timeout=120)
    match = re.search(r"test_loss=(\d+\.\d+)", out)
    assert match, out
    assert float(match.group(1)) < 0.01  # it recovers y = 1*x0 + ... + 8*x7


@pytest.mark.timeout(130)
def test_digits_short_run_prints_accuracy_and_where_the_logs_are(tmp_path: Path) -> None:
    out = run_example("digits.py", "--max-epochs", "2", "--root-dir", str(tmp_path), timeout=120)
    match = ACCURACY_LINE.search(out)
    assert match, out
    assert 0.5 < float(match.group(1)) <= 1.0  # two epochs are far from done, but clearly learning
    log_dir = tmp_path / "tandem_logs" / "version_0"
    assert f"logs and checkpoints: {log_dir}" in out
    assert f"tensorboard --logdir {tmp_path}" in out
    assert list(log_dir.glob("events.out.tfevents.*")), "no TensorBoard event file was written"
    assert (log_dir / "hparams.yaml").is_file()
    assert (log_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
@pytest.mark.timeout(310)
def test_digits_default_run_reaches_97_percent(tmp_path: Path) -> None:
    out = run_example("digits.py", "--root-dir", str(tmp_path), timeout=300)
    match = ACCURACY_LINE.search(out)
    assert match, out
    assert float(match.group(1)) >= 0.97, out


def test_digits_cli_config_files_merge_and_interpolate(monkeypatch, capsys) -> None:
    import yaml

    from tandem.cli import CLI

    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.setenv("RUNS_DIR", "/data/runs")
    import digits

    configs = ["-c", str(EXAMPLES / "configs" / "digits.yaml"), "-c", str(EXAMPLES / "configs" / "ddp.yaml")]
    with pytest.raises(SystemExit):
        CLI(digits.DigitsCNN, digits.DigitsData, args=["fit", *configs, "--print_config"])
    config = yaml.safe_load(capsys.readouterr().out)
    trainer = config["trainer"]
    assert trainer["strategy"] == "ddp" and trainer["devices"] == 2 and trainer["max_epochs"] == 30
    assert trainer["default_root_dir"] == "/data/runs/digits_cli"  # ${oc.env:RUNS_DIR,runs}
    assert [c["class_path"] for c in trainer["callbacks"]] == [
        "tandem.callbacks.ModelCheckpoint",
        "tandem.callbacks.EarlyStopping",
    ]
    assert config["model"] == {"lr": 0.001, "dropout": 0.25} and config["data"]["batch_size"] == 32
