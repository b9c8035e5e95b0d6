"""Crash and wait gaps, stranding, silent loss, named containers (issue 33 items 4, 6, 7; issue 32's
"a test kills the agent mid-Image on the real node, both routes").

Every case is what a tenant (or a crash at the wrong moment) does on the shared node:
  kill_mid_image_kubelet, kill_mid_image_criu: the agent SIGKILLed at each step of an Image
      (docs/images.md, "Pods"); the next agent finishes it from its record: the process running
      with its memory (never left held), the image whole or Failed Interrupted, nothing left
      behind (the pod's copy, the partial image, the kubelet's archive);
  stopped_processes: four pods stop their own process (SIGSTOP) and ask for Checkpoints: each fails
      at once naming the state, an honest pod's Checkpoint is not held up behind them;
  forged_phase: a final phase written while the agent is down is marked (SetByAgent False);
  partial_name: an Image named *.partial.* is refused, so no image retention never removes appears;
  sidecar_first: a Restore into a new pod whose sidecar sorts first restores the container the
      image was taken from, by name, and never touches the sidecar; a pod without it is refused;
  alloc_leftovers: what a pod writes into its image directory (.alloc/<id>) does not stay.

The kill cases stop the agent at a chosen step through GCR_AGENT_TEST_PAUSE=file:PAUSE (the point
named in a root-only file of the node, read at each point), SIGKILL its process and delete its pod
(so no restart back-off builds up). Images need uid-0 pods here (root lacks CAP_SYS_RESOURCE, which
CRIU needs for other uids; docs/images.md).
"""
import json
import os
import signal
import time

PAUSE = "/run/gcr/records/test-pause"
IMAGES = "/var/lib/gcr/images"
CHECKPOINTS = "/var/lib/kubelet/checkpoints"
GROUP = "gpucr.dev/v1alpha1"

HELM_SET = {
    "agent.extraEnv[0].name": "GCR_AGENT_TEST_PAUSE",
    "agent.extraEnv[0].value": "file:" + PAUSE,
}
# The agent's own CRIU on pods, for the cases that need it only: with it, each container's image
# directory is mounted at a path of its own allocation, which a container restored into a new pod
# (another allocation) does not find, so restores into new pods (other modules') need it off.
PODS = {"images.pods.enabled": "true", "images.pods.capabilities": "{SYS_ADMIN,SYS_CHROOT,NET_ADMIN}"}


# ---- helpers ----

def diagnose(ctx, what, ns=None, pod=None, pids=()):
    """On the way out of a failed step: what the agent, the runtime and the pod say."""
    try:
        lines = ctx.agent_log()
        keys = [str(p) for p in pids] + ([pod] if pod else [])
        ctx.log(f"{what}: agent lines:\n  " + "\n  ".join(
            [l for l in lines if any(k in l for k in keys)][-25:] if keys else lines[-25:]))
        if ns and pod:
            st = ctx.kjson("get", "pod", "-n", ns, pod).get("status", {})
            ctx.log(f"{what}: pod {ns}/{pod} status: {json.dumps(st.get('containerStatuses'))[:2500]}")
        for p in [x for x in pids if isinstance(x, int)]:
            try:
                ctx.log(f"{what}: /proc/{p}/stat: {open(f'/proc/{p}/stat').read()[:200]}")
            except OSError as e:
                ctx.log(f"{what}: /proc/{p}/stat: {e}")
        state = os.path.join(ctx.N.ENV["GCR_TESTBED_DIR"], "containerd", "state", "io.containerd.runtime.v2.task",
                             "k8s.io")
        for d in (os.listdir(state) if os.path.isdir(state) else []):
            for f in ("criu-dump.log", "dump.log"):
                lp = os.path.join(state, d, f)
                if os.path.exists(lp):
                    txt = open(lp, errors="replace").read().splitlines()
                    keep = [l for l in txt if "rror" in l or "Warn" in l][-20:] + txt[-15:]
                    ctx.log(f"{what}: {lp}:\n  " + "\n  ".join(l[:300] for l in keep))
        clog = os.path.join(ctx.N.ENV["GCR_TESTBED_DIR"], "containerd.log")
        if os.path.exists(clog):
            tail = open(clog, errors="replace").read().splitlines()[-40:]
            ctx.log(f"{what}: containerd.log tail:\n  " + "\n  ".join(l[:400] for l in tail))
    except Exception as e:  # noqa: BLE001 (diagnostics only)
        ctx.log(f"{what}: diagnostics failed: {e}")

def pause_at(point, seconds=180):
    with open(PAUSE + ".tmp", "w") as f:
        f.write(f"{point} {seconds}\n")
    os.rename(PAUSE + ".tmp", PAUSE)


def pause_off():
    try:
        os.unlink(PAUSE)
    except FileNotFoundError:
        pass


def agent_host_pid(ctx, pod):
    """The host pid of gcr-agent in the agent pod (its cgroup names the pod's uid)."""
    uid = pod["metadata"]["uid"]
    marks = (uid, uid.replace("-", "_"))
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            comm = open(f"/proc/{d}/comm").read().strip()
            cg = open(f"/proc/{d}/cgroup").read()
        except OSError:
            continue
        if comm == "gcr-agent" and any(m in cg for m in marks):
            return int(d)
    raise AssertionError(f"no gcr-agent process of pod {pod['metadata']['name']}")


def kill_agent(ctx, pod):
    """SIGKILL (no goodbye: its operation in flight is cut short where it stands), then the pod
    deleted at once, so the DaemonSet's next agent starts without a restart back-off. The next
    agent, Ready."""
    pid = agent_host_pid(ctx, pod)
    os.kill(pid, signal.SIGKILL)
    pause_off()  # the next agent must not pause
    ctx.log(f"agent pid {pid} SIGKILLed")
    ctx.kubectl("delete", "pod", "-n", ctx.N.SYSTEM_NS, pod["metadata"]["name"], "--grace-period=0", "--force",
                "--wait=false", check=False)
    return ctx.wait_until("the next agent Ready", lambda: (p := ctx.N.agent_ready()) and
                          p["metadata"]["uid"] != pod["metadata"]["uid"] and p, 180)


def wait_paused(ctx, agent, point, timeout=120):
    ctx.wait_until(f"the agent paused at {point}", lambda: any(
        "test hook: pausing" in line and line.rstrip().endswith(point) for line in ctx.agent_log(agent)), timeout)


def checkpoint(ctx, ns, name, pod, **spec):
    ctx.apply({"apiVersion": GROUP, "kind": "Checkpoint", "metadata": {"name": name, "namespace": ns},
               "spec": dict({"podName": pod}, **spec)})


def status(ctx, kind, ns, name):
    return ctx.kjson("get", kind, "-n", ns, name).get("status", {})


def final(ctx, kind, ns, name, timeout=180):
    return ctx.wait_until(f"{kind} {ns}/{name} final", lambda: (s := status(ctx, kind, ns, name)).get("phase") in
                          ("Succeeded", "Failed") and s, timeout)


def pod_env(ctx, ns, pod, var):
    return next((l.split("=", 1)[1] for l in ctx.kubectl("exec", "-n", ns, pod, "--", "env").stdout.splitlines()
                 if l.startswith(var + "=")), None)


def running_with_memory(ctx, ns, pod, pid, nbytes, what):
    N = ctx.N
    st = N.smi(ns, pod, "state", pid)
    ctx.check(st == "running", f"{what}: the process's driver state is {st}, not running (left held)")
    mem = int(N.smi(ns, pod, "mem", pid))
    ctx.check(mem >= nbytes, f"{what}: the process holds {mem} bytes on the GPU, not its {nbytes}")
    shim = N.shim_status(ns, pod, pid)
    ctx.check(shim.get("state") == "running", f"{what}: its shim is {shim.get('state')}")


def no_leftovers(ctx, ns, pod, ck_uid, what):
    """Nothing of the Image but the image itself: the pod's copy (image-<uid> in its socket dir),
    the CRIU route's work and partial (<uid>* in its image directory), partial images of the pod,
    the kubelet's archives of its container."""
    sock = pod_env(ctx, ns, pod, "GCR_SOCKET_DIR") or "/run/gcr"
    ls = ctx.kubectl("exec", "-n", ns, pod, "--", "ls", "-a", sock).stdout.split()
    ctx.check(f"image-{ck_uid}" not in ls, f"{what}: the pod's copy image-{ck_uid} is left in {sock}: {ls}")
    idir = pod_env(ctx, ns, pod, "GCR_IMAGE_DIR")
    if idir:
        left = [n for n in os.listdir(idir) if n.startswith(ck_uid)]
        ctx.check(not left, f"{what}: left in the pod's image directory {idir}: {left}")
    pdir = os.path.join(IMAGES, ns, pod)
    parts = [n for n in (os.listdir(pdir) if os.path.isdir(pdir) else []) if ".partial." in n]
    ctx.check(not parts, f"{what}: partial images left in {pdir}: {parts}")
    arch = [n for n in (os.listdir(CHECKPOINTS) if os.path.isdir(CHECKPOINTS) else [])
            if n.startswith(f"checkpoint-{pod}_{ns}-")]
    ctx.check(not arch, f"{what}: the kubelet's archives left in {CHECKPOINTS}: {arch}")


def kill_at_each_step(ctx, ns, pod, steps, kubelet):
    """One Checkpoint (action Image) per step, the agent killed there; the next agent's outcome."""
    N = ctx.N
    pid, nbytes = N.workload_pod(ns, pod, 0)
    N.ctl(ns, pod, "go")  # the program runs its iterations, then waits: data of its own on the GPU
    ctx.wait_until(f"{pod} DONE", lambda: "DONE" in ctx.kubectl("logs", "-n", ns, pod).stdout.split("\n"), 60)
    spec = {"action": "Image"}
    if kubelet:
        spec["cpuCheckpoint"] = "Kubelet"
    outcomes = []
    try:
        for point, want in steps:
            name = f"{'kub' if kubelet else 'criu'}-{point}"
            agent = ctx.agent()
            pause_at(f"image-{point}")
            checkpoint(ctx, ns, name, pod, **spec)
            uid = ctx.kjson("get", "checkpoint", "-n", ns, name)["metadata"]["uid"]
            wait_paused(ctx, agent, f"image-{point}")
            t0 = time.monotonic()
            kill_agent(ctx, agent)
            s = final(ctx, "checkpoint", ns, name)
            took = time.monotonic() - t0
            reason = (s.get("conditions") or [{}])[0].get("reason")
            outcomes.append(f"{point}: {s['phase']} {reason} ({took:.1f} s after the kill)")
            ctx.log(f"killed at image-{point}: {s['phase']} ({reason}) {s.get('message', '')[:300]}")
            if s["phase"] != want[0] or reason != want[1]:
                diagnose(ctx, f"killed at image-{point}", ns, pod, [pid, name])
            ctx.check(s["phase"] == want[0] and reason == want[1],
                      f"killed at image-{point}: {s['phase']} {reason}, want {want}: {s.get('message')}")
            running_with_memory(ctx, ns, pod, pid, nbytes, f"killed at image-{point}")
            img = os.path.join(IMAGES, ns, pod, name)
            if want[0] == "Succeeded":
                ctx.check(os.path.isfile(os.path.join(img, "manifest.json")), f"{point}: no whole image at {img}")
                man = json.load(open(os.path.join(img, "manifest.json")))
                ctx.check(man.get("container") == "main", f"{point}: the manifest names container "
                          f"{man.get('container')}")
            else:
                ctx.check(not os.path.exists(img), f"{point}: an image at {img} after Failed")
            # The sweep runs every 10 s; what the recovery itself removes is gone at once.
            ctx.wait_until(f"no leftovers after image-{point}", lambda: no_leftovers(ctx, ns, pod, uid, point)
                           is None, 30)
    finally:
        pause_off()
    ctx.figure("agent killed mid-Image (%s): %s" % ("kubelet" if kubelet else "CRIU", "; ".join(outcomes)))
    N.ctl(ns, pod, "check")
    out = ctx.wait_until(f"{pod} RESULT", lambda: [l for l in ctx.kubectl("logs", "-n", ns, pod).stdout.splitlines()
                                                  if l.startswith("RESULT")], 60)
    ctx.check(out == ["RESULT ok"], f"{pod}: the program's own check after every kill says {out}")


# ---- cases ----

def case_kill_mid_image_kubelet(ctx):
    """The kubelet's route: killed before its suspend (nothing touched: run again, Succeeded);
    after it (the process held, its data in its pod's files: brought back, Failed Interrupted,
    the audit's strand); after the kubelet's checkpoint (brought back, then finished from the
    archive: Succeeded); before the seal (finished: Succeeded)."""
    ns = ctx.namespace("crash-kub")
    kill_at_each_step(ctx, ns, "kub", [("suspend", ("Succeeded", "ImageWritten")),
                                       ("dump", ("Failed", "Interrupted")),
                                       ("back", ("Succeeded", "ImageWritten")),
                                       ("seal", ("Succeeded", "ImageWritten"))], kubelet=True)


def case_kill_mid_image_criu(ctx):
    """The agent's own CRIU (images.pods): killed after the suspend to the partial image and
    before CRIU's dump, and after the dump before the seal (brought back from the partial image's
    files, which go: Failed Interrupted); after the commit, the process still held (brought back
    from the image, moved: Succeeded)."""
    ns = ctx.namespace("crash-criu")
    ctx.helm_upgrade(PODS)
    try:
        kill_at_each_step(ctx, ns, "criu", [("dump", ("Failed", "Interrupted")),
                                            ("seal", ("Failed", "Interrupted")),
                                            ("back", ("Succeeded", "ImageWritten"))], kubelet=False)
    finally:
        ctx.cleanup()  # its pods hold the allocations of the upgrade's image directories
        ctx.helm_upgrade()


def case_stopped_processes(ctx):
    """Four pods stop their own GPU process (SIGSTOP) and ask for Checkpoints at once, then an
    honest pod does: each stopped one fails within seconds with an error naming the state (the
    agent's waits on a process are bounded and a stopped one is seen), so none holds a worker;
    the honest one succeeds; continued, the stopped ones are untouched and run."""
    N = ctx.N
    ns = ctx.namespace("crash-stop")
    pods = [f"s{i}" for i in range(4)] + ["honest"]
    pids = {p: N.workload_pod(ns, p, 4000 + i) for i, p in enumerate(pods)}
    host = {p: N.host_pid(ns, p) for p in pods[:4]}
    for p in pods[:4]:
        os.kill(host[p], signal.SIGSTOP)
    ctx.wait_until("the four stopped", lambda: all(open(f"/proc/{host[p]}/stat").read().rsplit(")", 1)[1].split()[0]
                                                   == "T" for p in pods[:4]), 10)
    try:
        t0 = time.monotonic()
        for p in pods:
            checkpoint(ctx, ns, p, p)
        s = final(ctx, "checkpoint", ns, "honest", 60)
        honest_s = time.monotonic() - t0
        ctx.check(s["phase"] == "Succeeded", f"the honest pod's Checkpoint: {s['phase']} {s.get('message')}")
        slowest = 0.0
        for p in pods[:4]:
            st = final(ctx, "checkpoint", ns, p, 60)
            done = time.monotonic() - t0
            slowest = max(slowest, done)
            if st["phase"] != "Failed" or "stopped (state T" not in st.get("message", ""):
                diagnose(ctx, f"stopped {p}", ns, p, [host[p]])
            ctx.check(st["phase"] == "Failed" and "stopped (state T" in st.get("message", ""),
                      f"Checkpoint {p} of a stopped process: {st['phase']}: {st.get('message')}")
        ctx.figure(f"4 stopped processes: their Checkpoints Failed (state named) within {slowest:.1f} s; an honest "
                   f"pod's Succeeded after {honest_s:.1f} s")
    finally:
        for p in pods[:4]:
            os.kill(host[p], signal.SIGCONT)
    for p in pods[:4]:
        pid, _ = pids[p]
        ctx.check(N.smi(ns, p, "state", pid) == "running", f"{p} touched: {N.smi(ns, p, 'state', pid)}")
        N.finish(ns, p)
    ctx.apply({"apiVersion": GROUP, "kind": "Restore", "metadata": {"name": "honest", "namespace": ns},
               "spec": {"checkpointName": "honest"}})
    N.wait_phase("restore", ns, "honest")
    N.finish(ns, "honest")


def case_forged_phase(ctx):
    """A final Succeeded written on a Checkpoint while the agent cannot act (stopped): the agent,
    which has no record of it, marks it: condition SetByAgent False reason Forged, the message,
    a Warning Event StatusForged, and `kubectl get` shows SetByAgent False; the pod's process is
    untouched. An honest Checkpoint's status says SetByAgent True."""
    N = ctx.N
    ns = ctx.namespace("crash-forge")
    pid, _ = N.workload_pod(ns, "own", 4100)
    checkpoint(ctx, ns, "honest", "own")
    N.wait_phase("checkpoint", ns, "honest")
    honest = {c["type"]: c["status"] for c in status(ctx, "checkpoint", ns, "honest").get("conditions", [])}
    ctx.check(honest.get("SetByAgent") == "True", f"an honest Checkpoint's conditions: {honest}")
    ctx.apply({"apiVersion": GROUP, "kind": "Restore", "metadata": {"name": "honest", "namespace": ns},
               "spec": {"checkpointName": "honest"}})
    N.wait_phase("restore", ns, "honest")
    before = N.shim_status(ns, "own", pid).get("requests")
    agent = ctx.agent()
    apid = agent_host_pid(ctx, agent)
    os.kill(apid, signal.SIGSTOP)
    try:
        checkpoint(ctx, ns, "forged", "own")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ctx.kubectl("patch", "checkpoint", "-n", ns, "forged", "--subresource=status", "--type=merge", "-p",
                    json.dumps({"status": {"phase": "Succeeded", "message": "all done", "startTime": now,
                                           "completionTime": now, "nodeName": ctx.node,
                                           "conditions": [{"type": "Complete", "status": "True", "reason": "Done",
                                                           "message": "all done", "lastTransitionTime": now},
                                                          {"type": "SetByAgent", "status": "True",
                                                           "reason": "WrittenByAgent", "message": "trust me",
                                                           "lastTransitionTime": now}]}}))
    finally:
        os.kill(apid, signal.SIGCONT)
    s = ctx.wait_until("the forged phase marked", lambda: (s := status(ctx, "checkpoint", ns, "forged")) and any(
        c.get("type") == "SetByAgent" and c.get("status") == "False" for c in s.get("conditions", [])) and s, 60)
    ctx.check(s.get("phase") == "Succeeded", f"the phase itself: {s.get('phase')} (the CRD keeps it final)")
    ctx.check(s.get("message", "").startswith("FORGED"), f"message: {s.get('message')}")
    ctx.wait_until("a StatusForged Warning", lambda: any(e.get("reason") == "StatusForged" and e.get("type") == "Warning"
                                                         for e in N.events_for(ns, "forged")), 30)
    line = ctx.kubectl("get", "checkpoint", "-n", ns, "forged").stdout
    ctx.check("False" in line.splitlines()[-1], f"kubectl get shows:\n{line}")
    ctx.log(f"kubectl get checkpoint forged:\n{line}")
    ctx.check(N.shim_status(ns, "own", pid).get("requests") == before, "the forged Checkpoint reached the process")
    ctx.check(N.smi(ns, "own", "state", pid) == "running", "the process is not running")


def case_partial_name(ctx):
    """An Image Checkpoint named like a partial image (*.partial.*) is refused (Failed InvalidSpec,
    nothing touched), so no image that retention and verification never take for one appears."""
    N = ctx.N
    ns = ctx.namespace("crash-partial")
    pid, _ = N.workload_pod(ns, "p", 0)
    checkpoint(ctx, ns, "snap.partial.1", "p", action="Image", cpuCheckpoint="Kubelet")
    s = final(ctx, "checkpoint", ns, "snap.partial.1", 60)
    reason = (s.get("conditions") or [{}])[0].get("reason")
    ctx.check(s["phase"] == "Failed" and reason == "InvalidSpec" and ".partial." in s.get("message", ""),
              f"{s['phase']} {reason}: {s.get('message')}")
    ctx.check(not os.path.exists(os.path.join(IMAGES, ns, "p", "snap.partial.1")), "an image with a partial name")
    ctx.check(N.smi(ns, "p", "state", pid) == "running", "the process was touched")


def case_sidecar_first(ctx):
    """A pod (model server "main" and a sidecar "aaa-sidecar", which sorts first) imaged by the
    kubelet's route; a new pod from the checkpoint with the same two containers and a Restore: the
    agent restores main (the manifest names it), never the sidecar, which keeps running untouched
    (the bug: containerStatuses[0], the sidecar SIGKILLed, main never restored). A Restore into a
    pod without a container main: Failed ContainerNotFound, nothing touched."""
    N = ctx.N
    ns = ctx.namespace("crash-sidecar")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "src", "namespace": ns}, "spec": None}
    script = ("touch /tmp/ctl && tail -f /tmp/ctl | "
              f"gcr-testprog --module {N.KERNELS} --mib 48 --buffers 3 --threads 2 --iters 20 --wait")
    sidecar = {"name": "aaa-sidecar", "image": N.WORKLOAD_IMAGE, "imagePullPolicy": "Never",
               "command": ["/bin/sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"],
               "securityContext": {"allowPrivilegeEscalation": False}}

    def spec(main_image, main_cmd, main_name="main"):
        return {"runtimeClassName": "nvidia", "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                "securityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False},
                "containers": [sidecar, {"name": main_name, "image": main_image, "imagePullPolicy": "Never",
                                         "command": ["/bin/sh", "-c", main_cmd],
                                         "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                                         "resources": {"limits": {"gpucr.dev/shim": "1"}},
                                         "securityContext": {"allowPrivilegeEscalation": False,
                                                             "capabilities": {"drop": ["ALL"]}}}]}
    pod["spec"] = spec(N.WORKLOAD_IMAGE, script)
    ctx.apply(pod)
    line = ctx.wait_until("src READY", lambda: next((l for l in ctx.kubectl(
        "logs", "-n", ns, "src", "-c", "main", check=False).stdout.splitlines() if l.startswith("READY ")), None), 120)
    nbytes = int(dict(kv.split("=", 1) for kv in line.split()[1:])["bytes"])
    checkpoint(ctx, ns, "snap", "src", action="Image", cpuCheckpoint="Kubelet")
    N.wait_phase("checkpoint", ns, "snap", timeout=180)
    img = os.path.join(IMAGES, ns, "src", "snap")
    man = json.load(open(os.path.join(img, "manifest.json")))
    ctx.check(man.get("container") == "main", f"the manifest names container {man.get('container')}")
    ctx.kubectl("delete", "pod", "-n", ns, "src", "--wait=true", timeout=90)
    ref = f"localhost/gcr-restore/{ns}-snap:1"
    N.checkpoint_oci_image(os.path.join(img, "criu", "kubelet-checkpoint.tar"), ref, "main")
    dst = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dst", "namespace": ns},
           "spec": spec(ref, "exit 99")}
    ctx.apply(dst)
    try:
        ctx.wait_until("dst's containers running", lambda: len([c for c in ctx.kjson("get", "pod", "-n", ns, "dst")[
            "status"].get("containerStatuses", []) if "running" in c.get("state", {})]) == 2, 120)
    except AssertionError:
        diagnose(ctx, "dst", ns, "dst")
        raise
    ctx.apply({"apiVersion": GROUP, "kind": "Restore", "metadata": {"name": "back", "namespace": ns},
               "spec": {"checkpointName": "snap", "podName": "dst"}})
    s = final(ctx, "restore", ns, "back", 120)
    ctx.check(s["phase"] == "Succeeded", f"Restore into the pod with a sidecar first: {s['phase']}: {s.get('message')}")
    cs = {c["name"]: c for c in ctx.kjson("get", "pod", "-n", ns, "dst")["status"]["containerStatuses"]}
    ctx.check("running" in cs["aaa-sidecar"]["state"] and cs["aaa-sidecar"].get("restartCount", 0) == 0,
              f"the sidecar was touched: {cs['aaa-sidecar']}")
    logs = ctx.kubectl("logs", "-n", ns, "dst", "-c", "main").stdout
    pid = int(logs.split("READY pid=")[1].split()[0])

    def smi(what):
        return ctx.kubectl("exec", "-n", ns, "dst", "-c", "main", "--", "fakesmi", what, str(pid)).stdout.strip()
    ctx.check(smi("state") == "running" and int(smi("mem")) >= nbytes, "the restored model server lacks its GPU data")
    ctx.kubectl("exec", "-n", ns, "dst", "-c", "main", "--", "sh", "-c", "echo go >> /tmp/ctl")
    ctx.wait_until("dst DONE", lambda: "DONE" in ctx.kubectl("logs", "-n", ns, "dst", "-c", "main").stdout.split("\n"), 60)
    ctx.kubectl("exec", "-n", ns, "dst", "-c", "main", "--", "sh", "-c", "echo check >> /tmp/ctl")
    out = ctx.wait_until("dst RESULT", lambda: [l for l in ctx.kubectl("logs", "-n", ns, "dst", "-c", "main").stdout
                                                .splitlines() if l.startswith("RESULT")], 60)
    ctx.check(out == ["RESULT ok"], f"the restored program's own check: {out}")
    # A pod without container main: refused by name, at once, nothing ended.
    other = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other", "namespace": ns},
             "spec": dict(spec(N.WORKLOAD_IMAGE, "sleep 3600", main_name="server"))}
    ctx.apply(other)
    ctx.wait_until("other's containers running", lambda: len([c for c in ctx.kjson("get", "pod", "-n", ns, "other")[
        "status"].get("containerStatuses", []) if "running" in c.get("state", {})]) == 2, 120)
    ctx.apply({"apiVersion": GROUP, "kind": "Restore", "metadata": {"name": "none", "namespace": ns},
               "spec": {"checkpointName": "snap", "podName": "other"}})
    s = final(ctx, "restore", ns, "none", 60)
    reason = (s.get("conditions") or [{}])[0].get("reason")
    ctx.check(s["phase"] == "Failed" and reason == "ContainerNotFound" and "main" in s.get("message", ""),
              f"Restore into a pod without main: {s['phase']} {reason}: {s.get('message')}")
    cs = ctx.kjson("get", "pod", "-n", ns, "other")["status"]["containerStatuses"]
    ctx.check(all("running" in c["state"] and c.get("restartCount", 0) == 0 for c in cs), f"other touched: {cs}")


def case_alloc_leftovers(ctx):
    """images.pods: what a pod writes into its image directory (.alloc/<id>, writable by it,
    outside its ephemeral-storage limit) is removed by the sweep once it is a few seconds old,
    links never followed; the directory itself stays for the pod's next image."""
    N = ctx.N
    ctx.helm_upgrade(PODS)
    try:
        alloc_junk(ctx)
    finally:
        ctx.cleanup()
        ctx.helm_upgrade()


def alloc_junk(ctx):
    N = ctx.N
    ns = ctx.namespace("crash-alloc")
    N.workload_pod(ns, "junk", 0)
    idir = pod_env(ctx, ns, "junk", "GCR_IMAGE_DIR")
    ctx.check(idir and idir.startswith(IMAGES + "/.alloc/"), f"GCR_IMAGE_DIR {idir}")
    ctx.kubectl("exec", "-n", ns, "junk", "--", "sh", "-c",
                f"head -c 4194304 /dev/zero > {idir}/fill.bin && mkdir -p {idir}/a/b/c && echo x > {idir}/a/b/c/f"
                f" && ln -s /etc {idir}/etc-link")
    ctx.check(os.path.isfile(os.path.join(idir, "fill.bin")), "the pod's write is not in the host directory")
    t0 = time.monotonic()
    ctx.wait_until("the pod's junk removed", lambda: not os.listdir(idir), 90)
    ctx.figure(f"a pod's 4 MiB of junk in its image directory removed after {time.monotonic() - t0:.0f} s")
    ctx.check(os.path.isdir(idir) and os.path.isdir("/etc"), "the directory itself (or a link's target) went")


CASES = [("kill_mid_image_kubelet", case_kill_mid_image_kubelet),
         ("kill_mid_image_criu", case_kill_mid_image_criu),
         ("stopped_processes", case_stopped_processes),
         ("forged_phase", case_forged_phase),
         ("partial_name", case_partial_name),
         ("sidecar_first", case_sidecar_first),
         ("alloc_leftovers", case_alloc_leftovers)]
