# tests/flow/test_overcommit.py: GPU memory overcommit by suspend (docs/preemption.md) on the
# stand-in driver: gcr-agent without Kubernetes, processes of different priority sharing one
# small stand-in GPU (FAKECUDA_MEM_MIB), each suspended and resumed in the right order,
# their data checked by the test program itself.
"""Needs a build dir (top_builddir): gcr-agent, gcrctl, the shim, gcr-testprog, tests/fakecuda;
root. No Kubernetes: the API server is unreachable, which the agent rides out; pods come from a
fake <procRoot>/<pid>/cgroup and the processes' overcommit settings from a fake
<procRoot>/<pid>/environ (what the agent reads on a node). Each case prints PASS/FAIL; the last
line is 'N passed, N failed'. No sleeps: every wait is on a log line, a program's line or a
polled state, bounded."""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.abspath(os.environ.get("top_builddir", os.path.join(SRC, "build")))
sys.path.insert(0, os.path.join(SRC, "tests", "gpu"))
import harness as H  # noqa: E402

AGENT = os.path.join(BUILD, "node-agent", "gcr-agent")
GCRCTL = os.path.join(BUILD, "node-agent", "gcrctl")
FAKE_DIR = os.path.join(BUILD, "tests", "fakecuda")
FAKESMI = os.path.join(FAKE_DIR, "fakesmi")
CUDA_ERROR_UNKNOWN = 999
MODULE = os.path.join(SRC, "tests", "progs", "gcr_kernels.h")
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: none, user: u}}]
current-context: c
"""
WAIT_S = 60  # the bound on any one wait
# The idle cases' --overcommit-idle-ms; GCR_OC_FLOW_IDLE_MS=0 runs them with the policy off (they
# must fail: nothing then gives an idle requester's victims back).
IDLE_MS = 1500
IDLE_FLAG = os.environ.get("GCR_OC_FLOW_IDLE_MS", str(IDLE_MS))
# case_room_unused's --overcommit-unused-backoff-ms; GCR_OC_FLOW_UNUSED_MS=-1 runs it with the
# back-off off (it must fail: the victim is suspended at every request).
UNUSED_FLAG = os.environ.get("GCR_OC_FLOW_UNUSED_MS", "60000")
HOSTILE = os.path.join(BUILD, "tests", "progs", "gcr-hostile")


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def poll(fn, what, timeout=WAIT_S):
    """fn() until it returns a true value, at most timeout seconds (a bounded poll of state)."""
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > end:
            raise Fail("timed out after %d s waiting for %s" % (timeout, what))
        time.sleep(0.05)


class Node:
    """A work dir standing for a node: the agent's dirs, a fake /proc, one stand-in GPU."""

    def __init__(self, mem_mib):
        self.dir = tempfile.mkdtemp(prefix="gcr-overcommit-")
        self.cfg = H.Config()
        self.cfg.log_dir = os.path.join(self.dir, "logs")
        self.cfg.shim = os.path.join(BUILD, "shim", ".libs", "libgcr.so")
        prefix = os.environ.get("GCR_TEST_PRELOAD_PREFIX", "")
        if prefix:
            self.cfg.shim = prefix + ":" + self.cfg.shim
        self.cfg.testprog = os.path.join(BUILD, "tests", "progs", "gcr-testprog")
        self.cfg.gcrctl = GCRCTL
        self.sock = os.path.join(self.dir, "sock")
        self.records = os.path.join(self.dir, "records")
        self.proc = os.path.join(self.dir, "proc")
        self.fake = os.path.join(self.dir, "fake")
        for d in (self.sock, self.proc, self.fake):
            os.makedirs(d)
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            f.write(KUBECONFIG)
        # The agent, gcrctl and every process see the same stand-in GPU (and NVML on it).
        self.env = {"LD_LIBRARY_PATH": FAKE_DIR, "FAKECUDA_DIR": self.fake, "FAKECUDA_MEM_MIB": str(mem_mib),
                    "GCR_RESTORE_MARGIN_MIB": "8", "GCR_SOCKET_DIR": self.sock}
        os.environ.update(self.env)
        self.registry = os.path.join(self.sock, "agent", "agent.sock")
        self.port = free_port()
        self.agent = None
        self.procs = []
        self.n = 0

    def start_agent(self, *flags, real_proc=False):
        """real_proc: the machine's /proc and processes outside pods (the GPU measurement's way)."""
        self.real_proc = real_proc
        argv = [AGENT, "--kubeconfig", self.kubeconfig, "--node-name", "node-oc", "--socket-dir", self.sock,
                "--record-dir", self.records, "--metrics-address", "127.0.0.1:%d" % self.port,
                "--proc-root", "/proc" if real_proc else self.proc, *flags]
        if real_proc:
            argv += ["--processes-outside-pods", "true"]
        p = H.Proc(self.cfg, "agent", ["sh", "-c", 'exec "$@" 2>&1', "sh"] + argv,
                   extra_env=dict(self.env, GCR_LOG_LEVEL="info"))
        self.procs.append(p)
        p.expect(r".*overcommit.*policy (on|off)", WAIT_S, what="the overcommit policy's start line")
        self.agent = p
        return p

    def stop_agent(self):
        self.agent.p.send_signal(signal.SIGTERM)
        check(self.agent.p.wait(WAIT_S) == 0, "agent exit status")
        self.agent = None

    def start(self, name, mib, prio=None, opt_in=True, preemptible=True, buffers=4, extra_env=None, linger=False,
              hold_after=False, program=None):
        """gcr-testprog under the shim (or program, an argv); it starts (and registers) only once
        its pid has a pod and an environment in the fake /proc."""
        self.n += 1
        env = {"LD_PRELOAD": self.cfg.shim, "GCR_LOG_LEVEL": "info", "GCR_AGENT_SOCKET": self.registry}
        environ = {}
        if opt_in:
            environ["GCR_OVERCOMMIT"] = "1"
        if prio is not None:
            environ["GCR_PRIORITY"] = str(prio)
        if not preemptible:
            environ["GCR_PREEMPTIBLE"] = "0"
        env.update(environ)
        env.update(extra_env or {})
        argv = ["sh", "-c", 'read go && exec env "$@"', "sh"] + ["%s=%s" % kv for kv in env.items()] + \
            (program or [self.cfg.testprog, "--module", MODULE, "--mib", str(mib), "--buffers", str(buffers),
                         "--threads", "1", "--iters", "3", "--wait"] + (["--linger"] if linger else []) +
             (["--hold-after"] if hold_after else []))
        p = H.Proc(self.cfg, name, argv, extra_env=self.env)
        self.procs.append(p)
        p.uid = ""
        if getattr(self, "real_proc", False):
            p.send("go")  # its own environment, read from /proc/<pid>/environ
            return p
        d = os.path.join(self.proc, str(p.pid))
        os.makedirs(d)
        uid = "0c0c0c0c-0000-4000-8000-%012d" % self.n
        with open(os.path.join(d, "cgroup"), "w") as f:
            f.write("0::/kubepods.slice/kubepods-pod%s.slice/cri-containerd-%064x.scope\n"
                    % (uid.replace("-", "_"), self.n))
        with open(os.path.join(d, "environ"), "wb") as f:
            f.write(b"".join(("%s=%s" % kv).encode() + b"\0" for kv in environ.items()))
        p.uid = uid
        p.send("go")
        return p

    def ready(self, p):
        m = p.expect(r"READY pid=(\d+)|ERROR ", WAIT_S, what="READY of %s" % p.name)
        check(m.group(0).startswith("READY"), "%s: %s" % (p.name, m.group(0)))
        check(int(m.group(1)) == p.pid, "READY pid %s != %d" % (m.group(1), p.pid))
        # Registered: the agent has it (it reads the fake environ at registration).
        self.agent_line(r"registered pid %d " % p.pid)

    def agent_line(self, pattern, since=0, timeout=WAIT_S):
        """Waits for an agent log line matching pattern (anywhere after line since)."""
        rx = re.compile(pattern)
        return poll(lambda: next((l for l in self.agent.lines[since:] if rx.search(l)), None),
                    "agent line /%s/" % pattern, timeout)

    def agent_mark(self):
        return len(self.agent.lines)

    def state(self, p):
        return H.state_of(H.gcrctl(self.cfg, self.sock, "status", p.pid))

    def finish(self, p):
        """Runs p's iterations and its own exact check of every buffer; it must print RESULT ok."""
        p.send("go")
        p.expect(r"^DONE", WAIT_S, what="DONE of %s" % p.name)
        p.send("check")
        m = p.expect(r"RESULT (\w+)|ERROR |FAIL", WAIT_S, what="RESULT of %s" % p.name)
        check(m.group(0) == "RESULT ok", "%s: %s" % (p.name, m.group(0)))
        check(p.p.wait(WAIT_S) == 0, "%s exit status" % p.name)

    def checked(self, p):
        """p's own exact check of every buffer (after DONE): RESULT ok; it lives on (--hold-after)
        or exits, as it was started."""
        p.send("check")
        m = p.expect(r"RESULT (\w+)|ERROR |FAIL", WAIT_S, what="RESULT of %s" % p.name)
        check(m.group(0) == "RESULT ok", "%s: %s" % (p.name, m.group(0)))

    def ran_checked(self, p):
        """p's iterations, then its check (it keeps its memory with --hold-after)."""
        p.send("go")
        p.expect(r"^DONE", WAIT_S, what="DONE of %s" % p.name)
        self.checked(p)

    def end_pair(self, high, low, mark):
        """high checks its data and ends; low, held for it, comes back; low ends (--hold-after)."""
        self.checked(high)
        check(high.p.wait(WAIT_S) == 0, "high exit status")
        self.agent_line(r"resumed pid %d .*it was held for is gone" % low.pid, mark)
        low.send("exit")
        check(low.p.wait(WAIT_S) == 0, "low exit status")

    def oom(self, p):
        """p's allocation failed with out-of-memory, as without GCR (gcr-testprog exits 2)."""
        m = p.expect(r"READY|ERROR (\S+) (\S+)", WAIT_S, what="the allocation's failure in %s" % p.name)
        check(m.group(0).startswith("ERROR") and m.group(2) == "CUDA_ERROR_OUT_OF_MEMORY",
              "%s: want CUDA_ERROR_OUT_OF_MEMORY, got %s" % (p.name, m.group(0)))
        check(p.p.wait(WAIT_S) == 2, "%s exit status" % p.name)

    def metrics(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=10) as r:
            return r.read().decode()

    def close(self):
        for p in self.procs:
            if p.p.poll() is None:
                p.kill()
        os.environ.pop("FAKECUDA_MEM_MIB", None)
        if os.environ.get("GCR_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)


def held(n, p):
    return n.state(p) == "suspended"


def gate_waits(n, p):
    """Calls of p that waited at its closed gate (its shim's stats)."""
    st = H.gcrctl(n.cfg, n.sock, "stats", p.pid)
    return H.dig(st.data, "gate", "waits") or 0


def gate_shim_state(n, p):
    """The shim's own state (a data-only suspend leaves the driver running)."""
    return H.dig(H.gcrctl(n.cfg, n.sock, "status", p.pid).data, "shim", "state")


def inject(p, func, nth):
    """Arms a fault in p's stand-in driver: its nth call of func fails."""
    out = subprocess.run([FAKESMI, "fail", str(p.pid), func, str(nth), str(CUDA_ERROR_UNKNOWN)],
                         capture_output=True, text=True, timeout=30)
    check(out.returncode == 0, "fakesmi fail: %s" % out.stderr.strip())


def disarm(p):
    """Removes p's armed faults; how many had not fired."""
    out = subprocess.run([FAKESMI, "disarm", str(p.pid)], capture_output=True, text=True, timeout=30)
    check(out.returncode == 0, "fakesmi disarm: %s" % out.stderr.strip())
    return int(out.stdout.strip())


def metric(n, name, pod):
    m = re.search(r'%s\{pod="%s"\} ([\d.]+)' % (name, re.escape(pod)), n.metrics())
    return float(m.group(1)) if m else None


# ---- cases ----

def case_two(n):
    """A low-priority process holds most of the GPU; a high-priority one allocates past it: the
    low one is suspended (a record says for whom), the allocation succeeds; once the high one
    ends, the low one is resumed and its data is bit-exact."""
    n.start_agent()
    low = n.start("low", 192, prio=1)
    n.ready(low)
    high = n.start("high", 384, prio=10)
    n.ready(high)
    check(held(n, low), "low not suspended while high runs: %s" % n.state(low))
    rec = os.path.join(n.records, "overcommit", "%d.json" % low.pid)
    check(os.path.exists(rec), "no record of the hold at %s" % rec)
    check(re.search(r'gcr_agent_overcommit_suspensions_total\{pod="%s"\} 1' % low.uid, n.metrics()),
          "suspension not counted in /metrics")
    mark = n.agent_mark()
    n.finish(high)
    n.agent_line(r"resumed pid %d " % low.pid, mark)
    check(n.state(low) == "running", "low after its resume: %s" % n.state(low))
    poll(lambda: not os.path.exists(rec), "record %s removed after the resume" % rec)
    n.finish(low)
    check(re.search(r'gcr_agent_overcommit_resumes_total\{pod="%s"\} 1' % low.uid, n.metrics()),
          "resume not counted in /metrics")


def case_just_enough(n):
    """Three processes: the high one needs room one process can give: only the lowest priority is
    suspended, the middle one keeps running."""
    n.start_agent()
    a = n.start("a-prio1", 160, prio=1)
    n.ready(a)
    b = n.start("b-prio5", 160, prio=5)
    n.ready(b)
    c = n.start("c-prio10", 256, prio=10)
    n.ready(c)
    check(held(n, a), "a (priority 1) not suspended: %s" % n.state(a))
    check(n.state(b) == "running", "b (priority 5) suspended though a alone made room: %s" % n.state(b))
    mark = n.agent_mark()
    n.finish(c)
    n.agent_line(r"resumed pid %d " % a.pid, mark)
    n.finish(b)
    n.finish(a)


def case_order(n):
    """Three processes; the high one needs both others' memory: both suspended, the lower
    priority first; once it ends they are resumed highest priority first, both bit-exact."""
    n.start_agent()
    a = n.start("a-prio1", 160, prio=1)
    n.ready(a)
    b = n.start("b-prio5", 160, prio=5)
    n.ready(b)
    c = n.start("c-prio10", 448, prio=10)
    n.ready(c)
    check(held(n, a) and held(n, b), "a %s, b %s: want both suspended" % (n.state(a), n.state(b)))
    n.agent_line(r"suspended pid %d " % a.pid)  # logged before the reply; read by another thread
    n.agent_line(r"suspended pid %d " % b.pid)
    lines = n.agent.lines
    sa = [i for i, l in enumerate(lines) if re.search(r"suspended pid %d " % a.pid, l)]
    sb = [i for i, l in enumerate(lines) if re.search(r"suspended pid %d " % b.pid, l)]
    check(sa and sb and sa[0] < sb[0], "suspend order: a at %s, b at %s (want a first)" % (sa, sb))
    mark = n.agent_mark()
    n.finish(c)
    n.agent_line(r"resumed pid %d " % a.pid, mark)
    n.agent_line(r"resumed pid %d " % b.pid, mark)
    lines = n.agent.lines[mark:]
    ra = [i for i, l in enumerate(lines) if re.search(r"resumed pid %d " % a.pid, l)]
    rb = [i for i, l in enumerate(lines) if re.search(r"resumed pid %d " % b.pid, l)]
    check(ra and rb and rb[0] < ra[0], "resume order: b at %s, a at %s (want b, priority 5, first)" % (rb, ra))
    n.finish(a)
    n.finish(b)


def case_never(n):
    """The low-priority process says never suspend me (GCR_PREEMPTIBLE=0): the high one's
    allocation fails with out-of-memory, the low one is never touched."""
    n.start_agent()
    low = n.start("low-never", 192, prio=1, preemptible=False)
    n.ready(low)
    high = n.start("high", 384, prio=10)
    n.oom(high)
    check(n.state(low) == "running", "never-suspend process: %s" % n.state(low))
    check(not any(re.search(r"suspended pid %d " % low.pid, l) for l in n.agent.lines), "suspend logged")
    n.finish(low)


def case_policy_off(n):
    """--overcommit false: the same two processes as case_two, the high one gets out-of-memory
    (this is the case that fails when the policy does nothing)."""
    n.start_agent("--overcommit", "false")
    low = n.start("low", 192, prio=1)
    n.ready(low)
    high = n.start("high", 384, prio=10)
    n.oom(high)
    n.agent_line(r"overcommit is off")
    check(n.state(low) == "running", "low: %s" % n.state(low))
    n.finish(low)


def case_env_untrusted(n):
    """--overcommit-env false (the chart's setting): processes whose pod the agent does not see
    (here: no API server) take no part, whatever their environment says: out-of-memory."""
    n.start_agent("--overcommit-env", "false")
    low = n.start("low", 192, prio=1)
    n.ready(low)
    high = n.start("high", 384, prio=10)
    n.oom(high)
    n.agent_line(r"pid %d has not opted in" % high.pid)
    check(n.state(low) == "running", "low: %s" % n.state(low))
    n.finish(low)


def case_opt_in(n):
    """Only opted-in processes take part: a requester whose process did not opt in (its shim asks,
    its environ as the agent reads it says no) is refused; a low-priority process that did not opt
    in is never suspended."""
    n.start_agent()
    low = n.start("low", 192, prio=1)
    n.ready(low)
    high = n.start("high-not-in", 384, prio=10, opt_in=False, extra_env={"GCR_OVERCOMMIT": "1"})
    n.oom(high)
    n.agent_line(r"pid %d has not opted in" % high.pid)
    check(n.state(low) == "running", "low: %s" % n.state(low))
    n.finish(low)
    other = n.start("low-not-in", 192, prio=1, opt_in=False)
    n.ready(other)
    high2 = n.start("high2", 384, prio=10)
    n.oom(high2)
    check(n.state(other) == "running", "a process that did not opt in was suspended: %s" % n.state(other))
    n.finish(other)


def case_not_enough(n):
    """Lower-priority memory cannot cover the allocation: nobody is suspended, the application
    gets out-of-memory. Twice: an allocation larger than the GPU, and one that the low process's
    memory cannot cover because a never-suspend process holds the rest."""
    n.start_agent()
    low = n.start("low", 128, prio=1)
    n.ready(low)
    high = n.start("high", 1200, prio=10, buffers=1)
    n.oom(high)
    n.agent_line(r"more than GPU")
    check(n.state(low) == "running", "low suspended for nothing: %s" % n.state(low))
    keep = n.start("keep-never", 192, prio=0, preemptible=False)
    n.ready(keep)
    high2 = n.start("high2", 352, prio=10, buffers=1)
    n.oom(high2)
    n.agent_line(r"may be suspended hold")
    n.finish(keep)
    check(n.state(low) == "running", "low suspended for nothing: %s" % n.state(low))
    n.finish(low)


def case_bound(n):
    """An agent that does not answer (stopped): the allocation gets out-of-memory within
    GCR_ROOM_TIMEOUT_MS, not later."""
    n.start_agent()
    low = n.start("low", 192, prio=1)
    n.ready(low)
    os.kill(n.agent.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        high = n.start("high", 384, prio=10, extra_env={"GCR_ROOM_TIMEOUT_MS": "1500"})
        n.oom(high)
        took = time.monotonic() - t0
        check(took < 1.5 + 5.0, "out-of-memory after %.1f s (bound 1.5 s + start-up)" % took)
    finally:
        os.kill(n.agent.pid, signal.SIGCONT)
    check(n.state(low) == "running", "low: %s" % n.state(low))
    n.finish(low)


def case_restart(n):
    """The agent is restarted while the low process is held: the next agent finds the record and
    resumes it once the high one ends; data bit-exact."""
    n.start_agent()
    low = n.start("low", 192, prio=1)
    n.ready(low)
    high = n.start("high", 384, prio=10)
    n.ready(high)
    check(held(n, low), "low: %s" % n.state(low))
    n.stop_agent()
    check(held(n, low), "low after the agent stopped: %s" % n.state(low))
    n.start_agent()
    n.agent_line(r"pid %d \(priority 1\) held since an earlier agent" % low.pid)
    mark = n.agent_mark()
    n.finish(high)
    n.agent_line(r"resumed pid %d " % low.pid, mark)
    n.finish(low)


def case_data_only(n):
    """--overcommit-mode data: the victim's buffers leave the GPU, its context stays (the shim says
    suspended, the driver running); the high one's allocation fits; the victim comes back bit-exact."""
    n.start_agent("--overcommit-mode", "data")
    low = n.start("low", 192, prio=1)
    n.ready(low)
    high = n.start("high", 384, prio=10)
    n.ready(high)
    st = H.gcrctl(n.cfg, n.sock, "status", low.pid)
    check(H.dig(st.data, "shim", "state") == "suspended" and H.driver_state_of(st) == "running",
          "low: shim %s, driver %s (want suspended, running)" % (H.dig(st.data, "shim", "state"),
                                                                H.dig(st.data, "driver")))
    n.agent_line(r"data-only suspends")
    mark = n.agent_mark()
    n.finish(high)
    n.agent_line(r"resumed pid %d " % low.pid, mark)
    check(H.dig(H.gcrctl(n.cfg, n.sock, "status", low.pid).data, "shim", "state") == "running", "low not running")
    n.finish(low)


def case_room_returned(n):
    """The high process frees its memory and lives on (gcr-testprog --linger): with the default
    --overcommit-return-ms the low one is resumed once the GPU has had room for it that long,
    while the high one still runs; bit-exact."""
    n.start_agent()
    low = n.start("low", 192, prio=1)
    n.ready(low)
    high = n.start("high", 384, prio=10, linger=True)
    n.ready(high)
    check(held(n, low), "low not suspended while high runs: %s" % n.state(low))
    mark = n.agent_mark()
    high.send("go")
    high.expect(r"^DONE", WAIT_S, what="DONE of high")
    n.checked(high)
    high.expect(r"^FREED", WAIT_S, what="FREED of high")
    n.agent_line(r"resumed pid %d .*room returned: \d+ MiB free on \S+ for [\d.]+ s while pid %d runs"
                 % (low.pid, high.pid), mark)
    check(high.p.poll() is None, "high ended before low's resume: not a return of freed memory")
    check(n.state(low) == "running", "low after its resume: %s" % n.state(low))
    n.finish(low)
    high.send("exit")
    check(high.p.wait(WAIT_S) == 0, "high exit status")


def case_outside_pods(n):
    """gcr-agent on a machine without Kubernetes (--processes-outside-pods, the real /proc): the
    processes' own environment opts them in and ranks them; the low one is suspended for the high
    one and resumed after it, bit-exact (how the GPU measurement runs). With --hold-driver the
    agent opens the driver at start and says so."""
    n.start_agent("--hold-driver", "true", real_proc=True)
    n.agent_line(r"CUDA driver open in \d+ ms, held while the agent runs", 0)
    low = n.start("low", 192, prio=1)
    n.ready(low)
    high = n.start("high", 384, prio=10)
    n.ready(high)
    check(held(n, low), "low not suspended while high runs: %s" % n.state(low))
    check(re.search(r'gcr_agent_overcommit_suspensions_total\{pod="pid/%d"\} 1' % low.pid, n.metrics()),
          "suspension not counted under pid/%d" % low.pid)
    mark = n.agent_mark()
    n.finish(high)
    n.agent_line(r"resumed pid %d " % low.pid, mark)
    n.finish(low)


def case_idle_wake(n):
    """The requester idles, holding its memory (gcr-testprog --wait: no driver call until 'go'):
    after --overcommit-idle-ms it is suspended itself and the victim it was held for is resumed,
    bit-exact, while it idles; its next call wakes it: the victim is suspended again, the
    requester resumed, its data bit-exact; once it ends the victim comes back."""
    n.start_agent("--overcommit-idle-ms", IDLE_FLAG)
    low = n.start("low", 192, prio=1, hold_after=True)
    n.ready(low)
    mark = n.agent_mark()
    high = n.start("high", 384, prio=10)
    n.ready(high)
    check(held(n, low), "low not suspended while high runs: %s" % n.state(low))
    # Bound: the idle time, the checks' pace (500 ms) and a suspend and a resume, with room.
    line = n.agent_line(r"suspended idle pid %d .* after ([\d.]+) s without a GPU call" % high.pid, mark,
                        timeout=IDLE_MS / 1000 + 15)
    idle_s = float(re.search(r"after ([\d.]+) s without", line).group(1))
    check(idle_s >= IDLE_MS / 1000, "suspended after %.1f s idle, before the threshold" % idle_s)
    n.agent_line(r"resumed pid %d .*it was held for is suspended for idling" % low.pid, mark)
    # Data only, whatever the victims' mode (its next call must reach the shim's gate).
    check(gate_shim_state(n, high) == "suspended", "high after its idle suspend: %s" % gate_shim_state(n, high))
    check(n.state(low) == "running", "low after its resume: %s" % n.state(low))
    check(metric(n, "gcr_agent_overcommit_idle_suspensions_total", high.uid) == 1, "idle suspension not counted")
    # The victim's data, while the requester idles suspended: bit-exact (it then holds it, idle).
    n.ran_checked(low)
    # The requester's next call wakes it: low suspended again for it, then high resumed.
    mark = n.agent_mark()
    high.send("go")
    high.expect(r"^DONE", WAIT_S, what="DONE of high (its call woken)")
    check(held(n, low), "low not suspended again for the woken high: %s" % n.state(low))
    lines = n.agent.lines[mark:]
    sl = [i for i, l in enumerate(lines) if re.search(r"suspended pid %d .* for pid %d " % (low.pid, high.pid), l)]
    rh = [i for i, l in enumerate(lines) if re.search(r"resumed pid %d .*it called the GPU" % high.pid, l)]
    check(sl and rh and sl[0] < rh[0], "wake order: low suspended at %s, high resumed at %s" % (sl, rh))
    n.agent_line(r"pid %d woken: its first call waited [\d.]+ ms" % high.pid, mark)
    check(metric(n, "gcr_agent_overcommit_wakes_total", high.uid) == 1, "wake not counted")
    check(any(re.search(r"wake sent", l) for l in list(high.err_tail)), "high's shim did not say it sent the wake")
    n.end_pair(high, low, n.agent_mark())


def case_idle_faults(n):
    """The idle requester's suspend fails (a copy out fails): it runs on, untouched, its victim
    stays held, and it is tried again after another idle period; its wake's resume fails (a copy
    in fails): it stays suspended (the victim suspended for it is given back), and the next check
    makes room and resumes it; both bit-exact."""
    n.start_agent("--overcommit-idle-ms", IDLE_FLAG)
    low = n.start("low", 192, prio=1, hold_after=True)
    n.ready(low)
    high = n.start("high", 384, prio=10)
    n.ready(high)
    mark = n.agent_mark()
    inject(high, "cuMemcpyDtoHAsync", 1)
    n.agent_line(r"idle pid %d .* not suspended: .*tried again after another" % high.pid, mark,
                 timeout=IDLE_MS / 1000 + 15)
    check(disarm(high) == 0, "the fault in the idle suspend did not fire")
    check(gate_shim_state(n, high) == "running", "high after its failed suspend: %s" % gate_shim_state(n, high))
    check(held(n, low), "low after high's failed idle suspend: %s" % n.state(low))
    n.agent_line(r"suspended idle pid %d " % high.pid, mark, timeout=IDLE_MS / 1000 + 15)
    n.agent_line(r"resumed pid %d .*suspended for idling" % low.pid, mark)
    n.ran_checked(low)
    mark = n.agent_mark()
    inject(high, "cuMemcpyHtoDAsync", 1)
    high.send("go")
    n.agent_line(r"woken pid %d \(priority 10\) stays suspended" % high.pid, mark)
    high.expect(r"^DONE", WAIT_S, what="DONE of high (resumed at the next check)")
    check(disarm(high) == 0, "the fault in the wake's resume did not fire")
    n.agent_line(r"resumed pid %d .*it called the GPU" % high.pid, mark)
    check(held(n, low), "low not suspended for the woken high: %s" % n.state(low))
    n.end_pair(high, low, mark)


def case_idle_host_full(n):
    """The idle requester's buffers would not fit in the host's available memory (the node's
    meminfo, here the fake /proc's): it is not suspended, its victim stays held; once the host has
    room, the next idle period suspends it and the victim comes back, bit-exact."""
    meminfo = os.path.join(n.proc, "meminfo")
    with open(meminfo, "w") as f:
        f.write("MemTotal:       1048576 kB\nMemAvailable:     102400 kB\n")  # 100 MiB
    n.start_agent("--overcommit-idle-ms", IDLE_FLAG)
    low = n.start("low", 192, prio=1)
    n.ready(low)
    high = n.start("high", 384, prio=10)
    n.ready(high)
    mark = n.agent_mark()
    n.agent_line(r"idle pid %d .* not suspended: its 38\d MiB of buffers do not fit in the host's 100 MiB"
                 % high.pid, mark, timeout=IDLE_MS / 1000 + 15)
    check(gate_shim_state(n, high) == "running", "high: %s" % gate_shim_state(n, high))
    check(held(n, low), "low: %s" % n.state(low))
    with open(meminfo, "w") as f:
        f.write("MemTotal:       1048576 kB\nMemAvailable:     921600 kB\n")  # 900 MiB
    n.agent_line(r"suspended idle pid %d " % high.pid, mark, timeout=IDLE_MS / 1000 + 15)
    n.agent_line(r"resumed pid %d .*suspended for idling" % low.pid, mark)
    n.finish(low)
    high.send("go")
    high.expect(r"^DONE", WAIT_S, what="DONE of high (woken)")
    n.checked(high)
    check(high.p.wait(WAIT_S) == 0, "high exit status")


def case_idle_restart(n):
    """The agent restarts while the idle requester is suspended: the next agent reads its record;
    the requester's call registers its shim with the new agent and wakes it there (the victim
    suspended again); both bit-exact."""
    n.start_agent("--overcommit-idle-ms", IDLE_FLAG)
    low = n.start("low", 192, prio=1)
    n.ready(low)
    mark = n.agent_mark()
    high = n.start("high", 384, prio=10)
    n.ready(high)
    n.agent_line(r"suspended idle pid %d " % high.pid, mark, timeout=IDLE_MS / 1000 + 15)
    n.agent_line(r"resumed pid %d " % low.pid, mark)
    n.stop_agent()
    n.start_agent("--overcommit-idle-ms", IDLE_FLAG)
    n.agent_line(r"pid %d \(priority 10\) suspended for idling since an earlier agent" % high.pid)
    mark = n.agent_mark()
    high.send("go")
    high.expect(r"^DONE", WAIT_S, what="DONE of high (woken by the new agent)")
    n.agent_line(r"resumed pid %d .*it called the GPU" % high.pid, mark)
    check(held(n, low), "low not suspended again for the woken high: %s" % n.state(low))
    n.checked(high)
    check(high.p.wait(WAIT_S) == 0, "high exit status")
    n.agent_line(r"resumed pid %d .*is gone" % low.pid, mark)
    n.finish(low)


def case_wake_lost(n):
    """The idle requester calls while no agent listens (issue 33: an agent killed within ~150 ms of
    that call): its shim sends its one wake to the agent, which is stopped and then killed with it
    unread. The next agent reads the hold's record, asks the shim (its status says "wake":
    "called") and wakes it: the victim is suspended again, the requester's call goes through,
    both bit-exact. Without that, the requester stays suspended for good."""
    n.start_agent("--overcommit-idle-ms", IDLE_FLAG)
    low = n.start("low", 192, prio=1)
    n.ready(low)
    mark = n.agent_mark()
    high = n.start("high", 384, prio=10)
    n.ready(high)
    n.agent_line(r"suspended idle pid %d " % high.pid, mark, timeout=IDLE_MS / 1000 + 15)
    n.agent_line(r"resumed pid %d " % low.pid, mark)
    # The agent stops reading; the call's wake goes into its socket and dies with it.
    n.agent.p.send_signal(signal.SIGSTOP)
    try:
        high.send("go")
        poll(lambda: any("wake sent" in l for l in list(high.err_tail)), "high's shim to send its wake")
        st = H.gcrctl(n.cfg, n.sock, "status", high.pid)
        check(H.dig(st.data, "shim", "wake", "state") == "called", "high's status after its call: %s"
              % H.dig(st.data, "shim"))
    finally:
        n.agent.p.send_signal(signal.SIGKILL)
        n.agent.p.wait(WAIT_S)
    n.start_agent("--overcommit-idle-ms", IDLE_FLAG)
    mark = 0
    high.expect(r"^DONE", WAIT_S, what="DONE of high (woken by the new agent from its status)")
    n.agent_line(r"pid %d \(priority 10\) called while no agent listened" % high.pid, mark)
    n.agent_line(r"resumed pid %d .*it called the GPU" % high.pid, mark)
    check(held(n, low), "low not suspended again for the woken high: %s" % n.state(low))
    n.checked(high)
    check(high.p.wait(WAIT_S) == 0, "high exit status")
    n.agent_line(r"resumed pid %d .*is gone" % low.pid, mark)
    n.finish(low)


def case_victim_called(n):
    """A victim's thread calls while it is held (data mode: the call reaches the shim's gate): its
    shim tells the agent, which keeps it suspended since the process it was held for runs at a
    higher priority; once that one ends it is resumed, the waiting call goes through, bit-exact."""
    n.start_agent("--overcommit-mode", "data")
    low = n.start("low", 192, prio=1)
    n.ready(low)
    high = n.start("high", 384, prio=10)
    n.ready(high)
    check(gate_shim_state(n, low) == "suspended", "low: %s" % gate_shim_state(n, low))
    mark = n.agent_mark()
    low.send("go")
    n.agent_line(r"pid %d \(priority 1, held for another\) called while suspended" % low.pid, mark)
    n.agent_line(r"pid %d stays suspended: pid %d it was held for" % (low.pid, high.pid), mark)
    check(gate_shim_state(n, low) == "suspended", "low after its call: %s" % gate_shim_state(n, low))
    check(not any(l.startswith("ITER") or l == "DONE" for l in low.lines), "low ran while suspended")
    n.finish(high)
    n.agent_line(r"pid %d woken: its first call waited [\d.]+ ms" % low.pid, mark)
    low.expect(r"^DONE", WAIT_S, what="DONE of low (its waiting call through)")
    n.checked(low)
    check(metric(n, "gcr_agent_overcommit_wakes_total", low.uid) == 1, "the wake not counted")


def case_gcrctl_not_woken(n):
    """A process suspended by gcrctl (not by overcommit) whose thread reaches the closed gate is
    not woken: its shim sends no wake, the agent resumes nothing; it runs once gcrctl resumes it."""
    n.start_agent("--overcommit-idle-ms", IDLE_FLAG)
    p = n.start("solo", 128, prio=5)
    n.ready(p)
    # Data only (--no-driver): its next call then reaches the shim's gate (after the driver's
    # checkpoint it would block inside the driver, where no shim sees it).
    r = H.gcrctl(n.cfg, n.sock, "suspend", p.pid, flags=("--no-driver",))
    check(r.rc == 0 and gate_shim_state(n, p) == "suspended", "gcrctl suspend: rc %s %s" % (r.rc, r.error))
    mark = n.agent_mark()
    p.send("go")
    poll(lambda: gate_waits(n, p) >= 1, "solo's call at the closed gate")
    # Several of the agent's checks (every 500 ms) and its idle threshold pass: still suspended.
    end = time.monotonic() + IDLE_MS / 1000 + 2.0
    while time.monotonic() < end:
        check(gate_shim_state(n, p) == "suspended", "the gcrctl-suspended process was resumed")
        time.sleep(0.1)
    check(not any(re.search(r"pid %d .*called while suspended|wake from pid %d" % (p.pid, p.pid), l)
                  for l in n.agent.lines[mark:]), "the agent heard a wake from it")
    check(not any("wake sent" in l for l in list(p.err_tail)), "its shim sent a wake")
    r = H.gcrctl(n.cfg, n.sock, "resume", p.pid, flags=("--no-driver",))
    check(r.rc == 0, "gcrctl resume: rc %s %s" % (r.rc, r.error))
    n.finish(p)


def case_room_unused(n):
    """Room without need (issue 33): a high-priority process that holds no GPU memory asks for
    256 MiB every 0.5 s and never allocates (gcr-hostile). The first request suspends the low
    one; the room is not used (free again, or 3 s passed), so the asker loses its priority (its requests refused
    for --overcommit-unused-backoff-ms) and the low one is resumed at once: suspended once, not at
    each request, its data bit-exact. GCR_OC_FLOW_UNUSED_MS=-1 makes it fail."""
    n.start_agent("--overcommit-unused-backoff-ms", UNUSED_FLAG, "--overcommit-return-ms", "500")
    low = n.start("low", 384, prio=1, hold_after=True)
    n.ready(low)
    mark = n.agent_mark()
    asker = n.start("asker", 0, prio=10, program=[HOSTILE, "room", str(256 << 20), "16", "500"])
    m = asker.expect(r"ROOM sent=\d+ answered=(\d+) granted=(\d+) denied=(\d+)", WAIT_S, what="the asker's summary")
    suspends = len([x for x in n.agent.lines[mark:] if re.search(r"suspended pid %d " % low.pid, x)])
    check(suspends == 1, "the low one was suspended %d times for a process that used no room (%s)"
          % (suspends, m.group(0)))
    n.agent_line(r"pid %d .*did not use it .*loses its priority" % asker.pid, mark)
    n.agent_line(r"resumed pid %d .*did not use the room it was given" % low.pid, mark)
    n.agent_line(r"pid %d: no room .*did not use it: its requests are refused" % asker.pid, mark)
    poll(lambda: n.state(low) == "running", "the low one running")
    n.ran_checked(low)


CASES = [(case_two, 512), (case_just_enough, 512), (case_order, 512), (case_never, 512), (case_policy_off, 512), (case_opt_in, 512), (case_env_untrusted, 512),
         (case_not_enough, 512), (case_bound, 512), (case_restart, 512), (case_data_only, 512),
         (case_room_returned, 512), (case_outside_pods, 512), (case_idle_wake, 512), (case_idle_faults, 512), (case_idle_host_full, 512),
         (case_idle_restart, 512), (case_wake_lost, 512), (case_victim_called, 512),
         (case_gcrctl_not_woken, 512), (case_room_unused, 512)]


def main():
    if os.geteuid() != 0:
        print("FAIL: needs root (the agent's record dir, gcrctl on other processes)")
        return 1
    want = set(sys.argv[1:])
    passed = failed = 0
    for fn, mem in CASES:
        name = fn.__name__[5:]
        if want and name not in want:
            continue
        n = Node(mem)
        try:
            fn(n)
            print("PASS %s" % name, flush=True)
            passed += 1
        except Exception as e:  # noqa: BLE001
            print("FAIL %s: %s" % (name, e), flush=True)
            if not isinstance(e, Fail):
                traceback.print_exc()
            for p in n.procs:
                print(p.tail(15))
            failed += 1
        finally:
            n.close()
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
