# tests/flow/test_agent_paths.py: gcr-agent's own paths on a bare node: the defaults derived from
# --socket-dir work together, a conflicting configuration is refused by name, and a shim running
# as a non-root user registers on the registry socket (failures said at WARN on both sides).
"""Needs a build dir (top_builddir): gcr-agent, the shim, gcr-testprog, tests/fakecuda; root and
setpriv (a shim as uid 65534). No Kubernetes: the API server is unreachable, which the agent
rides out; pods come from a fake <procRoot>/<pid>/cgroup. Each case prints PASS/FAIL; the last
line is 'N passed, N failed'. No sleeps: every wait is on a log or protocol line, bounded."""

import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import traceback
import urllib.request

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.abspath(os.environ.get("top_builddir", os.path.join(SRC, "build")))
sys.path.insert(0, os.path.join(SRC, "tests", "gpu"))
import harness as H  # noqa: E402

AGENT = os.path.join(BUILD, "node-agent", "gcr-agent")
FAKE_DIR = os.path.join(BUILD, "tests", "fakecuda")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
POD = "1f0c5b0e-9d7a-4c2b-8e6f-3a4b5c6d7e8f"
CID = "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: none, user: u}}]
current-context: c
"""


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


class Node:
    """A work dir standing for a node: kubelet dir, shim dir, fake /proc, and the agent's flags."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gcr-agent-paths-")
        os.chmod(self.dir, 0o711)  # as /run: a non-root process may pass through it
        self.cfg = H.Config()
        self.cfg.log_dir = os.path.join(self.dir, "logs")
        self.cfg.shim = os.path.join(BUILD, "shim", ".libs", "libgcr.so")
        # Sanitizer builds need the ASan runtime first in a preloaded process (tests/run.sh).
        prefix = os.environ.get("GCR_TEST_PRELOAD_PREFIX", "")
        if prefix:
            self.cfg.shim = prefix + ":" + self.cfg.shim
        self.cfg.testprog = os.path.join(BUILD, "tests", "progs", "gcr-testprog")
        self.procs = []
        for d in ("kubelet", "shim", "proc"):
            os.makedirs(os.path.join(self.dir, d))
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            f.write(KUBECONFIG)
        self.config = os.path.join(self.dir, "config.yaml")
        with open(self.config, "w") as f:
            f.write('devicePlugin:\n  enabled: true\n  kubeletDir: "%s/kubelet"\n  shimHostDir: "%s/shim"\n'
                    % (self.dir, self.dir))
        # The shims' own directories (control sockets, the fake driver's), open to uid 65534.
        self.user_dir = os.path.join(self.dir, "user")
        os.makedirs(self.user_dir)
        os.chmod(self.user_dir, 0o1777)
        self.port = free_port()

    def argv(self, *flags):
        return [AGENT, "--config", self.config, "--kubeconfig", self.kubeconfig, "--node-name", "node-p",
                "--metrics-address", "127.0.0.1:%d" % self.port, "--proc-root", os.path.join(self.dir, "proc"),
                *flags]

    def start_agent(self, *flags):
        # Its log lines on stdout, where the harness can wait for them.
        p = H.Proc(self.cfg, "agent", ["sh", "-c", 'exec "$@" 2>&1', "sh"] + self.argv(*flags),
                   extra_env={"GCR_LOG_LEVEL": "info"})
        self.procs.append(p)
        return p

    def in_pod(self, pid):
        d = os.path.join(self.dir, "proc", str(pid))
        os.makedirs(d)
        with open(os.path.join(d, "cgroup"), "w") as f:
            f.write("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/"
                    "cri-containerd-%s.scope\n" % (POD.replace("-", "_"), CID))

    def start_shimmed(self, registry, name, pod=True):
        """gcr-testprog under the shim as uid 65534; it starts (and registers) only once its pid
        is in the fake /proc, so the registry can tell its pod."""
        env = ["LD_PRELOAD=" + self.cfg.shim, "LD_LIBRARY_PATH=" + FAKE_DIR, "GCR_LOG_LEVEL=warn",
               "GCR_SOCKET_DIR=" + self.user_dir, "FAKECUDA_DIR=" + self.user_dir, "GCR_AGENT_SOCKET=" + registry]
        argv = NOBODY + ["sh", "-c", 'read go && exec env "$@"', "sh"] + env + \
            [self.cfg.testprog, "--module", os.path.join(SRC, "tests", "progs", "gcr_kernels.h"), "--iters", "1",
             "--wait"]
        p = H.Proc(self.cfg, name, argv)
        self.procs.append(p)
        if pod:
            self.in_pod(p.pid)
        p.send("go")  # sh's read; then exec keeps the pid
        m = p.expect(r"READY pid=(\d+)", 60, what="READY")
        check(int(m.group(1)) == p.pid, "READY pid %s != %d" % (m.group(1), p.pid))
        return p

    def registered(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port, timeout=10) as r:
            m = re.search(r"^gcr_agent_registered_processes (\d+)$", r.read().decode(), re.M)
        return int(m.group(1)) if m else None

    def close(self):
        for p in self.procs:
            p.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def case_defaults(n):
    """Only --socket-dir given, device plugin on: the agent starts, its registry socket in a
    directory of its own under the socket dir (reachable by all), the plugin's socket root beside."""
    run = os.path.join(n.dir, "run")
    a = n.start_agent("--socket-dir", run)
    reg = os.path.join(run, "agent", "agent.sock")
    a.expect(r"info agent: node node-p: registry %s, shim sockets %s," % (re.escape(reg), re.escape(run)), 60,
             what="the agent's start line")
    check(a.alive(), "the agent exited")
    st = os.stat(reg)
    check(stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666, "registry socket mode %o" % st.st_mode)
    mode = stat.S_IMODE(os.stat(os.path.dirname(reg)).st_mode)
    check(mode == 0o711, "registry dir mode %o, want 0711" % mode)
    check(os.path.isdir(os.path.join(run, "alloc")), "no device-plugin socket root %s/alloc" % run)
    return a, reg


def case_nonroot_registers(n):
    """A shim running as uid 65534 registers with the running agent (the gauge counts it); one
    not in a pod is refused, at WARN."""
    a, reg = case_defaults(n)
    p = n.start_shimmed(reg, "nobody")
    a.expect(r"info registry: registered pid %d \(pod %s" % (p.pid, POD), 60, what="the registration")
    check(n.registered() == 1, "gauge gcr_agent_registered_processes %s, want 1" % n.registered())
    check(not any("not registered" in l for l in p.err_tail), "the shim says: %s" % list(p.err_tail))
    q = n.start_shimmed(reg, "nobody-no-pod", pod=False)
    a.expect(r"warn registry: registration of pid %d \(uid 65534\) refused" % q.pid, 60, what="the refusal")
    check(n.registered() == 1, "gauge %s after a refusal, want 1" % n.registered())
    p.kill()
    a.expect(r"info registry: pid %d gone" % p.pid, 60, what="the process's end")
    check(n.registered() == 0, "gauge %s after the process ended" % n.registered())


def case_shim_warns(n):
    """No agent at GCR_AGENT_SOCKET: the shim says so, once, in its one "gcr: " line (printed
    whatever the log level), and the program runs on."""
    p = n.start_shimmed(os.path.join(n.dir, "no-agent.sock"), "unregistered", pod=False)
    said = [l for l in p.err_tail if "not registered with the node agent at " in l]
    check(len(said) == 1 and re.match(r"gcr: pid \d+ not registered", said[0]),
          "not one 'gcr: ' line from the shim: %s" % list(p.err_tail))


def case_conflict(n):
    """An explicit registry socket whose directory holds the plugin's socket root is refused at
    start, naming both keys."""
    run = os.path.join(n.dir, "run2")
    out = subprocess.run(n.argv("--socket-dir", run, "--registry-socket", os.path.join(run, "agent.sock")),
                         capture_output=True, text=True, timeout=60)
    first = (out.stderr.splitlines() or [""])[0]
    check(out.returncode == 2 and "devicePlugin.socketRoot %s/alloc" % run in first and "registrySocket" in first,
          "exit %d: %s" % (out.returncode, first))
    check(not os.path.exists(run), "a refused agent created %s" % run)


CASES = [
    ("defaults-from-socket-dir", lambda n: case_defaults(n) and None),
    ("nonroot-shim-registers", case_nonroot_registers),
    ("shim-warns-unregistered", case_shim_warns),
    ("conflict-refused", case_conflict),
]


def main():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        print("SKIP: needs root and setpriv (a shim as another user)")
        return 77
    only = re.compile(sys.argv[1]) if len(sys.argv) > 1 else None
    passed = failed = 0
    for name, fn in CASES:
        if only and not only.search(name):
            continue
        n = Node()
        try:
            fn(n)
            passed += 1
            print("PASS %s" % name, flush=True)
        except (Fail, H.HarnessError) as e:
            failed += 1
            print("FAIL %s: %s" % (name, e), flush=True)
        except Exception:
            failed += 1
            print("FAIL %s: %s" % (name, traceback.format_exc()), flush=True)
        finally:
            n.close()
    print("agent-paths: %d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
