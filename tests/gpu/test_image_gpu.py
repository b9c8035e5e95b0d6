# tests/gpu/test_image_gpu.py: process images (issue 18) on the GPU machine: checkpoint to an image, process
# gone and 0 MiB on the GPU, restore, bit-exact; --leave-running; a corrupt image refused. PASS/FAIL/NOT RUN.
"""Run: python3 tests/gpu/test_image_gpu.py [--only REGEX] [--skip REGEX] [--list] [--criu PATH]
        [--dir DIR] [--stand-in BUILD_DIR]

  image-testprog       gcr-testprog --chunks 1 GiB (GCR_IMAGE_TESTPROG_MIB) under the shim: verify,
                       checkpoint --image (the process ends), gone, 0 MiB on the GPU (nvidia-smi),
                       restore (same pid), verify gives the same chunks and zero bytes (every chunk
                       bit-exact on the GPU), check -> RESULT ok.
  image-torch          torch_serve --commands --weights-gib 2 (GCR_IMAGE_TORCH_GIB): steps,
                       checkpoint --image, gone, 0 MiB, restore, steps, check -> DIGEST equal to an
                       uninterrupted run's (same arguments, no shim), RESULT ok.
  image-leave-running  the same with --leave-running: the process goes on, still on the GPU, its
                       DIGEST equal; the image stays whole (manifest).
                       On the stand-in (no torch): gcr-testprog --chunks, verify after the checkpoint.
  image-corrupt        gcr-testprog --chunks 256 MiB: checkpoint, one byte of a gpu/*.bin flipped:
                       restore refused, no process with the pid, nothing on the GPU; flipped back,
                       the image restores and RESULT ok.
Programs' stdin/stdout are FIFOs (tests/gpu/image_proc.py), so CRIU dumps and restores them. CRIU:
--criu, else $GCR_CRIU, else .gpubuild/criu/criu (with .gpubuild/criu/lib), ~/.cache/gcr-criu, PATH.
--stand-in BUILD: the stand-in driver (tests/fakecuda) of that build dir; image-torch is NOT RUN there
(unless TORCH_SERVE names a program speaking torch_serve's protocol on the stand-in: a dry run).
Records go to GCR_TEST_LOG (/tmp/gcr-gpu-tests.jsonl); GCR_DEADLINE (epoch s) bounds the run.
Exit status: 0 all passed, 1 any failed, 3 none failed but some were not run.
"""

import argparse
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402
import image_proc as I  # noqa: E402
from image_proc import check  # noqa: E402

TP_MIB = int(os.environ.get("GCR_IMAGE_TESTPROG_MIB", "1024"))
TORCH_GIB = float(os.environ.get("GCR_IMAGE_TORCH_GIB", "2"))
TORCH_STEPS = int(os.environ.get("GCR_IMAGE_TORCH_STEPS", "20"))  # before and after the checkpoint each


class NotRun(Exception):
    pass


class Ctx:
    def __init__(self, run, name):
        self.run, self.place, self.name = run, run.place, name
        self.notes = []
        self.procs = []
        self.images = []

    def note(self, msg):
        self.notes.append(msg)
        print("  note: %s" % msg, flush=True)

    def start(self, tag, argv, shim=True):
        p = I.FifoProc(self.place, "%s-%s" % (self.name, tag), argv, shim=shim)
        self.procs.append(p)
        m = p.expect(r"^READY pid=(\d+)", 300, what="READY")
        check(int(m.group(1)) == p.pid, "READY pid %s, started %d" % (m.group(1), p.pid))
        return p

    def image(self, tag):
        img = os.path.join(self.run.dir, "%s-%s-%d" % (self.name, tag, os.getpid()))
        self.images.append(img)
        return img

    def ctl(self, *args):
        r = self.place.ctl(*args, timeout=900)
        self.run.log.write(kind="gcrctl", test=self.name, argv=r.argv[1:], rc=r.rc, ok=r.ok,
                           wall_ms=round(r.wall_ms, 3), json=r.data, error=r.error)
        return r

    def checkpoint(self, p, img, *flags):
        r = self.ctl("checkpoint", "--image", img, *flags, p.pid)
        check(r.ok, "checkpoint: %s" % r.error)
        check(os.path.isfile(os.path.join(img, "manifest.json")), "no manifest.json in %s" % img)
        self.note("checkpoint %.2f s, %s MiB written" % (r.wall_ms / 1e3, _mib(H.dig(r.data, "bytes", "written"))))
        return r

    def gone(self, p):
        """After a checkpoint that ends it: the process exited and holds nothing on the GPU."""
        p.reap(60)
        check(I.wait_gone(p.pid, 60), "process %d still running after the checkpoint" % p.pid)
        mib = self.place.gpu_mib(p.pid)
        check(mib is not None, "GPU memory of %d could not be read" % p.pid)
        check(mib == 0, "%s MiB still on the GPU for %d after the checkpoint" % (mib, p.pid))

    def restore(self, p, img):
        r = self.ctl("restore", "--image", img)
        check(r.ok, "restore: %s" % r.error)
        check(H.dig(r.data, "pid") == p.pid, "restored pid %s, expected %d" % (H.dig(r.data, "pid"), p.pid))
        check(I.alive(p.pid), "restored process %d not running" % p.pid)
        p.restored = True
        mib = self.place.gpu_mib(p.pid)
        check(mib is not None and mib > 0, "restored process holds %s MiB on the GPU" % mib)
        self.note("restore %.2f s" % (r.wall_ms / 1e3))
        return r

    def cleanup(self):
        for p in self.procs:
            p.close()
        for img in self.images:
            d, base = os.path.dirname(img), os.path.basename(img)
            for f in os.listdir(d):
                if f == base or f.startswith(base + ".partial."):
                    shutil.rmtree(os.path.join(d, f), ignore_errors=True)


def _mib(v):
    return "%.0f" % (v / 2**20) if isinstance(v, int) else "?"


# ---- gcr-testprog --chunks ----

def tp_argv(T, mib):
    return T.place.testprog_argv(mib, "--chunks", "--buffers", 4, "--wait", "--threads", 1, "--iters", 3)


def tp_verify(p):
    """The program checks every chunk bit-exact ("VERIFIED chunks=N zero_bytes=Z")."""
    p.send("verify")
    m = p.expect(r"^VERIFIED chunks=(\d+) zero_bytes=(\d+)", 300, what="VERIFIED")
    return int(m.group(1)), int(m.group(2))


def tp_finish(p):
    p.send("check")
    m = p.expect(r"^RESULT (.*)$", 300, what="RESULT")
    check(m.group(1).strip() == "ok", "RESULT %s" % m.group(1))
    check(I.wait_gone(p.pid, 60), "process %d did not exit after RESULT" % p.pid)


def tp_ready(T, tag, mib):
    p = T.start(tag, tp_argv(T, mib))
    p.send("go")
    p.expect(r"^DONE$", 300, what="DONE")
    return p, tp_verify(p)


def t_image_testprog(T):
    p, before = tp_ready(T, "tp", T.run.tp_mib)
    img = T.image("img")
    T.checkpoint(p, img)
    T.gone(p)
    T.restore(p, img)
    after = tp_verify(p)
    check(after == before, "after the restore (chunks, zero bytes) = %s, before %s" % (after, before))
    tp_finish(p)


def flip(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))


def t_image_corrupt(T):
    p, before = tp_ready(T, "tp", min(256, T.run.tp_mib))
    img = T.image("img")
    T.checkpoint(p, img)
    T.gone(p)
    gdir = os.path.join(img, "gpu")
    bins = sorted(f for f in os.listdir(gdir) if f.endswith(".bin"))
    check(bins, "no gpu/*.bin in the image")
    victim = os.path.join(gdir, max(bins, key=lambda f: os.path.getsize(os.path.join(gdir, f))))
    flip(victim)
    r = T.ctl("restore", "--image", img)
    check(not r.ok and r.rc not in (0, None), "restore of a corrupt image: rc %s ok %s" % (r.rc, r.ok))
    check(not I.alive(p.pid), "a process %d appeared after the refused restore" % p.pid)
    mib = T.place.gpu_mib(p.pid)
    check(mib == 0, "%s MiB on the GPU for %d after the refused restore" % (mib, p.pid))
    check(any(w in (r.error or "").lower() for w in ("corrupt", "checksum", "sha-256", os.path.basename(victim))),
          "the refusal names neither the corruption nor the file: %s" % r.error)
    T.note("refused: %s" % (r.error or "")[:120])
    flip(victim)
    T.restore(p, img)
    after = tp_verify(p)
    check(after == before, "after the restore (chunks, zero bytes) = %s, before %s" % (after, before))
    tp_finish(p)


# ---- torch_serve --commands ----

def torch_argv(T):
    pl = T.place
    return [pl.python, pl.torch_serve, "--commands", "--weights-gib", T.run.torch_gib]


def torch_steps(p, n, total):
    p.send("steps %d" % n)
    p.expect(r"^STEPS total=%d$" % total, 600, what="STEPS total=%d" % total)


def torch_check(p):
    p.send("check")
    d = p.expect(r"^DIGEST ([0-9a-f]{64})$", 600, what="DIGEST").group(1)
    r = p.expect(r"^RESULT (.*)$", 600, what="RESULT").group(1).strip()
    check(r == "ok", "RESULT %s" % r)
    return d


def torch_reference(T):
    """The uninterrupted run's DIGEST (same arguments, no shim), once per run."""
    if T.run.ref_digest is None:
        p = T.start("ref", torch_argv(T), shim=False)
        p.send("go")
        torch_steps(p, TORCH_STEPS, TORCH_STEPS)
        torch_steps(p, TORCH_STEPS, 2 * TORCH_STEPS)
        T.run.ref_digest = torch_check(p)
    return T.run.ref_digest


def t_image_torch(T):
    if T.run.stand_in and not T.run.torch_stub:
        raise NotRun("PyTorch does not run on the stand-in driver")
    ref = torch_reference(T)
    p = T.start("cr", torch_argv(T))
    p.send("go")
    torch_steps(p, TORCH_STEPS, TORCH_STEPS)
    img = T.image("img")
    T.checkpoint(p, img)
    T.gone(p)
    T.restore(p, img)
    torch_steps(p, TORCH_STEPS, 2 * TORCH_STEPS)
    d = torch_check(p)
    check(d == ref, "DIGEST %s, uninterrupted %s" % (d, ref))
    check(I.wait_gone(p.pid, 60), "process %d did not exit after RESULT" % p.pid)


def t_image_leave_running(T):
    img = T.image("img")
    if T.run.stand_in and not T.run.torch_stub:
        T.note("stand-in: gcr-testprog --chunks (no torch)")
        p, before = tp_ready(T, "tp", min(256, T.run.tp_mib))
        T.checkpoint(p, img, "--leave-running")
        check(I.alive(p.pid) and (T.place.gpu_mib(p.pid) or 0) > 0, "not running and resident after --leave-running")
        after = tp_verify(p)
        check(after == before, "after --leave-running (chunks, zero bytes) = %s, before %s" % (after, before))
        tp_finish(p)
    else:
        ref = torch_reference(T)
        p = T.start("lr", torch_argv(T))
        p.send("go")
        torch_steps(p, TORCH_STEPS, TORCH_STEPS)
        T.checkpoint(p, img, "--leave-running")
        check(I.alive(p.pid), "process %d gone after --leave-running" % p.pid)
        mib = T.place.gpu_mib(p.pid)
        check(mib is not None and mib > 0, "process holds %s MiB on the GPU after --leave-running" % mib)
        torch_steps(p, TORCH_STEPS, 2 * TORCH_STEPS)
        d = torch_check(p)
        check(d == ref, "DIGEST %s, uninterrupted %s" % (d, ref))
    check(os.path.isfile(os.path.join(img, "manifest.json")), "the image went away")


TESTS = [
    ("image-testprog", t_image_testprog, 60, ["testprog", "module"]),
    ("image-torch", t_image_torch, 180, ["torch_serve"]),
    ("image-leave-running", t_image_leave_running, 180, ["torch_serve", "testprog"]),
    ("image-corrupt", t_image_corrupt, 60, ["testprog", "module"]),
]


class Run:
    def __init__(self, a):
        self.dir = a.dir
        os.makedirs(self.dir, exist_ok=True)
        self.place = I.Place(os.path.join(self.dir, "run-%d" % os.getpid()), criu=a.criu, stand_in=a.stand_in,
                             stand_in_mib=a.stand_in_mib)
        self.stand_in = a.stand_in
        self.tp_mib = a.testprog_mib
        self.torch_gib = TORCH_GIB
        self.ref_digest = None
        # On the stand-in, TORCH_SERVE may name a program that speaks torch_serve's protocol there
        # (a dry run of these tests' flow; PyTorch itself needs a GPU).
        self.torch_stub = bool(a.stand_in and os.environ.get("TORCH_SERVE"))
        self.log = H.JsonLog(os.environ.get("GCR_TEST_LOG", "/tmp/gcr-gpu-tests.jsonl"))
        d = os.environ.get("GCR_DEADLINE")
        self.deadline = float(d) if d else None

    def remaining_s(self):
        return float("inf") if self.deadline is None else self.deadline - time.time()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--skip", action="append", default=[])
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--criu")
    ap.add_argument("--dir", default="/var/tmp/gcr-image-tests", help="images and FIFOs go here")
    ap.add_argument("--stand-in", metavar="BUILD")
    ap.add_argument("--stand-in-mib", type=int, default=2048)
    ap.add_argument("--testprog-mib", type=int, default=TP_MIB)
    ap.add_argument("--keep-logs", action="store_true")
    a = ap.parse_args(argv)
    sel = [t for t in TESTS if (not a.only or any(re.search(r, t[0]) for r in a.only))
           and not any(re.search(r, t[0]) for r in a.skip)]
    if a.list:
        for name, _, est, needs in sel:
            print("%-22s ~%3d s  needs %s" % (name, est, ", ".join(needs)))
        return 0
    run = Run(a)
    criu_why = run.place.criu_problem()
    run.log.write(kind="run-start", suite="image", argv=sys.argv, criu=run.place.criu, stand_in=a.stand_in)
    print("image tests: %d selected, criu %s, dir %s, logs %s" % (len(sel), run.place.criu, a.dir, run.place.log_dir),
          flush=True)
    counts = {"PASS": 0, "FAIL": 0, "NOT RUN": 0}
    try:
        for name, fn, est, needs in sel:
            status, reason, notes, t0 = "PASS", "", [], time.time()
            missing = run.place.missing(*needs) + run.place.missing("gcrctl", "shim")
            if name == "image-leave-running":  # one of its two programs is enough
                torch_lr = not a.stand_in or run.torch_stub
                missing = [m for m in missing if not m.startswith("testprog" if torch_lr else "torch_serve")]
            if criu_why:
                status, reason = "FAIL", criu_why
            elif missing:
                status, reason = "NOT RUN", "missing " + ", ".join(missing)
            elif run.remaining_s() < est:
                status, reason = "NOT RUN", "time budget (%.0f s left, needs ~%d s)" % (run.remaining_s(), est)
            else:
                print("--- %s %s" % (time.strftime("%H:%M:%S"), name), flush=True)
                T = Ctx(run, name)
                status, reason = H.run_case(T, fn, NotRun, (I.Fail, H.HarnessError))
                notes = T.notes
            counts[status] += 1
            H.report_case(run.log, name, status, reason, notes, t0)
    finally:
        run.place.close()
        if not a.keep_logs:
            shutil.rmtree(run.place.work_dir, ignore_errors=True)
        run.log.close()
    print("%d passed, %d failed, %d skipped" % (counts["PASS"], counts["FAIL"], counts["NOT RUN"]), flush=True)
    if counts["FAIL"]:
        return 1
    return 3 if counts["NOT RUN"] else 0


if __name__ == "__main__":
    sys.exit(main())
