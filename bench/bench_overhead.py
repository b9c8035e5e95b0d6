# bench/bench_overhead.py: steady-state cost of running under the shim: PyTorch step time and a
# launch-bound microbenchmark, each alternately with and without LD_PRELOAD; JSON lines + table.
"""Usage: python3 bench/bench_overhead.py [--reps 3] [--blocks-eager 50] [--blocks-graphs 30]
                                        [--block-steps-eager 40] [--block-steps-graphs 400] [--warmup-s 3] [--torch-modes eager,graphs,async]
                                        [--launch-reps 2xREPS] [--launch-blocks 40] [--launch-block-rounds 20]
                                        [--no-torch] [--no-launch]
                                        [--log FILE]

torch:  per rep, tests/gpu/torch_serve.py --bench-blocks [--graphs | --alloc async] with and without the shim, both
        resident, take turns (ABBA) running blocks of steps ("block N" -> "BLOCK_MS mean p50 p90"):
        a process pair sees the same machine, second by second. Without this the spread between
        separate processes (5-12 ms per eager step on the H100 machine) hid a 1 % effect.
launch: per rep, bench/launch_bench (LAUNCH_BENCH) --turns --pin with and without the shim, the
        same way: "block R" -> "BLOCK_NS submit kernel kernel+memcpy" (median ns per launch over R
        rounds of batches); a process's figure is the median over its blocks. Separate processes
        differ by more than the shim costs (run 21: 3.26-3.91 us per empty kernel, 5.0-8.4 us
        per kernel + memcpy), so back-to-back pairs failed a 3 % bar by chance.
Overhead = with / without - 1 on the medians over processes; also the median of the ratios of the
pairs. Pairs alternate which starts first and, block by block, which goes first.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "gpu"))
sys.path.insert(0, HERE)
import harness as H  # noqa: E402
import report  # noqa: E402


def run_pair(S, tag, rep, argv, blocks, block_cmd, block_re, block_timeout, ready_timeout):
    """One process with the shim and one without, resident together, take turns (ABBA) running
    one block each (block_cmd -> a line matching block_re), so drift of the machine lands on
    both alike. Returns ({shim: [the block line's numbers, per block]}, {shim: error or None});
    on a harness error (None, message)."""
    procs = {}
    blk = {False: [], True: []}
    errs = {}
    try:
        # Alternate which starts first too: both warm up at once, each on its first allowed CPU.
        for shim in ([False, True] if rep % 2 == 0 else [True, False]):
            procs[shim] = S.start("%s-%s-r%d" % (tag, "shim" if shim else "noshim", rep), argv, shim=shim)
        for p in procs.values():
            p.expect(r"READY\b", 240, what="READY")
            p.expect(r"BENCH_READY\b", ready_timeout, what="BENCH_READY")
        for b in range(blocks):
            for shim in ([False, True] if b % 2 == 0 else [True, False]):
                p = procs[shim]
                p.send(block_cmd)
                m = p.expect(block_re, block_timeout, what=block_re.split("\\")[0])
                blk[shim].append([float(x) for x in m.groups()])
        for shim, p in procs.items():
            p.send("end")
            res = p.expect(r"RESULT (.*)", 60, what="RESULT").group(1).strip()
            rc = p.wait_exit(60)
            errs[shim] = None if res == "ok" and rc == 0 else "RESULT %s, exit status %s" % (res, rc)
    except (H.HarnessError, ValueError) as e:
        return None, str(e)
    finally:
        for p in procs.values():
            S.finish(p)
    return blk, errs


def run_torch_pair(S, mode, rep, block_steps, blocks, warmup_s):
    """tests/gpu/torch_serve.py --bench-blocks as a pair: "block N" -> "BLOCK_MS mean p50 p90"."""
    base = {"kind": "overhead", "bench": "torch-%s" % mode, "rep": rep, "block_steps": block_steps,
            "warmup_s": warmup_s, "interleaved": True}
    argv = [S.cfg.python, S.cfg.torch_serve, "--bench-blocks", "--warmup-s", warmup_s, "--pin"]
    if mode == "graphs":
        argv.append("--graphs")
    elif mode == "async":
        # Issue 19: PyTorch's cudaMallocAsync backend, every tensor a cudaMallocAsync/cudaFreeAsync
        # (tens per step): the allocation-heavy loop the shim's own pool serves.
        argv += ["--alloc", "async"]
    blk, errs = run_pair(S, "overhead-torch-%s" % mode, rep, argv, blocks, "block %d" % block_steps,
                         r"BLOCK_MS\s+(\S+)\s+(\S+)\s+(\S+)", 60 + block_steps, 120 + warmup_s)
    if blk is None:
        return [dict(base, shim=shim, ok=False, error=errs) for shim in (False, True)]
    recs = []
    for shim in (False, True):
        means = [x[0] for x in blk[shim]]
        rec = dict(base, shim=shim, ok=errs[shim] is None and len(means) > 0, blocks=len(means),
                   mean_ms=sum(means) / len(means) if means else None,
                   p50_ms=report.median([x[1] for x in blk[shim]]), p90_ms=report.median([x[2] for x in blk[shim]]),
                   block_means=means)
        if errs[shim]:
            rec["error"] = errs[shim]
        recs.append(rec)
    return recs


LAUNCH_VARIANTS = ("submit", "kernel", "kernel+memcpy")  # the columns of launch_bench's BLOCK_NS


def run_launch_pair(S, rep, blocks, block_rounds, warmup_s):
    """bench/launch_bench --turns as a pair: "block R" -> "BLOCK_NS submit kernel kernel+memcpy"
    (each the median ns per launch over R batches); a process's figure per variant is the
    median over its blocks."""
    base = {"kind": "overhead", "rep": rep, "blocks": blocks, "block_rounds": block_rounds,
            "warmup_s": warmup_s, "interleaved": True}
    argv = [S.cfg.launch_bench, "--turns", "--warmup-s", warmup_s, "--pin"]
    # A round (a batch of each variant) is ~12 ms on the H100.
    blk, errs = run_pair(S, "overhead-launch", rep, argv, blocks, "block %d" % block_rounds,
                         r"BLOCK_NS\s+(\S+)\s+(\S+)\s+(\S+)", 30 + block_rounds * 0.1, 60 + warmup_s)
    recs = []
    for i, variant in enumerate(LAUNCH_VARIANTS):
        b = dict(base, bench="launch-%s" % variant)
        for shim in (False, True):
            if blk is None:
                recs.append(dict(b, shim=shim, ok=False, error=errs))
                continue
            vals = sorted(x[i] for x in blk[shim])
            ns = report.median(vals) if vals else None
            ok = errs[shim] is None and ns is not None and ns > 0
            rec = dict(b, shim=shim, ok=ok, ns_per_launch=ns, per_s=1e9 / ns if ok else None,
                       p10_ns=vals[len(vals) // 10] if vals else None,
                       p90_ns=vals[(len(vals) * 9) // 10] if vals else None, block_ns=vals)
            if errs[shim]:
                rec["error"] = errs[shim]
            recs.append(rec)
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
                    help="launch_bench pairs (default: 2 x --reps; they are short)")
    ap.add_argument("--launch-blocks", type=int, default=40,
                    help="launch: blocks each process of a pair runs, taking turns")
    ap.add_argument("--launch-block-rounds", type=int, default=20,
                    help="launch: rounds (one batch of each variant) per block")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-launch", action="store_true")
    ap.add_argument("--log", default=os.environ.get("GCR_BENCH_LOG", "/tmp/gcr-bench.jsonl"))
    a = ap.parse_args(argv)
    cfg = H.Config()
    S = H.Session(cfg, a.log)
    plan = []  # (bench names, rep, estimate s, callable returning records, what it needs)
    # Launch first: it is short, and the figure most sensitive to the shim.
    for rep in range(a.reps * 2 if a.launch_reps is None else a.launch_reps):
        if not a.no_launch:
            est = 15.0 + a.warmup_s + a.launch_blocks * a.launch_block_rounds * 2 * 0.015
            plan.append((["launch-%s" % v for v in LAUNCH_VARIANTS], rep, est,
                         lambda rep=rep: run_launch_pair(S, rep, a.launch_blocks, a.launch_block_rounds, a.warmup_s),
                         ["launch_bench", "shim"]))
    for rep in range(a.reps):
        if not a.no_torch:
            for mode in [m for m in a.torch_modes.split(",") if m]:
                graphs = mode == "graphs"
                steps = a.block_steps_graphs if graphs else a.block_steps_eager
                blocks = a.blocks_graphs if graphs else a.blocks_eager
                # H100 machine: ~8 ms per eager step, ~0.8 ms per graph replay, ~15 s to start.
                est = 30.0 + a.warmup_s + blocks * steps * 2 * (0.001 if graphs else 0.01)
                plan.append((["torch-%s" % mode], rep, est,
                             lambda mode=mode, rep=rep, steps=steps, blocks=blocks: run_torch_pair(
                                 S, mode, rep, steps, blocks, a.warmup_s),
                             ["torch_serve", "shim"]))
    records = []
    try:
        S.log.write(kind="bench-start", bench="overhead", argv=sys.argv)
        for names, rep, est, fn, need in plan:
            missing = cfg.missing(*need)
            if missing or cfg.remaining_s() < est:
                why = ("missing " + ", ".join(missing)) if missing else "time budget (%.0f s left)" % cfg.remaining_s()
                recs = [{"kind": "overhead", "bench": name, "shim": shim, "rep": rep, "ok": False, "skipped": True,
                         "error": why} for name in names for shim in (False, True)]
            else:
                recs = fn()
            for r in recs:
                S.log.write(**r)
                records.append(r)
                tag = "with shim   " if r.get("shim") else "without shim"
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
