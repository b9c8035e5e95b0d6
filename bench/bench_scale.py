#!/usr/bin/env python3
# bench/bench_scale.py: scale PyTorch serving processes on the GPU to zero and back with
# `gcrctl scale` (the same lib/gcr_scale.c policy and runner as the cluster scaler), time the
# request to all suspended / all resident, check 0 MiB while at zero and the outputs bit-exact
# against an uninterrupted run of the same seed (issue 6, item 6).
"""Usage: bench/bench_scale.py [--gib 16 [16 ...]] [--cycles 2] [--steps 160] [--pace-ms 25]

Env as tests/gpu/harness.py (GCRCTL, GCR_SHIM, TORCH_SERVE, GCR_BENCH_LOG, GCR_LOG_DIR).
One JSON line per scale request (kind "scale") and one summary (kind "scale-summary") go to
GCR_BENCH_LOG; a table goes to stdout. Exit 0 only when every scale succeeded, every process
was at 0 MiB while at zero and every digest matched the reference."""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))
import harness as H  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, nargs="+", default=[16.0], help="GPU GiB held by each serving process")
    ap.add_argument("--cycles", type=int, default=2)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--pace-ms", type=float, default=25.0)
    a = ap.parse_args()

    cfg = H.Config()
    s = H.Session(cfg, os.environ.get("GCR_BENCH_LOG", "/tmp/gcr-bench.jsonl"))
    ok = True
    try:
        procs, refs = [], {}
        for i, g in enumerate(a.gib):
            argv = [cfg.python, cfg.torch_serve, "--wait", "--steps", a.steps, "--pace-ms", a.pace_ms,
                    "--extra-gib", g]
            procs.append((g, s.start("scale-serve-%d-%gGiB" % (i, g), argv, shim=True)))
            if g not in refs:  # one uninterrupted run per configuration, same seed
                refs[g] = s.start("scale-ref-%gGiB" % g, argv, shim=False)
        everyone = [p for _, p in procs] + list(refs.values())
        for p in everyone:
            p.expect(r"^READY", 300, what="READY")
        for _, p in procs:
            if H.wait_staging_ready(s, p.pid, timeout=240) is None:
                raise H.HarnessError("staging of %d never became ready" % p.pid)
        for p in everyone:
            p.send("go")
        for _, p in procs:
            p.expect(r"^STEP 10\b", 120, what="STEP 10")
        pids = [str(p.pid) for _, p in procs]
        rows = []
        for cycle in range(a.cycles):
            for target in (0, len(procs)):
                flags = ["--replicas", str(target)] + pids[:-1]
                r = s.ctl("scale", pids[-1], flags=flags, timeout=300, test="bench_scale",
                          note="cycle %d to %d" % (cycle, target))
                mib = [H.gpu_mem_mib(s.cfg, p.pid) for _, p in procs]
                good = r.rc == 0 and r.error is None
                if target == 0:
                    good = good and all(m == 0 for m in mib)
                ok = ok and good
                row = {"cycle": cycle, "to": target, "ok": good, "wall_ms": round(r.wall_ms, 1),
                       "ms": H.dig(r.data, "ms"), "gpu_mib": mib, "gib": a.gib,
                       "procs": [{k: x.get(k) for k in ("pid", "action", "ok", "ms", "bytes", "error")}
                                 for x in (H.dig(r.data, "processes") or [])],
                       "error": r.error}
                s.log.write(kind="scale", **row)
                rows.append(row)
                print("cycle %d scale to %d: %s request-to-done %s ms (gcrctl wall %.0f ms), GPU MiB %s%s"
                      % (cycle, target, "ok" if good else "FAIL", H.dig(r.data, "ms", "total"), r.wall_ms,
                         mib, "" if r.error is None else " error: " + r.error), flush=True)
        for p in everyone:
            p.expect(r"^DONE", 600, what="DONE")
            p.send("check")
        digests = {}
        for g, p in [(g, p) for g, p in procs] + [(g, p) for g, p in refs.items()]:
            m = p.expect(r"^DIGEST (\S+)", 300, what="DIGEST")
            p.expect(r"^RESULT ok", 120, what="RESULT ok")
            digests.setdefault(g, []).append(m.group(1))
        exact = all(len(set(v)) == 1 for v in digests.values())
        ok = ok and exact
        down = [r["ms"]["total"] for r in rows if r["to"] == 0 and r["ms"]]
        up = [r["ms"]["total"] for r in rows if r["to"] != 0 and r["ms"]]
        summ = {"gib": a.gib, "cycles": a.cycles, "ok": ok, "bit_exact": exact,
                "to_zero_ms": H.stats(down), "to_resident_ms": H.stats(up)}
        s.log.write(kind="scale-summary", **summ)
        print("SUMMARY %s GiB x%d: to zero %s ms, back %s ms (median, min, max); bit-exact %s; %s"
              % (a.gib, len(a.gib), summ["to_zero_ms"], summ["to_resident_ms"], exact, "ok" if ok else "FAIL"))
    except H.HarnessError as e:
        print("bench_scale: FAIL: %s" % e, flush=True)
        ok = False
    finally:
        s.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
