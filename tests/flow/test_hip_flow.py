# tests/flow/test_hip_flow.py: the HIP backend end to end on the stand-in runtime (tests/fakehip):
# gcr-hipprog under the preloaded shim, the control socket and protocol, what status and stats
# report, the stand-in's memory accounting, fault injection; suspend/resume with the data step
# only (keep-context: bit-exact, 0 bytes in the buffers, the gate holding launching threads,
# out of memory at resume, failures that leave the process running) and in full mode, where
# the control step is CRIU (missing: a clear error, nothing touched; a fake criu: its argument
# vectors, the order of data and control steps, a failing dump undone).
"""Needs a build dir (top_builddir). Each case prints PASS/FAIL; the last line is 'N passed, N
failed'. No sleeps: every wait is on a line from the program or on a command's exit."""

import json
import os
import subprocess
import sys
import tempfile
import traceback

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.path.abspath(os.environ.get("top_builddir", os.path.join(SRC, "build")))
SHIM = os.path.join(BUILD, "shim", ".libs", "libgcr.so")
PROG = os.path.join(BUILD, "tests", "progs", "gcr-hipprog")
GCRCTL = os.path.join(BUILD, "node-agent", "gcrctl")
SMI = os.path.join(BUILD, "tests", "fakehip", "fakehipsmi")
FAKE = os.path.join(BUILD, "tests", "fakehip")
MIB = 1 << 20


class Fail(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Fail(msg)


def env_for(d, shim=True, extra=None):
    env = dict(os.environ)
    env.update({"LD_LIBRARY_PATH": FAKE, "FAKEHIP_DIR": d, "GCR_SOCKET_DIR": d, "GCR_LOG_LEVEL": "warn"})
    if shim:
        prefix = os.environ.get("GCR_TEST_PRELOAD_PREFIX", "")
        env["LD_PRELOAD"] = (prefix + ":" if prefix else "") + SHIM
    env.update(extra or {})
    return env


def start(d, args, shim=True, extra=None):
    p = subprocess.Popen([PROG] + args, env=env_for(d, shim, extra), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("READY pid=%d" % p.pid):
        p.kill()
        raise Fail("no READY line: %r / %s" % (line, p.stderr.read()[-500:]))
    return p


def ask_check(p):
    p.stdin.write("check\n")
    p.stdin.flush()
    return p.stdout.readline().strip()


def finish(p):
    p.stdin.close()
    try:
        rc = p.wait(timeout=60)
    except subprocess.TimeoutExpired:  # held at the gate by a case that failed half-way
        p.kill()
        p.wait()
        raise Fail("program did not exit (left suspended?)")
    check(rc == 0, "program exit %d: %s" % (rc, p.stderr.read()[-500:]))


def gcrctl(d, *args):
    out = subprocess.run([GCRCTL, "--socket-dir", d, "--json"] + list(args), capture_output=True,
                         text=True, timeout=60, env=env_for(d, shim=False))
    try:
        return out.returncode, json.loads(out.stdout.strip().splitlines()[-1]), out.stderr
    except (ValueError, IndexError):
        return out.returncode, None, out.stderr


def gcrctl_env(d, extra, *args):
    out = subprocess.run([GCRCTL, "--socket-dir", d, "--json"] + list(args), capture_output=True,
                         text=True, timeout=60, env=env_for(d, shim=False, extra=extra))
    try:
        return out.returncode, json.loads(out.stdout.strip().splitlines()[-1]), out.stderr
    except (ValueError, IndexError):
        return out.returncode, None, out.stderr


def smi(d, *args):
    out = subprocess.run([SMI] + list(args), capture_output=True, text=True, timeout=30, env=env_for(d, shim=False))
    check(out.returncode == 0, "fakehipsmi %s: %s" % (args, out.stderr.strip()))
    return out.stdout.strip()


def case_without_shim(d):
    out = subprocess.run([PROG, "--mib", "2"], env=env_for(d, shim=False), capture_output=True, text=True, timeout=120)
    check(out.returncode == 0 and "RESULT ok" in out.stdout, "plain run: %s %s" % (out.stdout, out.stderr))


def status(d, pid):
    rc, st, err = gcrctl(d, "status", str(pid))
    check(rc == 0 and st is not None, "status: %s" % err)
    return st


def shim_state(d, pid):
    return (status(d, pid).get("shim") or {}).get("state")


def mem(d, pid):
    return int(smi(d, "mem", str(pid)))


SMALL = 2 * MIB  # gcr-hipprog's 8-byte checksum word: below GCR_VMM_MIN_BYTES, the runtime's (rounded)


def case_under_shim(d):
    mib, bufs = 4, 3
    p = start(d, ["--mib", str(mib), "--buffers", str(bufs), "--wait"])
    try:
        check(ask_check(p) == "RESULT ok", "checksums under the shim")
        st = status(d, p.pid)
        shim = st.get("shim") or {}
        check(shim.get("backends") == {"cuda": False, "hip": True}, "backends: %s" % shim.get("backends"))
        check(st.get("driver") == "none", "driver of a HIP process: %s" % st.get("driver"))
        # The shared table: hipMalloc buffers on the VMM API, the application's own handle
        # virtualised, the 8-byte word left to the runtime.
        b, n = shim["bytes"], shim["buffers"]
        check(b["vmm"] == bufs * mib * MIB and n["vmm"] == bufs, "vmm %s %s" % (b, n))
        check(b["app_vmm"] == mib * MIB and n["app_vmm"] == 1, "app_vmm %s %s" % (b, n))
        check(b["driver"] == 8 and n["driver"] == 1, "runtime's own %s %s" % (b, n))
        held = mem(d, p.pid)
        check(held == bufs * mib * MIB + SMALL + mib * MIB, "stand-in holds %d bytes" % held)
        rc, stats, err = gcrctl(d, "stats", str(p.pid))
        calls = stats["calls"]
        check(calls.get("hipMalloc") == bufs + 1, "hipMalloc calls %s" % calls.get("hipMalloc"))
        check(calls.get("hipLaunchKernel", 0) >= 2 * (bufs + 1) and calls.get("hipModuleLaunchKernel") == 1,
              "launch counts %s" % calls)
        check(calls.get("hipMemCreate") == 1 and calls.get("hipMemSetAccess") == 1, "vmm calls %s" % calls)
        check(stats["decisions"]["converted"] == bufs, "converted %s" % stats["decisions"])
    finally:
        if p.poll() is None:
            finish(p)


def suspend_resume(d, p, held, left, flags=("--no-driver",), what=""):
    """One keep-context cycle: data out, `left` bytes held while suspended, back bit-exact."""
    rc, rep, err = gcrctl(d, "suspend", *flags, str(p.pid))
    check(rc == 0 and rep and rep.get("ok"), "%s suspend: %s %s" % (what, rep, err))
    check(mem(d, p.pid) == left, "%s: %d bytes held while suspended, expected %d" % (what, mem(d, p.pid), left))
    check(shim_state(d, p.pid) == "suspended", "%s: shim state" % what)
    sh = rep["shim"]
    check(sh["copied"] == sh["bytes"] and sh["zero"] == 0, "%s: every chunk copied on HIP: %s" % (what, sh))
    rc, rep2, err = gcrctl(d, "resume", *flags, str(p.pid))
    check(rc == 0 and rep2 and rep2.get("ok"), "%s resume: %s %s" % (what, rep2, err))
    check(mem(d, p.pid) == held, "%s: %d bytes after resume, expected %d" % (what, mem(d, p.pid), held))
    check(shim_state(d, p.pid) == "running", "%s: shim state after resume" % what)
    check(ask_check(p) == "RESULT ok", "%s: checksums after resume (bit-exact, same addresses)" % what)
    return rep


def case_suspend_resume_keep_context(d):
    mib, bufs = 4, 3
    p = start(d, ["--mib", str(mib), "--buffers", str(bufs), "--wait"])
    try:
        held = mem(d, p.pid)
        for i in range(3):
            rep = suspend_resume(d, p, held, SMALL, what="cycle %d" % i)
            check(rep["shim"]["bytes"] == (bufs + 1) * mib * MIB and rep["shim"]["handles"] == bufs + 1,
                  "cycle %d: staged %s" % (i, rep["shim"]))
        check(int(smi(d, "registered", str(p.pid))) > 0, "no pinned copy slots registered")
    finally:
        if p.poll() is None:
            finish(p)


def case_all_converted_zero_bytes(d):
    # With every buffer on the VMM API the stand-in holds exactly 0 bytes while suspended.
    p = start(d, ["--mib", "4", "--buffers", "2", "--wait"], extra={"GCR_VMM_MIN_BYTES": "1"})
    try:
        suspend_resume(d, p, mem(d, p.pid), 0, what="min bytes 1")
    finally:
        if p.poll() is None:
            finish(p)


def case_gate_holds_launches(d):
    p = start(d, ["--mib", "4", "--buffers", "2", "--threads", "3", "--wait"], extra={"GCR_VMM_MIN_BYTES": "1"})
    try:
        held = mem(d, p.pid)
        waits0 = gcrctl(d, "stats", str(p.pid))[1]["gate"]["waits"]
        # Three threads launch without pause; a launch that passed the gate while the memory is
        # released would fault (the stand-in unmaps it), and bit-exactness is checked after.
        for i in range(3):
            suspend_resume(d, p, held, 0, what="launching cycle %d" % i)
        waits = gcrctl(d, "stats", str(p.pid))[1]["gate"]["waits"]
        check(waits > waits0, "no launch waited at the gate (%d -> %d)" % (waits0, waits))
        p.stdin.write("stop\n")
        p.stdin.flush()
        line = p.stdout.readline().strip()
        check(line.startswith("STOPPED") and line.endswith(" bad=0") and "iters=0 " not in line,
              "launchers: %r" % line)
    finally:
        if p.poll() is None:
            finish(p)


def case_oom_at_resume_then_retry(d):
    p = start(d, ["--mib", "4", "--buffers", "2", "--wait"])
    try:
        held = mem(d, p.pid)
        rc, rep, err = gcrctl(d, "suspend", "--no-driver", str(p.pid))
        check(rc == 0, "suspend: %s" % err)
        smi(d, "fail", str(p.pid), "hipMemCreate", "2", "2")  # the second re-creation: out of memory
        rc, rep, err = gcrctl(d, "resume", "--no-driver", str(p.pid))
        check(rc != 0 and "not enough GPU memory" in (rep or {}).get("error", ""), "resume under OOM: %s %s" % (rep, err))
        check(shim_state(d, p.pid) == "suspended", "after the failed resume: not suspended")
        check(mem(d, p.pid) == SMALL, "the failed resume left %d bytes" % mem(d, p.pid))
        rc, rep, err = gcrctl(d, "resume", "--no-driver", str(p.pid))
        check(rc == 0, "retried resume: %s" % err)
        check(mem(d, p.pid) == held and ask_check(p) == "RESULT ok", "after the retried resume")
    finally:
        if p.poll() is None:
            finish(p)


def case_failed_suspend_leaves_running(d):
    p = start(d, ["--mib", "4", "--buffers", "2", "--wait"])
    try:
        held = mem(d, p.pid)
        # A copy out fails (nothing released yet), then a release fails (some memory already
        # gone: everything comes back from staging). Both leave the process running, whole.
        for func, nth in (("hipMemcpyDtoHAsync", 2), ("hipMemRelease", 2)):
            smi(d, "fail", str(p.pid), func, str(nth), "1")
            rc, rep, err = gcrctl(d, "suspend", "--no-driver", str(p.pid))
            check(rc != 0 and func in (rep or {}).get("error", ""), "%s failure: %s %s" % (func, rep, err))
            check(shim_state(d, p.pid) == "running", "%s: not running" % func)
            check(mem(d, p.pid) == held, "%s: %d bytes held, expected %d" % (func, mem(d, p.pid), held))
            check(ask_check(p) == "RESULT ok", "%s: checksums after the failed suspend" % func)
        suspend_resume(d, p, held, SMALL, what="after the failures")
    finally:
        if p.poll() is None:
            finish(p)


def case_full_without_criu(d):
    p = start(d, ["--mib", "4", "--wait"])
    try:
        held = mem(d, p.pid)
        rc, rep, err = gcrctl_env(d, {"GCR_CRIU": "/nonexistent/criu"}, "suspend", str(p.pid))
        msg = (rep or {}).get("error", "")
        check(rc != 0 and "CRIU not found" in msg and "untouched" in msg, "full suspend without CRIU: %s %s" % (rep, err))
        check(shim_state(d, p.pid) == "running" and mem(d, p.pid) == held, "the process was touched")
        check(ask_check(p) == "RESULT ok", "checksums")
        rc, stats, err = gcrctl(d, "stats", str(p.pid))
        check(stats["gate"]["waits"] == 0, "the gate was closed")
    finally:
        if p.poll() is None:
            finish(p)


FAKE_CRIU = os.path.join(SRC, "tests", "unit", "fake-criu.sh")


def criu_env(d, pid, **kw):
    plugins = os.path.join(d, "plugins")
    os.makedirs(plugins, exist_ok=True)
    open(os.path.join(plugins, "amdgpu_plugin.so"), "w").close()
    env = {"GCR_CRIU": FAKE_CRIU, "CRIU_LIBS_DIR": plugins, "FAKE_CRIU_VERSION_OUT": "Version: 4.1",
           "FAKE_CRIU_LOG": os.path.join(d, "criu.log"), "FAKE_CRIU_APPEND": "1", "FAKE_CRIU_PID": str(pid),
           # What the device holds at the moment CRIU runs: the order of data and control steps.
           "FAKE_CRIU_HOOK": "echo mem=$(%s mem %d)" % (SMI, pid)}
    env.update(kw)
    return env


def criu_runs(d):
    """The fake's log as a list of runs, each a list of lines (CRIU_LIBS_DIR=, argv..., mem=)."""
    with open(os.path.join(d, "criu.log")) as f:
        text = f.read()
    return [r.strip().splitlines() for r in text.split("--\n") if r.strip()]


def case_full_fake_criu(d):
    p = start(d, ["--mib", "4", "--buffers", "2", "--wait"])
    img = os.path.join(d, "images")
    plugins = os.path.join(d, "plugins")
    try:
        held = mem(d, p.pid)
        env = criu_env(d, p.pid)
        rc, rep, err = gcrctl_env(d, env, "--images-dir", img, "suspend", str(p.pid))
        check(rc == 0 and rep.get("control") == "criu", "full suspend: %s %s" % (rep, err))
        opts = ["--libdir", plugins, "--shell-job", "--tcp-established", "--ext-unix-sk", "--file-locks"]
        pdir = os.path.join(img, str(p.pid))
        want = (["CRIU_LIBS_DIR=" + plugins, "dump", "--tree", str(p.pid), "--images-dir", pdir] + opts +
                ["--log-file", "dump.log", "-v2", "mem=%d" % SMALL])
        runs = criu_runs(d)
        check(len(runs) == 1 and runs[0] == want, "dump run %s, expected %s" % (runs, want))
        check(os.path.exists(os.path.join(pdir, "gcr-dump")), "no dump mark")
        # The stand-in's criu does not end the process: it stays suspended by the shim.
        rc, rep, err = gcrctl_env(d, env, "--images-dir", img, "resume", str(p.pid))
        check(rc == 0 and rep.get("control") == "criu", "full resume: %s %s" % (rep, err))
        runs = criu_runs(d)
        want = (["CRIU_LIBS_DIR=" + plugins, "restore", "--images-dir", pdir] + opts +
                ["--log-file", "restore.log", "-v2", "--restore-detached", "--pidfile",
                 os.path.join(pdir, "restore.pid"), "mem=%d" % SMALL])
        check(len(runs) == 2 and runs[1] == want, "restore run %s, expected %s" % (runs[1:], want))
        check(not os.path.exists(os.path.join(pdir, "gcr-dump")), "dump mark left after the restore")
        check(mem(d, p.pid) == held and shim_state(d, p.pid) == "running", "after the full resume")
        check(ask_check(p) == "RESULT ok", "checksums after the full cycle")
        # A dump that fails: the shim's data goes back, the process keeps running.
        env = criu_env(d, p.pid, FAKE_CRIU_RC="1", FAKE_CRIU_SAY="Error (criu/cr-dump.c): dump failed")
        rc, rep, err = gcrctl_env(d, env, "--images-dir", img, "suspend", str(p.pid))
        msg = (rep or {}).get("error", "")
        check(rc != 0 and "criu dump failed" in msg and "process running" in msg, "failing dump: %s %s" % (rep, err))
        check(criu_runs(d)[-1][-1] == "mem=%d" % SMALL, "the failing dump ran before the data step")
        check(shim_state(d, p.pid) == "running" and mem(d, p.pid) == held, "after the failing dump")
        check(not os.path.exists(os.path.join(pdir, "gcr-dump")), "dump mark after a failed dump")
        check(ask_check(p) == "RESULT ok", "checksums after the failing dump")
    finally:
        if p.poll() is None:
            finish(p)


def case_fault_passthrough(d):
    # The runtime's error reaches the application unchanged through the shim's wrapper: the
    # first hipMemCreate is the shim's, for the first large hipMalloc, so hipMalloc reports it.
    out = subprocess.run([PROG, "--mib", "2"], env=env_for(d, extra={"FAKEHIP_FAIL": "hipMemCreate:1:2"}),
                         capture_output=True, text=True, timeout=120)
    check(out.returncode == 1 and "hipMalloc" in out.stderr and "hipErrorOutOfMemory" in out.stderr,
          "injected fault: rc %d %s" % (out.returncode, out.stderr))
    # And the application's own hipMemCreate (after three converted buffers and the small one).
    out = subprocess.run([PROG, "--mib", "2"], env=env_for(d, extra={"FAKEHIP_FAIL": "hipMemCreate:3:2"}),
                         capture_output=True, text=True, timeout=120)
    check(out.returncode == 1 and "hipMemCreate" in out.stderr and "hipErrorOutOfMemory" in out.stderr,
          "injected fault: rc %d %s" % (out.returncode, out.stderr))


def case_fault_injected_live(d):
    p = start(d, ["--mib", "2", "--wait"])
    try:
        smi(d, "fail", str(p.pid), "hipLaunchKernel", "1", "98")
        p.stdin.write("check\n")
        p.stdin.flush()
        rc = p.wait(timeout=60)
        check(rc == 1 and "hipLaunchKernel" in p.stderr.read(), "live fault: exit %d" % rc)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def main():
    cases = [case_without_shim, case_under_shim, case_suspend_resume_keep_context, case_all_converted_zero_bytes,
             case_gate_holds_launches, case_oom_at_resume_then_retry, case_failed_suspend_leaves_running,
             case_full_without_criu, case_full_fake_criu, case_fault_passthrough, case_fault_injected_live]
    passed = failed = 0
    for c in cases:
        d = tempfile.mkdtemp(prefix="gcr-hipflow-")
        try:
            c(d)
            passed += 1
            print("PASS %s" % c.__name__)
        except Exception as e:  # noqa: BLE001 - every failure is reported, then the next case runs
            failed += 1
            print("FAIL %s: %s" % (c.__name__, e))
            if not isinstance(e, Fail):
                traceback.print_exc()
        finally:
            subprocess.run(["rm", "-rf", d])
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
