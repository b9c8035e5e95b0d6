# tests/flow/test_pools.py: stream-ordered memory on the shim's fast path (issue 19), on the
# stand-in driver: gcr-poolprog (explicit and default pools, cross-stream frees, trim, a captured
# graph that allocates inside, an explicit graph with memory nodes) suspended and resumed at
# random moments, bit-exact against a run without the shim.
"""Needs a build dir (top_builddir): shim, gcrctl, tests/progs/gcr-poolprog,
tests/fakecuda/{libcuda.so.1,fakesmi}. Each case prints PASS/FAIL; the last line is
'pools: N passed, N failed'. No sleeps: every wait is on a protocol line or a command's exit.
GCR_TEST_SEED fixes the random moments (printed with each case)."""

import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_flow as F  # noqa: E402

H = F.H
check = F.check
POOLPROG = os.path.join(F.BUILD, "tests", "progs", "gcr-poolprog")
MODULE = os.path.join(F.SRC, "tests", "progs", "gcr_kernels.h")  # the stand-in's kernels are built in
STEPS = 120


def argv(*extra):
    return [POOLPROG, "--module", MODULE, "--mib", 48, "--threads", 2, "--steps", STEPS, "--wait"] + list(extra)


def lost(p, ok):
    """With a failed gcrctl call: the program's last output and exit status (a program lost
    mid-suspend was seen once, with nothing to tell why)."""
    return "" if ok else "\n%s\n  exit status %s" % (p.tail(), p.p.poll())


def run(f, name, args, shim, cycles=0, rng=None):
    """One process: READY, go, `cycles` suspend/resume at random moments, DONE, check. Returns
    (DIGEST, the cycle records)."""
    p = f.S.start(name, args, shim=shim, extra_env=f.env)
    m = p.expect(r"READY pid=(\d+) bytes=(\d+)", 60, what="READY")
    pid = int(m.group(1))
    check(pid == p.pid, "READY pid %d != %d" % (pid, p.pid))
    if shim:
        check(H.wait_socket(f.dir, pid, 15), "no control socket for %d" % pid)
    p.send("go")
    recs = []
    for i in range(cycles):
        # A random number of steps first (the moment), then suspend wherever the threads are.
        for _ in range(rng.randint(1, STEPS // (cycles + 2))):
            p.expect(r"STEP \d+", 60, what="STEP before suspend #%d" % (i + 1))
        s = f.ctl("suspend", pid)
        check(s.ok, "suspend #%d: %s%s" % (i + 1, s.describe(), lost(p, s.ok)))
        mem = f.mem(pid)
        st = f.ctl("status", pid)
        r = f.ctl("resume", pid)
        check(r.ok, "resume #%d: %s%s" % (i + 1, r.describe(), lost(p, r.ok)))
        recs.append({"suspend": s, "status": st, "mem": mem})
        check(mem == 0, "cycle %d: %d bytes of device memory while suspended" % (i + 1, mem))
    p.expect(r"DONE$", 120, what="DONE")
    if cycles and p.seen(r"DONE$") and len(recs) < cycles:
        raise F.Fail("the program finished before the suspends")
    p.send("check")
    d = p.expect(r"DIGEST ([0-9a-f]{64})", 120, what="DIGEST").group(1)
    res = p.expect(r"RESULT (.*)", 60, what="RESULT").group(1)
    check(res == "ok", "%s: RESULT %s" % (name, res))
    check(p.wait_exit(60) == 0, "%s: exit status non-zero" % name)
    return d, recs


def seeded(name):
    seed = int(os.environ.get("GCR_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 1 << 30)
    print("  %s: seed %d (GCR_TEST_SEED=%d repeats it)" % (name, seed, seed), flush=True)
    return random.Random(seed)


def bytes_of(rec, *keys):
    v = H.dig(rec["status"].data, "shim", *keys)
    return v if isinstance(v, int) else None


def case_pools(extra):
    def fn(f):
        rng = seeded(f.name)
        ref, _ = run(f, "reference", argv(*extra), shim=False)
        got, recs = run(f, "suspended", argv(*extra), shim=True, cycles=3, rng=rng)
        check(got == ref, "DIGEST differs after 3 suspends: reference %s, got %s" % (ref, got))
        for i, rec in enumerate(recs, 1):
            pool, seg = bytes_of(rec, "bytes", "pool"), bytes_of(rec, "pool", "segments")
            asyn = bytes_of(rec, "bytes", "async")
            # The pools' memory is the shim's (moved at PCIe speed), none left to the driver's pools.
            check(pool is not None and pool > 0 and seg, "cycle %d: no pool segments in status: %s" % (
                i, H.dig(rec["status"].data, "shim")))
            check(asyn == 0, "cycle %d: %s bytes left to the driver's pools" % (i, asyn))
            # "total": what the shim staged (all-zero chunks are recorded, not copied: "moved").
            total = rec["suspend"].get("bytes", "total")
            check(isinstance(total, int) and total >= pool,
                  "cycle %d: the shim staged %s bytes, its pools hold %d" % (i, total, pool))
    return fn


CASES = [
    ("pools-cycles", case_pools(())),
    # The second stream held: its copies and frees stay queued across steps and at the suspends.
    ("pools-held-stream", case_pools(("--hold",))),
]


def main():
    return F.run_cases(CASES, "pools", sys.argv)


if __name__ == "__main__":
    sys.exit(main())
