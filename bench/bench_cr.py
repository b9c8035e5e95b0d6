# bench/bench_cr.py: checkpoint/restore latency of GCR (shim data path + driver control path) against
# the driver's checkpoint API alone, per process size; raw JSON lines to a log, tables on stdout.
"""Usage: python3 bench/bench_cr.py [--reps R] [--paths gcr,driver] [--prog testprog|torch]
                                  [--log FILE] [SIZE_GIB ...]   (sizes default: 1 4 16)

Per size and repetition, each path runs its own fresh process:
  gcr:    the program under LD_PRELOAD of the shim; gcrctl --json suspend / resume
  driver: the program without the shim;        gcrctl --json suspend --driver-only / resume --driver-only
Program: testprog = gcr-testprog --mib S*1024 --buffers 8 --wait --threads 1 --iters 1;
         torch    = tests/gpu/torch_serve.py --wait --steps 2 --extra-gib S.
READY, go, DONE, suspend, GPU memory while suspended, resume, check -> RESULT ok must hold.
Runs that would not fit before GCR_DEADLINE (epoch s) are logged as skipped (NOT RUN).
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "gpu"))
sys.path.insert(0, HERE)
import harness as H  # noqa: E402
import report  # noqa: E402


def estimate_s(prog, path, gib):
    """Rough wall time of one run (s), from the H100 numbers in docs: driver checkpoint about
    0.5 s/GiB + restore 0.22 s/GiB; GCR about 0.1 s/GiB; filling the buffers and start-up."""
    per_gib = 1.0 if path == "driver" else 0.4
    return 8.0 + per_gib * gib + (15.0 if prog == "torch" else 0.0)


def prog_argv(cfg, prog, gib):
    if prog == "torch":
        return [cfg.python, cfg.torch_serve, "--wait", "--steps", 2, "--extra-gib", gib]
    return [cfg.testprog, "--module", cfg.fatbin, "--mib", int(round(gib * 1024)), "--buffers", 8, "--wait",
            "--threads", 1, "--iters", 1]


def step_record(r):
    return {"ok": r.ok, "rc": r.rc, "wall_ms": round(r.wall_ms, 3), "ms": r.get("ms"), "bytes": r.get("bytes"),
            "mode": r.get("mode"), "error": r.error, "code": r.get("code")}


def run_one(S, prog, path, gib, rep):
    cfg = S.cfg
    shim = path == "gcr"
    flags = ("--driver-only",) if path == "driver" else ()
    rec = {"kind": "cr", "prog": prog, "path": path, "gib": gib, "rep": rep, "ok": False}
    big = 60.0 + 10.0 * gib  # s: start-up and filling the buffers
    p = None
    suspended = False
    try:
        p = S.start("cr-%s-%s-%gGiB-r%d" % (prog, path, gib, rep), prog_argv(cfg, prog, gib), shim=shim)
        m = p.expect(r"READY pid=(\d+)(?:\s+bytes=(\d+))?", big + (180 if prog == "torch" else 0), what="READY")
        pid = int(m.group(1))
        rec["pid"], rec["bytes_reported"] = pid, int(m.group(2)) if m.group(2) else None
        if shim and not H.wait_socket(S.socket_dir, pid, 15):
            rec["note"] = "no control socket after 15 s"
        p.send("go")
        p.expect(r"DONE\b", big, since=0, what="DONE")
        rec["gpu_mib_running"] = S.gpu_mem(pid)
        if shim:
            # Steady state: the shim pins its staging memory in the background after the
            # buffers appear; a suspend before that would pin on the critical path.
            rec["staging_wait_s"] = H.wait_staging_ready(S, pid, 120)
        s = S.ctl("suspend", pid, flags, timeout=120 + 2 * gib, test="bench_cr")
        suspended = s.ok
        rec["suspend"] = step_record(s)
        if s.ok:
            rec["gpu_mib_suspended"] = S.gpu_mem(pid)
            rec["gpu_used_mib_device_suspended"] = H.gpu_used_mib(cfg)
            r = S.ctl("resume", pid, flags, timeout=120 + 2 * gib, test="bench_cr")
            suspended = not r.ok
            rec["resume"] = step_record(r)
            rec["gpu_mib_resumed"] = S.gpu_mem(pid)
        if not suspended:
            p.send("check")
            res = p.expect(r"RESULT (.*)", big, since=0, what="RESULT").group(1).strip()
            rec["result"] = res
            rec["ok"] = bool(s.ok and rec.get("resume", {}).get("ok") and res == "ok")
        if not rec["ok"]:
            rec["error"] = (rec.get("suspend", {}).get("error") or rec.get("resume", {}).get("error")
                            or "RESULT %s" % rec.get("result"))
    except H.HarnessError as e:
        rec["error"] = str(e)
    finally:
        if p is not None:
            S.finish(p, suspended=suspended)
    return rec


def line(rec):
    def ms(step):
        v = report.step_ms(rec.get(step)) if isinstance(rec.get(step), dict) else None
        return "%.0f" % v if v is not None else "n/a"
    return "%-8s %5g GiB %-6s rep %d: %s suspend %s ms, resume %s ms, GPU %s MiB suspended%s" % (
        rec["prog"], rec["gib"], rec["path"], rec["rep"], "ok  " if rec.get("ok") else "FAIL", ms("suspend"),
        ms("resume"), rec.get("gpu_mib_suspended", "n/a"),
        "" if rec.get("ok") else " -- " + str(rec.get("error", "?")).splitlines()[0][:300])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sizes", nargs="*", type=float, default=[1, 4, 16], help="process sizes (GiB)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--paths", default="gcr,driver")
    ap.add_argument("--prog", choices=["testprog", "torch"], default="testprog")
    ap.add_argument("--log", default=os.environ.get("GCR_BENCH_LOG", "/tmp/gcr-bench.jsonl"))
    a = ap.parse_args(argv)
    paths = [x for x in a.paths.split(",") if x]
    cfg = H.Config()
    need = ["gcrctl"] + (["torch_serve"] if a.prog == "torch" else ["testprog", "fatbin"])
    if "gcr" in paths:
        need.append("shim")
    S = H.Session(cfg, a.log)
    missing = cfg.missing(*need)
    records = []
    try:
        S.log.write(kind="bench-start", bench="cr", argv=sys.argv, sizes=a.sizes, reps=a.reps, paths=paths,
                    prog=a.prog)
        for gib in a.sizes:
            for rep in range(a.reps):
                order = paths if rep % 2 == 0 else list(reversed(paths))  # alternate to spread drift
                for path in order:
                    est = estimate_s(a.prog, path, gib)
                    if missing:
                        rec = {"kind": "cr", "prog": a.prog, "path": path, "gib": gib, "rep": rep, "ok": False,
                               "skipped": True, "error": "missing " + ", ".join(missing)}
                    elif cfg.remaining_s() < est:
                        rec = {"kind": "cr", "prog": a.prog, "path": path, "gib": gib, "rep": rep, "ok": False,
                               "skipped": True, "error": "time budget (%.0f s left, ~%.0f s needed)" % (
                                   cfg.remaining_s(), est)}
                    else:
                        rec = run_one(S, a.prog, path, gib, rep)
                    S.log.write(**rec)
                    records.append(rec)
                    if rec.get("skipped"):
                        print("NOT RUN %s %g GiB %s rep %d: %s" % (a.prog, gib, path, rep, rec["error"]), flush=True)
                    else:
                        print(line(rec), flush=True)
    finally:
        S.close()
    print()
    print(report.cr_tables(records))
    ran = [r for r in records if not r.get("skipped")]
    return 0 if ran and all(r.get("ok") for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
