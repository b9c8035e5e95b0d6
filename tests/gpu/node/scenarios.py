#!/usr/bin/env python3
"""The GPU node's scenarios (issue 30), driven as a user drives GCR: kubectl (and helm for the
chart's values) alone. Run by tests/gpu/node/run.sh once the node is up:

    scenarios.py LIST        LIST: all, or a comma list of the names below, run in that order

Every workload pod is the model server (llm_serve.py serve: a 16 GB Llama in bfloat16 loaded
with from_pretrained from a hostPath directory, generating greedily in a loop and printing each
iteration's token digest and the digest chain), requesting nvidia.com/gpu: 1 (the test device
plugin: a CDI device for containerd to inject) and gpucr.dev/shim: 1 (GCR's injection), running
as uid 1000 unless said. Every check of data is against the uninterrupted run of `reference`:
each ITER line's digest and chain must be exactly the reference's, and the server's own check of
every weight (WCHECK) must pass. On the stand-in (run.sh --standin) the same pods run the
stand-in workload on the stand-in driver.

  reference   uninterrupted runs of the 8b and tiny models: the expected digests (kept in the
              node's state for later calls), and a cold start's time
  cr          Checkpoint then Restore through kubectl, three times, apply-to-Succeeded timed; the same
              suspend and resume with gcrctl in the agent's pod on the same process, timed; 0 MiB
              of GPU memory while suspended; bit-exact
  scale       a GPUResidency: kubectl scale 1 -> 0 -> 1; readiness gate and Ready false then true;
              0 MiB at 0; bit-exact
  nonroot     a pod as uid/gid 2000 (runAsNonRoot): injected, Checkpoint and Restore, bit-exact
  optout      a pod with nvidia.com/gpu but not gpucr.dev/shim: nothing injected; a Checkpoint of
              it fails with a reason; its GPU memory and output untouched
  overcommit  two pods of different PriorityClass on the one GPU: the high one allocates more than
              is free, succeeds after the low one is suspended (time from the refused attempt to
              success), ends; the low one comes back; both bit-exact
  hostmem     the pod's memory (its cgroup, and the kubelet's summary = kubectl top) running,
              suspended, resumed; a pod whose memory limit is below what its suspend needs gets a
              Checkpoint refusal naming the limit and keeps running, bit-exact
  evict       helm upgrade with eviction on; a Deployment's pod drained, imaged in its grace
              period, the node uncordoned, the replacement restored from the image, bit-exact;
              uncordon -> first generated token against the same pod's cold start
  tp          (two GPUs; not in `all`) a tensor-parallel pod: two NCCL ranks (nccl_ranks.py --mode
              tp, 8 GiB of weights each) in one container; Checkpoint and Restore through kubectl
              three times and the group suspend and resume with gcrctl, timed; 0 MiB on both GPUs
              while suspended; both ranks' digests equal to an uninterrupted run's without GCR

Results: one JSON line per scenario in $GCR_NODE_OUT/results.jsonl (name, ok, seconds, figures,
error), $GCR_NODE_OUT/report.md, and "N passed, N failed" at the end (scenarios not run for
time are listed, and counted in neither).
"""
import hashlib
import json
import os
import shutil
import glob
import subprocess
import sys
import threading
import time
import traceback
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(TOP, "tests", "k8s"))
import test_node_e2e as N  # noqa: E402
import test_evict_e2e as E  # noqa: E402

check, kubectl, kjson, apply, wait_until, log = N.check, N.kubectl, N.kjson, N.apply, N.wait_until, N.log

ENV = os.environ
STANDIN = ENV.get("GCR_NODE_STANDIN") == "1"
BACKEND = ENV.get("GCR_NODE_BACKEND", "torch")
STATE = ENV["GCR_NODE_STATE"]
MODELS = ENV["GCR_NODE_MODELS"]
OUTDIR = ENV.get("GCR_NODE_OUT", "/tmp/gcr-node-out")
DEADLINE = float(ENV.get("GCR_NODE_DEADLINE", time.time() + 540))
NODE = ENV["GCR_TESTBED_NODE"]
IMAGE = ENV["GCR_NODE_WORKLOAD_IMAGE"]
IMAGE_REPO, IMAGE_TAG = ENV["GCR_NODE_IMAGE_REPO"], ENV["GCR_NODE_IMAGE_TAG"]
PY = "/usr/bin/python3" if STANDIN else "/opt/torch/.venv/bin/python3"
SERVER = "/opt/gcr-node/llm_serve.py"
API = "gpucr.dev/v1alpha1"
# Seconds each scenario needs at most (GPU, stand-in): one is not started with less time left.
COST = {"reference": (150, 60), "cr": (180, 70), "scale": (110, 50), "nonroot": (70, 40), "optout": (70, 40),
        "overcommit": (170, 70), "hostmem": (150, 70), "evict": (300, 150),
        "tp": (240, 120)}
# Pod start: a 16 GB load from disk (page cache cold) takes a while on the GPU machine.
START_S = 60 if STANDIN else 240


def now():
    return time.time()


# ---- pods ----

def volumes():
    # The host's /usr by its parts, not whole: a hostPath is a recursive bind, and the driver's
    # own file system is mounted under /usr/local/nvidia on the GPU machine; CRIU cannot dump a
    # container holding that submount, which no container runtime declared ("FS mnt
    # ./usr/local/nvidia ... unsupported", run 66's eviction). The driver reaches the pod through
    # CDI, as on any node.
    v = [(f"usr-{d}", f"/usr/{d}", f"/usr/{d}") for d in ("bin", "sbin", "lib", "libexec", "include", "share")]
    v.append(("models", MODELS, "/models"))
    if not STANDIN:
        v.append(("torch", "/opt/torch", "/opt/torch"))
    return ([{"name": n, "hostPath": {"path": h, "type": "Directory"}} for n, h, _ in v],
            [{"name": n, "mountPath": c, "readOnly": True} for n, _, c in v])


def pod_spec(args, uid=1000, shim=True, gpu=True, memory=None, priority=None, gate=False, grace=5,
             restart="Never", prestop=None, sched_gate=None, pull="Never", gpus=1, command=None):
    vols, mounts = volumes()
    limits = {}
    if gpu:
        limits["nvidia.com/gpu"] = str(gpus)
    if shim:
        limits["gpucr.dev/shim"] = "1"
    if memory:
        limits["memory"] = memory
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HUB_OFFLINE", "value": "1"},
           {"name": "TRANSFORMERS_OFFLINE", "value": "1"}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if shim:
        env.append({"name": "GCR_LOG_LEVEL", "value": "info"})  # the shim's lines in the pod's log
    c = {"name": "main", "image": IMAGE, "imagePullPolicy": pull, "command": command or [PY, SERVER] + args, "env": env,
         "resources": {"limits": limits} | ({"requests": {"memory": memory}} if memory else {}),
         "volumeMounts": mounts,
         "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}
    if prestop:
        c["lifecycle"] = {"preStop": {"exec": {"command": [prestop]}}}
    spec = {"restartPolicy": restart, "terminationGracePeriodSeconds": grace,
            "securityContext": {"runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": uid != 0},
            "containers": [c], "volumes": vols}
    if priority:
        spec["priorityClassName"] = priority
    if gate:
        spec["readinessGates"] = [{"conditionType": "gpucr.dev/resident"}]
    if sched_gate:
        spec["schedulingGates"] = [{"name": sched_gate}]
    return spec


def serve_args(size="8b", extra=()):
    # The stand-in generates in microseconds: paced to about a GPU's rate, so logs stay small.
    pace = ["--pace-s", "0.1"] if STANDIN else []
    return ["serve", "--backend", BACKEND, "--dir", f"/models/llama-{size}"] + pace + list(extra)


def server_pod(ns, name, size="8b", labels=None, annotations=None, **kw):
    t0 = now()
    apply({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "labels": labels or {"app": name},
                        "annotations": annotations or {}},
           "spec": pod_spec(serve_args(size), **kw)})
    return t0


def logs(ns, pod, previous=False):
    r = kubectl("logs", "-n", ns, pod, *(["--previous"] if previous else []), check=False, timeout=60)
    return r.stdout


def parse(text):
    """The server's lines: LOADED fields, ITER (i, d, chain, t0, t1) in order, WCHECK results."""
    loaded, iters, wchecks, other = None, [], [], []
    for line in text.splitlines():
        f = line.split()
        if not f:
            continue
        if f[0] == "LOADED":
            loaded = dict(kv.split("=", 1) for kv in f[1:] if "=" in kv)
        elif f[0] == "ITER" and len(f) >= 6:
            kv = dict(x.split("=", 1) for x in f[2:] if "=" in x)
            iters.append((int(f[1]), kv["d"], kv["chain"], float(kv["t0"]), float(kv["t1"])))
        elif f[0] == "WCHECK":
            wchecks.append(line)
        elif f[0] in ("ERROR", "ALLOC", "RESULT", "DONE", "Traceback"):
            other.append(line)
    return loaded, iters, wchecks, other


def wait_iters(ns, pod, n=1, after=0.0, timeout=None):
    """Waits until the pod printed n ITER lines whose t1 is after `after`; returns the parse."""
    timeout = timeout or START_S

    def got():
        text = logs(ns, pod)
        p = parse(text)
        if any(l.startswith("ERROR") for l in p[3]):
            raise StopIteration(f"{ns}/{pod}: {[l for l in p[3] if l.startswith('ERROR')]}\n{text[-3000:]}")
        if sum(1 for it in p[1] if it[4] > after) >= n:
            return p
        pod_trouble(ns, pod, text)
        return None
    try:
        return wait_until(f"{ns}/{pod}: {n} ITER line(s)", got, timeout, 0.5)
    except StopIteration as e:
        raise AssertionError(str(e)) from None


def pod_trouble(ns, pod, text=""):
    """Stops a wait at once when the pod cannot get there (its container failed to be made, or
    ended); an unschedulable pod is reported as the wait's last reason."""
    st = kjson("get", "pod", "-n", ns, pod).get("status", {})
    for c in st.get("containerStatuses", []):
        w = c.get("state", {}).get("waiting", {})
        t = c.get("state", {}).get("terminated")
        if w.get("reason") in ("CreateContainerError", "CreateContainerConfigError", "RunContainerError",
                               "CrashLoopBackOff", "ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull"):
            raise StopIteration(f"{ns}/{pod}: {w.get('reason')}: {w.get('message')}")
        if t:
            raise StopIteration(f"{ns}/{pod}: container ended ({t.get('reason')}, exit {t.get('exitCode')}): {text[-3000:]}")
    for c in st.get("conditions", []):
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            raise AssertionError(f"{ns}/{pod} not scheduled: {c.get('reason')}: {c.get('message')}")


def pod_processes(ns, pod):
    """The host's processes of a pod (their cgroup names the pod's UID): (pid, argv, environ) each,
    argv and environ lists of bytes; what the agent's registry and NVML see."""
    uid = kjson("get", "pod", "-n", ns, pod)["metadata"]["uid"]
    marks = (uid, uid.replace("-", "_"))
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cgroup") as f:
                cg = f.read()
            if not any(m in cg for m in marks):
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        yield int(d), argv, env


def host_pid(ns, pod):
    """The host pid of the pod's model server."""
    for pid, argv, _ in pod_processes(ns, pod):
        if any(b"llm_serve.py" in a for a in argv):
            return pid
    raise AssertionError(f"no server process of {ns}/{pod} on the host")


def agent():
    return wait_until("the agent Ready", N.agent_ready, 120)["metadata"]["name"]


def agent_exec(*cmd, timeout=120):
    return kubectl("exec", "-n", N.SYSTEM_NS, agent(), "-c", "agent", "--", *cmd, check=False, timeout=timeout)


def gpu_mib(pid, ns=None, pod=None):
    """The GPU memory (MiB) of the server process as the driver reports it. On the GPU: nvidia-smi
    in the agent's pod (the host's pid namespace, the driver from NVIDIA's runtime), by host pid.
    On the stand-in: its fakesmi (the fake driver root's nvidia-smi, which CDI mounts in every GPU
    container) in the server's own pod, by the pid the server has there (1: the pod's command is
    the server)."""
    if STANDIN:
        r = kubectl("exec", "-n", ns, pod, "--", "nvidia-smi", "mem", "1", check=False)
        check(r.returncode == 0, f"the stand-in's nvidia-smi in {ns}/{pod}: {r.stderr.strip()}")
        return int(r.stdout.strip()) / (1 << 20)
    r = agent_exec("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    check(r.returncode == 0, f"nvidia-smi in the agent's pod: {r.stderr.strip()} {r.stdout.strip()}")
    for line in r.stdout.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) == 2 and f[0] == str(pid):
            return float(f[1])
    return 0.0


# ---- the reference ----

def ref_path():
    return os.path.join(STATE, "reference.json")


def load_ref():
    if not os.path.exists(ref_path()):
        raise AssertionError("no reference yet (scenario `reference` first)")
    with open(ref_path()) as f:
        return json.load(f)


def expected_chain(ref, upto):
    """The chain values an uninterrupted run prints for iterations 0..upto."""
    out, chain = [], b""
    for i in range(upto + 1):
        chain = hashlib.sha256(chain + ref[i % len(ref)].encode()).digest()
        out.append(chain.hex()[:16])
    return out


def verify(ns, pod, size="8b", text=None, contiguous=True):
    """Every ITER line of the pod bit-exact against the reference (digest and chain), every WCHECK
    ok, the weights' sum the reference's; returns (number of ITER lines, last iteration)."""
    ref = load_ref()[size]
    loaded, iters, wchecks, other = parse(text if text is not None else logs(ns, pod))
    check(iters, f"{ns}/{pod}: no ITER line")
    chains = expected_chain(ref["digests"], max(i for i, *_ in iters))
    for k, (i, d, c, _, _) in enumerate(iters):
        check(d == ref["digests"][i % len(ref["digests"])], f"{ns}/{pod}: iteration {i}: digest {d}, "
              f"the reference's {ref['digests'][i % len(ref['digests'])]}")
        check(c == chains[i], f"{ns}/{pod}: iteration {i}: chain {c}, the reference's {chains[i]}")
        if contiguous and k > 0:
            check(i == iters[k - 1][0] + 1, f"{ns}/{pod}: iteration {i} after {iters[k - 1][0]}")
    check(all(" ok " in w + " " for w in wchecks), f"{ns}/{pod}: weight check failed: {wchecks}")
    if loaded:
        check(loaded.get("wsum") == ref["wsum"], f"{ns}/{pod}: weights' sum {loaded.get('wsum')}, the reference's {ref['wsum']}")
    return len(iters), iters[-1][0]


def case_reference(fig):
    """Uninterrupted runs (no suspend): the expected digests of both models."""
    ns = "gcrn-ref"
    N.namespace(ns)
    out = {}
    for size in ("8b", "tiny"):
        name = f"ref-{size}"
        t0 = now()
        apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
               "spec": pod_spec(serve_args(size, ["--max-iters", "16"]))})
        text = wait_until(f"{name} DONE", lambda: (t := logs(ns, name)) and ("DONE" in t.split() or "ERROR" in t) and t,
                          START_S + 60, 1)
        loaded, iters, wchecks, other = parse(text)
        check(loaded and len(iters) == 16 and "DONE" in text.split(), f"{name}: {text[-2000:]}")
        check(all(" ok " in w + " " for w in wchecks) and wchecks, f"{name}: weight checks {wchecks}")
        digests = [d for _, d, *_ in iters]
        chains = expected_chain(digests, 15)
        check([c for _, _, c, *_ in iters] == chains, f"{name}: its own chain does not follow its digests")
        out[size] = {"digests": digests, "wsum": loaded["wsum"], "pid_uid": loaded.get("uid")}
        fig[f"{size}_cold_start_to_first_iter_s"] = round(iters[0][4] - t0, 2)
        fig[f"{size}_load_s"] = float(loaded["load_s"])
        fig[f"{size}_iter_s"] = round((iters[-1][4] - iters[0][4]) / 15, 3)
        fig[f"{size}_gpu_bytes"] = int(loaded["gpu_bytes"])
        fig[f"{size}_distinct_digests"] = len(set(digests))
    check(out["8b"]["digests"] != out["tiny"]["digests"], "both models gave the same digests")
    with open(ref_path(), "w") as f:
        json.dump(out, f)
    kubectl("delete", "namespace", ns, "--wait=false")


# ---- timed operations ----

class PhaseWatch:
    """kubectl get KIND --watch on one name, started before the object exists: the time each phase
    was first seen (what a user watching sees)."""

    def __init__(self, kind, ns, name):
        self.seen = {}
        self.watching = threading.Event()
        # -v=6 logs each request's answer: the watch's (watch=true) says it is established.
        self.p = subprocess.Popen(
            [os.path.join(ENV["GCR_TESTBED_BIN"], "kubectl"), "-v=6", "get", kind, "-n", ns, "--watch",
             "--field-selector", f"metadata.name={name}", "-o", "jsonpath={.status.phase}{\"\\n\"}"],
            env=N.ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self.read, daemon=True).start()
        threading.Thread(target=self.established, daemon=True).start()
        if not self.watching.wait(10):
            log(f"kubectl's watch on {kind} {ns}/{name} not seen established in 10 s; timing from now")

    def established(self):
        for line in self.p.stderr:
            if "watch=true" in line:
                self.watching.set()

    def read(self):
        for line in self.p.stdout:
            ph = line.strip()
            if ph and ph not in self.seen:
                self.seen[ph] = now()

    def wait(self, timeout):
        end = now() + timeout
        while now() < end and not ({"Succeeded", "Failed"} & set(self.seen)):
            time.sleep(0.01)
        self.p.kill()
        return self.seen


def cr_object(kind, ns, name, spec):
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name, "namespace": ns}, "spec": spec}


def timed_apply(kind, ns, name, spec, want="Succeeded", timeout=120):
    """Applies a Checkpoint or Restore; returns (phase, seconds from the start of kubectl apply to
    that phase, its status)."""
    w = PhaseWatch(kind.lower() + "s", ns, name)
    t0 = now()
    apply(cr_object(kind, ns, name, spec))
    seen = w.wait(timeout)
    ph = "Succeeded" if "Succeeded" in seen else "Failed" if "Failed" in seen else None
    st = kjson("get", kind.lower(), "-n", ns, name).get("status", {})
    check(ph == want, f"{kind} {ns}/{name}: {ph or 'no final phase'} ({st.get('message')}), wanted {want}")
    return ph, round(seen[ph] - t0, 3), st


def gcrctl(op, pid):
    """gcrctl OP PID in the agent's pod (the same process, the same driver, no API server): its
    JSON answer and its wall time measured inside the pod (the kubectl exec around it excluded)."""
    # The stand-in's NVML finds its GPU through the environment its CDI spec gives the agent's
    # container (run.sh's STANDIN_GPU_ENV); NVIDIA's runtime edits the spec at runc create, out of
    # containerd's sight, so a kubectl exec does not get it (the real NVML needs none).
    env = f"env {ENV['GCR_NODE_STANDIN_GPU_ENV']} " if STANDIN else ""
    r = agent_exec("sh", "-c", f"a=$(date +%s.%N); {env}gcrctl --json {op} {pid}; rc=$?; b=$(date +%s.%N); "
                   "echo WALL $a $b $rc")
    wall = next((l.split() for l in r.stdout.splitlines() if l.startswith("WALL ")), None)
    js = next((json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")), None)
    check(wall and wall[3] == "0" and js and js.get("ok"), f"gcrctl {op} {pid}: {r.stdout.strip()} {r.stderr.strip()}")
    return js, round(float(wall[2]) - float(wall[1]), 3)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def overhead_figures(fig):
    """Medians of the rounds in fig (checkpoint, restore, gcrctl_suspend, gcrctl_resume) and the
    agent's overhead: what Kubernetes adds over gcrctl on the same processes."""
    fig["checkpoint_s_median"] = median([c["apply_to_succeeded_s"] for c in fig["checkpoint"]])
    fig["restore_s_median"] = median([r["apply_to_succeeded_s"] for r in fig["restore"]])
    fig["gcrctl_suspend_s_median"] = median([g["wall_s"] for g in fig["gcrctl_suspend"]])
    fig["gcrctl_resume_s_median"] = median([g["wall_s"] for g in fig["gcrctl_resume"]])
    fig["agent_overhead_checkpoint_s"] = round(fig["checkpoint_s_median"] - fig["gcrctl_suspend_s_median"], 3)
    fig["agent_overhead_restore_s"] = round(fig["restore_s_median"] - fig["gcrctl_resume_s_median"], 3)


def case_cr(fig):
    """Checkpoint and Restore through kubectl, and the same with gcrctl, on one 16 GB server."""
    ns = "gcrn-cr"
    N.namespace(ns)
    server_pod(ns, "llm")
    wait_iters(ns, "llm", 3)
    pid = host_pid(ns, "llm")
    check(kubectl("exec", "-n", ns, "llm", "--", "id", "-u").stdout.strip() == "1000", "the pod does not run as uid 1000")
    env = kubectl("exec", "-n", ns, "llm", "--", "cat", "/proc/1/environ").stdout.replace("\0", "\n")
    check("LD_PRELOAD=/opt/gcr/lib/libgcr.so" in env, "no LD_PRELOAD from GCR's Allocate")
    maps = kubectl("exec", "-n", ns, "llm", "--", "cat", "/proc/1/maps").stdout
    check("libgcr.so" in maps, "the shim is not loaded in the server")
    fig["gpu_mib_running"] = gpu_mib(pid, ns, "llm")
    check(fig["gpu_mib_running"] > 0, "the server holds no GPU memory")
    ck, rs, g_s, g_r, mib_s = [], [], [], [], []
    for rnd in (1, 2, 3):
        _, t, st = timed_apply("Checkpoint", ns, f"ck{rnd}", {"podName": "llm"})
        ck.append({"apply_to_succeeded_s": t, "durations_ms": st.get("durations"), "bytes": st.get("bytes")})
        check(any(p.get("pid") == pid for p in st.get("processes", [])), f"status.processes {st.get('processes')} lacks {pid}")
        mib_s.append(gpu_mib(pid, ns, "llm"))
        check(mib_s[-1] == 0, f"{mib_s[-1]} MiB of GPU memory held while suspended")
        _, t, st = timed_apply("Restore", ns, f"rs{rnd}", {"checkpointName": f"ck{rnd}"})
        rs.append({"apply_to_succeeded_s": t, "durations_ms": st.get("durations")})
        wait_iters(ns, "llm", 2, after=now())
        js, wall = gcrctl("suspend", pid)
        g_s.append({"wall_s": wall, "ms": js.get("ms"), "bytes": js.get("bytes")})
        mib_s.append(gpu_mib(pid, ns, "llm"))
        check(mib_s[-1] == 0, f"{mib_s[-1]} MiB of GPU memory held while suspended by gcrctl")
        js, wall = gcrctl("resume", pid)
        g_r.append({"wall_s": wall, "ms": js.get("ms")})
        wait_iters(ns, "llm", 2, after=now())
    n, last = verify(ns, "llm")
    fig.update(checkpoint=ck, restore=rs, gcrctl_suspend=g_s, gcrctl_resume=g_r, gpu_mib_suspended=mib_s,
               iters_checked=n, last_iter=last)
    overhead_figures(fig)
    kubectl("delete", "namespace", ns, "--wait=false")


def case_scale(fig):
    """kubectl scale of a GPUResidency: 1 -> 0 -> 1, with the readiness gate."""
    ns = "gcrn-scale"
    N.namespace(ns)
    server_pod(ns, "llm", labels={"app": "llm-scale"}, gate=True)
    wait_iters(ns, "llm", 2)
    pid = host_pid(ns, "llm")

    def cond(t):
        return {c["type"]: c["status"] for c in kjson("get", "pod", "-n", ns, "llm")["status"].get("conditions", [])}.get(t)
    apply({"apiVersion": API, "kind": "GPUResidency", "metadata": {"name": "llm", "namespace": ns},
           "spec": {"selector": {"matchLabels": {"app": "llm-scale"}}, "replicas": 1}})
    wait_until("resident and Ready", lambda: cond("gpucr.dev/resident") == "True" and cond("Ready") == "True", 90)
    t0 = now()
    kubectl("scale", "-n", ns, "gpuresidency/llm", "--replicas=0")
    wait_until("not resident, not Ready", lambda: cond("gpucr.dev/resident") == "False" and cond("Ready") == "False", 120, 0.1)
    fig["scale_to_0_gate_false_s"] = round(now() - t0, 2)
    wait_until("0 MiB on the GPU", lambda: gpu_mib(pid, ns, "llm") == 0, 120)
    fig["scale_to_0_gpu_0_s"] = round(now() - t0, 2)
    fig["gpu_mib_at_0"] = gpu_mib(pid, ns, "llm")
    t0 = now()
    kubectl("scale", "-n", ns, "gpuresidency/llm", "--replicas=1")
    wait_until("resident and Ready again", lambda: cond("gpucr.dev/resident") == "True" and cond("Ready") == "True", 120, 0.1)
    fig["scale_to_1_ready_s"] = round(now() - t0, 2)
    fig["gpu_mib_at_1"] = gpu_mib(pid, ns, "llm")
    check(fig["gpu_mib_at_1"] > 0, "no GPU memory after scaling back to 1")
    wait_iters(ns, "llm", 2, after=now())
    st = kjson("get", "gpuresidency", "-n", ns, "llm").get("status", {})
    fig["status"] = {k: st.get(k) for k in ("replicas", "residentReplicas", "conditions") if k in st}
    fig["iters_checked"], _ = verify(ns, "llm")
    kubectl("delete", "namespace", ns, "--wait=false")


def case_nonroot(fig):
    """A pod as uid and gid 2000 (runAsNonRoot): the shim injected, the driver usable, Checkpoint
    and Restore Succeeded, bit-exact."""
    ns = "gcrn-nonroot"
    N.namespace(ns)
    server_pod(ns, "u2000", size="tiny", uid=2000)
    wait_iters(ns, "u2000", 2)
    fig["id"] = kubectl("exec", "-n", ns, "u2000", "--", "id").stdout.strip()
    check("uid=2000" in fig["id"] and "gid=2000" in fig["id"], f"id: {fig['id']}")
    fig["devices"] = kubectl("exec", "-n", ns, "u2000", "--", "sh", "-c", "ls -l /dev | grep nvidia || true").stdout.strip().splitlines()
    pid = host_pid(ns, "u2000")
    _, fig["checkpoint_s"], _ = timed_apply("Checkpoint", ns, "ck", {"podName": "u2000"})
    check(gpu_mib(pid, ns, "u2000") == 0, "GPU memory held while suspended")
    _, fig["restore_s"], _ = timed_apply("Restore", ns, "rs", {"checkpointName": "ck"})
    wait_iters(ns, "u2000", 2, after=now())
    fig["iters_checked"], _ = verify(ns, "u2000", size="tiny")
    kubectl("delete", "namespace", ns, "--wait=false")


def case_optout(fig):
    """A pod asking for the GPU but not for GCR: no shim, no GCR environment or mounts; a
    Checkpoint naming it fails with a reason; it keeps its GPU memory and its output."""
    ns = "gcrn-optout"
    N.namespace(ns)
    server_pod(ns, "plain", size="tiny", shim=False)
    wait_iters(ns, "plain", 2)
    pid = host_pid(ns, "plain")
    env = kubectl("exec", "-n", ns, "plain", "--", "cat", "/proc/1/environ").stdout.split("\0")
    gcr_env = [e for e in env if e.startswith(("LD_PRELOAD", "GCR_"))]
    check(not gcr_env, f"GCR environment in a pod that did not opt in: {gcr_env}")
    maps = kubectl("exec", "-n", ns, "plain", "--", "cat", "/proc/1/maps").stdout
    check("libgcr" not in maps, "the shim is loaded in a pod that did not opt in")
    mounts = kubectl("exec", "-n", ns, "plain", "--", "cat", "/proc/self/mountinfo").stdout
    check("/opt/gcr" not in mounts and "/run/gcr" not in mounts, "GCR's mounts in a pod that did not opt in")
    before = gpu_mib(pid, ns, "plain")
    check(before > 0, "the pod holds no GPU memory")
    _, _, st = timed_apply("Checkpoint", ns, "ck", {"podName": "plain"}, want="Failed")
    fig["checkpoint_message"] = st.get("message")
    check("no process running under the GCR shim" in (st.get("message") or ""),
          f"the failed Checkpoint's message: {st.get('message')}")
    after = gpu_mib(pid, ns, "plain")
    # Untouched: nothing released (a suspend would take it to 0). PyTorch's caching allocator only
    # grows while the server generates, so the same or more, never less.
    check(after >= before, f"the pod's GPU memory fell: {before} -> {after} MiB")
    wait_iters(ns, "plain", 2, after=now())
    fig["iters_checked"], _ = verify(ns, "plain", size="tiny")
    fig["gpu_mib"] = after
    kubectl("delete", "namespace", ns, "--wait=false")


def case_overcommit(fig):
    """Two pods of different PriorityClass on the one GPU, both opted in to overcommit."""
    ns = "gcrn-oc"
    N.namespace(ns)
    for name, value in (("gcrn-low", 10), ("gcrn-high", 1000)):
        apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
               "value": value, "preemptionPolicy": "Never", "description": "GCR GPU node, overcommit"})
    oc = {"gpucr.dev/overcommit": "suspend"}
    server_pod(ns, "victim", labels={"app": "victim", **oc}, priority="gcrn-low")
    wait_iters(ns, "victim", 3)
    pid = host_pid(ns, "victim")
    fig["victim_gpu_mib"] = gpu_mib(pid, ns, "victim")
    over = 128 if STANDIN else 4096
    hold = 8 if STANDIN else 15
    apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "high", "namespace": ns, "labels": {"app": "high", **oc}},
           "spec": pod_spec(["alloc", "--backend", BACKEND, "--over-free-mib", str(over), "--hold-s", str(hold)],
                            priority="gcrn-high")})
    line = wait_until("the high pod's ALLOC line", lambda: next((l for l in logs(ns, "high").splitlines()
                                                                 if l.startswith(("ALLOC", "ERROR"))), None), START_S)
    check(line.startswith("ALLOC"), f"the high pod's allocation failed: {logs(ns, 'high')[-2000:]}")
    a = dict(kv.split("=", 1) for kv in line.split()[1:])
    fig["high_alloc_bytes"], fig["free_before_bytes"] = int(a["bytes"]), int(a["free"])
    fig["refused_to_success_s"] = round(float(a["ms"]) / 1000, 3)
    check(int(a["bytes"]) > int(a["free"]), "the high pod did not ask for more than was free")
    fig["victim_gpu_mib_while_high"] = gpu_mib(pid, ns, "victim")
    check(fig["victim_gpu_mib_while_high"] == 0, f"the victim holds {fig['victim_gpu_mib_while_high']} MiB while the high pod runs")
    done = wait_until("the high pod Succeeded", lambda: kjson("get", "pod", "-n", ns, "high")["status"].get("phase")
                      in ("Succeeded", "Failed") and kjson("get", "pod", "-n", ns, "high"), hold + 120)
    check(done["status"]["phase"] == "Succeeded" and "RESULT ok" in logs(ns, "high"),
          f"the high pod: {done['status']['phase']}: {logs(ns, 'high')[-1500:]}")
    # The high pod's end: its RESULT line's time (it exits right after printing it).
    t_high_end = float(next(l for l in logs(ns, "high").splitlines() if l.startswith("RESULT")).split("t=")[1])
    p = wait_iters(ns, "victim", 1, after=t_high_end, timeout=120)
    # The victim is suspended between two tokens, inside an iteration (its threads wait at the
    # gate): its pause is the longest time between two iterations' ends, and it is back when the
    # first iteration after the high pod's end completes.
    ends = sorted(it[4] for it in p[1])
    back = min(t for t in ends if t > t_high_end)
    fig["victim_back_after_high_end_s"] = round(back - t_high_end, 2)
    fig["victim_paused_s"] = round(max(b - a for a, b in zip(ends, ends[1:])), 2)
    fig["victim_gpu_mib_after"] = gpu_mib(pid, ns, "victim")
    check(fig["victim_gpu_mib_after"] > 0, "the victim has no GPU memory after coming back")
    fig["events"] = [f"{e.get('reason')}: {e.get('note')}" for e in N.events_for(ns, "victim")][-5:]
    fig["iters_checked"], _ = verify(ns, "victim")
    kubectl("delete", "namespace", ns, "--wait=false")


def cgroup_mem(ns, pod):
    """The pod's memory as its own cgroup says it (v2 or v1), in bytes."""
    r = kubectl("exec", "-n", ns, pod, "--", "sh", "-c",
                "if [ -f /sys/fs/cgroup/memory.current ]; then echo v2; cat /sys/fs/cgroup/memory.current "
                "/sys/fs/cgroup/memory.max; grep -E '^(anon|file|shmem) ' /sys/fs/cgroup/memory.stat; else echo v1; "
                "cat /sys/fs/cgroup/memory/memory.usage_in_bytes /sys/fs/cgroup/memory/memory.limit_in_bytes; "
                "grep -E '^(total_rss|total_cache|total_shmem) ' /sys/fs/cgroup/memory/memory.stat; fi").stdout.split()
    out = {"cgroup": r[0], "current": int(r[1]), "limit": r[2]}
    for k, v in zip(r[3::2], r[4::2]):
        out[k.replace("total_", "").replace("rss", "anon").replace("cache", "file")] = int(v)
    return out


def staging(pid):
    """The shim's staging pool (capacity: faulted in; used: holding suspended data), from gcrctl
    stats in the agent's pod."""
    r = agent_exec("gcrctl", "--json", "stats", str(pid))
    check(r.returncode == 0, f"gcrctl stats {pid}: {r.stdout} {r.stderr}")
    js = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("{")))

    def find(o):
        if isinstance(o, dict):
            if isinstance(o.get("staging"), dict):
                return o["staging"]
            for v in o.values():
                f = find(v)
                if f is not None:
                    return f
        return None
    st = find(js) or {}
    return {k: st.get(k) for k in ("capacity", "used", "ring", "grown_inline", "fault_ms")}


def summary_mem(ns, pod):
    """What `kubectl top pod` would show: the kubelet's summary API (working set) for the pod."""
    s = json.loads(kubectl("get", "--raw", f"/api/v1/nodes/{NODE}/proxy/stats/summary").stdout)
    for p in s.get("pods", []):
        if p["podRef"]["name"] == pod and p["podRef"]["namespace"] == ns:
            m = p.get("memory", {})
            return {k: m.get(k) for k in ("workingSetBytes", "usageBytes", "rssBytes")}
    return {}


def case_hostmem(fig):
    """The pod's memory running, suspended and resumed; and the Checkpoint refused when the pod's
    memory limit cannot hold what the suspend moves."""
    ns = "gcrn-mem"
    N.namespace(ns)
    big, small = ("2Gi", "400Mi") if STANDIN else ("48Gi", "12Gi")
    server_pod(ns, "mem", memory=big)
    wait_iters(ns, "mem", 3)
    fig["limit"] = big
    fig["running"] = {"cgroup": cgroup_mem(ns, "mem"), "kubelet": summary_mem(ns, "mem")}
    pid = host_pid(ns, "mem")
    fig["running"]["staging"] = staging(pid)
    _, t, st = timed_apply("Checkpoint", ns, "ck", {"podName": "mem"})
    fig["checkpoint_bytes"] = st.get("bytes")
    fig["suspended"] = {"cgroup": cgroup_mem(ns, "mem"), "kubelet": summary_mem(ns, "mem"), "staging": staging(pid)}
    held = fig["suspended"]["staging"].get("used", 0)
    check(held > 0, f"the suspended shim holds nothing in staging: {fig['suspended']['staging']}")
    check(fig["suspended"]["cgroup"]["current"] >= held,
          f"the pod's cgroup counts {fig['suspended']['cgroup']['current']} bytes, less than the {held} its shim holds: "
          "the suspended data is not in the pod's own memory")
    timed_apply("Restore", ns, "rs", {"checkpointName": "ck"})
    wait_iters(ns, "mem", 2, after=now())
    fig["resumed"] = {"cgroup": cgroup_mem(ns, "mem"), "kubelet": summary_mem(ns, "mem")}
    verify(ns, "mem")
    kubectl("delete", "pod", "-n", ns, "mem", "--wait=false")
    # The limit below what the suspend needs: refused, named, the pod running on.
    server_pod(ns, "small", memory=small)
    wait_iters(ns, "small", 3)
    pid = host_pid(ns, "small")
    fig["small_limit"] = small
    fig["small_running"] = {"cgroup": cgroup_mem(ns, "small"), "kubelet": summary_mem(ns, "small")}
    mib = gpu_mib(pid, ns, "small")
    _, _, st = timed_apply("Checkpoint", ns, "ck-small", {"podName": "small"}, want="Failed")
    msg = st.get("message", "")
    fig["refusal_message"] = msg
    check("memory limit" in msg, f"the refusal does not name the memory limit: {msg}")
    check(gpu_mib(pid, ns, "small") == mib, "the refused pod's GPU memory changed")
    wait_iters(ns, "small", 3, after=now())
    fig["small_iters_checked"], _ = verify(ns, "small")
    fig["small_restarts"] = kjson("get", "pod", "-n", ns, "small")["status"]["containerStatuses"][0]["restartCount"]
    check(fig["small_restarts"] == 0, "the refused pod restarted")
    kubectl("delete", "namespace", ns, "--wait=false")


def helm(*args, timeout=300):
    return N.run([os.path.join(ENV["GCR_TESTBED_BIN"], "helm")] + list(args), timeout=timeout)


def chart_values(*extra):
    return ["--set", f"image.repository={IMAGE_REPO}", "--set", f"image.tag={IMAGE_TAG}"] + list(extra)


def case_evict(fig):
    """kubectl drain of the node with a Deployment's opted-in pod: imaged within its grace period;
    kubectl uncordon: the replacement restored from the image goes on bit-exact."""
    ns, app = "gcrn-evict", "llm-evict"
    gate = "gpucr.dev/restore"
    # Eviction without loss is off by default: these values are what docs/preemption.md has a
    # user set (images of the CPU side through the kubelet, the checkpoint at deletion, the
    # replacement's restore).
    save_logs("before-evict")
    helm("upgrade", N.RELEASE, N.CHART, "-n", N.SYSTEM_NS, *chart_values(
        "--set", "images.kubelet.enabled=true", "--set", f"images.kubelet.port={ENV['GCR_NODE_KUBELET_PORT']}",
        "--set", "eviction.enabled=true", "--set", "eviction.restore.enabled=true"), "--wait", "--timeout", "240s")
    try:
        wait_until("the agent on the host network", lambda: (p := N.agent_ready()) and p["spec"].get("hostNetwork"), 180)
        N.namespace(ns)
        # uid 0: CRIU restores a process of another uid only with CAP_SYS_RESOURCE, which root
        # lacks on these machines (tests/k8s/test_evict_e2e.py).
        spec = pod_spec(serve_args("8b"), uid=0, grace=300, prestop=E.HOLD, sched_gate=gate, pull="IfNotPresent",
                        restart="Always")
        t0 = now()
        apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app, "namespace": ns},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                        "template": {"metadata": {"labels": {"app": app, "gpucr.dev/evict": "image"}}, "spec": spec}}})
        old = wait_until("the first pod", lambda: next((p["metadata"]["name"] for p in kjson("get", "pods", "-n", ns)["items"]
                                                        if not p["metadata"].get("deletionTimestamp")), None), 120)
        p = wait_iters(ns, old, 3)
        fig["cold_start_first_iter_s"] = round(p[1][0][4] - t0, 2)
        fig["cold_start_load_s"] = float(p[0]["load_s"])
        pod = kjson("get", "pod", "-n", ns, old)
        ck = E.ck_name(old, pod["metadata"]["uid"])
        w = E.Watch(host_pid(ns, old), ns, ck)
        t_drain = now()
        d = E.drain(f"app={app}")
        try:
            out, _ = d.communicate(timeout=400)
            check(d.returncode == 0, f"kubectl drain failed: {out[-1500:]}")
            wait_until("the drained server's process gone", lambda: w.gone, 120)
            w.stop = True
            fig["drain_s"] = round(now() - t_drain, 1)
            written = E.imaged_before_end(ns, old, w.gone)
            c = kjson("get", "checkpoint", "-n", ns, ck)
            check(c.get("status", {}).get("phase") == "Succeeded", f"Checkpoint {ck}: {c.get('status')}")
            fig["eviction_checkpoint"] = {k: c["status"].get(k) for k in ("durations", "bytes", "message")}
            fig["imaged_before_end_s"] = round(w.gone - t_drain, 1)
            new = wait_until("the replacement pointed at the image", lambda: next(
                (q["metadata"]["name"] for q in kjson("get", "pods", "-n", ns)["items"]
                 if q["metadata"]["name"] != old and not q["spec"].get("schedulingGates")
                 and not q["metadata"].get("deletionTimestamp")), None), 180)
        finally:
            t_uncordon = now()
            E.uncordon()
        N.wait_phase("restore", ns, ck, timeout=400)
        fig["uncordon_to_restore_succeeded_s"] = round(now() - t_uncordon, 2)
        p = wait_iters(ns, new, 1, after=t_uncordon, timeout=180)
        first = min(it[4] for it in p[1] if it[4] > t_uncordon)
        fig["uncordon_to_first_iter_s"] = round(first - t_uncordon, 2)
        fig["restored_sooner_than_cold_start"] = fig["uncordon_to_first_iter_s"] < fig["cold_start_first_iter_s"]
        wait_iters(ns, new, 3, after=t_uncordon, timeout=120)
        rs = kjson("get", "restore", "-n", ns, ck)["status"]
        fig["restore_durations_ms"] = rs.get("durations")
        n, last = verify(ns, new)
        # The replacement's log begins with the original's (the checkpoint carries the container's
        # log): its first iteration after the restore is the first one past the uncordon.
        first_i = next(it[0] for it in parse(logs(ns, new))[1] if it[4] > t_uncordon)
        fig.update(replacement=new, first_iteration_after_restore=first_i, iters_checked=n, note=written.get("note"))
        kubectl("delete", "namespace", ns, "--wait=false")
    finally:
        E.uncordon()
        save_logs("evict", ["gcrn-evict"])
        helm("upgrade", N.RELEASE, N.CHART, "-n", N.SYSTEM_NS, "--reset-values", *chart_values(), "--wait", "--timeout", "240s")


# ---- a tensor-parallel pod: two NCCL ranks, one per GPU, in one container ----

TP_STEPS = 800
TP_ARGS = ["--mode", "tp", "--pace-ms", "40", "--weights-gib", "8", "--steps", str(TP_STEPS)]


def tp_pod(ns, name, shim=True):
    """One container that starts its two ranks as torchrun does (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR in the environment, one process per GPU of the pod's two) and prefixes each rank's
    lines. /dev/shm is a memory emptyDir, as vLLM's and SGLang's docs have users give a TP pod (the
    runtime's 64 MiB is too small for NCCL); NVLink multicast (NVLS) off, as on every GPU test here."""
    script = ("export MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 WORLD_SIZE=2 NCCL_NVLS_ENABLE=0 "
              "CUBLAS_WORKSPACE_CONFIG=:4096:8; for r in 0 1; do RANK=$r LOCAL_RANK=$r "
              f"{PY} /opt/gcr-node/nccl_ranks.py {' '.join(TP_ARGS)} 2>&1 | /usr/bin/sed -u \"s/^/R$r /\" & done; wait")
    spec = pod_spec([], shim=shim, gpus=2, command=["/bin/bash", "-c", script])
    spec["volumes"].append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}})
    spec["containers"][0]["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
           "spec": spec})


def tp_lines(ns, pod):
    """Per rank: its STEP numbers, its DIGEST (or None), and any ERROR line."""
    out = {r: {"steps": [], "digest": None, "errors": []} for r in (0, 1)}
    for line in logs(ns, pod).splitlines():
        f = line.split()
        if len(f) < 2 or f[0] not in ("R0", "R1"):
            continue
        r = out[int(f[0][1])]
        if f[1] == "STEP" and len(f) > 2:
            r["steps"].append(int(f[2]))
        elif f[1] == "DIGEST" and len(f) > 2:
            r["digest"] = f[2]
        elif f[1] in ("ERROR", "Traceback"):
            r["errors"].append(line)
    return out


def tp_wait(ns, pod, what, pred, timeout):
    def got():
        t = tp_lines(ns, pod)
        errs = t[0]["errors"] + t[1]["errors"]
        if errs:
            raise StopIteration(f"{ns}/{pod}: {errs}\n{logs(ns, pod)[-3000:]}")
        if pred(t):
            return t
        pod_trouble(ns, pod, logs(ns, pod))
        return None
    try:
        return wait_until(f"{ns}/{pod}: {what}", got, timeout, 0.5)
    except StopIteration as e:
        raise AssertionError(str(e)) from None


def tp_pids(ns, pod):
    """The ranks' host pids by rank: python running nccl_ranks.py (not the shell whose script names it)."""
    pids = {}
    for pid, argv, env in pod_processes(ns, pod):
        if argv[0].endswith(b"python3") and any(a.endswith(b"nccl_ranks.py") for a in argv):
            rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
            if rank is not None:
                pids[rank] = pid
    check(sorted(pids) == [0, 1], f"{ns}/{pod}: rank processes {pids}")
    return pids


def case_tp(fig):
    """A tensor-parallel pod (two GPUs, two NCCL ranks of 8 GiB of weights each, in one container):
    Checkpoint and Restore through kubectl three times, and the group suspend and resume with
    gcrctl on the same processes; 0 MiB on both GPUs while suspended; the final digest of both
    ranks equal to an uninterrupted run's without GCR."""
    ns = "gcrn-tp"
    N.namespace(ns)
    fig["node_nvidia_gpu_allocatable"] = kjson("get", "node", NODE)["status"]["allocatable"].get("nvidia.com/gpu")
    t0 = now()
    tp_pod(ns, "ref", shim=False)
    ref = tp_wait(ns, "ref", "the uninterrupted run's digests", lambda t: t[0]["digest"] and t[1]["digest"], START_S + 120)
    fig["reference_s"] = round(now() - t0, 1)
    want = [ref[0]["digest"], ref[1]["digest"]]
    kubectl("delete", "pod", "-n", ns, "ref", "--grace-period=0", "--force", "--wait=true", check=False, timeout=120)
    tp_pod(ns, "tp")
    tp_wait(ns, "tp", "both ranks past step 3", lambda t: len(t[0]["steps"]) > 3 and len(t[1]["steps"]) > 3, START_S)
    pids = tp_pids(ns, "tp")
    fig["pids"] = pids
    mib = [gpu_mib(pids[r], ns, "tp") for r in (0, 1)]
    fig["gpu_mib_running"] = mib
    check(all(m > 8000 for m in mib), f"the ranks hold {mib} MiB, not their 8 GiB of weights")
    ck, rs, g_s, g_r, mib_s = [], [], [], [], []

    def steps_past(n):
        last = tp_lines(ns, "tp")
        base = [max(last[r]["steps"] or [-1]) for r in (0, 1)]
        tp_wait(ns, "tp", f"{n} more steps on both ranks",
                lambda t: all(max(t[r]["steps"] or [-1]) >= base[r] + n for r in (0, 1)), 120)

    for rnd in (1, 2, 3):
        _, t, st = timed_apply("Checkpoint", ns, f"ck{rnd}", {"podName": "tp"})
        ck.append({"apply_to_succeeded_s": t, "durations_ms": st.get("durations"), "bytes": st.get("bytes")})
        got = sorted(p.get("pid") for p in st.get("processes", []))
        check(got == sorted(pids.values()), f"status.processes {st.get('processes')}, the ranks {pids}")
        mib_s.append([gpu_mib(pids[r], ns, "tp") for r in (0, 1)])
        check(mib_s[-1] == [0, 0], f"{mib_s[-1]} MiB held by the ranks while suspended")
        _, t, st = timed_apply("Restore", ns, f"rs{rnd}", {"checkpointName": f"ck{rnd}"})
        rs.append({"apply_to_succeeded_s": t, "durations_ms": st.get("durations")})
        steps_past(2)
        group = f"{pids[0]},{pids[1]}"
        js, wall = gcrctl("suspend --group", group)
        g_s.append({"wall_s": wall, "ms": js.get("ms")})
        mib_s.append([gpu_mib(pids[r], ns, "tp") for r in (0, 1)])
        check(mib_s[-1] == [0, 0], f"{mib_s[-1]} MiB held by the ranks while suspended by gcrctl")
        js, wall = gcrctl("resume --group", group)
        g_r.append({"wall_s": wall, "ms": js.get("ms")})
        steps_past(2)
    fin = tp_wait(ns, "tp", "both ranks' digests", lambda t: t[0]["digest"] and t[1]["digest"], 300)
    got = [fin[0]["digest"], fin[1]["digest"]]
    check(got == want, f"digests {got} after three Checkpoint/Restore and three gcrctl rounds; uninterrupted: {want}")
    fig.update(checkpoint=ck, restore=rs, gcrctl_suspend=g_s, gcrctl_resume=g_r, gpu_mib_suspended=mib_s,
               steps=TP_STEPS, digests=got)
    overhead_figures(fig)
    kubectl("delete", "namespace", ns, "--wait=false")


# The namespaces each scenario makes: removed after it, passed or failed, with their pods gone before
# the next one starts (they hold the GPU's nvidia.com/gpu slots and memory).
NAMESPACES = {"reference": ["gcrn-ref"], "cr": ["gcrn-cr"], "scale": ["gcrn-scale"], "nonroot": ["gcrn-nonroot"],
              "optout": ["gcrn-optout"], "overcommit": ["gcrn-oc"], "hostmem": ["gcrn-mem"], "evict": ["gcrn-evict"],
              "tp": ["gcrn-tp"]}


LOGDIR = os.path.join(ENV.get("GCR_TESTBED_DIR", STATE), "logs", "scenarios")


def cgroup_stats(path, pods):
    """The stall counters of the node and of the system pods' cgroups (cumulative, cgroup v2): CPU
    throttling, memory limit events and pressure, I/O pressure. Run 68's idle agent failed its
    probes for a minute while two model servers loaded; these say which of the three it waited on."""
    lines = []
    for res in ("cpu", "memory", "io"):
        try:
            lines.append(f"host /proc/pressure/{res}: " + open(f"/proc/pressure/{res}").read().replace("\n", "; "))
        except OSError as e:
            lines.append(f"host /proc/pressure/{res}: {e}")
    pod_dirs = glob.glob("/sys/fs/cgroup/**/pod*-*", recursive=True)  # one walk of the tree, every pod
    for p in pods:
        uid = p["metadata"]["uid"]
        for cg in (x for x in pod_dirs if os.path.basename(x) == f"pod{uid}"):
            for d in [cg] + sorted(x for x in glob.glob(os.path.join(cg, "*")) if os.path.isdir(x)):
                for f in ("cpu.stat", "cpu.max", "cpu.pressure", "memory.current", "memory.max", "memory.events",
                          "memory.pressure", "io.pressure"):
                    try:
                        v = open(os.path.join(d, f)).read().strip().replace("\n", "; ")
                    except OSError:
                        continue
                    lines.append(f"{p['metadata']['name']} {os.path.relpath(d, '/sys/fs/cgroup')} {f}: {v}")
                try:  # the page cache charged to it, dirty and under write-back
                    st = dict(ln.split() for ln in open(os.path.join(d, "memory.stat")) if ln.count(" ") == 1)
                    lines.append(f"{p['metadata']['name']} {os.path.relpath(d, '/sys/fs/cgroup')} memory.stat: " +
                                 " ".join(f"{k}={st.get(k)}" for k in ("anon", "file", "file_dirty", "file_writeback")))
                except OSError:
                    pass
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


class ProbeWatch:
    """The system pods' /healthz asked from the host once a second (the wait paces the
    measurement, it synchronises nothing), as the kubelet asks it: HTTP, 2 s timeout. Runs 68-74
    saw the kubelet's probes of the agent and the scaler time out, and only GCR's pods have HTTP
    probes; this watch, on the stand-in, found the cause in the test bed (its bridge took a pod's
    MAC) and shows whether any remain. One JSON line per probe in probes.jsonl."""

    def __init__(self):
        self.stop = threading.Event()
        self.targets, self.refreshed = {}, 0.0
        self.n = self.slow = self.failed = 0
        self.out = open(os.path.join(OUTDIR, "probes.jsonl"), "a")
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def refresh(self):
        r = kubectl("get", "pods", "-n", N.SYSTEM_NS, "-o", "json", check=False, timeout=20)
        if r.returncode == 0:
            # Running and not being deleted: a pod on its way out stops answering, as it should.
            self.targets = {p["metadata"]["name"]: p["status"].get("podIP") for p in json.loads(r.stdout)["items"]
                            if p["status"].get("podIP") and p["status"].get("phase") == "Running"
                            and not p["metadata"].get("deletionTimestamp")}
        self.refreshed = now()

    def one(self, pod, ip):
        t0 = now()
        try:
            with urllib.request.urlopen(f"http://{ip}:9464/healthz", timeout=2) as resp:
                err = None if resp.status == 200 else f"HTTP {resp.status}"
        except Exception as e:  # noqa: BLE001 (a timeout or a refusal is the measurement)
            err = f"{type(e).__name__}: {e}"
        ms = (now() - t0) * 1000
        rec = {"t": round(time.time(), 3), "pod": pod, "ms": round(ms, 1), "error": err}
        if err is not None or ms > 1000:
            self.refresh()  # the list is up to 10 s old: a pod that went meanwhile is not counted
            rec["gone"] = pod not in self.targets
        if not rec.get("gone"):
            self.n += 1
            self.slow += ms > 1000
            self.failed += err is not None
        return rec

    def run(self):
        while not self.stop.wait(1.0):
            try:
                self.round()
            except Exception as e:  # noqa: BLE001 (a help to the diagnosis, never a result)
                self.out.write(json.dumps({"t": round(time.time(), 3), "watch_error": str(e)}) + "\n")

    def round(self):
        if now() - self.refreshed > 10:
            self.refresh()
        for pod, ip in list(self.targets.items()):
            self.out.write(json.dumps(self.one(pod, ip)) + "\n")
        self.out.flush()

    def summary(self):
        self.stop.set()
        self.th.join(timeout=10)
        return (f"probes from the host of running pods: {self.n}, {self.slow} over 1 s, {self.failed} failed "
                f"(probes.jsonl)")


def save_logs(name, namespaces=()):
    """What each pod printed and what happened, kept in the node's logs (run.sh packs them into
    logs.tar.gz): the kubelet removes a deleted pod's logs with it."""
    d = os.path.join(LOGDIR, name)
    os.makedirs(d, exist_ok=True)
    for ns in list(namespaces) + [N.SYSTEM_NS]:
        pods = kjson("get", "pods", "-n", ns).get("items", []) if kubectl(
            "get", "namespace", ns, check=False).returncode == 0 else []
        for p in pods:
            pn = p["metadata"]["name"]
            for c in p["spec"].get("initContainers", []) + p["spec"]["containers"]:
                for prev in (False, True):
                    r = kubectl("logs", "-n", ns, pn, "-c", c["name"], *(["--previous"] if prev else []),
                                check=False, timeout=60)
                    if r.stdout:
                        with open(os.path.join(d, f"{ns}_{pn}_{c['name']}{'.previous' if prev else ''}.log"), "w") as f:
                            f.write(r.stdout)
        # CRIU's logs of a container checkpoint (runc's work directory in containerd's state): gone
        # with the container.
        for crl in glob.glob(os.path.join(ENV.get("GCR_TESTBED_DIR", STATE), "containerd", "state", "*", "*", "*",
                                          "criu-*.log")):
            shutil.copy(crl, os.path.join(d, crl.split(os.sep)[-2][:12] + "-" + os.path.basename(crl)))
        if ns == N.SYSTEM_NS:
            cgroup_stats(os.path.join(d, "cgroup-stats.txt"), pods)
        with open(os.path.join(d, f"{ns}.describe.txt"), "w") as f:
            f.write(kubectl("describe", "pods", "-n", ns, check=False, timeout=60).stdout)
            f.write(kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp", "-o", "wide", check=False).stdout)
            f.write(kubectl("get", "checkpoints,restores,gpuresidencies", "-n", ns, "-o", "yaml", check=False).stdout)


def cleanup(name):
    try:
        save_logs(name, NAMESPACES[name])
    except Exception as e:  # noqa: BLE001 (logs are a help, not a result)
        log(f"saving the logs of {name}: {e}")
    for ns in NAMESPACES[name]:
        if kubectl("get", "namespace", ns, check=False).returncode != 0:
            continue
        kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force", check=False, timeout=60)
        kubectl("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False, timeout=150)


CASES = {"reference": case_reference, "cr": case_cr, "scale": case_scale, "nonroot": case_nonroot,
         "optout": case_optout, "overcommit": case_overcommit, "hostmem": case_hostmem, "evict": case_evict,
         "tp": case_tp}


# ---- results ----

def report(results):
    lines = [f"# GPU node scenarios ({'stand-in driver' if STANDIN else 'GPU'}), {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}", ""]
    for r in results:
        state = "NOT RUN" if r.get("not_run") else ("passed" if r["ok"] else "FAILED")
        lines.append(f"## {r['name']}: {state} ({r['seconds']} s)")
        if r.get("error"):
            lines += ["", "```", r["error"][-1500:], "```"]
        if r.get("figures"):
            lines += ["", "```json", json.dumps(r["figures"], indent=1)[:6000], "```"]
        lines.append("")
    targets = []
    fig = {r["name"]: r.get("figures", {}) for r in results}
    if fig.get("cr", {}).get("checkpoint_s_median") is not None:
        c = fig["cr"]
        targets += [f"- Checkpoint apply->Succeeded {c['checkpoint_s_median']} s (target <= 1.0 s)",
                    f"- Restore apply->Succeeded {c['restore_s_median']} s (target <= 1.0 s)",
                    f"- agent overhead over gcrctl: checkpoint {c['agent_overhead_checkpoint_s']} s, restore "
                    f"{c['agent_overhead_restore_s']} s (target <= 0.3 s each)"]
    if fig.get("overcommit", {}).get("refused_to_success_s") is not None:
        targets.append(f"- overcommit: refused -> success {fig['overcommit']['refused_to_success_s']} s (target <= 1.5 s)")
    if fig.get("evict", {}).get("uncordon_to_first_iter_s") is not None:
        e = fig["evict"]
        targets.append(f"- eviction: uncordon -> first iteration {e['uncordon_to_first_iter_s']} s, cold start "
                       f"{e['cold_start_first_iter_s']} s (target: sooner)")
    if targets:
        lines += ["## Figures against the issue's targets (measurements, not pass/fail)", ""] + targets + [""]
    with open(os.path.join(OUTDIR, "report.md"), "w") as f:
        f.write("\n".join(lines))


def main(argv):
    # all: every scenario one GPU can run (tp needs two).
    names = [n for n in CASES if n != "tp"] if not argv or argv[0] == "all" else argv[0].split(",")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown scenario(s) {unknown}; known: {', '.join(CASES)}")
        return 2
    results = []
    path = os.path.join(OUTDIR, "results.jsonl")
    watch = ProbeWatch()
    for name in names:
        cost = COST[name][1 if STANDIN else 0]
        left = DEADLINE - now()
        if left < cost:
            log(f"NOT RUN {name}: {left:.0f} s left, it needs up to {cost} s")
            r = {"name": name, "ok": False, "not_run": True, "seconds": 0, "figures": {},
                 "error": f"not run: {left:.0f} s left of the call, it needs up to {cost} s"}
        else:
            log(f"=== {name}")
            fig, t = {}, now()
            try:
                CASES[name](fig)
                r = {"name": name, "ok": True, "seconds": round(now() - t, 1), "figures": fig}
                log(f"PASS {name} ({r['seconds']} s): {json.dumps(fig)[:1500]}")
            except Exception as e:  # reported; the next scenario runs
                r = {"name": name, "ok": False, "seconds": round(now() - t, 1), "figures": fig,
                     "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2500:]}"}
                log(f"FAIL {name} ({r['seconds']} s): {e}")
                traceback.print_exc()
            cleanup(name)
        r["mode"] = "standin" if STANDIN else "gpu"
        results.append(r)
        with open(path, "a") as f:
            f.write(json.dumps(r) + "\n")
        report(results)
    probes = watch.summary()
    log(probes)
    with open(os.path.join(OUTDIR, "report.md"), "a") as f:
        f.write(f"\n## Probes\n\n- {probes}\n")
    passed = sum(1 for r in results if r["ok"])
    failed = sum(1 for r in results if not r["ok"] and not r.get("not_run"))
    not_run = [r["name"] for r in results if r.get("not_run")]
    print(f"{passed} passed, {failed} failed" + (f" ({len(not_run)} not run for time: {', '.join(not_run)})" if not_run else ""))
    return 0 if failed == 0 and not not_run else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
