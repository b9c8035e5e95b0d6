#!/usr/bin/env python3
"""Two real nodes and images on storage both share: tier k8s-twonode.

    python3 tests/k8s/test_twonode_e2e.py [BUILD_DIR]

The real-node test bed of test_node_e2e.py with GCR_TESTBED_NODES=2: gcr-node and gcr-node-2,
each with its own containerd, kubelet and kube-proxy (the second in network and mount namespaces
of its own, tests/k8s/node/README.md), one directory /var/lib/gcr/images seen by both (the
chart's images.hostPath, as an NFS share would be). The chart with its defaults plus
images.kubelet and images.shared. Cases: the agent on both nodes, a suspend and resume of a pod on
gcr-node-2 by its agent; a pod imaged on gcr-node, deleted, and a new pod on gcr-node-2 restored
from that image (docs/images.md, "Shared storage"); the same with images.shared off: Failed
ImageElsewhere, nothing run; the images on a ReadWriteMany claim (images.claim) with the node
registry on: a new pod on gcr-node-2 names the Checkpoint's status.image.reference and is
restored there. GCR_TWONODE_SHARED=false installs the chart with images.shared off
from the start (the positive case must then fail). GCR_TWONODE_E2E_CASES: a comma list of case
names to run (after the install). Ends with "N passed, N failed".
"""
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_node_e2e as N  # noqa: E402
import test_evict_e2e as E  # noqa: E402
import test_replace_e2e as R  # noqa: E402

check, kubectl, kjson, apply, wait_until, log = N.check, N.kubectl, N.kjson, N.apply, N.wait_until, N.log
SHARED = os.environ.get("GCR_TWONODE_SHARED", "true")


def node1():
    return N.ENV["GCR_TESTBED_NODE"]


def node2():
    return N.ENV["GCR_TESTBED_NODE2"]


def node2_dir():
    return os.path.join(N.ENV["GCR_TESTBED_DIR"], "node2")


def agents_ready():
    """The DaemonSet's agents, one Ready on each node: {node: pod}, or None."""
    pods = [p for p in N.agent_pod() if not p["metadata"].get("deletionTimestamp")]
    ready = {p["spec"].get("nodeName"): p for p in pods
             if {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}.get("Ready") == "True"}
    return ready if len(pods) == 2 and set(ready) == {node1(), node2()} else None


def helm(verb, shared, extra=()):
    """helm install/upgrade: the chart's defaults plus images.kubelet, images.shared and extra
    --set values; waits for an agent Ready on both nodes with imagesShared shared in its config."""
    port = open(os.path.join(N.ENV["GCR_TESTBED_DIR"], "kubelet.port")).read().strip()
    N.run([os.path.join(N.ENV["GCR_TESTBED_BIN"], "helm"), verb, N.RELEASE, N.CHART, "-n", N.SYSTEM_NS,
           *(["--create-namespace"] if verb == "install" else []),
           "--set", f"image.repository={N.IMAGE_REPO}", "--set", f"image.tag={N.IMAGE_TAG}",
           "--set", "images.kubelet.enabled=true", "--set", f"images.kubelet.port={port}",
           "--set", f"images.shared={shared}", *extra, "--wait", "--timeout", "180s"], timeout=200)
    cm = [c for c in kjson("get", "configmaps", "-n", N.SYSTEM_NS)["items"] if "config.yaml" in c.get("data", {})]
    check(len(cm) == 1 and f'imagesShared: "{shared}"' in cm[0]["data"]["config.yaml"],
          f"the agent's config does not say imagesShared {shared}")
    # The agents restarted with the new config (the DaemonSet rolls them on a config change).
    gen = kjson("get", "daemonsets", "-n", N.SYSTEM_NS)["items"][0]["metadata"]["generation"]
    wait_until("the DaemonSet rolled out on both nodes", lambda: (lambda st: st.get("observedGeneration") == gen and
               st.get("updatedNumberScheduled") == 2 == st.get("numberReady") == st.get("desiredNumberScheduled"))(
        kjson("get", "daemonsets", "-n", N.SYSTEM_NS)["items"][0]["status"]), 180)
    agents = wait_until("an agent Ready on both nodes", agents_ready, 120)
    # Each node's heartbeat Lease (the scaler creates it, the node's agent holds it): until then
    # an agent takes its node's pods as agent-less and fails their Checkpoints.
    for n in (node1(), node2()):
        wait_until(f"Lease gcr-agent-{n} held by {n}", lambda: kjson("get", "lease", "-n", N.SYSTEM_NS,
                   f"gcr-agent-{n}")["spec"].get("holderIdentity") == n, 60)
    # And its shim slots back on the node: a restarted device plugin's slots count only once its
    # kubelet reports them again (until then a pod asking for one can only go to the other node).
    for n in (node1(), node2()):
        wait_until(f"gpucr.dev/shim allocatable on {n}", lambda: int(kjson("get", "node", n)["status"].get(
                   "allocatable", {}).get("gpucr.dev/shim", "0")) > 0, 60)
    return agents


def case_install():
    """Both nodes Ready; the chart's DaemonSet has an agent Ready on each; each node advertises
    gpucr.dev/shim (its own device plugin registered with its own kubelet)."""
    nodes = {n["metadata"]["name"]: {c["type"]: c["status"] for c in n["status"]["conditions"]}.get("Ready")
             for n in kjson("get", "nodes")["items"]}
    check(nodes == {node1(): "True", node2(): "True"}, f"nodes: {nodes}")
    agents = helm("install", SHARED)
    for n in (node1(), node2()):
        alloc = wait_until(f"gpucr.dev/shim on {n}", lambda: kjson("get", "node", n)["status"]
                           .get("allocatable", {}).get("gpucr.dev/shim"), 60)
        check(int(alloc) > 0, f"{n} advertises gpucr.dev/shim={alloc}")
    log(f"chart installed (images.kubelet, images.shared={SHARED}): agents "
        f"{sorted((n, p['metadata']['name']) for n, p in agents.items())}")


def case_suspend_resume_on_node2():
    """A GPU pod on gcr-node-2 gets its shim from that node's device plugin; a Checkpoint (suspend)
    and a Restore of it are done by gcr-node-2's agent, and the program's own check is bit-exact."""
    ns = "two-a"
    N.namespace(ns)
    try:
        pid, nbytes = N.workload_pod(ns, "cr", 1000, node=node2())
        pod = kjson("get", "pod", "-n", ns, "cr")
        check(pod["spec"].get("nodeName") == node2(), f"the pod runs on {pod['spec'].get('nodeName')}")
        check(pod["status"].get("podIP", "").startswith("10.88.1."), f"pod IP {pod['status'].get('podIP')} not node 2's")
        check("LD_PRELOAD=/opt/gcr/lib/libgcr.so" in kubectl("exec", "-n", ns, "cr", "--", "env").stdout,
              "no LD_PRELOAD from gcr-node-2's device plugin")
        apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Checkpoint", "metadata": {"name": "cr", "namespace": ns},
               "spec": {"podName": "cr"}})
        N.wait_phase("checkpoint", ns, "cr")
        s = kjson("get", "checkpoint", "-n", ns, "cr")["status"]
        check(s.get("nodeName") == node2(), f"Checkpoint done by {s.get('nodeName')}")
        check(N.smi(ns, "cr", "mem", pid) == "0", "the stand-in GPU still holds memory of the suspended program")
        apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Restore", "metadata": {"name": "cr", "namespace": ns},
               "spec": {"checkpointName": "cr"}})
        N.wait_phase("restore", ns, "cr")
        r = kjson("get", "restore", "-n", ns, "cr")["status"]
        check(r.get("nodeName") == node2(), f"Restore done by {r.get('nodeName')}")
        check(int(N.smi(ns, "cr", "mem", pid)) >= nbytes, "the memory did not come back")
        N.finish(ns, "cr")
        log(f"suspend and resume on {node2()} by its agent: {s.get('durations')} / {r.get('durations')}")
    finally:
        end_pod(ns, "cr")


def end_pod(ns, pod):
    """Deletes a case's pod (if any) and waits for it, also when the case failed: its program's
    lock on a slot of its node's stand-in GPU pool goes with it. A process restored from the other node keeps the slot it had there
    (CRIU restores the lock), which must then be free here (tests/k8s/node/README.md)."""
    kubectl("delete", "pod", "-n", ns, pod, "--ignore-not-found", "--wait=true", timeout=90)


def restore_elsewhere(ns):
    """A pod on gcr-node imaged (action Image, cpuCheckpoint Kubelet) and deleted; the checkpoint
    image imported into gcr-node-2's containerd; a new pod there from it and a Restore naming it.
    Returns (image dir, bytes)."""
    N.namespace(ns)
    img, ref, nbytes = N.image_for_new_pod(ns, "src", "snap", node=node1(), import_dir=node2_dir())
    ck = kjson("get", "checkpoint", "-n", ns, "snap")["status"]
    check(ck.get("nodeName") == node1(), f"the image was written by {ck.get('nodeName')}")
    N.restored_pod(ns, "dst", ref, node=node2())
    apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Restore", "metadata": {"name": "back", "namespace": ns},
           "spec": {"checkpointName": "snap", "podName": "dst"}})
    return img, nbytes


def case_restore_on_other_node():
    """Shared images: the image written by gcr-node's agent restores into a new pod on gcr-node-2,
    by gcr-node-2's agent: Succeeded, Restored Event, the program goes on from where it was
    (its log from before the checkpoint) and its own bit-exact check says RESULT ok."""
    ns = "two-restore"
    t0 = time.monotonic()
    try:
        img, nbytes = restore_elsewhere(ns)
        N.wait_phase("restore", ns, "back", timeout=120)
        r = kjson("get", "restore", "-n", ns, "back")["status"]
        check(r.get("nodeName") == node2(), f"Restore done by {r.get('nodeName')}")
        # Signed (shared storage): copied with each file's SHA-256 checked, never handed over.
        check("copied into the pod, each file's SHA-256 checked" in r.get("message", ""), f"message: {r.get('message')}")
        check(kjson("get", "pod", "-n", ns, "dst")["spec"].get("nodeName") == node2(), "the new pod is not on gcr-node-2")
        wait_until("a Restored Event", lambda: any(e.get("reason") == "Restored" for e in N.events_for(ns, "back")), 30)
        N.restored_program(ns, "dst", nbytes)
        N.finish(ns, "dst")
        check(os.path.isdir(img), f"the image {img} is gone after the restore")
        log(f"image of {node1()} restored on {node2()}: {r.get('message')}; durations {r.get('durations')}; "
            f"{time.monotonic() - t0:.1f} s from the source pod to RESULT ok")
    finally:
        end_pod(ns, "dst")


def case_shared_off_refused():
    """images.shared off (the chart's default): the same Restore is Failed ImageElsewhere with a
    Warning Event and nothing run: the restored process stays held at its shim's gate, without
    its GPU data (the stand-in GPU holds none of it), the image untouched."""
    if SHARED != "false":
        helm("upgrade", "false")
    ns = "two-refused"
    try:
        img, _ = restore_elsewhere(ns)
        N.wait_phase("restore", ns, "back", ("Failed",), timeout=120)
        r = kjson("get", "restore", "-n", ns, "back")["status"]
        msg = r.get("message", "")
        reason = (r.get("conditions") or [{}])[0].get("reason")
        check(reason == "ImageElsewhere" and r.get("nodeName") == node2(),
              f"Restore failed with {reason} on {r.get('nodeName')}: {msg}")
        check(f"on node {node1()}, the pod on {node2()}" in msg and "nothing was done" in msg, f"message: {msg}")
        wait_until("an ImageElsewhere Warning", lambda: any(e.get("reason") == "ImageElsewhere" and
                                                           e.get("type") == "Warning" for e in N.events_for(ns, "back")), 30)
        # The refusal comes before the runtime's restore ends: wait for the restored container.
        wait_until("the restored container running", lambda: kjson("get", "pod", "-n", ns, "dst")["status"]
                   .get("containerStatuses", [{}])[0].get("state", {}).get("running"), 90)
        logs = kubectl("logs", "-n", ns, "dst").stdout
        pid = int(logs.split("READY pid=")[1].split()[0])
        check(N.smi(ns, "dst", "mem", pid) == "0", "the refused pod's process got GPU memory")
        check("DONE" not in logs.split("\n") and "RESULT" not in logs, f"the refused pod's program ran on: {logs[-300:]}")
        check(sorted(os.listdir(img)) == ["criu", "gpu", "manifest.json"], f"the image changed: {os.listdir(img)}")
        log(f"images.shared off: Restore Failed: {msg}")
    finally:
        end_pod(ns, "dst")


CLAIM_DIR = "/var/lib/gcr-claim"  # the PersistentVolume's directory, seen by both nodes like an NFS export


def case_claim_and_reference():
    """images.claim (a ReadWriteMany claim as every agent's images directory, shared implied) with
    the node registry on (eviction.restore): a pod on gcr-node imaged, its Checkpoint publishes
    status.image.reference; the image lies on the claim's volume; a new pod on gcr-node-2 that
    names the reference is pulled from gcr-node-2's own agent and restored there, RESULT ok."""
    ns = "two-claim"
    shutil.rmtree(CLAIM_DIR, ignore_errors=True)  # an earlier run's images
    os.makedirs(CLAIM_DIR)
    apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "gcr-images-pv"},
           "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                    "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": CLAIM_DIR, "type": "Directory"},
                    "claimRef": {"namespace": N.SYSTEM_NS, "name": "gcr-images"}}})
    apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "gcr-images", "namespace": N.SYSTEM_NS},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": "gcr-images-pv",
                    "resources": {"requests": {"storage": "1Gi"}}}})
    helm("upgrade", "true", ["--set", "images.shared=false", "--set", "images.claim=gcr-images",
                             "--set", "eviction.restore.enabled=true"])
    N.namespace(ns)
    try:
        _, nbytes = N.workload_pod(ns, "src", 0, node=node1())
        apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Checkpoint", "metadata": {"name": "snap", "namespace": ns},
               "spec": {"podName": "src", "action": "Image", "cpuCheckpoint": "Kubelet"}})
        N.wait_phase("checkpoint", ns, "snap", timeout=180)
        st = kjson("get", "checkpoint", "-n", ns, "snap")["status"]
        ref = st.get("image", {}).get("reference", "")
        check(st.get("nodeName") == node1() and ref.startswith(f"127.0.0.1:5055/gcr-evict/{ns}/snap:"),
              f"Checkpoint on {st.get('nodeName')}, image {st.get('image')}")
        on_claim = os.path.join(CLAIM_DIR, ns, "src", "snap")
        check(sorted(os.listdir(on_claim)) == ["criu", "gpu", "manifest.json"], f"not on the claim: {on_claim}")
        check(not os.path.exists(os.path.join("/var/lib/gcr/images", ns)), "the image went to the hostPath, not the claim")
        end_pod(ns, "src")
        N.restored_pod(ns, "dst", ref, pull="IfNotPresent", node=node2())
        apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Restore", "metadata": {"name": "back", "namespace": ns},
               "spec": {"checkpointName": "snap", "podName": "dst"}})
        N.wait_phase("restore", ns, "back", timeout=120)
        r = kjson("get", "restore", "-n", ns, "back")["status"]
        check(r.get("nodeName") == node2(), f"Restore done by {r.get('nodeName')}")
        pulled = [e for e in N.events_for(ns, "dst") if e.get("reason") == "Pulled"]
        check(pulled and ref in pulled[0].get("note", pulled[0].get("message", "")), f"Pulled events: {pulled}")
        N.restored_program(ns, "dst", nbytes)
        N.finish(ns, "dst")
        log(f"claim: image of {node1()} on the claim, pulled by {node2()} from its own agent ({ref.split(':')[0]}:"
            f"5055), restored: {r.get('durations')}")
    finally:
        end_pod(ns, "dst")
        shutil.rmtree(CLAIM_DIR, ignore_errors=True)


def case_drain_to_other_node():
    """Eviction without loss across nodes (docs/preemption.md): images.shared, eviction and
    eviction.restore on. A Deployment's pod opted in (the label, gcr-hold as preStop, the
    scheduling gate), preferring gcr-node; `kubectl drain gcr-node`: the agent images it within its
    grace period, the replacement is pointed at the image without a nodeSelector, scheduled on
    gcr-node-2 (gcr-node is cordoned), pulled from gcr-node-2's own registry and restored there by
    itself, RESULT ok. Nothing is done by the test after the drain."""
    helm("upgrade", SHARED, ["--set", "eviction.enabled=true", "--set", "eviction.restore.enabled=true"])
    ns, app = "two-drain", "drainweb"
    N.namespace(ns)
    spec = E.pod_spec(60)
    spec["schedulingGates"] = [{"name": R.GATE}]
    spec["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    spec["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "preference": {"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node1()]}]}}]}}
    apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app, "namespace": ns},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                    "template": {"metadata": {"labels": {"app": app, "gpucr.dev/evict": "image"}}, "spec": spec}}})
    try:
        p = wait_until("the first pod running", lambda: (p := R.one_pod(ns, app)) and
                       p["status"].get("phase") == "Running" and p, 120)
        old, uid = p["metadata"]["name"], p["metadata"]["uid"]
        check(p["spec"].get("nodeName") == node1(), f"the first pod runs on {p['spec'].get('nodeName')}")
        nbytes = int(R.ready_line(ns, old)["bytes"])
        ck = E.ck_name(old, uid)
        t0 = time.time()
        d = E.drain(f"app={app}")
        out, _ = d.communicate(timeout=200)
        check(d.returncode == 0, f"kubectl drain failed: {out[-1500:]}")
        c = kjson("get", "checkpoint", "-n", ns, ck)
        check(c.get("status", {}).get("phase") == "Succeeded" and c["status"].get("nodeName") == node1(),
              f"Checkpoint {ck}: {c.get('status')}")
        N.wait_phase("restore", ns, ck, timeout=180)
        t_restored = time.time()
        rs = kjson("get", "restore", "-n", ns, ck)
        new = rs["spec"].get("podName")
        q = kjson("get", "pod", "-n", ns, new)
        check(q["spec"].get("nodeName") == node2() and not q["spec"].get("nodeSelector"),
              f"the replacement runs on {q['spec'].get('nodeName')}, nodeSelector {q['spec'].get('nodeSelector')}")
        check(rs["status"].get("nodeName") == node2(), f"Restore done by {rs['status'].get('nodeName')}")
        R.restored_ok(ns, new, nbytes)
        back = wait_until("RestoredFromEviction on the replacement", lambda: E.event(ns, new, "RestoredFromEviction"), 30)
        check(ck in back.get("note", ""), f"event {back}")
        log(f"drain of {node1()}: {old} imaged, {new} restored on {node2()} {t_restored - t0:.1f} s after the drain "
            f"began (Restore durations {rs['status'].get('durations')}), RESULT ok")
        print(f"$ kubectl get pods -n {ns} -o wide\n{kubectl('get', 'pods', '-n', ns, '-o', 'wide').stdout}", flush=True)
    finally:
        E.uncordon()
        kubectl("delete", "deployment", "-n", ns, app, "--ignore-not-found", "--wait=true", timeout=90)
        for pod in [x["metadata"]["name"] for x in R.live_pods(ns, app)]:
            end_pod(ns, pod)


CASES = [case_install, case_suspend_resume_on_node2, case_restore_on_other_node, case_shared_off_refused,
         case_claim_and_reference, case_drain_to_other_node]

if __name__ == "__main__":
    only = os.environ.get("GCR_TWONODE_E2E_CASES")  # a comma list of names: those cases only, after the install
    if only:
        CASES = [case_install] + [c for c in CASES[1:] if c.__name__ in only.split(",")]
    sys.exit(N.main(CASES, nodes=2))
