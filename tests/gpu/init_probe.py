#!/usr/bin/env python3
"""tests/gpu/init_probe.py: what a new process pays to open the CUDA driver (dlopen + cuInit)
while the GPUs' only process is checkpointed, and what changes it. gcrctl opens the driver at
every call; on the two-H200 machine that was 30 ms at a suspend (contexts live) and 230-440 ms
at a resume (run 70), a quarter of the group resume. This finds out why and what helps:

  - running:      a torch process with 2 GiB on every GPU, running;
  - checkpointed: the same process checkpointed by the driver (gcrctl --driver-only);
  - holder:       checkpointed, while another process has the driver open (cuInit, no context),
                  as the node agent does;
  - one-gpu:      checkpointed, the prober sees one GPU (CUDA_VISIBLE_DEVICES=0);
  - after-gap:    checkpointed, 3 s after the last opening;
  - no-init:      whether cuCheckpointProcessGetState answers without cuInit.

Each condition opens the driver in 3 fresh processes and reports the medians. One JSON line per
condition on stdout. Env: GCRCTL (gcrctl), LIBCUDA (default libcuda.so.1).
Usage: python3 tests/gpu/init_probe.py > init.jsonl
"""
import json
import os
import statistics
import subprocess
import sys
import time

GCRCTL = os.environ.get("GCRCTL", "node-agent/gcrctl")
LIBCUDA = os.environ.get("LIBCUDA", "libcuda.so.1")

# A fresh process: dlopen and cuInit timed apart; optionally the state query of a pid without
# cuInit first.
OPEN = r"""
import ctypes, json, sys, time
t0 = time.perf_counter()
lib = ctypes.CDLL(sys.argv[1])
t1 = time.perf_counter()
out = {"dlopen_ms": (t1 - t0) * 1e3}
pid = int(sys.argv[2])
if pid > 0:
    st = ctypes.c_int(-1)
    out["state_without_init_rc"] = lib.cuCheckpointProcessGetState(pid, ctypes.byref(st))
    out["state_without_init"] = st.value
t2 = time.perf_counter()
out["init_rc"] = lib.cuInit(0)
out["init_ms"] = (time.perf_counter() - t2) * 1e3
if pid > 0:
    st = ctypes.c_int(-1)
    out["state_rc"] = lib.cuCheckpointProcessGetState(pid, ctypes.byref(st))
    out["state"] = st.value
print(json.dumps(out))
"""

# The holder: opens the driver as the agent does, says so, waits for stdin to close.
HOLD = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
print(lib.cuInit(0), flush=True)
sys.stdin.read()
"""

WORKER = r"""
import sys, torch
bufs = [torch.ones(512 << 20, dtype=torch.float32, device=f"cuda:{d}") for d in range(torch.cuda.device_count())]
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.read()
"""


def opened(env=None, pid=0):
    r = subprocess.run([sys.executable, "-c", OPEN, LIBCUDA, str(pid)], capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, timeout=60)
    if r.returncode != 0:
        return {"error": r.stderr[-400:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def condition(name, env=None, pid=0, gap_s=0.0, reps=3):
    runs = []
    for _ in range(reps):
        if gap_s:
            time.sleep(gap_s)  # the condition itself: the GPUs left alone that long
        runs.append(opened(env, pid))
    ok = [r for r in runs if "init_ms" in r]
    line = {"condition": name, "runs": runs}
    if ok:
        line["init_ms_median"] = statistics.median(r["init_ms"] for r in ok)
        line["dlopen_ms_median"] = statistics.median(r["dlopen_ms"] for r in ok)
    print(json.dumps(line), flush=True)


def gcrctl(*args):
    r = subprocess.run([GCRCTL, "--json", *args], capture_output=True, text=True, timeout=120)
    print(json.dumps({"gcrctl": list(args), "rc": r.returncode, "stdout": r.stdout[-1500:],
                      "stderr": r.stderr[-600:]}), flush=True)
    return r.returncode


def main():
    w = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if w.stdout.readline().strip() != "ready":
        sys.exit("worker did not start")
    try:
        condition("running", pid=w.pid)
        if gcrctl("suspend", "--driver-only", str(w.pid)) != 0:
            sys.exit("driver-only suspend failed")
        condition("checkpointed", pid=w.pid)
        condition("one-gpu", env={"CUDA_VISIBLE_DEVICES": "0"}, pid=w.pid)
        condition("after-gap", pid=w.pid, gap_s=3.0)
        h = subprocess.Popen([sys.executable, "-c", HOLD, LIBCUDA], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
        print(json.dumps({"holder_cuInit_rc": h.stdout.readline().strip()}), flush=True)
        condition("holder", pid=w.pid)
        condition("holder-after-gap", pid=w.pid, gap_s=3.0)
        gcrctl("resume", "--driver-only", str(w.pid))  # its ms.init with the holder there
        h.stdin.close()
        h.wait(timeout=30)
    finally:
        w.stdin.close()
        w.wait(timeout=60)


if __name__ == "__main__":
    main()
