"""The examples run end to end, in fresh processes, and print what they promise."""

from __future__ import annotations

import os
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


@pytest.mark.slow
@pytest.mark.timeout(310)
def test_digits_default_run_reaches_97_percent_and_says_where_the_logs_are(tmp_path: Path) -> None:
    """``make demo``'s run (10 epochs, about 8 s on 2 idle cores)."""
    out = run_example("digits.py", "--root-dir", str(tmp_path), timeout=300)
    match = ACCURACY_LINE.search(out)
    assert match, out
    assert float(match.group(1)) >= 0.97, out
    log_dir = tmp_path / "tandem_logs" / "version_0"
    assert f"logs and checkpoints: {log_dir}" in out
    assert f"tensorboard --logdir {tmp_path}" in out
    assert list(log_dir.glob("events.out.tfevents.*")), "no TensorBoard event file was written"
    assert (log_dir / "hparams.yaml").is_file()
    # Lightning's default ModelCheckpoint(): the latest epoch's checkpoint alone
    assert [p.name for p in (log_dir / "checkpoints").iterdir()] == ["epoch=9-step=200.ckpt"]


def test_digits_names_the_tensorboard_beside_its_python(examples_importable, tmp_path, monkeypatch) -> None:
    """``make demo`` runs .venv/bin/python without activating .venv: digits.py's last line names .venv's tensorboard
    by its path (the one line that says how to watch the run; the Makefile adds none); an activated environment's
    (on the PATH) by its name."""
    import digits

    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "tensorboard").write_text("#!/bin/sh\n")
    (venv_bin / "tensorboard").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert digits.tensorboard_command() == os.path.join(".venv", "bin", "tensorboard")
    monkeypatch.setenv("PATH", f"{venv_bin}:/usr/bin:/bin")
    assert digits.tensorboard_command() == "tensorboard"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # outside the folder that holds .venv: the whole path
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert digits.tensorboard_command() == str(venv_bin / "tensorboard")


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


# The examples' --fast runs: each checks that the program runs and prints what it promises. The cheap ones run in
# this process through their main(argv); those that start processes (ddp, fsdp) run as a user would run them.


@pytest.fixture
def examples_importable(monkeypatch):
    """examples/ on sys.path; seed_everything's variable and the global RNG as they were, after the test."""
    from tandem.utilities.seed import isolate_rng

    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.delenv("TANDEM_GLOBAL_SEED", raising=False)
    with isolate_rng():
        yield


def test_gan_example_fast_steps_both_optimizers_each_batch(examples_importable, tmp_path, capsys) -> None:
    import gan

    gan.main(["--fast", "--root-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "batches: 4, optimizer steps (global_step): 8" in out  # two manual steps a batch
    assert re.search(r"generated points on a mode: \d\.\d{3}", out)
    # a few batches show nothing of what a GAN learns: the output says so, with the full run's number
    assert "--fast is a smoke test (4 batches)" in out
    assert "The full run (python examples/gan.py, 30 epochs) puts 83% of the generated points on a mode." in out


def test_finetune_example_fast_unfreezes_the_pretrained_backbone(examples_importable, tmp_path, capsys) -> None:
    import finetune

    result = finetune.main(["--fast", "--root-dir", str(tmp_path)])
    assert (tmp_path / "pretrained_backbone.pt").is_file()
    assert result["backbone_trains"]  # BackboneFinetuning unfroze it at epoch 1
    head, backbone = result["learning_rates"]  # the backbone joined as a second group, at a tenth of the head's rate
    assert backbone == pytest.approx(head * 0.1)
    out = capsys.readouterr().out
    assert "validation accuracy: fine-tuned" in out
    # 2 batches an epoch may well leave the fine-tuned model behind: the output says that this is a smoke test
    assert "--fast is a smoke test (2 batches an epoch)" in out
    assert "ends at 0.98 fine-tuned, 0.95 from scratch." in out


@pytest.mark.timeout(250)
def test_resume_example_fast_continues_exactly_after_sigkill_then_sigterm_in_one_folder(tmp_path: Path) -> None:
    """The docstring's commands one after the other in one --root-dir: each reports its own run's last.ckpt (the
    pre-empted run's, written at the stop, not the killed run's earlier one beside it)."""
    # in a fresh process, as a user runs it: the resumed and the uninterrupted runs there compute as the killed child
    # did (a test process's earlier tests may have changed torch's global settings)
    out = run_example("resume.py", "--fast", "--root-dir", str(tmp_path), timeout=120)
    assert "stopped by SIGKILL after step 13 (exit -9); last.ckpt holds step 10" in out
    assert "resumed run against uninterrupted run: largest weight difference 0.0\n" in out  # bit for bit
    out = run_example("resume.py", "--fast", "--signal", "TERM", "--root-dir", str(tmp_path), timeout=120)
    assert "stopped by SIGTERM after step 13 (exit 143); last.ckpt holds step 13" in out
    assert "resumed run against uninterrupted run: largest weight difference 0.0\n" in out


def test_digits_cli_example_fast_fits_from_the_config(examples_importable, tmp_path) -> None:
    import digits_cli

    config = str(EXAMPLES / "configs" / "digits.yaml")
    cli = digits_cli.main(["fit", "-c", config, "--fast", "--trainer.default_root_dir", str(tmp_path)])
    assert cli.trainer.global_step == 3 and cli.trainer.current_epoch == 1  # configs/fast.yaml: 3 batches, 1 epoch
    run = tmp_path / "tandem_logs" / "version_0"
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.timeout(130)
def test_ddp_example_fast_on_two_cpu_processes(tmp_path: Path) -> None:
    out = run_example(
        "ddp.py", "--accelerator", "cpu", "--devices", "2", "--fast", "--root-dir", str(tmp_path), timeout=120
    )
    assert "world size: 2 (cpu, gloo)" in out
    assert "--fast is a smoke test (3 batches)" in out
    assert "training samples in the first epoch, per rank: [96, 96]" in out  # 3 batches of 32 on each rank
    assert "replicas equal after fit: True" in out
    assert ACCURACY_LINE.search(out), out


@pytest.mark.timeout(130)
def test_fsdp_lm_example_fast_shards_over_two_cpu_processes(tmp_path: Path) -> None:
    out = run_example(
        "fsdp_lm.py", "--accelerator", "cpu", "--devices", "2", "--fast", "--root-dir", str(tmp_path), timeout=120
    )
    held, whole = map(int, re.search(r"parameters held by rank 0: (\d+) of (\d+) \(2 processes\)", out).groups())
    assert whole / 2 - 64 <= held <= whole / 2 + 64  # about half: each tensor split along its first dimension
    assert re.search(r"validation loss: \d+\.\d{3}", out)
    assert len(re.findall(r"^generated: '.{15}'$", out, re.MULTILINE)) == 4  # 7-character prompts + 8 characters
    assert "--fast is a smoke test (a tiny model, 4 batches)" in out
