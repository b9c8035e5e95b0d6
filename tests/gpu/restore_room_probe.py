# tests/gpu/restore_room_probe.py: measures, on a real GPU, how much free memory the driver's
# cuCheckpointProcessRestore needs beyond what NVML showed the process using before its checkpoint.
"""Usage: python3 tests/gpu/restore_room_probe.py [--hold-mib 64] [--extra-mib "-64 0 32 64 128 256"]

For each extra E: a fresh child (ctypes, driver API) allocates --hold-mib of small buffers and
fills them; NVML's usedGpuMemory for it is the need N (what lib/gcr_room.c records); the child is
locked and checkpointed; a filler process takes the GPU down to N + E free; the restore is tried.
An out-of-memory restore leaves the driver unable to ever restore that child (CUDA_ERROR_OPERATING_
SYSTEM afterwards), so every trial uses a new child. Prints one JSON line per trial, with the
cost of the NVML calls gcr_room makes. Stdlib only; libcuda and libnvidia-ml by ctypes.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
def ok(r, what):
    if r != 0:
        print("ERR %s %d" % (what, r), flush=True); sys.exit(1)
ok(cu.cuInit(0), "init")
dev = ctypes.c_int(); ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "dev")
ctx = ctypes.c_void_p(); ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
ok(cu.cuCtxSetCurrent(ctx), "cur")
mib = int(sys.argv[1]); bufs = []
for i in range(max(1, mib // 8)):
    p = ctypes.c_uint64(); ok(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(8 << 20)), "alloc")
    ok(cu.cuMemsetD8_v2(p, ctypes.c_ubyte(i % 251 + 1), ctypes.c_size_t(8 << 20)), "set"); bufs.append(p)
ok(cu.cuCtxSynchronize(), "sync")
print("READY", flush=True)
sys.stdin.readline()
h = (ctypes.c_ubyte * 16)()
for i, p in enumerate(bufs):
    ok(cu.cuMemcpyDtoH_v2(h, p, ctypes.c_size_t(16)), "dtoh")
    if any(b != i % 251 + 1 for b in h):
        print("BAD", flush=True); sys.exit(1)
print("OK", flush=True)
"""

FILLER = r"""
import ctypes, sys
cu = ctypes.CDLL("libcuda.so.1")
cu.cuInit(0); dev = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(dev), 0)
ctx = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cu.cuCtxSetCurrent(ctx)
nv = ctypes.CDLL("libnvidia-ml.so.1"); nv.nvmlInit_v2()
h = ctypes.c_void_p(); nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
want = int(sys.argv[1]); held = []
# Allocate in shrinking steps until NVML's free is at most want (2 MiB granularity).
step = 1 << 30
while True:
    m = Mem(); nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
    if m.free <= want or step < (2 << 20):
        break
    take = min(step, m.free - want)
    take -= take % (2 << 20)
    p = ctypes.c_uint64()
    if take == 0 or cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(take)) != 0:
        step //= 2; continue
    held.append(p)
m = Mem(); nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
print("FILLED %d" % m.free, flush=True)
sys.stdin.readline()
"""


class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Proc(ctypes.Structure):  # nvmlProcessInfo_t (v3 layout)
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hold-mib", type=int, default=64)
    ap.add_argument("--extra-mib", default="-64 0 16 32 64 128 256")
    a = ap.parse_args()
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuInit(0)
    nv = ctypes.CDLL("libnvidia-ml.so.1")
    t = time.perf_counter()
    nv.nvmlInit_v2()
    init_ms = (time.perf_counter() - t) * 1e3
    h = ctypes.c_void_p()
    nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))

    def used_by(pid):
        n = ctypes.c_uint(64)
        arr = (Proc * 64)()
        t0 = time.perf_counter()
        r = nv.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), arr)
        ms = (time.perf_counter() - t0) * 1e3
        for i in range(n.value if r == 0 else 0):
            if arr[i].pid == pid:
                return arr[i].usedGpuMemory, ms
        return 0, ms

    def free():
        m = Mem()
        t0 = time.perf_counter()
        nv.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
        return m.free, (time.perf_counter() - t0) * 1e3

    print(json.dumps({"nvml_init_ms": round(init_ms, 3)}), flush=True)
    for extra in [int(x) for x in a.extra_mib.split()]:
        c = subprocess.Popen([sys.executable, "-c", CHILD, str(a.hold_mib)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        if c.stdout.readline().strip() != "READY":
            print(json.dumps({"extra_mib": extra, "error": "child did not start"}), flush=True)
            c.kill()
            continue
        need, proc_ms = used_by(c.pid)
        lock = (ctypes.c_ubyte * 64)()
        r_lock = cu.cuCheckpointProcessLock(c.pid, lock)
        r_ckpt = cu.cuCheckpointProcessCheckpoint(c.pid, None)
        after_ckpt, _ = used_by(c.pid)
        want = need + extra * (1 << 20)
        f = subprocess.Popen([sys.executable, "-c", FILLER, str(max(want, 0))], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        line = f.stdout.readline().split()
        fr, mem_ms = free()
        t0 = time.perf_counter()
        r_rest = cu.cuCheckpointProcessRestore(c.pid, None)
        rest_ms = (time.perf_counter() - t0) * 1e3
        after_rest, _ = used_by(c.pid)
        f.stdin.write("\n")
        f.stdin.flush()
        f.wait(60)
        r_retry = None
        if r_rest != 0:
            r_retry = cu.cuCheckpointProcessRestore(c.pid, None)
        r_unlock = cu.cuCheckpointProcessUnlock(c.pid, None)
        out = None
        if r_unlock == 0:
            c.stdin.write("\n")
            c.stdin.flush()
            out = c.stdout.readline().strip()
        c.kill()
        c.wait(30)
        print(json.dumps({"extra_mib": extra, "need": need, "free_at_restore": fr, "filler": line,
                          "lock": r_lock, "checkpoint": r_ckpt, "used_after_ckpt": after_ckpt,
                          "restore": r_rest, "restore_ms": round(rest_ms, 1), "used_after_restore": after_rest,
                          "retry_after_filler_left": r_retry, "unlock": r_unlock, "child": out,
                          "nvml_procs_ms": round(proc_ms, 3), "nvml_mem_ms": round(mem_ms, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
