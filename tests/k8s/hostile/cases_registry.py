"""Issue 33, the node's checkpoint-image registry and shared images, as a hostile tenant tries them
(tier k8s-hostile; docs/install.md, "The image registry and shared images").

The attacker's processes run on the node's host network here (this test, root on the test bed's
node, and a child of it as uid 65534): what a hostNetwork pod of the cluster has, network-wise.
Cases:
  case_port_squat                 127.0.0.1:5055 taken while the agent restarts (a TLS impostor with
                                  its own certificate): the agent runs on and says so, containerd
                                  sends the impostor no request (no token), and once the port is
                                  free the image is pulled and restored
  case_idle_flood                 300 idle connections of root and 300 of another user, renewed as
                                  they drop: an honest pull (a pod from a published reference) still
                                  runs; its time with and without the flood
  case_token_hidden               the token of a published reference is in status.image.reference
                                  only: not the message, no Event, not the agent's log
  case_cached_image_not_startable a pulled checkpoint image leaves the node's image store: a pod of
                                  another namespace naming it (IfNotPresent) must pull, and cannot
                                  once the token is gone
  case_tampered_shared_image      images.shared: a byte of gpu/ changed with its chunk's CRC-32C
                                  kept (a writer of the share): the Restore is refused, naming it
"""
import json
import os
import re
import socket
import ssl
import subprocess
import tempfile
import threading
import time

import registry_client as R

PORT = 5055


def store_names(ctx):
    """The names in the node's image store under the registry's repository (ctr on the node's
    containerd, at the CRI socket's path)."""
    ctr = [os.path.join(ctx.N.ENV["GCR_TESTBED_CTRD"], "ctr"), "--address", "/run/containerd/containerd.sock",
           "-n", "k8s.io"]
    out = ctx.N.run(ctr + ["images", "ls", "-q"], timeout=60).stdout
    return [l for l in out.splitlines() if l.startswith(f"127.0.0.1:{PORT}/gcr-evict/")]


def published(ctx, ns, ck="snap"):
    """A uid-0 workload pod imaged by a Kubelet Checkpoint (status.image.reference published), then
    deleted (the stand-in driver's pool slot its restore needs is free again). (reference, token)."""
    N = ctx.N
    N.workload_pod(ns, "src", 0)
    ctx.apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Checkpoint", "metadata": {"name": ck, "namespace": ns},
               "spec": {"podName": "src", "action": "Image", "cpuCheckpoint": "Kubelet"}})
    N.wait_phase("checkpoint", ns, ck, timeout=180)
    ref = ctx.kjson("get", "checkpoint", "-n", ns, ck)["status"].get("image", {}).get("reference", "")
    ctx.check(ref.startswith(f"127.0.0.1:{PORT}/gcr-evict/{ns}/{ck}:"), f"no published reference: {ref!r}")
    ctx.kubectl("delete", "pod", "-n", ns, "src", "--wait=true", timeout=90)
    return ref, ref.rsplit(":", 1)[1]


def container_state(ctx, ns, pod):
    """The pod's container state ({} until it has one)."""
    p = ctx.kjson("get", "pod", "-n", ns, pod)
    cs = p.get("status", {}).get("containerStatuses") or [{}]
    return cs[0].get("state", {})


def wait_running(ctx, ns, pod, timeout):
    return ctx.wait_until(f"pod {ns}/{pod} running", lambda: "running" in container_state(ctx, ns, pod), timeout)


def gone(ctx, ns, pod):
    ctx.kubectl("delete", "pod", "-n", ns, pod, "--wait=true", "--ignore-not-found", timeout=120)


def agent_pods(ctx):
    return [p for p in ctx.N.agent_pod() if not p["metadata"].get("deletionTimestamp")]


def agent_metric(ctx, pod, name):
    """One sample of pod's /metrics without waiting for it to be Ready."""
    text = ctx.kubectl("get", "--raw", f"/api/v1/namespaces/{ctx.N.SYSTEM_NS}/pods/{pod}:9464/proxy/metrics",
                       check=False).stdout
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


# ---- the port taken ----

class Squatter(threading.Thread):
    """Takes 127.0.0.1:PORT as soon as it is free (tries every 2 ms), then answers like a registry:
    TLS with a certificate of its own for 127.0.0.1 (an impostor: it can serve any image), plain
    HTTP otherwise. Records every byte it is sent and every request it decrypts."""

    def __init__(self, certdir):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.bound = threading.Event()
        self.raw, self.requests, self.conns, self.tls_failures = [], [], 0, 0
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        crt, key = os.path.join(certdir, "sq.crt"), os.path.join(certdir, "sq.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-keyout", key, "-out", crt, "-days", "2", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
        self.ctx.load_cert_chain(crt, key)

    def run(self):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        while not self.stop.is_set():
            try:
                s.bind(("127.0.0.1", PORT))
                break
            except OSError:
                time.sleep(0.002)
        if self.stop.is_set():
            s.close()
            return
        s.listen(64)
        s.settimeout(0.2)
        self.bound.set()
        while not self.stop.is_set():
            try:
                c, _ = s.accept()
            except socket.timeout:
                continue
            self.conns += 1
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()
        s.close()

    def serve(self, c):
        c.settimeout(5)
        try:
            first = c.recv(5, socket.MSG_PEEK)
            self.raw.append(first)
            if first[:1] == b"\x16":  # a TLS ClientHello
                try:
                    t = self.ctx.wrap_socket(c, server_side=True)
                except (ssl.SSLError, OSError):
                    self.tls_failures += 1
                    return
                req = t.recv(65536)
                self.requests.append(req)
                t.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{}\n")
            else:
                data = c.recv(65536)
                self.raw.append(data)
                self.requests.append(data)
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n{}\n")
        except OSError:
            pass
        finally:
            c.close()


def restored_pod(ctx, ns, name, ref):
    ctx.N.restored_pod(ns, name, ref, pull="IfNotPresent")


def case_port_squat(ctx):
    """The registry's port taken by an impostor while the agent restarts: the agent keeps running (no
    restart), logs who holds the port, writes RegistryPortTaken on its pod, reports it in /metrics and
    is not Ready; containerd's pull reaches the impostor and sends it nothing (TLS to the agent's CA
    only), so no token; once the port is free the agent serves again and a new pod from the same
    reference is pulled and restored."""
    ns = ctx.namespace("hostile-squat")
    ref, token = published(ctx, ns)
    old = agent_pods(ctx)[0]
    with tempfile.TemporaryDirectory() as d:
        sq = Squatter(d)
        sq.start()
        try:
            ctx.kubectl("delete", "pod", "-n", ctx.N.SYSTEM_NS, old["metadata"]["name"], "--wait=false")
            ctx.check(sq.bound.wait(120), "the old agent never let the port go")
            ctx.log(f"squatter holds 127.0.0.1:{PORT} (pid {os.getpid()})")
            new = ctx.wait_until("the new agent running", lambda: next(
                (p for p in agent_pods(ctx) if p["metadata"]["uid"] != old["metadata"]["uid"] and
                 "running" in (p.get("status", {}).get("containerStatuses") or [{}])[0].get("state", {})), None), 180)
            name = new["metadata"]["name"]

            def restarts():
                p = next((x for x in agent_pods(ctx) if x["metadata"]["name"] == name), {})
                return (p.get("status", {}).get("containerStatuses") or [{}])[0].get("restartCount", 0)
            # Either it says who holds the port and runs on, or (before the fix) it exits.
            ctx.wait_until("the agent's log naming the port's holder, or its exit", lambda: restarts() > 0 or any(
                f"is taken by pid {os.getpid()}" in l for l in ctx.agent_log(pod=new)), 90)
            ctx.check(restarts() == 0, f"the agent exited while its port was taken ({restarts()} restarts)")
            ctx.wait_until("Event RegistryPortTaken on the agent's pod", lambda: any(
                e.get("reason") == "RegistryPortTaken" for e in ctx.N.events_for(ctx.N.SYSTEM_NS, name)), 60)
            ctx.check(agent_metric(ctx, name, "gcr_agent_image_registry_listening") == 0.0,
                      "gcr_agent_image_registry_listening is not 0 while the port is taken")
            ctx.check((agent_metric(ctx, name, "gcr_agent_image_registry_bind_failures_total") or 0) >= 1,
                      "no bind failure counted")
            # A pull meanwhile: containerd reaches the impostor and stops at its certificate.
            restored_pod(ctx, ns, "during", ref)
            ctx.wait_until("the pull refused while the port is taken", lambda: any(
                e.get("reason") == "Failed" for e in ctx.N.events_for(ns, "during")), 90)
            ctx.check("running" not in container_state(ctx, ns, "during"), "a pod ran from the impostor")
            p = next(x for x in agent_pods(ctx) if x["metadata"]["name"] == name)
            ready = {c["type"]: c["status"] for c in p["status"].get("conditions", [])}.get("Ready")
            ctx.check(restarts() == 0, f"the agent restarted {restarts()} times while the port was taken")
            ctx.check(ready != "True", "the agent is Ready without its registry's port")
            why = [e.get("note", "") for e in ctx.N.events_for(ns, "during") if e.get("reason") == "Failed"]
            ctx.log(f"the pull meanwhile: {why[0][:300] if why else '?'}")
            ctx.check(sq.conns >= 1, "containerd never reached the impostor (the test proves nothing)")
        finally:
            sq.stop.set()
            sq.join(10)
        seen = b"".join(sq.raw) + b"".join(sq.requests)
        ctx.check(token.encode() not in seen and not sq.requests,
                  f"the impostor received {len(sq.requests)} request(s): {sq.requests[:2]!r}")
        ctx.log(f"impostor: {sq.conns} connection(s), {sq.tls_failures} TLS handshake(s) refused by containerd, "
                f"no request, no token")
    gone(ctx, ns, "during")
    t0 = time.monotonic()
    ctx.agent(timeout=120)  # Ready again: the port is its own
    ctx.figure(f"the agent had the port back {time.monotonic() - t0:.1f} s after the impostor left")
    restored_pod(ctx, ns, "after", ref)
    wait_running(ctx, ns, "after", 120)
    p = agent_pods(ctx)[0]
    ctx.check((p["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0) == 0,
              "the agent restarted at some point")


# ---- idle connections ----

def hold(stop, n, uid=None, made=None):
    """Keeps n idle connections to the registry open until stop, replacing those the agent closes
    (in a child as uid when given; made[0] counts the connections opened). Returns the child's pid
    or the thread."""
    def loop():
        conns = []
        while not stop():
            conns = [c for c in conns if not _closed(c)]
            while len(conns) < n:
                try:
                    c = socket.create_connection(("127.0.0.1", PORT), timeout=2)
                    c.setblocking(False)
                    conns.append(c)
                    if made is not None:
                        made[0] += 1
                except OSError:
                    break
            time.sleep(0.05)  # the pace of the flood's renewal, not a synchronisation
        for c in conns:
            c.close()
    if uid is None:
        t = threading.Thread(target=loop, daemon=True)
        t.start()
        return t
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(uid)
            os.setuid(uid)
            loop()
        finally:
            os._exit(0)
    return pid


def _closed(c):
    try:
        return c.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def pull_time(ctx, ns, pod, ref, timeout=90):
    """Seconds from creating pod (from ref, imagePullPolicy Always: the kubelet asks the registry
    whatever the node's store holds) to its container running (pulled and restored)."""
    t0 = time.monotonic()
    ctx.N.restored_pod(ns, pod, ref, pull="Always")
    wait_running(ctx, ns, pod, timeout)
    return time.monotonic() - t0


def case_idle_flood(ctx):
    """Idle connections of root and of another user, renewed as the agent drops them, do not keep an
    honest pull out: a pod from a published reference is pulled and restored under the flood."""
    ns = ctx.namespace("hostile-flood")
    ref, _ = published(ctx, ns)
    before = pull_time(ctx, ns, "before", ref)
    gone(ctx, ns, "before")
    name = ctx.agent()["metadata"]["name"]
    ev0 = agent_metric(ctx, name, 'gcr_agent_image_registry_connections_total{outcome="evicted"}') or 0
    done, made = threading.Event(), [0]
    child = hold(lambda: False, 300, uid=65534)  # forked before this process starts threads
    t = hold(done.is_set, 300, made=made)
    try:
        ctx.wait_until("the flood under way (connections opened by root)", lambda: made[0] >= 64, 60)
        under = pull_time(ctx, ns, "under", ref, timeout=60)
    finally:
        done.set()
        os.kill(child, 9)
        os.waitpid(child, 0)
        t.join(10)
    ev = (agent_metric(ctx, name, 'gcr_agent_image_registry_connections_total{outcome="evicted"}') or 0) - ev0
    ctx.figure(f"a pod from a checkpoint image created to running: {before:.1f} s alone, {under:.1f} s under 600 "
               f"idle connections ({ev:.0f} of the flood's connections dropped for others)")


# ---- the token ----

def case_token_hidden(ctx):
    """A published reference's token: in status.image.reference, not in the message, no Event of the
    namespace or the agent's pod, no line of the agent's log, even after a pull and a wrong token."""
    ns = ctx.namespace("hostile-token")
    ref, token = published(ctx, ns)
    st = ctx.kjson("get", "checkpoint", "-n", ns, "snap")["status"]
    ctx.check(token not in json.dumps({k: v for k, v in st.items() if k != "image"}),
              f"the token outside status.image: {st.get('message')}")
    ctx.check(token not in json.dumps(st["image"].get("path", "")), "the token in the image path")
    restored_pod(ctx, ns, "dst", ref)
    wait_running(ctx, ns, "dst", 120)
    code, _, _ = R.request(PORT, f"/v2/gcr-evict/{ns}/snap/manifests/{'0' * 32}")
    ctx.check(code == 404, f"a wrong token answered {code}")
    ours = [e for e in ctx.kjson("get", "events.events.k8s.io", "-n", ns)["items"]
            if e.get("reportingController") == "gpucr.dev/gcr-agent"]
    ctx.check(ours, "no Event of the agent to look at")
    ctx.check(not [e for e in ours if token in e.get("note", "")], "an Event of the agent carries the token")
    agent = [e for e in ctx.kjson("get", "events.events.k8s.io", "-n", ctx.N.SYSTEM_NS)["items"]]
    ctx.check(not [e for e in agent if token in e.get("note", "")], "an Event in the agent's namespace carries it")
    lines = ctx.agent_log()
    ctx.check(any("manifest of Checkpoint" in l for l in lines), "the agent's log does not show the pull")
    ctx.check(not [l for l in lines if token in l], "the agent's log carries the token")


# ---- the node's image store ----

def case_cached_image_not_startable(ctx):
    """Once a pod was created from a checkpoint image, the image leaves the node's image store; a pod of
    another namespace naming it with imagePullPolicy IfNotPresent must pull it, and after the token is
    withdrawn (here: its Checkpoint deleted) cannot: it never runs another pod's memory."""
    ns = ctx.namespace("hostile-cache")
    other = ctx.namespace("hostile-cache-other")
    ref, _ = published(ctx, ns)
    restored_pod(ctx, ns, "first", ref)
    wait_running(ctx, ns, "first", 120)
    ctx.check(any(e.get("reason") == "Pulled" for e in ctx.N.events_for(ns, "first")), "the first pod was not pulled")
    # Its container started: the image leaves the store while its token is still good. Looked at
    # here, checked after the attack (so that the attack is tried whatever the outcome).
    t0 = time.monotonic()
    try:
        ctx.wait_until("the image out of the node's store", lambda: not store_names(ctx), 15)
        left = time.monotonic() - t0
    except AssertionError:
        left = None
    gone(ctx, ns, "first")
    ctx.kubectl("delete", "checkpoint", "-n", ns, "snap", "--wait=true", timeout=120)
    restored_pod(ctx, other, "thief", ref)
    t1 = time.monotonic()
    ctx.wait_until("the other namespace's pod refused its pull", lambda: any(
        e.get("reason") in ("Failed", "BackOff") for e in ctx.N.events_for(other, "thief")) or
        "running" in container_state(ctx, other, "thief"), 90)
    state = container_state(ctx, other, "thief")
    ctx.check("running" not in state and "terminated" not in state,
              f"a pod of another namespace started from the cached checkpoint image without its token: {state}")
    ctx.check(any(e.get("reason") == "Pulling" for e in ctx.N.events_for(other, "thief")),
              "the other pod was never made to pull")
    ctx.check(not store_names(ctx), f"checkpoint images left in the node's store: {store_names(ctx)}")
    ctx.check(left is not None, "the image stayed in the node's store after a container started from it")
    ctx.log(f"the image left the node's store {left:.1f} s after its first pod ran; the other namespace's pod was "
            f"refused its pull in {time.monotonic() - t1:.1f} s")
    lines = [l for l in ctx.agent_log() if "removed from the node's image store: a container was started" in l]
    ctx.check(lines, "the agent's log does not say the image left the store")


# ---- shared images ----

def crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


T32 = crc32c_table()


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = T32[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def raw_crc(data):
    """The linear part of CRC-32C (register from 0, no final xor)."""
    crc = 0
    for b in data:
        crc = T32[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def forge(buf, q, p):
    """Flips byte q of buf and sets the 4 bytes at p (q < p, both near the end) so that buf's CRC-32C
    is unchanged: CRC is linear, so the change is cancelled by solving 32 equations over GF(2)."""
    end = len(buf)
    start = min(p, q)

    def f(delta):  # the CRC change a delta (bytes from start to the end) makes
        return raw_crc(delta)
    dq = bytearray(end - start)
    dq[q - start] = 0x01
    target = f(dq)
    cols = []
    for bit in range(32):
        d = bytearray(end - start)
        d[p - start + bit // 8] = 1 << (bit % 8)
        cols.append(f(d))
    # Solve sum(x_i * cols[i]) == target (Gaussian elimination on 32-bit rows).
    rows = [(cols[i], 1 << i) for i in range(32)]
    basis = []
    for v, m in rows:
        for bv, bm in basis:
            if v ^ bv < v:
                v, m = v ^ bv, m ^ bm
        if v:
            basis.append((v, m))
            basis.sort(reverse=True)
    v, m = target, 0
    for bv, bm in basis:
        if v ^ bv < v:
            v, m = v ^ bv, m ^ bm
    if v != 0:
        raise AssertionError("no CRC-preserving patch at that place")
    out = bytearray(buf)
    out[q] ^= 0x01
    for bit in range(32):
        if m >> bit & 1:
            out[p + bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def case_tampered_shared_image(ctx):
    """images.shared on (the chart makes the images key): a writer of the share changes a byte of an
    image's GPU data and keeps the chunk's CRC-32C (CRC is linear: 4 more bytes changed), the
    manifest untouched. The Restore into a new pod is refused, naming the file and the signed
    manifest; nothing of the changed data is resumed."""
    ctx.helm_upgrade({"images.shared": "true"})
    try:
        ns = ctx.namespace("hostile-share")
        ref, _ = published(ctx, ns)
        img = ctx.kjson("get", "checkpoint", "-n", ns, "snap")["status"]["image"]["path"]
        man = json.load(open(os.path.join(img, "manifest.json")))
        a = next(a for a in man["allocs"] if any(not c.get("zero") for c in a["chunks"]))
        ch = next(c for c in a["chunks"] if not c.get("zero"))
        path = os.path.join(img, a["file"])
        with open(path, "r+b") as f:
            f.seek(ch["off"])
            chunk = f.read(ch["len"])
            ctx.check(f"{crc32c(chunk):08x}" == ch["crc32c"], "the test's CRC-32C is not the image's")
            new = forge(chunk, len(chunk) - 64, len(chunk) - 16)
            ctx.check(new != chunk and crc32c(new) == crc32c(chunk), "the forged chunk's CRC-32C differs")
            f.seek(ch["off"])
            f.write(new)
        ctx.log(f"{a['file']}: 5 bytes changed in the chunk at {ch['off']}, its CRC-32C {ch['crc32c']} kept")
        restored_pod(ctx, ns, "dst", ref)
        wait_running(ctx, ns, "dst", 120)
        ctx.apply({"apiVersion": "gpucr.dev/v1alpha1", "kind": "Restore", "metadata": {"name": "back", "namespace": ns},
                   "spec": {"checkpointName": "snap", "podName": "dst"}})
        ph = ctx.N.wait_phase("restore", ns, "back", want=("Failed", "Succeeded"), timeout=120)
        msg = ctx.kjson("get", "restore", "-n", ns, "back")["status"].get("message", "")
        ctx.check(ph == "Failed", f"a tampered shared image was restored: {msg}")
        ctx.check(man.get("mac", {}).get("alg") == "HMAC-SHA256" and all("sha256" in f for f in man["files"]),
                  f"the image on shared storage is not signed: {sorted(man)}")
        ctx.check("SHA-256 does not match the signed manifest" in msg and a["file"] in msg,
                  f"the refusal does not say why: {msg}")
        ctx.log(f"refused: {msg}")
    finally:
        ctx.helm_upgrade()


CASES = [
    ("case_token_hidden", case_token_hidden),
    ("case_cached_image_not_startable", case_cached_image_not_startable),
    ("case_idle_flood", case_idle_flood),
    ("case_port_squat", case_port_squat),
    ("case_tampered_shared_image", case_tampered_shared_image),
]
