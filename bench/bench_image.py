# bench/bench_image.py: process images (issue 18) measured in one run: the disk's own bandwidth as the floor,
# GCR image checkpoint/restore, the driver's checkpoint plus CRIU alone, and a cold start of the same process.
"""Usage: python3 bench/bench_image.py [--sizes "1 16 64"] [--prog torch|testprog] [--dir /var/tmp/gcr-bench-img]
           [--disk-gib 4] [--cold-reps 2] [--steps-before 8] [--steps-after 8] [--criu PATH]
           [--budget-s S] [--log FILE] [--stand-in BUILD_DIR [--stand-in-mib MIB]] [--cases LIST]

Per size (GiB of weights), in this order, all on the filesystem of --dir:
  disk:    once, first: a --disk-gib file written sequentially with O_DIRECT (then fsync), read with
           O_DIRECT, written buffered + fsync, read from the page cache (read once untimed, then timed).
  weights: torch: tests/gpu/torch_serve.py --save-weights (safetensors), kept for this size only.
  ref:     the process uninterrupted (no shim, no C/R): go, steps A, steps B, check -> DIGEST.
  cold:    spawn -> READY of the same process without the shim (weights from safetensors to the GPU),
           --cold-reps times with the page cache dropped (sync; echo 3 > /proc/sys/vm/drop_caches) and
           --cold-reps times warm (the weights file read once before).
  gcr:     under LD_PRELOAD of the shim, stdin/stdout FIFOs: go, steps A, (staging ready),
           gcrctl checkpoint --image (the process ends), every image file read once (page cache),
           gcrctl restore --image, steps B, check: DIGEST must equal ref's and RESULT ok.
  driver:  the same without the shim, gcrctl checkpoint --image --driver-only (the driver's
           checkpoint moves GPU state to host memory, CRIU dumps all of it), restore, same checks.
--prog testprog (gcr-testprog --mib; on the stand-in driver with --stand-in BUILD): no weights file;
"steps" are its --iters, all before the checkpoint; bit-exact = its own exact final check (RESULT ok),
no DIGEST. Each image is deleted after use. A case that does not fit (disk space for its image or the
weights file, host memory, the time left in --budget-s / GCR_DEADLINE) or cannot run (no CRIU, page
cache not droppable) prints "NOT RUN: <why>" and the table says so. Raw JSON lines go to --log; a
markdown table with the done-when checks (issue 18) goes to stdout. Exit: 0 every case ran and was
bit-exact, 1 a case failed, 3 none failed but some did not run (the done-when checks are in the table).
A size too long for one command (64 GiB) runs as several, e.g. --cases disk,ref,gcr / ref,driver / cold,
each with its own --log; --table-from LOG... then prints one table from all of them (no GPU needed).
"""

import argparse
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "gpu"))
import harness as H  # noqa: E402
import image_proc as I  # noqa: E402

GIB = 1 << 30
BLOCK = 64 << 20  # bytes per write/read call in the disk floor (O_DIRECT needs aligned buffers: mmap is)
PAR_PATTERNS = ((2, 8), (8, 4))  # (piece MiB, threads): the shim writes up to 8 MiB pieces
RSS_MARGIN = 4 * GIB  # bytes: CPU side of a process in its image (torch: a few GiB of resident memory)


class NotRun(Exception):
    pass


def gib_s(nbytes, secs):
    return nbytes / GIB / secs if secs and secs > 0 else None


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def read_all(fd, buf):
    """Reads fd from its offset to the end through buf; the bytes read."""
    got = 0
    while True:
        k = os.readv(fd, [buf])
        if k <= 0:
            return got
        got += k


def disk_free(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fmt_gib(n):
    return "%.2f GiB" % (n / GIB)


def drop_caches():
    """sync; echo 3 > /proc/sys/vm/drop_caches; None, or why it could not."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError as e:
        return "cannot drop the page cache (%s; needs root and a writable /proc/sys)" % e
    return None


def ctl_record(r):
    return {"ok": r.ok, "rc": r.rc, "wall_ms": round(r.wall_ms, 3), "json": r.data, "error": r.error,
            "argv": r.argv[1:]}


class Torch:
    """tests/gpu/torch_serve.py --commands, its weights from safetensors (or generated on the GPU
    when the disk cannot hold the file and an image at once: same bytes, noted)."""

    name = "torch"
    ready = r"^READY pid=(\d+) bytes=(\d+)"
    has_digest = True

    def __init__(self, b, gib):
        self.b, self.gib = b, gib
        self.file = os.path.join(b.a.dir, "weights-%g.safetensors" % gib)

    def base(self):
        return [self.b.place.python, self.b.place.torch_serve]

    def argv(self, src):
        w = ["--weights-file", self.file] if src == "file" else ["--weights-gib", self.gib]
        return self.base() + ["--commands"] + w + self.b.a.torch_arg

    def save(self):
        tmp = self.b.a.dir
        cp = subprocess.run(self.base() + ["--save-weights", self.file, "--weights-gib", str(self.gib)],
                            capture_output=True, text=True, timeout=600 + 60 * self.gib, cwd=tmp)
        if cp.returncode != 0 or "SAVED" not in cp.stdout:
            raise I.Fail("torch_serve --save-weights: exit %d: %s %s" % (cp.returncode, cp.stdout[-500:],
                                                                         cp.stderr[-1500:]))
        return cp.stdout.strip().splitlines()[-1]

    def begin(self, p, timeout):
        p.send("go")
        a = self.b.a.steps_before
        p.send("steps %d" % a)
        p.expect(r"^STEPS total=%d$" % a, timeout, what="STEPS total=%d" % a)

    def end(self, p, timeout):
        a, b = self.b.a.steps_before, self.b.a.steps_after
        p.send("steps %d" % b)
        p.expect(r"^STEPS total=%d$" % (a + b), timeout, what="STEPS total=%d" % (a + b))
        p.send("check")
        d = p.expect(r"^DIGEST ([0-9a-f]{64})$", timeout, what="DIGEST").group(1)
        r = p.expect(r"^RESULT (.*)$", timeout, what="RESULT").group(1).strip()
        return d, r


class Testprog:
    """gcr-testprog --mib (the stand-in's dry run): its iterations run after "go", before the
    checkpoint; "check" then runs its exact check of every buffer."""

    name = "testprog"
    ready = r"^READY pid=(\d+) bytes=(\d+)"
    has_digest = False

    def __init__(self, b, gib):
        self.b, self.gib = b, gib
        self.file = None

    def argv(self, src):
        a = self.b.a
        return self.b.place.testprog_argv(round(self.gib * 1024), "--buffers", 8, "--wait", "--threads", 1,
                                          "--iters", a.steps_before + a.steps_after)

    def begin(self, p, timeout):
        p.send("go")
        p.expect(r"^DONE$", timeout, what="DONE")

    def end(self, p, timeout):
        p.send("check")
        return None, p.expect(r"^RESULT (.*)$", timeout, what="RESULT").group(1).strip()


class Bench:
    def __init__(self, a):
        self.a = a
        os.makedirs(a.dir, exist_ok=True)
        self.place = I.Place(os.path.join(a.dir, "run-%d" % os.getpid()), criu=a.criu, stand_in=a.stand_in,
                             stand_in_mib=a.stand_in_mib)
        self.log = H.JsonLog(a.log)
        self.t_end = time.time() + a.budget_s
        dl = os.environ.get("GCR_DEADLINE")
        if dl:
            try:
                self.t_end = min(self.t_end, float(dl))
            except ValueError:
                pass
        self.disk = {}
        self.res = {}  # gib -> case -> record
        self.failed = self.not_run = 0

    # ---- bookkeeping ----
    def left(self):
        return self.t_end - time.time()

    def plan(self, what, est_s):
        """Prints the estimate; NotRun when the budget cannot hold it."""
        print("--- %s %s: estimate %.0f s, %.0f s of the budget left" % (time.strftime("%H:%M:%S"), what, est_s,
                                                                        self.left()), flush=True)
        if est_s > self.left():
            raise NotRun("time budget: estimate %.0f s, %.0f s left" % (est_s, self.left()))

    def record(self, gib, case, rec):
        rec.setdefault("status", "ok")
        self.res.setdefault(gib, {})[case] = rec
        self.log.write(kind="bench_image", case=case, gib=gib, prog=self.a.prog, **rec)
        if rec["status"] == "NOT RUN":
            self.not_run += 1
            print("NOT RUN %s %g GiB: %s" % (case, gib, rec["why"]), flush=True)
        elif rec["status"] == "FAIL":
            self.failed += 1
            print("FAIL %s %g GiB: %s" % (case, gib, rec["error"]), flush=True)
        else:
            print("ok %s %g GiB: %s" % (case, gib, rec.get("summary", "")), flush=True)

    def bw(self, key, default):
        v = self.disk.get(key)
        return v if isinstance(v, (int, float)) and v > 0 else default

    def est_start(self, gib, cold=False):
        if self.a.prog == "torch":
            rd = self.bw("read_direct", 1.0 * GIB) if cold else self.bw("read_cache", 4.0 * GIB)
            return 15.0 + gib * GIB / rd + gib * 0.1
        return 1.0 + gib * 0.5

    def est_cr(self, gib, mode):
        w = max(self.bw("write_direct", 1.0 * GIB), self.bw("write_direct_par", 1.0 * GIB),
                self.bw("write_buffered_fsync", 1.0 * GIB))
        c = self.bw("read_cache", 4.0 * GIB)
        per = 1.5 if mode == "driver" else 0.5  # s/GiB beyond the disk: driver checkpoint/restore, hashing
        return self.est_start(gib) + 2 * gib * GIB / w + gib * GIB / c + per * gib + 10.0

    # ---- cases ----
    def disk_floor(self):
        a = self.a
        n = int(a.disk_gib * GIB) // BLOCK * BLOCK
        rec = {"bytes": n, "dir": a.dir}
        try:
            self.plan("disk floor (%s)" % fmt_gib(n), 4 * n / GIB + 10)
            free = disk_free(a.dir)
            if free < n + GIB:
                raise NotRun("disk: %s free on %s, %s needed" % (fmt_gib(free), a.dir, fmt_gib(n + GIB)))
            path = os.path.join(a.dir, "floor.bin")
            buf = mmap.mmap(-1, BLOCK)
            buf.write(os.urandom(BLOCK))  # incompressible
            try:
                rec["write_direct"], rec["read_direct"] = self._direct(path, buf, n)
                # The shim writes 2 MiB chunks from several threads: the disk's floor is the best of
                # one stream and as many as the shim uses, so the bound is never against a slower disk.
                # Two patterns the shim could use (2 MiB pieces from 8 threads, 8 MiB from 4): the
                # floor takes the faster, per direction.
                pats = {}
                for piece_mib, threads in PAR_PATTERNS:
                    pats["%dMiBx%d" % (piece_mib, threads)] = self._direct_par(path, buf, n, threads, piece_mib << 20)
                rec["direct_par_patterns"] = {k: {"write": w, "read": r} for k, (w, r) in pats.items()}
                rec["write_direct_par"] = max(w for w, _ in pats.values())
                rec["read_direct_par"] = max(r for _, r in pats.values())
            except OSError as e:
                rec["direct_not_run"] = "O_DIRECT on %s: %s" % (a.dir, e)
                print("NOT RUN disk direct I/O: %s" % rec["direct_not_run"], flush=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            t0 = time.perf_counter()
            for _ in range(n // BLOCK):
                if os.write(fd, buf) != BLOCK:
                    raise OSError("short write")
            os.fsync(fd)
            rec["write_buffered_fsync"] = n / (time.perf_counter() - t0)
            os.close(fd)
            fd = os.open(path, os.O_RDONLY)
            for timed in (False, True):  # once to be sure it is all cached, then timed
                os.lseek(fd, 0, os.SEEK_SET)
                t0 = time.perf_counter()
                got = read_all(fd, buf)
                if timed:
                    rec["read_cache"] = got / (time.perf_counter() - t0)
            os.close(fd)
            os.unlink(path)
            self.disk = rec
            rec["summary"] = ", ".join("%s %.2f GiB/s" % (k, rec[k] / GIB) for k in
                                       ("write_direct", "write_direct_par", "write_buffered_fsync", "read_direct",
                                        "read_direct_par", "read_cache")
                                       if k in rec)
        except NotRun as e:
            rec.update(status="NOT RUN", why=str(e))
        except OSError as e:
            rec.update(status="FAIL", error="disk floor: %s" % e)
        self.record(0, "disk", rec)

    @staticmethod
    def _direct_par(path, buf, n, threads, piece):
        """n bytes in `piece`-byte pieces by `threads` threads (thread k takes pieces k, k+threads,
        ...) with O_DIRECT pwrite/pread (the GIL is released during the call), fsync after the
        writes; returns (write, read) bytes/s."""
        view = memoryview(buf)[:piece]
        count = n // piece

        def run(fd, write):
            errs = []

            def worker(k):
                try:
                    for i in range(k, count, threads):
                        got = os.pwrite(fd, view, i * piece) if write else os.preadv(fd, [view], i * piece)
                        if got != piece:
                            raise OSError("short O_DIRECT %s" % ("write" if write else "read"))
                except OSError as e:
                    errs.append(e)
            ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            if write:
                os.fsync(fd)
            dt = time.perf_counter() - t0
            if errs:
                raise errs[0]
            return count * piece / dt
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
        try:
            w = run(fd, True)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            r = run(fd, False)
        finally:
            os.close(fd)
        return w, r

    @staticmethod
    def _direct(path, buf, n):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
        try:
            t0 = time.perf_counter()
            for _ in range(n // BLOCK):
                if os.write(fd, buf) != BLOCK:
                    raise OSError("short O_DIRECT write")
            os.fsync(fd)
            w = n / (time.perf_counter() - t0)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            t0 = time.perf_counter()
            r = read_all(fd, buf) / (time.perf_counter() - t0)
        finally:
            os.close(fd)
        return w, r

    def run_size(self, gib):
        a = self.a
        wl = Torch(self, gib) if a.prog == "torch" else Testprog(self, gib)
        size = int(gib * GIB)
        image_need = int(size * 1.05) + RSS_MARGIN
        src, file_why = "gen", None
        cases = a.cases
        if wl.file is not None:
            free = disk_free(a.dir)
            both = free >= size + GIB + image_need  # the file and an image at once
            rec = {}
            if not both and any(c in cases for c in ("ref", "gcr", "driver")):
                rec["note"] = ("the ref/C-R processes generate their weights on the GPU (the same bytes): %s free "
                               "on %s holds the file (%s) or an image (up to %s), not both" %
                               (fmt_gib(free), a.dir, fmt_gib(size), fmt_gib(image_need)))
                print("  note: " + rec["note"], flush=True)
            if free < size + GIB:
                file_why = "disk: weights file needs %s, %s free on %s" % (fmt_gib(size + GIB), fmt_gib(free), a.dir)
            elif "cold" in cases or (both and any(c in cases for c in ("ref", "gcr", "driver"))):
                try:
                    self.plan("weights file %g GiB" % gib, 15 + gib * GIB / self.bw("write_buffered_fsync", GIB))
                    t0 = time.perf_counter()
                    rec["saved"] = wl.save()
                    rec["s"] = round(time.perf_counter() - t0, 3)
                    rec["summary"] = "%s (%.1f s)" % (rec["saved"], rec["s"])
                    src = "file" if both else "gen"
                except (NotRun, I.Fail, subprocess.TimeoutExpired) as e:
                    file_why = "weights file: %s" % e
                    rec.update(status="NOT RUN" if isinstance(e, NotRun) else "FAIL", why=str(e), error=str(e))
            else:
                file_why = "not needed by these cases"
                rec["summary"] = "not written (" + file_why + ")"
            rec["weights_src"] = src
            self.record(gib, "weights", rec)
        ref = self.case(gib, "ref", cases, lambda: self.ref(wl, src), self.est_start(gib) + 20)
        if "cold" in cases:
            for kind in ("cold", "warm"):
                name = "cold_start_" + kind
                if wl.file is not None and not os.path.exists(wl.file):
                    self.record(gib, name, {"status": "NOT RUN", "why": file_why or "no weights file"})
                    continue
                self.case(gib, name, cases + [name], lambda k=kind: self.cold(wl, k),
                          a.cold_reps * (self.est_start(gib, kind == "cold") + 5))
        if src == "gen" and wl.file and os.path.exists(wl.file):
            os.unlink(wl.file)
        for mode in ("gcr", "driver"):
            self.case(gib, mode, cases, lambda m=mode: self.cr(wl, m, src, ref, image_need), self.est_cr(gib, mode))
        if wl.file and os.path.exists(wl.file):
            os.unlink(wl.file)

    def case(self, gib, name, cases, fn, est):
        """Runs fn (a record, or NotRun / Fail) when its name is in cases and it fits; records it."""
        if name not in cases:
            return None
        try:
            self.plan("%s %g GiB (%s)" % (name, gib, self.a.prog), est)
            rec = fn()
        except NotRun as e:
            rec = {"status": "NOT RUN", "why": str(e)}
        except (I.Fail, H.HarnessError, OSError, subprocess.SubprocessError) as e:
            rec = {"status": "FAIL", "error": str(e)}
        self.record(gib, name, rec)
        return rec

    def ready(self, p, wl, timeout):
        m = p.expect(wl.ready, timeout, what="READY")
        pid = int(m.group(1))
        I.check(pid == p.pid, "READY pid %d is not the pid started (%d)" % (pid, p.pid))
        return pid, int(m.group(2)), time.perf_counter() - p.t0

    def timeout(self, gib):
        return 300.0 + 30.0 * gib

    def ref(self, wl, src):
        p = I.FifoProc(self.place, "ref-%g" % wl.gib, wl.argv(src), shim=False)
        try:
            pid, nbytes, ready_s = self.ready(p, wl, self.timeout(wl.gib))
            wl.begin(p, self.timeout(wl.gib))
            digest, result = wl.end(p, self.timeout(wl.gib))
            I.check(result == "ok", "uninterrupted run: RESULT %s" % result)
            return {"digest": digest, "result": result, "ready_s": round(ready_s, 3), "bytes": nbytes,
                    "weights_src": src, "summary": "%s, READY in %.1f s" % ("DIGEST " + digest if digest else "RESULT ok", ready_s)}
        finally:
            p.close()

    def cold(self, wl, kind):
        a = self.a
        times = []
        if kind == "warm" and wl.file:
            self._cache_file(wl.file)
        for rep in range(a.cold_reps):
            if kind == "cold":
                why = drop_caches()
                if why:
                    raise NotRun(why)
            p = I.FifoProc(self.place, "%s-%g-r%d" % (kind, wl.gib, rep), wl.argv("file"), shim=False)
            try:
                times.append(self.ready(p, wl, self.timeout(wl.gib))[2])
            finally:
                p.close()
        med = statistics.median(times)
        return {"s": [round(t, 3) for t in times], "median_s": round(med, 3),
                "summary": "spawn -> READY %.2f s median of %s" % (med, ["%.2f" % t for t in times])}

    @staticmethod
    def _cache_file(path):
        buf = bytearray(16 << 20)
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass

    def cr(self, wl, mode, src, ref, image_need):
        a = self.a
        why = self.place.criu_problem()
        if why:
            raise NotRun(why)
        if ref is None or ref.get("status") != "ok":
            raise NotRun("no uninterrupted run to compare with")
        free = disk_free(a.dir)
        if free < image_need:
            raise NotRun("disk: the image needs up to %s, %s free on %s" % (fmt_gib(image_need), fmt_gib(free), a.dir))
        avail = mem_available()
        need_mem = int(wl.gib * GIB * 1.1) + 2 * GIB
        if avail is not None and avail < need_mem:
            raise NotRun("host memory: %s available, %s needed (the GPU data passes through host memory)" %
                         (fmt_gib(avail), fmt_gib(need_mem)))
        img = os.path.join(a.dir, "img-%s-%g" % (mode, wl.gib))
        self._rm_image(img)
        shim = mode == "gcr"
        flags = [] if shim else ["--driver-only"]
        to = self.timeout(wl.gib)
        rec = {"mode": mode, "weights_src": src, "image": img}
        p = I.FifoProc(self.place, "%s-%g" % (mode, wl.gib), wl.argv(src), shim=shim)
        try:
            pid, nbytes, ready_s = self.ready(p, wl, to)
            rec.update(pid=pid, bytes_ready=nbytes, ready_s=round(ready_s, 3))
            wl.begin(p, to)
            if shim:
                rec["staging_wait_s"] = H.wait_staging_ready(self.place, pid, 120 + wl.gib * 5)
            rec["gpu_mib_running"] = self.place.gpu_mib(pid)
            c = self.place.ctl("checkpoint", "--image", img, *flags, pid, timeout=int(to))
            rec["checkpoint"] = ctl_record(c)
            I.check(c.ok, "checkpoint: %s" % c.error)
            p.reap(60)
            I.check(I.wait_gone(pid, 60), "process %d still running after the checkpoint" % pid)
            rec["gpu_mib_after_checkpoint"] = self.place.gpu_mib(pid)
            I.check(rec["gpu_mib_after_checkpoint"] == 0, "GPU memory held after the checkpoint: %s MiB" %
                    rec["gpu_mib_after_checkpoint"])
            rec["image_du"], rec["image_bytes"] = I.du_bytes(img)
            cached, cache_s = I.cache_dir(img)
            rec["cache_read"] = {"bytes": cached, "s": round(cache_s, 3)}
            r = self.place.ctl("restore", "--image", img, timeout=int(to))
            rec["restore"] = ctl_record(r)
            I.check(r.ok, "restore: %s" % r.error)
            I.check(H.dig(r.data, "pid") == pid, "restored pid %s, expected %d" % (H.dig(r.data, "pid"), pid))
            p.restored = True
            rec["gpu_mib_restored"] = self.place.gpu_mib(pid)
            digest, result = wl.end(p, to)
            rec.update(digest=digest, result=result)
            exact = result == "ok" and (not wl.has_digest or digest == ref.get("digest"))
            rec["bit_exact"] = exact
            I.check(exact, "not bit-exact: RESULT %s, DIGEST %s, uninterrupted %s" % (result, digest, ref.get("digest")))
            I.check(I.wait_gone(pid, 60), "restored process %d did not exit after RESULT" % pid)
            b = H.dig(c.data, "bytes") or {}
            rec["summary"] = ("checkpoint %.2f s, restore %.2f s (gcrctl wall), image %s on disk, %s" % (
                c.wall_ms / 1e3, r.wall_ms / 1e3, fmt_gib(rec["image_du"]),
                "DIGEST equal" if wl.has_digest else "RESULT ok"))
            rec["bytes"] = b
            return rec
        except I.Fail as e:
            rec.update(status="FAIL", error=str(e))
            return rec
        finally:
            p.close()
            self._rm_image(img)

    def _rm_image(self, img):
        parent = os.path.dirname(img)
        for f in os.listdir(parent):
            if f == os.path.basename(img) or f.startswith(os.path.basename(img) + ".partial."):
                shutil.rmtree(os.path.join(parent, f), ignore_errors=True)

    def close(self):
        self.place.close()
        if not self.a.keep_logs:
            shutil.rmtree(self.place.work_dir, ignore_errors=True)
        self.log.close()


# ---- the table ----

def cell_status(rec):
    if rec is None:
        return "not asked"
    if rec.get("status") == "NOT RUN":
        return "NOT RUN: %s" % rec["why"]
    if rec.get("status") == "FAIL":
        return "FAIL: %s" % (rec["error"].splitlines() or [""])[0][:120]
    return None


def secs(rec, op):
    """Wall seconds of gcrctl's op (checkpoint/restore) in a C/R record, None when it did not run."""
    if rec is None or rec.get("status") != "ok":
        return None
    return rec[op]["wall_ms"] / 1e3


def image_ratio(rec):
    """Image size on disk (du) / (non-zero GPU bytes + CPU resident), from gcrctl's bytes."""
    if rec is None or rec.get("status") != "ok":
        return None
    b = rec.get("bytes") or {}
    nz = b.get("written")
    if nz is None and isinstance(b.get("gpu"), int) and isinstance(b.get("zero"), int):
        nz = b["gpu"] - b["zero"]
    rss = b.get("rss")
    if not isinstance(nz, int) or not isinstance(rss, int) or nz + rss <= 0:
        return None
    return rec["image_du"] / float(nz + rss)


def table(a, d, res, criu):
    """The markdown tables: a (sizes, dir, prog, steps), d the disk floor record, res {gib: {case: record}}."""
    out = []
    out.append("## Disk floor (%s, %s file)" % (a.dir, fmt_gib(d.get("bytes", 0)) if d else "-"))
    out.append("")
    if not d:
        drec = res.get(0, {}).get("disk")
        out.append(cell_status(drec) or "not measured")
    else:
        out.append("| direct write, 1 stream | direct write, parallel (best of 2 MiB x 8, 8 MiB x 4) | buffered write"
                   " + fsync | direct read, 1 stream | direct read, parallel | page-cache read |")
        out.append("|---|---|---|---|---|---|")
        out.append("| %s |" % " | ".join(("%.2f GiB/s" % (d[k] / GIB)) if k in d else
                                          ("NOT RUN: %s" % d.get("direct_not_run", "?"))
                                          for k in ("write_direct", "write_direct_par", "write_buffered_fsync",
                                                    "read_direct", "read_direct_par", "read_cache")))
    wbw = max([d[k] for k in ("write_direct", "write_direct_par", "write_buffered_fsync") if k in d] or [0])
    sizes = [g for g in a.sizes]
    out.append("")
    out.append("## Images: %s, %d + %d steps, criu %s" % (a.prog, a.steps_before, a.steps_after, criu))
    out.append("")
    out.append("| | " + " | ".join("%g GiB" % g for g in sizes) + " |")
    out.append("|---|" + "---|" * len(sizes))

    def row(label, fn):
        cells = []
        for g in sizes:
            try:
                v = fn(res.get(g, {}), g)
            except (KeyError, TypeError, ZeroDivisionError) as e:
                v = "n/a (%s)" % e
            cells.append(v if v is not None else "-")
        out.append("| %s | %s |" % (label, " | ".join(cells)))

    def cr_cell(case, op):
        def f(r, g):
            rec = r.get(case)
            s = cell_status(rec)
            if s:
                return s
            j = rec[op]["json"] or {}
            t = H.dig(j, "ms", "total")
            return "%.2f s (gcrctl %s ms)" % (rec[op]["wall_ms"] / 1e3, "%.0f" % t if isinstance(t, (int, float)) else "?")
        return f

    def floor_cell(r, g):
        if not wbw:
            return None
        return "write %.1f s, read (cache) %s" % (g * GIB / wbw, "%.1f s" % (g * GIB / d["read_cache"])
                                                  if "read_cache" in d else "-")

    def ratio(case_a, case_b, op):
        def f(r, g):
            x, y = secs(r.get(case_a), op), secs(r.get(case_b), op)
            return "%.1fx" % (x / y) if x and y else None
        return f

    def cold_cell(kind):
        def f(r, g):
            rec = r.get("cold_start_" + kind)
            return cell_status(rec) or "%.2f s" % rec["median_s"]
        return f

    def img_cell(case):
        def f(r, g):
            rec = r.get(case)
            s = cell_status(rec)
            if s:
                return s
            q = image_ratio(rec)
            return "%s, %s" % (fmt_gib(rec["image_du"]), "%.3f" % q if q else "ratio n/a")
        return f

    def exact_cell(r, g):
        parts = []
        for case in ("gcr", "driver"):
            rec = r.get(case)
            if rec is None:
                continue
            if rec.get("status") in ("NOT RUN", "FAIL") and not rec.get("bit_exact") is False:
                parts.append("%s %s" % (case, rec["status"]))
            else:
                parts.append("%s %s" % (case, "yes" if rec.get("bit_exact") else "no"))
        return ", ".join(parts) or None

    row("disk floor for this size", floor_cell)
    row("GCR checkpoint", cr_cell("gcr", "checkpoint"))
    row("GCR restore (image in page cache)", cr_cell("gcr", "restore"))
    row("driver+CRIU checkpoint", cr_cell("driver", "checkpoint"))
    row("driver+CRIU restore", cr_cell("driver", "restore"))
    row("driver+CRIU / GCR, checkpoint", ratio("driver", "gcr", "checkpoint"))
    row("driver+CRIU / GCR, restore", ratio("driver", "gcr", "restore"))
    row("cold start, warm (spawn -> READY)", cold_cell("warm"))
    row("cold start, page cache dropped", cold_cell("cold"))
    row("GCR image (du), / (non-zero GPU + rss)", img_cell("gcr"))
    row("driver+CRIU image (du), / (GPU + rss)", img_cell("driver"))
    row("bit-exact (%s)" % ("DIGEST = uninterrupted" if a.prog == "torch" else "RESULT ok"), exact_cell)

    # done-when (issue 18), from the same run
    def verdict(ok, text):
        return "%s %s" % ("PASS" if ok else "MISS", text)

    def chk_ckpt(r, g):
        s = secs(r.get("gcr"), "checkpoint")
        if s is None or not wbw:
            return "NOT RUN"
        bound = 1.15 * g * GIB / wbw + 1.0
        return verdict(s <= bound, "%.2f s <= %.2f s" % (s, bound))

    def chk_restore2(r, g):
        if g != 16:
            return None
        s = secs(r.get("gcr"), "restore")
        return "NOT RUN" if s is None else verdict(s <= 2.0, "%.2f s <= 2 s" % s)

    def chk_restore_cold(r, g):
        s = secs(r.get("gcr"), "restore")
        w = r.get("cold_start_warm")
        if s is None or cell_status(w):
            return "NOT RUN"
        return verdict(w["median_s"] >= 3 * s, "warm start %.2f s / restore %.2f s = %.1fx >= 3x" %
                       (w["median_s"], s, w["median_s"] / s))

    def chk_image(r, g):
        q = image_ratio(r.get("gcr"))
        return "NOT RUN" if q is None else verdict(q <= 1.02, "%.3f <= 1.02" % q)

    def chk_vs_driver(r, g):
        out_ = []
        for op in ("checkpoint", "restore"):
            x, y = secs(r.get("driver"), op), secs(r.get("gcr"), op)
            out_.append("%s NOT RUN" % op if not (x and y) else verdict(x >= 3 * y, "%s %.1fx" % (op, x / y)))
        return ", ".join(out_)

    row("**check** checkpoint <= 1.15 x size/write bw + 1 s", chk_ckpt)
    row("**check** restore <= 2 s (16 GiB)", chk_restore2)
    row("**check** restore >= 3x faster than warm cold start", chk_restore_cold)
    row("**check** image <= 1.02 x", chk_image)
    row("**check** GCR >= 3x faster than driver+CRIU", chk_vs_driver)
    out.append("")
    out.append("Write bandwidth used for the bound: the fastest of direct (1 stream; parallel) and buffered+fsync "
               "(%s). Times are gcrctl's wall time (its own total in brackets). MISS = measured, bound not met." %
               ("%.2f GiB/s" % (wbw / GIB) if wbw else "not measured"))
    return "\n".join(out)


def table_from(a):
    import json

    disk, res, criu, sizes = {}, {}, None, set()
    for path in a.table_from:
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("kind") == "bench_image_start" and r.get("prog") == a.prog:
                    criu = r.get("criu")
                    if r.get("dir"):
                        a.dir = r["dir"]
                elif r.get("kind") == "bench_image" and r.get("prog") == a.prog:
                    res.setdefault(r["gib"], {})[r["case"]] = r
                    if r["case"] == "disk" and r.get("status") == "ok":
                        disk = r
                    elif r["gib"]:
                        sizes.add(r["gib"])
    if "--sizes" not in sys.argv:
        a.sizes = sorted(sizes)
    print(table(a, disk, res, criu))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1 16 64", help="GiB of weights (testprog: of buffers), space-separated")
    ap.add_argument("--prog", choices=["torch", "testprog"], default="torch")
    ap.add_argument("--dir", default="/var/tmp/gcr-bench-img", help="where images, weights and the floor file go")
    ap.add_argument("--disk-gib", type=float, default=4.0)
    ap.add_argument("--cold-reps", type=int, default=2)
    ap.add_argument("--steps-before", type=int, default=8)
    ap.add_argument("--steps-after", type=int, default=8)
    ap.add_argument("--criu", help="CRIU binary (passed to gcrctl as GCR_CRIU; its lib/ beside it on LD_LIBRARY_PATH)")
    ap.add_argument("--budget-s", type=float, default=3600.0, help="no case starts that would not end within this")
    ap.add_argument("--cases", default="disk,ref,cold,gcr,driver",
                    help="comma-separated subset of disk,ref,cold,gcr,driver (gcr and driver need ref)")
    ap.add_argument("--torch-arg", action="append", default=[], help="one more argument for torch_serve (repeat)")
    ap.add_argument("--log", default=os.environ.get("GCR_BENCH_LOG", "/tmp/gcr-bench-image.jsonl"))
    ap.add_argument("--stand-in", metavar="BUILD", help="run on the stand-in driver of this build dir (testprog)")
    ap.add_argument("--stand-in-mib", type=int, default=4096, help="the stand-in GPU's memory (MiB)")
    ap.add_argument("--keep-logs", action="store_true", help="keep --dir/run-PID (FIFO programs' output, shim logs)")
    ap.add_argument("--table-from", nargs="+", metavar="LOG",
                    help="run nothing: the table from these logs' records (later records of a size and case "
                         "win), e.g. 64 GiB measured in several commands")
    a = ap.parse_args(argv)
    a.sizes = [float(x) for x in a.sizes.replace(",", " ").split()]
    if a.table_from:
        return table_from(a)
    a.cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    if a.stand_in and a.prog == "torch" and not os.environ.get("TORCH_SERVE"):
        ap.error("--stand-in: PyTorch does not run on the stand-in driver: --prog testprog (or TORCH_SERVE=a program "
                 "speaking torch_serve's protocol on it)")
    b = Bench(a)
    b.log.write(kind="bench_image_start", argv=sys.argv, sizes=a.sizes, prog=a.prog, dir=a.dir,
                criu=b.place.criu, stand_in=a.stand_in, mem_available=mem_available(), disk_free=disk_free(a.dir))
    print("bench_image: %s, sizes %s GiB, dir %s (%s free), host memory %s available, criu %s, log %s" % (
        a.prog, " ".join("%g" % g for g in a.sizes), a.dir, fmt_gib(disk_free(a.dir)),
        fmt_gib(mem_available() or 0), b.place.criu, a.log), flush=True)
    missing = b.place.missing("gcrctl", "shim") + (b.place.missing("testprog", "module") if a.prog == "testprog"
                                                   else b.place.missing("torch_serve"))
    try:
        if missing:
            print("FAIL: missing %s" % ", ".join(missing))
            b.failed += 1
        else:
            if "disk" in a.cases:
                b.disk_floor()
            for g in a.sizes:
                b.run_size(g)
        t = table(a, b.disk, b.res, b.place.criu)
        print()
        print(t, flush=True)
        b.log.write(kind="bench_image_table", table=t)
    finally:
        b.close()
    return 1 if b.failed else (3 if b.not_run else 0)


if __name__ == "__main__":
    sys.exit(main())
