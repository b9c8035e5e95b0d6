#!/usr/bin/env python3
# tests/k8s/test_agent_e2e.py: gcr-agent end to end against the real kube-apiserver of
# the test bed: Checkpoint/Restore of a shimmed process on the stand-in driver, then the
# scale-to-zero cases of test_scale_e2e.py and the tenant, deletion and applied-together
# cases of test_tenant_e2e.py. Stdlib only.
"""Usage: tests/k8s/test_agent_e2e.py [BUILD_DIR]   (default: build)

Brings the test bed up (tests/k8s/testbed.sh) unless KUBECONFIG and GCR_TESTBED_DIR
are set (eval "$(tests/k8s/testbed.sh up)"), applies the
CRDs, creates Pod objects bound to node "node-a" with their status set through the
status subresource (there is no kubelet), starts gcr-testprog under the shim on the
stand-in CUDA driver (registered with the agent through GCR_AGENT_SOCKET; its pod and
container come from a fake /proc tree holding <pid>/cgroup), starts gcr-agent, and
runs the cases. Nothing sleeps to synchronise: every wait polls the API (or a
process's protocol lines) for a condition, with a bound. Each case prints PASS or
FAIL; the last line is "N passed, N failed".

Needs kubectl from the test bed (GCR_TESTBED_BIN or PATH) and a built tree
(BUILD_DIR/node-agent/gcr-agent, shim/.libs/libgcr.so, tests/progs/gcr-testprog,
tests/fakecuda/{libcuda.so.1,fakesmi}). GCR_E2E_VALGRIND=1 runs the agent under valgrind;
GCR_E2E_AGENT=PATH runs another gcr-agent binary (e.g. a sanitizer build).
"""

import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("top_builddir", os.path.join(SRC, "build")))
FAKE_DIR = os.path.join(BUILD, "tests", "fakecuda")
FAKESMI = os.path.join(FAKE_DIR, "fakesmi")
GCRCTL = os.path.join(BUILD, "node-agent", "gcrctl")
AGENT = os.environ.get("GCR_E2E_AGENT") or os.path.join(BUILD, "node-agent", "gcr-agent")
SHIM = os.path.join(BUILD, "shim", ".libs", "libgcr.so")
TESTPROG = os.path.join(BUILD, "tests", "progs", "gcr-testprog")
NCCLPROG = os.path.join(BUILD, "tests", "progs", "gcr-ncclprog")
FAKENCCL = os.path.join(BUILD, "tests", "fakenccl")
TESTBED = os.path.join(SRC, "tests", "k8s", "testbed.sh")
CHART_SA = os.path.join(SRC, "tests", "k8s", "chart_sa_kubeconfig.sh")
RBAC_EXPECTED = os.path.join(SRC, "tests", "k8s", "rbac-expected.txt")
RBAC_UNUSED_OK = os.path.join(SRC, "tests", "k8s", "rbac-unused-allowed.txt")
NODE = "node-a"
NODE_B = "node-b"  # another node: no agent, then one faked by its Lease
# A namespace of its own per run, so that a reused test bed holds no old objects. The
# chart is rendered into it (release gcr-NS, chart_sa_kubeconfig.sh's default).
NS = "gcr-e2e-" + uuid.uuid4().hex[:8]
CHART_RELEASE = "gcr-" + NS
# The agents' heartbeat Leases live in the chart's namespace, as the chart's config.yaml
# says (leaseNamespace: .Release.Namespace) and its lease Role allows.
LEASE_NS = NS
# The DaemonSet's pods' labels (its selector), which the chart passes to the scaler as
# agentSelector: the scaler creates the heartbeat Lease of each node one of them runs on
# (the node identity cannot create Leases). Here such pods are API objects only.
AGENT_LABELS = {"app.kubernetes.io/name": "gcr", "app.kubernetes.io/instance": CHART_RELEASE,
                "app.kubernetes.io/component": "agent"}
AGENT_SELECTOR = ",".join("%s=%s" % kv for kv in sorted(AGENT_LABELS.items()))
WAIT_S = 60  # bound of one wait on the API, in seconds



def http_get(port, path):
    """(status, body) of GET http://127.0.0.1:port/path; (0, "") when nothing answers."""
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path), timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return 0, ""


def file_tail(path, n):
    """The last n lines of a log file, or "" when there is none (yet)."""
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except (OSError, TypeError):
        return ""

class Fail(Exception):
    pass


def run_case(results, name, fn, on_fail=None):
    """Runs one case: a PASS or FAIL line (with on_fail()'s text after a FAIL), then goes on."""
    t0 = time.time()
    try:
        fn()
        results.append(True)
        print("PASS %s (%.1f s)" % (name, time.time() - t0), flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is a FAIL line, then go on
        results.append(False)
        print("FAIL %s: %s" % (name, e), flush=True)
        extra = on_fail() if on_fail is not None else ""
        if extra:
            print(extra, flush=True)


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def log(msg):
    print("  " + msg, flush=True)


class Env:
    """Test bed, directories, the agent and the test programs; close() stops all of them."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="gcr-agent-e2e-")
        self.sock_dir = os.path.join(self.dir, "run")
        self.proc_root = os.path.join(self.dir, "proc")
        self.fake_dir = os.path.join(self.dir, "fake")
        for d in (self.sock_dir, self.proc_root, self.fake_dir):
            os.makedirs(d, mode=0o700)
        self.registry = os.path.join(self.sock_dir, "agent.sock")
        # Checkpoints with action Image write under it (the chart's images.hostPath).
        self.images_dir = os.path.join(self.dir, "images")
        self.started_testbed = False
        self.agent = None
        self.agent_log = None
        self.agent_runs = 0
        self.scaler = None
        self.scaler_log = None
        self.progs = []
        self.metrics_port = free_port()
        # The stand-in GPU's memory (FAKECUDA_MEM_MIB) as the programs and the agent see it. A
        # restore wants 128 MiB free beyond what it brings back: many programs need more.
        self.gpu_mib = 512
        self.kubectl = "kubectl"
        self.env = dict(os.environ)
        # The chart's ServiceAccounts' user names by identity ("node", "scaler"), once
        # agent_identity() ran, and the scaler's kubeconfig (the node one is self.kubeconfig).
        self.sa_users = {}
        self.scaler_kubeconfig = None

    def testbed_up(self):
        # A running test bed is used only when its whole environment is there
        # (eval "$(testbed.sh up)"): a KUBECONFIG alone may be a real cluster.
        if not (os.environ.get("KUBECONFIG") and os.environ.get("GCR_TESTBED_DIR")):
            self.env.pop("KUBECONFIG", None)
            out = subprocess.run([TESTBED, "up"], capture_output=True, text=True, timeout=600)
            if out.returncode != 0:
                raise Fail("testbed up failed: %s" % out.stderr[-2000:])
            self.started_testbed = True
            for m in re.finditer(r"export (\w+)='([^']*)'", out.stdout):
                self.env[m.group(1)] = m.group(2)
        binp = self.env.get("GCR_TESTBED_BIN")
        if binp and os.path.exists(os.path.join(binp, "kubectl")):
            self.kubectl = os.path.join(binp, "kubectl")
        self.kubeconfig = self.env["KUBECONFIG"]

    def agent_identity(self):
        """The chart's own ServiceAccounts, ClusterRoles(Bindings) and lease Roles(Bindings), rendered
        into NS by tests/k8s/chart_sa_kubeconfig.sh, and a kubeconfig per identity holding its token:
        node agents run as the DaemonSet's identity, the scaler as the Deployment's, each with exactly
        what the chart grants it, so a missing rule fails a case (GCR_E2E_ADMIN=1: admin certs)."""
        if os.environ.get("GCR_E2E_ADMIN") == "1":
            self.scaler_kubeconfig = self.kubeconfig
            return
        env = dict(self.env)
        env.setdefault("GCR_TOKEN_DURATION", "2h")
        if os.path.exists(os.path.join(os.path.dirname(self.kubectl), "kubectl")):
            env["GCR_TESTBED_BIN"] = os.path.dirname(self.kubectl)
        paths = {}
        for who in ("node", "scaler"):
            paths[who] = os.path.join(self.dir, "%s.kubeconfig" % who)
            out = subprocess.run([CHART_SA, NS, paths[who], who], capture_output=True, text=True, timeout=300,
                                 env=env)
            if out.returncode != 0:
                raise Fail("chart_sa_kubeconfig.sh %s: %s" % (who, out.stderr.strip()[-2000:] or
                                                              out.stdout.strip()[-2000:]))
            self.sa_users[who] = out.stdout.strip().splitlines()[-1]
            log("%s identity: %s (the chart's RBAC, release %s)" % (who, self.sa_users[who], CHART_RELEASE))
        self.kubeconfig = paths["node"]
        self.scaler_kubeconfig = paths["scaler"]

    def k(self, *args, stdin=None, ok=True):
        out = subprocess.run([self.kubectl, *args], input=stdin, capture_output=True, text=True,
                             timeout=60, env=self.env)
        if ok and out.returncode != 0:
            raise Fail("kubectl %s: %s" % (" ".join(args), out.stderr.strip()))
        return out

    def apply(self, obj):
        return self.k("apply", "-f", "-", stdin=json.dumps(obj))

    def get(self, kind, name):
        out = self.k("get", kind, name, "-n", NS, "-o", "json", ok=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def wait(self, what, fn, timeout=WAIT_S):
        """Polls fn() (bounded) until it returns something true; returns it."""
        deadline = time.time() + timeout
        while True:
            v = fn()
            if v:
                return v
            if time.time() > deadline:
                raise Fail("timed out after %d s waiting for %s" % (timeout, what))
            time.sleep(0.2)

    def wait_phase(self, kind, name, phases, timeout=WAIT_S):
        def f():
            o = self.get(kind, name)
            ph = (o or {}).get("status", {}).get("phase")
            return o if ph in phases else None
        try:
            return self.wait("%s %s phase in %s" % (kind, name, phases), f, timeout)
        except Fail:
            o = self.get(kind, name)
            raise Fail("%s %s never reached %s; status: %s" % (kind, name, phases,
                       json.dumps((o or {}).get("status"))))

    def events_for(self, name):
        out = self.k("get", "events.events.k8s.io", "-n", NS, "-o", "json")
        return [e for e in json.loads(out.stdout)["items"] if e.get("regarding", {}).get("name") == name]

    def wait_event(self, name, etype, reason=None):
        return self.wait("a %s Event about %s" % (etype, name),
                         lambda: [e for e in self.events_for(name)
                                  if e.get("type") == etype and (reason is None or e.get("reason") == reason)])

    # --- pods ---
    def make_pod(self, name, cid=None, node=NODE):
        self.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
                    "spec": {"nodeName": node, "containers": [{"name": "main", "image": "example.invalid/gpu:1"}]}})
        pod = self.get("pod", name)
        if cid:
            st = {"status": {"phase": "Running", "containerStatuses": [{
                "name": "main", "containerID": "containerd://" + cid, "image": "example.invalid/gpu:1",
                "imageID": "", "ready": True, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}
            self.k("patch", "pod", name, "-n", NS, "--subresource=status", "--type=merge", "-p", json.dumps(st))
        return pod["metadata"]["uid"]

    def make_agent_pod(self, node):
        """What the DaemonSet would schedule on node (an API object only): the scaler finds it by
        AGENT_SELECTOR and creates that node's heartbeat Lease."""
        self.apply({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "gcr-agent-" + node, "namespace": LEASE_NS, "labels": AGENT_LABELS},
                    "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "example.invalid/gcr:1"}]}})

    def lease(self, node):
        out = self.k("get", "lease", "gcr-agent-" + node, "-n", LEASE_NS, "-o", "json", ok=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    # --- processes ---
    def start_prog(self, pod_uid, cid, argv=None, ready=r"READY pid=(\d+)", wait=True):
        """gcr-testprog (or argv) under the shim, its cgroup file written under its own pid before
        exec."""
        cg = ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/"
              "cri-containerd-%s.scope" % (pod_uid.replace("-", "_"), cid))
        # The registry reads the process's start time from <proc-root>/<pid>/stat: the real one.
        script = ('mkdir -p "$ROOT/$$" && printf "%s\\n" "$CG" > "$ROOT/$$/cgroup" && '
                  'ln -sf /proc/$$/stat "$ROOT/$$/stat" && exec env LD_PRELOAD="$SHIMLIB" "$@"')
        env = dict(self.env)
        env.update({"ROOT": self.proc_root, "CG": cg, "SHIMLIB": SHIM,
                    "LD_LIBRARY_PATH": FAKE_DIR, "FAKECUDA_DIR": self.fake_dir, "FAKECUDA_MEM_MIB": str(self.gpu_mib),
                    "GCR_SOCKET_DIR": self.sock_dir, "GCR_AGENT_SOCKET": self.registry,
                    "GCR_LOG_LEVEL": "warn"})
        if argv is not None:  # the stand-in NCCL beside the stand-in driver
            env["LD_LIBRARY_PATH"] = FAKE_DIR + ":" + FAKENCCL
        argv = ["bash", "-c", script, "prog"] + (argv or [
            TESTPROG, "--module", os.path.join(SRC, "tests", "progs", "gcr_kernels.h"),
            "--mib", "16", "--threads", "2", "--iters", "50", "--wait"])
        p = Prog(argv, env)
        self.progs.append(p)
        if not wait:  # ranks of one group: READY once every rank has started
            return p
        m = p.expect(ready, 60)
        check(int(m.group(1)) == p.p.pid, "READY pid %s != %d" % (m.group(1), p.p.pid))
        return p

    def mem(self, pid):
        out = subprocess.run([FAKESMI, "mem", str(pid)], capture_output=True, text=True, timeout=30,
                             env=self.fake_env())
        check(out.returncode == 0, "fakesmi mem: %s" % out.stderr.strip())
        return int(out.stdout.strip())

    def drv_state(self, pid):
        out = subprocess.run([FAKESMI, "state", str(pid)], capture_output=True, text=True, timeout=30,
                             env=self.fake_env())
        return out.stdout.strip()

    def shim(self, pid):
        """The shim's own status of pid (gcrctl status --json: state, bytes), as the agent sees it."""
        out = subprocess.run([GCRCTL, "--socket-dir", self.sock_dir, "--json", "status", str(pid)],
                             capture_output=True, text=True, timeout=30, env=self.fake_env())
        check(out.returncode == 0, "gcrctl status %d: %s" % (pid, out.stderr.strip()))
        return json.loads(out.stdout).get("shim") or {}

    def fake_env(self):
        env = dict(self.env)
        # FAKECUDA_MEM_MIB as the programs have it: the stand-in NVML the agent reads sizes the GPU so.
        env.update({"LD_LIBRARY_PATH": FAKE_DIR, "FAKECUDA_DIR": self.fake_dir, "FAKECUDA_MEM_MIB": str(self.gpu_mib)})
        return env

    # --- the agent ---
    def start_agent(self, extra_env=None, extra_args=None):
        self.agent_runs += 1
        self.agent_special = bool(extra_env or extra_args)  # a test hook (pause) or extra flags
        logp = os.path.join(self.dir, "agent.%d.log" % self.agent_runs)
        self.agent_log = logp
        env = self.fake_env()
        env["GCR_LOG_LEVEL"] = "debug"  # the whole story in the log a failed case prints
        if find_criu():  # images (action Image): the agent runs CRIU
            env["GCR_CRIU"] = find_criu()
        env.update(extra_env or {})
        # Half the options in a config file shaped like the Helm chart's (camelCase keys,
        # sections the agent does not read), half as flags, as the DaemonSet passes them.
        cfg = os.path.join(self.dir, "config.yaml")
        with open(cfg, "w") as f:
            f.write('logLevel: "info"\nleaseNamespace: "%s"\ndevicePlugin:\n  enabled: false\n'
                    '  slots: 32\n  shimEnv: {}\nnodeName: %s\nprocRoot: "%s"\nmaxParallel: 3\n'
                    'imagesDir: "%s"\nimagesKeep: 2\n' % (LEASE_NS, NODE, self.proc_root, self.images_dir))
        argv = [AGENT, "--config=%s" % cfg, "--role", "node", "--kubeconfig", self.kubeconfig,
                "--socket-dir", self.sock_dir,
                "--registry-socket", self.registry, "--metrics-address", "127.0.0.1:%d" % self.metrics_port,
                *(extra_args or ())]
        if os.environ.get("GCR_E2E_VALGRIND") == "1":
            argv = ["valgrind", "--quiet", "--error-exitcode=99", "--leak-check=full",
                    "--errors-for-leak-kinds=definite", "--suppressions=%s" % os.path.join(SRC, "tests", "valgrind.supp"),
                    *argv]
        self.agent = subprocess.Popen(argv, stdout=open(logp, "w"), stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        def ready():
            if self.agent.poll() is not None:  # e.g. an option it does not know: no 120 s wait
                raise Fail("agent exited with status %s before it was ready: %s" % (
                    self.agent.returncode, file_tail(logp, 6).strip()))
            return self.http("/readyz")[0] == 200
        self.wait("agent /readyz", ready, timeout=120)
        return self.agent

    def start_scaler(self):
        """gcr-agent --role=scaler as the chart's scaler identity, as the Deployment runs it."""
        self.scaler_log = os.path.join(self.dir, "scaler.log")
        env = dict(self.env)
        env.update({"GCR_LOG_LEVEL": "info", "POD_NAME": "scaler-e2e"})
        self.scaler = subprocess.Popen(
            [AGENT, "--role", "scaler", "--kubeconfig", self.scaler_kubeconfig, "--lease-namespace", LEASE_NS,
             "--metrics-address", "127.0.0.1:%d" % free_port(), "--leader-lease-seconds", "3",
             "--agent-selector", AGENT_SELECTOR],
            stdout=open(self.scaler_log, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def stop_scaler(self):
        if self.scaler is None:
            return None
        if self.scaler.poll() is None:
            self.scaler.send_signal(signal.SIGTERM)
        try:
            rc = self.scaler.wait(60)
        except subprocess.TimeoutExpired:
            self.scaler.kill()
            rc = self.scaler.wait(30)
        self.scaler = None
        return rc

    def stop_agent(self, sig=signal.SIGTERM):
        if self.agent is None:
            return None
        if self.agent.poll() is None:
            self.agent.send_signal(sig)
        try:
            rc = self.agent.wait(60)
        except subprocess.TimeoutExpired:
            self.agent.kill()
            rc = self.agent.wait(30)
        self.agent = None
        return rc

    def http(self, path):
        return http_get(self.metrics_port, path)

    def agent_tail(self, n=40):
        return file_tail(self.agent_log, n)

    def close(self):
        self.stop_agent()
        self.stop_scaler()
        for p in self.progs:
            p.kill()
        if not self.started_testbed and os.environ.get("GCR_E2E_KEEP") != "1":
            # The chart's cluster-scoped RBAC of this run (the namespace goes with the test bed's reuse).
            self.k("delete", "clusterrolebinding,clusterrole", "-l", "app.kubernetes.io/instance=" + CHART_RELEASE,
                   "--ignore-not-found", "--wait=false", ok=False)
        if self.started_testbed:
            subprocess.run([TESTBED, "down", self.env["GCR_TESTBED_DIR"]], capture_output=True, timeout=120,
                           env=self.env)
        if os.environ.get("GCR_E2E_KEEP") != "1":
            shutil.rmtree(self.dir, ignore_errors=True)


def rbac_lines(path):
    """(identity, kind, group, resource, verb) of each non-comment line of an RBAC list file."""
    rules = []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].split()
            if line:
                rules.append(tuple(line[:5]))
    return rules


def audit_used(audit_log, user):
    """(group, resource[/subresource], verb) of every request the API server allowed to user,
    from the test bed's audit log (Metadata level, JSON lines). kubectl's own calls with the
    token (chart_sa_kubeconfig.sh's can-i) are not the agent's and are left out."""
    used = set()
    with open(audit_log) as f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("user", {}).get("username") != user or "objectRef" not in ev:
                continue
            if ev.get("userAgent", "").startswith("kubectl/"):
                continue
            if ev.get("annotations", {}).get("authorization.k8s.io/decision") != "allow":
                continue
            ref = ev["objectRef"]
            res = ref.get("resource", "") + ("/" + ref["subresource"] if ref.get("subresource") else "")
            used.add((ref.get("apiGroup") or "core", res, ev.get("verb")))
    return used


def audit_lease_reads(audit_log, offset, ns, name, user):
    """Response codes of the GETs of Lease ns/name the audit log shows past byte offset, made by
    user (None: any client but kubectl, when the agents run as admin)."""
    codes = []
    with open(audit_log) as f:
        f.seek(offset)
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ref = ev.get("objectRef") or {}
            if (ev.get("stage") != "ResponseComplete" or ev.get("verb") != "get" or ref.get("resource") != "leases"
                    or ref.get("namespace") != ns or ref.get("name") != name
                    or ev.get("userAgent", "").startswith("kubectl/")
                    or (user is not None and ev.get("user", {}).get("username") != user)):
                continue
            codes.append((ev.get("responseStatus") or {}).get("code"))
    return codes


class Prog:
    """A program whose stdout lines a reader thread queues; waits are bounded."""

    def __init__(self, argv, env):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, env=env, start_new_session=True)
        self.q = queue.Queue()
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def expect(self, pattern, timeout):
        deadline = time.time() + timeout
        rx = re.compile(pattern)
        while True:
            left = deadline - time.time()
            if left <= 0:
                raise Fail("timed out waiting for /%s/; output: %s" % (pattern, self.lines[-10:]))
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise Fail("program exited waiting for /%s/; output: %s" % (pattern, self.lines[-10:]))
            self.lines.append(line)
            m = rx.search(line)
            if m:
                return m

    def send(self, s):
        self.p.stdin.write(s + "\n")
        self.p.stdin.flush()

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            pass


def find_criu():
    """CRIU >= 4 as tests/flow/test_image.py finds it: $GCR_CRIU, else scripts/install-criu.sh's
    cache, else criu on PATH; None when there is none (the image cases then fail, saying so)."""
    for c in (os.environ.get("GCR_CRIU"), os.path.expanduser("~/.cache/gcr-criu/4.1.1/criu"), shutil.which("criu")):
        if c and os.access(c, os.X_OK):
            return c
    return None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def checkpoint(name, pod, **spec):
    return {"apiVersion": "gpucr.dev/v1alpha1", "kind": "Checkpoint", "metadata": {"name": name, "namespace": NS},
            "spec": dict({"podName": pod}, **spec)}


def restore(name, ck):
    return {"apiVersion": "gpucr.dev/v1alpha1", "kind": "Restore", "metadata": {"name": name, "namespace": NS},
            "spec": {"checkpointName": ck}}


def binaries_missing():
    """True (and says so, as one failed case) when the build lacks a binary the tiers run."""
    for f in (AGENT, SHIM, TESTPROG, FAKESMI, GCRCTL):
        if not os.path.exists(f):
            print("missing %s (build first)" % f)
            print("0 passed, 1 failed")
            return True
    return False


def main():
    if binaries_missing():
        return 1
    E = Env()
    results = []
    # The fixture every case uses: the pod and its shimmed process, written by setup only. A
    # case keeps its own state in its own locals; after a failed case, heal() brings the
    # fixture back (agent running plainly, process resident), so one failure stays one.
    fx = {}

    def agent_tail():
        tail = E.agent_tail()
        return "  agent log tail:\n" + "\n".join("    " + l for l in tail.splitlines()) if tail else ""

    def heal():
        """After a failed case: the agent running without test hooks, the process resident."""
        if E.agent is None or E.agent.poll() is not None or getattr(E, "agent_special", False):
            E.stop_agent()
            E.start_agent()
        pid = fx.get("pid")
        if pid is None or fx["prog"].p.poll() is not None:
            return
        shim_state = E.shim(pid).get("state")
        if E.drv_state(pid) == "running" and shim_state == "running":
            return
        flags = ["--no-driver"] if E.drv_state(pid) == "running" else []
        out = subprocess.run([GCRCTL, "--socket-dir", E.sock_dir, "--json", "resume", *flags, str(pid)],
                             capture_output=True, text=True, timeout=120, env=E.fake_env())
        log("healed after the failure: pid %d resumed (%s): %s" % (pid, " ".join(flags) or "full",
                                                                  (out.stdout or out.stderr).strip()[:200]))

    def case(name, fn):
        run_case(results, name, fn, agent_tail)
        if not results[-1] and fx.get("heal"):
            try:
                heal()
            except Exception as e:  # noqa: BLE001 - reported; the next case says what it finds
                print("  heal after %s failed: %s" % (name, e), flush=True)

    def untouched(pid):
        check(E.mem(pid) > 0, "process %d lost its GPU memory" % pid)
        check(E.drv_state(pid) == "running", "driver state of %d is %s" % (pid, E.drv_state(pid)))

    def suspended(pid):
        check(E.mem(pid) == 0, "%d bytes of GPU memory left while suspended" % E.mem(pid))
        check(E.drv_state(pid) == "checkpointed", "driver state %s" % E.drv_state(pid))

    def do_restore(rname, ckname):
        E.apply(restore(rname, ckname))
        r = E.wait_phase("restore", rname, ("Succeeded", "Failed"))
        check(r["status"]["phase"] == "Succeeded", "restore: %s" % r["status"].get("message"))
        untouched(fx["pid"])
        return r

    def setup():
        E.testbed_up()
        E.k("apply", "-f", os.path.join(SRC, "crd"))
        E.k("create", "namespace", NS)
        for crd in ("checkpoints.gpucr.dev", "restores.gpucr.dev"):
            E.k("wait", "--for=condition=Established", "--timeout=60s", "crd/" + crd)
        E.agent_identity()
        fx["cid"] = uuid.uuid4().hex + uuid.uuid4().hex
        fx["uid"] = E.make_pod("gpu-pod", fx["cid"])
        E.make_pod("plain-pod", uuid.uuid4().hex + uuid.uuid4().hex)
        # node-b has no agent: no Lease of it left by an earlier run on a reused test bed.
        E.k("delete", "lease", "gcr-agent-" + NODE_B, "-n", LEASE_NS, "--ignore-not-found")
        E.make_pod("other-pod", uuid.uuid4().hex + uuid.uuid4().hex, node=NODE_B)
        # The node agent starts before anything created its Lease: it gets ready all the same
        # (start_agent waits for /readyz) and waits for the scaler, which then starts.
        E.start_agent()
        E.wait("the agent waiting for its Lease", lambda: "waiting for the scaler to create lease %s/gcr-agent-%s"
               % (LEASE_NS, NODE) in open(E.agent_log).read())
        E.start_scaler()
        E.make_agent_pod(NODE)
        p = E.start_prog(fx["uid"], fx["cid"])
        fx["prog"], fx["pid"] = p, p.p.pid
        p.send("go")  # the program computes; the checkpoint gates it wherever it is
        E.wait("agent registers pid %d" % fx["pid"],
               lambda: "gcr_agent_registered_processes 1" in E.http("/metrics")[1])
        untouched(fx["pid"])
        fx["heal"] = True

    def restore_waits_for_room():
        """Another process holds the whole (fake) GPU: the Restore is refused without touching the
        driver, waits (Running, condition WaitingForGPUMemory, a Warning Event) and succeeds once
        that process leaves; the program's own check at the end covers its data."""
        E.apply(checkpoint("ck-room", "gpu-pod"))
        c = E.wait_phase("checkpoint", "ck-room", ("Succeeded", "Failed"))
        check(c["status"]["phase"] == "Succeeded", "checkpoint: %s" % c["status"].get("message"))
        suspended(fx["pid"])
        hog = subprocess.Popen([FAKESMI, "hold", "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=E.fake_env())
        try:
            line = hog.stdout.readline()
            check(line.startswith("HOLDING free="), "fakesmi hold: %r %s" % (line, hog.stderr.read() if
                                                                               hog.poll() is not None else ""))
            log("another process holds the GPU: %s" % line.strip())
            E.apply(restore("rs-room", "ck-room"))
            ev = E.wait_event("rs-room", "Warning", "WaitingForGPUMemory")
            note = ev[0].get("note", "")
            check("retry when the GPU has room" in note and "bytes free" in note, "Event note: %s" % note)
            r = E.get("restore", "rs-room")["status"]
            conds = r.get("conditions") or [{}]
            check(r.get("phase") == "Running" and conds[0].get("reason") == "WaitingForGPUMemory",
                  "status while waiting: %s" % json.dumps(r))
            suspended(fx["pid"])  # refused before the driver's restore: still whole, still checkpointed
        finally:
            hog.stdin.close()
            hog.wait(30)
        log("the other process left")
        r = E.wait_phase("restore", "rs-room", ("Succeeded", "Failed"), timeout=WAIT_S)
        check(r["status"]["phase"] == "Succeeded", "restore after room came back: %s" % r["status"].get("message"))
        untouched(fx["pid"])
        E.wait_event("rs-room", "Normal", "Restored")

    def restore_onto_absent_gpu():
        """A Restore naming another GPU (spec.targetGPU) that this node lacks: Failed with the
        reason and a Warning Event before the driver is touched, the process still suspended and
        checkpointed where it was; a plain Restore of the same Checkpoint then brings it back."""
        E.apply(checkpoint("ck-gpu", "gpu-pod"))
        c = E.wait_phase("checkpoint", "ck-gpu", ("Succeeded", "Failed"))
        check(c["status"]["phase"] == "Succeeded", "checkpoint: %s" % c["status"].get("message"))
        suspended(fx["pid"])
        absent = "GPU-00000000-1111-2222-3333-444444444444"
        obj = restore("rs-gpu-absent", "ck-gpu")
        obj["spec"]["targetGPU"] = absent
        E.apply(obj)
        r = E.wait_phase("restore", "rs-gpu-absent", ("Succeeded", "Failed"))["status"]
        msg = r.get("message", "")
        check(r["phase"] == "Failed" and "no GPU %s" % absent in msg and "still suspended" in msg,
              "Restore onto an absent GPU: %s" % json.dumps(r))
        E.wait_event("rs-gpu-absent", "Warning")
        suspended(fx["pid"])
        do_restore("rs-gpu-back", "ck-gpu")

    def tp_pod():
        """A pod whose two GPU processes are NCCL ranks (tensor-parallel in one container): its
        Checkpoint suspends them as one group (each alone would be refused: its peer's collective
        would strand), both at 0 bytes and checkpointed; its Restore brings both back; their digests
        equal those of the same two ranks run without GCR, so nothing was lost or replayed."""
        def ranks(tag, shim, cid=None, uid=None):
            idf = os.path.join(E.sock_dir, "nccl-id-%s" % tag)
            argvs = [[NCCLPROG, "--rank", str(r), "--nranks", "2", "--id-file", idf, "--steps", "60", "--mib", "4",
                      "--pace-ms", "20", "--wait", "--module", os.path.join(SRC, "tests", "progs", "gcr_kernels.h")]
                     for r in range(2)]
            if shim:
                ps = [E.start_prog(uid, cid, argv=a, wait=False) for a in argvs]
            else:
                env = dict(E.fake_env(), LD_LIBRARY_PATH=FAKE_DIR + ":" + FAKENCCL)
                ps = [Prog(a, env) for a in argvs]
                E.progs.extend(ps)
            for q in ps:
                q.expect(r"READY pid=(\d+) rank", 60)
            return ps

        def digests(ps):
            out = []
            for q in ps:
                m = q.expect(r"(DIGEST [0-9a-f]+|ERROR .*)$", 240)
                check(m.group(1).startswith("DIGEST"), "rank: %s" % m.group(1))
                out.append(m.group(1).split()[1])
                q.send("exit")
            return out

        ref = ranks("ref", False)
        for q in ref:
            q.send("go")
        want = digests(ref)
        cid = uuid.uuid4().hex + uuid.uuid4().hex
        uid = E.make_pod("tp-pod", cid)
        ps = ranks("tp", True, cid, uid)
        def registered(n):
            m = re.search(r"^gcr_agent_registered_processes (\d+)", E.http("/metrics")[1], re.M)
            return m is not None and int(m.group(1)) >= n

        try:
            pids = [q.p.pid for q in ps]
            E.wait("the agent registers both ranks", lambda: registered(3))  # and the first pod's process
            for q in ps:
                q.send("go")
            for q in ps:
                q.expect(r"STEP 5$", 60)
            E.apply(checkpoint("ck-tp", "tp-pod"))
            c = E.wait_phase("checkpoint", "ck-tp", ("Succeeded", "Failed"))
            check(c["status"]["phase"] == "Succeeded", "checkpoint of the TP pod: %s" % c["status"].get("message"))
            for pid in pids:
                suspended(pid)
            do_restore_of = restore("rs-tp", "ck-tp")
            E.apply(do_restore_of)
            r = E.wait_phase("restore", "rs-tp", ("Succeeded", "Failed"))
            check(r["status"]["phase"] == "Succeeded", "restore of the TP pod: %s" % r["status"].get("message"))
            for pid in pids:
                check(E.drv_state(pid) == "running" and E.mem(pid) > 0, "rank %d not back on the GPU" % pid)
            check(digests(ps) == want, "the ranks' digests differ from an uninterrupted run")
        finally:
            for q in ps:
                q.kill()
            E.wait("the agent forgets both ranks", lambda: not registered(3))

    def bad(name, obj, kind, want):
        E.apply(obj)
        o = E.wait_phase(kind, name, ("Succeeded", "Failed"))
        s = o["status"]
        check(s["phase"] == "Failed", "phase %s" % s["phase"])
        check(want in s.get("message", ""), "message %r lacks %r" % (s.get("message"), want))
        check(s.get("completionTime"), "no completionTime")
        E.wait_event(name, "Warning")
        untouched(fx["pid"])

    def pod_missing():
        bad("ck-missing", checkpoint("ck-missing", "no-such-pod"), "checkpoint", "not found")

    def no_shim():
        bad("ck-plain", checkpoint("ck-plain", "plain-pod"), "checkpoint", "no process running under the GCR shim")

    def own_lease():
        # The node identity cannot create Leases: the scaler creates the Lease of each node
        # running an agent pod (none held), and the node's agent, which logged once that it
        # was waiting, holds and renews it from then on.
        E.wait("the scaler creating Lease %s/gcr-agent-%s" % (LEASE_NS, NODE),
               lambda: "created heartbeat lease %s/gcr-agent-%s for agent pod gcr-agent-%s" % (LEASE_NS, NODE, NODE)
               in open(E.scaler_log).read())
        spec = E.wait("Lease %s/gcr-agent-%s held by %s" % (LEASE_NS, NODE, NODE),
                      lambda: (E.lease(NODE) or {}).get("spec", {}).get("holderIdentity") == NODE and E.lease(NODE))["spec"]
        check(spec.get("leaseDurationSeconds") == 40, "leaseDurationSeconds %s" % spec.get("leaseDurationSeconds"))
        first = spec.get("renewTime")
        E.wait("renewTime after %s" % first, lambda: (E.lease(NODE) or {}).get("spec", {}).get("renewTime", "") > first,
               timeout=30)
        waits = open(E.agent_log).read().count("waiting for the scaler to create lease")
        check(waits == 1, "the agent logged its wait %d times, not once" % waits)
        # node-b runs no agent pod: no Lease for it, so it still reads as unserved.
        check(E.lease(NODE_B) is None, "a Lease for %s, where no agent pod runs: %s" % (NODE_B, E.lease(NODE_B)))

    def other_node_no_agent():
        # No GCR agent serves the pod's node (no Lease): nobody else would ever
        # answer, so this agent fails the Checkpoint and touches nothing.
        bad("ck-other", checkpoint("ck-other", "other-pod"), "checkpoint", "node %s" % NODE_B)
        s = E.get("checkpoint", "ck-other")["status"]
        check("no GCR agent" in s.get("message", ""), "message %r" % s.get("message"))
        E.wait_event("ck-other", "Warning", "NoAgentOnNode")

    def other_node_served():
        # The pod's node has a live agent (its Lease renewed now): that agent owns
        # the Checkpoint, this one must not race it. What shows it: the agent read the Lease
        # (the API server's audit log, answered 200: read as live, not failed to read) and
        # wrote nothing (no status, no Event). Operations on one pod never overlap, so once
        # a change to ck-served made the agent read the Lease a second time, the first pass
        # has ended and its outcome is in the API.
        audit = os.path.join(E.env.get("GCR_TESTBED_DIR", ""), "audit.log")
        check(os.path.exists(audit), "no audit log %s" % audit)
        offset = os.path.getsize(audit)
        user = E.sa_users.get("node")
        lease = "gcr-agent-" + NODE_B

        def reads(n):
            codes = audit_lease_reads(audit, offset, LEASE_NS, lease, user)
            return codes if len(codes) >= n else None

        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        E.apply({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": lease, "namespace": LEASE_NS},
                 "spec": {"holderIdentity": NODE_B, "leaseDurationSeconds": 40, "renewTime": now}})
        try:
            E.k("apply", "-f", "-", stdin="\n---\n".join(json.dumps(o) for o in (
                checkpoint("ck-served", "other-pod"), checkpoint("ck-marker", "plain-pod"))))
            E.wait_phase("checkpoint", "ck-marker", ("Failed",))
            E.wait("the agent reading Lease %s/%s for ck-served" % (LEASE_NS, lease), lambda: reads(1))
            E.k("annotate", "checkpoint", "ck-served", "-n", NS, "gcr-test/bump=1", "--overwrite")
            codes = E.wait("the agent reading the Lease again after ck-served changed", lambda: reads(2))
            check(all(c == 200 for c in codes), "Lease reads answered %s: not read as live" % codes)
            o = E.get("checkpoint", "ck-served")
            check("phase" not in (o.get("status") or {}), "pod on %s: status %s" % (NODE_B, o.get("status")))
            check(not E.events_for("ck-served"), "events about ck-served: %s" % E.events_for("ck-served"))
            untouched(fx["pid"])
        finally:
            E.k("delete", "lease", lease, "-n", LEASE_NS, "--ignore-not-found")

    def restore_of_failed():
        bad("rs-failed", restore("rs-failed", "ck-missing"), "restore", "failed")

    def schema():
        out = E.k("apply", "-f", "-", stdin=json.dumps(checkpoint("ck-bad", "Bad_Name!")), ok=False)
        check(out.returncode != 0, "API server accepted a bad podName")
        check(E.get("checkpoint", "ck-bad") is None, "bad object exists")

    def kill_mid(hook, ck, rs, keep=False):
        def run():
            E.stop_agent()
            E.start_agent({"GCR_AGENT_TEST_PAUSE": hook, "GCR_AGENT_TEST_PAUSE_S": "120"})
            E.apply(checkpoint(ck, "gpu-pod", **({"keepContext": True} if keep else {})))
            E.wait_phase("checkpoint", ck, ("Running",))
            if hook == "after-cr" and keep:
                E.wait("process suspended", lambda: E.shim(fx["pid"]).get("state") == "suspended")
                check(E.drv_state(fx["pid"]) == "running", "driver state %s" % E.drv_state(fx["pid"]))
            elif hook == "after-cr":
                E.wait("process suspended", lambda: E.mem(fx["pid"]) == 0)
            else:
                untouched(fx["pid"])
            E.stop_agent(signal.SIGKILL)
            E.start_agent()
            c = E.wait_phase("checkpoint", ck, ("Succeeded", "Failed"))["status"]
            check(c["phase"] == "Succeeded", "after restart: %s: %s" % (c["phase"], c.get("message")))
            if hook == "after-cr":
                check("not redone" in c.get("message", ""), "message: %s" % c.get("message"))
            if keep:  # recognised as suspended in its recorded mode: the driver still not involved
                check(c.get("mode") == "KeepContext", "status.mode %s" % c.get("mode"))
                check(E.shim(fx["pid"]).get("state") == "suspended" and E.drv_state(fx["pid"]) == "running",
                      "shim %s, driver %s" % (E.shim(fx["pid"]).get("state"), E.drv_state(fx["pid"])))
                check(do_restore(rs, ck)["status"].get("mode") == "KeepContext", "Restore mode")
                return
            suspended(fx["pid"])
            do_restore(rs, ck)
        return run

    def sigterm():
        # SIGTERM while a Checkpoint is in flight: it finishes, then the agent exits 0.
        E.stop_agent()
        E.start_agent({"GCR_AGENT_TEST_PAUSE": "before-cr", "GCR_AGENT_TEST_PAUSE_S": "120"})
        E.apply(checkpoint("ck-term", "gpu-pod"))
        E.wait_phase("checkpoint", "ck-term", ("Running",))
        rc = E.stop_agent(signal.SIGTERM)
        check(rc == 0, "agent exit status %s on SIGTERM" % rc)
        c = E.get("checkpoint", "ck-term")["status"]
        check(c["phase"] == "Succeeded", "in-flight Checkpoint: %s: %s" % (c["phase"], c.get("message")))
        suspended(fx["pid"])
        E.start_agent()
        do_restore("rs-term", "ck-term")

    def apiserver_restart():
        E.wait("agent registers pid %d (found by the start-up scan)" % fx["pid"],
               lambda: "gcr_agent_registered_processes 1" in E.http("/metrics")[1])
        # A change the pod watch does not see: its resourceVersion is older than the
        # restarted server's watch cache, so resuming it gets 410 Gone (a relist).
        E.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "rv-bump", "namespace": NS},
                 "data": {"t": str(time.time())}})
        log_before = len(open(E.agent_log).read())
        out = subprocess.run([TESTBED, "restart-apiserver", E.env["GCR_TESTBED_DIR"]], capture_output=True,
                             text=True, timeout=300, env=E.env)
        check(out.returncode == 0, "restart-apiserver: %s" % out.stderr[-1000:])
        E.apply(checkpoint("ck-after-restart", "gpu-pod"))
        c = E.wait_phase("checkpoint", "ck-after-restart", ("Succeeded", "Failed"), timeout=90)["status"]
        check(c["phase"] == "Succeeded", "%s: %s" % (c["phase"], c.get("message")))
        suspended(fx["pid"])
        do_restore("rs-after-restart", "ck-after-restart")
        # Some watch was resumed from an expired resourceVersion: relisted, still ready.
        after = open(E.agent_log).read()[log_before:]
        check("resourceVersion expired (410); relisting" in after,
              "no 410 relist in the agent log: %s" % [l for l in after.splitlines() if "kube:" in l][-12:])
        check(E.http("/readyz")[0] == 200, "not ready after the relist")

    def nothing_twice():
        # Every finished object kept its one result across the restarts above. A
        # WorkerShareUsed Event says the object waited for its namespace's share of the
        # workers (the cases above run many at once): not a result, so not counted.
        for n in ("ck-missing", "ck-plain", "ck-other"):
            ev = [e for e in E.events_for(n) if e.get("reportingController") == "gpucr.dev/gcr-agent"
                  and e.get("reason") != "WorkerShareUsed"]
            check(len(ev) == 1 or all(e.get("series") for e in ev[1:]),
                  "%s has %d result events: %s" % (n, len(ev), [(e.get("reason"), e.get("note")) for e in ev]))

    def metrics():
        code, body = E.http("/healthz")
        check(code == 200, "/healthz %d" % code)
        code, body = E.http("/metrics")
        check(code == 200, "/metrics %d" % code)
        for m in ('gcr_agent_operations_total{kind="checkpoint",result="succeeded"}',
                  "gcr_agent_operation_duration_seconds_bucket", "gcr_agent_bytes_moved_total",
                  "gcr_agent_registered_processes 1"):
            check(m in body, "/metrics lacks %s" % m)

    def image_dir(name, pod="gpu-pod"):
        return os.path.join(E.images_dir, NS, pod, name)

    def image_ok(name):
        """Checkpoint name with action Image of gpu-pod: Succeeded, status and Event, a whole
        image at its path, the process running on untouched."""
        check(find_criu(), "no CRIU >= 4 ($GCR_CRIU, ~/.cache/gcr-criu/4.1.1/criu, PATH): run scripts/install-criu.sh")
        E.apply(checkpoint(name, "gpu-pod", action="Image"))
        c = E.wait_phase("checkpoint", name, ("Succeeded", "Failed"), timeout=180)["status"]
        check(c["phase"] == "Succeeded", "Image: %s: %s" % (c["phase"], c.get("message")))
        img = c.get("image") or {}
        check(img.get("path") == image_dir(name), "status.image.path %s, not %s" % (img.get("path"), image_dir(name)))
        check(img.get("gpuBytes", 0) >= 16 << 20 and 0 < img.get("bytes", 0), "status.image %s" % img)
        d = c.get("durations") or {}
        check({"suspend", "write", "dump", "manifest", "resume", "total"} <= set(d), "durations %s" % d)
        check(os.path.exists(os.path.join(image_dir(name), "manifest.json")), "no manifest in %s" % image_dir(name))
        check(not [n for n in os.listdir(os.path.dirname(image_dir(name))) if ".partial." in n],
              "a partial image is left: %s" % os.listdir(os.path.dirname(image_dir(name))))
        E.wait_event(name, "Normal", "ImageWritten")
        untouched(fx["pid"])
        check(E.shim(fx["pid"]).get("state") == "running", "the shim is not running after the image")
        return c

    def image_killed(step, want, name):
        """The agent SIGKILLed at one step of an Image (the agent's CRIU on a host process; the
        test hook pauses it after the step is recorded, before it runs): the next agent finishes it
        from its record (docs/images.md, "Records, and an agent killed mid-image"): the process
        running, never left held at its gate; the image whole, or Failed Interrupted and nothing
        of it left (no partial image)."""
        def run():
            check(find_criu(), "no CRIU >= 4 ($GCR_CRIU, ~/.cache/gcr-criu/4.1.1/criu, PATH): run scripts/install-criu.sh")
            E.stop_agent()
            E.start_agent({"GCR_AGENT_TEST_PAUSE": "image-" + step, "GCR_AGENT_TEST_PAUSE_S": "120"})
            E.apply(checkpoint(name, "gpu-pod", action="Image"))
            E.wait("the agent paused at image-%s" % step, lambda: "pausing 120 s at image-%s" % step in
                   open(E.agent_log).read(), timeout=120)
            E.stop_agent(signal.SIGKILL)
            E.start_agent()
            c = E.wait_phase("checkpoint", name, ("Succeeded", "Failed"), timeout=180)["status"]
            reason = (c.get("conditions") or [{}])[0].get("reason")
            check((c["phase"], reason) == want, "killed at image-%s: %s %s, want %s: %s" % (
                step, c["phase"], reason, want, c.get("message")))
            E.wait("the process running", lambda: E.shim(fx["pid"]).get("state") == "running")
            untouched(fx["pid"])
            pod_dir = os.path.dirname(image_dir(name))
            check(not [n for n in os.listdir(pod_dir) if ".partial." in n], "a partial image is left: %s"
                  % os.listdir(pod_dir))
            check(os.path.exists(os.path.join(image_dir(name), "manifest.json")) == (want[0] == "Succeeded"),
                  "the image at %s after %s" % (image_dir(name), c["phase"]))
            log("  killed at image-%s: %s (%s) %s" % (step, c["phase"], reason, c.get("message", "")[:200]))
        return run

    def image_and_retention():
        """Three Checkpoints with action Image of one pod, one after another: each a whole image
        under <images>/<ns>/<pod>/<name>, the process running on; with imagesKeep 2 the first is
        removed when the third commits. Deleting a Checkpoint removes its image (the sweep)."""
        for n in ("ck-img1", "ck-img2", "ck-img3"):
            image_ok(n)
        check(not os.path.exists(image_dir("ck-img1")), "the oldest image is still there past imagesKeep 2")
        check(os.path.exists(image_dir("ck-img2")) and os.path.exists(image_dir("ck-img3")), "a newer image is gone")
        E.k("delete", "checkpoint", "ck-img2", "-n", NS)
        E.wait("the image of the deleted Checkpoint ck-img2 removed", lambda: not os.path.exists(image_dir("ck-img2")))
        check(os.path.exists(image_dir("ck-img3")), "the image of the live Checkpoint ck-img3 went too")
        untouched(fx["pid"])

    def image_refused():
        """Action Image where a directory already is: Failed ImageFailed + Warning Event, nothing
        written over, the process untouched and running; Image with keepContext is refused by
        the API server (the CRD's rule)."""
        taken = image_dir("ck-img-taken")
        os.makedirs(taken)
        with open(os.path.join(taken, "mine"), "w") as f:
            f.write("not an image")
        E.apply(checkpoint("ck-img-taken", "gpu-pod", action="Image"))
        c = E.wait_phase("checkpoint", "ck-img-taken", ("Succeeded", "Failed"), timeout=120)["status"]
        check(c["phase"] == "Failed", "phase %s: %s" % (c["phase"], c.get("message")))
        check("never overwritten" in c.get("message", "") and "process untouched" in c.get("message", ""),
              "message: %s" % c.get("message"))
        E.wait_event("ck-img-taken", "Warning", "ImageFailed")
        check(os.listdir(taken) == ["mine"], "the directory was written to: %s" % os.listdir(taken))
        untouched(fx["pid"])
        check(E.shim(fx["pid"]).get("state") == "running", "the shim is not running")
        out = E.k("apply", "-f", "-", stdin=json.dumps(checkpoint("ck-img-kc", "gpu-pod", action="Image",
                                                                  keepContext=True)), ok=False)
        check(out.returncode != 0 and "keepContext" in out.stderr, "Image with keepContext accepted: %s" % out.stderr)
        out = E.k("apply", "-f", "-", stdin=json.dumps(checkpoint("ck-img-bad", "gpu-pod", action="Snapshot")),
                  ok=False)
        check(out.returncode != 0, "action Snapshot accepted")

    def program_ok():
        p = fx["prog"]
        p.expect(r"DONE$", 120)
        p.send("check")
        m = p.expect(r"RESULT (.*)", 120)
        check(m.group(1) == "ok", "program reports RESULT %s" % m.group(1))

    def rbac_all_used():
        """Every permission tests/k8s/rbac-expected.txt (so the chart) grants an identity was used by
        the processes running as it in this run (node agents; the scaler), per the API server's audit
        log, or is in rbac-unused-allowed.txt with why."""
        if not E.sa_users:
            log("GCR_E2E_ADMIN=1: the agents ran as admin; nothing to compare")
            return
        audit = os.path.join(E.env.get("GCR_TESTBED_DIR", ""), "audit.log")
        check(os.path.exists(audit), "no audit log %s (test bed started before it had one? restart it)" % audit)
        allowed = {r[:5] for r in rbac_lines(RBAC_UNUSED_OK)}
        unused = []
        for who, user in sorted(E.sa_users.items()):
            used = audit_used(audit, user)
            unused += [r for r in rbac_lines(RBAC_EXPECTED) if r[0] == who and r[2:] not in used and r not in allowed]
            log("used by %s (%s): %s" % (who, user, " ".join(sorted("%s:%s:%s" % u for u in used))))
            # Not a failure: an allow-listed path (a race) may be taken in some runs.
            for r in sorted(r for r in allowed if r[0] == who and r[2:] in used):
                log("allow-listed but used in this run: %s" % " ".join(r))
        check(not unused, "granted but never used by its identity (remove from the chart and rbac-expected.txt, "
              "or list in rbac-unused-allowed.txt with the reason): %s" % "; ".join(" ".join(r) for r in unused))

    try:
        case("setup: test bed, CRDs, the chart's ServiceAccount and RBAC, pods, agent, shimmed process registered", setup)
        if results[-1]:
            case("heartbeat: the scaler creates the node's Lease (the node identity cannot), the agent, "
                 "having waited, holds and renews it; none for a node without agent pod", own_lease)
            case("GPU full at restore: Restore waits (WaitingForGPUMemory, Warning Event), succeeds once "
                 "room is back", restore_waits_for_room)
            case("Restore onto a GPU the node lacks (spec.targetGPU): Failed + Event before the driver, still "
                 "suspended where it was; a plain Restore then succeeds", restore_onto_absent_gpu)
            case("a pod of two NCCL ranks: its Checkpoint suspends them as one group, its Restore brings both "
                 "back, digests of an uninterrupted run", tp_pod)
            case("bad input: pod missing -> Failed + Event, process untouched", pod_missing)
            case("bad input: pod without a GCR process -> Failed + Event", no_shim)
            case("bad input: pod on a node without an agent -> Failed + Event, process untouched",
                 other_node_no_agent)
            case("pod on another node with a live agent: left to that node's agent", other_node_served)
            case("bad input: Restore of a Failed Checkpoint -> Failed + Event", restore_of_failed)
            case("schema: the API server rejects a bad spec", schema)
            case("agent SIGKILLed before the suspend, restarted: done once", kill_mid("before-cr", "ck-k1", "rs-k1"))
            case("agent SIGKILLed after the suspend, restarted: not redone", kill_mid("after-cr", "ck-k2", "rs-k2"))
            case("keepContext, agent SIGKILLed after the suspend: seen as suspended in its mode, not redone",
                 kill_mid("after-cr", "ck-k3", "rs-k3", keep=True))
            case("SIGTERM mid-Checkpoint: it finishes, agent exits 0", sigterm)
            case("kube-apiserver restarted mid-watch: agent recovers; the expired watch (410) is relisted",
                 apiserver_restart)
            for step, want in (("suspend", ("Succeeded", "ImageWritten")), ("dump", ("Failed", "Interrupted")),
                               ("seal", ("Failed", "Interrupted")), ("back", ("Succeeded", "ImageWritten"))):
                case("action Image, agent SIGKILLed at step %s: finished from its record, %s, the process "
                     "running, nothing left" % (step, want[0]), image_killed(step, want, "ck-imgk-" + step))
            case("action Image: three images of one pod, the process running on; imagesKeep 2 removes the "
                 "oldest; a deleted Checkpoint's image removed", image_and_retention)
            case("action Image refused: a directory already there -> Failed + Warning Event, nothing overwritten, "
                 "process running; Image with keepContext refused by the API server", image_refused)
            case("finished objects are never redone", nothing_twice)
            case("/healthz and /metrics answer", metrics)
            case("program's own check after all cycles: RESULT ok", program_ok)
            fx["heal"] = False  # the cases below bring their own fixtures
            # Scale to zero (test_scale_e2e.py) on the same bed and namespace, with agents of
            # its own: so the RBAC audit below also covers what only the scaler uses.
            E.stop_agent()
            rc = E.stop_scaler()  # the scale cases run scalers of their own
            if rc != 0:
                results.append(False)
                print("FAIL scaler exit status %s on SIGTERM\n%s" % (rc, file_tail(E.scaler_log, 30)))
            import test_scale_e2e
            test_scale_e2e.base = sys.modules[__name__]
            test_scale_e2e.scale_cases(E, case)
            # Namespaces, a confined identity, deletions, objects applied together
            # (test_tenant_e2e.py): the node agent E.agent again, on node-a.
            import test_tenant_e2e
            test_tenant_e2e.base = sys.modules[__name__]
            test_tenant_e2e.tenant_cases(E, case)
    finally:
        rc = E.stop_agent()
        if rc not in (None, 0):
            results.append(False)
            print("FAIL agent exit status %s at the end" % rc)
            print(E.agent_tail())
        if results and results[0]:
            case("RBAC: every permission the chart grants each identity (node, scaler) was used by it (audit log)",
                 rbac_all_used)
        E.close()
    passed = sum(1 for r in results if r)
    failed = len(results) - passed
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
