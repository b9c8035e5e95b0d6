# bench/bench_cr.py: checkpoint/restore latency of GCR (shim data path + driver control path) against
# the driver's checkpoint API alone, per process size; raw JSON lines to a log, tables on stdout.
"""Usage: python3 bench/bench_cr.py [--reps R] [--paths gcr,driver] [--prog testprog|torch|torch-async]
           [--big-gib 32] [--driver-reps-big 1] [--reps-big 2] [--keep-context "1 16"] [--reserved 60:4]
           [--serving 16:1] [--serving-cycles 4] [--serving-driver-cycles 1] [--cases LIST]
           [--gcr-env K=V]... [--log FILE] [SIZE_GIB ...]     (sizes default: 1 4 16 64)

Cases (--cases, comma-separated; default all): each repetition runs its own fresh process.
  sizes:    per size, GCR (the program under LD_PRELOAD of the shim; gcrctl suspend / resume)
            and the driver alone (without the shim; gcrctl suspend --driver-only); sizes of at
            least --big-gib run the driver alone --driver-reps-big times (64 GiB takes ~45 s)
            and GCR at most --reps-big times.
  keep:     GCR with --keep-context (the data path alone, the context stays resident), per size.
  reserved: R GiB allocated, only W GiB written (the rest zero, as never-written memory is),
            GCR and the driver alone, once each (gcr-testprog --chunks --write-mib).
  serving:  tests/gpu/torch_serve.py --commands --weights-gib W --state-gib S: GCR with
            GCR_INCREMENTAL=1 through --serving-cycles suspend/resume cycles with steps (the state
            changes in full) between them, and the driver alone through --serving-driver-cycles.
Program for sizes/keep: testprog = gcr-testprog --mib S*1024 --buffers 8 --wait --threads 1
--iters 1; torch = tests/gpu/torch_serve.py --wait --steps 2 --extra-gib S; torch-async = the same
with --alloc async (PyTorch's cudaMallocAsync backend). GCR runs wait for
the shim's staging to report ready before the timed suspend. READY, go, DONE, suspend, GPU memory
while suspended, resume, check -> RESULT ok must hold. Order: small sizes, keep, serving,
reserved, then sizes of at least --big-gib, so that a short budget loses the slowest last.
Runs that would not fit before GCR_DEADLINE (epoch s) are logged as skipped (NOT RUN).
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "gpu"))
sys.path.insert(0, HERE)
import harness as H  # noqa: E402
import report  # noqa: E402


def estimate_s(prog, path, gib):
    """Rough wall time of one run (s), from the H100 numbers in docs: driver checkpoint about
    0.5 s/GiB + restore 0.22 s/GiB; GCR about 0.1 s/GiB plus pinning; filling and start-up."""
    per_gib = 0.8 if path == "driver" else 0.35
    return 8.0 + per_gib * gib + (15.0 if prog.startswith("torch") else 0.0)


def prog_argv(cfg, prog, gib):
    if prog == "torch":
        return [cfg.python, cfg.torch_serve, "--wait", "--steps", 2, "--extra-gib", gib]
    if prog == "torch-async":  # the same under PyTorch's cudaMallocAsync backend (issue 19)
        return [cfg.python, cfg.torch_serve, "--alloc", "async", "--wait", "--steps", 2, "--extra-gib", gib]
    return [cfg.testprog, "--module", cfg.fatbin, "--mib", int(round(gib * 1024)), "--buffers", 8, "--wait",
            "--threads", 1, "--iters", 1]


def reserved_argv(cfg, gib, written):
    return [cfg.testprog, "--module", cfg.fatbin, "--chunks", "--mib", int(round(gib * 1024)),
            "--write-mib", int(round(written * 1024)), "--buffers", 8, "--wait", "--threads", 1, "--iters", 1]


def step_record(r):
    return {"ok": r.ok, "rc": r.rc, "wall_ms": round(r.wall_ms, 3), "ms": r.get("ms"), "bytes": r.get("bytes"),
            "mode": r.get("mode"), "error": r.error, "code": r.get("code"), "shim": r.get("shim")}


def run_one(S, rec, argv, shim, flags=(), env=None):
    """One process: READY, go, DONE, (staging ready), suspend, resume, check -> RESULT ok."""
    gib = rec["gib"]
    rec["ok"] = False
    big = 60.0 + 10.0 * gib  # s: start-up and filling the buffers
    torch = rec["prog"].startswith("torch")
    p = None
    suspended = False
    try:
        p = S.start("cr-%s-%s-%gGiB-r%d" % (rec["prog"], rec["path"], gib, rec["rep"]), argv, shim=shim,
                    extra_env=env)
        m = p.expect(r"READY pid=(\d+)(?:\s+bytes=(\d+))?", big + (180 if torch else 0), what="READY")
        pid = int(m.group(1))
        rec["pid"], rec["bytes_reported"] = pid, int(m.group(2)) if m.group(2) else None
        if shim and not H.wait_socket(S.socket_dir, pid, 15):
            rec["note"] = "no control socket after 15 s"
        p.send("go")
        p.expect(r"DONE\b", big, since=0, what="DONE")
        rec["gpu_mib_running"] = H.gpu_mem_mib(S.cfg, pid)
        if shim:
            # Steady state: the shim pins its staging memory in the background after the
            # buffers appear; a suspend before that would pin on the critical path.
            rec["staging_wait_s"] = H.wait_staging_ready(S, pid, 120 + gib)
        s = S.ctl("suspend", pid, flags, timeout=120 + 2 * gib, test="bench_cr")
        suspended = s.ok
        rec["suspend"] = step_record(s)
        if s.ok:
            rec["gpu_mib_suspended"] = H.gpu_mem_mib(S.cfg, pid)
            rec["gpu_used_mib_device_suspended"] = H.gpu_used_mib(S.cfg)
            r = S.ctl("resume", pid, flags, timeout=120 + 2 * gib, test="bench_cr")
            suspended = not r.ok
            rec["resume"] = step_record(r)
            rec["gpu_mib_resumed"] = H.gpu_mem_mib(S.cfg, pid)
        if not suspended:
            p.send("check")
            res = p.expect(r"RESULT (.*)", big + 60, since=0, what="RESULT").group(1).strip()
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


def run_serving(S, rec, weights, state, cycles, shim, env):
    """torch_serve --commands: steps, then cycles of suspend/resume each followed by steps."""
    cfg = S.cfg
    flags = () if shim else ("--driver-only",)
    argv = [cfg.python, cfg.torch_serve, "--commands", "--weights-gib", weights, "--state-gib", state,
            "--alloc", "default"]
    rec.update(ok=False, cycles=[])
    burst = 4
    p = None
    suspended = False
    total = weights + state
    try:
        p = S.start("serving-%s-%gGiB" % (rec["path"], total), argv, shim=shim, extra_env=env)
        m = p.expect(r"READY pid=(\d+) bytes=(\d+) weights=(\d+) state=(\d+)", 300 + 5 * total, what="READY")
        pid = int(m.group(1))
        rec.update(pid=pid, bytes_reported=int(m.group(2)), weights_bytes=int(m.group(3)),
                   state_bytes=int(m.group(4)))
        if shim and not H.wait_socket(S.socket_dir, pid, 15):
            rec["note"] = "no control socket after 15 s"
        p.send("go")
        steps = 0
        for i in range(cycles + 1):
            p.send("steps %d" % burst)
            steps += burst
            p.expect(r"STEPS total=%d$" % steps, 120, what="STEPS")
            if i == cycles:
                break
            # The staging must be ready before a timed suspend; after a resume it should be at
            # once (the host copy is kept), so later waits are bounded shorter.
            waited = H.wait_staging_ready(S, pid, (120 + total) if i == 0 else 30) if shim else None
            s = S.ctl("suspend", pid, flags, timeout=120 + 2 * total, test="bench_serving")
            suspended = s.ok
            c = {"cycle": i, "staging_wait_s": waited, "suspend": step_record(s)}
            rec["cycles"].append(c)
            if not s.ok:
                raise H.HarnessError("suspend %d: %s" % (i, s.describe()))
            c["gpu_mib_suspended"] = H.gpu_mem_mib(S.cfg, pid)
            r = S.ctl("resume", pid, flags, timeout=120 + 2 * total, test="bench_serving")
            c["resume"] = step_record(r)
            suspended = not r.ok
            if not r.ok:
                raise H.HarnessError("resume %d: %s" % (i, r.describe()))
            print("  serving %s cycle %d: suspend %s ms, copied %s GiB, resume %s ms" % (
                rec["path"], i, _f(report.step_ms(c["suspend"])),
                _f(report.moved_gib(c["suspend"]), "%.2f"), _f(report.step_ms(c["resume"]))), flush=True)
        p.send("check")
        rec["digest"] = p.expect(r"DIGEST ([0-9a-f]{64})", 300, since=0, what="DIGEST").group(1)
        rec["result"] = p.expect(r"RESULT (.*)", 300, since=0, what="RESULT").group(1).strip()
        rec["ok"] = rec["result"] == "ok"
        if not rec["ok"]:
            rec["error"] = "RESULT %s" % rec["result"]
    except H.HarnessError as e:
        rec["error"] = str(e)
    finally:
        if p is not None:
            S.finish(p, suspended=suspended)
    return rec


def _f(v, fmt="%.0f"):
    return fmt % v if isinstance(v, (int, float)) else "n/a"


def line(rec):
    def ms(step):
        v = report.step_ms(rec.get(step)) if isinstance(rec.get(step), dict) else None
        return "%.0f" % v if v is not None else "n/a"
    return "%-8s %-9s %5g GiB %-8s rep %d: %s suspend %s ms, resume %s ms, GPU %s MiB suspended%s" % (
        rec["prog"], rec.get("case", "sizes"), rec["gib"], rec["path"], rec["rep"],
        "ok  " if rec.get("ok") else "FAIL", ms("suspend"), ms("resume"), rec.get("gpu_mib_suspended", "n/a"),
        "" if rec.get("ok") else " -- " + str(rec.get("error", "?")).splitlines()[0][:300])


def pair(spec, what):
    """'A:B' -> (float A, float B); '' or 'none' -> None."""
    if not spec or spec == "none":
        return None
    try:
        x, y = spec.split(":")
        return float(x), float(y)
    except ValueError:
        raise SystemExit("bench_cr: --%s wants A:B (GiB), not %r" % (what, spec))


def plan(a, paths):
    """(case, path, gib, rep, extra) in the order they run."""
    small = [g for g in a.sizes if g < a.big_gib]
    big = [g for g in a.sizes if g >= a.big_gib]
    out = []

    def sizes(gs):
        for gib in gs:
            big_size = gib >= a.big_gib
            reps = {p: (a.driver_reps_big if p == "driver" else min(a.reps, a.reps_big)) if big_size else a.reps
                    for p in paths}
            for rep in range(max(reps.values()) if reps else 0):
                order = paths if rep % 2 == 0 else list(reversed(paths))  # alternate to spread drift
                for path in order:
                    if rep < reps[path]:
                        out.append(("sizes", path, gib, rep, None))
    if "sizes" in a.cases:
        sizes(small)
    if "keep" in a.cases and "gcr" in paths:
        for gib in a.keep_context:
            for rep in range(a.reps):
                out.append(("keep", "gcr-keep", gib, rep, None))
    if "serving" in a.cases and a.serving:
        for path in paths:
            out.append(("serving", path, sum(a.serving), 0, a.serving))
    if "reserved" in a.cases and a.reserved:
        for path in paths:
            out.append(("reserved", path, a.reserved[0], 0, a.reserved))
    if "sizes" in a.cases:
        sizes(big)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sizes", nargs="*", type=float, default=[1, 4, 16, 64], help="process sizes (GiB)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--paths", default="gcr,driver")
    ap.add_argument("--prog", choices=["testprog", "torch", "torch-async"], default="testprog")
    ap.add_argument("--big-gib", type=float, default=32.0)
    ap.add_argument("--driver-reps-big", type=int, default=1, help="driver-alone runs per size >= --big-gib")
    ap.add_argument("--reps-big", type=int, default=2, help="at most this many GCR runs per size >= --big-gib")
    ap.add_argument("--keep-context", default="1 16", help="sizes (GiB) for --keep-context runs")
    ap.add_argument("--reserved", default="60:4", help="RESERVED:WRITTEN GiB, or none")
    ap.add_argument("--serving", default="16:1", help="WEIGHTS:STATE GiB, or none")
    ap.add_argument("--serving-cycles", type=int, default=4)
    ap.add_argument("--serving-driver-cycles", type=int, default=1)
    ap.add_argument("--cases", default="sizes,keep,serving,reserved")
    ap.add_argument("--gcr-env", action="append", default=[], help="K=V for the shim's process (GCR runs)")
    ap.add_argument("--log", default=os.environ.get("GCR_BENCH_LOG", "/tmp/gcr-bench.jsonl"))
    a = ap.parse_args(argv)
    a.cases = [x for x in a.cases.split(",") if x]
    a.keep_context = [float(x) for x in a.keep_context.split()]
    a.reserved, a.serving = pair(a.reserved, "reserved"), pair(a.serving, "serving")
    paths = [x for x in a.paths.split(",") if x]
    gcr_env = dict(kv.split("=", 1) for kv in a.gcr_env)
    cfg = H.Config()
    S = H.Session(cfg, a.log)
    records = []
    try:
        S.log.write(kind="bench-start", bench="cr", argv=sys.argv, sizes=a.sizes, reps=a.reps, paths=paths,
                    prog=a.prog, cases=a.cases, keep_context=a.keep_context, reserved=a.reserved,
                    serving=a.serving, serving_cycles=a.serving_cycles, gcr_env=gcr_env,
                    # The GCR_* settings the run inherits (the shim's among them) change what is measured.
                    inherited_env={k: v for k, v in os.environ.items() if k.startswith("GCR_")})
        for case, path, gib, rep, extra in plan(a, paths):
            shim = path != "driver"
            prog = "torch" if case == "serving" else a.prog
            if case == "reserved":
                prog = "testprog-reserved"
            need = ["gcrctl"] + (["torch_serve"] if prog.startswith("torch") else ["testprog", "fatbin"]) + (
                ["shim"] if shim else [])
            missing = cfg.missing(*need)
            cycles = (a.serving_cycles if shim else a.serving_driver_cycles) if case == "serving" else 1
            est = estimate_s(prog, "gcr" if shim else "driver", gib) * (1 + 0.5 * (cycles - 1))
            base = {"kind": "serving" if case == "serving" else "cr", "case": case, "prog": prog, "path": path,
                    "gib": gib, "rep": rep, "ok": False}
            if case == "reserved":
                base["written_gib"] = extra[1]
            if case == "serving":
                base.update(weights_gib=extra[0], state_gib=extra[1])
            if missing or cfg.remaining_s() < est:
                rec = dict(base, skipped=True, error="missing " + ", ".join(missing) if missing else
                           "time budget (%.0f s left, ~%.0f s needed)" % (cfg.remaining_s(), est))
            elif case == "serving":
                env = dict(gcr_env, GCR_INCREMENTAL="1") if shim else None
                rec = run_serving(S, base, extra[0], extra[1], cycles, shim, env)
            else:
                flags = ("--driver-only",) if path == "driver" else ("--keep-context",) if case == "keep" else ()
                argv = (reserved_argv(cfg, gib, extra[1]) if case == "reserved" else prog_argv(cfg, prog, gib))
                rec = run_one(S, base, argv, shim, flags, gcr_env if shim else None)
            S.log.write(**rec)
            records.append(rec)
            stamp = time.strftime("%H:%M:%S")
            if rec.get("skipped"):
                print("%s NOT RUN %s %s %g GiB %s rep %d: %s" % (stamp, case, prog, gib, path, rep, rec["error"]),
                      flush=True)
            elif case == "serving":
                print("%s serving %s %s: %s%s" % (stamp, path, "%g+%g GiB" % extra, "ok" if rec["ok"] else "FAIL",
                                                   "" if rec["ok"] else " -- " + str(rec.get("error"))[:300]),
                      flush=True)
            else:
                print(stamp + " " + line(rec), flush=True)
    finally:
        S.close()
    print()
    print(report.render_records(records))
    ran = [r for r in records if not r.get("skipped")]
    return 0 if ran and all(r.get("ok") for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
