#!/usr/bin/env python3
"""Eviction without loss, the checkpoint at deletion (docs/preemption.md), on a real node: the
tier k8s-evict.

    python3 tests/k8s/test_evict_e2e.py [BUILD_DIR]

The real-node test bed of test_node_e2e.py (kubelet, containerd 2.x with CRI checkpoint and
restore, runc, CRIU) with the chart installed with images.kubelet.enabled=true and
eviction.enabled=true. Opted-in pods (label gpucr.dev/evict: image, preStop
/opt/gcr/lib/gcr-hold) run the test program holding GPU data on the stand-in driver; they are
drained (`kubectl drain --pod-selector`), deleted plainly, or deleted with too short a grace
period, and everything is observed as a user would: the Checkpoint evict-<pod>-<uid> and its
phase, Events on the pod, the image on the node, the program's process (gone only after the
image), the agent's /metrics, and a new pod restored from the image that finishes the
program's own bit-exact check (RESULT ok). GCR_EVICT_E2E_CASES (a comma list) runs only those
cases after the install; GCR_EVICT_E2E_SET (a comma list of key=value) adds helm --set values:
GCR_EVICT_E2E_SET=eviction.enabled=false makes the positive cases fail, as they must.
Ends with "N passed, N failed".
"""
import json
import os
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_node_e2e as N  # noqa: E402

check, kubectl, kjson, apply, wait_until, log = N.check, N.kubectl, N.kjson, N.apply, N.wait_until, N.log
HOLD = "/opt/gcr/lib/gcr-hold"
IMAGES = "/var/lib/gcr/images"


def helm_base(extra=(), env="GCR_EVICT_E2E_SET"):
    """helm --set arguments: the images and eviction on, extra, then those of the comma list in
    the environment variable env (key=value,...; the tiers switch a policy off with it)."""
    port = open(os.path.join(N.ENV["GCR_TESTBED_DIR"], "kubelet.port")).read().strip()
    base = ["--set", f"image.repository={N.IMAGE_REPO}", "--set", f"image.tag={N.IMAGE_TAG}",
            "--set", "images.kubelet.enabled=true", "--set", f"images.kubelet.port={port}",
            "--set", "eviction.enabled=true"] + list(extra)
    for kv in filter(None, os.environ.get(env, "").split(",")):
        base += ["--set", kv]
    return base


def agent_log(a=None):
    a = a or wait_until("the agent Ready", N.agent_ready, 120)
    return kubectl("logs", "-n", N.SYSTEM_NS, a["metadata"]["name"], "-c", "agent", check=False).stdout.splitlines()


def metric(result):
    a = wait_until("the agent Ready", N.agent_ready, 120)
    text = kubectl("get", "--raw", f"/api/v1/namespaces/{N.SYSTEM_NS}/pods/{a['metadata']['name']}:9464"
                   "/proxy/metrics").stdout
    m = re.search(r'^gcr_agent_eviction_images_total\{result="%s"\} (\S+)$' % result, text, re.M)
    return float(m.group(1)) if m else None


def case_install():
    """helm install with images.kubelet and eviction on (plus GCR_EVICT_E2E_SET)."""
    helm = os.path.join(N.ENV["GCR_TESTBED_BIN"], "helm")
    N.run([helm, "install", N.RELEASE, N.CHART, "-n", N.SYSTEM_NS, "--create-namespace"] + helm_base() +
          ["--wait", "--timeout", "180s"], timeout=200)
    a = wait_until("the agent Ready with images.kubelet", lambda: (p := N.agent_ready()) and any(
        x.startswith("--kubelet-url=") for x in p["spec"]["containers"][0].get("args", [])) and p, 120)
    wait_until("gpucr.dev/shim on the node", lambda: kjson("get", "node", N.ENV["GCR_TESTBED_NODE"])
               ["status"].get("allocatable", {}).get("gpucr.dev/shim"), 60)
    line = wait_until("the agent's eviction line", lambda: next(
        (x for x in agent_log(a) if "eviction imaging:" in x), None), 30)
    log(f"chart installed: {line.split('agent: ')[-1]}")


# ---- workloads ----

SCRIPT = ("touch /tmp/ctl; trap 'exit 0' TERM; "
          f"tail -f /tmp/ctl | gcr-testprog --module {N.KERNELS} --mib 48 --buffers 3 --threads 2 --iters 20 --wait "
          "& wait")


def pod_spec(grace):
    """uid 0 (root here lacks CAP_SYS_RESOURCE, which CRIU needs for other uids); sh as PID 1
    ends at SIGTERM (its trap), so a pod ends as soon as its hook returns."""
    return {"runtimeClassName": "nvidia", "terminationGracePeriodSeconds": grace,
            "securityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False},
            "containers": [{
                "name": "main", "image": N.WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", SCRIPT],
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                "resources": {"limits": {"gpucr.dev/shim": "1"}},
                "lifecycle": {"preStop": {"exec": {"command": [HOLD]}}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}


def ready_line(ns, pod):
    line = wait_until(f"pod {ns}/{pod} READY line", lambda: next(
        (x for x in kubectl("logs", "-n", ns, pod, check=False).stdout.splitlines() if x.startswith("READY ")), None),
        120)
    fields = dict(kv.split("=", 1) for kv in line.split()[1:])
    return int(fields["pid"]), int(fields["bytes"])


def deployment(ns, name, grace=60):
    """A Deployment of one opted-in replica (no scheduling gate: the replacement's restore is not
    this tier's); returns its pod's name, the program's pid in it and its GPU bytes."""
    labels = {"app": name, "gpucr.dev/evict": "image"}
    apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": labels}, "spec": pod_spec(grace)}}})
    pod = wait_until(f"deployment {name}'s pod", lambda: next(
        (p["metadata"]["name"] for p in kjson("get", "pods", "-n", ns, "-l", f"app={name}")["items"]
         if not p["metadata"].get("deletionTimestamp")), None), 60)
    pid, nbytes = ready_line(ns, pod)
    return pod, pid, nbytes


def bare_pod(ns, name, grace, annotations=None, extra=None, limits=None):
    spec = dict(pod_spec(grace), restartPolicy="Never", **(extra or {}))
    spec["containers"][0]["resources"]["limits"].update(limits or {})
    apply({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "labels": {"gpucr.dev/evict": "image"},
                        "annotations": annotations or {}},
           "spec": spec})
    return ready_line(ns, name)


def eviction_checkpoints(ns):
    return kjson("get", "checkpoints", "-n", ns, "-l", "gpucr.dev/eviction=true")["items"]


def ck_name(pod, uid):
    return f"evict-{pod}-{uid.replace('-', '')[:8]}"


def event(ns, pod, reason):
    return next((e for e in N.events_for(ns, pod) if e.get("reason") == reason), None)


def cleanup(ns):
    N.drop_namespace(ns)


class Watch:
    """Watches a host pid and the image's manifest on the node every 10 ms (when the program
    ended), and polls a Checkpoint's phase (when it was first seen Succeeded: a kubectl call
    late, so it cannot order the two; imaged_before_end does)."""

    def __init__(self, pid, ns, ck, pod=None):
        self.pid, self.ns, self.ck = pid, ns, ck
        self.manifest = f"{IMAGES}/{ns}/{pod}/{ck}/manifest.json" if pod else None
        self.succeeded = self.gone = self.manifest_seen = self.manifest_lost = None
        self.stop = False
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()
        threading.Thread(target=self.phase_loop, daemon=True).start()

    def loop(self):
        while not self.stop:
            if self.manifest:
                there = os.path.exists(self.manifest)
                if there and self.manifest_seen is None:
                    self.manifest_seen = time.time()
                if not there and self.manifest_seen is not None and self.manifest_lost is None:
                    self.manifest_lost = time.time()
            if self.gone is None and not os.path.exists(f"/proc/{self.pid}"):
                self.gone = time.time()
            if self.gone is not None and not self.manifest:
                break
            time.sleep(0.01)

    def phase_loop(self):
        while not self.stop and self.succeeded is None:
            r = kubectl("get", "checkpoint", "-n", self.ns, self.ck, "-o", "jsonpath={.status.phase}", check=False)
            if r.stdout.strip() == "Succeeded":
                self.succeeded = time.time()
            time.sleep(0.1)


def rel(t, t0):
    """t - t0 for a log line ("not seen" when t is None)."""
    return "not seen" if t is None else f"{t - t0:.1f} s"


def imaged_before_end(ns, pod, gone):
    """The pod's EvictionImageWritten Event, checked to be from before its program ended: the
    agent posts it once the Checkpoint is Succeeded and before it answers the hold (after which
    the kubelet sends SIGTERM); its eventTime (microseconds, the node's clock: this host's) against
    when the 10 ms watch saw the process gone. Polling the phase cannot order them (about 0.1 s
    apart, a kubectl call each)."""
    e = wait_until("an EvictionImageWritten Event", lambda: event(ns, pod, "EvictionImageWritten"), 30)
    t = datetime.strptime(e["eventTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
    check(gone is not None and t < gone, f"EvictionImageWritten at {e['eventTime']}, not before the program "
          f"ended ({gone})")
    check(e.get("type") == "Normal", f"Event {e}")
    return e


def drain(selector):
    node = N.ENV["GCR_TESTBED_NODE"]
    return subprocess.Popen([os.path.join(N.ENV["GCR_TESTBED_BIN"], "kubectl"), "drain", node, "--pod-selector",
                             selector, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=180s"],
                            env=N.ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def uncordon():
    kubectl("uncordon", N.ENV["GCR_TESTBED_NODE"], check=False)


def drained(selector):
    """kubectl drain of the pods selected, to its end; the node uncordoned again, also on failure."""
    d = drain(selector)
    try:
        out, _ = d.communicate(timeout=200)
    finally:
        uncordon()
    check(d.returncode == 0, f"kubectl drain failed: {out[-1500:]}")


# ---- cases ----

def case_drain_images():
    """A Deployment's opted-in pod drained: within its grace period the agent creates the
    Checkpoint evict-<pod>-<uid> (labels and cause of the contract), which Succeeds while the
    program still runs (its process ends after); Event EvictionImageWritten on the pod; the image
    on the node whole (manifest mode runtime, the kubelet's archive, the GPU files); and
    restorable: a new pod from the checkpoint image, a Restore with podName, the program goes on
    and passes its own check."""
    ns = "ev-drain"
    N.namespace(ns)
    try:
        pod, _, nbytes = deployment(ns, "web")
        p = kjson("get", "pod", "-n", ns, pod)
        uid, owner = p["metadata"]["uid"], p["metadata"]["ownerReferences"][0]["uid"]
        ck = ck_name(pod, uid)
        hpid = N.host_pid(ns, pod)
        w = Watch(hpid, ns, ck, pod)
        t0 = time.time()
        drained("app=web")
        wait_until("the program's process gone", lambda: w.gone, 60)
        c = kjson("get", "checkpoint", "-n", ns, ck)
        s = c.get("status", {})
        check(s.get("phase") == "Succeeded", f"Checkpoint {ck}: {s.get('phase')}: {s.get('message')}")
        lab, ann = c["metadata"].get("labels", {}), c["metadata"].get("annotations", {})
        check(lab.get("gpucr.dev/eviction") == "true" and lab.get("gpucr.dev/evicted-pod") == pod and
              lab.get("gpucr.dev/owner-uid") == owner and lab.get("gpucr.dev/node") == N.ENV["GCR_TESTBED_NODE"],
              f"labels {lab}")
        check(ann.get("gpucr.dev/evict-cause") == "EvictionByEvictionAPI", f"annotations {ann}")
        want = {"podName": pod, "action": "Image", "cpuCheckpoint": "Kubelet", "containerName": "main"}
        check({k: c["spec"].get(k) for k in want} == want, f"spec {c['spec']}")
        e = imaged_before_end(ns, pod, w.gone)
        done = datetime.strptime(s["completionTime"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
        check(done <= w.gone, f"completionTime {s['completionTime']} after the process ended ({w.gone})")
        log(f"drain: Checkpoint {ck} seen Succeeded {rel(w.succeeded, t0)} after the drain began, the program "
            f"ended {w.gone - t0:.1f} s after it (the image's Event at {e['eventTime']}); {s.get('message')}")
        check(ck in e.get("note", ""), f"Event {e}")
        log(f"Event: {e.get('note')}")
        # What a user sees (docs/preemption.md pastes these).
        log("kubectl get checkpoints -l gpucr.dev/eviction=true:\n" + kubectl(
            "get", "checkpoints", "-n", ns, "-l", "gpucr.dev/eviction=true").stdout)
        log("kubectl get events (the pod):\n" + kubectl(
            "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={pod}").stdout)
        img = s["image"]["path"]
        check(img == f"{IMAGES}/{ns}/{pod}/{ck}", f"status.image {s.get('image')}")
        w.stop = True
        check(w.manifest_seen is not None and w.manifest_lost is None and os.path.isdir(img),
              f"the image on the node: manifest seen at {w.manifest_seen}, gone at {w.manifest_lost} (t0 {t0}); "
              f"{os.listdir(os.path.dirname(img)) if os.path.isdir(os.path.dirname(img)) else 'no pod dir'}")
        man = json.load(open(os.path.join(img, "manifest.json")))
        check(man.get("mode") == "runtime", f"manifest mode {man.get('mode')}")
        check(sorted(os.listdir(img)) == ["criu", "gpu", "manifest.json"], f"image holds {sorted(os.listdir(img))}")
        archive = os.path.join(img, "criu", "kubelet-checkpoint.tar")
        check(os.path.getsize(archive) > 0, "empty kubelet archive")
        check(s["image"].get("gpuBytes", 0) >= 48 << 20, f"status.image {s.get('image')}")  # the program's 48 MiB
        check(metric("written") >= 1, "the agent's /metrics counts no written eviction image")
        # Restorable: the checkpoint image, a new pod, a Restore naming it.
        kubectl("delete", "deployment", "-n", ns, "web", "--wait=true", timeout=90)
        wait_until("the Deployment's pods gone", lambda: not kjson("get", "pods", "-n", ns, "-l", "app=web")["items"],
                   90)
        ref = f"localhost/gcr-restore/{ns}-{ck}:1"
        N.checkpoint_oci_image(archive, ref, "main")
        N.restored_pod(ns, "dst", ref)
        apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Restore", "metadata": {"name": "back", "namespace": ns},
               "spec": {"checkpointName": ck, "podName": "dst"}})
        N.wait_phase("restore", ns, "back", timeout=120)
        logs = kubectl("logs", "-n", ns, "dst").stdout
        check("READY pid=" in logs, f"the new pod's log is not the restored program's: {logs[-500:]}")
        rpid = int(logs.split("READY pid=")[1].split()[0])
        check(N.smi(ns, "dst", "state", rpid) == "running", "the restored process's driver state is not running")
        check(int(N.smi(ns, "dst", "mem", rpid)) >= nbytes, "the restored process lacks its GPU memory")
        N.finish(ns, "dst")
        log("the drained pod's image restored into a new pod: RESULT ok")
    finally:
        uncordon()
        cleanup(ns)


def case_drain_suspended():
    """Pods suspended already (a Checkpoint, as a GPUResidency at 0 makes; one Full, one KeepContext:
    its context still on the GPU) are drained: each eviction Checkpoint images the pod from its
    suspended state, never resuming it first (issue 33: the eviction failed "already suspended" and
    the pod went with its GPU state): Succeeded, its message saying the process stayed suspended,
    the GPU memory still 0 until the end; both images restore into new pods, RESULT ok."""
    ns = "ev-susp"
    N.namespace(ns)
    try:
        pods = {}
        for name, kc in (("full", False), ("kc", True)):
            pod, pid, nbytes = deployment(ns, name)
            ck = {"podName": pod}
            if kc:
                ck["keepContext"] = True
            apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Checkpoint", "metadata": {"name": f"own-{name}",
                   "namespace": ns}, "spec": ck})
            N.wait_phase("checkpoint", ns, f"own-{name}")
            uid = kjson("get", "pod", "-n", ns, pod)["metadata"]["uid"]
            pods[name] = (pod, pid, nbytes, ck_name(pod, uid), N.host_pid(ns, pod))
            check(N.smi(ns, pod, "mem", pid) == "0" or kc, f"{name}: GPU memory held while suspended")
        watches = {name: Watch(v[4], ns, v[3], v[0]) for name, v in pods.items()}
        t0 = time.time()
        drained("app in (full,kc)")
        for name, (pod, pid, nbytes, ck, hpid) in pods.items():
            w = watches[name]
            wait_until(f"{name}'s process gone", lambda: w.gone, 60)
            w.stop = True
            s = kjson("get", "checkpoint", "-n", ns, ck).get("status", {})
            check(s.get("phase") == "Succeeded", f"{name}: eviction Checkpoint {ck}: {s.get('phase')}: {s.get('message')}")
            check("stays suspended" in s.get("message", ""), f"{name}: {s.get('message')}")
            check(s["image"].get("gpuBytes", 0) >= 48 << 20, f"{name}: status.image {s.get('image')}")
            imaged_before_end(ns, pod, w.gone)
            log(f"drain of suspended pod {name}: {ck} Succeeded {rel(w.succeeded, t0)} after the drain began; "
                f"{s.get('message')}")
        for name in ("full", "kc"):
            kubectl("delete", "deployment", "-n", ns, name, "--wait=true", timeout=90)
        for name, (pod, pid, nbytes, ck, _) in pods.items():
            img = f"{IMAGES}/{ns}/{pod}/{ck}"
            ref = f"localhost/gcr-restore/{ns}-{ck}:1"
            N.checkpoint_oci_image(os.path.join(img, "criu", "kubelet-checkpoint.tar"), ref, "main")
            N.restored_pod(ns, f"dst-{name}", ref)
            apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Restore",
                   "metadata": {"name": f"back-{name}", "namespace": ns},
                   "spec": {"checkpointName": ck, "podName": f"dst-{name}"}})
            N.wait_phase("restore", ns, f"back-{name}", timeout=120)
            logs = kubectl("logs", "-n", ns, f"dst-{name}").stdout
            rpid = int(logs.split("READY pid=")[1].split()[0])
            check(int(N.smi(ns, f"dst-{name}", "mem", rpid)) >= nbytes, f"{name}: restored without its GPU memory")
            N.finish(ns, f"dst-{name}")
            log(f"the drained suspended pod {name}'s image restored into a new pod: RESULT ok")
    finally:
        uncordon()
        cleanup(ns)


def case_plain_delete():
    """kubectl delete pod of an opted-in pod (no DisruptionTarget, no annotation): no Checkpoint,
    the hold answered at once: the pod is gone long before its 60 s grace period."""
    ns = "ev-plain"
    N.namespace(ns)
    try:
        bare_pod(ns, "plain", 60)
        before = metric("skipped") or 0
        t0 = time.monotonic()
        kubectl("delete", "pod", "-n", ns, "plain", "--wait=true", timeout=90)
        took = time.monotonic() - t0
        check(took < 30, f"the pod took {took:.1f} s to end: the hold was not answered at once")
        check(not eviction_checkpoints(ns), f"a Checkpoint for a plain delete: {eviction_checkpoints(ns)}")
        check((metric("skipped") or 0) >= before + 1, "the agent's /metrics counts no skipped hold")
        line = wait_until("the agent's answer", lambda: next(
            (x for x in agent_log() if "answered nothing" in x and f"for {ns}/plain:" in x and
             "not for preemption or drain" in x), None), 30)
        log(f"plain delete: gone in {took:.1f} s; {line.split('evict: ')[-1][:200]}")
    finally:
        cleanup(ns)


def case_no_time():
    """Grace period 5 s, shorter than the estimate (15 s fixed): annotated any-deletion, deleted:
    no Checkpoint, a Warning EvictionNotImaged saying needed vs left, the pod ends."""
    ns = "ev-notime"
    N.namespace(ns)
    try:
        bare_pod(ns, "short", 5, {"gpucr.dev/evict-on": "any-deletion"})
        t0 = time.monotonic()
        kubectl("delete", "pod", "-n", ns, "short", "--wait=true", timeout=90)
        took = time.monotonic() - t0
        e = wait_until("an EvictionNotImaged Event", lambda: event(ns, "short", "EvictionNotImaged"), 30)
        note = e.get("note", "")
        check(e.get("type") == "Warning" and "needs about" in note and "leaves" in note and "AnyDeletion" in note,
              f"Event {e}")
        check(not eviction_checkpoints(ns), f"a Checkpoint without time for it: {eviction_checkpoints(ns)}")
        check(took < 30, f"the pod took {took:.1f} s to end")
        log(f"no time: gone in {took:.1f} s; Event: {note}")
    finally:
        cleanup(ns)


def case_policy_off():
    """helm upgrade --set eviction.enabled=false: a drained opted-in pod gets no image, its hold
    answered at once (last: the chart stays so)."""
    ns = "ev-off"
    N.namespace(ns)
    helm = os.path.join(N.ENV["GCR_TESTBED_BIN"], "helm")
    old = wait_until("the agent Ready", N.agent_ready, 120)
    N.run([helm, "upgrade", N.RELEASE, N.CHART, "-n", N.SYSTEM_NS] + helm_base(["--set", "eviction.enabled=false"]) +
          ["--wait", "--timeout", "180s"], timeout=200)
    wait_until("the agent with the policy off Ready", lambda: (p := N.agent_ready()) and (
        p["metadata"]["uid"] != old["metadata"]["uid"] or "eviction.enabled=false" in os.environ.get(
            "GCR_EVICT_E2E_SET", "")) and any("eviction imaging: off" in x for x in agent_log(p)) and p, 120)
    try:
        pod, _, _ = deployment(ns, "web")
        t0 = time.monotonic()
        drained("app=web")
        took = time.monotonic() - t0
        check(not eviction_checkpoints(ns), f"a Checkpoint with the policy off: {eviction_checkpoints(ns)}")
        check(took < 40, f"the drain took {took:.1f} s: the hold was not answered at once")
        check(event(ns, pod, "EvictionImageWritten") is None, "an EvictionImageWritten Event with the policy off")
        log(f"policy off: drained in {took:.1f} s, no image")
    finally:
        uncordon()
        cleanup(ns)


def case_agent_restart_during_hold():
    """The agent pod deleted while gcr-hold waits for the image (the test hook pauses each C/R 20 s
    before it starts, so the hold lasts that long): gcr-hold's connection drops unanswered, it asks
    again, and the DaemonSet's new agent waits for the Checkpoint the first one made (no second
    one): the image Succeeded before the program ended, no FailedPreStopHook."""
    ns = "ev-restart"
    N.namespace(ns)
    helm = os.path.join(N.ENV["GCR_TESTBED_BIN"], "helm")
    old = wait_until("the agent Ready", N.agent_ready, 120)
    N.run([helm, "upgrade", N.RELEASE, N.CHART, "-n", N.SYSTEM_NS] + helm_base(
        ["--set", "agent.extraEnv[0].name=GCR_AGENT_TEST_PAUSE", "--set", "agent.extraEnv[0].value=before-cr",
         "--set", "agent.extraEnv[1].name=GCR_AGENT_TEST_PAUSE_S", "--set-string", "agent.extraEnv[1].value=20"]) +
          ["--wait", "--timeout", "180s"], timeout=200)
    try:
        paused = wait_until("the paused agent Ready", lambda: (p := N.agent_ready()) and p["metadata"]["uid"] !=
                            old["metadata"]["uid"] and N.paused_env(p) and p, 120)
        pod, _, _ = deployment(ns, "web", grace=120)
        uid = kjson("get", "pod", "-n", ns, pod)["metadata"]["uid"]
        ck = ck_name(pod, uid)
        w = Watch(N.host_pid(ns, pod), ns, ck)
        t0 = time.time()
        d = drain("app=web")
        try:
            wait_until(f"Checkpoint {ck} Running (the agent paused in it)", lambda: kjson(
                "get", "checkpoint", "-n", ns, ck).get("status", {}).get("phase") == "Running", 60)
            check(w.gone is None, "the program ended before the agent was restarted")
            kubectl("delete", "pod", "-n", N.SYSTEM_NS, paused["metadata"]["name"], "--wait=false")
            t_del = time.time()
            ph_del = kjson("get", "checkpoint", "-n", ns, ck).get("status", {}).get("phase")
            new = wait_until("the DaemonSet's new agent Ready", lambda: (p := N.agent_ready()) and p["metadata"][
                "uid"] != paused["metadata"]["uid"] and p, 120)
            t_new = time.time()
            out, _ = d.communicate(timeout=200)
        finally:
            uncordon()
        check(d.returncode == 0, f"kubectl drain failed: {out[-1500:]}")
        wait_until("the program's process gone", lambda: w.gone, 120)
        w.stop = True
        s = kjson("get", "checkpoint", "-n", ns, ck).get("status", {})
        check(s.get("phase") == "Succeeded", f"Checkpoint {ck}: {s.get('phase')}: {s.get('message')}")
        check(ph_del not in ("Succeeded", "Failed"), f"the Checkpoint was {ph_del} when the agent was deleted: "
              "not a restart in the hold")
        e = imaged_before_end(ns, pod, w.gone)
        cks = [c["metadata"]["name"] for c in eviction_checkpoints(ns)]
        check(cks == [ck], f"eviction Checkpoints {cks}")
        check(event(ns, pod, "FailedPreStopHook") is None, f"gcr-hold failed: {event(ns, pod, 'FailedPreStopHook')}")
        line = wait_until("the new agent waiting for the Checkpoint", lambda: next(
            (x for x in agent_log(new) if f"Checkpoint {ck} exists already" in x), None), 30)
        log(f"agent restart in the hold: agent deleted {t_del - t0:.1f} s after the drain began, the new one Ready at "
            f"{t_new - t0:.1f} s; Checkpoint {ck} (then {ph_del}) seen Succeeded at {rel(w.succeeded, t0)}, the "
            f"image's Event at {e['eventTime']}, the program ended at "
            f"{w.gone - t0:.1f} s; {line.split('evict: ')[-1]}; Event: {e.get('note')}")
    finally:
        uncordon()
        cleanup(ns)
        N.run([helm, "upgrade", N.RELEASE, N.CHART, "-n", N.SYSTEM_NS] + helm_base() + ["--wait", "--timeout", "180s"],
              timeout=200)
        wait_until("the agent without the test hook Ready", lambda: (p := N.agent_ready()) and not N.paused_env(p), 120)


TOKEN = "gcr.test/token"


def node_token(n):
    """Advertises n of an extended resource on the node (as the Kubernetes docs do, a status
    patch), or removes it (n None): a resource one pod at a time can hold."""
    path = "/status/capacity/" + TOKEN.replace("/", "~1")
    op = {"op": "add", "path": path, "value": str(n)} if n is not None else {"op": "remove", "path": path}
    kubectl("patch", "node", N.ENV["GCR_TESTBED_NODE"], "--subresource=status", "--type=json", "-p",
            json.dumps([op]), check=n is not None)
    if n is not None:
        wait_until("the token allocatable", lambda: kjson("get", "node", N.ENV["GCR_TESTBED_NODE"])["status"]
                   .get("allocatable", {}).get(TOKEN) == str(n), 30)


def case_preempted():
    """A real preemption by the scheduler: an opted-in pod of a low PriorityClass holds the
    node's one token (an extended resource); a pod of a high PriorityClass asks for it. The
    scheduler marks the victim DisruptionTarget/PreemptionByScheduler and deletes it: its image
    is written before its program ends (Checkpoint Succeeded, cause PreemptionByScheduler,
    EvictionImageWritten), and the preemptor runs."""
    ns = "ev-preempt"
    N.namespace(ns)
    for name, value in (("gcr-ev-low", 10), ("gcr-ev-high", 1000)):
        apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
               "value": value, "description": "GCR eviction tier"})
    node_token(1)
    try:
        bare_pod(ns, "victim", 60, extra={"priorityClassName": "gcr-ev-low"}, limits={TOKEN: "1"})
        uid = kjson("get", "pod", "-n", ns, "victim")["metadata"]["uid"]
        ck = ck_name("victim", uid)
        hpid = N.host_pid(ns, "victim")
        w = Watch(hpid, ns, ck)
        t0 = time.time()
        apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "preemptor", "namespace": ns},
               "spec": {"priorityClassName": "gcr-ev-high", "terminationGracePeriodSeconds": 1,
                        "containers": [{"name": "main", "image": N.WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                                        "command": ["/bin/sh", "-c", "sleep 3600"],
                                        "resources": {"limits": {TOKEN: "1"}}}]}})
        wait_until("the victim's program gone", lambda: w.gone, 120)
        w.stop = True
        c = kjson("get", "checkpoint", "-n", ns, ck)
        s = c.get("status", {})
        check(s.get("phase") == "Succeeded", f"Checkpoint {ck}: {s.get('phase')}: {s.get('message')}")
        cause = c["metadata"].get("annotations", {}).get("gpucr.dev/evict-cause")
        check(cause == "PreemptionByScheduler", f"cause {cause}")
        e = imaged_before_end(ns, "victim", w.gone)
        img = s["image"]["path"]
        check(os.path.isfile(os.path.join(img, "manifest.json")), f"no manifest in {img}")
        wait_until("the preemptor Running", lambda: kjson("get", "pod", "-n", ns, "preemptor")["status"]
                   .get("phase") == "Running", 60)
        log(f"preempted: Checkpoint {ck} Succeeded {rel(w.succeeded, t0)} after the preemptor was created, the "
            f"victim's program ended {w.gone - t0:.1f} s after; Event: {e.get('note')}")
    finally:
        cleanup(ns)
        node_token(None)


CASES = [case_install, case_drain_images, case_drain_suspended, case_plain_delete, case_no_time, case_preempted,
         case_agent_restart_during_hold, case_policy_off]

if __name__ == "__main__":
    only = os.environ.get("GCR_EVICT_E2E_CASES")
    if only:
        CASES = [case_install] + [c for c in CASES[1:] if c.__name__ in only.split(",")]
    sys.exit(N.main(CASES))
