"""What ``import tandem`` costs on top of ``import torch``, and which heavy packages it pulls in.

Each measurement is a fresh Python process that times its own imports with ``time.perf_counter``
(interpreter start-up is the same for both and left out). The two kinds of process alternate and repeat;
the medians are compared. Also shown: the median of ``import tandem`` alone, timed inside the processes that
have just imported torch (steadier on a busy machine than a difference of two medians). Target (issue 18): at
most 0.1 s more than ``import torch``, and none of the packages in ``MUST_STAY_LAZY`` imported until they are used.

tandem's bytecode is compiled first (``compileall``), as ``pip install`` does and as the first import does unless
``PYTHONDONTWRITEBYTECODE`` is set. It is set on the 2-core development machine: there every import compiled
tandem's sources again (about 0.1 s) while torch's installed bytecode was used, which is how earlier runs measured
+0.15 s.

    python benchmarks/import_time.py               # 7 of each
    python benchmarks/import_time.py --repeats 15
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys

TARGET_S = 0.1
MUST_STAY_LAZY = ("tensorboard", "omegaconf", "torchmetrics", "tqdm", "rich", "mlflow", "wandb", "onnx", "matplotlib")
_WITHOUT = "torch"

# Run in the fresh process: time the imports, and list the top-level packages `import tandem` added.
_PROBE = """
import json, sys, time
start = time.perf_counter()
import torch
torch_s = time.perf_counter() - start
before = {name.partition(".")[0] for name in sys.modules}
tandem_s = None
if WITH_TANDEM:
    start = time.perf_counter()
    import tandem
    tandem_s = time.perf_counter() - start
added = sorted({name.partition(".")[0] for name in sys.modules} - before)
print(json.dumps({"torch_s": torch_s, "tandem_s": tandem_s, "added": added}))
"""


def _probe(with_tandem: bool) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.replace("WITH_TANDEM", str(with_tandem))],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.exit(f"the import probe failed (exit {proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="fresh processes of each kind")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args()
    import tandem

    compileall.compile_dir(os.path.dirname(tandem.__file__), quiet=1)  # its bytecode, as an install has it

    torch_only, with_tandem, tandem_alone = [], [], []
    added: list[str] = []
    for _ in range(args.repeats):  # alternate, so drifting machine load hits both alike
        torch_only.append(_probe(False)["torch_s"])
        result = _probe(True)
        with_tandem.append(result["torch_s"] + result["tandem_s"])
        tandem_alone.append(result["tandem_s"])
        added = result["added"]

    base, total = statistics.median(torch_only), statistics.median(with_tandem)
    delta = total - base
    print(f"import time, median of {args.repeats} fresh processes each:")
    print(f"  import torch                 {base:6.3f} s")
    print(f"  import torch; import tandem  {total:6.3f} s")
    print(
        f"  difference                   {delta:+6.3f} s (target <= {TARGET_S} s: "
        f"{'met' if delta <= TARGET_S else 'MISSED'})"
    )
    print(f"  import tandem alone          {statistics.median(tandem_alone):6.3f} s (after torch, same process)")
    print(f"  packages `import tandem` added: {', '.join(added) or '(none)'}")
    eager = [name for name in MUST_STAY_LAZY if name in added]
    print(
        f"  imported too early: {', '.join(eager) if eager else 'none'} (must stay lazy: {', '.join(MUST_STAY_LAZY)})"
    )
    if args.check and (eager or delta > TARGET_S):
        sys.exit(1)


if __name__ == "__main__":
    main()
