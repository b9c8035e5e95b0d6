# bench/bench_overhead.py: steady-state cost of running under the shim: PyTorch step time and a
# launch-bound microbenchmark, each alternately with and without LD_PRELOAD; JSON lines + table.
"""Usage: python3 bench/bench_overhead.py [--reps 3] [--blocks-eager 50] [--blocks-graphs 30]
                                        [--block-steps-eager 40] [--block-steps-graphs 400] [--warmup-s 3] [--torch-modes eager,graphs]
                                        [--launch-reps 2xREPS] [--launch-batches 300] [--no-torch] [--no-launch]
                                        [--log FILE]

torch:  per rep, tests/gpu/torch_serve.py --bench-blocks [--graphs] with and without the shim, both
        resident, take turns (ABBA) running blocks of steps ("block N" -> "BLOCK_MS mean p50 p90"):
        a process pair sees the same machine, second by second. Without this the spread between
        separate processes (5-12 ms per eager step on the H100 machine) hid a 1 % effect.
launch: bench/launch_bench (LAUNCH_BENCH) --batches B --pin -> "LAUNCH_STATS variant batches median p10 p90"
        (variants submit, kernel, kernel+memcpy; median ns per launch over the process's batches)
Overhead = with / without - 1 on the medians over processes; also the median of the ratios of the
pairs (run back to back, or for torch interleaved). Pairs alternate which goes first.
"""

import argparse
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "gpu"))
sys.path.insert(0, HERE)
import harness as H  # noqa: E402
import report  # noqa: E402


def run_torch_pair(S, mode, rep, block_steps, blocks, warmup_s):
    """One process with the shim and one without, resident together, take turns running
    block_steps steps (ABBA order), so drift of the machine lands on both alike."""
    base = {"kind": "overhead", "bench": "torch-%s" % mode, "rep": rep, "block_steps": block_steps,
            "warmup_s": warmup_s, "interleaved": True}
    argv = [S.cfg.python, S.cfg.torch_serve, "--bench-blocks", "--warmup-s", warmup_s, "--pin"]
    if mode == "graphs":
        argv.append("--graphs")
    procs = {}
    blk = {False: [], True: []}
    recs = []
    try:
        # Alternate which starts first too: both warm up at once, each on its first allowed CPU.
        for shim in ([False, True] if rep % 2 == 0 else [True, False]):
            procs[shim] = S.start("overhead-torch-%s-%s-r%d" % (mode, "shim" if shim else "noshim", rep),
                                  argv, shim=shim)
        for shim, p in procs.items():
            p.expect(r"READY\b", 240, what="READY")
            p.expect(r"BENCH_READY\b", 120 + warmup_s, what="BENCH_READY")
        for b in range(blocks):
            for shim in ([False, True] if b % 2 == 0 else [True, False]):
                p = procs[shim]
                p.send("block %d" % block_steps)
                m = p.expect(r"BLOCK_MS\s+(\S+)\s+(\S+)\s+(\S+)", 60 + block_steps, what="BLOCK_MS")
                blk[shim].append((float(m.group(1)), float(m.group(2)), float(m.group(3))))
        for shim, p in procs.items():
            p.send("end")
            res = p.expect(r"RESULT (.*)", 60, what="RESULT").group(1).strip()
            rc = p.wait_exit(60)
            means = [x[0] for x in blk[shim]]
            rec = dict(base, shim=shim, ok=res == "ok" and rc == 0, blocks=len(means),
                       mean_ms=sum(means) / len(means), p50_ms=report.median([x[1] for x in blk[shim]]),
                       p90_ms=report.median([x[2] for x in blk[shim]]), block_means=means)
            if not rec["ok"]:
                rec["error"] = "RESULT %s, exit status %s" % (res, rc)
            recs.append(rec)
    except (H.HarnessError, ValueError, ZeroDivisionError) as e:
        recs = [dict(base, shim=shim, ok=False, error=str(e)) for shim in (False, True)]
    finally:
        for p in procs.values():
            S.finish(p)
    return recs


def run_launch(S, shim, rep, batches, warmup_s):
    base = {"kind": "overhead", "shim": shim, "rep": rep, "batches": batches, "warmup_s": warmup_s}
    p = None
    recs = []
    try:
        p = S.start("overhead-launch-%s-r%d" % ("shim" if shim else "noshim", rep),
                    [S.cfg.launch_bench, "--batches", batches, "--warmup-s", warmup_s, "--pin"], shim=shim)
        p.expect(r"READY\b", 120, what="READY")
        # A batch round is ~15 ms on the H100 (1000 + 1000 x 2 calls + 64 submits).
        p.expect(r"RESULT (.*)", 60 + warmup_s + batches * 0.05, since=0, what="RESULT")
        rc = p.wait_exit(30)
        with p.cond:
            lines = list(p.lines)
        for l in lines:
            m = re.match(r"LAUNCH_STATS\s+(\S+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)", l)
            if m:
                ns = float(m.group(3))
                recs.append(dict(base, bench="launch-%s" % m.group(1), ok=rc == 0, ns_per_launch=ns,
                                 per_s=1e9 / ns if ns > 0 else None, p10_ns=float(m.group(4)),
                                 p90_ns=float(m.group(5))))
        if not recs:
            recs.append(dict(base, bench="launch-kernel", ok=False, error="no LAUNCH_STATS lines (exit %s)" % rc))
    except (H.HarnessError, ValueError) as e:
        recs.append(dict(base, bench="launch-kernel", ok=False, error=str(e)))
    finally:
        if p is not None:
            S.finish(p)
    return recs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--blocks-eager", type=int, default=50,
                    help="torch: blocks each process of an eager pair runs, taking turns")
    ap.add_argument("--blocks-graphs", type=int, default=30)
    ap.add_argument("--block-steps-eager", type=int, default=40)
    ap.add_argument("--block-steps-graphs", type=int, default=400)
    ap.add_argument("--warmup-s", type=float, default=3.0,
                    help="torch: warm up this long first, with and without the shim alike, so one-time "
                         "start-up work (the shim faults its staging pool in, the driver JIT-compiles its "
                         "digest kernel) is over: this measures the steady state")
    ap.add_argument("--torch-modes", default="eager,graphs")
    ap.add_argument("--launch-reps", type=int, default=None,
                    help="launch_bench processes with and without the shim (default: 2 x --reps; they are short)")
    ap.add_argument("--launch-batches", type=int, default=300,
                    help="batches per variant in each launch_bench process (median taken over them)")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-launch", action="store_true")
    ap.add_argument("--log", default=os.environ.get("GCR_BENCH_LOG", "/tmp/gcr-bench.jsonl"))
    a = ap.parse_args(argv)
    cfg = H.Config()
    S = H.Session(cfg, a.log)
    plan = []  # (name, estimate s, callable returning records)
    # Launch first: it is short, and the figure most sensitive to the shim.
    for rep in range(a.reps * 2 if a.launch_reps is None else a.launch_reps):
        order = [False, True] if rep % 2 == 0 else [True, False]
        if not a.no_launch:
            for shim in order:
                plan.append(("launch-kernel", shim, rep, 15.0 + a.warmup_s + a.launch_batches * 0.02,
                             lambda shim=shim, rep=rep: run_launch(S, shim, rep, a.launch_batches, a.warmup_s),
                             ["launch_bench"] + (["shim"] if shim else [])))
    for rep in range(a.reps):
        if not a.no_torch:
            for mode in [m for m in a.torch_modes.split(",") if m]:
                graphs = mode == "graphs"
                steps = a.block_steps_graphs if graphs else a.block_steps_eager
                blocks = a.blocks_graphs if graphs else a.blocks_eager
                # H100 machine: ~8 ms per eager step, ~0.8 ms per graph replay, ~15 s to start.
                est = 30.0 + a.warmup_s + blocks * steps * 2 * (0.001 if graphs else 0.01)
                plan.append(("torch-%s" % mode, None, rep, est,
                             lambda mode=mode, rep=rep, steps=steps, blocks=blocks: run_torch_pair(
                                 S, mode, rep, steps, blocks, a.warmup_s),
                             ["torch_serve", "shim"]))
    records = []
    try:
        S.log.write(kind="bench-start", bench="overhead", argv=sys.argv)
        for name, shim, rep, est, fn, need in plan:
            missing = cfg.missing(*need)
            if missing or cfg.remaining_s() < est:
                why = ("missing " + ", ".join(missing)) if missing else "time budget (%.0f s left)" % cfg.remaining_s()
                recs = [{"kind": "overhead", "bench": name, "shim": shim, "rep": rep, "ok": False, "skipped": True,
                         "error": why}]
            else:
                recs = fn()
            for r in recs:
                S.log.write(**r)
                records.append(r)
                tag = {True: "with shim   ", False: "without shim"}.get(r.get("shim"), "both")
                if r.get("skipped"):
                    print("NOT RUN %s %s rep %d: %s" % (r["bench"], tag, rep, r["error"]), flush=True)
                elif not r.get("ok"):
                    print("FAIL %s %s rep %d: %s" % (r["bench"], tag, rep, r.get("error")), flush=True)
                elif "mean_ms" in r:
                    print("%-22s %s rep %d: mean %.4f ms p50 %.4f p90 %.4f" % (
                        r["bench"], tag, rep, r["mean_ms"], r["p50_ms"], r["p90_ms"]), flush=True)
                else:
                    print("%-22s %s rep %d: %s launches/s, %s ns/launch" % (
                        r["bench"], tag, rep, report.f(r.get("per_s")), report.f(r.get("ns_per_launch"), "%.1f")),
                        flush=True)
    finally:
        S.close()
    print()
    print(report.overhead_tables(records))
    ran = [r for r in records if not r.get("skipped")]
    return 0 if ran and all(r.get("ok") for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
