"""Reading an offline W&B run back from its ``.wandb`` file (no network, no W&B server)."""

from __future__ import annotations

import glob
import json
import os
import struct

import wandb
from wandb.proto import wandb_internal_pb2


def finish(logger) -> None:
    """Finish the run and stop W&B's service process: only then is everything in the ``.wandb`` file (finish
    alone returns before the service wrote the last records)."""
    logger.experiment.finish()
    wandb.teardown()


def run_records(save_dir) -> dict[str, list]:
    """The records of the one offline run under ``save_dir``, by kind ("history", "config", "artifact", ...).

    The ``.wandb`` file is W&B's LevelDB-style log: a 7-byte header (":W&B", magic, version), then 32 KiB
    blocks of chunks, each with a 7-byte header (checksum, length, type: 1 whole, 2 first, 3 middle, 4 last)."""
    (path,) = glob.glob(os.path.join(str(save_dir), "wandb", "offline-run-*", "run-*.wandb"))
    with open(path, "rb") as file:
        data = file.read()
    assert data[:4] == b":W&B"
    block, position, parts, found = 32768, 7, [], {}
    while position + 7 <= len(data):
        room = block - position % block
        if room < 7:  # a block's tail too short for a chunk header is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        parts.append(data[position + 7 : position + 7 + length])
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record.FromString(b"".join(parts))
            parts = []
            found.setdefault(record.WhichOneof("record_type"), []).append(record)
    return found


def history(records) -> list[dict]:
    """One dict per logged row; a media value (table, images) is a dict of its fields."""
    rows = []
    for record in records["history"]:
        row: dict = {}
        for item in record.history.item:
            *outer, last = item.nested_key or [item.key]
            place = row
            for name in outer:
                place = place.setdefault(name, {})
            place[last] = json.loads(item.value_json)
        rows.append(row)
    return rows


def config(records) -> dict:
    return {item.key: json.loads(item.value_json) for r in records.get("config", []) for item in r.config.update}
