# tests/gpu/test_nccl_gpu.py: groups of PyTorch processes that communicate through NCCL (one per
# GPU), suspended and resumed as one (gcrctl --group) on a multi-GPU machine: bit-exact cycles at
# random moments, every GPU empty while suspended, a member killed mid-operation, a lone member
# refused; and the benchmark of the TP group against the driver alone, in the same run.
"""Run from anywhere: python3 tests/gpu/test_nccl_gpu.py [--only REGEX] [--skip REGEX] [--list]

Ranks: GCR_NCCL_RANKS (default: every GPU nvidia-smi lists, at least 2). Tuning: GCR_CYCLES (3),
GCR_NCCL_STEPS (300), GCR_NCCL_TP_STEPS (120), GCR_NCCL_TP_GIB (8: weights per rank),
GCR_NCCL_BENCH_REPS (3), GCR_NCCL_DRIVER_TIMEOUT_MS (20000: the driver-alone baseline's bound),
GCR_NCCL_BENCH_DRIVER (1; 0 leaves the baseline out, for a second variant of the shim in one run),
GCR_NCCL_HOLD_S (25: the long suspension against PyTorch's heartbeat monitor),
GCR_DEADLINE (epoch s). Measurements go to GCR_TEST_LOG and the benchmark to GCR_BENCH_LOG.
Exit status: 0 all passed, 1 any failed, 3 none failed but some were not run.
"""

import argparse
import os
import random
import re
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402


def env_int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


CYCLES = env_int("GCR_CYCLES", 3)
STEPS = env_int("GCR_NCCL_STEPS", 300)
TP_STEPS = env_int("GCR_NCCL_TP_STEPS", 120)
TP_GIB = float(os.environ.get("GCR_NCCL_TP_GIB", "8"))
BENCH_REPS = env_int("GCR_NCCL_BENCH_REPS", 3)
DRIVER_TIMEOUT_MS = env_int("GCR_NCCL_DRIVER_TIMEOUT_MS", 20000)
HOLD_S = env_int("GCR_NCCL_HOLD_S", 25)
BENCH_DRIVER = env_int("GCR_NCCL_BENCH_DRIVER", 1)
# How long the bench's group stays suspended before its resume (from the suspend's return). 0: at once.
# The wait models a suspended pod's idle time; it synchronises nothing. Run 70 (two H200s): with
# 3 s the resume took 1.21 s, not 0.92 s; gcrctl's opening of the driver took 0.43 s, not 0.24 s.
BENCH_GAP_MS = env_int("GCR_NCCL_BENCH_GAP_MS", 0)
# 1: `gcrctl hold-driver` keeps the driver open through the bench's test (its cycles, GCR's reps and
# the driver alone), as gcr-agent does on a node. With no process holding it, every gcrctl resume pays 0.2-0.4 s to
# open it (tests/gpu/init_probe.py, run 71).
BENCH_HOLD = env_int("GCR_NCCL_BENCH_HOLD", 0)
PROG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nccl_ranks.py")
SEED = env_int("GCR_NCCL_SEED", int(time.time()) % 100000)


class Fail(Exception):
    pass


class NotRun(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def gpu_count(cfg):
    out = H._smi(cfg, ["--query-gpu=index", "--format=csv,noheader"])
    return len([l for l in (out or "").splitlines() if l.strip()])


def gpu_used(cfg):
    """memory.used of every GPU (MiB), by index; raises when nvidia-smi fails."""
    out = H._smi(cfg, ["--query-gpu=index,memory.used", "--format=csv,noheader,nounits"])
    if out is None:
        raise H.HarnessError("nvidia-smi gave no memory reading")
    used = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2:
            used[int(parts[0])] = int(float(parts[1]))
    return used


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Ctx:
    def __init__(self, session, name):
        self.S = session
        self.cfg = session.cfg
        self.name = name
        self.notes = []
        self.groups = []

    def note(self, msg):
        self.notes.append(msg)
        print("  note: %s" % msg, flush=True)

    def log(self, **fields):
        self.S.log.write(kind="measure", test=self.name, **fields)

    def timeout(self, want):
        return max(10.0, min(float(want), self.cfg.remaining_s() - 10.0))

    def gctl(self, op, pids, *flags, timeout=300, env=None):
        flags = ["--group", ",".join(map(str, pids))] + list(flags)
        if env:
            old = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
        try:
            return self.S.ctl(op, None, flags, timeout=self.timeout(timeout), test=self.name)
        finally:
            for k, v in (old.items() if env else ()):
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def cleanup(self):
        for g in self.groups:
            g.kill()


class Ranks:
    """WORLD processes of nccl_ranks.py, one per GPU, each waiting for "go"."""

    def __init__(self, T, tag, world, args, shim=True, extra_env=None):
        self.T = T
        self.procs = []
        T.groups.append(self)
        # The rendezvous port is found free, then bound by rank 0 a moment later: another process
        # may take it meanwhile (run 65: EADDRINUSE before any suspend). The group then starts
        # again on another port, at most twice more.
        for attempt in range(3):
            self.start(tag + ("-again%d" % attempt if attempt else ""), world, args, shim, extra_env)
            try:
                self.ready(shim)
                return
            except (Fail, H.HarnessError) as e:  # a rank's ERROR line is a Fail, a rank gone a HarnessError
                if attempt == 2 or "EADDRINUSE" not in str(e):
                    raise
                T.note("rendezvous port taken (EADDRINUSE): the group starts again on another port")
                for p in self.procs:
                    p.kill()

    def start(self, tag, world, args, shim, extra_env):
        T, port = self.T, free_port()
        self.procs = []
        for r in range(world):
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r), "WORLD_SIZE": str(world),
                   "LOCAL_RANK": str(r), "NCCL_NVLS_ENABLE": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
            env.update(extra_env or {})
            argv = [T.cfg.python, PROG, "--wait"] + list(args)
            self.procs.append(T.S.start("%s-%s-r%d" % (T.name, tag, r), argv, shim=shim, extra_env=env))

    def ready(self, shim):
        T = self.T
        for r, p in enumerate(self.procs):
            m = p.expect(r"(READY pid=(\d+) rank=(\d+).*|ERROR .*)$", T.timeout(400), what="READY")
            check(m.group(1).startswith("READY"), "rank %d: %s\n%s" % (r, m.group(1), p.tail()))
            check(int(m.group(2)) == p.pid, "rank %d READY pid %s != %d" % (r, m.group(2), p.pid))
            if shim and not H.wait_socket(T.S.socket_dir, p.pid, timeout=30):
                T.note("no control socket for pid %d after 30 s" % p.pid)

    @property
    def pids(self):
        return [p.pid for p in self.procs]

    def go(self):
        for p in self.procs:
            p.send("go")

    def at_step(self, k):
        for p in self.procs:
            m = p.expect(r"(STEP %d|ERROR .*|DONE)$" % k, self.T.timeout(300), what="STEP %d" % k)
            check(m.group(1) == "STEP %d" % k, "rank %d: %s (before step %d)\n%s" % (
                self.procs.index(p), m.group(1), k, p.tail()))

    def digests(self):
        out = []
        for r, p in enumerate(self.procs):
            m = p.expect(r"(DIGEST [0-9a-f]+|ERROR .*)$", self.T.timeout(600), what="DIGEST")
            check(m.group(1).startswith("DIGEST"), "rank %d: %s\n%s" % (r, m.group(1), p.tail()))
            out.append(m.group(1).split()[1])
            p.expect(r"DONE$", self.T.timeout(60), what="DONE")
        return out

    def exit(self):
        for p in self.procs:
            if p.alive():
                p.send("exit")
        for p in self.procs:
            p.wait_exit(self.T.timeout(120))

    def kill(self):
        for p in self.procs:
            p.kill()


def world_of(T):
    n = env_int("GCR_NCCL_RANKS", 0) or gpu_count(T.cfg)
    if n < 2:
        raise NotRun("needs at least 2 GPUs (nvidia-smi lists %d)" % n)
    return n


# MiB per GPU that `gcrctl hold-driver` alone shows used (4 on H200: the driver's own, no context),
# measured before any rank starts; {} without the holder.
HOLDER_MIB = {}


def check_empty(T, g, what):
    """Every GPU the group uses shows 0 MiB used (beyond what the driver's holder alone showed
    before the ranks started), and no member is listed as a compute app."""
    used = gpu_used(T.cfg)
    ndev = gpu_count(T.cfg)
    devs = sorted({r % ndev for r in range(len(g.procs))})
    for d in devs:
        check(used.get(d, -1) == HOLDER_MIB.get(d, 0), "%s: GPU %d shows %s MiB used while the group is suspended "
              "(all: %s; the driver's holder alone: %s)" % (what, d, used.get(d), used, HOLDER_MIB))
    for pid in g.pids:
        check(T.S.gpu_mem(pid) == 0, "%s: pid %d listed with GPU memory while suspended" % (what, pid))
    return used


def group_cycle(T, g, what, gap_ms=0):
    r = T.gctl("suspend", g.pids)
    t_suspended = time.monotonic()
    check(r.ok, "%s: group suspend: %s" % (what, r.describe()))
    used = check_empty(T, g, what)
    time.sleep(max(0.0, gap_ms / 1000 - (time.monotonic() - t_suspended)))
    gap = (time.monotonic() - t_suspended) * 1000
    r2 = T.gctl("resume", g.pids)
    check(r2.ok, "%s: group resume: %s" % (what, r2.describe()))
    rec = {"what": what, "suspend_ms": r.get("ms", "total"), "resume_ms": r2.get("ms", "total"),
           "freeze_ms": r.get("ms", "freeze"), "drain_ms": r.get("ms", "drain"), "data_driver_ms": r.get("ms", "cr"),
           "resume_cr_ms": r2.get("ms", "cr"), "rebuild_ms": r2.get("ms", "rebuild"), "comms": r.get("comms"),
           "bytes": r.get("bytes", "total"), "gpu_used_mib": used, "gap_ms": round(gap),
           # Each member's resume: the driver opened (cuInit), its state query, then the rest.
           "resume_members": [{k: H.dig(m, "ms", k) for k in ("init", "state", "room", "driver", "data", "rebuild")}
                              for m in (r2.get("members") or [])]}
    T.log(event="group-cycle", **rec)
    print("  %s: suspend %.0f ms (freeze %.1f, drain %.1f, data+driver %.0f), resume %.0f ms (data+driver %.0f, "
          "rebuild %.0f), %d communicators" % (what, rec["suspend_ms"] or -1, rec["freeze_ms"] or -1,
                                              rec["drain_ms"] or -1, rec["data_driver_ms"] or -1,
                                              rec["resume_ms"] or -1, rec["resume_cr_ms"] or -1,
                                              rec["rebuild_ms"] or -1, rec["comms"] or 0), flush=True)
    print("    resume %.0f ms after the suspend; members' init / state / driver ms: %s" % (
        gap, ", ".join("%s / %s / %s" % tuple("%.0f" % m[k] if isinstance(m[k], (int, float)) else "?"
                                               for k in ("init", "state", "driver"))
                       for m in rec["resume_members"])), flush=True)
    return r, r2


def cycles_test(mode, steps, args, bench=False):
    def run(T):
        world = world_of(T)
        if not (bench and BENCH_HOLD):
            return run_cycles(T, world)
        # As gcr-agent on a node: the driver held open from before the ranks start to the end.
        holder = subprocess.Popen([T.cfg.gcrctl, "hold-driver"], stdout=subprocess.PIPE, text=True)
        try:
            line = holder.stdout.readline()  # its word that the driver is open
            check(line.startswith("driver open"), "gcrctl hold-driver: %r" % line)
            HOLDER_MIB.update(gpu_used(T.cfg))
            T.log(event="driver-held", line=line.strip(), holder_mib=HOLDER_MIB)
            print("  driver held open by gcrctl hold-driver (%s); alone it shows %s MiB used" % (
                line.strip(), HOLDER_MIB), flush=True)
            run_cycles(T, world)
        finally:
            HOLDER_MIB.clear()
            holder.terminate()
            holder.wait(timeout=30)

    def run_cycles(T, world):
        ref = Ranks(T, "ref", world, args + ["--steps", str(steps)], shim=False)
        ref.go()
        want = ref.digests()
        ref.exit()
        g = Ranks(T, "gcr", world, args + ["--steps", str(steps)])
        g.go()
        rng = random.Random(SEED + len(mode))
        points = sorted(rng.sample(range(3, max(steps - 10, 4)), CYCLES))
        for i, k in enumerate(points):
            g.at_step(k)
            group_cycle(T, g, "%s cycle %d (after step %d)" % (mode, i, k))
        got = g.digests()
        check(got == want, "digests after %d cycles at steps %s: %s; without the shim or a suspend: %s" % (
            CYCLES, points, got, want))
        T.note("%d ranks, %d cycles at steps %s, bit-exact" % (world, CYCLES, points))
        if bench:
            # The driver alone may leave the group in any state: ended by SIGKILL, not "exit".
            run_bench(T, g, world)
            g.kill()
        else:
            g.exit()
    return run


TESTS = []


def test(name, est_s):
    def deco(fn):
        TESTS.append((name, fn, est_s))
        return fn
    return deco


test("nccl-allreduce-cycles", 60)(cycles_test(
    "allreduce", STEPS, ["--mode", "allreduce", "--pace-ms", "20", "--hold-gib", "2"]))
# The TP group's run, then (same processes, idle after it) the benchmark.
test("nccl-tp-cycles-bench", 150)(cycles_test(
    "tp", TP_STEPS, ["--mode", "tp", "--pace-ms", "40", "--weights-gib", str(TP_GIB)], bench=True))


@test("nccl-member-killed", 40)
def t_member_killed(T):
    """A member killed after the drain: the error names it, the others are back running."""
    world = world_of(T)
    g = Ranks(T, "g", world, ["--mode", "allreduce", "--steps", "100000", "--pace-ms", "10", "--hold-gib", "0.5"])
    g.go()
    g.at_step(10)
    victim = g.procs[-1]
    argv = [T.cfg.gcrctl, "--socket-dir", T.S.socket_dir, "--json", "suspend", "--group", ",".join(map(str, g.pids))]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, GCR_GROUP_TEST_PAUSE="drain"))
    line = p.stderr.readline()  # gcrctl's own pause line, bounded by the communicate below
    check("paused after drain" in line, "gcrctl did not pause after the drain: %r" % line)
    victim.kill()
    out, err = p.communicate("\n", timeout=T.timeout(120))
    data = H.parse_json_output(out) or {}
    T.log(event="member-killed", result=data, stderr=err)
    check(data.get("ok") is False and ("pid %d" % victim.pid) in (data.get("error") or ""),
          "the error does not name the killed member: %r %r" % (out, err))
    for q in g.procs[:-1]:
        mine = [m for m in data.get("members", []) if m.get("pid") == q.pid]
        check(mine and mine[0].get("state") == "running", "survivor %d after the operation: %s" % (q.pid, mine))
        st = T.S.ctl("status", q.pid, test=T.name)
        comms = H.dig(st.data, "shim", "comms") or []
        check(H.dig(st.data, "shim", "state") == "running" or not q.alive(),
              "survivor %d: %s" % (q.pid, st.describe()))
        check(all(c.get("state") == "failed" for c in comms), "survivor %d's communicators: %s" % (q.pid, comms))
    T.note("error: %s" % (data.get("error") or "")[:200])


@test("nccl-watchdog-long-suspend", 60)
def t_watchdog(T):
    """PyTorch's heartbeat monitor (here 5 s; 480 s by default) ends a process whose watchdog
    thread stops: a group suspended longer (GCR_NCCL_HOLD_S, 25 s) must come back alive, its
    watchdog's event queries answered while the driver is locked."""
    world = world_of(T)
    env = {"TORCH_NCCL_ENABLE_MONITORING": "1", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "5",
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    g = Ranks(T, "g", world, ["--mode", "allreduce", "--steps", "100000", "--pace-ms", "10", "--hold-gib", "0.25"],
              extra_env=env)
    g.go()
    g.at_step(10)
    r = T.gctl("suspend", g.pids)
    check(r.ok, "group suspend: %s" % r.describe())
    check_empty(T, g, "long suspend")
    t0 = time.time()
    while time.time() - t0 < HOLD_S:  # the suspension's length, not a synchronisation
        for p in g.procs:
            check(p.alive(), "pid %d ended %.0f s into the suspension (PyTorch's heartbeat monitor?)\n%s" % (
                p.pid, time.time() - t0, p.tail()))
        time.sleep(1)
    r2 = T.gctl("resume", g.pids)
    check(r2.ok, "group resume after %.0f s: %s" % (time.time() - t0, r2.describe()))
    for p in g.procs:
        mark = p.mark()
        for i in range(5):
            m = p.expect(r"(STEP \d+|ERROR .*)$", T.timeout(60), since=mark if i == 0 else None,
                         what="steps after the long suspension")
            check(m.group(1).startswith("STEP"), "pid %d: %s\n%s" % (p.pid, m.group(1), p.tail()))
    T.note("%d ranks suspended %.0f s with a 5 s heartbeat timeout, all-reducing again" % (world, HOLD_S))


@test("nccl-single-refused", 30)
def t_single_refused(T):
    world = world_of(T)
    g = Ranks(T, "g", world, ["--mode", "allreduce", "--steps", "100000", "--pace-ms", "10", "--hold-gib", "0.25"])
    g.go()
    g.at_step(5)
    r = T.S.ctl("suspend", g.pids[0], test=T.name)
    check(not r.ok and "member of an NCCL group" in (r.error or ""), "lone suspend: %s" % r.describe())
    hint = re.search(r"--group ([0-9,]+)", r.stderr or "")
    check(hint and sorted(int(x) for x in hint.group(1).split(",")) == sorted(g.pids),
          "no group hint naming %s: %r" % (g.pids, r.stderr))
    st = T.S.ctl("status", g.pids[0], test=T.name)
    check(H.dig(st.data, "shim", "state") == "running", "touched: %s" % st.describe())
    g.at_step(20)  # still all-reducing


def bench_record(T, **rec):
    T.S.log.write(kind="nccl-bench", test=T.name, **rec)
    bl = os.environ.get("GCR_BENCH_LOG")
    if bl:
        log = H.JsonLog(bl)
        log.write(kind="nccl-bench", test=T.name, **rec)
        log.close()


def driver_alone(T, g):
    """The driver alone, same processes, same run: its figures or its bounded failure."""
    out = {}
    t0 = time.time()
    d = T.gctl("suspend", g.pids, "--driver-only", "--timeout-ms", str(DRIVER_TIMEOUT_MS))
    out["driver_suspend"] = {"ok": d.ok, "ms": d.get("ms", "total"), "wall_s": round(time.time() - t0, 2),
                             "error": d.error}
    if d.ok:
        time.sleep(BENCH_GAP_MS / 1000)  # suspended as long as GCR's reps were (at least)
        t0 = time.time()
        d2 = T.gctl("resume", g.pids, "--driver-only", "--timeout-ms", str(DRIVER_TIMEOUT_MS))
        out["driver_resume"] = {"ok": d2.ok, "ms": d2.get("ms", "total"), "wall_s": round(time.time() - t0, 2),
                                "error": d2.error}
    return out


def run_bench(T, g, world):
    """The TP group of WORLD x GCR_NCCL_TP_GIB GiB, idle after its run: BENCH_REPS suspend/resume
    cycles (median), then the driver's checkpoint alone on the same group, bounded."""
    for pid in g.pids:
        H.wait_staging_ready(T.S, pid, timeout=T.timeout(180))
    # Which GPUs each rank has a context on: the driver checkpoints every one of them.
    apps = subprocess.run([T.cfg.nvidia_smi, "--query-compute-apps=pid,gpu_uuid,used_memory",
                           "--format=csv,noheader"], capture_output=True, text=True, timeout=60).stdout
    T.log(event="contexts", pids=g.pids, compute_apps=apps.splitlines())
    sus, res = [], []
    for i in range(BENCH_REPS):
        r, r2 = group_cycle(T, g, "bench rep %d" % i, gap_ms=BENCH_GAP_MS)
        sus.append(r.get("ms", "total"))
        res.append(r2.get("ms", "total"))
    ms, _, _ = H.stats(sus)
    mr, _, _ = H.stats(res)
    rec = {"ranks": world, "gib_per_rank": TP_GIB, "suspend_ms": sus, "resume_ms": res, "suspend_median_ms": ms,
           "resume_median_ms": mr, "nccl_poke": os.environ.get("GCR_NCCL_POKE", "all"), "gap_ms": BENCH_GAP_MS,
           "driver_held": bool(BENCH_HOLD)}
    rec.update(driver_alone(T, g) if BENCH_DRIVER else {})
    d, d2 = rec.get("driver_suspend"), rec.get("driver_resume")
    if d is None:
        drv = "left out (GCR_NCCL_BENCH_DRIVER=0)"
    elif not d["ok"]:
        drv = "FAILED after %.1f s: %s" % (d["wall_s"], d["error"])
    else:
        drv = "suspend %.0f ms" % d["ms"] + (", resume %.0f ms" % d2["ms"] if d2["ok"] else
                                            ", resume FAILED: %s" % d2["error"])
    bench_record(T, **rec)
    print("  BENCH %d ranks x %.0f GiB (GCR_NCCL_POKE=%s, resumed %d ms after the suspend or later, driver %s): "
          "suspend median %.0f ms %s, resume median %.0f ms %s; driver alone: %s"
          % (world, TP_GIB, rec["nccl_poke"], BENCH_GAP_MS, "held open" if BENCH_HOLD else "not held", ms or -1, sus,
             mr or -1, res, drv), flush=True)
    T.note("suspend median %.0f ms, resume median %.0f ms" % (ms or -1, mr or -1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--skip", action="append", default=[])
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args(argv)
    selected = [t for t in TESTS if (not a.only or any(re.search(r, t[0]) for r in a.only))
                and not any(re.search(r, t[0]) for r in a.skip)]
    if a.list:
        for name, _, est in selected:
            print("%-28s ~%3d s" % (name, est))
        return 0
    session = H.Session()
    cfg = session.cfg
    session.log.write(kind="run-start", argv=sys.argv, suite="nccl", seed=SEED, cycles=CYCLES)
    print("nccl gpu tests: %d selected, seed %d, log %s, process logs in %s" % (
        len(selected), SEED, session.log.path, cfg.log_dir), flush=True)
    counts = {"PASS": 0, "FAIL": 0, "NOT RUN": 0}
    try:
        for name, fn, est in selected:
            t0 = time.time()
            missing = cfg.missing("gcrctl", "shim")
            if missing:
                status, reason, notes = "NOT RUN", "missing " + ", ".join(missing), []
            elif cfg.remaining_s() < est:
                status, reason, notes = "NOT RUN", "time budget (%.0f s left, needs ~%d s)" % (cfg.remaining_s(), est), []
            else:
                print("--- %s %s (%.0f s left)" % (time.strftime("%H:%M:%S"), name, min(cfg.remaining_s(), 1e9)),
                      flush=True)
                T = Ctx(session, name)
                status, reason = H.run_case(T, fn, NotRun, (Fail, H.HarnessError))
                notes = T.notes
            counts[status] += 1
            H.report_case(session.log, name, status, reason, notes, t0)
    finally:
        session.close()
    print("%d passed, %d failed, %d skipped" % (counts["PASS"], counts["FAIL"], counts["NOT RUN"]), flush=True)
    if counts["FAIL"]:
        return 1
    return 3 if counts["NOT RUN"] else 0


if __name__ == "__main__":
    sys.exit(main())
