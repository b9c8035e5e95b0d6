# tests/flow/test_nccl.py: groups of processes that communicate through NCCL, suspended and
# resumed as one operation (gcrctl --group, lib/gcr_group.c) on the stand-in driver and the
# stand-in NCCL (tests/fakenccl): every rank all-reduces every step, so a rank held alone would
# strand the others. Each case checks the outcome the design promises (docs/design.md, "Groups").
"""Needs a build dir (top_builddir): shim, gcrctl, gcr-ncclprog, tests/fakecuda, tests/fakenccl.
Each case prints PASS/FAIL; the last line is 'N passed, N failed'. No sleeps as synchronisation:
every wait is on a program's protocol line, a command's exit, or a state polled with a bound."""

import json
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_flow as T  # noqa: E402
from test_flow import Fail, check, H, BUILD, SRC  # noqa: E402

NCCLPROG = os.path.join(BUILD, "tests", "progs", "gcr-ncclprog")
FAKENCCL = os.path.join(BUILD, "tests", "fakenccl")
STEPS = int(os.environ.get("GCR_NCCL_STEPS", "120"))
SEED = int(os.environ.get("GCR_NCCL_SEED", str(int(time.time()) % 100000)))


class Flow(T.Flow):
    """test_flow's case directory, with the stand-in NCCL beside the stand-in driver."""

    def __init__(self, name):
        T.Flow.__init__(self, name)
        self.env["LD_LIBRARY_PATH"] = T.FAKE_DIR + ":" + FAKENCCL
        os.environ.update(self.env)
        self.groups = 0

    def group(self, n, devices=1, split=False, extra=(), env=None, steps=STEPS, shim=True, pace=5):
        self.groups += 1
        # gcrctl reads the stand-in NVML too: it must see as many devices as the programs.
        os.environ["FAKECUDA_DEVICES"] = str(max(devices, 1))
        return Group(self, n, "g%d" % self.groups, devices, split, extra, env, steps, shim, pace)

    def gctl(self, op, pids, *flags, timeout=120):
        return self.S.ctl(op, None, ["--group", ",".join(map(str, pids))] + list(flags), timeout=timeout,
                          test=self.name)


class Group:
    """n ranks of gcr-ncclprog on one unique id; each waits for "go"."""

    def __init__(self, f, n, tag, devices, split, extra, env, steps, shim, pace):
        self.f = f
        self.n = n
        self.steps = steps
        idfile = os.path.join(f.dir, "id-%s" % tag)
        e = dict(f.env, FAKECUDA_DEVICES=str(max(devices, 1)), **(env or {}))
        self.procs = []
        for r in range(n):
            argv = [NCCLPROG, "--rank", str(r), "--nranks", str(n), "--id-file", idfile, "--steps", str(steps),
                    "--mib", "4", "--pace-ms", str(pace), "--wait", "--devices", str(max(devices, 1)),
                    "--module", os.path.join(SRC, "tests", "progs", "gcr_kernels.h")]
            if split:
                argv.append("--split")
            argv += list(extra)
            self.procs.append(f.S.start("%s-r%d" % (tag, r), argv, shim=shim, extra_env=e))
        for r, p in enumerate(self.procs):
            m = p.expect(r"READY pid=(\d+) rank=(\d+)", 60, what="READY")
            check(int(m.group(1)) == p.pid and int(m.group(2)) == r, "READY line of rank %d: %s" % (r, m.group(0)))

    @property
    def pids(self):
        return [p.pid for p in self.procs]

    def go(self):
        for p in self.procs:
            p.send("go")

    def at_step(self, k):
        """Waits until every rank has finished step k."""
        for p in self.procs:
            p.expect(r"STEP (\d+)$" if k < 0 else r"STEP %d$" % k, 120, what="STEP %d" % k)

    def digests(self):
        """Every rank's digest; only then are they told to exit. A rank told earlier would close
        its sockets while a slower peer is still between its last collective and its last
        ncclCommGetAsyncError, which then reports the closed peer (seen under the sanitizers)."""
        out = []
        for r, p in enumerate(self.procs):
            m = p.expect(r"(DIGEST [0-9a-f]+|ERROR .*)$", 240, what="DIGEST")
            check(m.group(1).startswith("DIGEST"), "rank %d: %s\n%s" % (
                r, m.group(1), "\n".join(q.tail() for q in self.procs)))
            out.append(m.group(1).split()[1])
            p.expect(r"DONE$", 60, what="DONE")
        for p in self.procs:
            p.send("exit")
        for r, p in enumerate(self.procs):
            check(p.wait_exit(60) == 0, "rank %d exit status non-zero" % r)
        return out


REFERENCE = {}


def reference(f, n, split=False, devices=1, extra=()):
    """The digests of an uninterrupted run with the same shape (cached per shape)."""
    key = (n, split, devices, tuple(extra), STEPS)
    if key not in REFERENCE:
        g = f.group(n, devices=devices, split=split, extra=extra)
        g.go()
        REFERENCE[key] = g.digests()
    return REFERENCE[key]


def pool_usage(f, pids):
    """Device memory the stand-in's pool file charges to each of pids, per device (bytes)."""
    usage = {}
    path = os.path.join(f.dir, "fakecuda-pool")
    with open(path, "rb") as fh:
        data = fh.read()
    slot = struct.Struct("<iI8Q")
    for off in range(0, len(data) - slot.size + 1, slot.size):
        pid, _ns, *used = slot.unpack_from(data, off)
        if pid in pids:
            usage[pid] = used
    return usage


def status(f, pid):
    st = f.ctl("status", pid)
    check(st.rc is not None, "status: %s" % st.describe())
    return st.data or {}


def shim_state(f, pid):
    return H.dig(status(f, pid), "shim", "state")


def group_cycle(f, g, what, flags=()):
    """One suspend and resume of the whole group; every device of every member empty between."""
    r = f.gctl("suspend", g.pids, *flags)
    check(r.ok, "%s: group suspend: %s" % (what, r.describe()))
    check(r.get("comms") >= 1, "%s: the group reports no communicator: %s" % (what, r.stdout))
    for pid in g.pids:
        if "--no-driver" not in flags:  # the context and small buffers stay resident then
            check(f.mem(pid) == 0, "%s: pid %d holds %d bytes of device memory while suspended" % (
                what, pid, f.mem(pid)))
        check(f.state(pid) == ("running" if "--no-driver" in flags else "checkpointed"),
              "%s: pid %d driver state %s" % (what, pid, f.state(pid)))
        check(shim_state(f, pid) == "suspended", "%s: pid %d shim not suspended" % (what, pid))
    for pid, used in pool_usage(f, g.pids).items():
        if "--no-driver" not in flags:
            check(sum(used) == 0, "%s: pid %d still charged on a device: %s" % (what, pid, used))
    r2 = f.gctl("resume", g.pids, *flags)
    check(r2.ok, "%s: group resume: %s" % (what, r2.describe()))
    # Each member's driver opening (cuInit) is timed apart from its state query (benchmarks.md).
    for m in r2.get("members") or [{}]:
        check(all(isinstance(H.dig(m, "ms", k), (int, float)) and H.dig(m, "ms", k) >= 0 for k in ("init", "state")),
              "%s: a member's resume reports no ms.init and ms.state: %s" % (what, m))
    for pid in g.pids:
        check(shim_state(f, pid) == "running", "%s: pid %d not running after the group resume" % (what, pid))
    return r, r2


def cycles_at_random(f, g, rng, n=3, flags=()):
    """n group cycles, each after a random number of steps of the run."""
    points = sorted(rng.sample(range(2, max(g.steps - 10, 3)), n))
    for i, k in enumerate(points):
        g.at_step(k)
        group_cycle(f, g, "cycle %d (after step %d)" % (i, k), flags)
    return points


def case_allreduce(n, split=False, devices=1, extra=(), flags=()):
    def run(f):
        rng = random.Random(SEED + n * 7 + split)
        want = reference(f, n, split, devices, extra)
        check(len(set(want)) >= 1, "reference digests")
        g = f.group(n, devices=devices, split=split, extra=extra)
        g.go()
        points = cycles_at_random(f, g, rng, 3, flags)
        got = g.digests()
        check(got == want, "digests after cycles at steps %s: %s, uninterrupted %s" % (points, got, want))
    return run


def case_single_refused(f):
    """One member alone is refused, naming its group; nothing touched."""
    g = f.group(2)
    g.go()
    g.at_step(3)
    r = f.ctl("suspend", g.pids[0])
    check(not r.ok and "member of an NCCL group" in (r.error or ""), "lone suspend: %s" % r.describe())
    hint = "--group %d,%d" % (g.pids[0], g.pids[1])
    check(hint in r.stderr, "the refusal names the group (%s): %r" % (hint, r.stderr))
    check(f.state(g.pids[0]) == "running" and shim_state(f, g.pids[0]) == "running", "touched by the refusal")
    check(g.digests() == reference(f, 2), "digests after a refused suspend")


def case_old_refusal(f):
    """With the shim's NCCL layer off (GCR_NCCL=0) the communicators' shared memory makes the
    data path refuse as before: live communicators really share memory on the stand-in."""
    g = f.group(2, env={"GCR_NCCL": "0"})
    g.go()
    g.at_step(2)
    r = f.ctl("suspend", g.pids[0])
    check(not r.ok and "shared with another process" in (r.error or ""), "GCR_NCCL=0 suspend: %s" % r.describe())
    st = status(f, g.pids[0])
    check(H.dig(st, "shim", "buffers", "shared") >= 2, "no shared handles counted: %s" % st)
    check("comms" not in (st.get("shim") or {}), "GCR_NCCL=0 still records communicators")
    g.digests()


def case_dlopen(f):
    """NCCL opened with RTLD_LOCAL and looked up by dlsym (as Python's ctypes does): the shim's
    dlsym answers with its wrappers, the communicators are the shim's."""
    want = reference(f, 2, extra=("--api", "dlopen"))
    g = f.group(2, extra=("--api", "dlopen"))
    g.go()
    g.at_step(5)
    st = status(f, g.pids[0])
    check(len(H.dig(st, "shim", "comms") or []) == 1, "no communicator recorded: %s" % st)
    group_cycle(f, g, "dlopen")
    check(g.digests() == want, "digests")


def case_nonblocking(f):
    """Communicators made non-blocking (ncclConfig_t.blocking = 0) are rebuilt non-blocking."""
    want = reference(f, 2, extra=("--nonblocking",))
    g = f.group(2, extra=("--nonblocking",))
    g.go()
    cycles_at_random(f, g, random.Random(SEED + 3), 2)
    check(g.digests() == want, "digests")


def case_freeze_expires(f):
    """A member frozen by a coordinator that never drains thaws by itself at its bound; one
    whose coordinator's connection closes thaws at once; its peers go on."""
    g = f.group(2)
    g.go()
    g.at_step(2)
    pid = g.pids[0]
    path = os.path.join(f.dir, H.shim_socket_name(pid))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(b'{"v":1,"id":1,"op":"freeze","args":{"hold_ms":400}}\n')
    reply = json.loads(s.makefile().readline())
    check(reply.get("ok") and H.dig(reply, "result", "state") == "frozen", "freeze: %s" % reply)
    check(len(H.dig(reply, "result", "comms") or []) == 1, "freeze lists no communicator: %s" % reply)
    t0 = time.time()
    seen = [shim_state(f, pid)]
    while shim_state(f, pid) == "frozen" and time.time() - t0 < 10:
        time.sleep(0.02)  # polling a state that changes by itself, bounded
    waited = time.time() - t0
    check(seen[0] == "frozen" and shim_state(f, pid) == "running", "still %s after %.1f s" % (shim_state(f, pid), waited))
    check(waited >= 0.2, "thawed after %.2f s, before its 400 ms hold" % waited)
    # The coordinator's connection closes: thawed at once, long before the hold.
    s.sendall(b'{"v":1,"id":2,"op":"freeze","args":{"hold_ms":600000}}\n')
    reply = json.loads(s.makefile().readline())
    check(H.dig(reply, "result", "state") == "frozen", "second freeze: %s" % reply)
    s.close()
    t0 = time.time()
    while shim_state(f, pid) == "frozen" and time.time() - t0 < 10:
        time.sleep(0.02)
    check(shim_state(f, pid) == "running", "not thawed when its coordinator went")
    check(g.digests() == reference(f, 2), "digests")


def ctl_paused(f, op, pids, pause, action, *flags):
    """gcrctl OP --group with GCR_GROUP_TEST_PAUSE=pause: runs action() while the coordinator is
    stopped after that step, then lets it go on. Returns the CtlResult."""
    argv = [f.S.cfg.gcrctl, "--socket-dir", f.dir, "--json", op, "--group", ",".join(map(str, pids))] + list(flags)
    env = dict(os.environ, GCR_GROUP_TEST_PAUSE=pause)
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env)
    err = ""
    deadline = time.time() + 60
    while "paused after" not in err:
        left = deadline - time.time()
        r, _, _ = select.select([p.stderr], [], [], max(left, 0))
        if not r:
            p.kill()
            raise Fail("gcrctl never paused after %s: %r" % (pause, err))
        line = p.stderr.readline()
        if not line:
            break
        err += line
    check("paused after %s" % pause in err, "gcrctl did not pause after %s: %r" % (pause, err))
    action()
    out, rest = p.communicate("\n", timeout=120)
    data = H.parse_json_output(out)
    res = H.CtlResult(argv, p.returncode, out, err + rest, 0, data,
                      (data or {}).get("error") if isinstance(data, dict) and data.get("ok") is False else None)
    f.S.log.write(kind="gcrctl", test=f.name, op=op, **res.record())
    return res


def member(r, pid):
    for m in (r.data or {}).get("members", []):
        if m.get("pid") == pid:
            return m
    return {}


def case_killed_mid_suspend(f):
    """A member killed after the drain: the suspend fails naming it; the survivor is brought back
    running, its communicator with the dead peer failed, as a dead peer would leave it."""
    g = f.group(2)
    g.go()
    g.at_step(3)
    victim = g.procs[1]
    r = ctl_paused(f, "suspend", g.pids, "drain", victim.kill)
    check(not r.ok and ("pid %d" % victim.pid) in (r.error or ""), "error does not name the dead member: %s" % r.describe())
    m = member(r, victim.pid)
    check(m.get("gone") is True, "dead member not reported gone: %s" % m)
    survivor_failed(f, g.procs[0])


def survivor_failed(f, p):
    """p runs, back on its GPU, and its program's next NCCL call got the dead peer's error (as
    without GCR): its communicators with the dead member are failed."""
    m = p.expect(r"(ERROR .*|DIGEST .*)$", 60, what="the survivor's next NCCL call")
    check(m.group(1).startswith("ERROR"), "survivor went on as if its peer lived: %s" % m.group(1))
    st = status(f, p.pid)
    check(H.dig(st, "shim", "state") == "running", "survivor not running: %s" % st)
    comms = H.dig(st, "shim", "comms") or []
    check(comms and all(c["state"] == "failed" for c in comms), "survivor's communicators not failed: %s" % comms)
    check(f.state(p.pid) == "running" and f.mem(p.pid) > 0, "survivor not back on its GPU")
    p.send("exit")
    check(p.wait_exit(60) == 3, "survivor's exit status")


def case_killed_mid_resume(f):
    """A member killed while the group resumes (after the data, before the rebuild): the error
    names it; the survivor runs with its communicator failed."""
    g = f.group(3)
    g.go()
    g.at_step(4)
    r = f.gctl("suspend", g.pids)
    check(r.ok, "suspend: %s" % r.describe())
    victim = g.procs[2]
    r = ctl_paused(f, "resume", g.pids, "resume", victim.kill)
    check(not r.ok and ("pid %d" % victim.pid) in (r.error or ""), "error does not name the dead member: %s" % r.describe())
    for p in g.procs[:2]:
        survivor_failed(f, p)


def case_killed_while_suspended(f):
    """A member killed while the group is suspended: resume brings the others back (running,
    their communicator failed) and names the dead one."""
    g = f.group(2)
    g.go()
    g.at_step(2)
    check(f.gctl("suspend", g.pids).ok, "suspend")
    g.procs[1].kill()
    r = f.gctl("resume", g.pids)
    check(not r.ok and ("pid %d" % g.pids[1]) in (r.error or "") and "gone" in (r.error or ""), "resume: %s" % r.describe())
    check(r.get("failed_comms") == 1, "failed_comms: %s" % r.stdout)
    survivor_failed(f, g.procs[0])


def case_hung_member(f):
    """A member that does not answer (stopped): the suspend ends within its bound naming it, the
    others are thawed; once it runs again the whole group finishes as if nothing happened."""
    want = reference(f, 2)
    g = f.group(2)
    g.go()
    g.at_step(3)
    hung = g.pids[1]
    os.kill(hung, signal.SIGSTOP)
    try:
        t0 = time.time()
        r = f.gctl("suspend", g.pids, "--timeout-ms", "1500")
        took = time.time() - t0
    finally:
        os.kill(hung, signal.SIGCONT)
    check(not r.ok and ("pid %d" % hung) in (r.error or ""), "error does not name the stopped member: %s" % r.describe())
    check(took < 8, "the suspend took %.1f s with a 1.5 s bound" % took)
    check(shim_state(f, g.pids[0]) == "running", "the other member is not running")
    check(g.digests() == want, "digests after the stopped member came back")


def case_data_fails(f):
    """One member's data step fails after its communicators were torn down: the group is undone
    (the other resumed, every communicator rebuilt) and runs on bit-exact."""
    want = reference(f, 2)
    g = f.group(2)
    g.go()
    g.at_step(4)
    f.inject(g.pids[1], "cuMemcpyDtoHAsync", 2, T.CUDA_ERROR_UNKNOWN)
    r = f.gctl("suspend", g.pids)
    fired = f.disarm(g.pids[1]) == 0
    check(fired, "the injected copy failure did not fire")
    check(not r.ok and r.get("rolled_back") is True and "group running again" in (r.error or ""),
          "suspend with a failing copy: %s" % r.describe())
    for pid in g.pids:
        check(shim_state(f, pid) == "running" and f.state(pid) == "running", "pid %d not running" % pid)
    group_cycle(f, g, "after the undone suspend")
    check(g.digests() == want, "digests")


def case_incomplete_group(f):
    """A group that names only some of a communicator's processes is refused (its other ranks
    would wait for ever), nothing held afterwards."""
    g = f.group(3)
    g.go()
    g.at_step(2)
    r = f.gctl("suspend", g.pids[:2])
    check(not r.ok and "name every process" in (r.error or ""), "partial group: %s" % r.describe())
    for pid in g.pids:
        check(shim_state(f, pid) == "running", "pid %d held after the refusal" % pid)
    check(g.digests() == reference(f, 3), "digests")


def case_driver_only(f):
    """--driver-only on a group: bounded, and either done or refused cleanly (the stand-in, like
    the driver with NCCL's shared memory, does not checkpoint it); the group runs on."""
    want = reference(f, 2)
    g = f.group(2)
    g.go()
    g.at_step(3)
    t0 = time.time()
    r = f.gctl("suspend", g.pids, "--driver-only", "--timeout-ms", "2000")
    took = time.time() - t0
    check(took < 30, "driver-only group suspend took %.1f s" % took)
    if r.ok:
        check(f.gctl("resume", g.pids, "--driver-only").ok, "driver-only resume")
    else:
        check("pid" in (r.error or ""), "driver-only error names no member: %s" % r.describe())
        for pid in g.pids:
            check(f.state(pid) == "running", "pid %d left %s" % (pid, f.state(pid)))
    print("  driver-only group suspend: %s in %.2f s" % ("ok" if r.ok else "refused: " + (r.error or "")[:160], took),
          flush=True)
    check(g.digests() == want, "digests")


def case_watchdog(f):
    """A watchdog thread polling as PyTorch's does (its last step's event, the communicator's
    asynchronous error, every 10 ms) keeps its beat while the group is suspended, the stand-in
    driver locked (its calls would wait there), with nothing reported as an error."""
    g = f.group(2, extra=["--watchdog"])
    g.go()
    g.at_step(4)
    r = f.gctl("suspend", g.pids)
    check(r.ok, "group suspend: %s" % r.describe())
    for p in g.procs:
        check(f.state(p.pid) == "checkpointed", "pid %d driver state %s" % (p.pid, f.state(p.pid)))
        mark = p.mark()
        p.expect(r"BEAT \d+$", 10, since=mark, what="a watchdog beat while suspended")
        for _ in range(3):
            p.expect(r"BEAT \d+$", 10, what="watchdog beats while suspended")
        check(f.state(p.pid) == "checkpointed", "pid %d driver state %s" % (p.pid, f.state(p.pid)))
    r2 = f.gctl("resume", g.pids)
    check(r2.ok, "group resume: %s" % r2.describe())
    got = g.digests()
    for p in g.procs:
        check(not p.seen(r"ERROR"), "pid %d's watchdog saw an error:\n%s" % (p.pid, p.tail()))
    check(got == reference(f, 2), "digests with the watchdog: %s, uninterrupted %s" % (got, reference(f, 2)))


def case_scale(f):
    """gcrctl scale --replicas 0/1 --group: the group as one replica."""
    g = f.group(2)
    g.go()
    g.at_step(2)
    r = f.S.ctl("scale", None, ["--replicas", "0", "--group", ",".join(map(str, g.pids))], test=f.name)
    check(r.ok and all(shim_state(f, p) == "suspended" for p in g.pids), "scale 0: %s" % r.describe())
    r = f.S.ctl("scale", None, ["--replicas", "1", "--group", ",".join(map(str, g.pids))], test=f.name)
    check(r.ok and all(shim_state(f, p) == "running" for p in g.pids), "scale 1: %s" % r.describe())
    check(g.digests() == reference(f, 2), "digests")


def case_scale_found(f):
    """gcrctl scale over plain pids (what the agent's Checkpoint, Restore and GPUResidency run, one
    pod's processes at a time): the ranks of a group are found by their communicators and taken
    together as one group operation, a process outside any group alone; all suspended at 0, all
    back at 3, the group bit-exact and the other program's own check exact."""
    g = f.group(2)
    lone = f.start(["--mib", "16", "--iters", "5", "--wait"], name="lone")
    g.go()
    g.at_step(2)
    pids = [str(p) for p in g.pids] + [str(lone.pid)]
    r = f.S.ctl("scale", None, ["--replicas", "0"] + pids, test=f.name)
    check(r.ok and all(shim_state(f, p) == "suspended" for p in g.pids + [lone.pid]), "scale 0: %s" % r.describe())
    r = f.S.ctl("scale", None, ["--replicas", "3"] + pids, test=f.name)
    check(r.ok and all(shim_state(f, p) == "running" for p in g.pids + [lone.pid]), "scale 3: %s" % r.describe())
    check(g.digests() == reference(f, 2), "digests")
    lone.send("go")
    f.finish(lone)


CASES = [
    ("allreduce-2", case_allreduce(2)),
    ("allreduce-3-split", case_allreduce(3, split=True)),
    ("devices-3-split", case_allreduce(3, split=True, devices=3)),
    ("keep-context", case_allreduce(2, devices=2, flags=("--no-driver",))),
    ("dlopen", case_dlopen),
    ("nonblocking", case_nonblocking),
    ("single-refused", case_single_refused),
    ("old-refusal", case_old_refusal),
    ("freeze-expires", case_freeze_expires),
    ("killed-mid-suspend", case_killed_mid_suspend),
    ("killed-mid-resume", case_killed_mid_resume),
    ("killed-while-suspended", case_killed_while_suspended),
    ("hung-member", case_hung_member),
    ("data-fails", case_data_fails),
    ("incomplete-group", case_incomplete_group),
    ("driver-only", case_driver_only),
    ("scale", case_scale),
    ("scale-found", case_scale_found),
    ("watchdog", case_watchdog),
]


def main():
    print("seed %d" % SEED, flush=True)
    return T.run_cases(CASES, "nccl", sys.argv, flow=Flow)


if __name__ == "__main__":
    sys.exit(main())
