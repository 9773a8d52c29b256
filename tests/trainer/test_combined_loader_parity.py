"""Issue 43's "done when": a ported multi-loader program (``scripts/combined_parity_programs.py``: a dict of two
shuffled training loaders of different lengths, dropout, a validation loader, a scheduler stepped every batch),
written once for both frameworks, trains under tandem in each ``CombinedLoader`` mode with the batches, the epoch
length and the numbers Lightning 2.6.6 gives it, on one process and under two-process ``ddp`` (CPU, gloo); and under
``ddp`` a mid-epoch checkpoint of it resumes exactly. Lightning is never imported here: its numbers are the constants
below.

One process: each mode runs in this process. DDP: the ``combined_parity`` scenario of the trainer tests' shared launch
(``core_ddp``; ``run_all("tandem", 2, ...)``, as the script's ``--framework tandem --devices 2``) plays every mode and
the resume on two ranks; each rank's values are compared with that rank's under Lightning.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from helpers import lightning_by_rank, lightning_differences

SCRIPT = Path(__file__).parent / "scripts" / "combined_parity_programs.py"

# What Lightning 2.6.6 (torch 2.13.0 CPU) gives the program in each mode; recorded with
#   cd /tmp && OMP_NUM_THREADS=1 /root/lightning_suite_work/lvenv/bin/python \
#       /work/main/tests/trainer/scripts/combined_parity_programs.py --framework lightning --devices 1 --out /tmp/l1.json
#   cd /tmp && OMP_NUM_THREADS=1 /root/lightning_suite_work/lvenv/bin/python \
#       /work/main/tests/trainer/scripts/combined_parity_programs.py --framework lightning --devices 2 --out /tmp/l2.json
#   /root/lightning_suite_work/lvenv/bin/python /work/main/tests/trainer/scripts/combined_parity_programs.py \
#       --format /tmp/l1.json /tmp/l2.json
# (a venv with lightning==2.6.6; the last command prints the constants below; two runs gave identical files).
# Keys: those of test_lightning_parity.py (train_end<e>/..., val<n>/..., final/..., w/<param>/sum, sq), and
# train_batches (the epoch length) and ids<e>/<key> (the order each loader's samples came in). Under two devices the
# values are rank 0's, and rank1/<key> is rank 1's where it differs. BATCHES: each epoch's steps, each key of the
# batch with its batch size ("-": None), the same on both ranks. Tandem's values match bit for bit, except under two
# devices val_loss (logged with sync_dist: tandem reduces the ranks' sums and counts, Lightning averages their means;
# equal here but for rounding, 1.2e-7), hence test_lightning_parity.py's tolerance.
LIGHTNING: dict[tuple[str, int], dict[str, float]] = {
    ("max_size_cycle", 1): {
        "val0/epoch": 0.0,
        "val0/sanity_checking": 1.0,
        "val0/val_loss": 1.6682980060577393,
        "val0/global_step": 0.0,
        "val0/lr0": 0.05,
        "val1/epoch": 0.0,
        "val1/sanity_checking": 0.0,
        "val1/loss_a": 0.6048111319541931,
        "val1/loss_b": 0.15664497017860413,
        "val1/train_loss": 0.7614561319351196,
        "val1/train_loss_step": 0.7614561319351196,
        "val1/val_loss": 1.5484129190444946,
        "val1/global_step": 10.0,
        "val1/lr0": 0.024499999999999997,
        "train_end0/loss_a": 0.6048111319541931,
        "train_end0/loss_b": 0.15664497017860413,
        "train_end0/train_loss": 2.7887661457061768,
        "train_end0/train_loss_step": 0.7614561319351196,
        "train_end0/val_loss": 1.5484129190444946,
        "train_end0/train_loss_epoch": 2.7887661457061768,
        "train_end0/global_step": 10.0,
        "train_end0/lr0": 0.024499999999999997,
        "val2/epoch": 1.0,
        "val2/sanity_checking": 0.0,
        "val2/loss_a": 0.7984859347343445,
        "val2/loss_b": 0.8955779075622559,
        "val2/train_loss": 1.6940639019012451,
        "val2/train_loss_step": 1.6940639019012451,
        "val2/val_loss": 1.8227894306182861,
        "val2/train_loss_epoch": 2.7887661457061768,
        "val2/global_step": 20.0,
        "val2/lr0": 0.008403499999999998,
        "train_end1/loss_a": 0.7984859347343445,
        "train_end1/loss_b": 0.8955779075622559,
        "train_end1/train_loss": 2.5490691661834717,
        "train_end1/train_loss_step": 1.6940639019012451,
        "train_end1/val_loss": 1.8227894306182861,
        "train_end1/train_loss_epoch": 2.5490691661834717,
        "train_end1/global_step": 20.0,
        "train_end1/lr0": 0.008403499999999998,
        "final/global_step": 20.0,
        "final/lr0": 0.008403499999999998,
        "w/trunk.0.weight/sum": 1.5626977551728487,
        "w/trunk.0.weight/sq": 4.0331686199035195,
        "w/trunk.0.bias/sum": -3.3228557258844376,
        "w/trunk.0.bias/sq": 1.543689462354618,
        "w/heads.a.weight/sum": -0.5534385005012155,
        "w/heads.a.weight/sq": 1.1478127129405256,
        "w/heads.a.bias/sum": 0.24202360212802887,
        "w/heads.a.bias/sq": 0.05857542398702642,
        "w/heads.b.weight/sum": -0.6518872771412134,
        "w/heads.b.weight/sq": 0.4281941963061687,
        "w/heads.b.bias/sum": -0.1279379278421402,
        "w/heads.b.bias/sq": 0.016368113380540672,
        "train_batches": 10.0,
        "ids0/a": 2008.0,
        "ids0/b": 23928.0,
        "ids1/a": 1970.0,
        "ids1/b": 23985.0,
    },
    ("max_size_cycle", 2): {
        "val0/epoch": 0.0,
        "val0/sanity_checking": 1.0,
        "val0/val_loss": 1.3962218761444092,
        "val0/global_step": 0.0,
        "val0/lr0": 0.05,
        "val1/epoch": 0.0,
        "val1/sanity_checking": 0.0,
        "val1/loss_a": 1.230371356010437,
        "val1/loss_b": 1.1687358617782593,
        "val1/train_loss": 2.3991072177886963,
        "val1/train_loss_step": 2.3991072177886963,
        "val1/val_loss": 1.601892113685608,
        "val1/global_step": 5.0,
        "val1/lr0": 0.034999999999999996,
        "train_end0/loss_a": 1.230371356010437,
        "train_end0/loss_b": 1.1687358617782593,
        "train_end0/train_loss": 1.9240587949752808,
        "train_end0/train_loss_step": 2.3991072177886963,
        "train_end0/val_loss": 1.601892113685608,
        "train_end0/train_loss_epoch": 1.9240587949752808,
        "train_end0/global_step": 5.0,
        "train_end0/lr0": 0.034999999999999996,
        "val2/epoch": 1.0,
        "val2/sanity_checking": 0.0,
        "val2/loss_a": 2.9087979793548584,
        "val2/loss_b": 1.8964247703552246,
        "val2/train_loss": 4.805222511291504,
        "val2/train_loss_step": 4.805222511291504,
        "val2/val_loss": 1.7440807819366455,
        "val2/train_loss_epoch": 1.9240587949752808,
        "val2/global_step": 10.0,
        "val2/lr0": 0.024499999999999997,
        "train_end1/loss_a": 2.9087979793548584,
        "train_end1/loss_b": 1.8964247703552246,
        "train_end1/train_loss": 2.433300495147705,
        "train_end1/train_loss_step": 4.805222511291504,
        "train_end1/val_loss": 1.7440807819366455,
        "train_end1/train_loss_epoch": 2.433300495147705,
        "train_end1/global_step": 10.0,
        "train_end1/lr0": 0.024499999999999997,
        "final/global_step": 10.0,
        "final/lr0": 0.024499999999999997,
        "w/trunk.0.weight/sum": 2.5724595978826983,
        "w/trunk.0.weight/sq": 4.77395698513143,
        "w/trunk.0.bias/sum": -0.7602377533912659,
        "w/trunk.0.bias/sq": 1.7116981105829239,
        "w/heads.a.weight/sum": -0.5689367251470685,
        "w/heads.a.weight/sq": 0.5217872967408659,
        "w/heads.a.bias/sum": 0.47181692719459534,
        "w/heads.a.bias/sq": 0.22261121278735008,
        "w/heads.b.weight/sum": -0.2385437298216857,
        "w/heads.b.weight/sq": 0.288172987488067,
        "w/heads.b.bias/sum": -0.08587222546339035,
        "w/heads.b.bias/sq": 0.007374039106035346,
        "train_batches": 5.0,
        "ids0/a": 587.0,
        "ids0/b": 6566.0,
        "ids1/a": 581.0,
        "ids1/b": 6454.0,
        "rank1/val1/loss_a": 2.7048587799072266,
        "rank1/val1/loss_b": 0.28941962122917175,
        "rank1/val1/train_loss": 2.9942784309387207,
        "rank1/val1/train_loss_step": 2.9942784309387207,
        "rank1/train_end0/loss_a": 2.7048587799072266,
        "rank1/train_end0/loss_b": 0.28941962122917175,
        "rank1/train_end0/train_loss": 2.8109307289123535,
        "rank1/train_end0/train_loss_step": 2.9942784309387207,
        "rank1/train_end0/train_loss_epoch": 2.8109307289123535,
        "rank1/val2/loss_a": 0.3970402181148529,
        "rank1/val2/loss_b": 1.7581710815429688,
        "rank1/val2/train_loss": 2.1552112102508545,
        "rank1/val2/train_loss_step": 2.1552112102508545,
        "rank1/val2/train_loss_epoch": 2.8109307289123535,
        "rank1/train_end1/loss_a": 0.3970402181148529,
        "rank1/train_end1/loss_b": 1.7581710815429688,
        "rank1/train_end1/train_loss": 1.7708185911178589,
        "rank1/train_end1/train_loss_step": 2.1552112102508545,
        "rank1/train_end1/train_loss_epoch": 1.7708185911178589,
        "rank1/ids0/a": 506.0,
        "rank1/ids0/b": 6328.0,
        "rank1/ids1/a": 639.0,
        "rank1/ids1/b": 6630.0,
    },
    ("min_size", 1): {
        "val0/epoch": 0.0,
        "val0/sanity_checking": 1.0,
        "val0/val_loss": 1.6682980060577393,
        "val0/global_step": 0.0,
        "val0/lr0": 0.05,
        "val1/epoch": 0.0,
        "val1/sanity_checking": 0.0,
        "val1/loss_a": 0.0001838177558965981,
        "val1/loss_b": 2.4534246921539307,
        "val1/train_loss": 2.453608512878418,
        "val1/train_loss_step": 2.453608512878418,
        "val1/val_loss": 2.533466339111328,
        "val1/global_step": 6.0,
        "val1/lr0": 0.034999999999999996,
        "train_end0/loss_a": 0.0001838177558965981,
        "train_end0/loss_b": 2.4534246921539307,
        "train_end0/train_loss": 2.4723384380340576,
        "train_end0/train_loss_step": 2.453608512878418,
        "train_end0/val_loss": 2.533466339111328,
        "train_end0/train_loss_epoch": 2.4723384380340576,
        "train_end0/global_step": 6.0,
        "train_end0/lr0": 0.034999999999999996,
        "val2/epoch": 1.0,
        "val2/sanity_checking": 0.0,
        "val2/loss_a": 2.3797545433044434,
        "val2/loss_b": 1.1998581886291504,
        "val2/train_loss": 3.5796127319335938,
        "val2/train_loss_step": 3.5796127319335938,
        "val2/val_loss": 1.3938592672348022,
        "val2/train_loss_epoch": 2.4723384380340576,
        "val2/global_step": 12.0,
        "val2/lr0": 0.01715,
        "train_end1/loss_a": 2.3797545433044434,
        "train_end1/loss_b": 1.1998581886291504,
        "train_end1/train_loss": 2.548557996749878,
        "train_end1/train_loss_step": 3.5796127319335938,
        "train_end1/val_loss": 1.3938592672348022,
        "train_end1/train_loss_epoch": 2.548557996749878,
        "train_end1/global_step": 12.0,
        "train_end1/lr0": 0.01715,
        "final/global_step": 12.0,
        "final/lr0": 0.01715,
        "w/trunk.0.weight/sum": 2.611837991513312,
        "w/trunk.0.weight/sq": 4.548682516938781,
        "w/trunk.0.bias/sum": -2.0598667645826936,
        "w/trunk.0.bias/sq": 1.1680135103807712,
        "w/heads.a.weight/sum": -0.7201904319226742,
        "w/heads.a.weight/sq": 0.6993640708375438,
        "w/heads.a.bias/sum": 0.15261970460414886,
        "w/heads.a.bias/sq": 0.023292774233457658,
        "w/heads.b.weight/sum": -0.36125506716780365,
        "w/heads.b.weight/sq": 0.5697999130830604,
        "w/heads.b.bias/sum": -0.11152347177267075,
        "w/heads.b.bias/sq": 0.012437484756229689,
        "train_batches": 6.0,
        "ids0/a": 664.0,
        "ids0/b": 10045.0,
        "ids1/a": 691.0,
        "ids1/b": 9858.0,
    },
    ("min_size", 2): {
        "val0/epoch": 0.0,
        "val0/sanity_checking": 1.0,
        "val0/val_loss": 1.3962218761444092,
        "val0/global_step": 0.0,
        "val0/lr0": 0.05,
        "val1/epoch": 0.0,
        "val1/sanity_checking": 0.0,
        "val1/loss_a": 0.5777485966682434,
        "val1/loss_b": 2.145983934402466,
        "val1/train_loss": 2.7237324714660645,
        "val1/train_loss_step": 2.7237324714660645,
        "val1/val_loss": 1.4837901592254639,
        "val1/global_step": 3.0,
        "val1/lr0": 0.05,
        "train_end0/loss_a": 0.5777485966682434,
        "train_end0/loss_b": 2.145983934402466,
        "train_end0/train_loss": 1.6270934343338013,
        "train_end0/train_loss_step": 2.7237324714660645,
        "train_end0/val_loss": 1.4837901592254639,
        "train_end0/train_loss_epoch": 1.6270934343338013,
        "train_end0/global_step": 3.0,
        "train_end0/lr0": 0.05,
        "val2/epoch": 1.0,
        "val2/sanity_checking": 0.0,
        "val2/loss_a": 0.9449517130851746,
        "val2/loss_b": 0.7760764360427856,
        "val2/train_loss": 1.7210280895233154,
        "val2/train_loss_step": 1.7210280895233154,
        "val2/val_loss": 1.607147216796875,
        "val2/train_loss_epoch": 1.6270934343338013,
        "val2/global_step": 6.0,
        "val2/lr0": 0.034999999999999996,
        "train_end1/loss_a": 0.9449517130851746,
        "train_end1/loss_b": 0.7760764360427856,
        "train_end1/train_loss": 2.365495443344116,
        "train_end1/train_loss_step": 1.7210280895233154,
        "train_end1/val_loss": 1.607147216796875,
        "train_end1/train_loss_epoch": 2.365495443344116,
        "train_end1/global_step": 6.0,
        "train_end1/lr0": 0.034999999999999996,
        "final/global_step": 6.0,
        "final/lr0": 0.034999999999999996,
        "w/trunk.0.weight/sum": 2.6835453622043133,
        "w/trunk.0.weight/sq": 4.75394252424908,
        "w/trunk.0.bias/sum": -0.583596259355545,
        "w/trunk.0.bias/sq": 1.8266952408609045,
        "w/heads.a.weight/sum": -0.33936911076307297,
        "w/heads.a.weight/sq": 0.2853205122378182,
        "w/heads.a.bias/sum": 0.36251357197761536,
        "w/heads.a.bias/sq": 0.1314160898679697,
        "w/heads.b.weight/sum": -0.29606856498867273,
        "w/heads.b.weight/sq": 0.3794037570739077,
        "w/heads.b.bias/sum": -0.1295488327741623,
        "w/heads.b.bias/sq": 0.016782900073147866,
        "train_batches": 3.0,
        "ids0/a": 232.0,
        "ids0/b": 2886.0,
        "ids1/a": 208.0,
        "ids1/b": 2713.0,
        "rank1/val1/loss_a": 0.6995174288749695,
        "rank1/val1/loss_b": 0.5966395139694214,
        "rank1/val1/train_loss": 1.296156883239746,
        "rank1/val1/train_loss_step": 1.296156883239746,
        "rank1/train_end0/loss_a": 0.6995174288749695,
        "rank1/train_end0/loss_b": 0.5966395139694214,
        "rank1/train_end0/train_loss": 2.917297601699829,
        "rank1/train_end0/train_loss_step": 1.296156883239746,
        "rank1/train_end0/train_loss_epoch": 2.917297601699829,
        "rank1/val2/loss_a": 0.8598822951316833,
        "rank1/val2/loss_b": 0.5591186285018921,
        "rank1/val2/train_loss": 1.4190008640289307,
        "rank1/val2/train_loss_step": 1.4190008640289307,
        "rank1/val2/train_loss_epoch": 2.917297601699829,
        "rank1/train_end1/loss_a": 0.8598822951316833,
        "rank1/train_end1/loss_b": 0.5591186285018921,
        "rank1/train_end1/train_loss": 1.9352562427520752,
        "rank1/train_end1/train_loss_step": 1.4190008640289307,
        "rank1/train_end1/train_loss_epoch": 1.9352562427520752,
        "rank1/ids0/a": 187.0,
        "rank1/ids0/b": 2882.0,
        "rank1/ids1/a": 201.0,
        "rank1/ids1/b": 2754.0,
    },
    ("max_size", 1): {
        "val0/epoch": 0.0,
        "val0/sanity_checking": 1.0,
        "val0/val_loss": 1.6682980060577393,
        "val0/global_step": 0.0,
        "val0/lr0": 0.05,
        "val1/epoch": 0.0,
        "val1/sanity_checking": 0.0,
        "val1/loss_a": 0.0001838177558965981,
        "val1/loss_b": 0.2530253827571869,
        "val1/train_loss": 0.2530253827571869,
        "val1/train_loss_step": 0.2530253827571869,
        "val1/val_loss": 1.5605130195617676,
        "val1/global_step": 10.0,
        "val1/lr0": 0.024499999999999997,
        "train_end0/loss_a": 0.0001838177558965981,
        "train_end0/loss_b": 0.2530253827571869,
        "train_end0/train_loss": 2.318105936050415,
        "train_end0/train_loss_step": 0.2530253827571869,
        "train_end0/val_loss": 1.5605130195617676,
        "train_end0/train_loss_epoch": 2.318105936050415,
        "train_end0/global_step": 10.0,
        "train_end0/lr0": 0.024499999999999997,
        "val2/epoch": 1.0,
        "val2/sanity_checking": 0.0,
        "val2/loss_a": 0.1998932808637619,
        "val2/loss_b": 0.8394914269447327,
        "val2/train_loss": 0.8394914269447327,
        "val2/train_loss_step": 0.8394914269447327,
        "val2/val_loss": 1.533791184425354,
        "val2/train_loss_epoch": 2.318105936050415,
        "val2/global_step": 20.0,
        "val2/lr0": 0.008403499999999998,
        "train_end1/loss_a": 0.1998932808637619,
        "train_end1/loss_b": 0.8394914269447327,
        "train_end1/train_loss": 1.9270917177200317,
        "train_end1/train_loss_step": 0.8394914269447327,
        "train_end1/val_loss": 1.533791184425354,
        "train_end1/train_loss_epoch": 1.9270917177200317,
        "train_end1/global_step": 20.0,
        "train_end1/lr0": 0.008403499999999998,
        "final/global_step": 20.0,
        "final/lr0": 0.008403499999999998,
        "w/trunk.0.weight/sum": 1.9676964953541756,
        "w/trunk.0.weight/sq": 4.362303003692277,
        "w/trunk.0.bias/sum": -3.0335703687742352,
        "w/trunk.0.bias/sq": 1.5066178508508736,
        "w/heads.a.weight/sum": -0.6918634884059429,
        "w/heads.a.weight/sq": 0.7068790155991393,
        "w/heads.a.bias/sum": 0.19485747814178467,
        "w/heads.a.bias/sq": 0.03796943678777609,
        "w/heads.b.weight/sum": 0.12628710269927979,
        "w/heads.b.weight/sq": 0.6132271137225045,
        "w/heads.b.bias/sum": -0.301603227853775,
        "w/heads.b.bias/sq": 0.09096450705181613,
        "train_batches": 10.0,
        "ids0/a": 664.0,
        "ids0/b": 23928.0,
        "ids1/a": 608.0,
        "ids1/b": 23824.0,
    },
    ("max_size", 2): {
        "val0/epoch": 0.0,
        "val0/sanity_checking": 1.0,
        "val0/val_loss": 1.3962218761444092,
        "val0/global_step": 0.0,
        "val0/lr0": 0.05,
        "val1/epoch": 0.0,
        "val1/sanity_checking": 0.0,
        "val1/loss_a": 0.5777485966682434,
        "val1/loss_b": 1.3179614543914795,
        "val1/train_loss": 1.3179614543914795,
        "val1/train_loss_step": 1.3179614543914795,
        "val1/val_loss": 1.56836998462677,
        "val1/global_step": 5.0,
        "val1/lr0": 0.034999999999999996,
        "train_end0/loss_a": 0.5777485966682434,
        "train_end0/loss_b": 1.3179614543914795,
        "train_end0/train_loss": 1.5576763153076172,
        "train_end0/train_loss_step": 1.3179614543914795,
        "train_end0/val_loss": 1.56836998462677,
        "train_end0/train_loss_epoch": 1.5576763153076172,
        "train_end0/global_step": 5.0,
        "train_end0/lr0": 0.034999999999999996,
        "val2/epoch": 1.0,
        "val2/sanity_checking": 0.0,
        "val2/loss_a": 0.9880185127258301,
        "val2/loss_b": 2.0983121395111084,
        "val2/train_loss": 2.0983121395111084,
        "val2/train_loss_step": 2.0983121395111084,
        "val2/val_loss": 1.603907823562622,
        "val2/train_loss_epoch": 1.5576763153076172,
        "val2/global_step": 10.0,
        "val2/lr0": 0.024499999999999997,
        "train_end1/loss_a": 0.9880185127258301,
        "train_end1/loss_b": 2.0983121395111084,
        "train_end1/train_loss": 1.732482671737671,
        "train_end1/train_loss_step": 2.0983121395111084,
        "train_end1/val_loss": 1.603907823562622,
        "train_end1/train_loss_epoch": 1.732482671737671,
        "train_end1/global_step": 10.0,
        "train_end1/lr0": 0.024499999999999997,
        "final/global_step": 10.0,
        "final/lr0": 0.024499999999999997,
        "w/trunk.0.weight/sum": 2.6588778030127287,
        "w/trunk.0.weight/sq": 4.621470634670815,
        "w/trunk.0.bias/sum": -0.7447890862822533,
        "w/trunk.0.bias/sq": 1.7671447371439348,
        "w/heads.a.weight/sum": -0.25733378098811954,
        "w/heads.a.weight/sq": 0.28514879536148785,
        "w/heads.a.bias/sum": 0.3555237352848053,
        "w/heads.a.bias/sq": 0.1263971263508603,
        "w/heads.b.weight/sum": -0.29079895513132215,
        "w/heads.b.weight/sq": 0.28707044956189653,
        "w/heads.b.bias/sum": -0.08232154697179794,
        "w/heads.b.bias/sq": 0.006776837095829935,
        "train_batches": 5.0,
        "ids0/a": 232.0,
        "ids0/b": 6566.0,
        "ids1/a": 208.0,
        "ids1/b": 6454.0,
        "rank1/val1/loss_a": 0.6995174288749695,
        "rank1/val1/loss_b": 0.38475117087364197,
        "rank1/val1/train_loss": 0.38475117087364197,
        "rank1/val1/train_loss_step": 0.38475117087364197,
        "rank1/train_end0/loss_a": 0.6995174288749695,
        "rank1/train_end0/loss_b": 0.38475117087364197,
        "rank1/train_end0/train_loss": 2.1146020889282227,
        "rank1/train_end0/train_loss_step": 0.38475117087364197,
        "rank1/train_end0/train_loss_epoch": 2.1146020889282227,
        "rank1/val2/loss_a": 0.7740826606750488,
        "rank1/val2/loss_b": 1.4816383123397827,
        "rank1/val2/train_loss": 1.4816383123397827,
        "rank1/val2/train_loss_step": 1.4816383123397827,
        "rank1/val2/train_loss_epoch": 2.1146020889282227,
        "rank1/train_end1/loss_a": 0.7740826606750488,
        "rank1/train_end1/loss_b": 1.4816383123397827,
        "rank1/train_end1/train_loss": 1.642102599143982,
        "rank1/train_end1/train_loss_step": 1.4816383123397827,
        "rank1/train_end1/train_loss_epoch": 1.642102599143982,
        "rank1/ids0/a": 187.0,
        "rank1/ids0/b": 6328.0,
        "rank1/ids1/a": 201.0,
        "rank1/ids1/b": 6630.0,
    },
}
BATCHES: dict[tuple[str, int], list[str]] = {
    ("max_size_cycle", 1): [
        "a4 b4, a4 b4, a4 b4, a4 b4, a4 b4, a1 b4, a4 b4, a4 b4, a4 b4, a4 b2",
        "a4 b4, a4 b4, a4 b4, a4 b4, a4 b4, a1 b4, a4 b4, a4 b4, a4 b4, a4 b2",
    ],
    ("max_size_cycle", 2): [
        "a4 b4, a4 b4, a3 b4, a4 b4, a4 b3",
        "a4 b4, a4 b4, a3 b4, a4 b4, a4 b3",
    ],
    ("min_size", 1): [
        "a4 b4, a4 b4, a4 b4, a4 b4, a4 b4, a1 b4",
        "a4 b4, a4 b4, a4 b4, a4 b4, a4 b4, a1 b4",
    ],
    ("min_size", 2): [
        "a4 b4, a4 b4, a3 b4",
        "a4 b4, a4 b4, a3 b4",
    ],
    ("max_size", 1): [
        "a4 b4, a4 b4, a4 b4, a4 b4, a4 b4, a1 b4, a- b4, a- b4, a- b4, a- b2",
        "a4 b4, a4 b4, a4 b4, a4 b4, a4 b4, a1 b4, a- b4, a- b4, a- b4, a- b2",
    ],
    ("max_size", 2): [
        "a4 b4, a4 b4, a3 b4, a- b4, a- b3",
        "a4 b4, a4 b4, a3 b4, a- b4, a- b3",
    ],
}
MODES = tuple(dict.fromkeys(mode for mode, _ in LIGHTNING))


@pytest.fixture(scope="module")
def tandem_ddp(core_ddp: dict[str, Any]) -> list[dict[str, Any]]:
    """Every mode's results, and the resume's, under tandem's ddp on two ranks (the shared launch): ``[rank0,
    rank1]``."""
    return [rank["modes"] for rank in core_ddp["combined_parity"]]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_a_dict_of_two_loaders_trains_as_under_lightning(
    mode: str, devices: int, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if devices == 1:
        request.getfixturevalue("scripts_on_path")
        import combined_parity_programs as programs

        with mock.patch.dict(os.environ):  # seed_everything's variables stay out of the tests that follow
            results = [programs.run_mode(programs.api("tandem"), mode, tmp_path, devices=1)]
    else:
        results = [rank[mode] for rank in request.getfixturevalue("tandem_ddp")]
    report = []
    for rank, (want, got) in enumerate(
        zip(lightning_by_rank(LIGHTNING[(mode, devices)], devices), results, strict=True)
    ):
        if got["batches"] != BATCHES[(mode, devices)]:
            report.append(f"rank {rank}: batches {got['batches']}, Lightning's {BATCHES[(mode, devices)]}")
        lines = lightning_differences(want, got["values"])
        if lines:
            report.append(f"rank {rank}: {len(lines)} of {len(want)} values differ from Lightning's:")
            report += lines
    if devices == 2:  # DDP keeps the replicas equal, bit for bit (as under Lightning)
        first, second = (r["values"] for r in results)
        unequal = [k for k in first if k.startswith("w/") and first[k] != second[k]]
        if unequal:
            report.append(f"rank 1's final weights differ from rank 0's in {unequal}")
    assert not report, f"{mode} on {devices} device(s), tandem vs Lightning 2.6.6:\n" + "\n".join(report)


def _after_resume(values: dict[str, float]) -> dict[str, float]:
    """The values a resumed fit records that the uninterrupted one recorded too: the last epoch's end, the final
    step, rate and weights (its validation runs and sanity check are numbered from the resume)."""
    return {k: v for k, v in values.items() if k.startswith(("train_end1/", "final/", "w/"))}


@pytest.mark.timeout(300)
def test_a_mid_epoch_checkpoint_resumes_exactly_under_ddp(tandem_ddp: list[dict[str, Any]]) -> None:
    """max_size stopped in the second epoch right after "a"'s last batch (dropout, a per-step scheduler): each
    rank trains on the rest of the epoch's batches (no "a") and ends with the uninterrupted run's weights, rate
    and step, and rank 0 with its epoch values (logged without sync_dist, so each rank's own)."""
    import_path = str(SCRIPT.parent)
    sys.path.insert(0, import_path)
    try:
        from combined_parity_programs import RESUME_MODE, RESUME_STEP
    finally:
        sys.path.remove(import_path)
    for rank, result in enumerate(tandem_ddp):
        full, resumed = result[RESUME_MODE], result["resumed"]
        assert resumed["steps"] == full["steps"][RESUME_STEP:]
        assert [parts["a"] for _, _, parts in resumed["steps"]] == [None, None]
        want, got = _after_resume(full["values"]), _after_resume(resumed["values"])
        # loss_a, a step value last logged before the checkpoint: a resumed fit shows the step values it logged
        # itself (Lightning's too)
        assert set(want) - set(got) == {"train_end1/loss_a"}, f"rank {rank}"
        if rank == 1:  # a save gathers nothing: every rank resumes the epoch's partial sums rank 0 saved, so rank 1's
            # epoch value of a name logged without sync_dist mixes rank 0's first steps in (as in Lightning)
            got = {k: v for k, v in got.items() if not k.endswith(("train_loss", "train_loss_epoch"))}
        assert got == {k: want[k] for k in got}, f"rank {rank}"
