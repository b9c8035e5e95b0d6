# tests/gpu/harness.py: starts GPU test programs with or without the GCR shim, follows their
# stdout protocol with bounded waits, drives `gcrctl --json` and measures GPU memory. Stdlib only.
"""Shared by tests/gpu/test_gpu.py, bench/bench_cr.py and bench/bench_overhead.py.

Nothing here sleeps to synchronise: waits are on protocol lines (READY, ITER, DONE,
RESULT, ...) from a reader thread, each with a timeout, so a hung program turns into an
error that carries the tail of its output instead of a hung run.
"""

import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


class HarnessError(Exception):
    """A protocol wait, a program or a tool failed; the message says which and shows output."""


def repo_path(env_name, default):
    """Path from env var env_name (or default), made absolute relative to the repo root."""
    p = os.environ.get(env_name) or default
    return p if os.path.isabs(p) else os.path.join(REPO, p)


def now():
    return time.perf_counter()


class Config:
    """Where the build outputs are; every path can be overridden by an env var."""

    def __init__(self):
        build = os.environ.get("GCR_GPU_BUILD", "build-gpu")
        self.gcrctl = repo_path("GCRCTL", "node-agent/gcrctl")
        self.shim = repo_path("GCR_SHIM", "shim/.libs/libgcr.so")
        self.testprog = repo_path("TESTPROG", "tests/progs/gcr-testprog")
        self.poolprog = repo_path("POOLPROG", "tests/progs/gcr-poolprog")
        self.fatbin = repo_path("FATBIN", os.path.join(build, "gcr_kernels.fatbin"))
        self.rt_test = repo_path("RT_TEST", os.path.join(build, "rt_test"))
        self.rt_test_shared = repo_path("RT_TEST_SHARED", os.path.join(build, "rt_test_shared"))
        self.launch_bench = repo_path("LAUNCH_BENCH", os.path.join(build, "launch_bench"))
        self.torch_serve = repo_path("TORCH_SERVE", "tests/gpu/torch_serve.py")
        self.python = os.environ.get("PYTHON") or sys.executable or "python3"
        self.log_dir = os.environ.get("GCR_LOG_DIR", "/tmp/gcr-gpu-logs")
        self.shim_log_level = os.environ.get("GCR_TEST_SHIM_LOG_LEVEL", "info")
        self.nvidia_smi = os.environ.get("NVIDIA_SMI", "nvidia-smi")
        d = os.environ.get("GCR_DEADLINE", "")
        try:
            self.deadline = float(d) if d else None  # epoch seconds (time.time())
        except ValueError:
            self.deadline = None

    def remaining_s(self):
        """Seconds left before GCR_DEADLINE; infinity when none was given."""
        if self.deadline is None:
            return float("inf")
        return self.deadline - time.time()

    def missing(self, *attrs):
        """Names and paths of the required files that do not exist (empty list when all do)."""
        out = []
        for a in attrs:
            p = getattr(self, a)
            if not os.path.exists(p):
                out.append("%s (%s)" % (a, p))
        return out


class JsonLog:
    """Appends one JSON object per line, flushed at once, so a killed run keeps what it had."""

    def __init__(self, path):
        self.path = path
        d = os.path.dirname(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self.f = open(path, "a", encoding="utf-8")

    def write(self, **rec):
        rec.setdefault("t", round(time.time(), 3))
        self.f.write(json.dumps(rec, sort_keys=True, default=str) + "\n")
        self.f.flush()

    def close(self):
        self.f.close()


def _safe_name(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:120] or "proc"


class Proc:
    """One program under test. stdout lines are collected by a reader thread; expect()
    waits for the next line matching a pattern (from a cursor), with a timeout."""

    _counter = 0
    _lock = threading.Lock()

    def __init__(self, cfg, name, argv, shim=False, socket_dir=None, extra_env=None):
        self.cfg = cfg
        self.name = name
        self.argv = [str(a) for a in argv]
        self.shim = shim
        env = os.environ.copy()
        env.pop("LD_PRELOAD", None)
        env["PYTHONUNBUFFERED"] = "1"
        if shim:
            env["LD_PRELOAD"] = cfg.shim
            env["GCR_LOG_LEVEL"] = cfg.shim_log_level
        if socket_dir:
            # Set even without the shim: harmless, and gcrctl looks in the same place.
            env["GCR_SOCKET_DIR"] = socket_dir
        if extra_env:
            env.update({k: str(v) for k, v in extra_env.items()})
        os.makedirs(cfg.log_dir, exist_ok=True)
        with Proc._lock:
            Proc._counter += 1
            n = Proc._counter
        self.log_path = os.path.join(cfg.log_dir, "%03d-%s.log" % (n, _safe_name(name)))
        self._log = open(self.log_path, "w", encoding="utf-8", errors="replace")
        self._log.write("# argv: %s\n# shim: %s socket_dir: %s\n" % (" ".join(self.argv), shim, socket_dir))
        self._log.flush()
        self.lines = []  # stdout lines, newline stripped
        self.err_tail = collections.deque(maxlen=200)
        self.cursor = 0
        self.eof = False
        self.cond = threading.Condition()
        self.t0 = now()
        try:
            self.p = subprocess.Popen(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, cwd=REPO, text=True, bufsize=1, errors="replace", start_new_session=True)
        except OSError as e:
            self._log.write("# start failed: %s\n" % e)
            self._log.close()
            raise HarnessError("cannot start %s: %s" % (self.argv[0], e))
        self.pid = self.p.pid
        self._threads = [
            threading.Thread(target=self._read, args=(self.p.stdout, True), daemon=True),
            threading.Thread(target=self._read, args=(self.p.stderr, False), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _read(self, stream, is_out):
        try:
            for raw in stream:
                line = raw.rstrip("\n")
                with self.cond:
                    self._log.write("%9.3f %s| %s\n" % (now() - self.t0, "out" if is_out else "err", line))
                    self._log.flush()
                    if is_out:
                        self.lines.append(line)
                    else:
                        self.err_tail.append(line)
                    self.cond.notify_all()
        except (ValueError, OSError):
            pass
        finally:
            if is_out:
                with self.cond:
                    self.eof = True
                    self.cond.notify_all()

    def alive(self):
        return self.p.poll() is None

    def mark(self):
        """Index of the next stdout line to arrive; pass as since= to see only newer lines."""
        with self.cond:
            return len(self.lines)

    def seen(self, pattern):
        """True when any stdout line so far matches pattern (regex, searched from line start)."""
        rx = re.compile(pattern)
        with self.cond:
            return any(rx.match(l) for l in self.lines)

    def expect(self, pattern, timeout, since=None, what=None):
        """Waits for a stdout line matching pattern (re.match) at or after the cursor (or since)
        and returns the match; the cursor moves past it. Raises HarnessError on timeout or EOF."""
        rx = re.compile(pattern)
        deadline = now() + timeout
        with self.cond:
            i = self.cursor if since is None else since
            while True:
                while i < len(self.lines):
                    m = rx.match(self.lines[i])
                    i += 1
                    if m:
                        self.cursor = max(self.cursor, i)
                        return m
                if self.eof:
                    break
                left = deadline - now()
                if left <= 0:
                    break
                self.cond.wait(min(left, 1.0))
        rc = self.p.poll()
        if self.eof:
            # Give the exit status a moment to be reaped so the message can show it.
            try:
                rc = self.p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                rc = None
            why = "program closed stdout (exit status %s)" % rc
        else:
            why = "timeout after %.0f s (process %s)" % (timeout, "running" if rc is None else "exited %s" % rc)
        raise HarnessError("%s: waiting for %s: %s\n%s" % (self.name, what or repr(pattern), why, self.tail()))

    def send(self, line):
        try:
            self.p.stdin.write(line + "\n")
            self.p.stdin.flush()
        except (BrokenPipeError, OSError, ValueError) as e:
            raise HarnessError("%s: cannot send %r: %s\n%s" % (self.name, line, e, self.tail()))
        with self.cond:
            if not self._log.closed:
                self._log.write("%9.3f in | %s\n" % (now() - self.t0, line))
                self._log.flush()

    def wait_exit(self, timeout):
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HarnessError("%s: did not exit within %.0f s\n%s" % (self.name, timeout, self.tail()))

    def kill(self):
        """SIGKILLs the process group this Proc started (its own session); idempotent."""
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        for t in self._threads:
            t.join(timeout=2)
        with self.cond:
            if not self._log.closed:
                self._log.write("# exit status %s\n" % self.p.poll())
                self._log.close()

    def tail(self, n=12):
        with self.cond:
            out = self.lines[-n:]
            err = list(self.err_tail)[-n:]
        s = "  --- last stdout of %s (pid %d, log %s):\n" % (self.name, self.pid, self.log_path)
        s += "".join("  | %s\n" % l for l in out) or "  | (none)\n"
        s += "  --- last stderr:\n" + ("".join("  | %s\n" % l for l in err) or "  | (none)\n")
        return s.rstrip("\n")


class CtlResult:
    """One gcrctl call: ok, exit status, parsed JSON (or None), wall time, error text."""

    def __init__(self, argv, rc, stdout, stderr, wall_ms, data, error):
        self.argv = argv
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.wall_ms = wall_ms
        self.data = data
        self.error = error
        self.ok = rc == 0 and isinstance(data, dict) and data.get("ok", True) is True

    def get(self, *keys):
        """Nested lookup, None when any level is missing: r.get('ms', 'total')."""
        return dig(self.data, *keys)

    def record(self):
        return {"argv": self.argv[1:], "rc": self.rc, "ok": self.ok, "wall_ms": round(self.wall_ms, 3),
                "json": self.data, "error": self.error,
                "stdout": _clip(self.stdout), "stderr": _clip(self.stderr)}

    def describe(self):
        """One line for failure messages."""
        return "gcrctl %s -> rc=%s ok=%s error=%r stdout=%r stderr=%r" % (
            " ".join(self.argv[1:]), self.rc, self.ok, self.error, _clip(self.stdout, 300),
            _clip(self.stderr, 300))


def _clip(s, n=2000):
    s = s or ""
    return s if len(s) <= n else s[: n // 2] + " ... " + s[-n // 2:]


def dig(obj, *keys):
    for k in keys:
        if not isinstance(obj, dict) or k not in obj:
            return None
        obj = obj[k]
    return obj


def parse_json_output(text):
    """The last line of text that parses as a JSON object (gcrctl prints one), or None."""
    for line in reversed((text or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if isinstance(v, dict):
                return v
    try:  # a pretty-printed object over several lines
        v = json.loads(text)
        return v if isinstance(v, dict) else None
    except (ValueError, TypeError):
        return None


def gcrctl(cfg, socket_dir, op, pid=None, flags=(), timeout=180):
    """Runs `gcrctl --socket-dir DIR --json OP [FLAGS] [PID]`; never raises."""
    argv = [cfg.gcrctl]
    if socket_dir:
        argv += ["--socket-dir", socket_dir]
    argv += ["--json", op] + list(flags)
    if pid is not None:
        argv.append(str(pid))
    t0 = now()
    try:
        cp = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        wall = (now() - t0) * 1000.0
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return CtlResult(argv, None, out, err, wall, None, "gcrctl timed out after %d s (killed)" % timeout)
    except OSError as e:
        return CtlResult(argv, None, "", "", (now() - t0) * 1000.0, None, "cannot run gcrctl: %s" % e)
    wall = (now() - t0) * 1000.0
    data = parse_json_output(cp.stdout)
    error = None
    if isinstance(data, dict) and data.get("ok") is False:
        error = str(data.get("error", "")) or "(no error text)"
    elif data is None:
        error = "no JSON object on stdout"
    if cp.returncode != 0 and error is None:
        error = "exit status %d" % cp.returncode
    return CtlResult(argv, cp.returncode, cp.stdout, cp.stderr, wall, data, error)


# gcrctl status's "state": the process's one combined state (lib/gcr_cr.h, gcr_cr_st_name).
STATES = ("running", "suspended", "partial", "unmanaged", "gone")


def state_of(res):
    """The process's state from a `gcrctl --json status` result: its top-level "state", one of
    STATES (gcrctl combines the shim's, the driver's and CRIU's into it). Raises HarnessError
    when the status failed or has no such field, so a check on it cannot pass vacuously."""
    data = res.data if res is not None else None
    v = data.get("state") if isinstance(data, dict) else None
    if v not in STATES:
        raise HarnessError("gcrctl status gave no process state (want one of %s): %s" % (
            "/".join(STATES), _clip(res.stdout if res is not None else "", 300)))
    return v


def driver_state_of(res):
    """The driver's view ("checkpointed", "running", ...; "none" for a HIP process) from a status
    result. Raises HarnessError when the status has none (the driver could not be read)."""
    v = dig(res.data, "driver") if res is not None else None
    if not isinstance(v, str):
        raise HarnessError("gcrctl status gave no driver state: %s" % _clip(res.stdout if res is not None else "",
                                                                           300))
    return v.lower()


def is_suspended_state(state):
    """Suspended in the mode asked: exactly "suspended" (half-way states such as a shim still
    "suspending" are not)."""
    return state == "suspended"


def _smi(cfg, args, timeout=30):
    try:
        cp = subprocess.run([cfg.nvidia_smi] + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace", timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return cp.stdout if cp.returncode == 0 else None


def gpu_mem_mib(cfg, pid):
    """GPU memory (MiB) nvidia-smi reports for pid, summed over GPUs; 0 when the pid is not
    listed; None when nvidia-smi itself failed."""
    out = _smi(cfg, ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    if out is None:
        return None
    total = 0
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2:
            continue
        try:
            if int(parts[0]) != int(pid):
                continue
        except ValueError:
            continue
        try:
            total += int(float(parts[1]))
        except ValueError:
            pass  # "[N/A]": listed, size unknown
    return total


def gpu_uuids(cfg):
    """The GPUs' UUIDs in nvidia-smi's order, or [] when it cannot say."""
    out = _smi(cfg, ["--query-gpu=uuid", "--format=csv,noheader"])
    return [l.strip() for l in (out or "").splitlines() if l.strip().startswith("GPU-")]


def gpu_mem_by_uuid(cfg, pid):
    """{GPU UUID: MiB} nvidia-smi reports for pid on each GPU it is listed on; None when
    nvidia-smi failed."""
    out = _smi(cfg, ["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"])
    if out is None:
        return None
    mem = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            if len(parts) < 3 or int(parts[0]) != int(pid):
                continue
            mem[parts[1]] = mem.get(parts[1], 0) + int(float(parts[2]))
        except ValueError:
            continue
    return mem


def gpu_used_mib(cfg):
    """Device-wide memory.used (MiB) of the first GPU, or None."""
    out = _smi(cfg, ["--query-gpu=memory.used", "--format=csv,noheader,nounits"])
    if not out:
        return None
    try:
        return int(float(out.splitlines()[0].strip()))
    except (ValueError, IndexError):
        return None


def shim_request(sock_dir, pid, op, args=None, timeout=120):
    """One request on pid's control socket in sock_dir, as a tool would send it: the reply (a
    dict), or None when the shim closed the connection before a whole reply line."""
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    try:
        s.connect(os.path.join(sock_dir, shim_socket_name(pid)))
        s.sendall((json.dumps({"v": 1, "id": 1, "op": op, "args": args or {}}) + "\n").encode())
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                return None
            buf += chunk
    finally:
        s.close()
    return json.loads(buf)


def shim_socket_name(pid, name_pid=None):
    """The name a shim gives its control socket (lib/gcr_sock.c gcr_sock_shim_stem):
    gcr-<its pid>-<start time>.sock, the start time (clock ticks since boot, field 22 of
    /proc/<pid>/stat) read through our pid for it; name_pid is its pid in its own PID
    namespace when that differs. A shim that found the name taken chose a random one."""
    with open("/proc/%d/stat" % pid) as fh:
        start = fh.read().rsplit(")", 1)[1].split()[19]
    return "gcr-%d-%s.sock" % (pid if name_pid is None else name_pid, start)


def wait_socket(socket_dir, pid, timeout=15.0):
    """Waits (bounded) for the shim's control socket of pid to appear; True when it did.
    The shim creates it during start-up, so this is a condition wait, not a delay."""
    try:
        path = os.path.join(socket_dir, shim_socket_name(pid))
    except OSError:
        return False
    deadline = now() + timeout
    while True:
        if os.path.exists(path):
            return True
        try:
            if any(str(pid) in f for f in os.listdir(socket_dir)):
                return True
        except OSError:
            pass
        if now() >= deadline:
            return False
        time.sleep(0.02)  # polling a file system condition, bounded by timeout


def run_case(T, fn, not_run, fails):
    """Runs one test, fn(T), and T.cleanup() whatever happens: ("PASS", ""), ("NOT RUN", why) on
    not_run, ("FAIL", why) on an exception of the types fails or any other (with its traceback);
    a cleanup that fails adds its traceback to the reason."""
    status, reason = "PASS", ""
    try:
        fn(T)
    except not_run as e:
        status, reason = "NOT RUN", str(e)
    except fails as e:
        status, reason = "FAIL", str(e)
    except Exception:
        status, reason = "FAIL", "unexpected error in the test itself:\n" + traceback.format_exc()
    finally:
        try:
            T.cleanup()
        except Exception:
            reason += "\n(cleanup failed: %s)" % traceback.format_exc()
    return status, reason


def report_case(log, name, status, reason, notes, t0):
    """One test's outcome: a JSON line to log, a PASS/FAIL/NOT RUN line on stdout."""
    secs = time.time() - t0
    log.write(kind="test", name=name, status=status, reason=reason, notes=notes, secs=round(secs, 2))
    if status == "PASS":
        print("PASS %s (%.1f s)%s" % (name, secs, "".join("; " + n for n in notes)), flush=True)
    else:
        print("%s %s: %s" % (status, name, reason), flush=True)


def wait_staging_ready(session, pid, timeout=120.0):
    """Polls `gcrctl status` until the shim reports its pinned staging ready (bounded);
    returns the seconds waited, or None if it never became ready."""
    t0 = now()
    while now() - t0 < timeout:
        r = session.ctl("status", pid, timeout=30, note="staging-wait")
        if dig(r.data, "shim", "staging", "ready") is True:
            return round(now() - t0, 3)
        if r.rc not in (0,):
            return None
        time.sleep(0.1)  # polling a condition the shim reports, bounded by timeout
    return None


CHUNK = 2 << 20  # bytes: the shim's digest chunk, and gcr-testprog --chunks' unit


class ChunkProg:
    """gcr-testprog --chunks --wait (tests/progs/gcr_testprog.c), from READY through DONE to
    its commands: "mutate KIND COUNT SEED" -> (chunks changed since the last verify, how many
    of those are all zero now); "verify" (bit-exact, and the new reference for "changed");
    "check" -> RESULT ok. zero_bytes: data bytes that are all zero now, as the program says."""

    READY = r"READY pid=(\d+) bytes=(\d+) chunks=(\d+) zero_bytes=(\d+)"

    def __init__(self, proc, timeout=300.0):
        self.p = proc
        self.timeout = timeout
        m = proc.expect(self.READY, timeout, since=0, what="READY with chunks=")
        self.pid, self.bytes, self.chunks, self.zero_bytes = (int(m.group(i)) for i in range(1, 5))

    def go(self):
        self.p.send("go")
        self.p.expect(r"DONE$", self.timeout, what="DONE")

    def mutate(self, kind, count, seed):
        self.p.send("mutate %s %d %d" % (kind, count, seed))
        m = self.p.expect(r"MUTATED kind=(\w+) targets=\d+ changed=(\d+) zero=(\d+) zero_bytes=(\d+)|ERROR.*",
                          self.timeout, what="MUTATED")
        if m.group(1) != kind:
            raise HarnessError("mutate %s: %s\n%s" % (kind, m.group(0), self.p.tail()))
        self.zero_bytes = int(m.group(4))
        return int(m.group(2)), int(m.group(3))

    def verify(self, what=""):
        """Raises HarnessError unless every chunk is bit-exact."""
        self.p.send("verify")
        m = self.p.expect(r"VERIFIED chunks=\d+ zero_bytes=(\d+)|RESULT (.*)", self.timeout, what="VERIFIED")
        if m.group(2) is not None:
            raise HarnessError("%s: data not bit-exact: RESULT %s\n%s" % (what, m.group(2), self.p.tail()))
        self.zero_bytes = int(m.group(1))

    def finish(self):
        self.p.send("check")
        m = self.p.expect(r"RESULT (.*)", self.timeout, what="RESULT")
        if m.group(1).strip() != "ok":
            raise HarnessError("RESULT %s\n%s" % (m.group(1), self.p.tail()))
        rc = self.p.wait_exit(60)
        if rc != 0:
            raise HarnessError("exit status %s after RESULT ok\n%s" % (rc, self.p.tail()))


def shim_counts(res):
    """(bytes, copied, zero, unchanged) of the shim's part of a suspend/resume report; None
    where the shim did not say (unchanged: 0 when absent)."""
    def get(k):
        v = dig(res.data if res is not None else None, "shim", k)
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    return get("bytes"), get("copied"), get("zero"), get("unchanged") or 0


class Session:
    """A socket directory (its own, or the caller's), a JSON log, and every Proc started, killed
    at close()."""

    def __init__(self, cfg=None, log_path=None, socket_dir=None):
        self.cfg = cfg or Config()
        self.own_socket_dir = socket_dir is None  # removed at close() only when made here
        self.socket_dir = socket_dir or tempfile.mkdtemp(prefix="gcr-sock-")
        self.log = JsonLog(log_path or os.environ.get("GCR_TEST_LOG", "/tmp/gcr-gpu-tests.jsonl"))
        self.procs = []

    def start(self, name, argv, shim=False, extra_env=None):
        p = Proc(self.cfg, name, argv, shim=shim, socket_dir=self.socket_dir, extra_env=extra_env)
        self.procs.append(p)
        return p

    def ctl(self, op, pid=None, flags=(), timeout=180, test=None, note=None):
        r = gcrctl(self.cfg, self.socket_dir, op, pid, flags, timeout)
        self.log.write(kind="gcrctl", test=test, op=op, pid=pid, note=note, **r.record())
        return r

    def gpu_mem(self, pid):
        """gpu_mem_mib, for checks: a failed nvidia-smi raises HarnessError rather than giving
        None, which a check would have to skip (benchmarks that only record call gpu_mem_mib)."""
        v = gpu_mem_mib(self.cfg, pid)
        if v is None:
            raise HarnessError("nvidia-smi (%s) gave no reading of pid %d's GPU memory" % (self.cfg.nvidia_smi, pid))
        return v

    def finish(self, proc, suspended=False):
        """Ends proc: resumes it first if the caller believes it is suspended (a process
        locked by the driver is best not left for SIGKILL), then kills its group."""
        if suspended and proc.alive():
            self.ctl("resume", proc.pid, timeout=60, note="cleanup")
        proc.kill()

    def close(self):
        for p in self.procs:
            p.kill()
        self.log.close()
        if self.own_socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)


def stats(values):
    """(median, min, max) of the numbers in values, ignoring None; (None,)*3 when empty."""
    v = sorted(x for x in values if isinstance(x, (int, float)))
    if not v:
        return None, None, None
    n = len(v)
    med = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0
    return med, v[0], v[-1]
