# tests/bench/test_report.py: bench/report.py on synthetic logs in the format bench_cr.py writes
# (kinds "cr" and "serving", shim reports with copied/zero/host): tables, targets, ratios, plots.
"""Exits 0 when every check holds; prints 'N passed, N failed'. The plots are checked only where
matplotlib is installed (CI does not need it); --keep DIR keeps the synthetic log and PNGs there."""

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

SRC = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "bench"))
import report  # noqa: E402
from tally import Tally  # noqa: E402

GIB = 1 << 30
T = Tally("report")
check = T.check


def step(ms, total, copied, zero=0, unchanged=0, host=None, ok=True):
    shim = {"bytes": total, "copied": copied, "zero": zero, "unchanged": unchanged,
            "host": host if host is not None else total - zero, "ms": {"total": ms * 0.6, "digest": 3.0}}
    return {"ok": ok, "rc": 0 if ok else 1, "wall_ms": ms + 80.0, "ms": {"total": ms, "data": ms * 0.6},
            "bytes": {"moved": copied, "total": total}, "mode": "gcr", "error": None if ok else "boom",
            "code": None, "shim": shim}


def driver_step(ms, ok=True):
    return {"ok": ok, "rc": 0, "wall_ms": ms + 80.0, "ms": {"total": ms, "checkpoint": ms}, "bytes": None,
            "mode": "driver-only", "error": None, "code": None, "shim": None}


def synth(path):
    rnd = random.Random(5)
    recs = [{"kind": "bench-start", "bench": "cr", "sizes": [1, 4, 16, 64], "reps": 3}]
    gcr_ms = {1: (300, 250), 4: (380, 300), 16: (700, 760), 64: (1900, 2100)}
    drv_ms = {1: (875, 440), 4: (2300, 880), 16: (7500, 2800), 64: (30000, 12000)}
    for gib in (1, 4, 16, 64):
        total = gib * GIB
        for rep in range(3 if gib < 64 else 1):
            s, r = (x * (1 + 0.05 * rnd.random()) for x in gcr_ms[gib])
            recs.append({"kind": "cr", "case": "sizes", "prog": "testprog", "path": "gcr", "gib": float(gib), "rep": rep,
                         "ok": True, "result": "ok", "gpu_mib_suspended": 0, "gpu_mib_running": gib * 1024 + 500,
                         "suspend": step(s, total, total, host=int(total * 1.02)), "resume": step(r, total, total)})
            s, r = (x * (1 + 0.05 * rnd.random()) for x in drv_ms[gib])
            recs.append({"kind": "cr", "case": "sizes", "prog": "testprog", "path": "driver", "gib": float(gib), "rep": rep,
                         "ok": True, "result": "ok", "gpu_mib_suspended": 0, "suspend": driver_step(s),
                         "resume": driver_step(r)})
    for gib in (1, 16):
        for rep in range(2):
            recs.append({"kind": "cr", "case": "keep", "prog": "testprog", "path": "gcr-keep", "gib": float(gib),
                         "rep": rep, "ok": True, "suspend": step(150 + 10 * gib, gib * GIB, gib * GIB),
                         "resume": step(140 + 12 * gib, gib * GIB, gib * GIB)})
    res_total, written = 60 * GIB, 4 * GIB
    recs.append({"kind": "cr", "case": "reserved", "prog": "testprog-reserved", "path": "gcr", "gib": 60.0,
                 "written_gib": 4.0, "rep": 0, "ok": True,
                 "suspend": step(550, res_total, written, zero=res_total - written, host=int(written * 1.2)),
                 "resume": step(500, res_total, written, zero=res_total - written)})
    recs.append({"kind": "cr", "case": "reserved", "prog": "testprog-reserved", "path": "driver", "gib": 60.0,
                 "written_gib": 4.0, "rep": 0, "ok": True, "suspend": driver_step(28000), "resume": driver_step(11000)})
    recs.append({"kind": "cr", "case": "sizes", "prog": "testprog", "path": "gcr", "gib": 4.0, "rep": 9,
                 "ok": False, "skipped": True, "error": "time budget (10 s left, ~20 s needed)"})
    total = 17 * GIB
    cycles = []
    for i in range(4):
        copied = total if i == 0 else int(1.1 * GIB)
        cycles.append({"cycle": i, "gpu_mib_suspended": 0,
                       "suspend": step(800 if i == 0 else 400 + i, total, copied, unchanged=total - copied),
                       "resume": step(700, total, total)})
    recs.append({"kind": "serving", "case": "serving", "prog": "torch", "path": "gcr", "gib": 17.0, "rep": 0,
                 "weights_gib": 16.0, "state_gib": 1.0, "ok": True, "result": "ok", "cycles": cycles})
    recs.append({"kind": "serving", "case": "serving", "prog": "torch", "path": "driver", "gib": 17.0, "rep": 0,
                 "weights_gib": 16.0, "state_gib": 1.0, "ok": True, "result": "ok",
                 "cycles": [{"cycle": 0, "suspend": driver_step(8000), "resume": driver_step(3200)}]})
    for shim in (False, True):
        for rep in range(3):
            recs.append({"kind": "overhead", "bench": "torch-eager", "shim": shim, "rep": rep, "ok": True,
                         "mean_ms": 6.0 * (1.005 if shim else 1.0), "p90_ms": 7.0})
            recs.append({"kind": "overhead", "bench": "launch-kernel", "shim": shim, "rep": rep, "ok": True,
                         "ns_per_launch": 3400 * (1.05 if shim else 1.0), "per_s": 290000})
            # Process-to-process drift (rep) larger than the shim's cost: the pairs' ratios see 1 %.
            recs.append({"kind": "overhead", "bench": "launch-submit", "shim": shim, "rep": rep, "ok": True,
                         "ns_per_launch": (1000 + 200 * rep) * (1.01 if shim else 1.0)})
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
        f.write("not json\n")


def verdict(rows, prefix):
    for r in rows:
        if r[0].startswith(prefix):
            return r[2], r[1]
    return None, None


def main():
    keep = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--keep" else None
    d = keep or tempfile.mkdtemp(prefix="gcr-report-")
    os.makedirs(d, exist_ok=True)
    log = os.path.join(d, "bench.jsonl")
    synth(log)
    recs, bad, _ = report.load([log])
    check(bad == 1, "one unparsable line counted, got %d" % bad)
    rows = report.targets(recs)
    want = {"16 GiB suspend ≤": "PASS", "16 GiB suspend ≥ 10×": "PASS", "16 GiB resume ≤": "PASS",
            "16 GiB resume ≥ 4×": "FAIL",  # about 2800 / 760 = 3.7×
            "64 GiB suspend": "PASS", "64 GiB resume": "FAIL", "1 GiB suspend": "PASS",
            "keep-context 16 GiB suspend": "PASS", "incremental serving, later suspends copy": "PASS",
            "incremental serving, later suspends ≤": "PASS", "reserved 60 GiB / written 4 GiB": "PASS",
            "staging host bytes": "FAIL",  # the reserved run holds 1.2× what it saved
            "overhead ≤ 1%: PyTorch eager": "PASS", "overhead ≤ 1%: PyTorch CUDA-graph": "—",
            "overhead ≤ 3%: launch-bound: empty kernels": "FAIL",
            "overhead ≤ 3%: launch-bound: host time": "PASS"}
    for prefix, v in want.items():
        got, measured = verdict(rows, prefix)
        check(got == v, "target %r: %s (%s), expected %s" % (prefix, got, measured, v))
    got, measured = verdict(rows, "16 GiB resume ≥ 4×")
    check(measured is not None and measured.startswith("3."), "16 GiB resume ratio shown as %s" % measured)
    got, measured = verdict(rows, "staging host bytes")
    check(measured is not None and measured.startswith("1.200"), "host ratio shown as %s" % measured)
    got, measured = verdict(rows, "overhead ≤ 3%: launch-bound: host time")
    check(measured == "+1.00% (pairs: median +1.00%)", "submit overhead shown as %s" % measured)
    text = report.render([log])
    check("(3 pairs: median +1.00%)" in text, "overhead table shows the pairs' median")
    check("NOT RUN" in text, "the skipped run shows as NOT RUN")
    check("| testprog | 64 GiB | GCR | 1/1" in text, "64 GiB GCR row:\n" + text[:3000])
    check("Later GCR suspends (cycle ≥ 1): suspend 402 (401–403) ms" in text, "serving summary")
    check("1.10 (1.10–1.10)" in text, "serving copied GiB")
    cp = subprocess.run([sys.executable, os.path.join(SRC, "bench", "report.py"), log], capture_output=True, text=True)
    check(cp.returncode == 0 and "## Targets" in cp.stdout, "report.py LOG: rc %d %s" % (cp.returncode, cp.stderr[-500:]))
    try:
        import matplotlib  # noqa: F401
        have_mpl = True
    except ImportError:
        have_mpl = False
    if have_mpl:
        pd = os.path.join(d, "plots")
        cp = subprocess.run([sys.executable, os.path.join(SRC, "bench", "report.py"), "--plots", pd, log],
                            capture_output=True, text=True)
        check(cp.returncode == 0, "report.py --plots: rc %d %s" % (cp.returncode, cp.stderr[-800:]))
        for name in ("latency_vs_size.png", "keep_context.png", "incremental.png"):
            p = os.path.join(pd, name)
            ok = os.path.exists(p) and os.path.getsize(p) > 10000
            if ok:
                with open(p, "rb") as f:
                    ok = f.read(8) == b"\x89PNG\r\n\x1a\n"
            check(ok, "plot %s written as a PNG" % name)
    else:
        print("note: matplotlib not installed: plots not checked", flush=True)
    if not keep:
        shutil.rmtree(d, ignore_errors=True)
    return T.done()


if __name__ == "__main__":
    sys.exit(main())
