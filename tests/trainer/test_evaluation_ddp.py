"""Issue 42's evaluation under ``strategy="ddp", devices=2`` against Lightning 2.6.6: BatchNorm statistics in the
validation of a fit (every rank validates with rank 0's, as Lightning's DDP wrapper broadcasts them), and a
``shuffle=True`` evaluation loader sharded in Lightning's shuffled order (seed plus the epoch in progress). tandem's
side runs in the shared launch (``conftest.py``'s ``core_ddp``, scenario ``evaluation``)."""

from __future__ import annotations

from typing import Any

# What Lightning 2.6.6 (torch 2.13.0 CPU) gives the programs of scripts/eval_ddp_programs.py, one entry per rank;
# recorded with
#   cd /tmp && OMP_NUM_THREADS=1 /root/lightning_suite_work/lvenv/bin/python \
#       tests/trainer/scripts/eval_ddp_programs.py --framework lightning --out /tmp/ev.json
#   python tests/trainer/scripts/eval_ddp_programs.py --format /tmp/ev.json
# (the lvenv: lightning==2.6.6). tandem before issue 42 gave val_loss [1.112460732460022, 1.119316577911377,
# 1.128139615058899] (rank 1 validating with its own statistics) and sharded the shuffled loaders in dataset order.
LIGHTNING: list[dict[str, Any]] = [
    {
        "batchnorm": {"val_loss": [1.112460732460022, 1.1228432655334473, 1.13131582736969]},
        "shuffled_test": {
            "acc": 0.40625,
            "indices": [
                42,
                49,
                44,
                38,
                13,
                62,
                17,
                11,
                55,
                4,
                18,
                16,
                56,
                27,
                21,
                0,
                1,
                43,
                2,
                48,
                53,
                3,
                58,
                10,
                36,
                34,
                40,
                26,
                47,
                46,
                32,
                54,
            ],
        },
        "shuffled_val": {
            "passes": [
                [3, 11, 6, 8],
                [3, 11, 6, 8, 4, 2, 15, 14],
                [10, 15, 14, 3, 8, 9, 11, 6],
                [15, 0, 11, 13, 3, 14, 4, 10],
            ]
        },
    },
    {
        "batchnorm": {"val_loss": [1.112460732460022, 1.1228432655334473, 1.13131582736969]},
        "shuffled_test": {
            "acc": 0.28125,
            "indices": [
                60,
                6,
                7,
                15,
                28,
                50,
                33,
                12,
                9,
                63,
                14,
                29,
                51,
                25,
                59,
                24,
                35,
                45,
                20,
                22,
                52,
                61,
                31,
                5,
                39,
                37,
                30,
                23,
                19,
                8,
                57,
                41,
            ],
        },
        "shuffled_val": {
            "passes": [
                [10, 7, 13, 9],
                [10, 7, 13, 9, 5, 1, 12, 0],
                [7, 13, 0, 5, 2, 1, 12, 4],
                [8, 7, 2, 12, 1, 9, 6, 5],
            ]
        },
    },
]


def test_validation_in_a_fit_uses_rank_zeros_batchnorm_statistics_as_lightning(core_ddp):
    for rank in (0, 1):
        assert core_ddp["evaluation"][rank]["batchnorm"] == LIGHTNING[rank]["batchnorm"]  # bit for bit


def test_a_shuffled_test_loader_is_sharded_in_lightnings_order(core_ddp):
    for rank in (0, 1):
        assert core_ddp["evaluation"][rank]["shuffled_test"] == LIGHTNING[rank]["shuffled_test"]


def test_a_shuffled_validation_loader_draws_each_epochs_order(core_ddp):
    for rank in (0, 1):
        assert core_ddp["evaluation"][rank]["shuffled_val"] == LIGHTNING[rank]["shuffled_val"]
