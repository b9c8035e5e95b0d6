#!/usr/bin/env python3
"""GPU memory overcommit by suspend on a real node (docs/preemption.md): the tier k8s-overcommit.

    python3 tests/k8s/test_overcommit_e2e.py [BUILD_DIR]

The real-node test bed of test_node_e2e.py (kubelet, containerd, runc, the chart installed with
its default values), with a small stand-in GPU (GCR_TESTBED_GPU_MIB=512) that opted-in pods of
different PriorityClasses overcommit. Everything is observed as a user would: the programs' own
lines (READY, ERROR ... CUDA_ERROR_OUT_OF_MEMORY, RESULT ok: their bit-exact check), the stand-in
driver's state of each process (fakesmi in the pod), Events through the API, the agent's /metrics
through the API server's proxy and its log. The positive cases assert that the suspensions
happened, so the tier fails when the policy does nothing (GCR_OC_E2E_SET=overcommit.enabled=false
installs the chart so, to see it fail). Ends with "N passed, N failed".
"""
import json
import os
import re
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_node_e2e as N  # noqa: E402

GPU_MIB = 512
KERNELS = N.KERNELS
CLASSES = {"gcr-oc-low": 10, "gcr-oc-mid": 100, "gcr-oc-high": 1000}
OOM = "CUDA_ERROR_OUT_OF_MEMORY"
check, kubectl, kjson, apply, wait_until, log = N.check, N.kubectl, N.kjson, N.apply, N.wait_until, N.log


def helm_base():
    base = ["--set", f"image.repository={N.IMAGE_REPO}", "--set", f"image.tag={N.IMAGE_TAG}"]
    for kv in filter(None, os.environ.get("GCR_OC_E2E_SET", "").split(",")):
        base += ["--set", kv]
    return base


def case_install():
    """helm install with the chart's defaults (only the image set); the PriorityClasses the
    cases use (preemptionPolicy Never: the scheduler's own preemption would delete pods)."""
    helm = os.path.join(N.ENV["GCR_TESTBED_BIN"], "helm")
    N.run([helm, "install", N.RELEASE, N.CHART, "-n", N.SYSTEM_NS, "--create-namespace"] + helm_base() +
          ["--wait", "--timeout", "180s"], timeout=200)
    wait_until("the DaemonSet's agent Ready", N.agent_ready, 120)
    alloc = wait_until("gpucr.dev/shim on the node", lambda: kjson("get", "node", N.ENV["GCR_TESTBED_NODE"])
                       ["status"].get("allocatable", {}).get("gpucr.dev/shim"), 60)
    check(int(alloc) >= 4, f"node advertises gpucr.dev/shim={alloc}, the cases need 4 at once")
    for name, value in CLASSES.items():
        apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
               "value": value, "preemptionPolicy": "Never", "description": "GCR overcommit tier"})
    log(f"chart installed with defaults; gpucr.dev/shim={alloc}; stand-in GPU {GPU_MIB} MiB")


# ---- pods and what they show ----

def pod(ns, name, uid, mib, cls, buffers=4, optin=True, annotations=None, gate=False, hold_after=False):
    """A non-root pod of PriorityClass cls running gcr-testprog (mib MiB in buffers buffers) under
    the injected shim; steered through /tmp/ctl as in test_node_e2e. Returns its first line:
    READY (allocated) or ERROR (its allocation failed). The program's exit status follows as EXIT.
    hold_after: after its check (RESULT ok) it keeps its memory until "exit"."""
    hold = " --hold-after" if hold_after else ""
    script = ("touch /tmp/ctl && tail -f /tmp/ctl | { "
              f"gcr-testprog --module {KERNELS} --mib {mib} --buffers {buffers} --threads 1 --iters 3 --wait{hold}; "
              "echo EXIT $?; }")
    meta = {"name": name, "namespace": ns, "labels": {"case": ns}}
    if optin:
        meta["labels"]["gpucr.dev/overcommit"] = "suspend"
    if annotations:
        meta["annotations"] = annotations
    apply({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "runtimeClassName": "nvidia", "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "priorityClassName": cls,
        "securityContext": {"runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": True},
        "containers": [{
            "name": "main", "image": N.WORKLOAD_IMAGE, "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", script],
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "GCR_LOG_LEVEL", "value": "info"}],
            "resources": {"limits": {"gpucr.dev/shim": "1"}},
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        }]} | ({"readinessGates": [{"conditionType": "gpucr.dev/resident"}]} if gate else {})})
    return line(ns, name, r"^(READY|ERROR) ")


def logs(ns, name):
    return kubectl("logs", "-n", ns, name, check=False).stdout.splitlines()


def line(ns, name, pattern, timeout=120):
    rx = re.compile(pattern)
    return wait_until(f"{ns}/{name}: a line /{pattern}/", lambda: next((x for x in logs(ns, name) if rx.search(x)),
                                                                       None), timeout)


def ready(ns, name, *args, **kw):
    first = pod(ns, name, *args, **kw)
    check(first.startswith("READY "), f"{ns}/{name}: {first}")
    fields = dict(kv.split("=", 1) for kv in first.split()[1:])
    return int(fields["pid"]), int(fields["bytes"])


def oom(ns, name, *args, **kw):
    """The pod's allocation fails with out-of-memory, as without GCR; the program exits 2."""
    first = pod(ns, name, *args, **kw)
    check(first.startswith("ERROR ") and first.endswith(" " + OOM), f"{ns}/{name}: want {OOM}, got {first}")
    check(line(ns, name, r"^EXIT ", 30) == "EXIT 2", f"{ns}/{name}: exit status not 2")


def state(ns, name, pid):
    return N.smi(ns, name, "state", pid)


def mem(ns, name, pid):
    return int(N.smi(ns, name, "mem", pid))


def held(ns, name, pid):
    """Suspended for another pod: the driver checkpointed the process, 0 bytes on the GPU."""
    st, m = state(ns, name, pid), mem(ns, name, pid)
    check(st == "checkpointed" and m == 0, f"{ns}/{name} not suspended: driver state {st}, {m} bytes on the GPU")


def running(ns, name, pid, nbytes):
    st, m = state(ns, name, pid), mem(ns, name, pid)
    check(st == "running" and m >= nbytes, f"{ns}/{name}: driver state {st}, {m} of its {nbytes} bytes on the GPU")


def wait_resumed(ns, name, pid, nbytes, timeout=60):
    wait_until(f"{ns}/{name} resumed", lambda: state(ns, name, pid) == "running", timeout)
    running(ns, name, pid, nbytes)


def finish(ns, name):
    """The program's steps and its own bit-exact check of every buffer: RESULT ok, exit 0."""
    N.finish(ns, name)
    check(line(ns, name, r"^EXIT ", 30) == "EXIT 0", f"{ns}/{name}: exit status not 0")


def events(ns, name=None, reason=None):
    """Core Events (kubectl get events) of the namespace, of pod name, of that reason."""
    items = kjson("get", "events", "-n", ns)["items"]
    return [e for e in items if (name is None or e["involvedObject"].get("name") == name)
            and (reason is None or e.get("reason") == reason)]


def wait_event(ns, name, reason, kind, has=""):
    ev = wait_until(f"{reason} Event on {ns}/{name}", lambda: [e for e in events(ns, name, reason)
                                                               if has in e.get("message", "")], 30)
    check(ev[0].get("type") == kind, f"{reason} on {ns}/{name} is {ev[0].get('type')}, not {kind}")
    log(f"event {ns}/{name}: {kind} {reason}: {ev[0].get('message')}")
    return ev


def agent():
    return wait_until("the agent Ready", N.agent_ready, 120)


def agent_log(a=None):
    a = a or agent()
    return kubectl("logs", "-n", N.SYSTEM_NS, a["metadata"]["name"], "-c", "agent", check=False).stdout.splitlines()


def metrics_text(a=None):
    """The agent's /metrics, read through the API server's proxy."""
    a = a or agent()
    return kubectl("get", "--raw", f"/api/v1/namespaces/{N.SYSTEM_NS}/pods/{a['metadata']['name']}:9464"
                   "/proxy/metrics").stdout


def metric(name, podname, a=None):
    """A per-pod counter from the agent's /metrics."""
    text = metrics_text(a)
    m = re.search(r'^%s\{pod="%s"\} (\S+)$' % (re.escape(name), re.escape(podname)), text, re.M)
    return float(m.group(1)) if m else None


def in_namespace(ns):
    """Runs the case in namespace ns, which it deletes afterwards, passed or not, waiting until
    its pods are gone (their GPU memory free for the next case); on a failure, the agent's
    overcommit and registry lines first."""
    def wrap(fn):
        def case():
            N.namespace(ns)
            try:
                fn(ns)
            except Exception:
                lines = [x for x in agent_log() if "overcommit" in x or "registry" in x]
                log("agent lines:\n  " + "\n  ".join(lines[-100:]))
                raise
            finally:
                N.drop_namespace(ns)
        case.__name__ = fn.__name__
        case.__doc__ = fn.__doc__
        return case
    return wrap


def no_suspensions(ns):
    bad = [e["involvedObject"]["name"] for e in events(ns) if e.get("reason", "").startswith("OvercommitSuspend")]
    check(not bad, f"Overcommit suspend Events on {bad}")


# ---- cases ----

# The chart's default overcommit.idleMs (30 s), and the agent's checks on top (0.5 s each).
IDLE_S = 30


@in_namespace("oc-idle")
def case_idle(ns):
    """The chart's defaults: the high pod idles holding its memory (its program waits for "go"):
    after overcommit.idleMs it is suspended itself (data only: its buffers leave the GPU, its
    context stays), the low pod is resumed; Events on both and the metrics say so; the low pod's
    data is bit-exact while the high one idles; the high pod's next call wakes it: the low one is
    suspended again, the high one resumed, its data bit-exact; once it ends the low one is back.
    With GCR_OC_E2E_SET=overcommit.idleMs=0 this case fails (nothing suspends the idle pod)."""
    lpid, lbytes = ready(ns, "low", 2001, 192, "gcr-oc-low", hold_after=True)
    hpid, hbytes = ready(ns, "high", 2002, 384, "gcr-oc-high")
    held(ns, "low", lpid)
    ev = wait_until(f"OvercommitIdleSuspended Event on {ns}/high",
                    lambda: events(ns, "high", "OvercommitIdleSuspended"), IDLE_S + 30)
    check(ev[0].get("type") == "Warning", f"OvercommitIdleSuspended is {ev[0].get('type')}, not Warning")
    log(f"event {ns}/high: {ev[0].get('message')}")
    wait_resumed(ns, "low", lpid, lbytes)
    wait_event(ns, "low", "OvercommitResumed", "Normal", "suspended for idling")
    st, m = state(ns, "high", hpid), mem(ns, "high", hpid)
    check(st == "running" and m < hbytes, f"high not suspended data only: driver state {st}, {m} bytes on the GPU")
    check(metric("gcr_agent_overcommit_idle_suspensions_total", f"{ns}/high") == 1, "idle suspension not counted")
    N.finish(ns, "low")  # bit-exact while high idles; it keeps its memory (--hold-after)
    N.ctl(ns, "high", "go")
    line(ns, "high", r"^DONE$", 60)
    held(ns, "low", lpid)
    running(ns, "high", hpid, hbytes)
    wait_event(ns, "high", "OvercommitResumed", "Normal", "it called the GPU")
    wait_event(ns, "low", "OvercommitSuspended", "Warning", f"for pod {ns}/high")
    check(metric("gcr_agent_overcommit_wakes_total", f"{ns}/high") == 1, "the wake not counted")
    N.ctl(ns, "high", "check")
    check(line(ns, "high", r"^RESULT ", 60) == "RESULT ok", "high: its own check failed")
    check(line(ns, "high", r"^EXIT ", 30) == "EXIT 0", "high: exit status not 0")
    wait_resumed(ns, "low", lpid, lbytes)
    N.ctl(ns, "low", "exit")
    check(line(ns, "low", r"^EXIT ", 30) == "EXIT 0", "low: exit status not 0")


@in_namespace("oc-two")
def case_two(ns):
    """A low-priority pod holds most of the GPU; a high-priority pod allocates past it: the low one
    is suspended (0 bytes on the GPU), the allocation succeeds; Events on both pods and the metrics
    say so; once the high one ends, the low one is resumed and its data is bit-exact."""
    lpid, lbytes = ready(ns, "low", 2001, 192, "gcr-oc-low")
    running(ns, "low", lpid, lbytes)
    hpid, hbytes = ready(ns, "high", 2002, 384, "gcr-oc-high")
    held(ns, "low", lpid)
    running(ns, "high", hpid, hbytes)
    check("GCR_OVERCOMMIT=1" in kubectl("exec", "-n", ns, "high", "--", "env").stdout,
          "the device plugin did not give GCR_OVERCOMMIT=1 with the policy on")
    shim = line(ns, "high", r"room for \d+ bytes .*made by the agent", 10)
    log(f"high's shim: {shim}")
    wait_event(ns, "low", "OvercommitSuspended", "Warning", f"for pod {ns}/high (priority 1000 > 10)")
    wait_event(ns, "high", "OvercommitRoomMade", "Normal", f"pod {ns}/low (priority 10)")
    check(metric("gcr_agent_overcommit_suspensions_total", f"{ns}/low") == 1, "suspension not counted in /metrics")
    check((metric("gcr_agent_overcommit_bytes_moved_total", f"{ns}/low") or 0) >= 192 << 20,
          "bytes moved not counted in /metrics")
    check(metric("gcr_agent_overcommit_suspensions_total", f"{ns}/high") is None, "the requester was counted")
    finish(ns, "high")
    wait_resumed(ns, "low", lpid, lbytes)
    wait_event(ns, "low", "OvercommitResumed", "Normal", "resumed after")
    check(metric("gcr_agent_overcommit_resumes_total", f"{ns}/low") == 1, "resume not counted in /metrics")
    check((metric("gcr_agent_overcommit_held_seconds_total", f"{ns}/low") or 0) > 0, "time held not counted")
    log("/metrics:\n" + "\n".join(x for x in metrics_text().splitlines() if f'pod="{ns}/' in x))
    finish(ns, "low")
    log("kubectl get events:\n" + kubectl("get", "events", "-n", ns, "--field-selector",
                                          "involvedObject.kind=Pod", "--sort-by=.lastTimestamp").stdout[-3000:])


def conditions(ns, name):
    return {c["type"]: c for c in kjson("get", "pod", "-n", ns, name)["status"].get("conditions", [])}


def wait_readiness(ns, name, resident, reason):
    """The pod's gate gpucr.dev/resident (and so Ready) becomes resident ("True"/"False") with reason."""
    want = "True" if resident else "False"

    def seen():
        c = conditions(ns, name)
        g = c.get("gpucr.dev/resident", {})
        return (g.get("status") == want and g.get("reason") == reason and c.get("Ready", {}).get("status") == want
                and g)
    g = wait_until(f"{ns}/{name}: gpucr.dev/resident={want} ({reason}), Ready={want}", seen, 60)
    log(f"{ns}/{name}: gpucr.dev/resident={want} {reason}: {g.get('message')}")


@in_namespace("oc-ready")
def case_readiness(ns):
    """The victim's readiness gate gpucr.dev/resident shows whether it is resident: Ready while it
    runs, not Ready (SuspendedOnNode, from its node's heartbeat note) while it is held for the high
    pod, Ready again once it is resumed."""
    lpid, lbytes = ready(ns, "low", 2061, 192, "gcr-oc-low", gate=True)
    wait_readiness(ns, "low", True, "Resident")
    ready(ns, "high", 2062, 384, "gcr-oc-high")
    held(ns, "low", lpid)
    wait_readiness(ns, "low", False, "SuspendedOnNode")
    log("kubectl get pods while held:\n" + kubectl("get", "pods", "-n", ns, "-o", "wide").stdout)
    held(ns, "low", lpid)
    finish(ns, "high")
    wait_resumed(ns, "low", lpid, lbytes)
    wait_readiness(ns, "low", True, "Resident")
    finish(ns, "low")


@in_namespace("oc-enough")
def case_three_just_enough(ns):
    """Three pods; the highest needs room the lowest alone can give: only it is suspended, the
    middle one runs on; it is resumed once the highest ends."""
    apid, abytes = ready(ns, "a", 2011, 160, "gcr-oc-low")
    bpid, bbytes = ready(ns, "b", 2012, 160, "gcr-oc-mid")
    ready(ns, "c", 2013, 256, "gcr-oc-high")
    held(ns, "a", apid)
    running(ns, "b", bpid, bbytes)
    check(not events(ns, "b", "OvercommitSuspended"), "b (priority 100) suspended though a alone made room")
    finish(ns, "c")
    wait_resumed(ns, "a", apid, abytes)
    finish(ns, "b")
    finish(ns, "a")


@in_namespace("oc-order")
def case_three_order(ns):
    """Three pods; the highest needs both others' memory: both suspended, the lower priority
    first; once it ends they are resumed highest priority first, both bit-exact."""
    apid, abytes = ready(ns, "a", 2021, 160, "gcr-oc-low")
    bpid, bbytes = ready(ns, "b", 2022, 160, "gcr-oc-mid")
    a0 = agent()
    mark = len(agent_log(a0))
    ready(ns, "c", 2023, 448, "gcr-oc-high")
    held(ns, "a", apid)
    held(ns, "b", bpid)

    def order(word):
        lines = agent_log(a0)[mark:]
        at = {p: next((i for i, x in enumerate(lines) if f"{word} pid " in x and f"(pod {ns}/{p}," in x), None)
              for p in ("a", "b")}
        return at if None not in at.values() else None
    s = wait_until("both suspensions logged", lambda: order("suspended"), 30)
    check(s["a"] < s["b"], f"suspension order {s}: want a (priority 10) first")
    finish(ns, "c")
    wait_resumed(ns, "b", bpid, bbytes)
    wait_resumed(ns, "a", apid, abytes)
    r = wait_until("both resumes logged", lambda: order("resumed"), 30)
    check(r["b"] < r["a"], f"resume order {r}: want b (priority 100) first")
    log(f"agent lines: suspended a then b ({s}), resumed b then a ({r})")
    finish(ns, "a")
    finish(ns, "b")


@in_namespace("oc-never")
def case_never_preemptible(ns):
    """The low-priority pod is annotated gpucr.dev/preemptible: "false": the high pod's
    allocation fails with out-of-memory and the low pod is never touched."""
    lpid, lbytes = ready(ns, "low", 2031, 192, "gcr-oc-low", annotations={"gpucr.dev/preemptible": "false"})
    oom(ns, "high", 2032, 384, "gcr-oc-high")
    running(ns, "low", lpid, lbytes)
    no_suspensions(ns)
    check(metric("gcr_agent_overcommit_suspensions_total", f"{ns}/low") is None, "a suspension counted")
    finish(ns, "low")


@in_namespace("oc-restart")
def case_agent_restart(ns):
    """The agent pod is deleted while the low pod is held: the DaemonSet's new agent finds the
    record, keeps it held, and resumes it once the high pod ends; data bit-exact."""
    lpid, lbytes = ready(ns, "low", 2041, 192, "gcr-oc-low")
    ready(ns, "high", 2042, 384, "gcr-oc-high")
    held(ns, "low", lpid)
    old = agent()
    kubectl("delete", "pod", "-n", N.SYSTEM_NS, old["metadata"]["name"], "--wait=false")
    new = wait_until("a new agent Ready", lambda: (p := N.agent_ready()) and p["metadata"]["uid"] !=
                     old["metadata"]["uid"] and p, 120)
    wait_until("the new agent takes over the hold", lambda: any(
        re.search(r"pid \d+ \(priority 10\) held since an earlier agent", x) for x in agent_log(new)), 30)
    held(ns, "low", lpid)
    finish(ns, "high")
    wait_resumed(ns, "low", lpid, lbytes)
    wait_event(ns, "low", "OvercommitResumed", "Normal", "resumed after")
    check(metric("gcr_agent_overcommit_resumes_total", f"{ns}/low", new) == 1, "the new agent's /metrics: no resume")
    finish(ns, "low")
    log(f"agent {old['metadata']['name']} deleted while {ns}/low was held; {new['metadata']['name']} resumed it")


def agent_host_pid(a):
    """The host pid of gcr-agent in agent pod a (its cgroup names the pod's uid)."""
    marks = (a["metadata"]["uid"], a["metadata"]["uid"].replace("-", "_"))
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and open(f"/proc/{d}/comm").read().strip() == "gcr-agent" and any(
                    m in open(f"/proc/{d}/cgroup").read() for m in marks):
                return int(d)
        except OSError:
            continue
    raise AssertionError(f"no gcr-agent process of {a['metadata']['name']}")


@in_namespace("oc-wake")
def case_wake_lost(ns):
    """Issue 33 (QA on the real node, 2 of 2): the high pod, suspended for idling, calls while the
    agent cannot read (stopped), so its one wake sits in the dying agent's socket; the agent is then
    SIGKILLed and its pod deleted. The DaemonSet's next agent finds the wake in the shim's status
    ("wake": "called") and wakes it: the low pod suspended again, the high one's call goes through,
    both bit-exact. Before, the high pod stayed suspended for good."""
    lpid, lbytes = ready(ns, "low", 2071, 192, "gcr-oc-low", hold_after=True)
    hpid, hbytes = ready(ns, "high", 2072, 384, "gcr-oc-high")
    held(ns, "low", lpid)
    wait_until(f"OvercommitIdleSuspended Event on {ns}/high", lambda: events(ns, "high", "OvercommitIdleSuspended"),
               IDLE_S + 30)
    wait_resumed(ns, "low", lpid, lbytes)
    old = agent()
    apid = agent_host_pid(old)
    os.kill(apid, signal.SIGSTOP)
    try:
        N.ctl(ns, "high", "go")
        line(ns, "high", r"wake sent", 30)  # the shim's own line: the agent's socket took it
    finally:
        os.kill(apid, signal.SIGKILL)
    kubectl("delete", "pod", "-n", N.SYSTEM_NS, old["metadata"]["name"], "--grace-period=0", "--force",
            "--wait=false", check=False)
    new = wait_until("a new agent Ready", lambda: (p := N.agent_ready()) and p["metadata"]["uid"] !=
                     old["metadata"]["uid"] and p, 180)
    line(ns, "high", r"^DONE$", 60)
    log("the new agent: " + next((x for x in agent_log(new) if "called while no agent listened" in x), "(no line)"))
    held(ns, "low", lpid)
    running(ns, "high", hpid, hbytes)
    N.ctl(ns, "high", "check")
    check(line(ns, "high", r"^RESULT ", 60) == "RESULT ok", "high: its own check failed")
    check(line(ns, "high", r"^EXIT ", 30) == "EXIT 0", "high: exit status not 0")
    wait_resumed(ns, "low", lpid, lbytes)
    N.finish(ns, "low")  # bit-exact after its two suspends; it keeps its memory (--hold-after)
    N.ctl(ns, "low", "exit")
    check(line(ns, "low", r"^EXIT ", 30) == "EXIT 0", "low: exit status not 0")


@in_namespace("oc-own")
def case_taken_over(ns):
    """The low pod is held for the high one; its owner's own Checkpoint takes the hold over
    (issue 33: it failed "already suspended", with no Kubernetes way back): Succeeded, the policy
    no longer resumes it (still suspended after the high pod ended), and the owner's Restore
    resumes it, data bit-exact."""
    lpid, lbytes = ready(ns, "low", 2061, 192, "gcr-oc-low")
    ready(ns, "high", 2062, 384, "gcr-oc-high")
    held(ns, "low", lpid)
    apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Checkpoint", "metadata": {"name": "own", "namespace": ns},
           "spec": {"podName": "low"}})
    N.wait_phase("checkpoint", ns, "own")
    st = kjson("get", "checkpoint", "-n", ns, "own")["status"]
    check("already suspended by the overcommit policy" in st.get("message", ""), f"Checkpoint own: {st.get('message')}")
    # The agent names the host pid; lpid is the pod's own: the low pod is the only one held here.
    wait_until("the agent's take-over line", lambda: any(re.search(
        r"pid \d+ \(priority 10, suspended for another pod\) taken over by a Checkpoint", x) for x in agent_log()), 30)
    finish(ns, "high")
    # The policy's monitor looks every 0.5 s: ten of its turns after the high pod ended, still held.
    line(ns, "high", r"^EXIT ", 30)
    for _ in range(10):
        held(ns, "low", lpid)
        time.sleep(0.5)
    apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Restore", "metadata": {"name": "own", "namespace": ns},
           "spec": {"checkpointName": "own"}})
    N.wait_phase("restore", ns, "own")
    running(ns, "low", lpid, lbytes)
    finish(ns, "low")


@in_namespace("oc-off")
def case_policy_off(ns):
    """helm upgrade --set overcommit.enabled=false: the same two pods as case_two, the high one's
    allocation fails with out-of-memory and nothing is suspended (last: the chart stays so)."""
    helm = os.path.join(N.ENV["GCR_TESTBED_BIN"], "helm")
    old = agent()
    N.run([helm, "upgrade", N.RELEASE, N.CHART, "-n", N.SYSTEM_NS] + helm_base() +
          ["--set", "overcommit.enabled=false", "--wait", "--timeout", "180s"], timeout=200)
    # A new agent (the chart's config changed), unless it was installed so (GCR_OC_E2E_SET).
    wait_until("the agent with the policy off Ready", lambda: (p := N.agent_ready()) and (
        p["metadata"]["uid"] != old["metadata"]["uid"] or "overcommit.enabled=false" in helm_base()) and any(
        re.search(r"overcommit: policy off", x) for x in agent_log(p)), 120)
    lpid, lbytes = ready(ns, "low", 2051, 192, "gcr-oc-low")
    oom(ns, "high", 2052, 384, "gcr-oc-high")
    # high's container ends with its program (tail -f sees its pipe close); low's is there.
    env = kubectl("exec", "-n", ns, "low", "--", "env").stdout
    check("GCR_OVERCOMMIT=" not in env, "the device plugin still gives GCR_OVERCOMMIT with the policy off")
    running(ns, "low", lpid, lbytes)
    no_suspensions(ns)
    finish(ns, "low")


CASES = [case_install, case_two, case_idle, case_three_just_enough, case_three_order, case_never_preemptible,
         case_agent_restart, case_wake_lost, case_taken_over, case_readiness, case_policy_off]

if __name__ == "__main__":
    only = os.environ.get("GCR_OC_E2E_CASES")  # a comma list of names: those cases only, after the install
    if only:
        CASES = [case_install] + [c for c in CASES[1:] if c.__name__ in only.split(",")]
    sys.exit(N.main(CASES, GPU_MIB))
