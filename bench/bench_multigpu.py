# bench/bench_multigpu.py: suspend and resume of processes that use several GPUs, against the
# driver alone in the same run (issue 31): one PyTorch process holding GIB on each of two GPUs;
# the same amount on one GPU (this machine's per-link baseline); two one-GPU processes suspended
# at once (what a group's members do, without NCCL).
"""Usage: python3 bench/bench_multigpu.py [--gib 8] [--reps 3] [--cases two-gpu,one-gpu,two-procs]
        [--log FILE] [--drvpar BIN [--drvpar-gpus N]]
Paths as tests/gpu/harness.py (GCRCTL, GCR_SHIM). Each case: the program fills its tensors with a
seeded pattern and steps (an in-place update every step); gcrctl suspend/resume REPS times (medians,
gcrctl's own "ms.total"), 0 MiB per GPU checked while suspended; then the same program without the
shim, `--driver-only` once (the driver's checkpoint API alone). After the last resume the program
checks every tensor against a recomputation (RESULT ok). One JSON line per measurement to --log."""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
import harness as H  # noqa: E402

PROG = r'''
import sys, torch
gib, devs = float(sys.argv[1]), [int(d) for d in sys.argv[2].split(",")]
# First: the process gets contexts on its own GPUs only (torch.cuda.synchronize() on the default
# device would make one on GPU 0 too, which the driver then checkpoints as well: run 59's
# processes on GPU 1 took twice as long in the driver).
torch.cuda.set_device(devs[0])
n = int(gib * (1 << 30)) // 4
ts = []
for d in devs:
    g = torch.Generator(device="cuda:%d" % d); g.manual_seed(1234 + d)
    t = torch.randint(0, 1 << 30, (n,), device="cuda:%d" % d, dtype=torch.int32, generator=g)
    ts.append(t)
for d in devs:
    torch.cuda.synchronize(d)
print("READY", flush=True)
steps = 0
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "step":
        for t in ts:
            t[: 1 << 20].add_(1)
        for d in devs:
            torch.cuda.synchronize(d)
        steps += 1
        print("STEPPED", flush=True)
    elif cmd == "check":
        ok = True
        for d, t in zip(devs, ts):
            g = torch.Generator(device="cuda:%d" % d); g.manual_seed(1234 + d)
            ref = torch.randint(0, 1 << 30, (n,), device="cuda:%d" % d, dtype=torch.int32, generator=g)
            ref[: 1 << 20].add_(steps)
            ok = ok and bool(torch.equal(ref, t))
            del ref
        print("RESULT ok" if ok else "RESULT FAIL", flush=True)
        break
'''


class Proc:
    def __init__(self, cfg, gib, devs, shim):
        env = dict(os.environ)
        if shim:
            env["LD_PRELOAD"] = cfg.shim
            env["GCR_SOCKET_DIR"] = SOCK
        self.p = subprocess.Popen([cfg.python, "-c", PROG, str(gib), ",".join(map(str, devs))],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.expect("READY")

    def expect(self, want):
        line = self.p.stdout.readline().strip()
        if line != want and not line.startswith(want):
            raise RuntimeError("expected %r, got %r" % (want, line))
        return line

    def cmd(self, c, want):
        self.p.stdin.write(c + "\n")
        self.p.stdin.flush()
        return self.expect(want)

    def end(self):
        r = self.cmd("check", "RESULT")
        self.p.wait(60)
        return r == "RESULT ok"


def ctl(cfg, *args):
    return H.gcrctl(cfg, SOCK, args[0], None, list(args[1:]), timeout=300)


def log(rec):
    rec["t"] = time.time()
    print(json.dumps(rec), flush=True)
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps(rec) + "\n")


def used(cfg, pids):
    return sum(H.gpu_mem_mib(cfg, p) or 0 for p in pids)


def log_contexts(cfg, name, pids):
    """Which GPUs each process has a context on (the driver checkpoints every one of them)."""
    apps = subprocess.run([cfg.nvidia_smi, "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=60).stdout
    log({"kind": "contexts", "case": name, "pids": pids, "compute_apps": apps.splitlines()})


def case(cfg, name, gib, groups, reps):
    """groups: the device list of each process; all suspended at once (gcrctl scale)."""
    procs = [Proc(cfg, gib, devs, True) for devs in groups]
    pids = [str(p.p.pid) for p in procs]
    log_contexts(cfg, name, pids)
    sus, res, held = [], [], []
    for i in range(reps):
        for p in procs:
            p.cmd("step", "STEPPED")
        t0 = time.monotonic()
        r = ctl(cfg, "scale", "--replicas", "0", *pids) if len(pids) > 1 else ctl(cfg, "suspend", pids[0])
        t1 = time.monotonic()
        if not r.ok:
            raise RuntimeError("%s suspend: %s" % (name, r.describe()))
        held.append(used(cfg, [p.p.pid for p in procs]))
        r2 = ctl(cfg, "scale", "--replicas", str(len(pids)), *pids) if len(pids) > 1 else ctl(cfg, "resume", pids[0])
        t2 = time.monotonic()
        if not r2.ok:
            raise RuntimeError("%s resume: %s" % (name, r2.describe()))
        one = len(pids) == 1
        sus.append(r.get("ms", "total") if one else (t1 - t0) * 1000)
        res.append(r2.get("ms", "total") if one else (t2 - t1) * 1000)
        log({"kind": "multigpu", "case": name, "rep": i, "suspend_ms": sus[-1], "resume_ms": res[-1],
             "gpu_mib_suspended": held[-1], "suspend": r.data, "resume": r2.data})
    exact = all(p.end() for p in procs)
    # the driver alone, same program without the shim
    plain = [Proc(cfg, gib, devs, False) for devs in groups]
    d_s, d_r = [], []
    for p in plain:
        t0 = time.monotonic()
        r = ctl(cfg, "suspend", "--driver-only", str(p.p.pid))
        t1 = time.monotonic()
        r2 = ctl(cfg, "resume", "--driver-only", str(p.p.pid))
        t2 = time.monotonic()
        d_s.append((t1 - t0) * 1000 if r.ok else None)
        d_r.append((t2 - t1) * 1000 if r2.ok else None)
    for p in plain:
        p.end()
    out = {"kind": "multigpu-summary", "case": name, "gib_per_gpu": gib, "gpus": sum(len(g) for g in groups),
           "processes": len(groups), "suspend_median_ms": statistics.median(sus),
           "resume_median_ms": statistics.median(res), "suspend_ms": sus, "resume_ms": res,
           "gpu_mib_suspended": held, "bit_exact": exact,
           "driver_suspend_ms": d_s, "driver_resume_ms": d_r}
    log(out)
    return out


def drvpar_case(cfg, gib, ngpu, reps, tool):
    """The driver's own part of a suspend on one process per GPU at once: the data out first
    (--no-driver), then bench/drvpar's lock+checkpoint and restore+unlock of all of them from one
    caller in sequence, from threads of one caller (what gcr_group and scale do), and from one
    caller process each. Tells whether the driver's steps serialise, and where."""
    procs = [Proc(cfg, gib, [d], True) for d in range(ngpu)]
    pids = [str(p.p.pid) for p in procs]
    runs = []
    # Which GPUs each process has a context on (the driver checkpoints every one of them).
    log_contexts(cfg, "drvpar", pids)
    for p in procs:
        r = ctl(cfg, "suspend", "--no-driver", str(p.p.pid))
        if not r.ok:
            raise RuntimeError("drvpar: data out: %s" % r.describe())
    for i in range(reps):
        for mode in ("seq", "threads", "fork"):
            for op in ("out", "in"):
                out = subprocess.run([tool, mode, op] + pids, capture_output=True, text=True, timeout=120)
                try:
                    rec = json.loads(out.stdout)
                except ValueError:
                    raise RuntimeError("drvpar %s %s: %s %s" % (mode, op, out.stdout, out.stderr))
                rec["rep"] = i
                log(rec)
                runs.append(rec)
                if any(p["rc"] != 0 for p in rec["procs"]):
                    raise RuntimeError("drvpar %s %s failed: %s" % (mode, op, rec))
    for p in procs:
        r = ctl(cfg, "resume", "--no-driver", str(p.p.pid))
        if not r.ok:
            raise RuntimeError("drvpar: data back: %s" % r.describe())
    exact = all(p.end() for p in procs)
    summ = {"kind": "drvpar-summary", "processes": ngpu, "gib": gib, "bit_exact": exact}
    for mode in ("seq", "threads", "fork"):
        for op in ("out", "in"):
            w = [r["wall_ms"] for r in runs if r["mode"] == mode and r["op"] == op]
            summ["%s_%s_wall_median_ms" % (mode, op)] = statistics.median(w)
    log(summ)
    return summ


def main():
    global SOCK, LOG
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cases", default="two-gpu,one-gpu,two-procs")
    ap.add_argument("--log", default=os.environ.get("GCR_BENCH_LOG"))
    ap.add_argument("--drvpar", help="bench/drvpar's binary: run the drvpar case (one process per GPU) too")
    ap.add_argument("--drvpar-gpus", type=int, default=2)
    a = ap.parse_args()
    LOG = a.log
    cfg = H.Config()
    SOCK = tempfile.mkdtemp(prefix="gcr-sock-")
    cases = {"two-gpu": [[0, 1]], "one-gpu": [[0]], "two-procs": [[0], [1]]}
    failed = 0
    for name in filter(None, a.cases.split(",")):
        try:
            s = case(cfg, name, a.gib, cases[name], a.reps)
            print("%s: suspend %.0f ms, resume %.0f ms (medians of %d); driver alone %s / %s ms; 0 MiB: %s; "
                  "bit-exact: %s" % (name, s["suspend_median_ms"], s["resume_median_ms"], a.reps,
                                     s["driver_suspend_ms"], s["driver_resume_ms"],
                                     all(h == 0 for h in s["gpu_mib_suspended"]), s["bit_exact"]), flush=True)
            failed += not s["bit_exact"] or any(h != 0 for h in s["gpu_mib_suspended"])
        except Exception as e:  # noqa: BLE001 - reported; the next case runs
            failed += 1
            print("%s: FAILED: %s" % (name, e), flush=True)
    if a.drvpar:
        try:
            s = drvpar_case(cfg, 1.0, a.drvpar_gpus, a.reps, a.drvpar)
            print("drvpar: %s" % json.dumps(s), flush=True)
            failed += not s["bit_exact"]
        except Exception as e:  # noqa: BLE001 - reported
            failed += 1
            print("drvpar: FAILED: %s" % e, flush=True)
    return 1 if failed else 0


SOCK = LOG = None
if __name__ == "__main__":
    sys.exit(main())
