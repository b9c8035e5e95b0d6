#!/usr/bin/env python3
"""The replacement pod restored from its owner's eviction image, on the real node: tier k8s-replace.

    python3 tests/k8s/test_replace_e2e.py [BUILD_DIR]

The real-node test bed of test_node_e2e.py (kubelet, containerd 2.3.7 with restore through
CreateContainer, runc, CRIU), the chart with images.kubelet and eviction.restore on. The
eviction's Checkpoint is made by hand here, as the contract (docs/preemption.md, "Eviction
without loss") says the checkpoint at deletion makes it: labelled gpucr.dev/eviction and
gpucr.dev/owner-uid, action Image, cpuCheckpoint Kubelet. Then the pod is deleted; its
ReplicaSet's new pod carries the scheduling gate gpucr.dev/restore, and everything after is
GCR's: the gate, the image pulled from the node agent's registry on 127.0.0.1, containerd's
restore, the Restore of the GPU data, the Events. case_drain_restored runs the whole route with
nothing made by hand: the chart also has eviction on, the pod is drained, imaged by the agent within
its grace period, and its replacement restored once the node is uncordoned.
GCR_REPLACE_E2E_CASES: a comma list of case names to run (after the install);
GCR_REPLACE_E2E_SET: a comma list of key=value added as helm --set values
(eviction.restore.enabled=false or eviction.enabled=false makes the positive cases fail, as they
must). Ends with "N passed, N failed".
"""
import hashlib
import json
import os
import socket
import sys
import ssl
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_node_e2e as N  # noqa: E402
import test_evict_e2e as E  # noqa: E402
import registry_client as R  # noqa: E402

check, kubectl, kjson, apply, wait_until, log = N.check, N.kubectl, N.kjson, N.apply, N.wait_until, N.log
PORT = 5055
GATE = "gpucr.dev/restore"


def restore_on():
    """Whether this run installs eviction.restore on (GCR_REPLACE_E2E_SET may switch it off)."""
    return "eviction.restore.enabled=false" not in os.environ.get("GCR_REPLACE_E2E_SET", "").split(",")


def case_install():
    """helm install with images.kubelet, eviction and eviction.restore on (plus GCR_REPLACE_E2E_SET):
    the agent runs in the host's network namespace and its registry answers on the node's 127.0.0.1."""
    helm = os.path.join(N.ENV["GCR_TESTBED_BIN"], "helm")
    N.run([helm, "install", N.RELEASE, N.CHART, "-n", N.SYSTEM_NS, "--create-namespace"] +
          E.helm_base(["--set", "eviction.restore.enabled=true", "--set", f"eviction.restore.registryPort={PORT}",
                       "--set", "eviction.restore.waitSeconds=60"], env="GCR_REPLACE_E2E_SET") +
          ["--wait", "--timeout", "180s"], timeout=200)
    p = wait_until("the DaemonSet's agent Ready", N.agent_ready, 120)
    if not restore_on():  # the policy off: the positive cases must fail, not the install
        log(f"chart installed with {os.environ['GCR_REPLACE_E2E_SET']}: no registry")
        return
    check(p["spec"].get("hostNetwork") is True, "the agent is not on the host's network")
    code, _, _ = http("/v2/")
    check(code == 200, f"GET /v2/ on 127.0.0.1:{PORT} answered {code}")
    log(f"chart installed with eviction and eviction.restore on; registry on 127.0.0.1:{PORT} answers /v2/")


# ---- helpers ----

def http(path, method="GET", accept=None):
    """(status, headers, body) of a request to the node's registry, as containerd makes it: TLS with
    the files the agent wrote into containerd's host directory (registry_client)."""
    return R.request(PORT, path, method=method, accept=accept)


def script():
    return ("touch /tmp/ctl && tail -f /tmp/ctl | "
            f"gcr-testprog --module {N.KERNELS} --mib 48 --buffers 3 --threads 2 --iters 20 --wait")


def deployment(ns, name, kind="Deployment", replicas=1):
    """A Deployment (or StatefulSet, or Job) of 1 replica opted in (label gpucr.dev/evict: image, the
    scheduling gate), its pod uid 0 (CRIU needs CAP_SYS_RESOURCE for another uid on these
    machines), the test program on the injected shim."""
    labels = {"app": name, "gpucr.dev/evict": "image"}
    pod = {"schedulingGates": [{"name": GATE}],
           "runtimeClassName": "nvidia", "terminationGracePeriodSeconds": 5,
           "securityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False},
           "containers": [{"name": "main", "image": N.WORKLOAD_IMAGE, "imagePullPolicy": "IfNotPresent",
                           "command": ["/bin/sh", "-c", script()],
                           "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                           "resources": {"limits": {"gpucr.dev/shim": "1"}},
                           "securityContext": {"allowPrivilegeEscalation": False,
                                               "capabilities": {"drop": ["ALL"]}}}]}
    if kind == "Job":  # a deleted pod counts against backoffLimit; the Job makes a new one
        spec = {"backoffLimit": 3, "template": {"metadata": {"labels": labels},
                                                "spec": {**pod, "restartPolicy": "Never"}}}
    else:
        spec = {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                **({"serviceName": name} if kind == "StatefulSet" else {}),
                "template": {"metadata": {"labels": labels}, "spec": pod}}
    apply({"apiVersion": "batch/v1" if kind == "Job" else "apps/v1", "kind": kind,
           "metadata": {"name": name, "namespace": ns}, "spec": spec})


def live_pods(ns, app, but=()):
    return [p for p in kjson("get", "pods", "-n", ns, "-l", f"app={app}")["items"]
            if not p["metadata"].get("deletionTimestamp") and p["metadata"]["name"] not in but]


def one_pod(ns, app, but=()):
    pods = live_pods(ns, app, but)
    return pods[0] if len(pods) == 1 else None


def ready_line(ns, pod, timeout=120):
    line = wait_until(f"pod {ns}/{pod} READY line", lambda: next(
        (l for l in kubectl("logs", "-n", ns, pod, check=False).stdout.splitlines() if l.startswith("READY ")), None),
        timeout)
    return dict(kv.split("=", 1) for kv in line.split()[1:])


def eviction_checkpoint(ns, pod, wait=True):
    """The eviction's Checkpoint as the contract has the checkpoint at deletion make it (by hand here);
    returns its name, once Succeeded when wait."""
    p = kjson("get", "pod", "-n", ns, pod)
    owner = next(o["uid"] for o in p["metadata"]["ownerReferences"] if o.get("controller"))
    name = f"evict-{pod[:40]}-{p['metadata']['uid'][:8]}"
    apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Checkpoint", "metadata": {
        "name": name, "namespace": ns,
        "labels": {"gpucr.dev/eviction": "true", "gpucr.dev/evicted-pod": pod, "gpucr.dev/owner-uid": owner,
                   "gpucr.dev/node": N.ENV["GCR_TESTBED_NODE"]},
        "annotations": {"gpucr.dev/evict-cause": "EvictionByEvictionAPI"}},
        "spec": {"podName": pod, "action": "Image", "cpuCheckpoint": "Kubelet", "containerName": "main"}})
    if wait:
        N.wait_phase("checkpoint", ns, name, timeout=180)
    return name


def events(ns, pod, reason):
    return [e for e in N.events_for(ns, pod) if e.get("reason") == reason]


def ts(s):
    return time.mktime(time.strptime(s[:19], "%Y-%m-%dT%H:%M:%S")) if s else 0


# ---- cases ----

def case_no_image_cold():
    """A gated pod of an owner with no eviction image: the gate is removed at once (a cold start,
    as without GCR), with a Normal StartedCold Event saying why; the program starts fresh."""
    ns = "team-cold"
    N.namespace(ns)
    t0 = time.monotonic()
    deployment(ns, "cold")
    p = wait_until("the gated pod ungated and running", lambda: (p := one_pod(ns, "cold")) and
                   not p["spec"].get("schedulingGates") and p["status"].get("phase") == "Running" and p, 120)
    name = p["metadata"]["name"]
    check(p["spec"]["containers"][0]["image"] == N.WORKLOAD_IMAGE, f"image changed: {p['spec']['containers'][0]}")
    check(not p["metadata"].get("annotations", {}).get("gpucr.dev/restore-from"), "a cold pod names an image")
    ev = wait_until("a StartedCold Event", lambda: events(ns, name, "StartedCold"), 30)
    check(ev[0]["type"] == "Normal" and "no eviction image" in ev[0].get("note", ""), f"event: {ev[0]}")
    ready_line(ns, name)
    log(f"cold start: gated pod running in {time.monotonic() - t0:.1f} s; Event: {ev[0].get('note')}")
    kubectl("delete", "namespace", ns, "--wait=false")


def case_failed_image_cold():
    """The owner's eviction Checkpoint Failed (here: its pod gone before it ran): the replacement is
    ungated at once and starts cold, with a Warning StartedCold naming the Checkpoint and its message."""
    ns = "team-failed"
    N.namespace(ns)
    deployment(ns, "lost", replicas=0)
    rs = wait_until("the ReplicaSet", lambda: kjson("get", "replicasets", "-n", ns, "-l", "app=lost")["items"], 30)[0]
    ck = "evict-lost-gone-00000000"
    apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Checkpoint", "metadata": {
        "name": ck, "namespace": ns,
        "labels": {"gpucr.dev/eviction": "true", "gpucr.dev/owner-uid": rs["metadata"]["uid"]}},
        "spec": {"podName": "lost-gone", "action": "Image", "cpuCheckpoint": "Kubelet", "containerName": "main"}})
    N.wait_phase("checkpoint", ns, ck, ("Failed",), timeout=120)
    kubectl("scale", "deployment", "-n", ns, "lost", "--replicas=1")
    p = wait_until("the gated pod ungated and running", lambda: (p := one_pod(ns, "lost")) and
                   not p["spec"].get("schedulingGates") and p["status"].get("phase") == "Running" and p, 120)
    name = p["metadata"]["name"]
    check(p["spec"]["containers"][0]["image"] == N.WORKLOAD_IMAGE, "not a cold start")
    ev = wait_until("a StartedCold Event", lambda: events(ns, name, "StartedCold"), 30)
    check(ev[0]["type"] == "Warning" and ck in ev[0].get("note", "") and "Failed" in ev[0].get("note", ""),
          f"event {ev[0]}")
    labels = kjson("get", "checkpoint", "-n", ns, ck)["metadata"]["labels"]
    check("gpucr.dev/restored-into" not in labels, f"a Failed Checkpoint was consumed: {labels}")
    log(f"failed image: {name} started cold; Event: {ev[0].get('note')}")
    kubectl("delete", "namespace", ns, "--wait=false")


def case_registry_refuses():
    """From the node: an image issued for a restore is served by its tag (the index with the annotation
    containerd restores from, the manifest, config and layer by their digests, the layer being the
    kubelet's archive); 404 for a wrong token, a wrong digest, another Checkpoint's name, a Checkpoint
    not issued, and paths outside the API; nothing on the node's other address."""
    ns = "team-reg"
    N.namespace(ns)
    N.workload_pod(ns, "src", 0)
    ck = "evict-src-byhand"
    apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Checkpoint", "metadata": {
        "name": ck, "namespace": ns, "labels": {"gpucr.dev/eviction": "true"}},
        "spec": {"podName": "src", "action": "Image", "cpuCheckpoint": "Kubelet", "containerName": "main"}})
    N.wait_phase("checkpoint", ns, ck, timeout=180)
    token = "0123456789abcdef0123456789abcdef"
    base = f"/v2/gcr-evict/{ns}/{ck}"
    idx = "application/vnd.oci.image.index.v1+json"
    code, _, _ = http(f"{base}/manifests/{token}", accept=idx)
    check(code == 404, f"a Checkpoint not issued for a restore is served ({code})")
    # Issued by hand, as the scaler does when it takes the image for a pod.
    kubectl("label", "checkpoint", "-n", ns, ck, "gpucr.dev/restored-into=somepod")
    kubectl("annotate", "checkpoint", "-n", ns, ck, f"gpucr.dev/restore-token={token}")
    code, hdr, body = http(f"{base}/manifests/{token}", accept=idx)
    check(code == 200, f"the issued tag is not served ({code} {body[:200]})")
    index = json.loads(body)
    check(index.get("annotations", {}).get("org.criu.checkpoint.container.name") == "main", f"index {index}")
    check(hdr.get("Docker-Content-Digest") == "sha256:" + hashlib.sha256(body).hexdigest(), f"digest header {hdr}")
    code, hdr, _ = http(f"{base}/manifests/{token}", method="HEAD")
    check(code == 200 and int(hdr.get("Content-Length", -1)) == len(body), f"HEAD {code} {hdr}")
    mdig = index["manifests"][0]["digest"]
    code, _, mbody = http(f"{base}/manifests/{mdig}")
    check(code == 200 and "sha256:" + hashlib.sha256(mbody).hexdigest() == mdig, f"manifest by digest {code}")
    man = json.loads(mbody)
    code, _, cbody = http(f"{base}/blobs/{man['config']['digest']}")
    check(code == 200 and "sha256:" + hashlib.sha256(cbody).hexdigest() == man["config"]["digest"], "config blob")
    layer = man["layers"][0]
    img = kjson("get", "checkpoint", "-n", ns, ck)["status"]["image"]["path"]
    archive = open(os.path.join(img, "criu", "kubelet-checkpoint.tar"), "rb").read()
    code, _, lbody = http(f"{base}/blobs/{layer['digest']}")
    check(code == 200 and lbody == archive and layer["size"] == len(archive) and
          layer["digest"] == "sha256:" + hashlib.sha256(archive).hexdigest(), "the layer is not the kubelet's archive")
    # Refused.
    wrong = "sha256:" + "0" * 64
    for path, what in [(f"{base}/manifests/{'f' * 32}", "an unknown token"),
                       (f"{base}/manifests/{token.upper()}", "the token in capitals"),
                       (f"{base}/blobs/{wrong}", "a wrong digest"),
                       (f"{base}/manifests/{wrong}", "a wrong manifest digest"),
                       (f"/v2/gcr-evict/{ns}/other/blobs/{layer['digest']}", "another Checkpoint's name"),
                       (f"/v2/gcr-evict/default/{ck}/manifests/{token}", "another namespace"),
                       (f"/v2/gcr-evict/{ns}/{ck}/../{ck}/manifests/{token}", "a path with .."),
                       (f"{base}/manifests/{token}%00", "an escaped NUL after the token"),
                       (f"/v2/gcr-evict/{ns}/%65{ck[1:]}/manifests/{token}", "an escaped letter"),
                       ("/v2/_catalog", "the catalog"), (f"{base}/tags/list", "the tag list"),
                       ("/metrics", "another endpoint")]:
        code, _, _ = http(path)
        check(code == 404, f"{what}: {path} answered {code}, not 404")
    code, _, _ = http(f"{base}/blobs/uploads/", method="POST")
    check(code in (404, 405), f"an upload answered {code}")
    # Only containerd (the client certificate of the host directory) is answered, only over TLS,
    # and only by a server holding the agent's CA key (the name 127.0.0.1 checked against it).
    toml = R.hosts_toml(PORT)
    check(f'server = "https://127.0.0.1:{PORT}"' in toml and "skip_verify = false" in toml, f"hosts.toml: {toml}")
    try:
        R.request(PORT, f"{base}/manifests/{token}", client_cert=False)
        check(False, "the registry answered a client without the node's client certificate")
    except (ssl.SSLError, ConnectionError, OSError) as e:
        log(f"registry: a client without the client certificate refused ({type(e).__name__})")
    raw = R.plain(PORT, f"{base}/manifests/{token}")
    check(raw.startswith(b"HTTP/1.1 400 ") and b"TLS only" in raw and b"index" not in raw,
          f"plain HTTP answered {raw[:200]!r}")
    # The token withdrawn (as once the Restore is final): nothing served.
    kubectl("annotate", "checkpoint", "-n", ns, ck, "gpucr.dev/restore-token-")
    code, _, _ = http(f"{base}/blobs/{layer['digest']}")
    check(code == 404, f"the layer is still served once the token is withdrawn ({code})")
    # Loopback only: the node's own address has nothing on the port.
    addrs = [a["address"] for a in kjson("get", "node", N.ENV["GCR_TESTBED_NODE"])["status"]["addresses"]
             if a["type"] == "InternalIP"]
    check(addrs, "the node has no InternalIP")
    for a in addrs:
        s = socket.socket(socket.AF_INET6 if ":" in a else socket.AF_INET)
        s.settimeout(5)
        try:
            rc = s.connect_ex((a, PORT))
        finally:
            s.close()
        check(rc != 0, f"the registry port answers on the node's address {a}")
    log(f"registry: issued image served (layer {layer['size']} bytes = the kubelet's archive); 404 for the rest; "
        f"nothing on {addrs}:{PORT}")
    kubectl("delete", "namespace", ns, "--wait=false")


def evict_and_replace(ns, app, corrupt=False, kind="Deployment"):
    """The Deployment's (or kind's) pod running, its eviction Checkpoint made, (a byte of its GPU
    data flipped,) the pod deleted; returns (old pod, checkpoint, the replacement pod's name, t0,
    bytes)."""
    deployment(ns, app, kind=kind)
    p = wait_until("the first pod running", lambda: (p := one_pod(ns, app)) and
                   p["status"].get("phase") == "Running" and p, 120)
    old = p["metadata"]["name"]
    fields = ready_line(ns, old)
    ck = eviction_checkpoint(ns, old)
    img = kjson("get", "checkpoint", "-n", ns, ck)["status"]["image"]["path"]
    flipped = None
    if corrupt:
        flipped = sorted(f for f in os.listdir(os.path.join(img, "gpu")) if f.endswith(".bin") and
                         os.path.getsize(os.path.join(img, "gpu", f)) > 0)[0]
        with open(os.path.join(img, "gpu", flipped), "r+b") as f:
            f.seek(4096)
            b = f.read(1)
            f.seek(4096)
            f.write(bytes([b[0] ^ 0x5a]))
    t0 = time.monotonic()
    kubectl("delete", "pod", "-n", ns, old, "--wait=false")
    new = wait_until("the replacement pod", lambda: (p := one_pod(ns, app, but=(old,))) and p["metadata"]["name"], 60)
    return old, ck, new, t0, int(fields["bytes"]), flipped


def restored_ok(ns, pod, nbytes):
    """The replacement runs the restored program (its READY line from before), restored at the
    first attempt (the gate held it until the evicted pod had ended), its GPU memory back, and the
    program's own bit-exact check passes (RESULT ok); returns the pod."""
    p = kjson("get", "pod", "-n", ns, pod)
    check(p["status"]["containerStatuses"][0].get("restartCount") == 0, f"restarts: {p['status']['containerStatuses']}")
    logs = kubectl("logs", "-n", ns, pod).stdout
    check("READY pid=" in logs, f"the replacement's log is not the restored program's: {logs[-500:]}")
    pid = int(logs.split("READY pid=")[1].split()[0])
    check(N.smi(ns, pod, "state", pid) == "running", "the restored process's driver state is not running")
    check(int(N.smi(ns, pod, "mem", pid)) >= nbytes, "the restored process lacks its GPU memory")
    N.finish(ns, pod)
    return p


def case_replacement_restored():
    """A drained pod comes back from its image in the replacement pod: the ReplicaSet's new pod is
    ungated onto the image's node with the checkpoint image from the node's registry, containerd
    restores it, the Restore gives it its GPU data; the program goes on from where it was (its own
    bit-exact check), the Checkpoint is consumed, a RestoredFromEviction Event is on the pod."""
    ns = "team-replace"
    N.namespace(ns)
    old, ck, new, t0, nbytes, _ = evict_and_replace(ns, "web")
    p = wait_until("the replacement ungated", lambda: (p := kjson("get", "pod", "-n", ns, new)) and
                   not p["spec"].get("schedulingGates") and p, 60)
    t_ungated = time.monotonic()
    image = p["spec"]["containers"][0]["image"]
    check(image.startswith(f"127.0.0.1:{PORT}/gcr-evict/{ns}/{ck}:") and len(image.rsplit(":", 1)[1]) == 32,
          f"the replacement's image is {image}")
    check(p["metadata"].get("annotations", {}).get("gpucr.dev/restore-from") == ck, f"annotations {p['metadata']}")
    check(p["spec"].get("nodeSelector", {}).get("kubernetes.io/hostname") == N.ENV["GCR_TESTBED_NODE"],
          f"nodeSelector {p['spec'].get('nodeSelector')}")
    labels = kjson("get", "checkpoint", "-n", ns, ck)["metadata"]["labels"]
    check(labels.get("gpucr.dev/restored-into") == new[:63], f"the Checkpoint is not consumed: {labels}")
    img = kjson("get", "checkpoint", "-n", ns, ck).get("status", {}).get("image", {})
    check("reference" not in img, f"an eviction image published a reference of its own: {img}")
    N.wait_phase("restore", ns, ck, timeout=180)
    t_restored = time.monotonic()
    rs = kjson("get", "restore", "-n", ns, ck)
    check(rs["spec"].get("podName") == new, f"Restore spec {rs['spec']}")
    ev = wait_until("a RestoredFromEviction Event", lambda: events(ns, new, "RestoredFromEviction"), 30)
    check(ev[0]["type"] == "Normal" and ck in ev[0].get("note", ""), f"event {ev[0]}")
    p = restored_ok(ns, new, nbytes)
    started = p["status"]["containerStatuses"][0]["state"].get("running", {}).get("startedAt")
    # The token withdrawn once the Restore is final: the registry serves the image no more.
    wait_until("the token withdrawn", lambda: "gpucr.dev/restore-token" not in
               kjson("get", "checkpoint", "-n", ns, ck)["metadata"].get("annotations", {}), 30)
    created = ts(p["metadata"]["creationTimestamp"])
    log(f"replacement {new} of {old}: pod deleted -> ungated {t_ungated - t0:.1f} s -> Restore Succeeded "
        f"{t_restored - t0:.1f} s; pod created -> running {ts(started) - created:.0f} s -> Restore completed "
        f"{ts(rs['status'].get('completionTime')) - created:.0f} s (API times, whole seconds); "
        f"Restore durations {rs['status'].get('durations')}; Event: {ev[0].get('note')}")
    # What a user sees (docs/preemption.md, "The replacement pod").
    for args in (["get", "pods", "-n", ns, "-o", "wide"], ["get", "checkpoints,restores", "-n", ns, "-L",
                                                            "gpucr.dev/restored-into"],
                 ["get", "events", "-n", ns, "--field-selector", f"involvedObject.name={new}"]):
        print(f"$ kubectl {' '.join(args)}\n{kubectl(*args).stdout}", flush=True)
    agent = N.agent_pod()[0]["metadata"]["name"]
    print("agent log, registry:\n" + "\n".join(l for l in kubectl("logs", "-n", N.SYSTEM_NS, agent, "-c", "agent").stdout
                                             .splitlines() if "ocireg" in l), flush=True)
    kubectl("delete", "namespace", ns, "--wait=false")


def case_user_reference():
    """Restore into a new pod without building an image (docs/images.md, "Restore into a new pod"):
    a Kubelet Image that no eviction made gets status.image.reference, the checkpoint image on the
    node's registry; a user's pod naming it is pulled and restored by containerd, and a Restore
    naming that pod gives it its GPU data (the program's own bit-exact check). The registry serves
    it only by that token, and not once the Checkpoint is deleted."""
    ns = "team-ref"
    N.namespace(ns)
    _, nbytes = N.workload_pod(ns, "src", 0)
    apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Checkpoint", "metadata": {"name": "snap", "namespace": ns},
           "spec": {"podName": "src", "action": "Image", "cpuCheckpoint": "Kubelet"}})
    N.wait_phase("checkpoint", ns, "snap", timeout=180)
    st = kjson("get", "checkpoint", "-n", ns, "snap")["status"]
    ref = st.get("image", {}).get("reference", "")
    prefix = f"127.0.0.1:{PORT}/gcr-evict/{ns}/snap:"
    check(ref.startswith(prefix) and len(ref) == len(prefix) + 32, f"status.image {st.get('image')}")
    check(st["image"].get("container") == "main", f"status.image.container {st['image'].get('container')}")
    token = ref.rsplit(":", 1)[1]
    # The token is in status.image.reference only: not in the message nor the Event.
    check(token not in st.get("message", "") and "status.image.reference" in st.get("message", ""),
          f"the message: {st.get('message')}")
    notes = [e.get("note", "") for e in kjson("get", "events.events.k8s.io", "-n", ns)["items"]]
    check(notes and not any(token in n for n in notes), f"an Event carries the token: {notes}")
    path = f"/v2/gcr-evict/{ns}/snap/manifests/"
    accept = "application/vnd.oci.image.index.v1+json,application/vnd.oci.image.manifest.v1+json"
    code, _, _ = http(path + token, accept=accept)
    check(code == 200, f"the published reference answered {code}")
    bad = ("0" if token[0] != "0" else "1") + token[1:]
    code, _, _ = http(path + bad, accept=accept)
    check(code == 404, f"another token answered {code}")
    kubectl("delete", "pod", "-n", ns, "src", "--wait=true", timeout=90)
    t0 = time.monotonic()
    N.restored_pod(ns, "dst", ref, pull="IfNotPresent")
    apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Restore", "metadata": {"name": "back", "namespace": ns},
           "spec": {"checkpointName": "snap", "podName": "dst"}})
    N.wait_phase("restore", ns, "back", timeout=120)
    log(f"user's pod from status.image.reference restored in {time.monotonic() - t0:.1f} s (pod created to "
        f"Restore Succeeded): {kjson('get', 'restore', '-n', ns, 'back')['status'].get('durations')}")
    restored_ok(ns, "dst", nbytes)
    kubectl("delete", "checkpoint", "-n", ns, "snap", "--wait=true")
    code, _, _ = http(path + token, accept=accept)
    check(code == 404, f"the reference of a deleted Checkpoint answered {code}")
    print(f"$ kubectl get checkpoint snap -o jsonpath='{{.status.image.reference}}'\n{ref}", flush=True)
    kubectl("delete", "namespace", ns, "--wait=false")


def case_checkpoint_in_progress():
    """The order of a real eviction: the Checkpoint made and the pod deleted at once, so the replacement
    appears while the image is still being written. Its gate stays until the Checkpoint is final, then
    it is restored as in case_replacement_restored (bit-exact)."""
    ns = "team-replace3"
    N.namespace(ns)
    deployment(ns, "mid")
    p = wait_until("the first pod running", lambda: (p := one_pod(ns, "mid")) and
                   p["status"].get("phase") == "Running" and p, 120)
    old = p["metadata"]["name"]
    nbytes = int(ready_line(ns, old)["bytes"])
    ck = eviction_checkpoint(ns, old, wait=False)
    kubectl("delete", "pod", "-n", ns, old, "--wait=false")
    seen = []  # (checkpoint phase, replacement gated) while the replacement waits

    def restored():
        new = one_pod(ns, "mid", but=(old,))
        ph = phase("checkpoint", ns, ck)
        if new is not None:
            seen.append((ph, bool(new["spec"].get("schedulingGates"))))
        return new if new is not None and not new["spec"].get("schedulingGates") else None
    new = wait_until("the replacement ungated", restored, 90)["metadata"]["name"]
    check(any(g for _, g in seen), f"the replacement was never seen gated: {seen}")
    check(all(g for ph, g in seen if ph != "Succeeded"), f"ungated before the Checkpoint was final: {seen}")
    check(any(ph != "Succeeded" and g for ph, g in seen),
          f"the replacement was not seen while the Checkpoint was in progress (too fast to observe?): {seen}")
    N.wait_phase("restore", ns, ck, timeout=180)
    logs = kubectl("logs", "-n", ns, new).stdout
    pid = int(logs.split("READY pid=")[1].split()[0])
    check(int(N.smi(ns, new, "mem", pid)) >= nbytes, "the restored process lacks its GPU memory")
    N.finish(ns, new)
    log(f"in progress: replacement {new} held while Checkpoint {ck} was {sorted(set(ph for ph, g in seen if g))}; "
        f"restored, RESULT ok")
    kubectl("delete", "namespace", ns, "--wait=false")


def case_statefulset():
    """A StatefulSet's pod: its replacement has the same name (created once the evicted pod is gone) and
    is restored from the image as a Deployment's is."""
    ns = "team-replace4"
    N.namespace(ns)
    deployment(ns, "db", kind="StatefulSet")
    pod = "db-0"
    p = wait_until("db-0 running", lambda: (p := kjson("get", "pod", "-n", ns, pod)) and
                   p["status"].get("phase") == "Running" and p, 120)
    uid = p["metadata"]["uid"]
    nbytes = int(ready_line(ns, pod)["bytes"])
    ck = eviction_checkpoint(ns, pod)
    kubectl("delete", "pod", "-n", ns, pod, "--wait=false")
    wait_until("db-0 replaced and ungated", lambda: (p := kjson("get", "pod", "-n", ns, pod)) and
               p["metadata"]["uid"] != uid and not p["spec"].get("schedulingGates") and p, 90)
    N.wait_phase("restore", ns, ck, timeout=180)
    check(kjson("get", "checkpoint", "-n", ns, ck)["metadata"]["labels"].get("gpucr.dev/restored-into") == pod,
          "the Checkpoint is not consumed by db-0")
    logs = kubectl("logs", "-n", ns, pod).stdout
    pid = int(logs.split("READY pid=")[1].split()[0])
    check(int(N.smi(ns, pod, "mem", pid)) >= nbytes, "the restored process lacks its GPU memory")
    N.finish(ns, pod)
    wait_until("a RestoredFromEviction Event", lambda: events(ns, pod, "RestoredFromEviction"), 30)
    log(f"StatefulSet: db-0 restored from {ck}, RESULT ok")
    kubectl("delete", "namespace", ns, "--wait=false")


def case_job():
    """A Job's pod: the Job makes a new pod for the deleted one, with the template's gate; it is
    restored from the eviction image as a Deployment's is (the Job is its controller owner)."""
    ns = "team-replace5"
    N.namespace(ns)
    old, ck, new, _, nbytes, _ = evict_and_replace(ns, "train", kind="Job")
    p = kjson("get", "pod", "-n", ns, new)
    owner = next(o for o in p["metadata"]["ownerReferences"] if o.get("controller"))
    check(owner["kind"] == "Job" and owner["name"] == "train", f"the replacement's owner is {owner}")
    N.wait_phase("restore", ns, ck, timeout=180)
    check(kjson("get", "checkpoint", "-n", ns, ck)["metadata"]["labels"].get("gpucr.dev/restored-into") == new[:63],
          "the Checkpoint is not consumed by the Job's new pod")
    restored_ok(ns, new, nbytes)
    wait_until("a RestoredFromEviction Event", lambda: events(ns, new, "RestoredFromEviction"), 30)
    log(f"Job: {new} (after {old}) restored from {ck}, RESULT ok")
    kubectl("delete", "namespace", ns, "--wait=false")


def case_drain_restored():
    """The whole route, nothing made by hand: a Deployment's pod opted in (the label, gcr-hold as its
    preStop hook, the scheduling gate) holding GPU data; `kubectl drain` of the node. The agent images
    it within its grace period (the eviction Checkpoint Succeeded while the program still ran); the
    ReplicaSet's replacement is pointed at the image but stays Pending while the node is cordoned;
    `kubectl uncordon` (the maintenance over) is the test's only act after the drain: the replacement
    is restored by itself and passes the program's own bit-exact check. Events on both pods, the
    Checkpoint consumed."""
    ns, app = "team-drain", "drainweb"
    N.namespace(ns)
    spec = E.pod_spec(60)  # gcr-hold as preStop; the grace period holds the 15 s estimate
    spec["schedulingGates"] = [{"name": GATE}]
    spec["containers"][0]["imagePullPolicy"] = "IfNotPresent"  # the replacement pulls from the registry
    apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app, "namespace": ns},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                    "template": {"metadata": {"labels": {"app": app, "gpucr.dev/evict": "image"}}, "spec": spec}}})
    p = wait_until("the first pod running", lambda: (p := one_pod(ns, app)) and
                   p["status"].get("phase") == "Running" and p, 120)
    old, uid = p["metadata"]["name"], p["metadata"]["uid"]
    nbytes = int(ready_line(ns, old)["bytes"])
    ck = E.ck_name(old, uid)
    w = E.Watch(N.host_pid(ns, old), ns, ck)
    t0 = time.time()
    d = E.drain(f"app={app}")
    try:
        out, _ = d.communicate(timeout=200)
        check(d.returncode == 0, f"kubectl drain failed: {out[-1500:]}")
        wait_until("the drained program's process gone", lambda: w.gone, 60)
        w.stop = True
        written = E.imaged_before_end(ns, old, w.gone)
        c = kjson("get", "checkpoint", "-n", ns, ck)
        check(c.get("status", {}).get("phase") == "Succeeded", f"Checkpoint {ck}: {c.get('status')}")
        check(c["metadata"].get("annotations", {}).get("gpucr.dev/evict-cause") == "EvictionByEvictionAPI",
              f"Checkpoint {ck}: {c['metadata']}")
        # Cordoned: the replacement is pointed at the image (gate gone) and the scheduler leaves it Pending.
        new = wait_until("the replacement pointed at the image", lambda: (q := one_pod(ns, app, but=(old,))) and
                         not q["spec"].get("schedulingGates") and q, 120)["metadata"]["name"]
        q = wait_until("the replacement Unschedulable", lambda: (q := kjson("get", "pod", "-n", ns, new)) and any(
            x.get("type") == "PodScheduled" and x.get("reason") == "Unschedulable"
            for x in q["status"].get("conditions", [])) and q, 60)
        image = q["spec"]["containers"][0]["image"]
        check(image.startswith(f"127.0.0.1:{PORT}/gcr-evict/{ns}/{ck}:"), f"the replacement's image is {image}")
        check(q["metadata"].get("annotations", {}).get("gpucr.dev/restore-from") == ck, f"annotations {q['metadata']}")
        check(not q["spec"].get("nodeName") and q["status"].get("phase") == "Pending",
              f"the replacement runs on a cordoned node: {q['status']}")
        check(kjson("get", "checkpoint", "-n", ns, ck)["metadata"]["labels"].get("gpucr.dev/restored-into") == new[:63],
              "the Checkpoint is not consumed by the replacement")
    finally:
        t_uncordon = time.time()
        E.uncordon()
    N.wait_phase("restore", ns, ck, timeout=180)
    t_restored = time.time()
    rs = kjson("get", "restore", "-n", ns, ck)
    check(rs["spec"].get("podName") == new, f"Restore spec {rs['spec']}")
    restored_ok(ns, new, nbytes)
    check(ck in written.get("note", ""), f"event {written}")
    back = wait_until("RestoredFromEviction on the replacement", lambda: E.event(ns, new, "RestoredFromEviction"), 30)
    check(back["type"] == "Normal" and ck in back.get("note", ""), f"event {back}")
    wait_until("the token withdrawn", lambda: "gpucr.dev/restore-token" not in
               kjson("get", "checkpoint", "-n", ns, ck)["metadata"].get("annotations", {}), 30)
    log(f"drain -> restored: {old} drained, Checkpoint {ck} seen Succeeded {E.rel(w.succeeded, t0)} after the drain "
        f"began (its image's Event at {written['eventTime']}, its program ended at {w.gone - t0:.1f} s); {new} restored {t_restored - t_uncordon:.1f} s after the "
        f"uncordon (Restore durations {rs['status'].get('durations')}), RESULT ok")
    for args in (["get", "pods", "-n", ns, "-o", "wide"],
                 ["get", "checkpoints,restores", "-n", ns, "-L", "gpucr.dev/restored-into"],
                 ["get", "events", "-n", ns, "--field-selector", f"involvedObject.name={old}"],
                 ["get", "events", "-n", ns, "--field-selector", f"involvedObject.name={new}"]):
        print(f"$ kubectl {' '.join(args)}\n{kubectl(*args).stdout}", flush=True)
    kubectl("delete", "namespace", ns, "--wait=false")


def phase(kind, ns, name):
    return kjson("get", kind, "-n", ns, name).get("status", {}).get("phase") or "(none)"


def case_corrupt_image():
    """One byte of the image's GPU data flipped before the replacement: the Restore is Failed with the
    file named, a Warning Event on the pod, its restored container ended and the pod deleted (nothing
    half-running); the owner's next pod starts cold."""
    ns = "team-replace2"
    N.namespace(ns)
    old, ck, new, t0, _, flipped = evict_and_replace(ns, "bad", corrupt=True)
    N.wait_phase("restore", ns, ck, ("Failed",), timeout=180)
    msg = kjson("get", "restore", "-n", ns, ck)["status"].get("message", "")
    check("image refused" in msg and flipped in msg, f"Restore message: {msg}")
    ev = wait_until("a NotRestoredFromEviction Warning", lambda: events(ns, new, "NotRestoredFromEviction"), 60)
    check(ev[0]["type"] == "Warning" and "image refused" in ev[0].get("note", ""), f"event {ev[0]}")
    cid = None
    try:
        st = kjson("get", "pod", "-n", ns, new)["status"].get("containerStatuses", [{}])[0]
        cid = (st.get("containerID") or "").split("//")[-1] or None
    except AssertionError:
        pass  # already gone
    wait_until("the failed replacement gone", lambda: new not in
               [x["metadata"]["name"] for x in kjson("get", "pods", "-n", ns)["items"]], 90)
    if cid:
        check(not [q for q in os.listdir("/proc") if q.isdigit() and N._in_cgroup(q, cid)],
              "processes of the failed replacement's container still run")
    nxt = wait_until("the owner's next pod running", lambda: (p := one_pod(ns, "bad", but=(old, new))) and
                     p["status"].get("phase") == "Running" and p, 120)
    check(nxt["spec"]["containers"][0]["image"] == N.WORKLOAD_IMAGE, "the next pod is not a cold start")
    fresh = kubectl("logs", "-n", ns, nxt["metadata"]["name"]).stdout
    wait_until("the cold pod's READY", lambda: "READY " in kubectl("logs", "-n", ns, nxt["metadata"]["name"]).stdout, 120)
    log(f"corrupt image: Restore Failed ({msg}); Warning on {new}; it was deleted; {nxt['metadata']['name']} "
        f"started cold ({len(fresh)} bytes of log)")
    kubectl("delete", "namespace", ns, "--wait=false")


CASES = [case_install, case_registry_refuses, case_no_image_cold, case_failed_image_cold, case_replacement_restored,
         case_checkpoint_in_progress, case_statefulset, case_job, case_drain_restored, case_corrupt_image,
         case_user_reference]

if __name__ == "__main__":
    only = os.environ.get("GCR_REPLACE_E2E_CASES")  # a comma list of names: those cases only, after the install
    if only:
        CASES = [case_install] + [c for c in CASES[1:] if c.__name__ in only.split(",")]
    sys.exit(N.main(CASES))
