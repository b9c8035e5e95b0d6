#!/usr/bin/env python3
# tests/bench/turns_standin.py: stands in for bench/launch_bench --turns and torch_serve.py
# --bench-blocks in test_overhead_pairs.py: the same stdin/stdout protocol, known numbers.
"""Block k of a process answers BASE + 10 k (ns or ms), times 1.02 when LD_PRELOAD is set (as
under the shim), and appends N or S to $TURNS_ORDER_FILE so the caller can check the order.
$TURNS_DIE_AFTER=K: a process with LD_PRELOAD exits without answering block K."""

import os
import sys


def main():
    launch = "--turns" in sys.argv
    shim = bool(os.environ.get("LD_PRELOAD"))
    die_after = int(os.environ.get("TURNS_DIE_AFTER", "-1"))
    order = os.environ.get("TURNS_ORDER_FILE")
    print("READY pid=%d" % os.getpid(), flush=True)
    print("BENCH_READY", flush=True)
    k = 0
    for line in sys.stdin:
        words = line.split()
        if words == ["end"]:
            break
        if len(words) != 2 or words[0] != "block":
            print("ERROR bad command %r" % line, flush=True)
            return 2
        if shim and k == die_after:
            return 3
        if order:
            with open(order, "a") as f:
                f.write("S" if shim else "N")
        v = (3000.0 if launch else 8.0) + 10 * k
        v *= 1.02 if shim else 1.0
        if launch:
            print("BLOCK_NS %.3f %.3f %.3f" % (v, v * 2, v * 3), flush=True)
        else:
            print("BLOCK_MS %.3f %.3f %.3f" % (v, v, v * 1.5), flush=True)
        k += 1
    print("RESULT ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
