"""Python work per training step, counted: bytecodes and Python calls, tandem against the hand-written loop.

Wall-clock ratios on a small shared machine move by 5-10 % from one process to the next, which hides a change of
a few microseconds a step. The number of bytecodes the interpreter runs per step hardly moves (under 0.5 %), so it
shows such a change on any machine. It is not a time: a bytecode of tandem's glue costs a few nanoseconds, the
torch calls the step makes cost far more, and cache misses come on top (see benchmarks/README.md). Use it to see
what a change to the per-step path adds or removes; judge speed with overhead.py and logging_cost.py.

The workloads are logging_cost.py's (overhead.py's MLP, ``log_every_n_steps=50``, TensorBoard) with 1 and 64
metrics per step. Each is traced (``sys.settrace`` with opcode events) for runs of 50 and 150 steps in one process,
and the difference divided by 100 is the cost of a step (set-up, the first steps and the end of a run cancel out;
publishing every 50 steps and the epoch ends are averaged in). The raw loop's per-step lines count too.

    python benchmarks/glue.py                 # 1 and 64 metrics
    python benchmarks/glue.py --metrics 1 16 --top 20
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import logging_cost  # noqa: E402  (the workloads)

import tandem  # noqa: E402

SHORT, LONG = 50, 150
_PACKAGE = os.path.dirname(os.path.abspath(tandem.__file__)) + os.sep


def _where(code) -> str:
    """``folder/file.py:function`` of a code object; ``tandem/...`` for the tandem package's own (not this folder's,
    whatever the checkout is called)."""
    path = os.path.abspath(code.co_filename)
    if path.startswith(_PACKAGE):
        return f"tandem/{os.path.relpath(path, _PACKAGE).replace(os.sep, '/')}:{code.co_name}"
    return f"{'/'.join(path.replace(os.sep, '/').split('/')[-2:])}:{code.co_name}"


def count(run: Callable[[int], object], steps: int) -> tuple[collections.Counter, collections.Counter]:
    """Bytecodes and calls per function over ``run(steps)``."""
    codes, calls = collections.Counter(), collections.Counter()

    def on_call(frame, event, arg):
        where = _where(frame.f_code)
        calls[where] += 1
        frame.f_trace_opcodes = True

        def on_opcode(frame, event, arg):
            if event == "opcode":
                codes[where] += 1
            return on_opcode

        return on_opcode

    sys.settrace(on_call)
    try:
        run(steps)
    finally:
        sys.settrace(None)
    return codes, calls


def per_step(run: Callable[[int], object]) -> tuple[dict[str, float], dict[str, float]]:
    """Bytecodes and calls per step, by function (the difference of a long and a short run)."""
    run(SHORT)  # first-call costs (lazy imports, caches) out of both counted runs
    (short_codes, short_calls), (long_codes, long_calls) = count(run, SHORT), count(run, LONG)
    n = LONG - SHORT
    codes = {k: (long_codes[k] - short_codes[k]) / n for k in long_codes}
    calls = {k: (long_calls[k] - short_calls[k]) / n for k in long_calls}
    return codes, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--top", type=int, default=12, help="tandem functions to list per case")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    print(f"glue: bytecodes and Python calls per step, runs of {LONG} minus {SHORT} steps (counted, not timed)")
    extra = {}  # metrics per step -> tandem's bytecodes a step over the raw loop's
    with tempfile.TemporaryDirectory() as root:
        for n in args.metrics:
            raw_codes, raw_calls = per_step(lambda s, n=n: logging_cost.run_raw(s, n, tempfile.mkdtemp(dir=root)))
            codes, calls = per_step(lambda s, n=n: logging_cost.run_tandem(s, n, tempfile.mkdtemp(dir=root), False))
            raw_total, total = sum(raw_codes.values()), sum(codes.values())
            extra[n] = total - raw_total
            print(
                f"\n{n} metric(s): raw {raw_total:7.0f} bytecodes {sum(raw_calls.values()):5.0f} calls | tandem "
                f"{total:7.0f} bytecodes {sum(calls.values()):5.0f} calls | +{extra[n]:.0f} bytecodes "
                f"({100 * extra[n] / raw_total:+.1f} %)"
            )
            ours = {k: v for k, v in codes.items() if k.startswith("tandem/")}
            for where, value in sorted(ours.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"  {value:8.1f} bytecodes {calls.get(where, 0):6.1f} calls  {where}")
    low, high = min(extra), max(extra)
    if high > low:
        print(f"\neach further metric: +{(extra[high] - extra[low]) / (high - low):.0f} bytecodes over the raw loop's")


if __name__ == "__main__":
    main()
