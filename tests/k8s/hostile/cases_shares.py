"""Shares per pod, room only for need and by namespace, input bounds (issue 33; docs/install.md,
"Shares per pod", "Input bounds"; docs/preemption.md, "Who may take room from whom").

Each case is an attack an ordinary user of one namespace makes with one opted-in pod (the tool
gcr-hostile in the workload image), and checks that another namespace's pod still gets what it
asks for, that the attacker alone was refused, told (an Event on its pod) and counted (the
agent's /metrics), and that the agent stayed up. The figures (times with and without an attack,
the agent's peak memory) are printed as FIGURE lines and in the tier's summary.

Fixes switched off to see a case fail (GCR_HOSTILE_E2E_SET, or the code reverted):
  hold_flood        shares.holdsPerPod=64
  registry_flood    shares.registryPerPod=1024 (the table), the sweep of dead pids (code)
  worker_pinning    shares.workersPerNamespace=4 with the stopped-process bound reverted (gcr_cr's stopped())
  room_without_need overcommit.unusedBackoffMs=-1
  room_other_namespace  overcommit.roomFrom.*={*}
  allocs_oversized  the table cap and parse budget (code)
  gpu_files         the bounded copy of gpu/ (code)
"""
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import test_node_e2e as N  # noqa: E402
import test_evict_e2e as E  # noqa: E402

check, kubectl, kjson, apply, wait_until, log = N.check, N.kubectl, N.kjson, N.apply, N.wait_until, N.log
CLASSES = {"gcr-hs-low": 10, "gcr-hs-high": 1000}
LIMIT_MIB = 256  # the chart's agent.resources.limits.memory


# ---- pods ----

def pod(ns, name, script, labels=None, prio=None, uid=0, grace=5, prestop=False, extra=None):
    """An opted-in pod (gpucr.dev/shim: the shim, its sockets) running script under sh."""
    spec = {"runtimeClassName": "nvidia", "restartPolicy": "Never", "terminationGracePeriodSeconds": grace,
            "securityContext": {"runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": uid != 0},
            "containers": [{
                "name": "main", "image": N.WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}, {"name": "GCR_LOG_LEVEL", "value": "info"}],
                "resources": {"limits": {"gpucr.dev/shim": "1"}},
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}
    if prio:
        spec["priorityClassName"] = prio
    if prestop:
        spec["containers"][0]["lifecycle"] = {"preStop": {"exec": {"command": [E.HOLD]}}}
    spec.update(extra or {})
    apply({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "labels": labels or {"case": name}}, "spec": spec})


def hostile(ns, name, args, labels=None, prio=None):
    """A pod running gcr-hostile ARGS (then idle): the attacker."""
    pod(ns, name, f"gcr-hostile {args}; echo EXIT $?; exec sleep 3600", labels=labels, prio=prio)
    wait_until(f"{ns}/{name} running", lambda: kjson("get", "pod", "-n", ns, name)["status"].get("phase") == "Running",
               120)


def testprog(ns, name, mib, buffers=3, labels=None, prio=None, uid=0, hold_after=False, extra_script=""):
    """gcr-testprog (mib MiB in buffers buffers) steered through /tmp/ctl; returns its first line,
    READY or ERROR (an allocation that failed)."""
    hold = " --hold-after" if hold_after else ""
    script = (f"touch /tmp/ctl; {extra_script}tail -f /tmp/ctl | {{ gcr-testprog --module {N.KERNELS} --mib {mib} "
              f"--buffers {buffers} --threads 1 --iters 3 --wait{hold}; echo EXIT $?; }}")
    pod(ns, name, script, labels=labels, prio=prio, uid=uid)
    return line(ns, name, r"^(READY|ERROR) ")


def ready(ns, name, *args, **kw):
    first = testprog(ns, name, *args, **kw)
    check(first.startswith("READY "), f"{ns}/{name}: {first}")
    f = dict(kv.split("=", 1) for kv in first.split()[1:])
    return int(f["pid"]), int(f["bytes"])


def logs(ns, name):
    return kubectl("logs", "-n", ns, name, check=False).stdout.splitlines()


def line(ns, name, pattern, timeout=120):
    rx = re.compile(pattern)
    return wait_until(f"{ns}/{name}: a line /{pattern}/", lambda: next((x for x in logs(ns, name) if rx.search(x)),
                                                                       None), timeout)


def last_line(ns, name, pattern):
    rx = re.compile(pattern)
    found = [x for x in logs(ns, name) if rx.search(x)]
    return found[-1] if found else None


def events(ns, name, reason):
    return [e for e in N.events_for(ns, name) if e.get("reason") == reason]


def told(ctx, ns, name, reason, has):
    """The Warning Event reason on pod ns/name whose note holds has."""
    ev = wait_until(f"a {reason} Event on {ns}/{name} ({has})", lambda: [
        e for e in events(ns, name, reason) if has in e.get("note", "")], 60)
    check(ev[0].get("type") == "Warning", f"{reason} is {ev[0].get('type')}")
    return ev[0].get("note", "")


def share_of(ctx, table):
    return int(ctx.metric("gcr_agent_share_per_owner", table=table) or 0)


def refused(ctx, table):
    return ctx.metric("gcr_agent_share_refused_total", table=table) or 0


def classes():
    for name, value in CLASSES.items():
        apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
               "value": value, "preemptionPolicy": "Never", "description": "GCR hostile tier"})


def stop(ns, podname, pid, sig="STOP"):
    """kill -SIG pid inside the pod (the shell's kill: the image has no kill binary)."""
    kubectl("exec", "-n", ns, podname, "--", "sh", "-c", f"kill -{sig} {pid}", check=sig == "STOP")


def checkpoint(ns, name, podname, spec=None):
    apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Checkpoint", "metadata": {"name": name, "namespace": ns},
           "spec": dict({"podName": podname}, **(spec or {}))})


def restore(ns, name, ck):
    apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Restore", "metadata": {"name": name, "namespace": ns},
           "spec": {"checkpointName": ck}})


def timed_cr(ns, podname, pid, nbytes, tag):
    """A Checkpoint and a Restore of podname, each timed from its creation to Succeeded (the
    user's view: the agent's queue included); the process suspended, then back with its memory."""
    t0 = time.monotonic()
    checkpoint(ns, f"ck-{tag}", podname)
    N.wait_phase("checkpoint", ns, f"ck-{tag}", timeout=120)
    t_ck = time.monotonic() - t0
    check(N.smi(ns, podname, "mem", pid) == "0", f"{podname}: GPU memory while suspended")
    t0 = time.monotonic()
    restore(ns, f"rs-{tag}", f"ck-{tag}")
    N.wait_phase("restore", ns, f"rs-{tag}", timeout=120)
    t_rs = time.monotonic() - t0
    check(int(N.smi(ns, podname, "mem", pid)) >= nbytes, f"{podname}: its memory did not come back")
    return t_ck, t_rs


def agent_proc():
    """The host pid of the agent (gcr-agent in the agent pod's cgroup)."""
    a = N.agent_ready()
    uid = a["metadata"]["uid"]
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/comm") as f:
                if f.read().strip() != "gcr-agent":
                    continue
            with open(f"/proc/{d}/cgroup") as f:
                cg = f.read()
            if uid in cg or uid.replace("-", "_") in cg:
                return int(d)
        except OSError:
            continue
    raise AssertionError("no gcr-agent process of the agent pod")


def vm_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for x in f:
            if x.startswith(field + ":"):
                return int(x.split()[1])
    return 0


def restarts():
    a = N.agent_ready()
    return sum(c.get("restartCount", 0) for c in a["status"].get("containerStatuses", []))


def agent_same(apid, r0):
    """The agent process and container that were there at the start: no OOM kill, no restart."""
    a = N.agent_ready()
    last = [c.get("lastState", {}).get("terminated", {}) for c in a["status"].get("containerStatuses", [])]
    check(restarts() == r0 and agent_proc() == apid, f"the agent restarted: {[t for t in last if t]}")


def agent_lines(ctx, pattern):
    rx = re.compile(pattern)
    return [x for x in ctx.agent_log() if rx.search(x)]


# ---- cases ----

def case_hold_flood(ctx):
    """One pod keeps 64 connections open to gcr-hold's socket (never sending a line, reopening
    each as soon as the agent closes it): it holds its share of the node's 64 eviction holds, the
    rest are refused to it alone (Event ShareExhausted, gcr_agent_share_refused_total{table="holds"});
    a pod of another namespace drained meanwhile is still imaged within its grace period."""
    a, b = ctx.namespace("hs-holds-a"), ctx.namespace("hs-holds-b")
    share, before = share_of(ctx, "holds"), refused(ctx, "holds")
    hostile(a, "flood", "holds 64 120")
    wait_until("the flood holding its share of the holds", lambda: (ctx.metric(
        "gcr_agent_share_in_use", table="holds") or 0) >= share, 60)
    podname, _, _ = E.deployment(b, "web")
    uid = kjson("get", "pod", "-n", b, podname)["metadata"]["uid"]
    ck = E.ck_name(podname, uid)
    t0 = time.monotonic()
    E.drained("app=web")
    s = wait_until(f"Checkpoint {b}/{ck} final", lambda: (st := kjson("get", "checkpoint", "-n", b, ck).get(
        "status", {})).get("phase") in ("Succeeded", "Failed") and st, 120)
    took = time.monotonic() - t0
    check(s.get("phase") == "Succeeded", f"the victim's eviction image: {s.get('phase')}: {s.get('message')}")
    check(events(b, podname, "EvictionImageWritten"), "no EvictionImageWritten Event on the drained pod")
    note = told(ctx, a, "flood", "ShareExhausted", "eviction holds")
    n = refused(ctx, "holds") - before  # the flood, refused past its share
    check(n >= 1, "no refusal counted")
    check(agent_lines(ctx, r"share: pod [0-9a-f-]+: eviction holds .* refused"), "no log line of the refusal")
    ctx.figure(f"hold flood: {share} holds per pod; the flood refused {n:.0f} times; another namespace's drained pod "
               f"imaged in {took:.1f} s (drain to Checkpoint Succeeded)")
    log(f"attacker told: {note}")


def case_registry_flood(ctx):
    """One pod's process starts 1100 children that each register on the agent's registry socket
    (the parent keeps their connections): the pod holds its share of the node's 1024 entries,
    the rest are refused to it alone; a process of another namespace started afterwards is still
    registered and its Checkpoint and Restore succeed. Then children that register and exit at
    once (the audit's): their entries are dropped although the parent holds their connections."""
    a, b = ctx.namespace("hs-reg-a"), ctx.namespace("hs-reg-b")
    share, before = share_of(ctx, "registry"), refused(ctx, "registry")
    hostile(a, "flood", "register 1100 150")
    # Once the agent has taken every connection from its socket's queue, the flood holds its share.
    first = wait_until("the flood's registrations all answered", lambda: (x := last_line(
        a, "flood", r"^REGISTER children=1100 held=")) and int(re.search(r"held=(\d+)", x).group(1)) <= share and x,
        120)
    held = int(re.search(r"held=(\d+)", first).group(1))
    pid, nbytes = N.workload_pod(b, "app", 1000)
    t_ck, t_rs = timed_cr(b, "app", pid, nbytes, "flood")
    N.finish(b, "app")
    n = refused(ctx, "registry") - before
    check(n >= 1100 - share, f"{n:.0f} registrations refused, {1100 - share} expected")
    told(ctx, a, "flood", "ShareExhausted", "registered processes")
    hostile(a, "kids", "register 200 25 exit")
    last = wait_until("the short-lived children's entries dropped", lambda: (x := last_line(
        a, "kids", r"^REGISTER children=200 held=")) and "held=0 " in x and x, 60)
    ctx.figure(f"registry flood: {share} entries per pod, the flood kept {held} of 1100; another namespace's "
               f"Checkpoint {t_ck:.1f} s, Restore {t_rs:.1f} s; 200 short-lived children: {last}")


def case_worker_pinning(ctx):
    """Four pods of one namespace stop their own processes and ask for Checkpoints of them (one
    hour's timeout). Two fixes stand between them and the node's workers: a stopped process is
    named at once and its Checkpoint fails without waiting (gcr_cr; cases_crash stopped_processes),
    and whatever still waits holds at most its namespace's share of the workers (half of
    agent.maxParallel; the rest wait, told by a Warning Event WorkerShareUsed). Either way a pod
    of another namespace is checkpointed and restored as without them, and never more than the
    share of the namespace's Checkpoints run at once."""
    a, b = ctx.namespace("hs-work-a"), ctx.namespace("hs-work-b")
    share = share_of(ctx, "workers")
    cap = int(ctx.metric("gcr_agent_share_capacity", table="workers") or 0)
    pids = {}
    for i in range(4):
        pids[f"s{i}"] = ready(a, f"s{i}", 32, uid=0)[0]
    for p, hp in pids.items():
        stop(a, p, hp)  # the process stops itself, as far as the agent can tell
        checkpoint(a, p, p, {"timeoutSeconds": 3600})

    def phases():
        return {p: kjson("get", "checkpoint", "-n", a, p).get("status", {}) for p in pids}
    # Each either failed at once naming the stop, or runs (at most the share of them).
    wait_until(f"namespace {a}'s Checkpoints failed or {share} of them Running", lambda: (st := phases()) and (
        sum(x.get("phase") == "Running" for x in st.values()) >= share or
        all(x.get("phase") in ("Running", "Failed") for x in st.values())) and st, 60)
    pid, nbytes = N.workload_pod(b, "app", 1000)
    t_ck, t_rs = timed_cr(b, "app", pid, nbytes, "pinned")
    st = phases()
    running = sum(x.get("phase") == "Running" for x in st.values())
    failed = [p for p, x in st.items() if x.get("phase") == "Failed"]
    check(running <= share, f"{running} of namespace {a}'s Checkpoints run at once, more than its share {share}")
    for p in failed:
        check("stopped (state T" in (st[p].get("message") or ""), f"Checkpoint {p} failed for another reason: "
              f"{st[p].get('message')}")
    note = "none waited: each failed at once, naming the stopped process"
    if len(failed) + running < len(pids):  # some wait for a worker: told so
        note = wait_until("a WorkerShareUsed Event", lambda: next((e.get("note") for p in pids for e in events(
            a, p, "WorkerShareUsed")), None), 60)
    N.finish(b, "app")
    for p, hp in pids.items():
        stop(a, p, hp, "CONT")
    ctx.figure(f"worker pinning: {share} of {cap} workers per namespace; 4 stopped processes' Checkpoints in one "
               f"namespace ({running} running, {len(failed)} failed at once), another namespace's Checkpoint "
               f"{t_ck:.1f} s, Restore {t_rs:.1f} s")
    log(f"the stopped ones' Checkpoints: {note}")


def case_room_without_need(ctx):
    """A high-priority pod whose process holds no GPU memory asks for 256 MiB of room every 2.5 s
    for 30 s and never allocates: the first request suspends the low-priority pod (which holds
    the GPU), the room is not used within 3 s, so the asker loses its priority for
    overcommit.unusedBackoffMs (Event OvercommitRoomUnused) and the low pod resumes at once; its
    later requests are refused. The low pod is suspended once, not at every request (the audit: 8
    times in 30 s), and its data is bit-exact at the end."""
    classes()
    ns = ctx.namespace("hs-need")
    lpid, lbytes = ready(ns, "low", 384, buffers=4, labels={"gpucr.dev/overcommit": "suspend"}, prio="gcr-hs-low",
                         hold_after=True)
    hostile(ns, "asker", "room 268435456 12 2500", labels={"gpucr.dev/overcommit": "suspend"}, prio="gcr-hs-high")
    summary = line(ns, "asker", r"^ROOM sent=", 90)
    text = ctx.metrics()
    m = re.search(r'^gcr_agent_overcommit_suspensions_total\{pod="%s/low"\} (\S+)$' % re.escape(ns), text, re.M)
    n = float(m.group(1)) if m else 0
    check(1 <= n <= 2, f"the low pod was suspended {n:.0f} times for a pod that used no room ({summary})")
    told(ctx, ns, "asker", "OvercommitRoomUnused", "did not use it")
    granted = int(re.search(r"granted=(\d+)", summary).group(1))
    check(granted <= 2, f"the asker was granted room {granted} times: {summary}")
    wait_until("the low pod running", lambda: N.smi(ns, "low", "state", lpid) == "running", 60)
    check(int(N.smi(ns, "low", "mem", lpid)) >= lbytes, "the low pod's memory did not come back")
    N.finish(ns, "low")
    ctx.figure(f"room without need: 12 requests for 256 MiB in 30 s from a pod holding none: the low pod suspended "
               f"{n:.0f} time(s); {summary}")


def case_room_other_namespace(ctx):
    """A pod of a high PriorityClass runs out of GPU memory while a low-priority pod of another
    namespace holds it: with overcommit.roomFrom's default (each namespace from itself only) the
    other namespace's pod is not suspended, the allocation fails as without GCR, and the
    requester is told why (Event OvercommitRoomRefused naming overcommit.roomFrom)."""
    classes()
    a, b = ctx.namespace("hs-room-a"), ctx.namespace("hs-room-b")
    lpid, lbytes = ready(b, "low", 384, buffers=4, labels={"gpucr.dev/overcommit": "suspend"}, prio="gcr-hs-low")
    first = testprog(a, "high", 256, buffers=2, labels={"gpucr.dev/overcommit": "suspend"}, prio="gcr-hs-high")
    check(first.startswith("ERROR ") and "OUT_OF_MEMORY" in first, f"{a}/high: {first} (room taken from {b}?)")
    check(N.smi(b, "low", "state", lpid) == "running" and int(N.smi(b, "low", "mem", lpid)) >= lbytes,
          f"{b}/low was touched")
    check(not events(b, "low", "OvercommitSuspended"), f"{b}/low suspended for another namespace")
    note = told(ctx, a, "high", "OvercommitRoomRefused", "overcommit.roomFrom")
    N.finish(b, "low")
    log(f"requester told: {note}")


def image_kubelet(ns, name, podname, timeout=180):
    checkpoint(ns, name, podname, {"action": "Image", "cpuCheckpoint": "Kubelet", "containerName": "main"})
    return N.wait_phase("checkpoint", ns, name, ("Succeeded", "Failed"), timeout=timeout)


def case_allocs_oversized(ctx):
    """A pod's process swaps its gpu/allocs.json (the table the agent copies into a Kubelet-route
    image) for a 40 MB one right after its own shim read it back (the audit's: the agent went to
    807 MiB, past its 256 MiB limit): refused unread (-EFBIG), the agent up, its peak RSS under
    the limit. Then the largest table allowed (6 MiB of all-zero chunks, the costliest that
    parses): parsed within the budget; the agent's peak RSS (VmHWM) is the figure."""
    ns = ctx.namespace("hs-allocs")
    apid, r0 = agent_proc(), restarts()
    hwm0 = vm_kib(apid, "VmHWM")
    plant = "gcr-hostile table objects 40000000 /tmp/big.json >/dev/null; "
    plant += "( gcr-hostile plant \"$GCR_SOCKET_DIR\" 300 table /tmp/big.json > /tmp/plant.log 2>&1 & ); "
    ready(ns, "big", 48, extra_script=plant)
    phase = image_kubelet(ns, "big", "big")
    msg = kjson("get", "checkpoint", "-n", ns, "big")["status"].get("message", "")
    planted = kubectl("exec", "-n", ns, "big", "--", "cat", "/tmp/plant.log", check=False).stdout.strip()
    check("PLANT table" in planted, f"the table was not planted: {planted}")
    agent_same(apid, r0)
    check(phase == "Failed" and "more than" in msg, f"a 40 MB table: {phase}: {msg}")
    hwm1 = vm_kib(apid, "VmHWM")
    check(hwm1 < LIMIT_MIB * 1024, f"the agent's peak RSS {hwm1 >> 10} MiB")
    # The largest allowed: parsed, within the budget.
    plant = "gcr-hostile table zero 6291000 /tmp/cap.json >/dev/null; "
    plant += "( gcr-hostile plant \"$GCR_SOCKET_DIR\" 300 table /tmp/cap.json > /tmp/plant.log 2>&1 & ); "
    ready(ns, "cap", 48, extra_script=plant)
    phase2 = image_kubelet(ns, "cap", "cap")
    msg2 = kjson("get", "checkpoint", "-n", ns, "cap")["status"].get("message", "")
    agent_same(apid, r0)
    hwm2 = vm_kib(apid, "VmHWM")
    check(hwm2 < LIMIT_MIB * 1024, f"the agent's peak RSS {hwm2 >> 10} MiB with the largest table allowed")
    ctx.figure(f"agent RSS: peak {hwm0 >> 10} MiB before, {hwm1 >> 10} MiB after a 40 MB allocs.json (refused: "
               f"{msg[:120]}), {hwm2 >> 10} MiB after the largest allowed (6 MiB of all-zero chunks: {phase2}); "
               f"the chart's limit {LIMIT_MIB} MiB")
    log(f"the 6 MiB table's Checkpoint: {phase2}: {msg2[:300]}")


def case_gpu_files(ctx):
    """A pod's process puts a sparse 512 MiB file (a few KiB of its disk) beside its GPU data
    files before the agent copies them into a Kubelet-route image (the audit's 12 KB sparse file
    filled a 256 MiB filesystem): refused, nothing of it written to the node's images directory;
    the process runs on."""
    ns = ctx.namespace("hs-files")
    images = os.path.join(E.IMAGES, ns)
    plant = "( gcr-hostile plant \"$GCR_SOCKET_DIR\" 300 sparse 536870912 > /tmp/plant.log 2>&1 & ); "
    pid, nbytes = ready(ns, "sparse", 48, extra_script=plant)
    free0 = os.statvfs(E.IMAGES).f_bavail * os.statvfs(E.IMAGES).f_frsize
    phase = image_kubelet(ns, "sparse", "sparse")
    msg = kjson("get", "checkpoint", "-n", ns, "sparse")["status"].get("message", "")
    planted = kubectl("exec", "-n", ns, "sparse", "--", "cat", "/tmp/plant.log", check=False).stdout.strip()
    check("PLANT sparse" in planted, f"the sparse file was not planted: {planted}")
    free1 = os.statvfs(E.IMAGES).f_bavail * os.statvfs(E.IMAGES).f_frsize
    used = 0
    for root, _, files in os.walk(images):
        used += sum(os.lstat(os.path.join(root, f)).st_blocks * 512 for f in files)
    check(phase == "Failed" and "filler.bin" in msg, f"a sparse file beside the data: {phase}: {msg}")
    check(used < 64 << 20 and free0 - free1 < 256 << 20, f"{used >> 20} MiB in {images}, the disk "
          f"{(free0 - free1) >> 20} MiB fuller")
    check(N.smi(ns, "sparse", "state", pid) == "running" and int(N.smi(ns, "sparse", "mem", pid)) >= nbytes,
          "the process does not run on with its memory")
    N.finish(ns, "sparse")
    ctx.figure(f"gpu/ files: a sparse 512 MiB file refused ({msg[:160]}); {used >> 20} MiB written")


def case_honest_under_attack(ctx):
    """An honest namespace's Checkpoint, Restore, overcommit room and eviction image, timed, then
    again while one hostile pod exhausts every share it can at once (its registry entries, its
    eviction holds, its room requests, a worker held by its own stopped process): each still
    succeeds. The times before and under attack are the figures."""
    classes()
    h, x = ctx.namespace("hs-honest"), ctx.namespace("hs-attacker")

    def round_(tag):
        """The four operations of the honest namespace; their times in seconds."""
        out = {}
        pid, nbytes = N.workload_pod(h, f"cr-{tag}", 1000)
        out["checkpoint"], out["restore"] = timed_cr(h, f"cr-{tag}", pid, nbytes, tag)
        N.finish(h, f"cr-{tag}")
        # Overcommit: the honest high pod allocates past the honest low pod (192 + 384 MiB of 512).
        lpid, _ = ready(h, f"low-{tag}", 192, buffers=2, labels={"gpucr.dev/overcommit": "suspend"},
                        prio="gcr-hs-low")
        first = testprog(h, f"high-{tag}", 384, buffers=4, labels={"gpucr.dev/overcommit": "suspend"},
                         prio="gcr-hs-high")
        check(first.startswith("READY "), f"{h}/high-{tag}: {first}")
        check(N.smi(h, f"low-{tag}", "state", lpid) == "checkpointed", f"{h}/low-{tag} was not suspended for room")
        shim = line(h, f"high-{tag}", r"room for \d+ bytes .*made by the agent in", 30)
        out["room"] = float(re.search(r"made by the agent in (\d+(\.\d+)?) ms", shim).group(1)) / 1000
        kubectl("delete", "pod", "-n", h, f"high-{tag}", f"low-{tag}", "--wait=true", timeout=120)
        # The eviction image of a drained pod.
        podname, _, _ = E.deployment(h, f"web-{tag}")
        uid = kjson("get", "pod", "-n", h, podname)["metadata"]["uid"]
        ck = E.ck_name(podname, uid)
        t0 = time.monotonic()
        E.drained(f"app=web-{tag}")
        s = wait_until(f"Checkpoint {h}/{ck} final", lambda: (st := kjson("get", "checkpoint", "-n", h, ck).get(
            "status", {})).get("phase") in ("Succeeded", "Failed") and st, 120)
        check(s.get("phase") == "Succeeded", f"{tag}: the eviction image: {s.get('phase')}: {s.get('message')}")
        out["eviction"] = time.monotonic() - t0
        kubectl("delete", "deployment", "-n", h, f"web-{tag}", "--wait=true", timeout=120)
        return out

    before = round_("before")
    log(f"before the attack: {before}")
    # The attacker: one pod, every share it can take at once.
    r0 = {t: refused(ctx, t) for t in ("registry", "holds", "room")}
    script = (f"touch /tmp/ctl; (tail -f /tmp/ctl | gcr-testprog --module {N.KERNELS} --mib 32 --buffers 1 "
              "--threads 1 --iters 3 --wait > /tmp/prog.log 2>&1 &); "
              "until grep -q '^READY' /tmp/prog.log; do sleep 0.2; done; cat /tmp/prog.log; "
              "gcr-hostile register 1100 900 > /tmp/reg.log 2>&1 & gcr-hostile holds 64 900 > /tmp/holds.log 2>&1 & "
              "while :; do gcr-hostile room 268435456 64 0 > /tmp/room.log 2>&1; done")
    pod(x, "attacker", script, labels={"gpucr.dev/overcommit": "suspend"}, prio="gcr-hs-high")
    apid = int(line(x, "attacker", r"^READY ").split("pid=")[1].split()[0])
    stop(x, "attacker", apid)
    checkpoint(x, "pin", "attacker", {"timeoutSeconds": 3600})
    wait_until("the attacker's Checkpoint holding a worker", lambda: kjson("get", "checkpoint", "-n", x, "pin").get(
        "status", {}).get("phase") == "Running", 60)
    wait_until("the attacker's floods under way", lambda: "REGISTER children=1100" in kubectl(
        "exec", "-n", x, "attacker", "--", "cat", "/tmp/reg.log", check=False).stdout and (ctx.metric(
            "gcr_agent_share_in_use", table="holds") or 0) >= share_of(ctx, "holds"), 120)
    under = round_("under")
    check(all(refused(ctx, t) > r0[t] for t in r0), f"the attacker was not refused in every table: "
          f"{ {t: refused(ctx, t) - r0[t] for t in r0} }")
    log(f"under attack: {under}")
    for t in r0:
        log(f"attacker refused in {t}: {refused(ctx, t) - r0[t]:.0f} times")
    stop(x, "attacker", apid, "CONT")
    keys = ("checkpoint", "restore", "room", "eviction")
    ctx.figure("honest pod before / under attack (s): " +
               ", ".join(f"{k} {before[k]:.2f} / {under[k]:.2f}" for k in keys))


CASES = [
    ("hold_flood", case_hold_flood),
    ("registry_flood", case_registry_flood),
    ("worker_pinning", case_worker_pinning),
    ("room_without_need", case_room_without_need),
    ("room_other_namespace", case_room_other_namespace),
    ("allocs_oversized", case_allocs_oversized),
    ("gpu_files", case_gpu_files),
    ("honest_under_attack", case_honest_under_attack),
]
