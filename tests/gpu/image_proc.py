# tests/gpu/image_proc.py: what bench/bench_image.py and tests/gpu/test_image_gpu.py share: a program whose
# stdin/stdout are FIFOs (so CRIU can dump and restore it), gcrctl with CRIU, GPU memory, on a GPU or the stand-in.
"""As tests/flow/test_image.py does it: the program's stdin and stdout are FIFOs in a directory of
its own; we hold both ends (and a spare writer on stdout), so no read sees EOF while the process is
between CRIU's dump and its restore, and CRIU reopens them by path. No sleeps: every wait is on a
line (select with a deadline) or on an exit (a pidfd).

Two places to run: the GPU machine (paths from harness.Config, nvidia-smi) or the stand-in driver
(--stand-in BUILD: tests/fakecuda's libcuda, fakesmi, the build's gcrctl/shim/gcr-testprog)."""

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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness as H  # noqa: E402

REPO = H.REPO


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def criu_version(path, env=None):
    """CRIU's major version, or None when it does not run."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, env=env).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Version: *(\d+)\.", out)
    return int(m.group(1)) if m else None


class Place:
    """Paths and environment for one run. stand_in: a build dir (the stand-in driver), or None
    (the GPU machine). criu: a CRIU binary; its libraries are taken from lib/ beside it when there
    is one (the lead's .gpubuild/criu layout), given only to gcrctl (and so to CRIU)."""

    def __init__(self, work_dir, criu=None, stand_in=None, stand_in_mib=4096):
        self.work_dir = work_dir
        self.stand_in = os.path.abspath(stand_in) if stand_in else None
        os.makedirs(work_dir, exist_ok=True)
        self.socket_dir = tempfile.mkdtemp(prefix="sock-", dir=work_dir)
        # $GCR_LOG_DIR (run.sh packs it into logs.tar.gz) outlives the work dir; else the work dir.
        base = os.environ.get("GCR_LOG_DIR")
        self.log_dir = os.path.join(base, "image-%d" % os.getpid()) if base else os.path.join(work_dir, "logs")
        os.makedirs(self.log_dir, exist_ok=True)
        self.env = {"GCR_SOCKET_DIR": self.socket_dir, "GCR_LOG_DIR": self.log_dir}
        cfg = H.Config()
        if self.stand_in:
            b = self.stand_in
            self.fake_dir = os.path.join(b, "tests", "fakecuda")
            self.gcrctl = os.path.join(b, "node-agent", "gcrctl")
            self.shim = os.path.join(b, "shim", ".libs", "libgcr.so")
            self.testprog = os.path.join(b, "tests", "progs", "gcr-testprog")
            self.module = os.path.join(REPO, "tests", "progs", "gcr_kernels.h")
            self.fake_state = tempfile.mkdtemp(prefix="fakecuda-", dir=work_dir)
            self.env.update({"LD_LIBRARY_PATH": self.fake_dir, "FAKECUDA_DIR": self.fake_state,
                             "FAKECUDA_MEM_MIB": str(stand_in_mib)})
        else:
            self.gcrctl, self.shim, self.testprog, self.module = cfg.gcrctl, cfg.shim, cfg.testprog, cfg.fatbin
        self.cfg = cfg
        self.python = cfg.python
        self.torch_serve = cfg.torch_serve
        self.criu = criu or os.environ.get("GCR_CRIU") or self._default_criu()
        self.ctl_env = dict(self.env)
        if self.criu:
            self.ctl_env["GCR_CRIU"] = os.path.abspath(self.criu) if os.sep in self.criu else self.criu
            lib = os.path.join(os.path.dirname(os.path.abspath(self.criu)), "lib")
            if os.path.isdir(lib):
                self.ctl_env["LD_LIBRARY_PATH"] = ":".join(x for x in (lib, self.env.get("LD_LIBRARY_PATH")) if x)

    @staticmethod
    def _default_criu():
        for c in [os.path.join(REPO, ".gpubuild", "criu", "criu"), os.path.expanduser("~/.cache/gcr-criu/4.1.1/criu"),
                  shutil.which("criu")]:
            if c and os.path.exists(c):
                return c
        return None

    def criu_problem(self):
        """None when CRIU >= 4 runs, else why not."""
        if not self.criu:
            return "no CRIU: --criu, $GCR_CRIU, .gpubuild/criu/criu, ~/.cache/gcr-criu or PATH"
        v = criu_version(self.ctl_env["GCR_CRIU"], env=dict(os.environ, **self.ctl_env))
        if v is None or v < 4:
            return "CRIU %s does not run or is older than 4 (version %s)" % (self.criu, v)
        return None

    def missing(self, *names):
        return ["%s (%s)" % (n, getattr(self, n)) for n in names if not os.path.exists(getattr(self, n))]

    def testprog_argv(self, mib, *more):
        return [self.testprog, "--module", self.module, "--mib", int(mib)] + list(more)

    def proc_env(self, shim):
        """Environment of a program: the shim preloaded or not; the stand-in's libcuda either way."""
        e = dict(self.env)
        if shim:
            e["LD_PRELOAD"] = self.shim
            e["GCR_LOG_LEVEL"] = self.cfg.shim_log_level
        return e

    def ctl(self, *args, timeout=600, note=None):
        """gcrctl --json ARGS -> harness.CtlResult (never raises). note: as harness.Session.ctl's
        (its callers pass one), unused here."""
        argv = [self.gcrctl, "--json"] + [str(a) for a in args]
        env = dict(os.environ, **self.ctl_env)
        env.pop("LD_PRELOAD", None)
        t0 = time.perf_counter()
        try:
            cp = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                                timeout=timeout, env=env, cwd=REPO)
        except subprocess.TimeoutExpired:
            return H.CtlResult(argv, None, "", "", (time.perf_counter() - t0) * 1000.0, None,
                               "gcrctl timed out after %d s (killed)" % timeout)
        except OSError as e:
            return H.CtlResult(argv, None, "", "", 0.0, None, "cannot run gcrctl: %s" % e)
        wall = (time.perf_counter() - t0) * 1000.0
        data = H.parse_json_output(cp.stdout)
        err = None
        if isinstance(data, dict) and data.get("ok") is False:
            err = str(data.get("error", "")) or "(no error text)"
        elif data is None:
            err = "no JSON object on stdout (stderr: %s)" % cp.stderr.strip()[-300:]
        if cp.returncode != 0 and err is None:
            err = "exit status %d: %s" % (cp.returncode, cp.stderr.strip()[-300:])
        return H.CtlResult(argv, cp.returncode, cp.stdout, cp.stderr, wall, data, err)

    def gpu_mib(self, pid):
        """GPU memory pid holds (MiB; 0 when not listed); None when it cannot be read."""
        if self.stand_in:
            try:
                cp = subprocess.run([os.path.join(self.fake_dir, "fakesmi"), "mem", str(pid)], capture_output=True,
                                    text=True, timeout=30, env=dict(os.environ, **self.env))
            except (OSError, subprocess.TimeoutExpired):
                return None
            if cp.returncode != 0:
                return 0  # fakesmi knows no such process: it holds nothing
            return int(cp.stdout.strip() or 0) / 2**20
        return H.gpu_mem_mib(self.cfg, pid)

    def close(self):
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        if self.stand_in:
            shutil.rmtree(self.fake_state, ignore_errors=True)


def alive(pid):
    """Running, not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def wait_gone(pid, timeout):
    """Waits for pid to exit (a pidfd, not polling); True when it is gone."""
    try:
        fd = os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return not alive(pid)
    try:
        r, _, _ = select.select([fd], [], [], timeout)
        return bool(r) or not alive(pid)
    finally:
        os.close(fd)


class FifoProc:
    """A program with FIFOs for stdin and stdout in a directory of its own (kept until close(),
    since CRIU reopens them by path). lines: every stdout line so far; expect() moves a cursor."""

    def __init__(self, place, name, argv, shim, extra_env=None):
        self.place = place
        self.name = name
        self.d = tempfile.mkdtemp(prefix="proc-%s-" % re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:40], dir=place.work_dir)
        self.inp, self.outp = os.path.join(self.d, "in.fifo"), os.path.join(self.d, "out.fifo")
        os.mkfifo(self.inp)
        os.mkfifo(self.outp)
        self.w = os.open(self.inp, os.O_RDWR)
        self.r = os.open(self.outp, os.O_RDONLY | os.O_NONBLOCK)
        self.keep = os.open(self.outp, os.O_WRONLY)  # a writer always there: no EOF between dump and restore
        self.buf = b""
        self.lines = []
        self.cursor = 0
        self.err_path = os.path.join(place.log_dir, "%s.err" % os.path.basename(self.d))
        self.out_log = open(os.path.join(place.log_dir, "%s.out" % os.path.basename(self.d)), "w")
        self.out_log.write("# argv: %s\n# shim: %s\n" % (" ".join(str(a) for a in argv), shim))
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(place.proc_env(shim))
        env.update({k: str(v) for k, v in (extra_env or {}).items()})
        self.t0 = time.perf_counter()
        with open(self.err_path, "ab") as err:
            self.p = subprocess.Popen([str(a) for a in argv], stdin=self.w, stdout=self.keep, stderr=err, env=env,
                                      cwd=REPO, start_new_session=True)
        self.pid = self.p.pid
        self.restored = False

    def send(self, s):
        os.write(self.w, (s + "\n").encode())
        self.out_log.write("%9.3f in | %s\n" % (time.perf_counter() - self.t0, s))
        self.out_log.flush()

    def expect(self, pat, timeout, what=None):
        """The next stdout line (from the cursor) matching pat (re.search); Fail on timeout, or
        at once on an ERROR or RESULT FAIL line the pattern does not ask for."""
        rx = re.compile(pat)
        end = time.monotonic() + timeout
        while True:
            while self.cursor < len(self.lines):
                line = self.lines[self.cursor]
                self.cursor += 1
                m = rx.search(line)
                if m:
                    return m
                if line.startswith("ERROR") or line.startswith("RESULT FAIL"):
                    raise Fail("%s: waiting for %s: %s\n%s" % (self.name, what or pat, line, self.tail()))
            left = end - time.monotonic()
            if left <= 0:
                raise Fail("%s: no line matching %s in %.0f s\n%s" % (self.name, what or repr(pat), timeout,
                                                                        self.tail()))
            if not self.restored and self.p.poll() is not None and not self._readable(0):
                raise Fail("%s: exited (status %s) waiting for %s\n%s" % (self.name, self.p.returncode,
                                                                          what or pat, self.tail()))
            if self.restored and not alive(self.pid) and not self._readable(0):
                raise Fail("%s: restored process %d gone waiting for %s\n%s" % (self.name, self.pid, what or pat,
                                                                                self.tail()))
            # An exit of the original child is noticed within 1 s; lines at once.
            self._readable(min(left, 1.0))

    def _readable(self, timeout):
        r, _, _ = select.select([self.r], [], [], timeout)
        if not r:
            return False
        try:
            data = os.read(self.r, 1 << 16)
        except BlockingIOError:
            return False
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            line = line.decode(errors="replace")
            self.lines.append(line)
            self.out_log.write("%9.3f out| %s\n" % (time.perf_counter() - self.t0, line))
        self.out_log.flush()
        return bool(data)

    def reap(self, timeout=60):
        """The original child, after CRIU's dump ended it (a restored process is not our child)."""
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def tail(self, n=10):
        try:
            with open(self.err_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.err_path) - 3000))
                err = f.read().decode(errors="replace").splitlines()[-n:]
        except OSError:
            err = []
        return "  stdout: %s\n  stderr (%s): %s" % (self.lines[-n:], self.err_path, " | ".join(err))

    def close(self):
        """Kills what is left (the original child's group, or the restored pid) and removes the FIFOs."""
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except OSError:
                pass
        elif alive(self.pid):
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass
            wait_gone(self.pid, 30)
        self.reap(30)
        for fd in (self.w, self.r, self.keep):
            try:
                os.close(fd)
            except OSError:
                pass
        self.out_log.close()
        shutil.rmtree(self.d, ignore_errors=True)


def du_bytes(path):
    """Disk space a directory uses (du -s --block-size=1), and its files' total size."""
    used = 0
    apparent = 0
    for dp, _, fs in os.walk(path):
        for f in fs:
            st = os.lstat(os.path.join(dp, f))
            used += st.st_blocks * 512
            apparent += st.st_size
    return used, apparent


def cache_dir(path):
    """Reads every file under path once so that it is in the page cache; returns (bytes, seconds)."""
    n = 0
    t0 = time.perf_counter()
    buf = bytearray(16 << 20)
    for dp, _, fs in os.walk(path):
        for f in fs:
            with open(os.path.join(dp, f), "rb", buffering=0) as fh:
                while True:
                    k = fh.readinto(buf)
                    if not k:
                        break
                    n += k
    return n, time.perf_counter() - t0


def json_line(obj):
    return json.dumps(obj, sort_keys=True, default=str)
