"""A run killed in the middle of its second checkpoint save, for the tests of what a later save and a resume
remove.

usage: killed_save.py ROOT {file,sharded,async,swap}

Two epochs under the default layout (ROOT/tandem_logs/version_0/checkpoints/, one checkpoint an epoch):
``file`` on one device, ``sharded`` under FSDPStrategy(state_dict_type="sharded") on one process, ``async`` as
``file`` with plugins=[AsyncCheckpointIO()] (the second file is written in the background thread, and the
training goes on until the next save waits for it). The second save writes its whole temporary (the file's bytes, or every shard), prints "writing" and waits for the test's
SIGKILL, so the temporary is left exactly as a writer killed mid-save leaves it. ``swap``: as ``sharded``, but the
second save writes every shard and stops in the middle of replacing last.ckpt, after renaming the previous one
aside and before renaming the new one onto it.
"""

import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: helpers
import tandem  # noqa: E402
from helpers import TinyModule, loader  # noqa: E402
from tandem.callbacks import ModelCheckpoint  # noqa: E402
from tandem.strategies import AsyncCheckpointIO, FSDPStrategy  # noqa: E402
from tandem.strategies.environments.machine import find_free_port  # noqa: E402
from tandem.utilities import atomic  # noqa: E402
from tandem.utilities.checkpoint import CHECKPOINT_MARKER  # noqa: E402


def stalling_swap(steps):
    """The swap of a sharded checkpoint onto its target, waiting to be killed once it moved the previous one aside."""

    def wrapper(source, target):
        for step in steps(source, target):
            yield step
            if step == "moved aside":
                print("writing", flush=True)
                time.sleep(300)

    return wrapper


def stalling(save):
    """``save`` that, the second time it writes a checkpoint, waits to be killed once it has written."""
    calls = [0]

    def wrapper(obj, *args, **kwargs):
        result = save(obj, *args, **kwargs)
        calls[0] += 1
        if calls[0] == 2:
            for f in args[:1]:
                if hasattr(f, "flush"):
                    f.flush()
            background = threading.current_thread() is not threading.main_thread()
            print("writing" if background == BACKGROUND else f"writing, background={background}", flush=True)
            time.sleep(300)
        return result

    return wrapper


BACKGROUND = len(sys.argv) > 2 and sys.argv[2] == "async"

if __name__ == "__main__":
    root, kind = sys.argv[1], sys.argv[2]
    if kind in ("file", "async"):
        real_save = torch.save
        stall = stalling(real_save)
        torch.save = lambda obj, *a, **k: (stall if isinstance(obj, dict) and CHECKPOINT_MARKER in obj else real_save)(
            obj, *a, **k
        )
        strategy = "single_device"
    else:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(find_free_port()))
        if kind == "swap":
            atomic._swap_steps = stalling_swap(atomic._swap_steps)
        else:
            dcp.save = stalling(dcp.save)
        strategy = FSDPStrategy(state_dict_type="sharded")
    trainer = tandem.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        default_root_dir=root,
        # last.ckpt at each epoch's end (4 batches an epoch); a step save point writes it without a top-k file
        callbacks=[ModelCheckpoint(save_last=True, save_top_k=0, every_n_train_steps=4)],
        plugins=[AsyncCheckpointIO()] if kind == "async" else None,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyModule(), loader())
    sys.exit("the second save was not stalled")
