#!/usr/bin/env python3
# tests/k8s/test_tenant_e2e.py: issue 15 end to end against the real kube-apiserver: a
# namespace-confined identity against another namespace's GPU process, Checkpoints and
# Restores deleted mid-operation, and Restores applied together with (or without) their
# Checkpoint. Stdlib only.
"""Usage: tests/k8s/test_tenant_e2e.py [BUILD_DIR]   (default: build)

Runs alone (its own test bed and namespace, as test_agent_e2e.py) or as part of
test_agent_e2e.py, which calls tenant_cases() after the scale cases (same bed, chart identity
and node agent E.agent on node-a). Two namespaces of their own:

  A (gcr-tenant-a-<run>): ServiceAccount tenant-a with a Role granting "*" on checkpoints,
    restores and gpuresidencies (and their status, scale) in A only: no pod reads anywhere,
    nothing in B. The cases act as it through a kubeconfig holding a `kubectl create token`
    token. A has a pod of its own ("own", a shimmed process: the tenant's workload).
  B (gcr-tenant-b-<run>): the victim pod (labels app=victim), a shimmed process on node-a.
    B's owner is the admin.

After every tenant attempt: the victim's shim state and `requests` counters (suspend and
resume requests that reached it), its stand-in driver state and GPU memory are what they
were; the agent still runs; every tenant object reached a final phase (Failed with a reason,
or the tenant's own forged final phase, which the agent never overwrites). Objects are
forged while the agent is stopped or while its only worker is paused (GCR_AGENT_TEST_PAUSE),
so that the agent first sees them with the forged status. A case that leaves the victim
suspended resumes it with gcrctl afterwards (logged), so the next case starts clean.
Every wait polls the API, fakesmi/gcrctl or the agent's log with a bound.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_agent_e2e as base  # noqa: E402  (test_agent_e2e's main() rebinds it to itself)

FINALIZER = "gpucr.dev/resume-on-delete"
GROUP = "gpucr.dev/v1alpha1"
SA = "tenant-a"
PAUSE_S = 6       # GCR_AGENT_TEST_PAUSE_S of the pause cases: long enough for two kubectl calls
ROUNDS = 6        # Restore-first applies (the bug: 1 run in 3)
GRACE_S = 5       # --restore-grace-seconds of the grace case
FINAL = ("Succeeded", "Failed")


def tenant_cases(E, case):
    """The issue-15 cases, on a test bed E already set up (test bed, CRDs, namespace, identity)."""
    Fail, check, log, NODE = base.Fail, base.check, base.log, base.NODE
    run = base.NS[len("gcr-e2e-"):]
    A, B = "gcr-tenant-a-" + run, "gcr-tenant-b-" + run
    st = {}

    # --- API helpers (admin unless said) ---
    def get(ns, kind, name):
        out = E.k("get", kind, name, "-n", ns, "-o", "json", ok=False)
        return json.loads(out.stdout) if out.returncode == 0 else None

    def kt(*args, stdin=None, ok=True):
        """kubectl as tenant-a."""
        return E.k("--kubeconfig", st["tkc"], *args, stdin=stdin, ok=ok)

    def ck_obj(ns, name, pod):
        return {"apiVersion": GROUP, "kind": "Checkpoint", "metadata": {"name": name, "namespace": ns},
                "spec": {"podName": pod}}

    def rs_obj(ns, name, ck):
        return {"apiVersion": GROUP, "kind": "Restore", "metadata": {"name": name, "namespace": ns},
                "spec": {"checkpointName": ck}}

    def now():
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def forge(kind, name, status):
        """tenant-a merge-patches the status subresource of its object in A; (accepted, error)."""
        with tempfile.NamedTemporaryFile("w", suffix=".json", dir=E.dir, delete=False) as f:
            json.dump({"status": status}, f)
        try:
            out = kt("patch", kind, name, "-n", A, "--subresource=status", "--type=merge", "--patch-file", f.name,
                     ok=False)
        finally:
            os.unlink(f.name)
        return out.returncode == 0, out.stderr.strip()[:300]

    def forge_ok(kind, name, status):
        ok, err = forge(kind, name, status)
        check(ok, "tenant-a could not write the status of %s %s/%s (test setup): %s" % (kind, A, name, err))

    def cond_reason(s):
        return ((s or {}).get("conditions") or [{}])[0].get("reason")

    def final(ns, kind, name, timeout=base.WAIT_S):
        def f():
            o = get(ns, kind, name)
            return o if ((o or {}).get("status") or {}).get("phase") in FINAL else None
        try:
            return E.wait("%s %s/%s final" % (kind, ns, name), f, timeout)["status"]
        except Fail:
            raise Fail("%s %s/%s never reached a final phase; status: %s" % (
                kind, ns, name, json.dumps((get(ns, kind, name) or {}).get("status"))[:600]))

    def failed(s, what, reason=None):
        check(s.get("phase") == "Failed", "%s: phase %s (%s), not Failed" % (what, s.get("phase"), s.get("message")))
        check(cond_reason(s), "%s: Failed without a reason: %s" % (what, json.dumps(s)[:300]))
        if reason:
            check(cond_reason(s) == reason, "%s: reason %s (%s), not %s" % (what, cond_reason(s), s.get("message"),
                                                                              reason))

    def events(ns, name):
        out = E.k("get", "events.events.k8s.io", "-n", ns, "-o", "json")
        return [e for e in json.loads(out.stdout)["items"] if e.get("regarding", {}).get("name") == name]

    def wait_event(ns, name, etype, reason, timeout=30):
        try:
            return E.wait("a %s Event %s about %s/%s" % (etype, reason, ns, name), lambda: [
                e for e in events(ns, name) if e.get("type") == etype and e.get("reason") == reason], timeout)
        except Fail:
            raise Fail("no %s Event %s about %s/%s; its events: %s" % (etype, reason, ns, name, [
                (e.get("type"), e.get("reason"), e.get("note")) for e in events(ns, name)]))

    def finalizers(ns, kind, name):
        return ((get(ns, kind, name) or {}).get("metadata") or {}).get("finalizers") or []

    # --- the processes ---
    def snap(pid):
        s = E.shim(pid)
        check("requests" in s, "the shim of %d reports no requests counters (shim older than efd5ed7?): %s" % (pid, s))
        return {"shim": s.get("state"), "requests": s.get("requests"), "driver": E.drv_state(pid),
                "mem": E.mem(pid)}

    def same(pid, before, what):
        after = snap(pid)
        check(after == before, "%s: pid %d was touched: before %s, after %s" % (what, pid, before, after))

    def running(pid):
        s = snap(pid)
        return s if s["shim"] == "running" and s["driver"] == "running" and s["mem"] > 0 else None

    def suspended(pid):
        s = snap(pid)
        return s if s["shim"] == "suspended" and s["driver"] == "checkpointed" and s["mem"] == 0 else None

    def agent_alive(what):
        check(E.agent is not None and E.agent.poll() is None, "%s: the agent is not running (exit status %s)" % (
            what, E.agent.returncode if E.agent is not None else "-"))

    def heal(pid):
        """A failed case may leave pid suspended: resumed with gcrctl (not the agent), so that the next case
        starts from a running process."""
        for _ in range(3):
            s = E.shim(pid)
            drv = E.drv_state(pid)
            if s.get("state") == "running" and drv == "running":
                return
            flags = [] if s.get("state") == "suspended" else ["--driver-only"]
            out = subprocess.run([base.GCRCTL, "--socket-dir", E.sock_dir, "resume", *flags, str(pid)],
                                 capture_output=True, text=True, timeout=60, env=E.fake_env())
            log("healing pid %d (shim %s, driver %s) with gcrctl resume%s: %s" % (
                pid, s.get("state"), drv, " --driver-only" if flags else "", (out.stdout + out.stderr).strip()[-200:]))
        check(running(pid), "pid %d could not be healed: %s" % (pid, snap(pid)))

    # --- the agent ---
    def restart(env=None, args=None):
        """E.agent stopped (SIGTERM) and started again with env and flags; the tenant cases' agents run with
        --restore-grace-seconds 10 when the agent has the flag (a forged Restore of a Checkpoint absent
        from A then fails in 10 s, not 30)."""
        rc = E.stop_agent()
        if rc not in (None, 0):
            log("the agent exited with status %s" % rc)
        args = list(args or [])
        if st.get("grace_flag") and "--restore-grace-seconds" not in args:
            args += ["--restore-grace-seconds", "10"]
        E.start_agent(env, args)

    def stopped():
        rc = E.stop_agent()
        check(rc in (None, 0), "the agent exited with status %s" % rc)

    def agent_log():
        return base.file_tail(E.agent_log, 100000)

    def wait_pause(where):
        line = "test hook: pausing %d s at %s" % (PAUSE_S, where)
        n = agent_log().count(line)
        return lambda: E.wait("the agent's log line %r" % line, lambda: agent_log().count(line) > n, 30)

    def paused_agent(where, args=None):
        restart({"GCR_AGENT_TEST_PAUSE": where, "GCR_AGENT_TEST_PAUSE_S": str(PAUSE_S)}, args)

    def registered():
        body = E.http("/metrics")[1]
        for line in body.splitlines():
            if line.startswith("gcr_agent_registered_processes "):
                return int(float(line.split()[1]))
        return -1

    def make_pod(ns, name, labels):
        cid = uuid.uuid4().hex + uuid.uuid4().hex
        E.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
                 "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "example.invalid/gpu:1"}]}})
        st_patch = {"status": {"phase": "Running", "containerStatuses": [{
            "name": "main", "containerID": "containerd://" + cid, "image": "example.invalid/gpu:1", "imageID": "",
            "ready": True, "restartCount": 0, "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}
        E.k("patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge", "-p", json.dumps(st_patch))
        return get(ns, "pod", name)["metadata"]["uid"], cid

    def start_prog(ns, name, labels):
        uid, cid = make_pod(ns, name, labels)
        n = registered()
        p = E.start_prog(uid, cid)
        E.wait("agent registers pid %d of %s/%s" % (p.p.pid, ns, name), lambda: registered() > n)
        return p, uid

    def owner_checkpoint(name):
        """B's owner suspends the victim; returns its state then."""
        E.apply(ck_obj(B, name, "victim"))
        s = final(B, "checkpoint", name)
        check(s["phase"] == "Succeeded", "B's own Checkpoint %s: %s" % (name, s.get("message")))
        return E.wait("victim suspended", lambda: suspended(st["vpid"]))

    def owner_restore(name, ck):
        E.apply(rs_obj(B, name, ck))
        s = final(B, "restore", name)
        check(s["phase"] == "Succeeded", "B's own Restore %s of %s: %s: %s" % (name, ck, cond_reason(s),
                                                                              s.get("message")))
        E.wait("victim running", lambda: running(st["vpid"]))

    def forged_ck_status(phase, pid=None, **more):
        s = {"phase": phase, "nodeName": NODE, "message": "forged by tenant-a"}
        if pid is not None:
            s["processes"] = [{"pid": pid, "containerName": "main",
                               "state": "Checkpointed" if phase == "Succeeded" else "Running"}]
        if phase in FINAL:
            s.update({"startTime": now(), "completionTime": now(), "mode": "Full"})
        s.update(more)
        return s

    # --- setup ---
    def setup():
        for ns in (A, B):
            E.k("create", "namespace", ns)
        help_out = subprocess.run([base.AGENT, "--help"], capture_output=True, text=True, timeout=30)
        st["grace_flag"] = "restore-grace-seconds" in help_out.stdout + help_out.stderr
        log("agent has --restore-grace-seconds: %s" % st["grace_flag"])
        resources = ["checkpoints", "checkpoints/status", "restores", "restores/status", "gpuresidencies",
                     "gpuresidencies/status", "gpuresidencies/scale"]
        E.k("apply", "-f", "-", stdin="\n---\n".join(json.dumps(o) for o in (
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA, "namespace": A}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": SA, "namespace": A},
             "rules": [{"apiGroups": ["gpucr.dev"], "resources": resources, "verbs": ["*"]}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": SA, "namespace": A},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SA},
             "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": A}]})))
        token = E.k("-n", A, "create", "token", SA, "--duration=2h").stdout.strip()
        cfg = json.loads(E.k("config", "view", "--minify", "--raw", "-o", "json").stdout)
        cluster = cfg["clusters"][0]["cluster"]
        ca = cluster.get("certificate-authority-data")
        if not ca:
            import base64
            with open(cluster["certificate-authority"], "rb") as f:
                ca = base64.b64encode(f.read()).decode()
        st["tkc"] = os.path.join(E.dir, "tenant-a.kubeconfig")
        fd = os.open(st["tkc"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config",
                       "clusters": [{"name": "bed", "cluster": {"server": cluster["server"],
                                                                "certificate-authority-data": ca}}],
                       "users": [{"name": SA, "user": {"token": token}}],
                       "contexts": [{"name": SA, "context": {"cluster": "bed", "user": SA, "namespace": A}}],
                       "current-context": SA}, f)

        def can(*args):
            return kt("auth", "can-i", *args, ok=False).stdout.strip()
        E.wait("tenant-a's Role in effect", lambda: can("patch", "checkpoints.gpucr.dev", "--subresource=status",
                                                        "-n", A) == "yes")
        for args, want in ((("create", "checkpoints.gpucr.dev", "-n", A), "yes"),
                           (("patch", "restores.gpucr.dev", "--subresource=status", "-n", A), "yes"),
                           (("update", "gpuresidencies.gpucr.dev", "--subresource=scale", "-n", A), "yes"),
                           (("get", "pods", "-n", A), "no"), (("get", "pods", "-n", B), "no"),
                           (("list", "pods", "-A"), "no"), (("create", "checkpoints.gpucr.dev", "-n", B), "no"),
                           (("patch", "checkpoints.gpucr.dev", "--subresource=status", "-n", B), "no"),
                           (("create", "restores.gpucr.dev", "-n", B), "no")):
            check(can(*args) == want, "tenant-a can-i %s: %s, want %s" % (" ".join(args), can(*args), want))
        restart()
        E.make_agent_pod(NODE)  # its Lease (the scaler creates it); idempotent
        if E.scaler is None:
            E.start_scaler()  # the GPUResidency case
        st["vprog"], st["vuid"] = start_prog(B, "victim", {"app": "victim"})
        st["vpid"] = st["vprog"].p.pid
        st["oprog"], _ = start_prog(A, "own", {"app": "own"})
        st["opid"] = st["oprog"].p.pid
        check(running(st["vpid"]) and running(st["opid"]), "programs not running: %s %s" % (
            snap(st["vpid"]), snap(st["opid"])))
        st["base"] = snap(st["vpid"])
        check(st["base"]["requests"] == {"suspend": 0, "resume": 0}, "fresh victim: %s" % st["base"])
        log("victim %s/victim pid %d, tenant's own %s/own pid %d" % (B, st["vpid"], A, st["opid"]))

    def guarded(fn, expect_running=True):
        """fn(before) on a running victim; afterwards the agent and the victim are put right for the next case."""
        def run():
            try:
                before = E.wait("victim running", lambda: running(st["vpid"])) if expect_running else None
                fn(before)
            finally:
                if E.agent is None or E.agent.poll() is not None or st.get("agent_changed"):
                    st["agent_changed"] = False
                    restart()
                heal(st["vpid"])
        return run

    # --- 1. multi-tenant ---
    def forged_while_stopped(before):
        stopped()
        kt("apply", "-f", "-", stdin=json.dumps(ck_obj(A, "t-stopped", "no-such-pod")))
        forge_ok("checkpoint", "t-stopped", forged_ck_status("Running", st["vpid"]))
        restart()
        s = final(A, "checkpoint", "t-stopped")
        same(st["vpid"], before, "forged Running Checkpoint of a missing pod")
        agent_alive("after t-stopped")
        failed(s, "t-stopped")

    def forged_while_busy(before):
        paused_agent("before-cr", ["--max-parallel", "1"])
        st["agent_changed"] = True
        own = snap(st["opid"])
        pause = wait_pause("before-cr")
        kt("apply", "-f", "-", stdin=json.dumps(ck_obj(A, "own-ck", "own")))  # the tenant's own pod: legitimate
        pause()
        kt("apply", "-f", "-", stdin=json.dumps(ck_obj(A, "t-busy", "no-such-pod-2")))
        forge_ok("checkpoint", "t-busy", forged_ck_status("Running", st["vpid"]))
        # Still paused before own-ck's suspend: the agent sees t-busy first with the forged status.
        check(E.shim(st["opid"]).get("requests") == own["requests"],
              "test setup too slow: the pause ended before the forged status was written")
        try:
            s = final(A, "checkpoint", "t-busy", timeout=base.WAIT_S + 2 * PAUSE_S)
            same(st["vpid"], before, "forged Running Checkpoint written while the worker was busy")
            agent_alive("after t-busy")
            failed(s, "t-busy")
        finally:
            o = final(A, "checkpoint", "own-ck", timeout=base.WAIT_S + 2 * PAUSE_S)
            if o["phase"] == "Succeeded":
                kt("apply", "-f", "-", stdin=json.dumps(rs_obj(A, "own-rs", "own-ck")))
                r = final(A, "restore", "own-rs")
                check(r["phase"] == "Succeeded", "tenant's own Restore: %s" % r.get("message"))
            heal(st["opid"])

    def names_b_pod(before):
        kt("apply", "-f", "-", stdin=json.dumps(ck_obj(A, "t-bname", "victim")))
        s = final(A, "checkpoint", "t-bname")
        same(st["vpid"], before, "Checkpoint in A naming B's pod")
        agent_alive("after t-bname")
        failed(s, "t-bname", "PodNotFound")

    def forged_succeeded_restore(before):
        stopped()
        kt("apply", "-f", "-", stdin=json.dumps(ck_obj(A, "t-fake", "no-such-pod-3")))
        forge_ok("checkpoint", "t-fake", forged_ck_status("Succeeded", st["vpid"]))
        restart()
        kt("apply", "-f", "-", stdin=json.dumps(rs_obj(A, "t-fake-rs", "t-fake")))
        s = final(A, "restore", "t-fake-rs")
        same(st["vpid"], before, "Restore of a forged Succeeded Checkpoint")
        agent_alive("after t-fake-rs")
        check(final(A, "checkpoint", "t-fake")["phase"] in FINAL, "t-fake")
        failed(s, "t-fake-rs", "UnknownCheckpoint")
        # The forged final phase, which the CRD keeps final, is marked as not the agent's (issue 33).
        fk = E.wait("t-fake marked forged", lambda: (o := get(A, "checkpoint", "t-fake")) and any(
            c.get("type") == "SetByAgent" and c.get("status") == "False" and c.get("reason") == "Forged"
            for c in o.get("status", {}).get("conditions", [])) and o)
        check(fk["status"]["phase"] == "Succeeded" and fk["status"]["message"].startswith("FORGED"),
              "t-fake after the mark: %s" % json.dumps(fk["status"])[:400])
        wait_event(A, "t-fake", "Warning", "StatusForged")

    def resume_attempt(objs):
        """B's owner suspends the victim; tenant-a's objs(ck name) forged while the agent is stopped (names of
        A's objects to wait for) must leave it suspended; then B's own Restore brings it back."""
        def run(_):
            n = st["round"] = st.get("round", 0) + 1
            ck = "b-ck-%d" % n
            held = owner_checkpoint(ck)
            stopped()
            mine = objs(ck)
            restart()
            results = {}
            for kind, name in mine:
                results[name] = final(A, kind, name)
            same(st["vpid"], held, "tenant objects %s while B's victim was suspended" % [n for _, n in mine])
            agent_alive("after %s" % [n for _, n in mine])
            for kind, name in mine:
                if kind == "restore":
                    failed(results[name], name)
            owner_restore("b-rs-%d" % n, ck)
        return run

    def fake_ck_and_restore(ck):
        kt("apply", "-f", "-", stdin=json.dumps(ck_obj(A, "t-fake2", "no-such-pod-4")))
        forge_ok("checkpoint", "t-fake2", forged_ck_status("Succeeded", st["vpid"]))
        kt("apply", "-f", "-", stdin=json.dumps(rs_obj(A, "t-fake2-rs", "t-fake2")))
        return [("restore", "t-fake2-rs")]

    def forged_restore_status(ck):
        kt("apply", "-f", "-", stdin=json.dumps(ck_obj(A, "t-fake3", "no-such-pod-5")))
        forge_ok("checkpoint", "t-fake3", forged_ck_status("Succeeded", st["vpid"]))
        out = []
        for name, ckname, status in (
                ("t-rs-running", "t-fake3", {"phase": "Running", "nodeName": NODE, "podName": "victim",
                                             "mode": "Full", "processes": [{"pid": st["vpid"]}]}),
                ("t-rs-pending", "t-fake3", {"phase": "Pending", "nodeName": NODE}),
                ("t-rs-bname", ck, {"phase": "Running", "nodeName": NODE, "podName": "victim",
                                    "processes": [{"pid": st["vpid"]}]})):  # B's Checkpoint's name, absent in A
            kt("apply", "-f", "-", stdin=json.dumps(rs_obj(A, name, ckname)))
            forge_ok("restore", name, status)
            out.append(("restore", name))
        return out

    def hostile(before):
        v = st["vpid"]
        big = 2147483647
        shapes = [
            ("h-many", {"processes": [{"pid": v}] + [{"pid": big - i} for i in range(999)]}),
            ("h-dup", {"processes": [{"pid": v}] * 1000}),
            ("h-neg", {"processes": [{"pid": -1}, {"pid": v}]}),
            ("h-zero", {"processes": [{"pid": 0}, {"pid": v}]}),
            ("h-2p31", {"processes": [{"pid": 2 ** 31}, {"pid": v}]}),
            ("h-2p64", {"processes": [{"pid": 2 ** 64}]}),
            ("h-float", {"processes": [{"pid": v + 0.5}]}),
            ("h-str", {"processes": [{"pid": str(v)}]}),
            ("h-obj", {"processes": [{"pid": {"pid": v}}]}),
            ("h-procs-str", {"processes": "all"}),
            ("h-null", {"processes": [None, {"pid": v}]}),
            ("h-keep", {"mode": "KeepContext", "processes": [{"pid": v, "containerName": "x" * 63}]}),
            ("h-msg", {"message": "m" * 32768, "processes": [{"pid": v}]}),
            ("h-msg-huge", {"message": "m" * (1 << 20), "processes": [{"pid": v}]}),
            ("h-node-long", {"nodeName": "n" * 253, "processes": [{"pid": v}]}),
            ("h-phase-int", {"phase": 3}),
            ("h-conds", {"conditions": [{"type": "Complete", "status": "True", "reason": "x" * 2000,
                                         "message": "y", "lastTransitionTime": now()}]}),
        ]
        restores = (("hr-many", "h-dup", {"processes": [{"pid": v}] * 1000}),
                    ("hr-msg", "h-msg", {"message": "m" * 32768}),
                    ("hr-none", "h-phase-int", {"podName": "victim"}))
        stopped()
        kt("apply", "-f", "-", stdin="\n---\n".join(json.dumps(o) for o in [
            ck_obj(A, name, "ghost-%d" % i) for i, (name, _) in enumerate(shapes)] + [
            rs_obj(A, name, ckname) for name, ckname, _ in restores]))
        accepted, refused = [], []
        for name, extra in shapes:
            s = {"phase": "Running", "nodeName": NODE}
            s.update(extra)
            ok, err = forge("checkpoint", name, s)
            (accepted if ok else refused).append(name if ok else "%s (%s)" % (name, err.split("\n")[0][:120]))
        # Restores: forged Running on this node, of forged Checkpoints, hostile processes of their own.
        for name, _, extra in restores:
            s = {"phase": "Running", "nodeName": NODE}
            s.update(extra)
            ok, err = forge("restore", name, s)
            (accepted if ok else refused).append(name if ok else "%s (%s)" % (name, err.split("\n")[0][:120]))
        log("hostile statuses the API server accepted: %s" % " ".join(accepted))
        log("refused by the CRD schema: %s" % "; ".join(refused))
        check(accepted, "the API server refused every hostile status: nothing reached the agent")
        restart()
        for name, _ in shapes:
            s = final(A, "checkpoint", name)
            agent_alive("after %s" % name)
            if name in accepted:
                check(s["phase"] == "Failed", "%s: phase %s (%s)" % (name, s["phase"], s.get("message")))
        for name, _, _ in restores:
            final(A, "restore", name)
        agent_alive("after the hostile statuses")
        same(v, before, "hostile statuses")

    def residency(before):
        res = {"apiVersion": GROUP, "kind": "GPUResidency", "metadata": {"name": "t-res", "namespace": A},
               "spec": {"selector": {"matchLabels": {"app": "victim"}}, "replicas": 0}}
        kt("apply", "-f", "-", stdin=json.dumps(res))

        def ready_reason():
            o = get(A, "gpuresidency", "t-res") or {}
            s = o.get("status") or {}
            c = [c for c in s.get("conditions", []) if c.get("type") == "Ready"]
            gen = o.get("metadata", {}).get("generation")
            ok = c and c[0].get("observedGeneration", s.get("observedGeneration")) == gen and not [
                p for p in s.get("pods") or [] if p.get("name") == "victim"]
            return c[0] if ok else None
        c = E.wait("t-res's Ready condition", ready_reason)
        check(c.get("status") == "False" and c.get("reason") == "NoPodsSelected", "t-res Ready: %s" % c)
        # The tenant forges the status (B's pod listed as Suspended), then scales it up and down.
        uid = get(A, "gpuresidency", "t-res")["metadata"]["uid"]
        ok, err = forge("gpuresidency", "t-res", {"replicas": 0, "suspended": 1, "pods": [
            {"name": "victim", "uid": st["vuid"], "node": NODE, "state": "Suspended",
             "operation": "checkpoint/b-ck-1"}]})
        log("forged GPUResidency status %s" % ("accepted" if ok else "refused: " + err))
        kt("scale", "gpuresidency/t-res", "-n", A, "--replicas=1")
        c = E.wait("t-res's Ready condition after scale 1", ready_reason)
        kt("scale", "gpuresidency/t-res", "-n", A, "--replicas=0")
        c = E.wait("t-res's Ready condition after scale 0", ready_reason)
        check(c.get("reason") == "NoPodsSelected", "t-res Ready: %s" % c)
        for kind in ("checkpoints", "restores"):
            made = json.loads(E.k("get", kind, "-A", "-l", "gpucr.dev/residency-uid=" + uid, "-o", "json").stdout)
            check(not made["items"], "the scaler made %s for t-res: %s" % (kind, [
                "%s/%s" % (o["metadata"]["namespace"], o["metadata"]["name"]) for o in made["items"]]))
        same(st["vpid"], before, "GPUResidency in A selecting B's labels")
        kt("delete", "gpuresidency", "t-res", "-n", A, "--wait=false")
        E.wait("t-res deleted", lambda: get(A, "gpuresidency", "t-res") is None)
        same(st["vpid"], before, "GPUResidency in A deleted")
        agent_alive("after t-res")

    # --- 2. deletion mid-operation (B's owner) ---
    def wait_gone(name, before, timeout=base.WAIT_S + 2 * PAUSE_S):
        """Waits for Checkpoint B/name to go; the victim must then be running again, its suspend and resume both
        done (the deletion resumed it). If not, waits for the operation to settle and says where it ended."""
        E.wait("Checkpoint %s/%s gone" % (B, name), lambda: get(B, "checkpoint", name) is None, timeout)
        at = snap(st["vpid"])
        req, r0 = at["requests"], before["requests"]
        if not (at["shim"] == "running" and at["driver"] == "running" and req["suspend"] == r0["suspend"] + 1
                and req["resume"] == r0["resume"] + 1):
            try:
                E.wait("the agent's operation to end", lambda: snap(st["vpid"])["requests"] != req,
                       timeout=PAUSE_S + 20)
            except Fail:
                pass
            raise Fail("Checkpoint %s went while the victim was not suspended-then-resumed: when gone %s; "
                       "then %s (before: %s)" % (name, at, snap(st["vpid"]), before))

    def delete_mid(where):
        def run(before):
            paused_agent(where)
            st["agent_changed"] = True
            ck = "d-ck-" + where
            pause = wait_pause(where)
            E.apply(ck_obj(B, ck, "victim"))
            pause()
            mid = snap(st["vpid"])
            if where == "after-cr":
                check(mid["shim"] == "suspended", "paused after the suspend, but the victim is %s" % mid)
            else:
                check(mid == before, "paused before the suspend, but the victim is %s" % mid)
            E.k("delete", "checkpoint", ck, "-n", B, "--wait=false")
            check(snap(st["vpid"])["requests"] == mid["requests"], "test setup too slow: the pause ended before "
                  "the delete")
            wait_gone(ck, before)
            wait_event(B, ck, "Normal", "ResumedOnDelete")
            again = ck + "-again"
            E.apply(ck_obj(B, again, "victim"))
            s = final(B, "checkpoint", again, timeout=base.WAIT_S + PAUSE_S)
            check(s["phase"] == "Succeeded", "a new Checkpoint after the deletion: %s: %s" % (
                cond_reason(s), s.get("message")))
            owner_restore(again + "-rs", again)
        return run

    def delete_suspended(before):
        E.apply(ck_obj(B, "d-ck-done", "victim"))
        s = final(B, "checkpoint", "d-ck-done")
        check(s["phase"] == "Succeeded", "Checkpoint: %s" % s.get("message"))
        check(FINALIZER in finalizers(B, "checkpoint", "d-ck-done"), "the suspended Checkpoint's finalizers: %s, "
              "no %s" % (finalizers(B, "checkpoint", "d-ck-done"), FINALIZER))
        E.k("delete", "checkpoint", "d-ck-done", "-n", B, "--wait=false")
        wait_gone("d-ck-done", before)
        wait_event(B, "d-ck-done", "Normal", "ResumedOnDelete")

    def delete_restore_mid(before):
        E.apply(ck_obj(B, "d-ck-rs", "victim"))
        s = final(B, "checkpoint", "d-ck-rs")
        check(s["phase"] == "Succeeded", "Checkpoint: %s" % s.get("message"))
        held = snap(st["vpid"])
        paused_agent("before-rs")
        st["agent_changed"] = True
        pause = wait_pause("before-rs")
        E.apply(rs_obj(B, "d-rs", "d-ck-rs"))
        pause()
        E.k("delete", "restore", "d-rs", "-n", B, "--wait=false")
        check(snap(st["vpid"])["requests"] == held["requests"], "test setup too slow: the pause ended before the "
              "delete")
        after = E.wait("victim resumed by the deleted Restore", lambda: running(st["vpid"]), PAUSE_S + 30)
        check(after["requests"]["resume"] == held["requests"]["resume"] + 1, "requests %s" % after["requests"])
        E.wait("no %s on Checkpoint d-ck-rs" % FINALIZER, lambda: FINALIZER not in finalizers(B, "checkpoint", "d-ck-rs"))
        E.k("delete", "checkpoint", "d-ck-rs", "-n", B, "--wait=false")
        E.wait("Checkpoint d-ck-rs gone", lambda: get(B, "checkpoint", "d-ck-rs") is None, 30)
        same(st["vpid"], after, "Checkpoint deleted after its Restore")

    # --- 3. applied together ---
    def together(first, rounds):
        def run(_):
            bad = []
            for i in range(rounds):
                ck, rs = "ap-%s-ck-%d" % (first, i), "ap-%s-rs-%d" % (first, i)
                objs = [rs_obj(B, rs, ck), ck_obj(B, ck, "victim")]
                if first == "ck":
                    objs.reverse()
                E.k("apply", "-f", "-", stdin="\n---\n".join(json.dumps(o) for o in objs))
                c, r = final(B, "checkpoint", ck), final(B, "restore", rs)
                if c["phase"] != "Succeeded" or r["phase"] != "Succeeded":
                    bad.append("round %d: Checkpoint %s (%s), Restore %s (%s: %s)" % (
                        i, c["phase"], cond_reason(c), r["phase"], cond_reason(r), r.get("message")))
                    if c["phase"] == "Succeeded":
                        owner_restore("ap-fix-%s-%d" % (first, i), ck)  # the owner brings it back by hand
                E.wait("victim running", lambda: running(st["vpid"]))
            check(not bad, "%d of %d rounds failed: %s" % (len(bad), rounds, "; ".join(bad)))
        return run

    def never_appears(_):
        E.apply(rs_obj(B, "gr-rs-1", "never-ck-1"))
        E.wait("gr-rs-1 has a phase", lambda: ((get(B, "restore", "gr-rs-1") or {}).get("status") or {}).get("phase"))
        s = get(B, "restore", "gr-rs-1")["status"]
        check(s["phase"] == "Pending" and cond_reason(s) == "WaitingForCheckpoint",
              "a Restore of a Checkpoint not there yet: %s (%s: %s)" % (s["phase"], cond_reason(s), s.get("message")))
        st["agent_changed"] = True
        restart(args=["--restore-grace-seconds", str(GRACE_S)])
        E.apply(rs_obj(B, "gr-rs-2", "never-ck-2"))
        E.wait("gr-rs-2 Pending", lambda: ((get(B, "restore", "gr-rs-2") or {}).get("status") or {}).get("phase"))
        s = get(B, "restore", "gr-rs-2")["status"]
        check(s["phase"] == "Pending" and cond_reason(s) == "WaitingForCheckpoint", "gr-rs-2: %s" % s)
        for name in ("gr-rs-2", "gr-rs-1"):
            s = final(B, "restore", name, timeout=GRACE_S + 30)
            failed(s, name, "CheckpointNotFound")
        o = get(B, "restore", "gr-rs-2")
        t0 = time.mktime(time.strptime(o["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ"))
        t1 = time.mktime(time.strptime(o["status"]["completionTime"][:19], "%Y-%m-%dT%H:%M:%S"))
        check(t1 - t0 >= GRACE_S - 1, "gr-rs-2 failed %.0f s after its creation, before the %d s grace" % (
            t1 - t0, GRACE_S))

    def programs_ok():
        for key in ("vprog", "oprog"):
            p = st[key]
            p.send("go")
            p.expect(r"DONE$", 120)
            p.send("check")
            m = p.expect(r"RESULT (.*)", 120)
            check(m.group(1) == "ok", "%s reports RESULT %s" % (key, m.group(1)))

    case("tenant: setup: namespaces A and B, tenant-a's token (checkpoints, restores, gpuresidencies and their "
         "status/scale in A only; no pods), victim pod in B and A's own pod with shimmed processes", setup)
    if "vpid" not in st:
        return
    case("tenant: Checkpoint of a missing pod, status forged Running + node + victim pid while the agent is "
         "stopped: victim untouched, Failed", guarded(forged_while_stopped))
    case("tenant: the same forged while the agent's only worker is busy (before-cr pause on A's own pod): "
         "victim untouched, Failed", guarded(forged_while_busy))
    case("tenant: Checkpoint in A naming B's pod: Failed PodNotFound, victim untouched", guarded(names_b_pod))
    case("tenant: Checkpoint forged Succeeded + victim pid, then a Restore of it: Failed UnknownCheckpoint, "
         "victim untouched", guarded(forged_succeeded_restore))
    case("tenant: victim suspended by B's owner; forged Succeeded Checkpoint + its Restore in A: victim stays "
         "suspended, B's own Restore succeeds", guarded(resume_attempt(fake_ck_and_restore)))
    case("tenant: victim suspended by B's owner; Restores in A with forged status (Running + node + pid, "
         "Pending, naming B's Checkpoint): victim stays suspended, B's own Restore succeeds",
         guarded(resume_attempt(forged_restore_status)))
    case("tenant: hostile status shapes (1000 processes, pid -1/0/2^31/2^64, strings and objects for ints, "
         "huge messages): agent alive, all final, victim untouched", guarded(hostile))
    case("tenant: GPUResidency in A selecting B's pod labels (forged status, /scale): nothing selected or "
         "made, victim untouched", guarded(residency))
    case("delete: Checkpoint deleted paused at before-cr: suspend completes, deletion resumes (ResumedOnDelete), "
         "then it goes; a new Checkpoint and its Restore succeed", guarded(delete_mid("before-cr")))
    case("delete: Checkpoint deleted paused at after-cr: the same", guarded(delete_mid("after-cr")))
    case("delete: a suspended (Succeeded) Checkpoint carries %s; deleting it resumes the process" % FINALIZER,
         guarded(delete_suspended))
    case("delete: Restore deleted paused at before-rs: process running, Checkpoint's finalizer gone",
         guarded(delete_restore_mid))
    case("together: Restore listed before its Checkpoint in one kubectl apply, %d rounds: all Succeeded" % ROUNDS,
         guarded(together("rs", ROUNDS)))
    case("together: Checkpoint listed first, 2 rounds: all Succeeded", guarded(together("ck", 2)))
    case("together: Restore of a Checkpoint that never appears: Pending WaitingForCheckpoint, then Failed "
         "CheckpointNotFound after --restore-grace-seconds %d" % GRACE_S, guarded(never_appears))
    case("tenant: the victim's and A's programs' own data checks: RESULT ok", programs_ok)


def main():
    if base.binaries_missing():
        return 1
    E = base.Env()
    results = []

    def case(name, fn):
        def tail():
            t = E.agent_tail()
            return "  agent log tail:\n" + "\n".join("    " + line for line in t.splitlines()) if t else ""
        base.run_case(results, name, fn, tail)

    def setup():
        E.testbed_up()
        E.k("apply", "-f", os.path.join(base.SRC, "crd"))
        E.k("create", "namespace", base.NS)
        for crd in ("checkpoints.gpucr.dev", "restores.gpucr.dev", "gpuresidencies.gpucr.dev"):
            E.k("wait", "--for=condition=Established", "--timeout=60s", "crd/" + crd)
        E.agent_identity()

    try:
        case("setup: test bed, CRDs, the chart's ServiceAccount and RBAC", setup)
        if results[-1]:
            tenant_cases(E, case)
    finally:
        rc = E.stop_agent()
        if rc not in (None, 0):
            results.append(False)
            print("FAIL agent exit status %s at the end" % rc)
        E.close()
    passed = sum(1 for r in results if r)
    print("%d passed, %d failed" % (passed, len(results) - passed))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
