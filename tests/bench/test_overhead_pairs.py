# tests/bench/test_overhead_pairs.py: bench_overhead.py's interleaved pairs (run_pair and the
# launch and torch records built on it) against a stand-in speaking the same protocol.
"""Exits 0 when every check holds; prints 'N passed, N failed'. The stand-in tells the two
processes of a pair apart by LD_PRELOAD, as the real pair differs; what is preloaded in place
of the shim is this process's own libc (already loaded anyway), so the check needs no build
and runs alike in the sanitizer tier."""

import os
import sys
import tempfile

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
STANDIN = os.path.join(SRC, "tests", "bench", "turns_standin.py")


def own_libc():
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "/libc.so" in path or "/libc-" in path:
                return path
    raise SystemExit("test_overhead_pairs: no libc in /proc/self/maps")


os.environ["GCR_SHIM"] = own_libc()
os.environ["LAUNCH_BENCH"] = STANDIN
os.environ["TORCH_SERVE"] = STANDIN
sys.path.insert(0, os.path.join(SRC, "bench"))
sys.path.insert(0, os.path.join(SRC, "tests", "gpu"))
import bench_overhead as B  # noqa: E402
import harness as H  # noqa: E402
import report  # noqa: E402
from tally import Tally  # noqa: E402

T = Tally("overhead pairs")
check = T.check


def session(tmp):
    os.environ["GCR_LOG_DIR"] = os.path.join(tmp, "procs")
    return H.Session(H.Config(), os.path.join(tmp, "log.jsonl"))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        order = os.path.join(tmp, "order")
        os.environ["TURNS_ORDER_FILE"] = order
        S = session(tmp)
        try:
            launch = []
            for rep in (0, 1):
                open(order, "w").close()
                recs = B.run_launch_pair(S, rep, 4, 5, 0)
                launch += recs
                got = open(order).read()
                # Pairs and blocks both alternate who goes first: ABBA within a pair.
                check(got == "NSSNNSSN", "rep %d: block order %r, want NSSNNSSN" % (rep, got))
            check(len(launch) == 12 and all(r["ok"] for r in launch), "launch records: %s" % launch)
            for v in B.LAUNCH_VARIANTS:
                rs = [r for r in launch if r["bench"] == "launch-%s" % v]
                pct, paired, npairs = report.overhead_pct(rs, report.overhead_metric("launch-%s" % v))
                check(npairs == 2 and abs(pct - 2.0) < 1e-6 and abs(paired - 2.0) < 1e-6,
                      "launch-%s: overhead %s, pairs %s over %s" % (v, pct, paired, npairs))
            wo = [r for r in launch if r["bench"] == "launch-kernel" and not r["shim"]][0]
            # Blocks answer 2 x (3000 + 10 k), k = 0..3: the median over blocks is 6030.
            check(abs(wo["ns_per_launch"] - 6030.0) < 1e-6 and wo["block_ns"] == [6000.0, 6020.0, 6040.0, 6060.0],
                  "launch-kernel without shim: %s" % wo)
            torch = B.run_torch_pair(S, "eager", 0, 7, 3, 0)
            check([r["blocks"] for r in torch] == [3, 3] and all(r["ok"] for r in torch), "torch records: %s" % torch)
            pct, _, _ = report.overhead_pct(torch, "mean_ms")
            check(pct is not None and abs(pct - 2.0) < 1e-6, "torch overhead %s" % pct)
            # The process under the shim dies mid-way: both records fail, with the reason.
            os.environ["TURNS_DIE_AFTER"] = "2"
            try:
                bad = B.run_launch_pair(S, 0, 4, 5, 0)
            finally:
                del os.environ["TURNS_DIE_AFTER"]
            check(len(bad) == 6 and not any(r["ok"] for r in bad) and all(r.get("error") for r in bad),
                  "a pair whose process died: %s" % bad)
            check(report.overhead_pct([r for r in bad if r["ok"]], "ns_per_launch")[0] is None,
                  "failed records must not make a figure")
        finally:
            S.close()
    return T.done()


if __name__ == "__main__":
    sys.exit(main())
