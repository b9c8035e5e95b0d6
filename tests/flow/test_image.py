# tests/flow/test_image.py: process images (docs/images.md) on the stand-in driver with the real
# CRIU: checkpoint to an image, process gone, restore, bit-exact; every corruption refused before
# anything is touched; gcrctl killed mid-write leaves no image; the image's size bound.
"""Needs a build dir (top_builddir) and CRIU >= 4 ($GCR_CRIU, else scripts/install-criu.sh's
cache or criu on $PATH): without one every case FAILS, saying why. The program's stdin and
stdout are FIFOs (CRIU restores them by path); the test holds both ends, so no read sees EOF
while the process is between dump and restore. No sleeps: every wait is on a line or an exit."""

import ctypes
import fcntl
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.abspath(os.environ.get("top_builddir", os.path.join(SRC, "build")))
FAKE_DIR = os.path.join(BUILD, "tests", "fakecuda")
GCRCTL = os.path.join(BUILD, "node-agent", "gcrctl")
SHIM = os.path.join(BUILD, "shim", ".libs", "libgcr.so")
PROG = os.path.join(BUILD, "tests", "progs", "gcr-testprog")
KERNELS = os.path.join(SRC, "tests", "progs", "gcr_kernels.h")
sys.path.insert(0, os.path.join(SRC, "tests", "gpu"))
import harness as H  # noqa: E402  (its shim_request: one control-socket request)


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def find_criu():
    """CRIU >= 4, or (None, why)."""
    def ok(c):
        try:
            out = subprocess.run([c, "--version"], capture_output=True, text=True, timeout=30).stdout
        except OSError:
            return False
        m = re.search(r"Version: *(\d+)\.", out)
        return m is not None and int(m.group(1)) >= 4
    env = os.environ.get("GCR_CRIU")
    if env:
        return (env, None) if ok(env) else (None, "GCR_CRIU=%s is not a runnable criu >= 4" % env)
    for c in [os.path.expanduser("~/.cache/gcr-criu/4.1.1/criu"), shutil.which("criu")]:
        if c and ok(c):
            return c, None
    return None, "no CRIU >= 4: GCR_CRIU unset, none in ~/.cache/gcr-criu or on PATH (run scripts/install-criu.sh)"


class Proc:
    """gcr-testprog under the shim, stdin and stdout FIFOs in d."""

    def __init__(self, d, args, env):
        self.inp, self.outp = os.path.join(d, "in.fifo"), os.path.join(d, "out.fifo")
        for f in (self.inp, self.outp):
            if not os.path.exists(f):
                os.mkfifo(f)
        self.w = os.open(self.inp, os.O_RDWR)
        self.r = os.open(self.outp, os.O_RDONLY | os.O_NONBLOCK)
        self.keep = os.open(self.outp, os.O_WRONLY)  # a writer always there: no EOF between dump and restore
        self.buf = b""
        self.lines = []
        e = dict(os.environ, **env)
        # Sanitizer builds need the ASan runtime first in a preloaded process (tests/run.sh).
        prefix = os.environ.get("GCR_TEST_PRELOAD_PREFIX", "")
        e["LD_PRELOAD"] = prefix + ":" + SHIM if prefix else SHIM
        self.p = subprocess.Popen([PROG, "--module", KERNELS] + args, stdin=self.w, stdout=self.keep,
                                  stderr=open(os.path.join(d, "err.txt"), "ab"), env=e, start_new_session=True)
        m = self.expect(r"READY pid=(\d+)", 60)
        self.pid = int(m.group(1))

    def send(self, s):
        os.write(self.w, (s + "\n").encode())

    def expect(self, pat, timeout):
        rx = re.compile(pat)
        end = time.monotonic() + timeout
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                line = line.decode(errors="replace")
                self.lines.append(line)
                m = rx.search(line)
                if m:
                    return m
            left = end - time.monotonic()
            check(left > 0, "no line matching %r in %d s (last: %s)" % (pat, timeout, self.lines[-3:]))
            r, _, _ = select.select([self.r], [], [], left)
            if r:
                try:
                    self.buf += os.read(self.r, 65536)
                except BlockingIOError:
                    pass

    def reap(self):
        """The original child after CRIU ended it (restored processes are not our children)."""
        try:
            self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def close(self, pid=None):
        for p in {self.pid, pid} - {None}:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        self.reap()
        for fd in (self.w, self.r, self.keep):
            os.close(fd)


class Case:
    def __init__(self, name, criu):
        self.name = name
        self.d = tempfile.mkdtemp(prefix="gcr-image-")
        self.env = {"LD_LIBRARY_PATH": FAKE_DIR, "FAKECUDA_DIR": self.d, "FAKECUDA_MEM_MIB": "1024",
                    "GCR_SOCKET_DIR": os.path.join(self.d, "sock"), "GCR_LOG_DIR": os.path.join(self.d, "logs"),
                    "GCR_CRIU": criu}
        self.procs = []

    def start(self, args, env=None):
        p = Proc(self.d, args, dict(self.env, **(env or {})))
        self.procs.append(p)
        return p

    def ctl(self, *args, timeout=300):
        r = subprocess.run([GCRCTL, "--json"] + list(args), capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, **self.env))
        out = r.stdout.strip().splitlines()
        data = json.loads(out[-1]) if out and out[-1].startswith("{") else {}
        return r.returncode, data, r.stderr.strip()

    def alive(self, pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        with open("/proc/%d/stat" % pid) as f:  # a zombie is gone too
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"

    def gpu_bytes(self, pid):
        r = subprocess.run([os.path.join(FAKE_DIR, "fakesmi"), "mem", str(pid)], capture_output=True, text=True,
                           timeout=30, env=dict(os.environ, **self.env))
        return int(r.stdout.strip()) if r.returncode == 0 else 0

    def close(self):
        for p in self.procs:
            p.close()
        shutil.rmtree(self.d, ignore_errors=True)


def image_size(img):
    return sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(img) for f in fs)


def checkpoint(c, p, img, *flags):
    rc, rep, err = c.ctl("checkpoint", "--image", img, *flags, str(p.pid))
    check(rc == 0 and rep.get("ok"), "checkpoint: rc %d %s %s" % (rc, rep, err))
    check(os.path.isfile(os.path.join(img, "manifest.json")), "no manifest in the image")
    check(not [f for f in os.listdir(c.d) if ".partial." in f], "a partial directory was left")
    return rep


def restore_ok(c, p, img):
    rc, rep, err = c.ctl("restore", "--image", img)
    check(rc == 0 and rep.get("ok"), "restore: rc %d %s %s" % (rc, rep, err))
    check(rep.get("pid") == p.pid, "restored pid %s, expected %d" % (rep.get("pid"), p.pid))
    check(c.alive(p.pid), "restored process not running")
    return rep


def finish(p, verify=False):
    p.expect(r"^DONE$", 120)
    p.send("check")
    m = p.expect(r"RESULT (.*)", 120)
    check(m.group(1) == "ok", "program reports RESULT %s" % m.group(1))


def verify(p):
    """The program checks every chunk bit-exact on the GPU ("VERIFIED", else "RESULT FAIL ...")
    and reports (chunks, zero bytes)."""
    p.send("verify")
    m = p.expect(r"VERIFIED chunks=(\d+) zero_bytes=(\d+)|RESULT (.*)", 120)
    check(m.group(3) is None, "verify: %s" % m.group(0))
    return int(m.group(1)), int(m.group(2))


# ---- cases ----

def case_roundtrip(c):
    """Checkpoint (CRIU ends the process: 0 bytes on the GPU), restore, iterations go on, RESULT ok;
    image size <= 1.02 x (non-zero GPU bytes + CPU resident)."""
    p = c.start(["--mib", "64", "--wait", "--iters", "60"])
    p.send("go")
    p.expect(r"ITER 5\b", 60)
    img = os.path.join(c.d, "img")
    rep = checkpoint(c, p, img)
    p.reap()
    check(not c.alive(p.pid), "process still alive after the checkpoint")
    check(c.gpu_bytes(p.pid) == 0, "GPU bytes held after the checkpoint")
    b = rep["bytes"]
    size = image_size(img)
    bound = 1.02 * (b["written"] + b["rss"])
    check(b["written"] > 0 and size <= bound, "image %d bytes > 1.02 x (%d written + %d resident)"
          % (size, b["written"], b["rss"]))
    print("  image %.1f MiB, ratio %.3f of (GPU non-zero + resident); write %.1f ms for %.1f MiB, dump %.1f ms"
          % (size / 2**20, size / (b["written"] + b["rss"]), rep["ms"]["write"], b["written"] / 2**20,
             rep["ms"]["dump"]))
    r = restore_ok(c, p, img)
    print("  restore %.1f ms (verify %.1f, criu %.1f, read %.1f, resume %.1f)" % (
        r["ms"]["total"], r["ms"]["verify"], r["ms"]["restore"], r["ms"]["read"], r["ms"]["resume"]))
    check(c.gpu_bytes(p.pid) > 0, "restored process holds no GPU memory")
    finish(p)


def case_zero_buffers(c):
    """Several buffers, most all-zero: zero chunks recorded, not written; restored bit-exact."""
    p = c.start(["--chunks", "--buffers", "6", "--mib", "48", "--write-mib", "12", "--iters", "3", "--wait"])
    p.send("go")
    p.expect(r"^DONE$", 120)
    before = verify(p)
    img = os.path.join(c.d, "img")
    rep = checkpoint(c, p, img)
    b = rep["bytes"]
    check(b["zero"] > 0 and b["written"] < b["gpu"], "zero chunks: %s" % b)
    # The program's all-zero chunks are exactly the ones the shim recorded and did not write.
    check(b["zero"] == before[1], "%d zero bytes recorded, the program holds %d" % (b["zero"], before[1]))
    gpu = sum(os.path.getsize(os.path.join(img, "gpu", f)) for f in os.listdir(os.path.join(img, "gpu"))
              if f.endswith(".bin"))
    check(gpu == b["written"], "gpu/ files hold %d bytes, %d written" % (gpu, b["written"]))
    p.reap()
    restore_ok(c, p, img)
    after = verify(p)
    check(after == before, "after the restore %s, before %s" % (after, before))
    p.send("check")
    m = p.expect(r"RESULT (.*)", 120)
    check(m.group(1) == "ok", "RESULT %s" % m.group(1))


def case_leave_running(c):
    """--leave-running: the image is written and the process goes on, resident."""
    p = c.start(["--mib", "32", "--wait", "--iters", "40"])
    p.send("go")
    p.expect(r"ITER 3\b", 60)
    img = os.path.join(c.d, "img")
    checkpoint(c, p, img, "--leave-running")
    check(c.alive(p.pid) and c.gpu_bytes(p.pid) > 0, "process not running and resident after --leave-running")
    finish(p)
    p.reap()
    check(os.path.isfile(os.path.join(img, "manifest.json")), "image gone")


def edit_manifest(img, fn):
    path = os.path.join(img, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    fn(m)
    with open(path, "w") as f:
        json.dump(m, f)


def case_corruptions(c):
    """Each corruption is refused with a message naming it, the image stays, and no process is
    left: all before anything is touched, except a GPU data chunk, which is checked while CRIU
    restores the CPU side, so the restored process (held at the gate, never resumed) is removed;
    with --verify-first that one too is refused before CRIU runs. Undone, the image restores."""
    p = c.start(["--mib", "32", "--wait", "--iters", "30"])
    p.send("go")
    p.expect(r"ITER 2\b", 60)
    img = os.path.join(c.d, "img")
    checkpoint(c, p, img)
    p.reap()
    man = os.path.join(img, "manifest.json")
    with open(man) as f:
        orig = f.read()
    gpuf = os.path.join(img, "gpu", sorted(f for f in os.listdir(os.path.join(img, "gpu")) if f.endswith(".bin"))[0])
    criuf = os.path.join(img, "criu", sorted(f for f in os.listdir(os.path.join(img, "criu")) if f.startswith("pages-"))[0])

    def flip(path):
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0xFF]))

    def truncate(path):
        saved = path + ".saved"
        shutil.copyfile(path, saved)
        os.truncate(path, os.path.getsize(path) - 4096)
        return lambda: os.replace(saved, path)

    def restore_manifest():
        with open(man, "w") as f:
            f.write(orig)

    partial = img + ".partial.1"
    cases = [
        ("flipped byte in a GPU file", lambda: flip(gpuf), lambda: flip(gpuf), "corrupt"),
        ("flipped byte in a CRIU file", lambda: flip(criuf), lambda: flip(criuf), "corrupt"),
        ("truncated GPU file", lambda: truncate(gpuf), None, "truncated"),
        ("manifest deleted", lambda: os.rename(man, man + ".x"), lambda: os.rename(man + ".x", man), "manifest"),
        ("partial name", lambda: os.rename(img, partial), lambda: os.rename(partial, img), "partial"),
        ("another GPU model", lambda: edit_manifest(img, lambda m: m["gpu"].update(model="Other GPU")),
         restore_manifest, "GPU model"),
        ("another driver", lambda: edit_manifest(img, lambda m: m["gpu"].update(driver="999.1")),
         restore_manifest, "driver version"),
        ("another shim version", lambda: edit_manifest(img, lambda m: m.update(shim_version="0.0.1")),
         restore_manifest, "shim version"),
        ("another format", lambda: edit_manifest(img, lambda m: m.update(format=99)), restore_manifest, "format"),
    ]
    cases.insert(1, ("flipped byte in a GPU file, --verify-first", lambda: flip(gpuf), lambda: flip(gpuf),
                     "corrupt"))
    for what, do, undo, word in cases:
        r = do()
        undo = undo or r
        target = partial if what == "partial name" else img
        first = what.endswith("--verify-first")
        rc, rep, err = c.ctl("restore", "--image", target, *(["--verify-first"] if first else []))
        check(rc != 0, "%s: restore succeeded" % what)
        check(word.lower() in err.lower(), "%s: message does not say %r: %s" % (what, word, err))
        check(not c.alive(p.pid), "%s: a process is left" % what)
        held = what == "flipped byte in a GPU file"
        check(("was removed" in err) == held, "%s: %s" % (what, "no process should have been made" if not held
                                                            else "the held process is not said to be removed"))
        # gcrctl reaped the removed process (it is the subreaper while it restores): the pid is
        # free for the next restore, which the loop's next round and restore_ok() rely on.
        undo()
        print("  refused: %s (%s)" % (what, err[:110]))
    restore_ok(c, p, img)
    finish(p)


def case_killed_mid_write(c):
    """gcrctl SIGKILLed while the shim suspends to the image (held by the GCR_TEST_IMAGE_HOLD FIFO
    before its copies): no image; the shim finds its client gone once the data is in the files
    and undoes the suspend from them, so the process runs on with its data intact."""
    hold = os.path.join(c.d, "hold.fifo")
    os.mkfifo(hold)
    p = c.start(["--mib", "32", "--wait", "--iters", "30"], env={"GCR_TEST_IMAGE_HOLD": hold})
    p.send("go")
    p.expect(r"ITER 2\b", 60)
    img = os.path.join(c.d, "img")
    g = subprocess.Popen([GCRCTL, "checkpoint", "--image", img, str(p.pid)], env=dict(os.environ, **c.env),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fd = os.open(hold, os.O_WRONLY)  # returns once the shim is inside image-write, held
    g.kill()
    g.wait(30)
    os.close(fd)  # the shim goes on, writes, finds its client gone, reads the files back
    check(not os.path.exists(img), "an image directory appeared")
    # The reply the shim never sent is the last thing it does: a status answered after it
    # sees the process running again (the control socket serves one request at a time).
    rc, st, err = c.ctl("status", str(p.pid))
    check(st.get("state") == "running", "after the kill: %s %s" % (st, err))
    finish(p)


def case_changed_after_verify(c):
    """A GPU file changed after verify passed (held by the GCR_TEST_RESTORE_HOLD FIFO between
    CRIU's restore and the data): the resume checks each chunk's CRC-32C on its way to the GPU,
    so the restore fails, the restored process is killed, nothing runs; undone, it restores."""
    p = c.start(["--mib", "16", "--wait", "--iters", "40"])
    p.send("go")
    p.expect(r"ITER 3\b", 60)
    img = os.path.join(c.d, "img")
    checkpoint(c, p, img)
    p.reap()
    gpu = os.path.join(img, "gpu")
    data = sorted(f for f in os.listdir(gpu) if f.endswith(".bin") and os.path.getsize(os.path.join(gpu, f)) > 0)
    check(data, "no GPU data file in the image")
    victim = os.path.join(gpu, data[0])
    hold = os.path.join(c.d, "restore-hold.fifo")
    os.mkfifo(hold)
    g = subprocess.Popen([GCRCTL, "--json", "restore", "--image", img],
                         env=dict(os.environ, GCR_TEST_RESTORE_HOLD=hold, **c.env),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fd = os.open(hold, os.O_WRONLY)  # returns once gcrctl is held: verified, CRIU restored
    with open(victim, "r+b") as f:
        f.seek(5)
        b = f.read(1)
        f.seek(5)
        f.write(bytes([b[0] ^ 0x5A]))
    os.close(fd)
    out, err = g.communicate(timeout=300)
    check(g.returncode != 0, "restore of a changed image succeeded: %s" % out)
    check("CRC-32C" in out + err and "killed" in out + err, "unexpected failure: %s %s" % (out, err))
    check(not c.alive(p.pid), "the restored process still runs after the failed restore")
    print("  refused during the resume: %s" % (out + err).strip().splitlines()[-1][:300])
    # gcrctl reaped it: restore_ok() below needs the pid free.
    with open(victim, "r+b") as f:
        f.seek(5)
        f.write(b)
    restore_ok(c, p, img)
    finish(p)


def case_write_fails(c):
    """The disk refuses the data mid-suspend (the process's file size limit, set with prlimit, makes
    the copy workers' writes fail with EFBIG, as a full disk would with ENOSPC): the checkpoint
    fails, no image and no partial directory stay, and the process runs on with its data intact,
    since no GPU memory is released before every chunk is written; with the limit lifted, it
    checkpoints."""
    p = c.start(["--mib", "32", "--wait", "--iters", "40"])
    p.send("go")
    p.expect(r"ITER 2\b", 60)
    img = os.path.join(c.d, "img")
    r = subprocess.run(["prlimit", "--pid", str(p.pid), "--fsize=%d:unlimited" % (4 << 20)],  # soft only: raising
                       capture_output=True, text=True)  # the hard limit needs CAP_SYS_RESOURCE
    check(r.returncode == 0, "prlimit: %s" % r.stderr)
    rc, rep, err = c.ctl("checkpoint", "--image", img, str(p.pid))
    check(rc != 0 and not rep.get("ok"), "checkpoint over the size limit succeeded: %s" % rep)
    check("File too large" in err or "File too large" in str(rep), "unexpected failure: %s %s" % (rep, err))
    print("  refused: %s" % err.strip().splitlines()[-1][:300])
    check(not os.path.exists(img), "an image directory appeared")
    left = [f for f in os.listdir(c.d) if f.startswith("img.partial")]
    check(not left, "partial directories left: %s" % left)
    rc, st, err = c.ctl("status", str(p.pid))
    check(st.get("state") == "running", "after the failed checkpoint: %s %s" % (st, err))
    r = subprocess.run(["prlimit", "--pid", str(p.pid), "--fsize=unlimited:unlimited"], capture_output=True,
                       text=True)
    check(r.returncode == 0, "prlimit: %s" % r.stderr)
    checkpoint(c, p, img)
    p.reap()
    restore_ok(c, p, img)
    finish(p)


def case_gpu_pair_unknown(c):
    """Restoring an image onto another GPU (--gpu, --gpu-pair): a target this machine lacks is
    refused before the driver's restore (-ENODEV), the restored process killed and reaped,
    nothing runs; a malformed pair is refused by gcrctl; a pair of GPUs the process did not use
    is left out (the driver wants only the GPUs it checkpointed), so the image restores in place.
    Restoring onto another GPU for real needs a two-GPU machine (tests/gpu/test_image_gpu.py)."""
    p = c.start(["--mib", "16", "--wait", "--iters", "30"])
    p.send("go")
    p.expect(r"ITER 2\b", 60)
    img = os.path.join(c.d, "img")
    checkpoint(c, p, img)
    p.reap()
    absent = "GPU-00000000-1111-2222-3333-444444444444"
    rc, rep, err = c.ctl("restore", "--image", img, "--gpu", absent)
    check(rc != 0, "restore onto a GPU that does not exist succeeded: %s" % rep)
    check("no GPU %s" % absent in err and "killed" in err, "unexpected failure: %s" % err)
    check(not c.alive(p.pid), "the restored process still runs")
    print("  refused: %s" % err.strip().splitlines()[-1][:240])
    rc, rep, err = c.ctl("restore", "--image", img, "--gpu-pair", "GPU-12")
    check(rc == 2 and "GPU UUID" in err, "a malformed pair: rc %d %s" % (rc, err))
    pair = absent + "=GPU-55555555-6666-7777-8888-999999999999"
    rc, rep, err = c.ctl("restore", "--image", img, "--gpu-pair", pair)
    check(rc == 0 and rep.get("ok") and rep.get("pid") == p.pid and c.alive(p.pid),
          "a pair of GPUs the process did not use, left out: rc %d %s %s" % (rc, rep, err))
    finish(p)


def case_writers_and_pieces(c):
    """GCR_IMAGE_WRITERS x GCR_IMAGE_PIECE_MIB (the disk's pattern): pieces that are not a divisor
    of the buffers, runs broken by zero chunks, one writer with 2 MiB pieces (no big slots) and
    three with 6 MiB ones: every chunk's CRC-32C checked before CRIU runs (--verify-first), the
    data bit-exact after the restore."""
    for writers, piece in (("3", "6"), ("1", "2")):
        p = c.start(["--chunks", "--buffers", "4", "--mib", "40", "--write-mib", "22", "--iters", "2", "--wait"],
                    env={"GCR_IMAGE_WRITERS": writers, "GCR_IMAGE_PIECE_MIB": piece})
        p.send("go")
        p.expect(r"^DONE$", 120)
        before = verify(p)
        img = os.path.join(c.d, "img-%s-%s" % (writers, piece))
        rep = checkpoint(c, p, img)
        b = rep["bytes"]
        check(b["zero"] > 0 and b["written"] > 0, "zero chunks and data: %s" % b)
        p.reap()
        rc, r, err = c.ctl("restore", "--image", img, "--verify-first")
        check(rc == 0 and r.get("ok"), "restore (%s writers, %s MiB): rc %d %s %s" % (writers, piece, rc, r, err))
        after = verify(p)
        check(after == before, "%s writers, %s MiB pieces: after the restore %s, before %s"
              % (writers, piece, after, before))
        p.send("check")
        m = p.expect(r"RESULT (.*)", 120)
        check(m.group(1) == "ok", "RESULT %s" % m.group(1))
        print("  %s writers, %s MiB pieces: %.1f MiB written in %.1f ms, bit-exact"
              % (writers, piece, b["written"] / 2**20, rep["ms"]["write"]))


def case_suspend_to_files(c):
    """gcrctl suspend --image DIR / resume --image DIR (what a container runtime's checkpoint and
    restore are wrapped in, docs/images.md "Restore into a new pod"): the GPU data goes to DIR/gpu,
    0 bytes left on the GPU, a plain resume refused until the data is read back; resume --image
    reads it and the program's data is bit-exact. An image whose manifest says mode runtime is
    refused by gcrctl restore, nothing restored."""
    p = c.start(["--chunks", "--buffers", "3", "--mib", "24", "--iters", "3", "--wait"])
    p.send("go")
    p.expect(r"^DONE$", 120)
    before = verify(p)
    d = os.path.join(c.d, "files")
    os.mkdir(d)
    rc, rep, err = c.ctl("--unchecked", "suspend", "--image", d, str(p.pid))
    check(rc == 0 and rep.get("ok"), "suspend --image: rc %d %s %s" % (rc, rep, err))
    check(c.gpu_bytes(p.pid) == 0, "GPU bytes held after suspend --image")
    files = os.listdir(os.path.join(d, "gpu"))
    check("allocs.json" in files and any(f.endswith(".bin") for f in files), "gpu/ holds %s" % files)
    rc, _, err = c.ctl("resume", str(p.pid))
    check(rc != 0, "a plain resume of a process whose data is in files was not refused")
    rc, _, err = c.ctl("suspend", "--image", "relative", str(p.pid))
    check(rc == 2 and "absolute" in err, "a relative DIR: rc %d %s" % (rc, err))
    rc, rep, err = c.ctl("--unchecked", "resume", "--image", d, str(p.pid))
    check(rc == 0 and rep.get("ok") and rep["bytes"]["gpu"] > 0, "resume --image: rc %d %s %s" % (rc, rep, err))
    check(c.gpu_bytes(p.pid) > 0, "no GPU memory after resume --image")
    after = verify(p)
    check(after == before, "after resume --image %s, before %s" % (after, before))
    # A runtime-mode image (the kubelet's CPU side) is never restored by gcrctl.
    img = os.path.join(c.d, "img")
    checkpoint(c, p, img, "--leave-running")
    edit_manifest(img, lambda m: m.update(mode="runtime"))
    rc, rep, err = c.ctl("restore", "--image", img)
    check(rc != 0 and "container runtime" in err, "restore of a runtime image: rc %d %s" % (rc, err))
    p.send("check")
    m = p.expect(r"RESULT (.*)", 120)
    check(m.group(1) == "ok", "RESULT %s" % m.group(1))


def shim_request(c, pid, op, args=None):
    """One request on pid's control socket; its reply (a dict)."""
    r = H.shim_request(c.env["GCR_SOCKET_DIR"], pid, op, args)
    check(r is not None, "%s: connection closed before a reply" % op)
    return r


def case_image_of_suspended(c):
    """A process suspended already (a drained pod's, by a Checkpoint or a GPUResidency at 0) is
    imaged from there, never resumed first: image-write takes its data from host memory to
    DIR/gpu (status "data": "written"), image-read makes those files what its next resume reads
    ("files"); it stays suspended all along (0 GPU bytes), and the resume brings it back bit-exact."""
    p = c.start(["--chunks", "--buffers", "3", "--mib", "24", "--iters", "3", "--wait"])
    p.send("go")
    p.expect(r"^DONE$", 120)
    before = verify(p)
    rc, rep, err = c.ctl("--unchecked", "suspend", str(p.pid))
    check(rc == 0 and rep.get("ok"), "suspend: rc %d %s %s" % (rc, rep, err))
    st = shim_request(c, p.pid, "status")["result"]
    check(st.get("state") == "suspended" and st.get("data") == "host", "after the suspend: %s" % st)
    d = os.path.join(c.d, "pod-side")
    os.mkdir(d)
    r = shim_request(c, p.pid, "image-write", {"dir": d})
    check(r.get("ok") and r["result"]["bytes"] > 0, "image-write: %s" % r)
    st = shim_request(c, p.pid, "status")["result"]
    check(st.get("state") == "suspended" and st.get("data") == "written", "after image-write: %s" % st)
    check(c.gpu_bytes(p.pid) == 0, "GPU bytes held while imaged suspended")
    rc, _, err = c.ctl("resume", str(p.pid))
    check(rc != 0, "a resume with the data in files only was not refused")
    r = shim_request(c, p.pid, "image-read", {"dir": d})
    check(r.get("ok"), "image-read: %s" % r)
    st = shim_request(c, p.pid, "status")["result"]
    check(st.get("state") == "suspended" and st.get("data") == "files", "after image-read: %s" % st)
    rc, rep, err = c.ctl("--unchecked", "resume", str(p.pid))
    check(rc == 0 and rep.get("ok"), "resume: rc %d %s %s" % (rc, rep, err))
    check(shim_request(c, p.pid, "status")["result"].get("data") == "gpu", "a running process's data is not on the GPU")
    after = verify(p)
    check(after == before, "after the image of the suspended process %s, before %s" % (after, before))
    p.send("check")
    m = p.expect(r"RESULT (.*)", 120)
    check(m.group(1) == "ok", "RESULT %s" % m.group(1))


CASES = [case_roundtrip, case_zero_buffers, case_leave_running, case_corruptions, case_killed_mid_write,
         case_changed_after_verify, case_write_fails, case_gpu_pair_unknown, case_writers_and_pieces,
         case_suspend_to_files, case_image_of_suspended]


def run_cases(cases, criu, why, only=()):
    """Runs each case (those named in only, if any) in its own Case; without CRIU each FAILS with
    why. Prints one line per case and "N passed, N failed", and exits 1 if any failed."""
    passed = failed = 0
    for fn in cases:
        if only and fn.__name__ not in only:
            continue
        if criu is None:
            print("FAIL %s: %s" % (fn.__name__, why))
            failed += 1
            continue
        c = Case(fn.__name__, criu)
        t0 = time.monotonic()
        try:
            fn(c)
            print("PASS %s (%.1f s)" % (fn.__name__, time.monotonic() - t0))
            passed += 1
        except Exception as e:  # noqa: BLE001
            print("FAIL %s: %s" % (fn.__name__, e))
            if not isinstance(e, Fail):
                traceback.print_exc()
            failed += 1
        finally:
            c.close()
        sys.stdout.flush()
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1 if failed else 0)


def main():
    # Restored processes come to us when gcrctl exits, not to an init that may reap late: a
    # finished case's zombie never holds a pid a later case's restore needs.
    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    criu, why = find_criu()
    run_cases(CASES, criu, why, sys.argv[1:])


if __name__ == "__main__":
    main()
