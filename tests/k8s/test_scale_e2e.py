#!/usr/bin/env python3
# tests/k8s/test_scale_e2e.py: scale to zero end to end against the real kube-apiserver: two
# gcr-agent processes acting as two nodes, shimmed programs on the stand-in driver, a
# GPUResidency driven through kubectl scale and the /scale subresource. Stdlib only.
"""Usage: tests/k8s/test_scale_e2e.py [BUILD_DIR]   (default: build)

Runs alone (its own test bed and namespace, as test_agent_e2e.py) or as part of
test_agent_e2e.py, which calls scale_cases() so that the chart's RBAC audit covers the
scaler's identity too. Node agents (gcr-agent --role=node, the chart's node identity): nodes
scale-a (pods llm-0, llm-1) and scale-b (llm-2), heartbeat 1 s (the activity note). Two
scalers (--role=scaler, the chart's scaler identity, as the Deployment with 2 replicas):
scaler-1 and scaler-2, leader Lease term 3 s. llm-0's program keeps computing (the most
active); llm-1 and llm-2 go idle; llm-2 declares no readiness gate.
Every wait polls the API or fakesmi with a bound; the last line is "N passed, N failed".
"""

import json
import os
import signal
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_agent_e2e as base  # noqa: E402

Fail, check, log = base.Fail, base.check, base.log
NODES = ("scale-a", "scale-b")
SCALERS = ("scaler-1", "scaler-2")
GATE = "gpucr.dev/resident"
PODS = {"llm-0": NODES[0], "llm-1": NODES[0], "llm-2": NODES[1]}
RES = "llm"
FINALIZER = "gpucr.dev/resume-on-delete"


class Node:
    """One gcr-agent acting as one node (role node: its own shim socket dir, registry socket and
    metrics port), or as one replica of the scaler Deployment (role scaler: metrics port only)."""

    def __init__(self, E, name, role="node"):
        self.E, self.name, self.role = E, name, role
        self.sock_dir = os.path.join(E.dir, "run-" + name)
        os.makedirs(self.sock_dir, mode=0o700, exist_ok=True)
        self.registry = os.path.join(self.sock_dir, "agent.sock")
        self.port = base.free_port()
        self.proc = None
        self.runs = 0
        self.log_path = None
        self.special = False

    def start(self, extra_env=None):
        E = self.E
        self.runs += 1
        self.special = bool(extra_env)  # a test hook (a pause): heal restarts it plainly
        self.log_path = os.path.join(E.dir, "agent-%s.%d.log" % (self.name, self.runs))
        env = E.fake_env()
        env["GCR_LOG_LEVEL"] = "info"
        env.update(extra_env or {})
        if self.role == "scaler":  # as the chart's Deployment: no node, its pod name in POD_NAME
            env["POD_NAME"] = self.name
            argv = [base.AGENT, "--role", "scaler", "--kubeconfig", E.scaler_kubeconfig, "--metrics-address",
                    "[127.0.0.1]:%d" % self.port, "--lease-namespace", base.LEASE_NS, "--leader-lease-seconds", "3",
                    "--agent-selector", base.AGENT_SELECTOR]
        else:
            argv = [base.AGENT, "--role", "node", "--kubeconfig", E.kubeconfig, "--node-name", self.name,
                    "--socket-dir", self.sock_dir, "--registry-socket", self.registry, "--metrics-address",
                    "127.0.0.1:%d" % self.port, "--proc-root", E.proc_root, "--lease-namespace", base.LEASE_NS,
                    "--heartbeat-seconds", "1",
                    # Its own: the default (/var/lib/gcr/images) is the real node's, whose images
                    # this agent's sweep would remove (their Checkpoints are not in this cluster).
                    "--images-dir", os.path.join(E.dir, "images-%s" % self.name)]
        if os.environ.get("GCR_E2E_VALGRIND") == "1":
            argv = ["valgrind", "--quiet", "--error-exitcode=99", "--leak-check=full",
                    "--errors-for-leak-kinds=definite",
                    "--suppressions=%s" % os.path.join(base.SRC, "tests", "valgrind.supp"), *argv]
        self.proc = base.subprocess.Popen(argv, stdout=open(self.log_path, "w"), stderr=base.subprocess.STDOUT,
                                          env=env, start_new_session=True)
        E.wait("agent %s /readyz" % self.name, lambda: self.http("/readyz")[0] == 200, timeout=120)

    def stop(self, sig=signal.SIGTERM):
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(60)
        except base.subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(30)
        self.proc = None
        return rc

    def http(self, path):
        return base.http_get(self.port, path)

    def tail(self, n=30):
        return base.file_tail(self.log_path, n)

    def start_prog(self, pod_uid, cid, iters):
        """gcr-testprog under the shim, registered with this node's agent (cgroup names the pod)."""
        E = self.E
        cg = ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod%s.slice/"
              "cri-containerd-%s.scope" % (pod_uid.replace("-", "_"), cid))
        # The registry reads the process's start time from <proc-root>/<pid>/stat: the real one.
        script = ('mkdir -p "$ROOT/$$" && printf "%s\\n" "$CG" > "$ROOT/$$/cgroup" && '
                  'ln -sf /proc/$$/stat "$ROOT/$$/stat" && exec env LD_PRELOAD="$SHIMLIB" "$@"')
        env = dict(E.env)
        env.update({"ROOT": E.proc_root, "CG": cg, "SHIMLIB": base.SHIM, "LD_LIBRARY_PATH": base.FAKE_DIR,
                    "FAKECUDA_DIR": E.fake_dir, "FAKECUDA_MEM_MIB": "512", "GCR_SOCKET_DIR": self.sock_dir,
                    "GCR_AGENT_SOCKET": self.registry, "GCR_LOG_LEVEL": "warn"})
        argv = ["bash", "-c", script, "prog", base.TESTPROG, "--module",
                os.path.join(base.SRC, "tests", "progs", "gcr_kernels.h"),
                "--mib", "16", "--threads", "2", "--iters", str(iters), "--wait"]
        p = base.Prog(argv, env)
        E.progs.append(p)
        m = p.expect(r"READY pid=(\d+)", 60)
        check(int(m.group(1)) == p.p.pid, "READY pid %s != %d" % (m.group(1), p.p.pid))
        return p


def scale_cases(E, case):
    """The scale-to-zero cases, on a test bed E already set up (test bed, CRDs, namespace, identity)."""
    st = {"nodes": {n: Node(E, n) for n in NODES}, "scalers": {n: Node(E, n, "scaler") for n in SCALERS},
          "pods": {}}
    ns = base.NS

    def res():
        return E.get("gpuresidency", RES) or {}

    def status():
        return res().get("status") or {}

    def ready(s):
        c = [c for c in s.get("conditions", []) if c.get("type") == "Ready"]
        return c[0] if c else {}

    def wait_resident(n, name=RES, timeout=base.WAIT_S):
        """Waits for Ready True with n resident; returns the status."""
        def f():
            s = (E.get("gpuresidency", name) or {}).get("status") or {}
            return s if s.get("replicas") == n and ready(s).get("status") == "True" else None
        try:
            return E.wait("%s: %d resident, Ready" % (name, n), f, timeout)
        except Fail:
            raise Fail("%s never reached %d resident; status: %s" % (name, n,
                       json.dumps((E.get("gpuresidency", name) or {}).get("status"))))

    def pid(pod):
        return st["pods"][pod]["prog"].p.pid

    def is_suspended(pod):
        return E.mem(pid(pod)) == 0 and E.drv_state(pid(pod)) == "checkpointed"

    def is_resident(pod):
        return E.mem(pid(pod)) > 0 and E.drv_state(pid(pod)) == "running"

    def gate(pod):
        o = E.get("pod", pod) or {}
        c = [c for c in o.get("status", {}).get("conditions", []) if c.get("type") == GATE]
        return c[0].get("status") if c else None

    def pod_states(s):
        return {p["name"]: p["state"] for p in s.get("pods", [])}

    def agree(s):
        """The status, the processes and the readiness gates tell the same story."""
        states = pod_states(s)
        for pod in st["pods"]:
            if pod not in states:
                continue
            if states[pod] == "Suspended":
                check(is_suspended(pod), "%s Suspended in status, but pid %d holds %d bytes (driver %s)"
                      % (pod, pid(pod), E.mem(pid(pod)), E.drv_state(pid(pod))))
                want = "False"
            else:
                check(states[pod] == "Resident", "%s is %s" % (pod, states[pod]))
                check(is_resident(pod), "%s Resident in status, but pid %d is %s" % (pod, pid(pod),
                      E.drv_state(pid(pod))))
                want = "True"
            if pod == "llm-2":
                check(gate(pod) is None, "llm-2 declares no gate, yet has condition %s" % gate(pod))
            else:  # the gate writer follows the same events as the status: bounded wait, not a race
                try:
                    E.wait("%s: %s=%s" % (pod, GATE, want), lambda: gate(pod) == want, timeout=10)
                except Fail:
                    raise Fail("%s: %s=%s, want %s" % (pod, GATE, gate(pod), want))
        check(s["replicas"] == sum(1 for v in states.values() if v == "Resident"), "replicas %s" % s)
        check(s["suspended"] == sum(1 for v in states.values() if v == "Suspended"), "suspended %s" % s)

    def scale_put(n):
        """What an HPA or KEDA does: GET .../scale, set spec.replicas, PUT it back. The Scale
        carries the object's resourceVersion, which the scaler's status writes move on: a
        Conflict is read again and retried, as client-go's RetryOnConflict does (5 tries)."""
        path = "/apis/gpucr.dev/v1alpha1/namespaces/%s/gpuresidencies/%s/scale" % (ns, RES)
        for _ in range(5):
            sc = json.loads(E.k("get", "--raw", path).stdout)
            check(sc["kind"] == "Scale" and sc["status"].get("selector") == "app=llm", "Scale: %s" % sc)
            sc["spec"]["replicas"] = n
            out = E.k("replace", "--raw", path, "-f", "-", stdin=json.dumps(sc), ok=False)
            if out.returncode == 0:
                return
            if "Conflict" not in out.stderr:
                break
        raise Fail("PUT %s (replicas %d): %s" % (path, n, out.stderr.strip()))

    def ops(kind, pod=None):
        out = E.k("get", kind, "-n", ns, "-l", "gpucr.dev/residency-uid=%s" % res()["metadata"]["uid"],
                  "-o", "json")
        items = json.loads(out.stdout)["items"]
        if pod:
            items = [i for i in items if i["metadata"]["annotations"].get("gpucr.dev/pod") == pod]
        return items

    def leader():
        out = E.k("get", "lease", "gcr-scaler-leader", "-n", base.LEASE_NS, "-o", "json", ok=False)
        return json.loads(out.stdout)["spec"].get("holderIdentity", "") if out.returncode == 0 else ""

    def setup():
        E.k("wait", "--for=condition=Established", "--timeout=60s", "crd/gpuresidencies.gpucr.dev")
        for n in list(st["scalers"].values()) + list(st["nodes"].values()):
            n.start()
        for n in NODES:  # the DaemonSet's pods: the leader creates these nodes' heartbeat Leases
            E.make_agent_pod(n)
        for i, (pod, node) in enumerate(sorted(PODS.items())):
            cid = uuid.uuid4().hex + uuid.uuid4().hex
            spec = {"nodeName": node, "containers": [{"name": "main", "image": "example.invalid/gpu:1"}]}
            if pod != "llm-2":
                spec["readinessGates"] = [{"conditionType": GATE}]
            E.apply({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": pod, "namespace": ns, "labels": {"app": "llm"}}, "spec": spec})
            E.k("patch", "pod", pod, "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps(
                {"status": {"phase": "Running", "containerStatuses": [{
                    "name": "main", "containerID": "containerd://" + cid, "image": "example.invalid/gpu:1",
                    "imageID": "", "ready": True, "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}))
            uid = E.get("pod", pod)["metadata"]["uid"]
            # llm-0 keeps computing (the most active); the others finish and idle.
            p = st["nodes"][node].start_prog(uid, cid, 1000000 if pod == "llm-0" else 5)
            p.send("go")
            if pod != "llm-0":
                p.expect(r"DONE$", 60)
            st["pods"][pod] = {"prog": p, "uid": uid, "node": node}
        # Activity: each node's Lease lists its pods, llm-0 the latest active.
        def activity():
            notes = {}
            for n in NODES:
                out = E.k("get", "lease", "gcr-agent-" + n, "-n", base.LEASE_NS, "-o", "json", ok=False)
                if out.returncode != 0:
                    return None
                a = json.loads(out.stdout)["metadata"].get("annotations", {}).get("gpucr.dev/activity")
                notes.update(json.loads(a)["pods"] if a else {})
            t = {pod: notes.get(v["uid"], {}).get("t") for pod, v in st["pods"].items()}
            return t if all(t.values()) and t["llm-0"] > max(t["llm-1"], t["llm-2"]) else None
        E.wait("activity notes on both nodes' Leases, llm-0 the most recent", activity)
        E.apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "GPUResidency",
                 "metadata": {"name": RES, "namespace": ns},
                 "spec": {"selector": {"matchLabels": {"app": "llm"}}, "replicas": 3}})
        s = wait_resident(3)
        check(s.get("selector") == "app=llm" and s.get("suspended") == 0, "status %s" % s)
        E.wait("readiness gates True on llm-0 and llm-1", lambda: gate("llm-0") == "True" and gate("llm-1") == "True")
        agree(status())
        check(any(leader().startswith(n + "-") for n in SCALERS), "leader Lease holder %r" % leader())

    def to_zero():
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=0")
        s = wait_resident(0)
        check(s["suspended"] == 3 and s.get("observedGeneration") == res()["metadata"]["generation"], "status %s" % s)
        ls = s.get("lastScale", {})
        check(ls.get("to") == 0 and ls.get("from") == 3 and ls.get("durationMs") is not None, "lastScale %s" % ls)
        log("3 -> 0 in %s ms (from the leader seeing the change)" % ls.get("durationMs"))
        agree(s)
        for pod in PODS:
            c = ops("checkpoints", pod)
            check(len(c) == 1 and c[0]["status"]["phase"] == "Succeeded", "%s: Checkpoints %s" % (pod, c))
            own = c[0]["metadata"].get("ownerReferences", [])
            check(own and own[0]["kind"] == "Pod" and own[0]["uid"] == st["pods"][pod]["uid"], "owner %s" % own)
        check(not E.wait_event(RES, "Normal", "Scaled") is None, "no Scaled event")

    def to_two_by_put():
        if status().get("replicas") != 0:  # its own starting point when the case before failed
            E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=0")
            wait_resident(0)
        scale_put(2)
        s = wait_resident(2)
        states = pod_states(s)
        check(states["llm-0"] == "Resident", "the most active pod was not resumed first: %s" % states)
        agree(s)
        # What was superseded is gone: per resumed pod only its Restore is left.
        r = [p for p, v in states.items() if v == "Resident"]
        for pod in r:
            check(not ops("checkpoints", pod) and len(ops("restores", pod)) == 1, "%s: objects left: %s %s"
                  % (pod, ops("checkpoints", pod), ops("restores", pod)))

    def to_three():
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=3")
        agree(wait_resident(3))
        # 3 -> 2: the least active goes first, never the busy llm-0.
        scale_put(2)
        s = wait_resident(2)
        check(pod_states(s)["llm-0"] == "Resident", "llm-0 suspended first: %s" % pod_states(s))
        agree(s)
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=3")
        agree(wait_resident(3))

    def parallel():
        # Each Checkpoint paused 3 s on its node (the test hook): llm-0 and llm-1 share node
        # scale-a, and its agent must run theirs at once (the recorded intervals overlap).
        slow = {"GCR_AGENT_TEST_PAUSE": "before-cr", "GCR_AGENT_TEST_PAUSE_S": "3"}
        for n in st["nodes"].values():
            check(n.stop() == 0, "agent %s: exit status on SIGTERM" % n.name)
            n.start(slow)
        agree(wait_resident(3))  # every process listed again by the restarted agents
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=0")
        s = wait_resident(0, timeout=90)
        check(s["suspended"] == 3, "status %s" % s)
        agree(s)
        a, b = (ops("checkpoints", pod)[0]["status"] for pod in ("llm-0", "llm-1"))
        check(a["nodeName"] == b["nodeName"] == NODES[0], "nodes %s %s" % (a["nodeName"], b["nodeName"]))
        check(a["startTime"] < b["completionTime"] and b["startTime"] < a["completionTime"],
              "not in parallel: llm-0 %s..%s, llm-1 %s..%s" % (a["startTime"], a["completionTime"],
                                                             b["startTime"], b["completionTime"]))
        log("llm-0 %s..%s, llm-1 %s..%s on %s" % (a["startTime"], a["completionTime"], b["startTime"],
                                                  b["completionTime"], NODES[0]))
        body = st["nodes"][NODES[0]].http("/metrics")[1]
        check('gcr_agent_operations_total{kind="checkpoint",result="succeeded"} 2' in body,
              "scale-a's metrics: %s" % [l for l in body.splitlines() if "operations_total" in l])
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=3")
        agree(wait_resident(3))

    def failover():
        # Each Checkpoint takes 2 s on its node (the test hook), so the scale is surely
        # in flight when the leading scaler dies; the node agents go on with theirs.
        slow = {"GCR_AGENT_TEST_PAUSE": "before-cr", "GCR_AGENT_TEST_PAUSE_S": "2"}
        for n in st["nodes"].values():
            check(n.stop() == 0, "agent %s: exit status on SIGTERM" % n.name)
            n.start(slow)
        E.wait("a leader", lambda: any(leader().startswith(n + "-") for n in SCALERS), timeout=30)
        before = leader()
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=0")
        E.wait("a Checkpoint of the new scale Running", lambda: any(
            c.get("status", {}).get("phase") == "Running" for c in ops("checkpoints")))
        victim = [n for n in st["scalers"].values() if before.startswith(n.name + "-")]
        check(len(victim) == 1, "leader %r is none of the scalers" % before)
        victim = victim[0]
        victim.stop(signal.SIGKILL)
        done = [c for c in ops("checkpoints") if c.get("status", {}).get("phase") == "Succeeded"]
        log("SIGKILLed the leader %s mid-scale (%d of 3 Checkpoints done)" % (before, len(done)))
        check(len(done) < 3, "the scale had ended before the kill")
        E.wait("another agent leads", lambda: leader() and leader() != before, timeout=30)
        victim.start()  # back as a candidate
        s = wait_resident(0, timeout=90)
        check(s["suspended"] == 3 and s.get("leader") != before, "status %s" % s)
        agree(s)
        for pod in PODS:
            c = ops("checkpoints", pod)
            check(len(c) == 1 and c[0]["status"]["phase"] == "Succeeded", "%s: Checkpoints %s" % (pod, c))

    def changed_mid_scale():
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=3")
        E.wait("a Restore of the scale to 3", lambda: ops("restores"))
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=1")
        s = wait_resident(1, timeout=90)
        check(s["suspended"] == 2 and s["suspending"] == 0 and s["resuming"] == 0, "status %s" % s)
        agree(s)
        for kind in ("checkpoints", "restores"):
            for o in ops(kind):
                check(o.get("status", {}).get("phase") in ("Succeeded", "Failed"), "%s %s unfinished: %s"
                      % (kind, o["metadata"]["name"], o.get("status")))

    def cond(s, type_):
        c = [c for c in s.get("conditions", []) if c.get("type") == type_]
        return c[0] if c else {}

    def status_of(name):
        return (E.get("gpuresidency", name) or {}).get("status") or {}

    def truthful(s, what):
        """Every pod s lists is in the state s gives it, as its process really is (fakesmi)."""
        for pod, state in pod_states(s).items():
            if pod not in st["pods"]:
                continue
            if state == "Suspended":
                check(is_suspended(pod), "%s: %s Suspended in status, but pid %d holds %d bytes (driver %s)"
                      % (what, pod, pid(pod), E.mem(pid(pod)), E.drv_state(pid(pod))))
            else:
                check(state == "Resident" and is_resident(pod), "%s: %s is %s in status, driver %s"
                      % (what, pod, state, E.drv_state(pid(pod))))

    def all_ops():
        """Names of every Checkpoint and Restore of the namespace, whoever made them."""
        names = set()
        for kind in ("checkpoints", "restores"):
            out = E.k("get", kind, "-n", ns, "-o", "json")
            names |= {kind + "/" + i["metadata"]["name"] for i in json.loads(out.stdout)["items"]}
        return names

    def conflict():
        # llm (the older) keeps 3 resident; llm-c, made now, selects the same pods and wants 0.
        # The rule: the older acts on a shared pod, the newer leaves it alone and says so.
        check(wait_resident(3)["replicas"] == 3, "not 3 resident to begin with")
        E.apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "GPUResidency",
                 "metadata": {"name": "llm-c", "namespace": ns},
                 "spec": {"selector": {"matchLabels": {"app": "llm"}}, "replicas": 0}})

        def both(want):
            a, b = status(), status_of("llm-c")
            ok = cond(a, "SelectorConflict").get("status") == want and cond(b, "SelectorConflict").get("status") == want
            return (a, b) if ok else None
        try:
            a, b = E.wait("SelectorConflict True on llm and llm-c", lambda: both("True"))
        except Fail:
            raise Fail("no SelectorConflict condition: llm %s; llm-c %s" % (json.dumps(status().get("conditions")),
                                                                            json.dumps(status_of("llm-c"))))
        ma, mb = cond(a, "SelectorConflict")["message"], cond(b, "SelectorConflict")["message"]
        check("llm-c" in ma and "this one is older and acts on them" in ma, "llm's condition: %s" % ma)
        check("GPUResidency llm " in mb and "it is older and acts on them, this one leaves them alone" in mb,
              "llm-c's condition: %s" % mb)
        for name in (RES, "llm-c"):
            ev = E.wait_event(name, "Warning", "SelectorConflict")
            check(all(p in ev[0].get("note", "") for p in PODS), "%s's Event: %s" % (name, ev[0].get("note")))
        b = E.wait("llm-c: Ready False SelectorConflict, its 3 pods listed", lambda: (lambda x: x if ready(x).get(
            "reason") == "SelectorConflict" and len(x.get("pods", [])) == 3 else None)(status_of("llm-c")))
        check(ready(b)["status"] == "False", "llm-c Ready: %s" % ready(b))
        check(all(p.get("state") == "Resident" and "older" in p.get("message", "") for p in b["pods"]),
              "llm-c's pods: %s" % b["pods"])
        truthful(b, "llm-c")
        check(ready(status()).get("status") == "True" and status()["replicas"] == 3, "llm: %s" % status())
        truthful(status(), "llm")
        uid_c = E.get("gpuresidency", "llm-c")["metadata"]["uid"]
        # Only the winner acts: its scale to 0 suspends all; llm-c made nothing and reports them as they are.
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=0")
        s = wait_resident(0)
        agree(s)
        b = E.wait("llm-c: its 3 pods Suspended, as they are", lambda: (lambda x: x if sorted(
            pod_states(x).values()) == ["Suspended"] * 3 else None)(status_of("llm-c")))
        truthful(b, "llm-c")
        check(b["suspended"] == 3 and b["replicas"] == 0 and ready(b)["status"] == "False", "llm-c: %s" % b)
        for kind in ("checkpoints", "restores"):
            check(not ops_of(kind, uid_c), "llm-c made %s: %s" % (kind, [o["metadata"]["name"] for o in
                                                                        ops_of(kind, uid_c)]))
        # The conflict ends (llm-c selects other pods): the condition goes False on both.
        E.k("patch", "gpuresidency", "llm-c", "-n", ns, "--type=merge", "-p",
            json.dumps({"spec": {"selector": {"matchLabels": {"app": "llm-elsewhere"}}}}))
        a, b = E.wait("SelectorConflict False on llm and llm-c", lambda: both("False"))
        check(ready(b).get("reason") == "NoPodsSelected", "llm-c Ready: %s" % ready(b))
        E.wait_event(RES, "Normal", "SelectorConflictResolved")
        E.k("delete", "gpuresidency", "llm-c", "-n", ns, "--wait=false")
        E.wait("GPUResidency llm-c deleted", lambda: E.get("gpuresidency", "llm-c") is None)
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=3")
        agree(wait_resident(3))

    def suspended_elsewhere():
        # A user's own Checkpoint suspends llm-1, which llm selects: its status must say so,
        # and the scaler must neither suspend it again nor resume what it did not suspend.
        check(wait_resident(3)["replicas"] == 3, "not 3 resident to begin with")
        before = all_ops()
        E.apply(base.checkpoint("user-ck", "llm-1"))
        c = E.wait_phase("checkpoint", "user-ck", ("Succeeded", "Failed"))["status"]
        check(c["phase"] == "Succeeded", "user's Checkpoint: %s" % c.get("message"))
        check(is_suspended("llm-1"), "llm-1 not suspended by the user's Checkpoint")
        try:
            s = E.wait("llm: llm-1 Suspended", lambda: (lambda x: x if pod_states(x).get("llm-1") == "Suspended"
                                                        else None)(status()))
        except Fail:
            raise Fail("llm-1 is suspended, yet llm's status says %s" % json.dumps(status()))
        e = [p for p in s["pods"] if p["name"] == "llm-1"][0]
        check("other means" in e.get("message", ""), "llm-1's entry: %s" % e)
        check(s["replicas"] == 2 and s["suspended"] == 1, "status %s" % s)
        s = E.wait("llm: Ready False SuspendedElsewhere", lambda: (lambda x: x if ready(x).get(
            "reason") == "SuspendedElsewhere" else None)(status()))
        truthful(s, "llm")
        # Target 2: reached with llm-1 as it is; nothing else suspended, llm-1 not suspended again.
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=2")
        s = wait_resident(2)
        check(pod_states(s).get("llm-1") == "Suspended", "status %s" % s)
        truthful(s, "llm")
        # Target 3: llm-1 is not the scaler's to resume: it waits, says why, makes nothing.
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=3")
        gen = res()["metadata"]["generation"]
        s = E.wait("llm: target 3 seen, SuspendedElsewhere", lambda: (lambda x: x if x.get(
            "observedGeneration") == gen and ready(x).get("reason") == "SuspendedElsewhere" else None)(status()))
        truthful(s, "llm")
        made = all_ops() - before
        check(made == {"checkpoints/user-ck"}, "the scaler acted: new objects %s" % sorted(made))
        # The user resumes it: resident again, as the status then says.
        E.apply(base.restore("user-rs", "user-ck"))
        r = E.wait_phase("restore", "user-rs", ("Succeeded", "Failed"))["status"]
        check(r["phase"] == "Succeeded", "user's Restore: %s" % r.get("message"))
        s = wait_resident(3)
        agree(s)
        made = all_ops() - before
        check(made == {"checkpoints/user-ck", "restores/user-rs"}, "the scaler acted: new objects %s" % sorted(made))
        E.k("delete", "restore", "user-rs", "-n", ns, "--wait=false")
        E.k("delete", "checkpoint", "user-ck", "-n", ns, "--wait=false")

    def pod_deleted_suspended():
        s = status()
        gone = sorted(p for p, v in pod_states(s).items() if v == "Suspended")[0]
        uid = st["pods"][gone]["uid"]
        E.k("delete", "pod", gone, "-n", ns, "--grace-period=0", "--force")
        st["pods"].pop(gone)["prog"].kill()  # its process goes with it
        E.wait("%s's Checkpoint and Restore objects removed" % gone,
               lambda: not ops("checkpoints", gone) and not ops("restores", gone))
        E.wait_event(RES, "Normal", "PodGone")
        s = E.wait("status without %s" % gone, lambda: (lambda x: x if gone not in pod_states(x) and ready(x).get(
            "status") == "True" else None)(status()))
        check(s["replicas"] == 1 and s["suspended"] == 1, "status %s" % s)
        check(uid not in json.dumps(s), "status still names uid %s" % uid)
        agree(s)

    def nothing_selected():
        E.apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "GPUResidency",
                 "metadata": {"name": "none", "namespace": ns},
                 "spec": {"selector": {"matchExpressions": [{"key": "app", "operator": "In",
                                                             "values": ["nothing-here"]}]}, "replicas": 2}})
        s = E.wait("GPUResidency none: NoPodsSelected", lambda: (lambda x: x if ready(x).get(
            "reason") == "NoPodsSelected" else None)((E.get("gpuresidency", "none") or {}).get("status") or {}))
        check(s.get("replicas") == 0 and ready(s)["status"] == "False" and "nothing-here" in ready(s)["message"],
              "status %s" % s)

    def no_shim():
        E.apply({"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "plain", "namespace": ns, "labels": {"app": "plain"}},
                 "spec": {"nodeName": NODES[0], "containers": [{"name": "main", "image": "example.invalid/x:1"}]}})
        E.k("patch", "pod", "plain", "-n", ns, "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"phase": "Running"}}))
        E.apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "GPUResidency",
                 "metadata": {"name": "plain", "namespace": ns},
                 "spec": {"selector": {"matchLabels": {"app": "plain"}}, "replicas": 0}})
        s = E.wait("GPUResidency plain: the pod Unmanaged", lambda: (lambda x: x if x.get("unmanaged") == 1 and ready(
            x) else None)((E.get("gpuresidency", "plain") or {}).get("status") or {}))
        p = s["pods"][0]
        check(p["state"] == "Unmanaged" and "no process under the GCR shim" in p.get("message", ""), "pods %s" % s)
        check(s["replicas"] == 0 and s["suspended"] == 0, "status %s" % s)
        uid = E.get("gpuresidency", "plain")["metadata"]["uid"]
        out = E.k("get", "checkpoints", "-n", ns, "-l", "gpucr.dev/residency-uid=" + uid, "-o", "name")
        check(out.stdout.strip() == "", "Checkpoints made for a pod without the shim: %s" % out.stdout)

    def programs_ok():
        # The deletions before left every pod resident (a suspended program waits at the gate).
        for pod in st["pods"]:
            check(is_resident(pod), "%s is %s" % (pod, E.drv_state(pid(pod))))
        for pod, v in st["pods"].items():
            if pod == "llm-0":
                v["prog"].expect(r"ITER \d+", 60)  # still computing
                continue
            v["prog"].send("check")
            m = v["prog"].expect(r"RESULT (.*)", 120)
            check(m.group(1) == "ok", "%s's program reports RESULT %s" % (pod, m.group(1)))

    def ops_of(kind, uid):
        out = E.k("get", kind, "-n", ns, "-l", "gpucr.dev/residency-uid=%s" % uid, "-o", "json")
        return json.loads(out.stdout)["items"]

    def delete_resumes():
        # All suspended, then the GPUResidency deleted with each Restore paused 2 s on its node,
        # and the leader SIGKILLed while they run: the next one finishes, then lets it go.
        slow = {"GCR_AGENT_TEST_PAUSE": "before-rs", "GCR_AGENT_TEST_PAUSE_S": "2"}
        for n in st["nodes"].values():
            check(n.stop() == 0, "agent %s: exit status on SIGTERM" % n.name)
            n.start(slow)
        # The restarted agents list every pod's process again (else a pod is Unmanaged).
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=%d" % len(st["pods"]))
        agree(wait_resident(len(st["pods"])))
        E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=0")
        s = wait_resident(0)
        check(s["suspended"] == len(st["pods"]), "status %s" % s)
        agree(s)
        r = res()
        check(FINALIZER in r["metadata"].get("finalizers", []), "finalizers %s" % r["metadata"].get("finalizers"))
        uid = r["metadata"]["uid"]
        E.k("delete", "gpuresidency", RES, "-n", ns, "--wait=false")
        E.wait("a Restore of the deletion Running", lambda: [
            o for o in ops_of("restores", uid) if o.get("status", {}).get("phase") == "Running"
            and o["metadata"].get("annotations", {}).get("gpucr.dev/on-delete")])
        before = leader()
        victim = [n for n in st["scalers"].values() if before.startswith(n.name + "-")]
        check(len(victim) == 1, "leader %r is none of the scalers" % before)
        victim[0].stop(signal.SIGKILL)
        check(E.get("gpuresidency", RES) is not None, "gone before its pods were resumed")
        E.wait("another agent leads", lambda: leader() and leader() != before, timeout=30)
        victim[0].start()  # back as a candidate
        E.wait("GPUResidency %s deleted" % RES, lambda: E.get("gpuresidency", RES) is None, timeout=90)
        for pod in st["pods"]:
            check(is_resident(pod), "%s not resident after the deletion: driver %s" % (pod, E.drv_state(pid(pod))))
            if pod != "llm-2":
                check(gate(pod) == "True", "%s: %s=%s after the deletion" % (pod, GATE, gate(pod)))
        for kind in ("checkpoints", "restores"):
            check(not ops_of(kind, uid), "%s left: %s" % (kind, [o["metadata"]["name"] for o in ops_of(kind, uid)]))
        ev = E.wait_event(RES, "Normal", "ResumedOnDelete")
        log("leader %s SIGKILLed mid-deletion; %s" % (before, ev[0].get("note")))

    def delete_gives_up():
        # A pod whose node has no live agent cannot be resumed: the deletion gives it up at
        # once (never hangs), resumes the others, says so, and keeps that pod's Checkpoint,
        # which a Restore made by hand later brings back.
        E.apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "GPUResidency",
                 "metadata": {"name": "llm-b", "namespace": ns},
                 "spec": {"selector": {"matchLabels": {"app": "llm"}}, "replicas": 0}})
        s = wait_resident(0, name="llm-b")
        check(s["suspended"] == len(st["pods"]), "status %s" % s)
        uid = E.get("gpuresidency", "llm-b")["metadata"]["uid"]
        lost = [p for p, v in st["pods"].items() if v["node"] == NODES[1]]
        kept = [p for p in st["pods"] if p not in lost]
        check(lost and kept, "pods %s" % st["pods"])
        node_b = st["nodes"][NODES[1]]
        check(node_b.stop() == 0, "agent %s: exit status on SIGTERM" % NODES[1])
        E.k("delete", "lease", "gcr-agent-" + NODES[1], "-n", base.LEASE_NS)  # as if its term ran out
        E.k("delete", "gpuresidency", "llm-b", "-n", ns, "--wait=false")
        E.wait("GPUResidency llm-b deleted", lambda: E.get("gpuresidency", "llm-b") is None)
        ev = E.wait_event("llm-b", "Warning", "ResumeOnDeleteFailed")
        note = ev[0].get("note", "")
        check(all(p in note for p in lost) and "no live GCR agent" in note and not any(p in note for p in kept),
              "event note: %s" % note)
        for pod in kept:
            check(is_resident(pod), "%s not resumed: driver %s" % (pod, E.drv_state(pid(pod))))
        for pod in lost:
            check(is_suspended(pod), "%s is not suspended any more" % pod)
        left = ops_of("checkpoints", uid)
        check(sorted(o["metadata"]["annotations"]["gpucr.dev/pod"] for o in left) == sorted(lost),
              "Checkpoints left: %s" % [o["metadata"]["name"] for o in left])
        check(not ops_of("restores", uid), "Restores left: %s" % ops_of("restores", uid))
        node_b.start()
        # Its Lease is gone and it may not create one: the leader re-creates it (the agent
        # pod is still there), then the agent renews it. Until then the other node's agent
        # would fail a Restore for its pods with NoAgentOnNode.
        E.wait("Lease gcr-agent-%s re-created by the scaler and renewed by its agent" % NODES[1],
               lambda: (E.lease(NODES[1]) or {}).get("spec", {}).get("holderIdentity") == NODES[1])
        E.wait("agent %s lists its process again" % NODES[1],
               lambda: "gcr_agent_registered_processes %d" % len(lost) in node_b.http("/metrics")[1])
        for o in left:
            E.apply(base.restore("by-hand-" + o["metadata"]["annotations"]["gpucr.dev/pod"], o["metadata"]["name"]))
        for o in left:
            pod = o["metadata"]["annotations"]["gpucr.dev/pod"]
            r = E.wait_phase("restore", "by-hand-" + pod, ("Succeeded", "Failed"))["status"]
            check(r["phase"] == "Succeeded", "Restore by hand: %s" % r.get("message"))
            check(is_resident(pod), "%s not resident after the Restore by hand" % pod)

    def heal():
        """After a failed case, the starting point the next one expects: every agent and scaler
        running without test hooks, and, while the GPUResidency exists, every pod resident."""
        for n in list(st["nodes"].values()) + list(st["scalers"].values()):
            if n.proc is None or n.proc.poll() is not None or n.special:
                n.stop()
                n.start()
        if st["pods"] and E.get("gpuresidency", RES) is not None:
            E.k("scale", "gpuresidency/" + RES, "-n", ns, "--replicas=%d" % len(st["pods"]))
            wait_resident(len(st["pods"]), timeout=90)
        log("healed after the failure: agents plain, %d pods resident" % len(st["pods"]))

    def wrapped(fn):
        def run():
            try:
                fn()
            except Exception:
                for n in list(st["nodes"].values()) + list(st["scalers"].values()):
                    print("  agent %s log tail:\n%s" % (n.name, "\n".join("    " + l for l in n.tail().splitlines())))
                try:
                    heal()
                except Exception as e:  # noqa: BLE001 - reported; the next case says what it finds
                    print("  heal failed: %s" % e, flush=True)
                raise
        run.case_fn = fn.__name__
        return run

    # GCR_SCALE_ONLY=conflict,suspended_elsewhere: setup and those cases only (a quick rerun).
    only = set(filter(None, os.environ.get("GCR_SCALE_ONLY", "").split(",")))
    run_case = case

    def case(name, fn):
        if not only or getattr(fn, "case_fn", "setup") in only | {"setup"}:
            run_case(name, fn)

    try:
        case("scale: two agents as two nodes, 3 pods selected, activity on the Leases, Ready at 3", wrapped(setup))
        if st["pods"]:
            case("scale: kubectl scale 3 -> 0: all suspended, gates False, one Checkpoint per pod", wrapped(to_zero))
            case("scale: PUT /scale (as HPA/KEDA) 0 -> 2: most active first, gates True", wrapped(to_two_by_put))
            case("scale: 2 -> 3, 3 -> 2 (least active first), -> 3", wrapped(to_three))
            case("scale: two GPUResidencies select the same pods: SelectorConflict condition and Warning Event on "
                 "both, only the older acts, status as the processes are; condition False once it ends",
                 wrapped(conflict))
            case("scale: a selected pod suspended by a user's Checkpoint: reported Suspended (not Resident), "
                 "never suspended again nor resumed by the scaler", wrapped(suspended_elsewhere))
            case("scale: two pods of one node suspended at once (max-parallel): operations overlap",
                 wrapped(parallel))
            case("scale: leader SIGKILLed mid-scale to 0: another takes over, done once", wrapped(failover))
            case("scale: replicas changed mid-scale (0 -> 3, then 1): nothing half-done", wrapped(changed_mid_scale))
            case("scale: pod deleted while suspended: its objects removed, status truthful",
                 wrapped(pod_deleted_suspended))
            case("scale: selector matching nothing: Ready False NoPodsSelected", wrapped(nothing_selected))
            case("scale: pod without the shim: Unmanaged, never a Checkpoint", wrapped(no_shim))
            case("scale: GPUResidency deleted while all suspended, leader SIGKILLed mid-way: pods resumed, "
                 "objects removed, then it goes", wrapped(delete_resumes))
            case("scale: GPUResidency deleted with a pod on a node without agent: given up at once, Warning, "
                 "its Checkpoint kept and restorable by hand", wrapped(delete_gives_up))
            case("scale: programs' own data checks after every cycle", wrapped(programs_ok))
    finally:
        for n in list(st["nodes"].values()) + list(st["scalers"].values()):
            rc = n.stop()
            if rc not in (None, 0):
                case("scale: agent %s exits 0 on SIGTERM" % n.name, lambda: (_ for _ in ()).throw(
                    Fail("exit status %s" % rc)))


def main():
    if base.binaries_missing():
        return 1
    E = base.Env()
    results = []

    def case(name, fn):
        base.run_case(results, name, fn)

    def setup():
        E.testbed_up()
        E.k("apply", "-f", os.path.join(base.SRC, "crd"))
        E.k("create", "namespace", base.NS)
        E.agent_identity()

    try:
        case("setup: test bed, CRDs, the chart's ServiceAccount and RBAC", setup)
        if results[-1]:
            scale_cases(E, case)
    finally:
        E.close()
    passed = sum(1 for r in results if r)
    print("%d passed, %d failed" % (passed, len(results) - passed))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
