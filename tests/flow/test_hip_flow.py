# tests/flow/test_hip_flow.py: the HIP backend end to end on the stand-in runtime (tests/fakehip):
# gcr-hipprog under the preloaded shim, the control socket and protocol, what status and stats
# report, the stand-in's memory accounting, fault injection, and the refusal to suspend (phase 1).
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
    rc = p.wait(timeout=120)
    check(rc == 0, "program exit %d: %s" % (rc, p.stderr.read()[-500:]))


def gcrctl(d, *args):
    out = subprocess.run([GCRCTL, "--socket-dir", d, "--json"] + list(args), capture_output=True,
                         text=True, timeout=60, env=env_for(d, shim=False))
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


def case_under_shim(d):
    mib, bufs = 4, 3
    p = start(d, ["--mib", str(mib), "--buffers", str(bufs), "--wait"])
    try:
        check(ask_check(p) == "RESULT ok", "checksums under the shim")
        rc, st, err = gcrctl(d, "status", str(p.pid))
        check(rc == 0 and st is not None, "status: %s" % err)
        shim = st.get("shim") or {}
        check(shim.get("backends") == {"cuda": False, "hip": True}, "backends: %s" % shim.get("backends"))
        hb = shim["hip"]["bytes"]
        # Buffers plus the 8-byte checksum word (rounded by the runtime, counted as asked).
        check(hb["plain"] == bufs * mib * MIB + 8, "hip plain bytes %d" % hb["plain"])
        check(hb["vmm"] == mib * MIB and hb["mapped"] == mib * MIB and hb["reserved"] == mib * MIB,
              "hip vmm bytes %s" % hb)
        # The stand-in holds the buffers (granularity-rounded) and the physical allocation.
        held = int(smi(d, "mem", str(p.pid)))
        check(held == bufs * mib * MIB + 2 * MIB + mib * MIB, "stand-in holds %d bytes" % held)
        rc, stats, err = gcrctl(d, "stats", str(p.pid))
        calls = stats["calls"]
        check(calls.get("hipMalloc") == bufs + 1, "hipMalloc calls %s" % calls.get("hipMalloc"))
        check(calls.get("hipLaunchKernel", 0) >= 2 * (bufs + 1) and calls.get("hipModuleLaunchKernel") == 1,
              "launch counts %s" % calls)
        check(calls.get("hipMemCreate") == 1 and calls.get("hipMemSetAccess") == 1, "vmm calls %s" % calls)
        # Phase 1: a HIP process is refused before anything is touched, and keeps running.
        rc, rep, err = gcrctl(d, "suspend", "--no-driver", str(p.pid))
        check(rc != 0 and "HIP" in (rep or {}).get("error", "") + err, "suspend of a HIP process: %s %s" % (rep, err))
        check(ask_check(p) == "RESULT ok", "checksums after the refused suspend")
        check(int(smi(d, "mem", str(p.pid))) == held, "memory changed by a refused suspend")
    finally:
        if p.poll() is None:
            finish(p)
    # Everything freed through the wrappers at exit: nothing is left recorded on the way out.


def case_fault_passthrough(d):
    # The runtime's error reaches the application unchanged through the shim's wrapper.
    out = subprocess.run([PROG, "--mib", "2"], env=env_for(d, extra={"FAKEHIP_FAIL": "hipMemCreate:1:2"}),
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
    cases = [case_without_shim, case_under_shim, case_fault_passthrough, case_fault_injected_live]
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
