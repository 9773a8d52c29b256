"""Checkpoint and log files: atomic writes, temporaries left by killed writers, file modes, write errors, the
checksum, and what a bad ``ckpt_path`` is told."""

from __future__ import annotations

import argparse
import collections
import datetime
import enum
import errno
import fcntl
import os
import pathlib
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from helpers import TinyModule, loader, quiet_trainer
from tandem.callbacks import ModelCheckpoint
from tandem.loggers import CSVLogger
from tandem.utilities import checkpoint_format, temporaries
from tandem.utilities.atomic import check_writable_folder, replace_directory, temporary_directory
from tandem.utilities.checkpoint import CHECKPOINT_MARKER, atomic_save, load_checkpoint_file
from tandem.utilities.checkpoint_format import CHECKSUM_KEY, to_plain
from tandem.utilities.exceptions import CheckpointError, FileWriteError
from tandem.utilities.temporaries import remove_stale_temporaries, remove_stale_temporaries_in

pytestmark = pytest.mark.timeout(60)


def _temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_failed_save_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_save({CHECKPOINT_MARKER: "x", "value": 1}, path)

    def broken_save(obj, f):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_save({CHECKPOINT_MARKER: "x", "value": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint_file(path)["value"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_process_killed_while_saving_leaves_a_loadable_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    code = f"""
import torch
from tandem.utilities.checkpoint import atomic_save
big = torch.randn(4_000_000)
i = 0
print("ready", flush=True)
while True:
    i += 1
    atomic_save({{"tandem_version": "x", "i": i, "big": big}}, {str(path)!r})
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 30
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # let it be in the middle of another save
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    checkpoint = load_checkpoint_file(path)
    assert checkpoint["i"] >= 1 and checkpoint["big"].numel() == 4_000_000


_HALF_WRITTEN = """
import sys, time
from tandem.utilities.atomic import atomic_write

def write(f):
    f.write(b"x" * 3_000_000)
    f.flush()
    print("writing", flush=True)
    time.sleep(120)

atomic_write(sys.argv[1], write)
"""


def test_a_killed_writers_temporary_is_removed_by_the_next_save_and_a_live_writers_is_not(tmp_path):
    """The next save to the same target removes what a SIGKILLed save left; a temporary that a live process is
    still writing, other hosts' recent temporaries and files that are not tandem's stay."""
    path = tmp_path / "last.ckpt"
    atomic_save({CHECKPOINT_MARKER: "x", "value": 1}, path)
    unrelated = [".last.ckpt.k2j4h5g6.tmp", ".other.ckpt.host-1-0123abcd.tmp", ".last-v1.ckpt.host-1-0123abcd.tmp"]
    for name in unrelated:
        (tmp_path / name).write_bytes(b"not ours to remove")
    writer = subprocess.Popen([sys.executable, "-c", _HALF_WRITTEN, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
        (live,) = set(_temporaries(tmp_path)) - set(unrelated)
        assert live.startswith(".last.ckpt.") and f"-{writer.pid}-" in live
        atomic_save({CHECKPOINT_MARKER: "x", "value": 2}, path)  # the writer is alive: its file stays
        assert live in _temporaries(tmp_path)
        assert (tmp_path / live).stat().st_size == 3_000_000
        writer.kill()
        writer.wait(timeout=10)
        assert live in _temporaries(tmp_path)  # SIGKILL: nothing removed it
        atomic_save({CHECKPOINT_MARKER: "x", "value": 3}, path)
    finally:
        writer.kill()
        writer.stdout.close()
    assert _temporaries(tmp_path) == sorted(unrelated)
    assert load_checkpoint_file(path)["value"] == 3


_DIRECTORY_BEING_WRITTEN = """
import sys, time
from tandem.utilities.atomic import temporary_directory

with temporary_directory(sys.argv[1]) as folder:
    (folder / "__0_0.distcp").write_bytes(b"x" * 1_000_000)
    print(folder.name, flush=True)
    time.sleep(120)
"""


def test_a_killed_sharded_writers_directory_is_removed_by_the_next_save_or_a_resume_and_a_live_ones_is_not(tmp_path):
    """A sharded checkpoint's temporary directory is named and locked like a file's. While its writer lives, no
    save into the folder and no resume's sweep touches it; after a SIGKILL, each of them removes it: the next
    sharded save of last.ckpt, a save of another file in the folder (a new run writes last-v1.ckpt), and a
    resume from that folder. The folder's other files, tandem's or not, stay."""
    path = tmp_path / "last.ckpt"
    kept = [tmp_path / "notes.tmp", tmp_path / ".last.ckpt.k2j4h5g6.tmp", tmp_path / "epoch=0-step=4.ckpt"]
    for name in kept:
        name.write_text("not a temporary of a killed tandem save")

    def next_sharded_save() -> None:
        with temporary_directory(path) as folder:
            folder.rmdir()

    removers = {
        "next sharded save": next_sharded_save,
        "a save of another file": lambda: atomic_save({CHECKPOINT_MARKER: "x"}, tmp_path / "last-v1.ckpt"),
        "resume": lambda: remove_stale_temporaries_in(tmp_path),
    }
    writer = subprocess.Popen(
        [sys.executable, "-c", _DIRECTORY_BEING_WRITTEN, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        stale = tmp_path / writer.stdout.readline().strip()
        assert stale.name.startswith(".last.ckpt.") and f"-{writer.pid}-" in stale.name and stale.is_dir()
        for remove in removers.values():
            remove()
        assert (stale / "__0_0.distcp").is_file()  # its writer is alive: kept
        spare = shutil.copytree(stale, tmp_path.parent / f"{tmp_path.name}-spare")
        writer.kill()
        writer.wait(timeout=10)
    finally:
        writer.kill()
        writer.stdout.close()
    for what, remove in removers.items():
        if not stale.exists():
            shutil.copytree(spare, stale)  # the same leftover again: its writer's process is gone
        remove()
        assert not stale.exists(), what
    assert all(p.read_text().startswith("not a temporary") for p in kept)


def test_temporaries_of_another_host_are_removed_only_when_unlocked_and_idle(tmp_path):
    """On a shared filesystem a writer on another machine cannot be asked whether it lives: its temporary goes
    only when nobody holds its lock and it has not changed for two minutes."""
    path = tmp_path / "last.ckpt"
    old, fresh, locked = (tmp_path / f".last.ckpt.othernode-{pid}-0123abcd.tmp" for pid in (11, 12, 13))
    for tmp in (old, fresh, locked):
        tmp.write_bytes(b"x")
    an_hour_ago = time.time() - 3600
    for tmp in (old, locked):
        os.utime(tmp, (an_hour_ago, an_hour_ago))
    with open(locked, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # a live writer elsewhere holds this one
        assert remove_stale_temporaries(path) == [old.name]
    assert sorted(_temporaries(tmp_path)) == sorted([fresh.name, locked.name])


# A process that replaced a sharded last.ckpt in one folder per point of the swap and stopped there, as a kill
# would stop it (nothing after that point ran), then ended: its leftovers name a writer that is gone.
_SWAPS_CUT_SHORT = """
import os, sys
from pathlib import Path
from tandem.utilities.atomic import _swap_steps, temporary_directory

for folder in map(Path, sys.argv[1:]):
    target, stop = folder / "last.ckpt", folder.name.replace("-", " ")
    with temporary_directory(target) as new:
        (new / "meta.pt").write_text("new")
        (new / "__0_0.distcp").write_bytes(b"n" * 1000)
        if stop != "before":
            for step in _swap_steps(new, target):
                if step == stop:
                    break
                if stop == "removing" and step == "in place":  # killed in the middle of removing the previous one
                    (old,) = folder.glob(".last.ckpt.*.old")
                    (old / "__0_0.distcp").unlink()
                    break
os._exit(0)
"""
_SWAP_POINTS = {  # where the kill landed: what is left before anything settles it, and what last.ckpt is then
    "before": ({"last.ckpt": "old", ".tmp": "new"}, "old"),
    "moved aside": ({".old": "old", ".tmp": "new"}, "old"),  # no last.ckpt: "last" would start from scratch
    "in place": ({"last.ckpt": "new", ".old": "old"}, "new"),
    "removing": ({"last.ckpt": "new", ".old": "old"}, "new"),  # a part of the previous one (29 of 58 MB seen)
    "removed": ({"last.ckpt": "new"}, "new"),
}


def _sharded_contents(folder: Path) -> dict[str, str]:
    """What each entry of ``folder`` holds (its meta.pt), by name: last.ckpt, or a temporary's kind."""
    found = {}
    for entry in folder.iterdir():
        name = entry.name if not entry.name.startswith(".") else entry.suffix
        found[name] = (entry / "meta.pt").read_text() if (entry / "meta.pt").exists() else "?"
    return found


def test_a_save_killed_at_each_point_of_replacing_a_sharded_checkpoint_is_settled_by_a_resume_or_the_next_save(
    tmp_path,
):
    """Replacing a sharded last.ckpt renames the previous one aside, the new one onto last.ckpt, then removes the
    previous one. Killed at any point, what is left is settled once its writer is gone, by a resume's sweep and by
    the next save into the folder alike: between the renames the previous checkpoint goes back to last.ckpt (a
    resume finds it instead of starting from step 0); after them the previous one (whole or half removed) goes."""
    folders = []
    for point in _SWAP_POINTS:
        folder = tmp_path / "resume" / point.replace(" ", "-")
        folder.mkdir(parents=True)
        (folder / "last.ckpt").mkdir()
        (folder / "last.ckpt" / "meta.pt").write_text("old")
        (folder / "last.ckpt" / "__0_0.distcp").write_bytes(b"o" * 1000)
        (folder / "notes.txt").write_text("the user's")
        folders.append(folder)
    done = subprocess.run([sys.executable, "-c", _SWAPS_CUT_SHORT, *map(str, folders)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for (point, (left, settled)), folder in zip(_SWAP_POINTS.items(), folders):
        assert _sharded_contents(folder) == {**left, "notes.txt": "?"}, point
        next_save = shutil.copytree(folder, tmp_path / "next-save" / folder.name, symlinks=True)
        remove_stale_temporaries_in(folder)  # a resume's sweep of its checkpoint's folder
        assert _sharded_contents(folder) == {"last.ckpt": settled, "notes.txt": "?"}, point
        shard = (folder / "last.ckpt" / "__0_0.distcp").read_bytes()
        assert shard == {"old": b"o", "new": b"n"}[settled] * 1000, point  # whole, never the half-removed one
        with temporary_directory(next_save / "last.ckpt") as new:  # the next save: its sweep runs first
            assert _sharded_contents(next_save) == {"last.ckpt": settled, ".tmp": "?", "notes.txt": "?"}, point
            (new / "meta.pt").write_text("next")
            replace_directory(new, next_save / "last.ckpt")
        assert _sharded_contents(next_save) == {"last.ckpt": "next", "notes.txt": "?"}, point


def test_a_live_writers_swap_is_left_alone_and_earlier_leftovers_go_when_idle(tmp_path, monkeypatch):
    """A previous checkpoint moved aside by a live process (this one) stays, target or not; one named by another
    host, or by an earlier tandem (no writer in its name), is settled once it has been aside for two minutes."""
    live = tmp_path / f".last.ckpt.{temporaries._writer_host()}-{os.getpid()}-0123abcd.old"
    foreign = tmp_path / ".best.ckpt.othernode-11-0123abcd.old"
    unnamed = tmp_path / ".epoch=0.ckpt.1a2b3c4d.old"  # as earlier versions named it
    for old in (live, foreign, unnamed):
        old.mkdir()
        (old / "meta.pt").write_text("old")
    (tmp_path / "epoch=0.ckpt").mkdir()  # its replacement arrived: the unnamed one is debris
    assert remove_stale_temporaries_in(tmp_path) == []  # aside for less than two minutes: maybe still swapping
    monkeypatch.setattr(temporaries, "_FOREIGN_IDLE_S", 0.0)
    assert sorted(remove_stale_temporaries_in(tmp_path)) == sorted([foreign.name, unnamed.name])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["best.ckpt", "epoch=0.ckpt", live.name])
    assert (tmp_path / "best.ckpt" / "meta.pt").read_text() == "old"  # no best.ckpt was there: put back


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_files_get_the_mode_open_gives(tmp_path, umask):
    """Checkpoints, hparams.yaml and metrics.csv: 0o666 less the umask, like open() and torch.save(obj, path)."""
    previous = os.umask(umask)
    try:
        trainer = quiet_trainer(
            max_epochs=1,
            logger=CSVLogger(tmp_path),
            callbacks=[ModelCheckpoint(save_last=True, save_top_k=0)],  # last.ckpt
            default_root_dir=tmp_path,
            log_every_n_steps=1,  # rows for metrics.csv
        )
        trainer.fit(TinyModule(), loader())
        plain = tmp_path / "plain.pt"
        torch.save({}, plain)
    finally:
        os.umask(previous)
    log_dir = Path(trainer.log_dir)
    files = [log_dir / "checkpoints" / "last.ckpt", log_dir / "hparams.yaml", log_dir / "metrics.csv"]
    for path in [*files, plain]:
        assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~umask), path


class _FullDisk:
    """A file whose writes fail once ``room`` bytes are used, as writes to a full disk do."""

    def __init__(self, f, room: int) -> None:
        self._f, self._room = f, room

    def write(self, data) -> int:
        if len(data) > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= len(data)
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self._f.close()


def test_a_full_disk_is_reported_naming_the_file_and_the_cause(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    atomic_save({CHECKPOINT_MARKER: "x", "value": 1}, path)
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen", lambda fd, mode: _FullDisk(real_fdopen(fd, mode), room=20_000))
    with pytest.raises(FileWriteError) as caught:
        atomic_save({CHECKPOINT_MARKER: "x", "value": 2, "big": torch.randn(100_000)}, path)
    monkeypatch.undo()
    message = str(caught.value)
    assert f"Could not write checkpoint {str(path)!r}: No space left on device (ENOSPC)." in message
    assert "The previous file at that path is intact. Free space on that disk" in message
    assert "unexpected pos" not in message and caught.value.errno == errno.ENOSPC
    assert caught.value.__suppress_context__  # torch's own "unexpected pos" text is not printed
    assert load_checkpoint_file(path)["value"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_folder_without_write_permission_is_named(tmp_path):
    """Checked by creating a file (permissions, ACLs and read-only mounts alike). root may write anywhere, so
    under root the check runs in a child process that became the user nobody."""
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    target = locked / "run" / "checkpoints"
    if os.geteuid() != 0:
        with pytest.raises(FileWriteError, match=r"Permission denied \(EACCES\)\. Make the folder writable"):
            check_writable_folder(target)
        return
    read, write = os.pipe()
    pid = os.fork()  # the check, as the user nobody (nothing is exec'd: the venv may be root's alone)
    if pid == 0:
        os.close(read)
        try:
            os.setgid(65534)
            os.setuid(65534)
            check_writable_folder(target)
            message = "no error"
        except BaseException as err:
            message = f"{type(err).__name__}: {err}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    os.waitpid(pid, 0)
    assert message.startswith(f"FileWriteError: Could not write {str(target)!r}: Permission denied (EACCES)."), message
    assert "Make the folder writable for this user, or write somewhere else" in message


# ---------------------------------------------------------------------------------------------- checksum


def _flip_a_byte_of(path: Path, tensor: torch.Tensor) -> None:
    data = bytearray(path.read_bytes())
    at = data.find(tensor.numpy().tobytes()[:64])
    assert at > 0
    data[at + 40] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_byte_in_tensor_data_fails_to_load_and_names_the_previous_checkpoint(tmp_path):
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(TinyModule(), loader())
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    damaged = tmp_path / "epoch=0-step=4.ckpt"
    trainer.save_checkpoint(damaged)
    stored = torch.load(damaged)  # torch's default weights_only=True reads the checksum too
    assert set(stored[CHECKSUM_KEY]["crc32"]) == {repr(k) for k in stored if k != CHECKSUM_KEY}

    _flip_a_byte_of(damaged, stored["state_dict"]["net.0.weight"])
    torch.load(damaged)  # torch itself notices nothing
    with pytest.raises(CheckpointError) as err:
        quiet_trainer(max_epochs=2).fit(TinyModule(), loader(), ckpt_path=damaged)
    assert str(err.value) == (
        f"Checkpoint {str(damaged)!r} is damaged: its 'state_dict' entry does not match the checksum stored when "
        "it was written; a byte changed on the disk or in a copy. Do not resume from it; use the previous "
        f"checkpoint in {str(tmp_path)!r}: 'last.ckpt'. (If you changed the file on purpose and saved it again "
        "with torch.save, delete its 'tandem_checksum' entry first.)"
    )
    load_checkpoint_file(tmp_path / "last.ckpt")  # the other one is fine


def test_checkpoints_stay_plain_torch_files_and_old_or_edited_ones_load(tmp_path):
    path = tmp_path / "weights.ckpt"
    atomic_save({CHECKPOINT_MARKER: "0.1", "state_dict": TinyModule().state_dict(), "extra": 1}, path)
    loaded = torch.load(path)  # torch's default weights_only=True: the checksum is plain strs in a dict
    assert loaded[CHECKSUM_KEY] == checkpoint_format.checksum(loaded)
    old = tmp_path / "old.ckpt"  # written before checksums
    torch.save({CHECKPOINT_MARKER: "0.1", "state_dict": loaded["state_dict"]}, old)
    assert CHECKSUM_KEY not in load_checkpoint_file(old)
    del loaded["extra"]  # an entry removed on purpose, the file saved again: the rest is still checked
    torch.save(loaded, path)
    assert set(load_checkpoint_file(path)) == {CHECKPOINT_MARKER, "state_dict", CHECKSUM_KEY}
    loaded["state_dict"] = {k: v + 1 for k, v in loaded["state_dict"].items()}
    torch.save(loaded, path)
    with pytest.raises(CheckpointError, match=r"its 'state_dict' entry does not match"):
        load_checkpoint_file(path)
    loaded["weights"] = loaded.pop("state_dict")  # a name changed (as a damaged byte in it would)
    torch.save(loaded, path)
    with pytest.raises(CheckpointError, match=r"its 'weights' entry does not match"):
        load_checkpoint_file(path)


def test_the_checksum_covers_tensors_values_and_keys_but_not_process_details():
    def crc(**changes):
        w = torch.arange(6.0).reshape(3, 2).t().contiguous()
        base = {CHECKPOINT_MARKER: "x", "w": w, "epoch": 3, "lr": 0.1, "set": {"a"}}
        return checkpoint_format.checksum({**base, **changes})["crc32"]

    value = crc()
    assert crc(**{CHECKSUM_KEY: {"crc32": {}}}) == value  # its own entry is left out
    transposed = torch.arange(6.0).reshape(3, 2).t()
    assert not transposed.is_contiguous() and crc(w=transposed) == value  # the values count, not the layout
    assert crc(set={"b", "a"}) == crc(set={"a", "b"}) and crc(set={"a"}) == value
    assert crc(other=object())["'other'"] == crc(other=object())["'other'"]  # other objects: by type
    for changed in ({"w": transposed.reshape(3, 2)}, {"w": transposed.double()}, {"epoch": 4}):
        differ = [name for name, v in crc(**changed).items() if value[name] != v]
        assert differ == [repr(next(iter(changed)))], changed
    assert crc(set={"b"})["'set'"] != value["'set'"] and crc(lr=0.2)["'lr'"] != value["'lr'"]


# ---------------------------------------------------------------------------------------------- ckpt_path


def test_a_folder_as_ckpt_path_is_named_a_folder_and_the_file_inside_suggested(tmp_path):
    run = tmp_path / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(CheckpointError, match=r"'.*version_0' is a folder, not a checkpoint file, and holds no"):
        load_checkpoint_file(run)
    for name in ("epoch=0-step=4.ckpt", "last.ckpt", "epoch=1-step=8.ckpt"):
        atomic_save({CHECKPOINT_MARKER: "x"}, run / "checkpoints" / name)
    for given in (run, run / "checkpoints"):
        with pytest.raises(CheckpointError) as err:
            quiet_trainer(max_epochs=1).fit(TinyModule(), loader(), ckpt_path=given)
        suggestion = str(run / "checkpoints" / "last.ckpt")
        assert str(err.value) == (
            f"ckpt_path {str(given)!r} is a folder, not a checkpoint file. Pass the file inside it: "
            f"ckpt_path={suggestion!r}."
        )


# ---------------------------------------------------------------------- plain torch.load(path) reads every checkpoint
class Color(enum.Enum):
    RED = 1


Point = collections.namedtuple("Point", "x y")


def test_values_torch_refuses_are_written_as_plain_data_and_come_back(tmp_path):
    odd = {
        "path": pathlib.Path("/data/train"),
        "color": Color.RED,
        "numpy": np.float64(0.5),
        "array": np.arange(3),
        "namespace": argparse.Namespace(lr=0.1),
        "by_tuple": {(1, "a"): [1.5, None, {"deep": Color.RED}]},
        "by_enum": {Color.RED: 1},  # a key torch refuses: the dict is written as its items
        "frozen": frozenset({1, 2}),
        "when": datetime.timedelta(hours=1, microseconds=5),
        "tagged": {"__tandem_value__": "path", "cls": "PosixPath", "path": "/mine"},  # a user's dict, kept as is
        "plain": {"lr": 0.1, "betas": (0.9, 0.99), "names": {"a", "b"}, "t": torch.ones(2), "dtype": torch.float16},
    }
    path = tmp_path / "c.ckpt"
    atomic_save(to_plain({CHECKPOINT_MARKER: "x", "hparams": odd}), path)
    raw = torch.load(path)  # torch's default: weights_only=True
    assert raw["hparams"]["plain"]["betas"] == (0.9, 0.99)  # safe values are stored as they are
    assert raw["hparams"]["path"] == {"__tandem_value__": "path", "cls": "PosixPath", "path": "/data/train"}
    back = load_checkpoint_file(path)["hparams"]
    assert back["path"] == odd["path"] and back["color"] is Color.RED
    assert back["numpy"] == 0.5 and type(back["numpy"]) is np.float64 and back["array"].tolist() == [0, 1, 2]
    assert back["namespace"] == odd["namespace"] and back["by_enum"] == {Color.RED: 1}
    assert back["by_tuple"] == {(1, "a"): [1.5, None, {"deep": Color.RED}]}
    assert back["frozen"] == frozenset({1, 2}) and back["when"] == odd["when"] and back["tagged"] == odd["tagged"]
    assert back["plain"]["names"] == {"a", "b"} and back["plain"]["dtype"] is torch.float16


def test_a_hyperparameter_that_is_no_plain_data_is_left_out_with_a_warning_naming_the_fix():
    hparams = {"layer": nn.Linear(2, 2), "lr": 0.1, "p": Point(1, 2)}
    warned: set = set()  # the Trainer keeps one per fit
    with pytest.warns(UserWarning) as caught:
        plain = to_plain({CHECKPOINT_MARKER: "x", "hparams": hparams}, warned)
    assert plain["hparams"] == {"lr": 0.1}  # the namedtuple is no plain tuple either: left out
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and "'p' (tests.utilities.test_checkpoint_io.Point) is left out" in messages[1]
    assert re.search(
        r"'layer' \(torch.nn.modules.linear.Linear\) is left out of checkpoints.*save_hyperparameters\(ignore="
        r"\['layer'\]\).*load_from_checkpoint\(path, layer=\.\.\.\)",
        messages[0],
    )
    to_plain({CHECKPOINT_MARKER: "x", "hparams": hparams}, warned)  # once per name: no second warning (an error here)


def test_a_value_that_is_no_plain_data_elsewhere_refuses_the_save_naming_where_it_is():
    with pytest.raises(CheckpointError, match=r"checkpoint\['callbacks'\]\['C'\]\['fn'\] holds a builtins.function"):
        to_plain({CHECKPOINT_MARKER: "x", "callbacks": {"C": {"fn": lambda x: x}}})


def test_a_file_torch_did_not_write_is_called_not_a_checkpoint_and_nothing_else(tmp_path):
    """ckpt_path="notes.txt" gets one diagnosis, "not a checkpoint", not "truncated or damaged" first; a checkpoint
    cut short is still called truncated."""
    notes, image = tmp_path / "notes.txt", tmp_path / "plot.png"
    notes.write_text("lr 0.1 was too high\n")
    image.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(200)))
    for path, holds in (
        (notes, "it holds text: 'lr 0.1 was too high'"),
        (image, "it starts with the bytes b'\\x89PNG"),
    ):
        with pytest.raises(CheckpointError) as caught:
            quiet_trainer(max_epochs=1, limit_val_batches=0).fit(TinyModule(), loader(), ckpt_path=path)
        message = str(caught.value)
        assert message.startswith(f"{str(path)!r} is not a checkpoint: torch.save did not write it ({holds}"), message
        assert "truncated" not in message and "damaged" not in message and "could not be read" not in message
    whole, cut = tmp_path / "whole.ckpt", tmp_path / "cut.ckpt"
    atomic_save({CHECKPOINT_MARKER: "x", "w": torch.zeros(1000)}, whole)
    cut.write_bytes(whole.read_bytes()[:500])
    with pytest.raises(CheckpointError, match=r"cut.ckpt' could not be read .*The file is truncated"):
        load_checkpoint_file(cut)


def test_a_state_dict_or_lightning_file_gets_a_load_recipe_that_works(tmp_path):
    bare = tmp_path / "bare.pt"
    torch.save(nn.Linear(2, 2).state_dict(), bare)
    with pytest.raises(CheckpointError, match=r"bare weights .*module.load_state_dict\(torch.load\(path\)\)"):
        load_checkpoint_file(bare)
    nn.Linear(2, 2).load_state_dict(torch.load(bare))  # the recipe works

    lightning = tmp_path / "lightning.ckpt"
    torch.save(
        {"state_dict": nn.Linear(2, 2).state_dict(), "pytorch-lightning_version": "2.6.0", "x": Color.RED}, lightning
    )
    with pytest.raises(
        CheckpointError,
        match=r"holds objects of tests.utilities.test_checkpoint_io.Color\. .*"
        r"weights_only=False",
    ):
        load_checkpoint_file(lightning)  # read weights-only first: the enum is refused before anything else
    with pytest.raises(CheckpointError, match=r"torch.load\(path, weights_only=False\)\['state_dict'\]"):
        load_checkpoint_file(lightning, weights_only=False)  # trusted: named a foreign file, with the recipe
    nn.Linear(2, 2).load_state_dict(torch.load(lightning, weights_only=False)["state_dict"])


def test_the_sweep_never_opens_waits_on_or_removes_what_is_no_temporary_of_its_own(tmp_path):
    """Named like a dead writer's temporaries: a FIFO (opening it would block every save into the folder), a
    symlink (to a file elsewhere), and a file of another user. The save completes, and all three stay."""
    dead = _dead_pid()
    name = lambda kind: tmp_path / f".last.ckpt.{temporaries._writer_host()}-{dead}-{kind}.tmp"  # noqa: E731
    fifo, link, theirs = name("0000f1f0"), name("0000111c"), name("0000aaaa")
    os.mkfifo(fifo)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not tandem's")
    link.symlink_to(elsewhere / "keep.txt")
    theirs.write_text("another user's")
    if os.getuid() == 0:  # CI runs as root, who may give a file away; another user cannot
        os.chown(theirs, 65534, 65534)
    saved = threading.Thread(target=atomic_save, args=({"x": 1}, tmp_path / "last.ckpt"), daemon=True)
    saved.start()
    saved.join(30)
    assert not saved.is_alive(), "the save blocked on the FIFO"
    assert torch.load(tmp_path / "last.ckpt") == {"x": 1}
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()
    assert theirs.exists() is (os.getuid() == 0)  # another user's stays; one's own dead temporary goes
    assert (elsewhere / "keep.txt").read_text() == "not tandem's"


def _dead_pid() -> int:
    """The pid of a process that has ended (its number is not reused this soon)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid
