# tests/flow/test_hostile.py: the shim's control socket under peers that misbehave (idle,
# polling, flooding, vanishing) and names that others take; every honest client must still get through.
"""Needs a build dir (top_builddir), as test_flow.py. Each case prints PASS/FAIL; the last line is
'N passed, N failed'. Waits are on protocol replies, log lines of the shim or bounded polls of state."""

import json
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_flow as T  # noqa: E402
from test_flow import Fail, check  # noqa: E402

H = T.H
STATUS = b'{"v":1,"id":1,"op":"status"}\n'
SUSPEND = b'{"v":1,"id":1,"op":"suspend"}\n'
# The acceptance bar: gcrctl status (a whole process: start, lookup, request) within this many ms.
STATUS_BAR_MS = float(os.environ.get("HOSTILE_STATUS_BAR_MS", "100"))


def sock_path(f, pid):
    return os.path.join(f.dir, H.shim_socket_name(pid))


def connect(path, timeout=10.0):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(path)
    return s


def request(s, line=STATUS):
    """One request on s; the reply line."""
    s.sendall(line)
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            raise Fail("connection closed before a reply (got %r)" % buf[:200])
        buf += chunk
    return buf


def wait_for(cond, timeout, what):
    """A bounded poll of state (10 ms steps); raises Fail with what on timeout."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise Fail("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(0.01)  # polling a condition, bounded by timeout


def expect_err(p, pattern, timeout, what):
    """Waits for a stderr line of p (the shim's log) matching pattern."""
    rx = re.compile(pattern)
    deadline = time.monotonic() + timeout
    with p.cond:
        while True:
            if any(rx.search(l) for l in p.err_tail):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise Fail("no log line %r (%s) within %.0f s; stderr tail: %s" %
                           (pattern, what, timeout, list(p.err_tail)[-5:]))
            p.cond.wait(min(left, 1.0))


def status_ok(f, pid, what):
    r = f.ctl("status", pid)
    check(r.ok and H.dig(r.data, "shim", "state") == "running", "%s: status %s" % (what, r.describe()))
    return r


class Pollers:
    """n peers, each on one connection sending status every interval s until stopped
    (pacing the load, not synchronising anything); counts their replies and errors."""

    def __init__(self, path, n, interval):
        self.stop = threading.Event()
        self.replies = 0
        self.errors = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(path, interval), daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, path, interval):
        try:
            s = connect(path)
            while not self.stop.is_set():
                if b'"ok":true' not in request(s):
                    raise Fail("poller got an error reply")
                with self.lock:
                    self.replies += 1
                self.stop.wait(interval)
            s.close()
        except Exception as e:  # reported by close()
            with self.lock:
                self.errors.append(repr(e))

    def count(self):
        with self.lock:
            return self.replies

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)
        return self.errors


def case_idle_peer(f):
    """A peer that connects and sends nothing neither blocks others nor stays forever."""
    p = f.start(["--iters", "5", "--wait"])
    idle = connect(sock_path(f, p.pid), timeout=30)
    r = status_ok(f, p.pid, "with an idle peer")
    check(r.wall_ms < 2000, "status took %.0f ms with one idle peer" % r.wall_ms)
    check(f.ctl("suspend", p.pid).ok and f.ctl("resume", p.pid).ok, "suspend/resume with an idle peer")
    t0 = time.monotonic()
    check(idle.recv(1) == b"", "the idle peer got data")  # EOF: the shim closed it
    waited = time.monotonic() - t0
    check(waited < 15, "idle connection closed after %.1f s" % waited)
    idle.close()
    p.send("go")
    f.finish(p)


def case_polling_peer(f):
    """A peer polling status every 100 ms on one connection does not shut others out."""
    p = f.start(["--iters", "5", "--wait"])
    polls = Pollers(sock_path(f, p.pid), 1, 0.1)
    try:
        wait_for(lambda: polls.count() >= 3, 10, "the poller's first replies")
        for i in range(3):
            r = f.ctl("suspend", p.pid)
            check(r.ok, "suspend %d while polled: %s" % (i, r.describe()))
            check(f.ctl("resume", p.pid).ok, "resume %d while polled" % i)
        n = polls.count()
        wait_for(lambda: polls.count() > n, 10, "the poller to be served after the cycles")
    finally:
        errors = polls.close()
    check(not errors, "poller: %s" % errors)
    p.send("go")
    f.finish(p)


def case_acceptance(f):
    """gcrctl status answers within STATUS_BAR_MS while 50 idle and 5 polling peers are connected
    (the median of 9 runs; the slowest is reported)."""
    p = f.start(["--iters", "5", "--wait"])
    path = sock_path(f, p.pid)
    base = [status_ok(f, p.pid, "no peers").wall_ms for _ in range(5)]
    idle = [connect(path) for _ in range(50)]
    polls = Pollers(path, 5, 0.1)
    try:
        wait_for(lambda: polls.count() >= 10, 10, "the pollers' first replies")
        walls = [status_ok(f, p.pid, "50 idle + 5 polling peers").wall_ms for _ in range(9)]
    finally:
        errors = polls.close()
        for s in idle:
            s.close()
    med = statistics.median(walls)
    print("  gcrctl status: median %.1f ms, max %.1f ms under 50 idle + 5 polling peers (%.1f ms without)"
          % (med, max(walls), statistics.median(base)), flush=True)
    check(not errors, "pollers: %s" % errors)
    check(med < STATUS_BAR_MS, "gcrctl status median %.1f ms >= %.0f ms" % (med, STATUS_BAR_MS))
    p.send("go")
    f.finish(p)


def case_flood(f):
    """300 connections opened at once and held (beyond the 64 served at once): the idlest make
    room, and a client arriving after them is served."""
    p = f.start(["--iters", "5", "--wait"])
    path = sock_path(f, p.pid)
    flood = []
    for _ in range(300):
        s = socket.socket(socket.AF_UNIX)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            pass  # the backlog is full this instant; the shim drains it
        flood.append(s)
    try:
        r = status_ok(f, p.pid, "after a flood")
        check(r.wall_ms < 2000, "status took %.0f ms after a flood" % r.wall_ms)
        s = connect(path)
        check(b'"ok":true' in request(s), "a raw client after the flood")
        s.close()
    finally:
        for s in flood:
            s.close()
    p.send("go")
    f.finish(p)


def case_full_backlog(f):
    """The listen backlog filled while the process is stopped: once it runs again, the queued
    peers (all idle) do not stand between a new client and its reply."""
    p = f.start(["--iters", "5", "--wait"])
    path = sock_path(f, p.pid)
    os.kill(p.pid, signal.SIGSTOP)
    queued = []
    try:
        wait_for(lambda: open("/proc/%d/stat" % p.pid).read().rsplit(")", 1)[1].split()[0] == "T", 10,
                 "the process to stop")
        while len(queued) < 2000:
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            try:
                s.connect(path)
            except BlockingIOError:
                s.close()
                break  # the backlog is full
            queued.append(s)
        check(len(queued) < 2000, "the backlog never filled")
        os.kill(p.pid, signal.SIGCONT)
        r = status_ok(f, p.pid, "after a full backlog")
        check(r.wall_ms < 3000, "status took %.0f ms after %d queued idle peers" % (r.wall_ms, len(queued)))
    finally:
        os.kill(p.pid, signal.SIGCONT)
        for s in queued:
            s.close()
    p.send("go")
    f.finish(p)


def lowest_free_fd(pid):
    used = {int(n) for n in os.listdir("/proc/%d/fd" % pid)}
    fd = 0
    while fd in used:
        fd += 1
    return fd


def case_fd_exhaustion(f):
    """At its open-file limit accept() fails (EMFILE): the control thread survives, keeps
    retrying, and serves again once a descriptor is free."""
    p = f.start(["--iters", "5", "--wait"])
    path = sock_path(f, p.pid)
    soft, hard = resource.prlimit(p.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(p.pid, resource.RLIMIT_NOFILE, (lowest_free_fd(p.pid), hard))
    try:
        waiting = connect(path)  # queued; accept fails for it
        expect_err(p, r"control socket accept: Too many open files", 10, "EMFILE")
        # A few more failed rounds, then room again.
        waiting.sendall(STATUS)
    finally:
        resource.prlimit(p.pid, resource.RLIMIT_NOFILE, (soft, hard))
    waiting.settimeout(10)
    check(b'"ok":true' in request(waiting, b""), "the waiting client after fds freed")
    waiting.close()
    status_ok(f, p.pid, "after EMFILE")
    p.send("go")
    f.finish(p)


def case_abandoned_suspend(f):
    """A suspend sent and abandoned at once never leaves the process suspended: not run when the
    client has gone before it starts, undone when the client goes while it runs."""
    p = f.start(["--mib", "64", "--iters", "5", "--wait"])
    for i in range(3):
        s = connect(sock_path(f, p.pid))
        s.sendall(SUSPEND)
        s.close()
        try:
            expect_err(p, r"control request suspend from a client that has gone: not run|suspend undone because",
                       30, "the abandoned suspend %d handled" % i)
        except Fail as e:
            st = f.ctl("status", p.pid)
            raise Fail("%s; the shim's state now: %s" % (e, H.dig(st.data, "shim", "state")))
        with p.cond:
            p.err_tail.clear()
        st = f.ctl("status", p.pid)
        check(H.dig(st.data, "shim", "state") == "running", "after abandoned suspend %d: %s" % (i, st.describe()))
        check(f.state(p.pid) == "running" and f.mem(p.pid) > 0, "driver state %s" % f.state(p.pid))
    p.send("go")
    f.finish(p)  # the program's own check: every buffer bit-exact


def case_stopped_process(f):
    """A process that stops itself (SIGSTOP) after its shim started cannot answer: gcrctl's status
    and suspend give up on it within a few seconds, not at their bounds (10 s and 10 min), with an
    error that names the state; once continued it is untouched, runs and checks bit-exact."""
    p = f.start(["--mib", "32", "--iters", "5", "--wait"])
    os.kill(p.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: open("/proc/%d/stat" % p.pid).read().rsplit(")", 1)[1].split()[0] == "T", 10,
                 "the process to stop")
        for op in ("status", "suspend"):
            t0 = time.monotonic()
            r = f.ctl(op, p.pid)
            took = time.monotonic() - t0
            check(not r.ok, "%s of a stopped process succeeded: %s" % (op, r.describe()))
            said = (r.error or "") + json.dumps(r.data or {})
            check("stopped (state T" in said, "%s: the error does not name the state: %s" % (op, r.describe()))
            check(took < 8, "%s of a stopped process took %.1f s" % (op, took))
    finally:
        os.kill(p.pid, signal.SIGCONT)
    st = f.ctl("status", p.pid)
    check(st.ok and H.dig(st.data, "shim", "state") == "running", "after SIGCONT: %s" % st.describe())
    p.send("go")
    f.finish(p)


def start_stopped(f, name, pre=""):
    """gcr-testprog started through sh, which stops itself before exec (same pid, same start
    time): the test sees the process's socket name before the shim makes it."""
    argv = ["sh", "-c", pre + 'kill -STOP $$; exec "$@"', "sh", f.S.cfg.testprog, "--module",
            os.path.join(T.SRC, "tests", "progs", "gcr_kernels.h"), "--iters", "5", "--wait"]
    p = f.S.start(name, argv, shim=True, extra_env=f.env)
    wait_for(lambda: open("/proc/%d/stat" % p.pid).read().rsplit(")", 1)[1].split()[0] == "T", 10,
             "sh to stop itself")
    return p


def as_nobody(code, *args):
    return subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                             "-c", code] + list(args), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


SQUAT = ("import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(4);"
         "print('bound', flush=True); sys.stdin.read()")


def case_squatted_name(f):
    """Another user takes the shim's expected name first in a sticky directory: the shim takes
    another, leaves the squatter's socket alone, and clients reach it."""
    if os.geteuid() != 0:
        raise Fail("needs root to act as another user")
    os.chmod(f.dir, 0o1777)
    p = start_stopped(f, "squatted")
    squat_path = sock_path(f, p.pid)
    squatter = as_nobody(SQUAT, squat_path)
    try:
        check(squatter.stdout.readline().strip() == "bound", "the squatter could not bind")
        os.kill(p.pid, signal.SIGCONT)
        m = p.expect(r"READY pid=(\d+)", 60, what="READY")
        check(int(m.group(1)) == p.pid, "READY pid")
        r = status_ok(f, p.pid, "squatted name")
        check(f.ctl("suspend", p.pid).ok and f.ctl("resume", p.pid).ok, "suspend/resume past a squatter")
        st = os.lstat(squat_path)
        check(st.st_uid == 65534, "the squatter's socket was replaced")
        stem = H.shim_socket_name(p.pid)[:-len(".sock")]
        ours = [n for n in os.listdir(f.dir) if n.startswith(stem + "-") and n.endswith(".sock")]
        check(len(ours) == 1 and os.lstat(os.path.join(f.dir, ours[0])).st_uid == 0,
              "the shim's own socket: %s" % os.listdir(f.dir))
        del r
    finally:
        squatter.stdin.close()
        squatter.wait(30)
    p.send("go")
    f.finish(p)


def case_same_pid_two_namespaces(f):
    """Two shims that are both pid 1 of their own PID namespaces share one socket directory:
    both get a socket and both are reachable by their host pids."""
    if os.geteuid() != 0 or not T.shutil.which("unshare"):
        raise Fail("needs root and unshare")
    procs = []
    for k in range(2):
        fake = os.path.join(f.dir, "fake%d" % k)
        os.makedirs(fake)
        argv = ["unshare", "--pid", "--fork", f.S.cfg.testprog, "--module",
                os.path.join(T.SRC, "tests", "progs", "gcr_kernels.h"), "--iters", "5", "--wait"]
        # Sockets of their own (FAKECUDA_DIR), one GPU with gcrctl's (the pool its NVML reads).
        pool = os.path.join(f.env["FAKECUDA_DIR"], "fakecuda-pool")
        p = f.S.start("ns%d" % k, argv, shim=True, extra_env=dict(f.env, FAKECUDA_DIR=fake, FAKECUDA_POOL=pool))
        check(p.expect(r"READY pid=(\d+)", 60, what="READY").group(1) == "1", "not pid 1 in its namespace")
        hp = T.host_pid(p.pid, 1)
        check(hp is not None, "no host pid for ns%d" % k)
        procs.append((p, hp))
    socks = sorted(n for n in os.listdir(f.dir) if n.startswith("gcr-1-"))
    check(len(socks) == 2, "sockets of the two pid-1 shims: %s" % os.listdir(f.dir))
    for p, hp in procs:
        r = f.ctl("status", hp)
        check(r.ok and H.dig(r.data, "shim", "pid") == 1, "status of host pid %d: %s" % (hp, r.describe()))
    p0, hp0 = procs[0]
    check(f.ctl("suspend", hp0).ok, "suspend the first")
    st = f.ctl("status", procs[1][1])
    check(H.dig(st.data, "shim", "state") == "running", "the second was touched: %s" % st.describe())
    check(H.dig(f.ctl("status", hp0).data, "shim", "state") == "suspended", "the first is not suspended")
    check(f.ctl("resume", hp0).ok, "resume the first")
    for p, _ in procs:
        p.send("go")
        f.finish(p)


def case_stale_cleanup(f):
    """A killed process's socket is removed by the next shim starting in the directory, and so is
    another user's dead socket when that shim runs as root (as here; a non-root caller leaves it:
    tests/unit/test_sock.c); a live socket and a plain file are left alone."""
    if os.geteuid() != 0:
        raise Fail("needs root to act as another user")
    os.chmod(f.dir, 0o1777)
    victim = f.start(["--iters", "5", "--wait"], name="victim")
    stale = sock_path(f, victim.pid)
    victim.kill()
    victim.wait_exit(30)
    check(os.path.exists(stale), "precondition: the killed process's socket is still there")
    foreign = os.path.join(f.dir, "gcr-999999-1.sock")
    nb = as_nobody("import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); print('bound')",
                   foreign)
    check(nb.stdout.readline().strip() == "bound" and nb.wait(30) == 0, "nobody's dead socket")
    plain = os.path.join(f.dir, "gcr-999998-1.sock")
    open(plain, "w").close()
    live = socket.socket(socket.AF_UNIX)
    live_path = os.path.join(f.dir, "gcr-999997-1.sock")
    live.bind(live_path)
    live.listen(4)
    try:
        p = f.start(["--iters", "5", "--wait"], name="next")
        wait_for(lambda: not os.path.exists(stale) and not os.path.exists(foreign), 10,
                 "the dead sockets to go")
        status_ok(f, p.pid, "the next shim")
        for keep in (plain, live_path):
            check(os.path.exists(keep), "%s was removed" % keep)
    finally:
        live.close()
    p.send("go")
    f.finish(p)


def case_umask(f):
    """Making its socket leaves the process's umask as it was."""
    p = start_stopped(f, "umask", pre="umask 027; ")
    os.kill(p.pid, signal.SIGCONT)
    p.expect(r"READY pid=(\d+)", 60, what="READY")
    wait_for(lambda: os.path.exists(sock_path(f, p.pid)), 10, "the socket")
    with open("/proc/%d/status" % p.pid) as fh:
        um = re.search(r"^Umask:\s+(\d+)", fh.read(), re.M).group(1)
    check(um == "0027", "umask %s after the socket was made, 0027 before" % um)
    check(os.stat(sock_path(f, p.pid)).st_mode & 0o777 == 0o600, "socket mode")
    p.send("go")
    f.finish(p)


CASES = [
    ("idle-peer", case_idle_peer),
    ("polling-peer", case_polling_peer),
    ("acceptance-50-idle-5-polling", case_acceptance),
    ("flood", case_flood),
    ("full-backlog", case_full_backlog),
    ("fd-exhaustion", case_fd_exhaustion),
    ("abandoned-suspend", case_abandoned_suspend),
    ("squatted-name", case_squatted_name),
    ("same-pid-two-namespaces", case_same_pid_two_namespaces),
    ("stale-cleanup", case_stale_cleanup),
    ("umask", case_umask),
    ("stopped-process", case_stopped_process),
]


def main():
    return T.run_cases(CASES, "hostile", sys.argv)


if __name__ == "__main__":
    sys.exit(main())
