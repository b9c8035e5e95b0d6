# tests/flow/test_flow.py: the whole suspend/resume flow on the stand-in driver (CI, no GPU):
# shim + gcrctl + driver checkpoint API, every lookup path, failures that must leave the process whole.
"""Needs a build dir (top_builddir): shim, gcrctl, gcr-testprog, tests/fakecuda/{libcuda.so.1,fakesmi}.
Each case prints PASS/FAIL; the last line is 'N passed, N failed'. No sleeps: every wait is on a
protocol line from the program or on a command's exit."""

import array
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.abspath(os.environ.get("top_builddir", os.path.join(SRC, "build")))
sys.path.insert(0, os.path.join(SRC, "tests", "gpu"))
import harness as H  # noqa: E402

FAKE_DIR = os.path.join(BUILD, "tests", "fakecuda")
FAKESMI = os.path.join(FAKE_DIR, "fakesmi")
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_UNKNOWN = 999


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


class Flow:
    """One case: its own socket/fake directory (the fake's device-memory pool is per directory)."""

    def __init__(self, name):
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="gcr-flow-")
        os.environ["GCR_LOG_DIR"] = os.path.join(self.dir, "logs")
        cfg = H.Config()
        cfg.gcrctl = os.path.join(BUILD, "node-agent", "gcrctl")
        cfg.shim = os.path.join(BUILD, "shim", ".libs", "libgcr.so")
        cfg.testprog = os.path.join(BUILD, "tests", "progs", "gcr-testprog")
        cfg.shim_log_level = "warn"
        self.S = H.Session(cfg, log_path=os.path.join(self.dir, "flow.jsonl"), socket_dir=self.dir)
        self.env = {"LD_LIBRARY_PATH": FAKE_DIR, "FAKECUDA_DIR": self.dir,
                    "FAKECUDA_MEM_MIB": os.environ.get("FLOW_FAKE_MIB", "1024")}
        os.environ.update(self.env)  # gcrctl loads the fake driver too
        # Sanitizer builds need the ASan runtime first in a preloaded process.
        prefix = os.environ.get("GCR_TEST_PRELOAD_PREFIX", "")
        if prefix:
            cfg.shim = prefix + ":" + cfg.shim

    def start(self, args, shim=True, name="testprog", env=None):
        env = dict(self.env, **(env or {}))
        argv = [self.S.cfg.testprog, "--module", os.path.join(SRC, "tests", "progs", "gcr_kernels.h")] + args
        p = self.S.start(name, argv, shim=shim, extra_env=env)
        m = p.expect(r"READY pid=(\d+)", 60, what="READY")
        check(int(m.group(1)) == p.pid, "READY pid %s != %d" % (m.group(1), p.pid))
        return p

    def ctl(self, op, pid, *flags):
        return self.S.ctl(op, pid, flags, timeout=120, test=self.name)

    def mem(self, pid):
        out = subprocess.run([FAKESMI, "mem", str(pid)], capture_output=True, text=True, timeout=30)
        check(out.returncode == 0, "fakesmi mem: %s" % out.stderr.strip())
        return int(out.stdout.strip())

    def state(self, pid):
        out = subprocess.run([FAKESMI, "state", str(pid)], capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    def inject(self, pid, func, nth, code):
        out = subprocess.run([FAKESMI, "fail", str(pid), func, str(nth), str(code)],
                             capture_output=True, text=True, timeout=30)
        check(out.returncode == 0, "fakesmi fail: %s" % out.stderr.strip())

    def disarm(self, pid):
        """Removes pid's armed faults; returns how many had not fired."""
        out = subprocess.run([FAKESMI, "disarm", str(pid)], capture_output=True, text=True, timeout=30)
        check(out.returncode == 0, "fakesmi disarm: %s" % out.stderr.strip())
        return int(out.stdout.strip())

    def finish(self, p):
        p.expect(r"DONE$", 120, what="DONE")
        p.send("check")
        m = p.expect(r"RESULT (.*)", 120, what="RESULT")
        check(m.group(1) == "ok", "program reports RESULT %s" % m.group(1))
        check(p.wait_exit(60) == 0, "program exit status non-zero")

    def close(self):
        self.S.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def cycle(f, p, n=3, flags=()):
    """n suspend/resume cycles while the program iterates; GPU memory must reach 0."""
    for i in range(n):
        r = f.ctl("suspend", p.pid, *flags)
        check(r.ok, "suspend %d: %s" % (i, r.describe()))
        check(f.mem(p.pid) == 0, "cycle %d: %d bytes of device memory while suspended" % (i, f.mem(p.pid)))
        check(f.state(p.pid) == "checkpointed", "driver state %s" % f.state(p.pid))
        st = f.ctl("status", p.pid)
        check(H.dig(st.data, "shim", "state") == "suspended", "status: %s" % st.describe())
        r = f.ctl("resume", p.pid, *flags)
        check(r.ok, "resume %d: %s" % (i, r.describe()))
        check(f.state(p.pid) == "running", "driver state after resume %s" % f.state(p.pid))


# ---- zero-skip and incremental suspend (issue 5): gcr-testprog --chunks ----------------------

CHUNK = H.CHUNK


class Chunks(H.ChunkProg):
    """A gcr-testprog --chunks process after DONE (harness.ChunkProg) on the stand-in."""

    def __init__(self, f, args, env=None, iters=3, threads=3):
        self.f = f
        p = f.start(["--chunks", "--buffers", "4", "--threads", str(threads), "--iters", str(iters),
                     "--wait"] + list(args), env=env)
        H.ChunkProg.__init__(self, p, 300)
        self.go()


def shim_bytes(r, key):
    """A byte count of the shim's report (suspend/resume "shim" object); absent counts as None."""
    v = H.dig(r.data, "shim", key)
    return v if isinstance(v, int) else None


def check_report(r, what, copied, zero, incremental):
    """The shim's byte accounting: copied and zero exact, every staged byte accounted for once."""
    total, c, z, u = shim_bytes(r, "bytes"), shim_bytes(r, "copied"), shim_bytes(r, "zero"), shim_bytes(r, "unchanged")
    check(c is not None and z is not None, "%s: report lacks shim.copied/shim.zero: %s" % (what, r.stdout.strip()))
    u = u or 0
    check(c == copied, "%s: shim copied %d bytes, expected %d (%d chunks)%s" % (
        what, c, copied, copied // CHUNK, " -- FEWER: a changed chunk was missed" if c < copied else ""))
    if not incremental:
        check(u == 0, "%s: %d bytes 'unchanged' without GCR_INCREMENTAL" % (what, u))
        check(z == zero, "%s: shim zero %d bytes, expected %d" % (what, z, zero))
    else:
        # An all-zero chunk that was zero before may count as zero or as unchanged.
        check(z <= zero + u, "%s: shim zero %d > %d zero bytes" % (what, z, zero))
    check(c + z + u == total, "%s: copied %d + zero %d + unchanged %d != bytes %d" % (what, c, z, u, total))
    check(H.dig(r.data, "bytes", "moved") == c, "%s: bytes.moved %s != shim.copied %d" % (
        what, H.dig(r.data, "bytes", "moved"), c))
    check(H.dig(r.data, "bytes", "total") == total, "%s: bytes.total %s != shim.bytes %d" % (
        what, H.dig(r.data, "bytes", "total"), total))
    check(isinstance(H.dig(r.data, "shim", "ms", "digest"), (int, float)) or not incremental,
          "%s: no shim.ms.digest" % what)
    check(isinstance(shim_bytes(r, "host"), int), "%s: no shim.host (staging host bytes)" % what)


def cr_cycle(f, c, what, changed_bytes=None, flags=(), incremental=False):
    """Suspend (copied == changed_bytes, or everything non-zero when None), resume (everything
    non-zero back), verify bit-exact. Returns the suspend's report."""
    s = f.ctl("suspend", c.p.pid, *flags)
    check(s.ok, "%s: suspend: %s" % (what, s.describe()))
    total = shim_bytes(s, "bytes") or 0
    if "--keep-context" not in flags:
        check(f.mem(c.p.pid) == 0, "%s: %d bytes of device memory while suspended" % (what, f.mem(c.p.pid)))
    check_report(s, what + " suspend", total - c.zero_bytes if changed_bytes is None else changed_bytes,
                 c.zero_bytes, incremental)
    r = f.ctl("resume", c.p.pid, *flags)
    check(r.ok, "%s: resume: %s" % (what, r.describe()))
    check_report(r, what + " resume", total - c.zero_bytes, c.zero_bytes, False)
    c.verify(what)
    return s


def case_zero_skip(f):
    """Never-written memory is recorded as zero, not copied, and zero again after resume."""
    c = Chunks(f, ["--mib", "64", "--write-mib", "16"])
    check(c.zero_bytes == 48 << 20, "program reports %d zero bytes" % c.zero_bytes)
    for i in range(2):
        s = cr_cycle(f, c, "cycle %d" % i)
        check(shim_bytes(s, "zero") == 48 << 20, "cycle %d: zero %s" % (i, shim_bytes(s, "zero")))
    c.finish()


MUTATIONS = [("random", 5), ("indirect", 4), ("graph", 3), ("streams", 7), ("memset", 6), ("memcpy", 6)]


def case_incremental(flags=()):
    """GCR_INCREMENTAL=1: the first suspend copies everything non-zero, then each suspend
    exactly the chunks a mutation changed (never fewer), and every resume is bit-exact."""
    def run(f):
        c = Chunks(f, ["--mib", "64", "--write-mib", "48"], env={"GCR_INCREMENTAL": "1"})
        cr_cycle(f, c, "first", flags=flags, incremental=True)
        cr_cycle(f, c, "unchanged", changed_bytes=0, flags=flags, incremental=True)
        for seed, (kind, n) in enumerate(MUTATIONS, 1):
            changed, zero = c.mutate(kind, n, seed)
            check(changed >= 1, "%s changed nothing" % kind)
            cr_cycle(f, c, kind, (changed - zero) * CHUNK, flags=flags, incremental=True)
        # Several kinds between two suspends, overlapping chunks.
        c.mutate("random", 8, 100)
        c.mutate("indirect", 8, 100)
        changed, zero = c.mutate("memcpy", 3, 101)
        cr_cycle(f, c, "mixed", (changed - zero) * CHUNK, flags=flags, incremental=True)
        c.finish()
    return run


def case_not_incremental(f):
    """Without GCR_INCREMENTAL every suspend copies everything non-zero, mutated or not."""
    c = Chunks(f, ["--mib", "32", "--write-mib", "24"])
    cr_cycle(f, c, "first")
    for seed, (kind, n) in enumerate(MUTATIONS[:3], 1):
        c.mutate(kind, n, seed)
        cr_cycle(f, c, kind)
    c.mutate("memset", 6, 9)  # some chunks zero now: they are no longer copied
    cr_cycle(f, c, "memset")
    c.finish()


def case_incremental_faults(f):
    """A copy or the digest failing mid-suspend, a copy failing mid-resume: the process stays
    running (or suspended and resumable) and the data bit-exact, and later cycles still copy
    every change."""
    c = Chunks(f, ["--mib", "32", "--write-mib", "24"], env={"GCR_INCREMENTAL": "1"})
    cr_cycle(f, c, "first", incremental=True)
    for func, nth in (("cuMemcpyDtoHAsync", 2), ("cuLaunchKernel", 1), ("cuMemsetD8Async", 1)):
        c.mutate("random", 6, nth * 7 + len(func))
        f.inject(c.p.pid, func, nth, CUDA_ERROR_UNKNOWN)
        s = f.ctl("suspend", c.p.pid)
        # Disarmed before the program runs again: a fault the shim never reached must not
        # hit the program's own calls.
        fired = f.disarm(c.p.pid) == 0
        print("  %s #%d: %s, suspend %s" % (func, nth, "fired" if fired else "not reached",
                                             "ok" if s.ok else "failed"), flush=True)
        if not s.ok:
            check(f.state(c.p.pid) == "running" and f.mem(c.p.pid) > 0,
                  "%s failed: process not left running" % func)
            st = f.ctl("status", c.p.pid)
            check(H.dig(st.data, "shim", "state") == "running", "%s failed: shim state %s" % (func, st.describe()))
            s = f.ctl("suspend", c.p.pid)
            check(s.ok, "suspend after the failed one (%s): %s" % (func, s.describe()))
        # The host copy may have been brought up to date for some chunks before the failure:
        # only the bytes' accounting and the data after resume are exact here.
        check(shim_bytes(s, "copied") is not None, "no shim.copied: %s" % s.stdout.strip())
        r = f.ctl("resume", c.p.pid)
        check(r.ok, "resume after %s: %s" % (func, r.describe()))
        c.verify("after a failed %s" % func)
        changed, zero = c.mutate("indirect", 3, nth)
        cr_cycle(f, c, "next cycle after %s" % func, (changed - zero) * CHUNK, incremental=True)
    # Resume: a host-to-device copy fails half-way.
    c.mutate("memcpy", 5, 77)
    check(f.ctl("suspend", c.p.pid).ok, "suspend before the failing resume")
    f.inject(c.p.pid, "cuMemcpyHtoDAsync", 2, CUDA_ERROR_UNKNOWN)
    r = f.ctl("resume", c.p.pid)
    f.disarm(c.p.pid)
    if not r.ok:
        st = f.ctl("status", c.p.pid)
        check(H.dig(st.data, "shim", "state") == "suspended", "failed resume left %s" % st.describe())
        r = f.ctl("resume", c.p.pid)
        check(r.ok, "second resume: %s" % r.describe())
    c.verify("after a failed host-to-device copy in resume")
    changed, zero = c.mutate("graph", 4, 78)
    cr_cycle(f, c, "cycle after the failed resume", (changed - zero) * CHUNK, incremental=True)
    c.finish()


def case_api(api, extra=()):
    def run(f):
        p = f.start(["--api", api, "--mib", "32", "--threads", "3", "--iters", "400", "--wait",
                     "--pitch", "--small", "--async", "--vmm"] + list(extra))
        p.send("go")
        p.expect(r"ITER \d+", 60)
        cycle(f, p)
        st = f.ctl("stats", p.pid)
        check(st.rc == 0, "stats: %s" % st.describe())
        calls = H.dig(st.data, "calls") or {}
        look = H.dig(st.data, "lookups") or {}
        launches = sum(v for k, v in calls.items() if k.startswith("cuLaunchKernel"))
        check(launches > 0, "the shim saw no kernel launch: %s" % calls)
        check(calls.get("cuMemAlloc_v2", 0) > 0, "the shim saw no cuMemAlloc: %s" % calls)
        check(calls.get("cuMemCreate", 0) > 0, "the shim saw no cuMemCreate (--vmm): %s" % calls)
        if api == "dlsym":
            check(look.get("dlsym_wrapped", 0) > 0, "no dlsym lookup answered by the shim: %s" % look)
        if api == "procaddr":
            check(look.get("procaddr_wrapped", 0) + look.get("procaddr_by_name", 0) > 0,
                  "no cuGetProcAddress answer wrapped: %s" % look)
        if "--ptds" in extra:
            twins = sum(v for k, v in calls.items() if k.endswith(("_ptsz", "_ptds")))
            check(twins > 0, "per-thread-stream variants not seen: %s" % calls)
        f.finish(p)
    return run


def case_graph(f):
    p = f.start(["--api", "procaddr", "--graph", "--mib", "16", "--threads", "2", "--iters", "200", "--wait"])
    p.send("go")
    p.expect(r"ITER \d+", 60)
    cycle(f, p)
    f.finish(p)


def case_idle(f):
    """Suspended while idle, then the data is checked after resume."""
    p = f.start(["--mib", "64", "--buffers", "8", "--iters", "5", "--wait"])
    p.send("go")
    p.expect(r"DONE$", 60)
    cycle(f, p, n=2)
    p.send("check")
    check(p.expect(r"RESULT (.*)", 60).group(1) == "ok", "RESULT not ok")


def case_managed(f):
    p = f.start(["--managed", "--iters", "50", "--wait"])
    p.send("go")
    r = f.ctl("suspend", p.pid)
    check(not r.ok and "managed" in (r.error or "").lower(), "suspend with UVM: %s" % r.describe())
    check(f.state(p.pid) == "running", "driver state %s after refusal" % f.state(p.pid))
    f.finish(p)


def case_errors(f):
    r = f.ctl("suspend", 4000000)
    check(not r.ok and "no such process" in (r.error or ""), "bad pid: %s" % r.describe())
    plain = f.start(["--iters", "5", "--wait"], shim=False, name="no-shim")
    r = f.ctl("suspend", plain.pid)
    check(not r.ok and "not a GCR process" in (r.error or ""), "no shim: %s" % r.describe())
    p = f.start(["--iters", "5", "--wait"])
    r = f.ctl("resume", p.pid)
    check(not r.ok and "not suspended" in (r.error or ""), "resume running: %s" % r.describe())
    check(f.ctl("suspend", p.pid).ok, "first suspend")
    r = f.ctl("suspend", p.pid)
    check(not r.ok and "already suspended" in (r.error or ""), "second suspend: %s" % r.describe())
    check(f.ctl("resume", p.pid).ok, "resume")
    # A driver without the checkpoint API (any library lacking cuCheckpointProcess*):
    # refused before anything is touched.
    os.environ["GCR_LIBCUDA"] = os.path.join(BUILD, "shim", ".libs", "libgcr.so")
    try:
        r = f.ctl("suspend", p.pid)
    finally:
        del os.environ["GCR_LIBCUDA"]
    check(not r.ok and "no checkpoint API" in (r.error or ""), "old driver: %s" % r.describe())
    st = f.ctl("status", p.pid)
    check(H.dig(st.data, "shim", "state") == "running", "state after refusal: %s" % st.describe())
    for q in (plain, p):
        q.send("go")
        f.finish(q)


def case_resume_oom(f):
    """Not enough GPU memory at resume: a clear error, still suspended, a retry works."""
    p = f.start(["--mib", "32", "--iters", "5", "--wait"])
    check(f.ctl("suspend", p.pid).ok, "suspend")
    f.inject(p.pid, "cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY)
    r = f.ctl("resume", p.pid)
    check(not r.ok and "not enough GPU memory" in (r.error or ""), "resume under OOM: %s" % r.describe())
    st = f.ctl("status", p.pid)
    check(H.dig(st.data, "shim", "state") == "suspended", "after failed resume: %s" % st.describe())
    r = f.ctl("resume", p.pid)
    check(r.ok, "retry: %s" % r.describe())
    p.send("go")
    f.finish(p)


def case_ctx_shrink(f):
    """While suspended the context's local memory (sized from the stack limit) is given back,
    in both modes, and the application's own limit is back before it runs again; a failure to
    lower it costs nothing but the saving, a failure to restore it fails the resume, which a
    retry finishes. The fake counts stack x 1024 bytes of local memory per context."""
    stack = 3072
    p = f.start(["--mib", "16", "--iters", "5", "--wait", "--stack", str(stack)])  # on by default
    for flags in ((), ("--keep-context",)):
        r = f.ctl("suspend", p.pid, *flags)
        check(r.ok and shim_bytes(r, "ctx_freed") == stack * 1024,
              "suspend %s: ctx_freed %s, want %d: %s" % (flags, shim_bytes(r, "ctx_freed"), stack * 1024, r.describe()))
        check(isinstance(H.dig(r.data, "shim", "ms", "ctx"), float), "no shim.ms.ctx: %s" % r.stdout.strip())
        check(f.ctl("resume", p.pid, *flags).ok, "resume %s" % (flags,))
    # Lowering fails: the suspend goes on without the saving.
    f.inject(p.pid, "cuCtxSetLimit", 1, CUDA_ERROR_UNKNOWN)
    r = f.ctl("suspend", p.pid)
    check(f.disarm(p.pid) == 0, "the shim's cuCtxSetLimit was not reached")
    check(r.ok and shim_bytes(r, "ctx_freed") == 0, "suspend with the limit unchangeable: %s" % r.describe())
    check(f.mem(p.pid) == 0, "GPU memory left while suspended")
    check(f.ctl("resume", p.pid).ok, "resume after an unchanged limit")
    # Restoring fails: still suspended, and a retry puts the limit back.
    check(f.ctl("suspend", p.pid).ok, "suspend before the failing restore")
    f.inject(p.pid, "cuCtxSetLimit", 1, CUDA_ERROR_OUT_OF_MEMORY)
    r = f.ctl("resume", p.pid)
    check(f.disarm(p.pid) == 0 and not r.ok and "stack" in (r.error or "").lower(),
          "resume with the limit unrestorable should fail clearly: %s" % r.describe())
    st = f.ctl("status", p.pid)
    check(H.dig(st.data, "shim", "state") == "suspended", "after the failed resume: %s" % st.describe())
    check(f.ctl("resume", p.pid).ok, "retry")
    p.send("go")
    f.finish(p)  # the program's final check wants its stack limit unchanged


def case_ctx_shrink_off(f):
    """GCR_CTX_SHRINK=0 leaves the context as it is."""
    p = f.start(["--mib", "16", "--iters", "5", "--wait", "--stack", "2048"], env={"GCR_CTX_SHRINK": "0"})
    r = f.ctl("suspend", p.pid)
    check(r.ok and shim_bytes(r, "ctx_freed") == 0, "suspend: %s" % r.describe())
    check(f.ctl("resume", p.pid).ok, "resume")
    p.send("go")
    f.finish(p)


def case_suspend_copy_fails(f):
    """A copy fails half-way through the data step: the process keeps running, data intact."""
    p = f.start(["--mib", "32", "--buffers", "4", "--iters", "100", "--wait"])
    # Armed while the program is idle, so the third copy is the shim's.
    f.inject(p.pid, "cuMemcpyDtoHAsync", 3, CUDA_ERROR_UNKNOWN)
    r = f.ctl("suspend", p.pid)
    check(not r.ok, "suspend should fail: %s" % r.describe())
    check(f.state(p.pid) == "running" and f.mem(p.pid) > 0, "process not left running")
    check(f.ctl("suspend", p.pid).ok and f.ctl("resume", p.pid).ok, "a later cycle")
    p.send("go")
    f.finish(p)


def case_copy_fails_after_release(f):
    """Allocations are released as soon as their data is out, while the others still copy.
    A copy failing after some were released (here the all-zero buffers, released at once,
    and maybe written ones): the released ones come back from staging, bit-exact, and the
    process keeps running; a later cycle works."""
    c = Chunks(f, ["--mib", "64", "--write-mib", "24"])  # 4 buffers of 8 chunks: 1.5 written
    f.inject(c.p.pid, "cuMemcpyDtoHAsync", 9, CUDA_ERROR_UNKNOWN)
    r = f.ctl("suspend", c.p.pid)
    fired = f.disarm(c.p.pid) == 0
    check(fired and not r.ok, "the 9th copy should fail the suspend: %s" % r.describe())
    check(f.state(c.p.pid) == "running" and f.mem(c.p.pid) > 0, "process not left running")
    st = f.ctl("status", c.p.pid)
    check(H.dig(st.data, "shim", "state") == "running", "shim state: %s" % st.describe())
    c.verify("after the failed suspend")
    cr_cycle(f, c, "a later cycle")
    c.finish()


def case_digest_oom(f):
    """No GPU memory left for the digests (a full GPU): the suspend still succeeds and copies
    every chunk, zero ones included; the resume is bit-exact."""
    c = Chunks(f, ["--mib", "32", "--write-mib", "16"])
    f.inject(c.p.pid, "cuMemAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY)
    r = f.ctl("suspend", c.p.pid)
    fired = f.disarm(c.p.pid) == 0
    check(fired, "the digest buffer's cuMemAlloc was not reached")
    check(r.ok, "suspend with no memory for digests: %s" % r.describe())
    check(shim_bytes(r, "zero") == 0 and shim_bytes(r, "copied") == shim_bytes(r, "bytes"),
          "without digests every chunk is copied: %s" % r.stdout.strip())
    check(f.ctl("resume", c.p.pid).ok, "resume")
    c.verify("after a suspend without digests")
    cr_cycle(f, c, "a later cycle, digests back")
    c.finish()


def case_driver_fails(f):
    """The driver's checkpoint fails after the data step: the data comes back, process runs."""
    p = f.start(["--mib", "32", "--iters", "100", "--wait"])
    p.send("go")
    p.expect(r"ITER \d+", 60)
    f.inject(p.pid, "cuCheckpointProcessCheckpoint", 1, CUDA_ERROR_UNKNOWN)
    r = f.ctl("suspend", p.pid)
    check(not r.ok and "GPU data restored" in (r.error or ""), "suspend: %s" % r.describe())
    check(f.state(p.pid) == "running", "driver state %s" % f.state(p.pid))
    st = f.ctl("status", p.pid)
    check(H.dig(st.data, "shim", "state") == "running", "shim state: %s" % st.describe())
    f.finish(p)


def case_restore_fails(f):
    """The driver's restore fails: still suspended, and a second resume finishes the job."""
    p = f.start(["--mib", "16", "--iters", "5", "--wait"])
    check(f.ctl("suspend", p.pid).ok, "suspend")
    # A transient failure: an out-of-memory one the real driver never recovers from (restore-room).
    f.inject(p.pid, "cuCheckpointProcessRestore", 1, CUDA_ERROR_UNKNOWN)
    r = f.ctl("resume", p.pid)
    check(not r.ok and "still suspended" in (r.error or ""), "resume: %s" % r.describe())
    check(f.state(p.pid) == "checkpointed", "driver state %s" % f.state(p.pid))
    check(f.ctl("resume", p.pid).ok, "second resume")
    p.send("go")
    f.finish(p)


# ---- restore room ("never lose a process", part 1): the fake driver's restore that runs out of
# memory breaks the process for good (CUDA_ERROR_OPERATING_SYSTEM after), as the real driver's
# does; gcrctl must refuse before it while another process holds the GPU. ----

ENOSPC = 28
ENODEV = 19
ROOM_MARGIN_MIB = 16   # GCR_RESTORE_MARGIN_MIB for these cases
ROOM_SCRATCH_MIB = 8   # FAKECUDA_RESTORE_SCRATCH_MIB: the fake driver's own restore work


class Hog:
    """Another fake CUDA process taking all but free_mib of the (shared) fake GPU."""

    def __init__(self, f, free_mib):
        env = dict(os.environ, **f.env)
        self.p = subprocess.Popen([FAKESMI, "hold", str(free_mib)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.p.stdout.readline()
        m = re.match(r"HOLDING free=(\d+)", line)
        if m is None:
            self.leave()
            raise Fail("fakesmi hold %d: %r %s" % (free_mib, line, self.p.stderr.read()))
        self.free = int(m.group(1))

    def leave(self):
        self.p.stdin.close()
        check(self.p.wait(30) == 0, "fakesmi hold exited non-zero")


def room_env(f, pid):
    """The need gcrctl recorded in the shim at suspend (bytes on the one fake GPU)."""
    st = f.ctl("status", pid)
    devs = H.dig(st.data, "shim", "restore_need", "devices") or []
    check(len(devs) == 1 and devs[0].get("bytes", 0) > 0, "restore_need: %s" % st.describe())
    return devs[0]["bytes"]


def case_restore_room(f):
    """Resume while another process leaves 0, need+4, need+12, 64 and 512 MiB free: every attempt
    is refused cleanly (-ENOSPC before the driver, or the shim's own refusal after it) or succeeds;
    once the other process leaves, the resume succeeds and the program's data is bit-exact."""
    os.environ["GCR_RESTORE_MARGIN_MIB"] = str(ROOM_MARGIN_MIB)
    try:
        p = f.start(["--mib", "128", "--iters", "5", "--wait"],
                    env={"FAKECUDA_RESTORE_SCRATCH_MIB": str(ROOM_SCRATCH_MIB)})
        # The check's cost on the resume path, with room to spare (NVML opened, then two reads).
        costs = []
        for _ in range(3):
            check(f.ctl("suspend", p.pid).ok, "suspend")
            r = f.ctl("resume", p.pid)
            check(r.ok and r.get("ms", "room") > 0, "resume with room: %s" % r.describe())
            costs.append((r.get("ms", "room"), r.get("ms", "total")))
        print("  room check with room to spare: %s ms (of resume totals %s ms)" %
              (", ".join("%.3f" % c[0] for c in costs), ", ".join("%.1f" % c[1] for c in costs)), flush=True)
        r = f.ctl("suspend", p.pid)
        check(r.ok, "suspend: %s" % r.describe())
        need = room_env(f, p.pid)
        need_mib = (need + (1 << 20) - 1) >> 20
        resumed = False
        # need+4: the fake driver's restore (need + 8 MiB scratch) would run out and break the
        # process; need+12: it would fit, but not the margin: refused, conservatively.
        for free_mib, must_refuse in ((0, True), (need_mib + 4, True), (need_mib + 12, True), (64, False),
                                      (512, False)):
            hog = Hog(f, free_mib)
            try:
                check(abs(hog.free - (free_mib << 20)) < (1 << 20), "hog left %d bytes, not %d MiB"
                      % (hog.free, free_mib))
                r = f.ctl("resume", p.pid)
                err = r.error or ""
                if r.ok:
                    check(not must_refuse, "resume with %d MiB free succeeded: the check let it by" % free_mib)
                    print("  %d MiB free: resumed; room check %.3f ms of %.3f ms" %
                          (free_mib, r.get("ms", "room"), r.get("ms", "total")), flush=True)
                    resumed = True
                elif r.get("code") == -ENOSPC:
                    check(r.rc == 3 and "retry when the GPU has room" in err and "bytes free" in err,
                          "refusal with %d MiB free: %s" % (free_mib, r.describe()))
                    check(f.state(p.pid) == "checkpointed", "driver state %s after a refusal" % f.state(p.pid))
                    print("  %d MiB free: refused before the driver (-ENOSPC)" % free_mib, flush=True)
                else:
                    # Past the driver: the shim's data step found no room for the 128 MiB.
                    check(not must_refuse, "%d MiB free: not refused by the check: %s" % (free_mib, r.describe()))
                    check("not enough GPU memory" in err and "retry resume" in err,
                          "%d MiB free: %s" % (free_mib, r.describe()))
                    print("  %d MiB free: driver restored, the shim's data step refused" % free_mib, flush=True)
                st = f.ctl("status", p.pid)
                check(H.dig(st.data, "shim", "state") == ("running" if resumed else "suspended"),
                      "shim state with %d MiB free: %s" % (free_mib, st.describe()))
                f.S.log.write(kind="room", test=f.name, free_mib=free_mib, need=need, ok=r.ok,
                              ms_room=r.get("ms", "room"), error=err)
            finally:
                hog.leave()
            if resumed:
                break
        check(resumed, "never resumed, even with 512 MiB free")
        p.send("go")
        f.finish(p)
    finally:
        del os.environ["GCR_RESTORE_MARGIN_MIB"]


def case_suspend_cut_short(f):
    """gcrctl killed right after the driver's checkpoint (the agent killed mid-Checkpoint is the
    same): the shim already keeps the restore's need, so a later resume checks it and succeeds
    instead of refusing for want of a record (the storm of issue 15 stranded a process so)."""
    p = f.start(["--mib", "32", "--iters", "5", "--wait"])
    mark = os.path.join(f.dir, "checkpointed")
    env = dict(os.environ, FAKECUDA_HOLD_AFTER_CHECKPOINT=mark)
    g = subprocess.Popen([f.S.cfg.gcrctl, "--socket-dir", f.dir, "suspend", str(p.pid)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while not os.path.exists(mark) and g.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        check(os.path.exists(mark), "gcrctl never reached the driver's checkpoint (exit %s): %s" % (
            g.poll(), g.stderr.read().decode() if g.poll() is not None else ""))
    finally:
        g.kill()
        g.wait(30)
    check(f.state(p.pid) == "checkpointed", "driver state %s" % f.state(p.pid))
    room_env(f, p.pid)  # the need is there although the suspend never finished
    r = f.ctl("resume", p.pid)
    check(r.ok, "resume after a suspend cut short: %s" % r.describe())
    p.send("go")
    f.finish(p)


def case_restore_room_unchecked(f):
    """The control: without the check (--unchecked) the same squeeze loses the process, as the
    real driver does, so the check above is what keeps it."""
    p = f.start(["--mib", "32", "--iters", "5", "--wait"],
                env={"FAKECUDA_RESTORE_SCRATCH_MIB": str(ROOM_SCRATCH_MIB)})
    check(f.ctl("suspend", p.pid).ok, "suspend")
    need_mib = (room_env(f, p.pid) + (1 << 20) - 1) >> 20
    hog = Hog(f, need_mib + 4)
    try:
        r = f.ctl("resume", p.pid, "--unchecked")
        check(not r.ok and "CUDA_ERROR_OUT_OF_MEMORY" in (r.error or ""), "unchecked resume: %s" % r.describe())
    finally:
        hog.leave()
    for flags in (("--unchecked",), ()):
        r = f.ctl("resume", p.pid, *flags)
        check(not r.ok and "CUDA_ERROR_OPERATING_SYSTEM" in (r.error or ""),
              "resume %s after the out-of-memory restore, GPU empty: %s" % (flags, r.describe()))
    p.kill()


def case_other_gpu(f):
    """Resume onto another GPU (--gpu, --gpu-pair; a Restore's targetGPU/gpuPairs): checked before
    the driver is called. A target this node lacks is refused (-ENODEV) with the process still
    suspended where it was; --gpu with --gpu-pair is refused untouched; a pair of a GPU the
    process did not use is left out (the driver wants only the GPUs it checkpointed), so the
    resume runs in place; the data is bit-exact after all of it. Moving for real needs two GPUs
    (tests/gpu/test_gpu.py, move-gpu)."""
    absent = "GPU-00000000-1111-2222-3333-444444444444"
    p = f.start(["--mib", "32", "--iters", "5", "--wait"])
    check(f.ctl("suspend", p.pid).ok, "suspend")
    r = f.ctl("resume", p.pid, "--gpu", absent)
    check(not r.ok and r.get("code") == -ENODEV and "no GPU %s" % absent in (r.error or "")
          and "still suspended" in (r.error or ""), "resume onto an absent GPU: %s" % r.describe())
    check(f.state(p.pid) == "checkpointed", "driver state %s after the refusal" % f.state(p.pid))
    check(f.mem(p.pid) == 0, "GPU memory held after the refusal")
    r = f.ctl("resume", p.pid, "--gpu", absent, "--gpu-pair", absent + "=" + absent.replace("0000", "5555"))
    check(not r.ok and "not both" in (r.error or ""), "--gpu with --gpu-pair: %s" % r.describe())
    check(f.state(p.pid) == "checkpointed", "driver state %s after --gpu with --gpu-pair" % f.state(p.pid))
    r = f.ctl("resume", p.pid, "--gpu", "GPU-12")
    check(r.rc == 2 and "GPU UUID" in (r.stderr or ""), "a malformed --gpu: %s" % r.describe())
    r = f.ctl("resume", p.pid, "--gpu-pair", absent + "=" + absent.replace("0000", "5555"))
    check(r.ok, "a pair of a GPU the process did not use is left out, the resume in place: %s" % r.describe())
    p.send("go")
    f.finish(p)


def case_modes(f):
    """--driver-only on a process without the shim; --no-driver keeps the context resident."""
    plain = f.start(["--mib", "16", "--iters", "5", "--wait"], shim=False, name="plain")
    check(f.ctl("suspend", plain.pid, "--driver-only").ok, "driver-only suspend")
    check(f.mem(plain.pid) == 0, "driver-only: memory left")
    check(f.ctl("resume", plain.pid, "--driver-only").ok, "driver-only resume")
    p = f.start(["--mib", "16", "--iters", "5", "--wait"])
    before = f.mem(p.pid)
    r = f.ctl("suspend", p.pid, "--no-driver")
    check(r.ok, "data-only suspend: %s" % r.describe())
    left = f.mem(p.pid)
    check(0 < left < before and f.state(p.pid) == "running", "data-only left %d of %d bytes" % (left, before))
    check(f.ctl("resume", p.pid, "--no-driver").ok, "data-only resume")
    for q in (plain, p):
        q.send("go")
        f.finish(q)


def case_peer_credentials(f):
    """Another user cannot drive the shim: the socket and the shim both refuse."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        raise Fail("needs root and setpriv to run as another user")
    p = f.start(["--iters", "5", "--wait"])
    os.chmod(f.dir, 0o755)
    sock = os.path.join(f.dir, H.shim_socket_name(p.pid))
    os.chmod(sock, 0o666)  # even with the file open to all, the shim checks the peer
    cp = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                         sys.executable, "-c",
                         "import socket,sys; s=socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(sys.argv[1]);"
                         "print(s.recv(4096).decode())",
                         sock], capture_output=True, text=True, timeout=30)
    check("permission denied" in cp.stdout, "foreign peer got: %r %r" % (cp.stdout, cp.stderr))
    st = f.ctl("status", p.pid)
    check(H.dig(st.data, "shim", "state") == "running", "process state changed")
    p.send("go")
    f.finish(p)


def host_pid(session, nspid):
    """The pid our namespace gives the process of session `session` (its unshare) that its own,
    nested PID namespace calls nspid; None when there is none."""
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/stat" % d) as fh:
                stat = fh.read()
            with open("/proc/%s/status" % d) as fh:
                ns = re.search(r"^NSpid:\s+(.*)$", fh.read(), re.M)
        except OSError:
            continue  # gone meanwhile
        sid = int(stat.rsplit(")", 1)[1].split()[3])  # after comm: state ppid pgrp session
        pids = ns.group(1).split() if ns else []
        if sid == session and len(pids) > 1 and int(pids[-1]) == nspid:
            return int(d)
    return None


def start_in_ns(f, args, shim=True, name="ns-testprog"):
    """gcr-testprog as in a container: its own PID and mount namespaces (unshare), its socket and
    fake-driver directory a tmpfs mounted only there (the host sees that directory empty).
    Returns (Proc, host pid, pid in its namespace, the directory)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise Fail("needs root and unshare to make PID and mount namespaces")
    inner = os.path.join(f.dir, "ns")
    os.makedirs(inner, exist_ok=True)
    # The GPU is the node's: the fake's memory pool stays the host's (what NVML sees).
    env = ["GCR_SOCKET_DIR=" + inner, "FAKECUDA_DIR=" + inner,
           "FAKECUDA_POOL=" + os.path.join(f.dir, "fakecuda-pool")]
    if shim:
        env += ["LD_PRELOAD=" + f.S.cfg.shim, "GCR_LOG_LEVEL=" + f.S.cfg.shim_log_level]
    # sh stays as the namespace's pid 1, so the program's own pid differs from 1 and from ours.
    argv = ["unshare", "--pid", "--fork", "--mount", "--mount-proc", "sh", "-c",
            'mount -t tmpfs gcr-ns "$0" || exit 9; env "$@"', inner] + env + \
           [f.S.cfg.testprog, "--module", os.path.join(SRC, "tests", "progs", "gcr_kernels.h")] + args
    p = f.S.start(name, argv, extra_env=f.env)
    nspid = int(p.expect(r"READY pid=(\d+)", 60, what="READY").group(1))
    hp = host_pid(p.pid, nspid)
    check(hp is not None and hp != nspid, "no host pid for pid %d of the namespace (found %s)" % (nspid, hp))
    check(os.listdir(inner) == [], "the namespace's tmpfs shows on the host: %s" % os.listdir(inner))
    return p, hp, nspid, inner


def case_container(f):
    """A shim in its own PID and mount namespaces (what the device plugin injects): gcrctl and the
    driver's checkpoint API reach it by the host pid, through /proc/<pid>/root and its NSpid."""
    p, hp, _, _ = start_in_ns(f, ["--mib", "32", "--buffers", "2", "--iters", "5", "--wait"])
    for i in range(2):
        r = f.ctl("suspend", hp)
        check(r.ok, "suspend %d by host pid: %s" % (i, r.describe()))
        check(f.mem(hp) == 0, "cycle %d: %d bytes of device memory while suspended" % (i, f.mem(hp)))
        check(f.state(hp) == "checkpointed", "driver state %s" % f.state(hp))
        st = f.ctl("status", hp)
        check(H.dig(st.data, "shim", "state") == "suspended", "status: %s" % st.describe())
        r = f.ctl("resume", hp)
        check(r.ok, "resume %d by host pid: %s" % (i, r.describe()))
        check(f.state(hp) == "running" and f.mem(hp) > 0, "driver state after resume %s" % f.state(hp))
    p.send("go")
    f.finish(p)  # the program's own check: every buffer bit-exact


def case_container_planted(f):
    """The path a container's process would serve on is the container's to write: a socket planted
    there, served by another process, is refused by its peer credentials, whether a listener bound
    there or an absolute symlink (which resolves in the caller's root) to a real shim's socket."""
    other = f.start(["--iters", "5", "--wait"], name="other")  # a real shim, on the host
    p, hp, nspid, inner = start_in_ns(f, ["--iters", "5", "--wait"], shim=False, name="ns-plain")
    planted = "/proc/%d/root%s/%s" % (hp, inner, H.shim_socket_name(hp, nspid))
    import socket
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(planted)
        s.listen(4)
        r = f.ctl("suspend", hp)
        check(not r.ok and "not a GCR process" in (r.error or "") and
              "served by pid %d" % os.getpid() in (r.error or ""), "planted listener: %s" % r.describe())
    finally:
        s.close()
    os.unlink(planted)
    os.symlink(os.path.join(f.dir, H.shim_socket_name(other.pid)), planted)
    r = f.ctl("suspend", hp)
    check(not r.ok and "served by pid %d" % other.pid in (r.error or ""), "planted symlink: %s" % r.describe())
    st = f.ctl("status", other.pid)
    check(H.dig(st.data, "shim", "state") == "running", "the other process was touched: %s" % st.describe())
    check(f.state(hp) == "running" and f.state(other.pid) == "running", "a driver state changed")
    for q in (p, other):
        q.send("go")
        f.finish(q)


def fd_target(pid, fd):
    """What pid's descriptor fd names, or None once it is closed."""
    try:
        return os.readlink("/proc/%d/fd/%s" % (pid, fd))
    except OSError:
        return None


def case_bad_requests(f):
    """Garbage on the control socket gets an error reply, never a crash."""
    p = f.start(["--iters", "5", "--wait"])
    import socket
    sock = os.path.join(f.dir, H.shim_socket_name(p.pid))
    for payload in (b"not json\n", b"{\"v\":9,\"op\":\"status\"}\n", b"{\"v\":1,\"op\":\"rm -rf\"}\n",
                    b"{\"v\":1,\"op\":\"suspend\",\"args\":{\"timeout_ms\":-5}}\n", b"x" * 70000 + b"\n"):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(sock)
        s.sendall(payload)
        reply = s.recv(4096)
        s.close()
        check(b"\"ok\":false" in reply, "payload %r got %r" % (payload[:40], reply[:200]))
    # image-read with "files": refused unless as many descriptors came with it; the ones that
    # came are closed once the request is served (the shim holds none of them after).
    r, w = os.pipe()
    pipe = os.readlink("/proc/self/fd/%d" % r)  # "pipe:[inode]": the shim's copies would read the same
    for names, fds, want in (([], [], b"must be 1.."), (["gpu/allocs.json"], [], b"0 descriptors came"),
                             (["gpu/allocs.json", "gpu/a.bin"], [r], b"1 descriptors came"),
                             (["gpu/allocs.json"], [r, w], b"2 descriptors came")):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(sock)
        line = json.dumps({"v": 1, "id": 1, "op": "image-read", "args": {"files": names}}).encode() + b"\n"
        s.sendmsg([line], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else [])
        reply = s.recv(4096)
        s.close()
        check(b"\"ok\":false" in reply and want in reply, "files %r with %d fds got %r" % (names, len(fds), reply[:200]))
    st = f.ctl("status", p.pid)
    check(H.dig(st.data, "shim", "state") == "running", "process state changed")
    kept = [d for d in os.listdir("/proc/%d/fd" % p.pid) if fd_target(p.pid, d) == pipe]
    check(not kept, "the shim kept descriptors passed to it: %s" % kept)
    os.close(r)
    os.close(w)
    p.send("go")
    f.finish(p)


def shim_call(f, pid, op, args=None):
    """One request on pid's control socket, as a tool would send it; the reply (a dict)."""
    r = H.shim_request(f.dir, pid, op, args)
    check(r is not None, "%s: connection closed before a reply" % op)
    return r


def shim_status(f, pid):
    r = shim_call(f, pid, "status")
    check(r.get("ok"), "status: %s" % r)
    return r["result"]


def refused(r, code, words):
    return not r.get("ok") and r["error"]["code"] == code and words in r["error"]["message"]


EINVAL = 22
EBADMSG = 74


def case_shim_state(f):
    """The shim's whole state in its status, across suspend, image files and resume: "state",
    "data" (gpu, host, written, files), "restore_need" (kept by its own op, only while suspended,
    gone at the resume) and "wake" (armed by a suspend with "wake", gone at the resume); the
    restore_need op refuses every malformed device list and keeps the last good one; trim refuses
    the old "trim": false form."""
    p = f.start(["--mib", "16", "--iters", "5", "--wait"])
    st = shim_status(f, p.pid)
    check(st.get("state") == "running" and st.get("data") == "gpu" and "restore_need" not in st
          and "wake" not in st, "running: %s" % st)
    good = {"devices": [{"uuid": "GPU-flow", "bytes": 12345}]}
    r = shim_call(f, p.pid, "restore_need", good)
    check(refused(r, -EINVAL, "state running"), "restore_need while running: %s" % r)
    for args in ({"trim": False}, {"restore_need": good}):
        r = shim_call(f, p.pid, "trim", args)
        check(refused(r, -EINVAL, "restore_need op"), "trim %s: %s" % (args, r))
    check(shim_call(f, p.pid, "trim").get("ok"), "trim without args while running")
    # gcrctl's suspend keeps the need it measured (before the driver's checkpoint).
    r = f.ctl("suspend", p.pid)
    check(r.ok, "suspend: %s" % r.describe())
    st = shim_status(f, p.pid)
    need = st.get("restore_need")
    check(st.get("state") == "suspended" and st.get("data") == "host" and "wake" not in st,
          "suspended: %s" % st)
    check(need and len(need["devices"]) == 1 and need["devices"][0]["bytes"] > 0, "gcrctl's need: %s" % st)
    long_uuid = "G" * 96
    bad = [{}, {"devices": []}, {"devices": {}}, {"devices": [{"uuid": "GPU 1", "bytes": 1}]},
           {"devices": [{"uuid": "GPU-1", "bytes": -1}]}, {"devices": [{"uuid": "GPU-1", "bytes": 1 << 50}]},
           {"devices": [{"uuid": "GPU-1", "bytes": "1"}]}, {"devices": [{"uuid": long_uuid, "bytes": 1}]},
           {"devices": [{"uuid": "GPU-1", "bytes": 1}, {"uuid": "GPU-1", "bytes": 2}]},
           {"devices": [{"uuid": "GPU-%d" % i, "bytes": 1} for i in range(65)]}, {"restore_need": good}]
    for args in bad:
        r = shim_call(f, p.pid, "restore_need", args)
        check(refused(r, -EBADMSG, "nothing kept"), "restore_need %s: %s" % (str(args)[:80], r))
    check(shim_status(f, p.pid).get("restore_need") == need, "a refused need changed the kept one")
    check(shim_call(f, p.pid, "restore_need", good).get("ok"), "restore_need while suspended")
    check(shim_status(f, p.pid).get("restore_need") == good, "the need kept is not the one sent")
    check(shim_call(f, p.pid, "restore_need", need).get("ok"), "restore_need back to gcrctl's")
    # Image files: written (resume refused, the need kept), then attached by image-read.
    d = os.path.join(f.dir, "image")
    os.mkdir(d)
    r = shim_call(f, p.pid, "image-write", {"dir": d})
    check(r.get("ok"), "image-write: %s" % r)
    st = shim_status(f, p.pid)
    check(st.get("data") == "written" and st.get("restore_need") == need, "after image-write: %s" % st)
    r = shim_call(f, p.pid, "resume")
    check(refused(r, -EINVAL, "image files only"), "resume with the data in files only: %s" % r)
    check(shim_status(f, p.pid).get("state") == "suspended", "a refused resume moved the state")
    r = shim_call(f, p.pid, "image-read", {"dir": d})
    check(r.get("ok"), "image-read: %s" % r)
    st = shim_status(f, p.pid)
    check(st.get("data") == "files" and st.get("restore_need") == need, "after image-read: %s" % st)
    r = f.ctl("resume", p.pid)
    check(r.ok, "resume from the files: %s" % r.describe())
    st = shim_status(f, p.pid)
    check(st.get("state") == "running" and st.get("data") == "gpu" and "restore_need" not in st,
          "resumed: %s" % st)
    r = shim_call(f, p.pid, "restore_need", need)
    check(refused(r, -EINVAL, "state running"), "restore_need after the resume: %s" % r)
    # The wake: armed by the agent's kind of suspend, off at the resume; never with an image.
    r = shim_call(f, p.pid, "suspend", {"wake": True, "image": d})
    check(refused(r, -EINVAL, "not with"), "wake with an image: %s" % r)
    r = shim_call(f, p.pid, "suspend", {"wake": True})
    check(r.get("ok"), "suspend with wake: %s" % r)
    st = shim_status(f, p.pid)
    check(st.get("data") == "host" and st.get("wake") == {"state": "armed", "waited_ms": 0}, "wake armed: %s" % st)
    r = shim_call(f, p.pid, "resume")
    check(r.get("ok"), "resume: %s" % r)
    st = shim_status(f, p.pid)
    check(st.get("state") == "running" and st.get("data") == "gpu" and "wake" not in st, "after the wake: %s" % st)
    p.send("go")
    f.finish(p)


def scale(f, replicas, pids, *flags):
    """gcrctl --json scale: the one JSON line it prints, and its exit status."""
    argv = [f.S.cfg.gcrctl, "--json", "--socket-dir", f.dir, "scale", "--replicas", str(replicas), *flags,
            *[str(p) for p in pids]]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    check(len(lines) == 1, "gcrctl scale printed %r (stderr %r)" % (out.stdout, out.stderr))
    return json.loads(lines[0]), out.returncode


def case_scale(f):
    """gcrctl scale (lib/gcr_scale, the agent scaler's policy): 3 -> 0 -> 2 -> 3, busiest resumed first,
    least busy suspended first, a process without a shim counted apart, bad arguments refused."""
    busy = f.start(["--mib", "32", "--threads", "2", "--iters", "100000", "--wait"], name="busy")
    idle = [f.start(["--mib", "32", "--iters", "5", "--wait"], name="idle%d" % i) for i in range(2)]
    plain = f.start(["--iters", "5", "--wait"], shim=False, name="no-shim")
    busy.send("go")
    busy.expect(r"ITER \d+", 60)
    for p in idle:
        p.send("go")
        p.expect(r"DONE$", 60)
    pids = [busy.pid] + [p.pid for p in idle]
    # 3 -> 2 with activity sampled: one of the idle ones goes, never the busy one.
    j, rc = scale(f, 2, pids, "--sample-ms", "300")
    check(rc == 0 and j["ok"], "scale to 2: %s" % j)
    gone = [p["pid"] for p in j["processes"] if p["action"] == "suspend"]
    check(len(gone) == 1 and gone[0] != busy.pid, "suspended %s (busy %d)" % (gone, busy.pid))
    check(f.mem(gone[0]) == 0, "suspended process holds GPU memory")
    # -> 0: the two others at once; every process suspended, timings reported.
    j, rc = scale(f, 0, pids)
    check(rc == 0 and j["after"] == {"resident": 0, "suspended": 3, "unmanaged": 0}, "scale to 0: %s" % j)
    check(j["actions"]["suspend"] == 2 and j["ms"]["run"] > 0 and j["ms"]["total"] >= j["ms"]["run"],
          "scale to 0: %s" % j)
    for pid in pids:
        check(f.mem(pid) == 0 and f.state(pid) == "checkpointed", "pid %d not suspended" % pid)
    # 0 -> 2: the busiest first (most calls counted by its shim).
    j, rc = scale(f, 2, pids)
    back = [p["pid"] for p in j["processes"] if p["action"] == "resume"]
    check(rc == 0 and len(back) == 2 and busy.pid in back, "scale to 2: %s" % j)
    check(f.state(busy.pid) == "running" and f.mem(busy.pid) > 0, "busy not resident")
    # 2 -> 3, then again: nothing to do.
    j, rc = scale(f, 3, pids)
    check(rc == 0 and j["after"]["resident"] == 3 and j["actions"]["resume"] == 1, "scale to 3: %s" % j)
    j, rc = scale(f, 3, pids)
    check(rc == 0 and j["actions"] == {"suspend": 0, "resume": 0}, "scale to 3 again: %s" % j)
    # A process without a shim is reported apart and never touched; more replicas than processes is fine.
    j, rc = scale(f, 0, [plain.pid])
    check(rc == 0 and j["after"]["unmanaged"] == 1 and j["actions"]["suspend"] == 0, "no shim: %s" % j)
    for bad in (["--replicas", "-1", str(busy.pid)], ["--replicas", "1"], ["--replicas", "1", "x"],
                ["--replicas", "1", str(busy.pid), str(busy.pid)]):
        out = subprocess.run([f.S.cfg.gcrctl, "--socket-dir", f.dir, "scale", *bad], capture_output=True,
                             text=True, timeout=30)
        check(out.returncode == 2, "gcrctl scale %s: exit %d" % (bad, out.returncode))
    # Human output names the total time from the request.
    out = subprocess.run([f.S.cfg.gcrctl, "--socket-dir", f.dir, "scale", "--replicas", "0", *map(str, pids)],
                         capture_output=True, text=True, timeout=120)
    check(out.returncode == 0 and "request to all suspended" in out.stdout, "human output: %r" % out.stdout)
    j, rc = scale(f, 3, pids)
    check(rc == 0 and j["after"]["resident"] == 3, "back to 3: %s" % j)
    for p in idle:
        p.send("check")
        check(p.expect(r"RESULT (.*)", 60).group(1) == "ok", "idle program RESULT not ok")
    busy.expect(r"ITER \d+", 60)  # still computing after five suspend/resume rounds


def case_hold_driver(f):
    """gcrctl hold-driver: says the driver is open, suspends and resumes beside it work, and it
    lets go on SIGTERM with status 0; with no driver to open, a clear error and status 1."""
    gcrctl = f.S.cfg.gcrctl
    h = subprocess.Popen([gcrctl, "hold-driver"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = h.stdout.readline()
        check(line.startswith("driver open in ") and "held until SIGTERM" in line, "first line: %r" % line)
        p = f.start(["--iters", "5", "--wait"])
        check(f.ctl("suspend", p.pid).ok and f.ctl("resume", p.pid).ok, "suspend/resume beside the holder")
        p.send("go")
        f.finish(p)
        h.terminate()
        out, err = h.communicate(timeout=30)
        check(h.returncode == 0 and "driver let go (signal 15)" in out, "rc %s, %r %r" % (h.returncode, out, err))
    finally:
        if h.poll() is None:
            h.kill()
            h.wait()
    r = subprocess.run([gcrctl, "hold-driver"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, GCR_LIBCUDA=os.path.join(f.dir, "no-libcuda.so")))
    check(r.returncode == 1 and "cannot open the CUDA driver" in r.stderr, "no driver: %d %r" % (r.returncode, r.stderr))
    r = subprocess.run([gcrctl, "hold-driver", "1"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "takes no argument" in r.stderr, "extra argument: %d %r" % (r.returncode, r.stderr))


CASES = [
    ("api-link", case_api("link")),
    ("api-dlsym", case_api("dlsym")),
    ("api-dlsym-ptds", case_api("dlsym", ["--ptds"])),
    ("api-procaddr", case_api("procaddr")),
    ("api-procaddr-ptds", case_api("procaddr", ["--ptds"])),
    ("graph", case_graph),
    ("idle", case_idle),
    ("managed-refused", case_managed),
    ("errors", case_errors),
    ("resume-oom", case_resume_oom),
    ("ctx-shrink", case_ctx_shrink),
    ("ctx-shrink-off", case_ctx_shrink_off),
    ("suspend-copy-fails", case_suspend_copy_fails),
    ("copy-fails-after-release", case_copy_fails_after_release),
    ("digest-oom", case_digest_oom),
    ("driver-checkpoint-fails", case_driver_fails),
    ("driver-restore-fails", case_restore_fails),
    ("restore-room", case_restore_room),
    ("restore-room-unchecked", case_restore_room_unchecked),
    ("suspend-cut-short", case_suspend_cut_short),
    ("other-gpu", case_other_gpu),
    ("modes", case_modes),
    ("peer-credentials", case_peer_credentials),
    ("zero-skip", case_zero_skip),
    ("incremental", case_incremental()),
    ("incremental-keep-context", case_incremental(("--keep-context",))),
    ("not-incremental", case_not_incremental),
    ("incremental-faults", case_incremental_faults),
    ("bad-requests", case_bad_requests),
    ("shim-state", case_shim_state),
    ("container", case_container),
    ("container-planted", case_container_planted),
    ("scale", case_scale),
    ("hold-driver", case_hold_driver),
]


def run_cases(cases, label, argv, flow=None):
    """Runs each (name, fn) whose name matches argv[1] (all without it) on a Flow of its own
    (flow: a subclass of Flow); one failure does not stop the rest. Prints "<label>: N passed,
    N failed"."""
    only = re.compile(argv[1]) if len(argv) > 1 else None
    passed = failed = 0
    for name, fn in cases:
        if only and not only.search(name):
            continue
        f = (flow or Flow)(name)
        try:
            fn(f)
            passed += 1
            print("PASS %s" % name, flush=True)
        except (Fail, H.HarnessError) as e:
            failed += 1
            print("FAIL %s: %s" % (name, e), flush=True)
        except Exception:  # a bug in the test itself is a failure too
            failed += 1
            print("FAIL %s: %s" % (name, traceback.format_exc()), flush=True)
        finally:
            f.close()
    print("%s: %d passed, %d failed" % (label, passed, failed))
    return 0 if failed == 0 and passed > 0 else 1


def main():
    return run_cases(CASES, "flow", sys.argv)


if __name__ == "__main__":
    sys.exit(main())
