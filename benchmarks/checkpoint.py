"""What the checkpoint checksum costs: saving and loading a large checkpoint with and without it.

A checkpoint of ``--size-mb`` MB of float32 tensors (a state_dict of 100 tensors, plus the small entries
a tandem checkpoint has) is saved and loaded through tandem's own functions, alternating with and without
the checksum, ``--repeats`` times; the medians are compared. Saving with the checksum is
``atomic_save`` (CRC32 of the contents, then ``torch.save`` to a temporary file, fsync, rename); without,
the same atomic write of the same dict with no checksum. Loading with the checksum is
``load_checkpoint_file`` (``torch.load`` then the CRC32 check); without, ``torch.load`` alone. Also shown:
the checksum alone (CRC32 of 16 MB pieces on up to 8 threads), and other hashes of the same bytes on one
thread (why CRC32). Target: the checksum adds at most 25% to a save (saves are frequent; a load happens once
per resume, and its cost is shown in seconds and GB/s).

    python benchmarks/checkpoint.py                  # 500 MB, 5 of each
    python benchmarks/checkpoint.py --size-mb 100 --repeats 3 --dir /mnt/shared
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

from tandem.utilities.atomic import atomic_write
from tandem.utilities.checkpoint import CHECKPOINT_MARKER, atomic_save, load_checkpoint_file
from tandem.utilities.checkpoint_format import CHECKSUM_KEY, checksum

TARGET = 0.25


def _checkpoint(size_mb: int) -> dict:
    per_tensor = size_mb * 2**20 // 4 // 100
    generator = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(per_tensor, generator=generator) for i in range(100)}
    return {CHECKPOINT_MARKER: "bench", "epoch": 3, "global_step": 1000, "state_dict": state, "hparams": {"lr": 0.1}}


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=500, help="MB of tensors in the checkpoint")
    parser.add_argument("--repeats", type=int, default=5, help="saves and loads of each kind")
    parser.add_argument("--dir", default=None, help="folder to write in (default: the system's temporary folder)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the save target is missed")
    args = parser.parse_args()
    torch.set_num_threads(1)

    checkpoint = _checkpoint(args.size_mb)
    size = sum(t.numel() * t.element_size() for t in checkpoint["state_dict"].values()) / 2**20
    print(f"checkpoint: {size:.0f} MB in {len(checkpoint['state_dict'])} tensors; torch {torch.__version__}")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        with_sum, without_sum = Path(folder, "with.ckpt"), Path(folder, "without.ckpt")
        for i in range(args.repeats):
            first_with = i % 2 == 0  # alternate which goes first: the disk and the caches favour neither
            for with_checksum in (first_with, not first_with):
                if with_checksum:
                    save_with = _timed(lambda: atomic_save(checkpoint, with_sum))
                    load_with = _timed(lambda: load_checkpoint_file(with_sum))
                else:
                    save_without = _timed(lambda: atomic_write(without_sum, lambda f: torch.save(checkpoint, f)))
                    load_without = _timed(lambda: torch.load(without_sum, map_location="cpu", weights_only=False))
            alone = _timed(lambda: checksum(checkpoint))
            rows.append((save_without, save_with, load_without, load_with, alone))
        assert CHECKSUM_KEY in torch.load(with_sum, weights_only=False)

    print("\n| run | save s | save + checksum s | load s | load + check s | checksum alone s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for i, row in enumerate(rows):
        print(f"| {i} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    medians = [statistics.median(column) for column in zip(*rows)]
    print("| **median** | " + " | ".join(f"**{v:.3f}**" for v in medians) + " |")
    save_cost = medians[1] / medians[0] - 1
    load_cost = medians[3] / medians[2] - 1
    print(f"\nwith / without: save {save_cost:+.0%} (target <= +{TARGET:.0%}), load {load_cost:+.0%}")
    print(
        f"the checksum alone: {medians[4]:.3f} s = {medians[4] / medians[0]:.0%} of a save, "
        f"{medians[4] / medians[2]:.0%} of a load ({size / 1024 / medians[4]:.1f} GB/s)"
    )

    data = torch.cat(list(checkpoint["state_dict"].values())).view(torch.uint8).numpy()
    hashes = {
        "zlib.crc32 (used)": lambda: zlib.crc32(data),
        "zlib.adler32": lambda: zlib.adler32(data),
        "hashlib.sha1": lambda: hashlib.sha1(data).digest(),
        "hashlib.sha256": lambda: hashlib.sha256(data).digest(),
        "hashlib.blake2b": lambda: hashlib.blake2b(data, digest_size=16).digest(),
    }
    print(f"\nother hashes of the same {size:.0f} MB (median of 3):")
    for name, fn in hashes.items():
        seconds = statistics.median(_timed(fn) for _ in range(3))
        print(f"  {name:<18} {seconds:.3f} s  ({size / 1024 / seconds:.1f} GB/s)")
    if args.check and save_cost > TARGET:
        sys.exit(1)


if __name__ == "__main__":
    main()
