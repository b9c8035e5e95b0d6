# bench/report.py: turns the raw JSON lines of tests/gpu/test_gpu.py, bench/bench_cr.py and
# bench/bench_overhead.py into the markdown tables of docs/benchmarks.md, printed on stdout.
"""Usage: python3 bench/report.py [--plots DIR] LOG.jsonl [LOG.jsonl ...]

Never crashes on missing, failed or malformed entries: they show as "n/a", "FAIL" or
"NOT RUN". The tables need only the Python standard library; --plots DIR also writes PNG
plots there and needs matplotlib (pip install --user matplotlib; not needed by CI), e.g.
  python3 bench/report.py --plots docs/plots docs/results/<run>/bench.jsonl
Ratios compare with the driver's checkpoint API alone measured in the same logs.
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu"))


def load(paths):
    """All JSON objects from the files (bad lines and missing files are counted, not fatal)."""
    recs, bad, missing = [], 0, []
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        v = json.loads(line)
                    except ValueError:
                        bad += 1
                        continue
                    if isinstance(v, dict):
                        recs.append(v)
        except OSError:
            missing.append(path)
    return recs, bad, missing


from harness import dig  # noqa: E402  (one definition, shared with the tests)


def num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def median(vals):
    v = sorted(x for x in vals if num(x) is not None)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2.0


def f(v, fmt="%.0f"):
    return fmt % v if num(v) is not None else "n/a"


def spread(vals, fmt="%.0f"):
    """'median (min–max)' of the numbers in vals, or n/a."""
    v = [x for x in vals if num(x) is not None]
    if not v:
        return "n/a"
    if len(v) == 1:
        return fmt % v[0]
    return "%s (%s–%s)" % (fmt % median(v), fmt % min(v), fmt % max(v))


def ratio(a, b, fmt="%.2f×"):
    if num(a) is None or num(b) is None or b == 0:
        return "n/a"
    return fmt % (a / b)


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in r) + " |")
    return "\n".join(out)


# ---- checkpoint/restore latency (bench_cr.py, kind "cr") -----------------------------------

def step_ms(step):
    """The latency of one gcrctl step: its own ms.total, else the command's wall time."""
    v = num(dig(step, "ms", "total"))
    return v if v is not None else num(dig(step, "wall_ms"))


def ok_step(step):
    return isinstance(step, dict) and step.get("ok") is True


GIB = float(1 << 30)


def moved_gib(step):
    """GiB the shim moved over PCIe in a step: shim.copied, else bytes.moved (older shims)."""
    v = num(dig(step, "shim", "copied"))
    if v is None:
        v = num(dig(step, "bytes", "moved"))
    return v / GIB if v is not None else None


def host_ratio(step):
    """Staging host bytes over the bytes the suspend saved (non-zero bytes held on the host)."""
    host, total, zero = num(dig(step, "shim", "host")), num(dig(step, "shim", "bytes")), num(dig(step, "shim", "zero"))
    if host is None or total is None:
        return None
    saved = total - (zero or 0)
    return host / saved if saved > 0 else None


def cr_groups(recs):
    groups = {}
    for r in recs:
        if r.get("kind") != "cr":
            continue
        key = (str(r.get("prog", "?")), num(r.get("gib")) or 0, str(r.get("path", "?")))
        groups.setdefault(key, []).append(r)
    return groups


def cr_tables(recs):
    groups = cr_groups(recs)
    if not groups:
        return "_No checkpoint/restore measurements._"
    rows = []
    for (prog, gib, path), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "gcr")):
        ran = [r for r in rs if not r.get("skipped")]
        sus = [r.get("suspend") for r in ran if ok_step(r.get("suspend"))]
        res = [r.get("resume") for r in ran if ok_step(r.get("resume"))]
        rows.append([
            prog, "%g GiB" % gib, "GCR" if path == "gcr" else ("driver API alone" if path == "driver" else path),
            "%d/%d%s" % (sum(1 for r in ran if r.get("ok")), len(ran),
                         (", %d NOT RUN" % (len(rs) - len(ran))) if len(rs) > len(ran) else ""),
            spread([step_ms(s) for s in sus]),
            spread([num(dig(s, "wall_ms")) for s in sus]),
            "/".join(f(median([num(dig(s, "ms", k)) for s in sus])) for k in ("data", "lock", "checkpoint")),
            spread([step_ms(s) for s in res]),
            spread([num(dig(s, "wall_ms")) for s in res]),
            "/".join(f(median([num(dig(s, "ms", k)) for s in res])) for k in ("restore", "unlock", "data")),
            spread([num(r.get("gpu_mib_suspended")) for r in ran if ok_step(r.get("suspend"))]),
            spread([num(r.get("gpu_mib_running")) for r in ran]),
            f(median([moved_gib(s) for s in sus]), "%.2f"),
            f(median([num(dig(s, "shim", "zero")) / GIB if num(dig(s, "shim", "zero")) is not None else None
                      for s in sus]), "%.2f"),
            f(median([host_ratio(s) for s in sus]), "%.3f"),
        ])
    out = [table(["program", "size", "path", "ok/runs", "suspend ms", "suspend wall ms",
                  "data/lock/checkpoint ms", "resume ms", "resume wall ms", "restore/unlock/data ms",
                  "GPU MiB suspended", "GPU MiB running", "GiB copied by shim", "GiB zero",
                  "staging host / saved"], rows)]
    out.append("\nms = gcrctl's own `ms.total` (start-up excluded), median (min–max); wall = the whole "
               "gcrctl command. Part columns are medians; n/a where gcrctl did not report them. "
               "gcr-keep = GCR with --keep-context. Staging host / saved = the shim's staging host "
               "bytes over the non-zero bytes it saved.\n")
    srows = []
    sizes = sorted({(k[0], k[1]) for k in groups})
    for prog, gib in sizes:
        def vals(path, step):
            return [step_ms(r.get(step)) for r in groups.get((prog, gib, path), [])
                    if not r.get("skipped") and ok_step(r.get(step))]
        ds, dr = median(vals("driver", "suspend")), median(vals("driver", "resume"))
        gs, gr = median(vals("gcr", "suspend")), median(vals("gcr", "resume"))
        ks, kr = median(vals("gcr-keep", "suspend")), median(vals("gcr-keep", "resume"))
        tot_d = ds + dr if num(ds) is not None and num(dr) is not None else None
        tot_g = gs + gr if num(gs) is not None and num(gr) is not None else None
        srows.append([prog, "%g GiB" % gib, spread(vals("driver", "suspend")), spread(vals("gcr", "suspend")),
                      ratio(ds, gs), spread(vals("driver", "resume")), spread(vals("gcr", "resume")),
                      ratio(dr, gr), ratio(tot_d, tot_g), f(ks) + " / " + f(kr),
                      ratio(ds, ks) + " / " + ratio(dr, kr)])
    out.append(table(["program", "size", "driver suspend ms", "GCR suspend ms", "suspend speed-up",
                      "driver resume ms", "GCR resume ms", "resume speed-up", "suspend+resume speed-up",
                      "keep-context suspend / resume ms", "keep-context speed-ups"], srows))
    out.append("\nMedian (min–max); speed-ups are driver median / GCR median, from the same logs.")
    fails = [r for rs in groups.values() for r in rs if not r.get("skipped") and not r.get("ok")]
    if fails:
        out.append("\nFailed runs:\n")
        for r in fails[:20]:
            err = r.get("error") or dig(r, "suspend", "error") or dig(r, "resume", "error") or r.get("result")
            out.append("- %s %g GiB %s rep %s: %s" % (r.get("prog"), num(r.get("gib")) or 0, r.get("path"),
                                                   r.get("rep"), str(err).splitlines()[0][:200] if err else "?"))
    return "\n".join(out)


# ---- incremental serving (bench_cr.py --serving, kind "serving") ---------------------------

def serving_tables(recs):
    runs = [r for r in recs if r.get("kind") == "serving"]
    if not runs:
        return "_No incremental serving measurements._"
    rows = []
    for r in runs:
        label = "GCR, GCR_INCREMENTAL=1" if r.get("path") == "gcr" else "driver API alone"
        what = "%s+%s GiB" % (f(num(r.get("weights_gib")), "%g"), f(num(r.get("state_gib")), "%g"))
        if r.get("skipped"):
            rows.append([what, label, "NOT RUN", "", "", "", "", str(r.get("error", ""))[:100]])
            continue
        if not r.get("cycles"):
            rows.append([what, label, "—", "", "", "", "", "ok" if r.get("ok") else
                         "FAIL: " + str(r.get("error", "")).splitlines()[0][:100] if r.get("error") else "FAIL"])
        for c in r.get("cycles") or []:
            rows.append([what, label, c.get("cycle"), f(step_ms(c.get("suspend"))), f(moved_gib(c.get("suspend")), "%.2f"),
                         f(step_ms(c.get("resume"))), f(num(c.get("gpu_mib_suspended"))),
                         "ok" if r.get("ok") else "FAIL: " + str(r.get("error", ""))[:100]])
    out = [table(["weights+state", "path", "cycle", "suspend ms", "GiB copied", "resume ms", "GPU MiB suspended",
                  "run"], rows)]
    g, d = serving_medians(recs, "gcr", later=True), serving_medians(recs, "driver")
    out.append("\nLater GCR suspends (cycle ≥ 1): suspend %s ms, resume %s ms, %s GiB copied; driver alone: "
               "suspend %s ms, resume %s ms; ratios %s / %s." % (
                   spread(g["suspend"]), spread(g["resume"]), spread(g["copied"], "%.2f"),
                   spread(d["suspend"]), spread(d["resume"]), ratio(median(d["suspend"]), median(g["suspend"])),
                   ratio(median(d["resume"]), median(g["resume"]))))
    return "\n".join(out)


def serving_medians(recs, path, later=False):
    out = {"suspend": [], "resume": [], "copied": []}
    for r in recs:
        if r.get("kind") != "serving" or r.get("path") != path or r.get("skipped"):
            continue
        for c in r.get("cycles") or []:
            if later and not (num(c.get("cycle")) or 0) >= 1:
                continue
            if ok_step(c.get("suspend")):
                out["suspend"].append(step_ms(c.get("suspend")))
                out["copied"].append(moved_gib(c.get("suspend")))
            if ok_step(c.get("resume")):
                out["resume"].append(step_ms(c.get("resume")))
    return out


# ---- the targets --------------------------------------------------------------------

def _cr_vals(recs, gib, path, step, prog="testprog", key=step_ms):
    return [key(r.get(step)) for r in recs if r.get("kind") == "cr" and r.get("prog") == prog
            and num(r.get("gib")) == gib and r.get("path") == path and not r.get("skipped") and ok_step(r.get(step))]


def targets(recs):
    """Rows (target, measured, verdict): PASS / FAIL on the medians, "not measured" without data."""
    rows = []

    def add(name, vals, limit, fmt="%.0f", unit=" ms", higher=False):
        m = median(vals)
        if m is None:
            rows.append([name, "not measured", "—"])
            return
        ok = m >= limit if higher else m <= limit
        rows.append([name, spread(vals, fmt) + unit, "PASS" if ok else "FAIL"])

    def speedup(name, gib, step, limit):
        d, g = median(_cr_vals(recs, gib, "driver", step)), median(_cr_vals(recs, gib, "gcr", step))
        if d is None or g is None or g == 0:
            rows.append([name, "not measured", "—"])
        else:
            rows.append([name, "%.1f× (driver %.0f ms / GCR %.0f ms)" % (d / g, d, g), "PASS" if d / g >= limit else "FAIL"])

    add("16 GiB suspend ≤ 750 ms", _cr_vals(recs, 16, "gcr", "suspend"), 750)
    speedup("16 GiB suspend ≥ 10× the driver", 16, "suspend", 10)
    add("16 GiB resume ≤ 800 ms", _cr_vals(recs, 16, "gcr", "resume"), 800)
    speedup("16 GiB resume ≥ 4× the driver", 16, "resume", 4)
    add("64 GiB suspend ≤ 2000 ms", _cr_vals(recs, 64, "gcr", "suspend"), 2000)
    add("64 GiB resume ≤ 2000 ms", _cr_vals(recs, 64, "gcr", "resume"), 2000)
    add("1 GiB suspend ≤ 450 ms", _cr_vals(recs, 1, "gcr", "suspend"), 450)
    add("1 GiB resume ≤ 450 ms", _cr_vals(recs, 1, "gcr", "resume"), 450)
    add("keep-context 16 GiB suspend ≤ 400 ms", _cr_vals(recs, 16, "gcr-keep", "suspend"), 400)
    add("keep-context 16 GiB resume ≤ 400 ms", _cr_vals(recs, 16, "gcr-keep", "resume"), 400)
    g = serving_medians(recs, "gcr", later=True)
    add("incremental serving, later suspends copy ≤ 1.5 GiB", g["copied"], 1.5, "%.2f", " GiB")
    add("incremental serving, later suspends ≤ 500 ms", g["suspend"], 500)
    res = [r for r in recs if r.get("kind") == "cr" and r.get("case") == "reserved" and r.get("path") == "gcr"
           and not r.get("skipped") and ok_step(r.get("suspend"))]
    name = "reserved %s GiB / written %s GiB: suspend ≤ 600 ms" % (
        f(num(res[0].get("gib")), "%g") if res else "60", f(num(res[0].get("written_gib")), "%g") if res else "4")
    add(name, [step_ms(r.get("suspend")) for r in res], 600)
    # The fixed part of the staging (the pinned ring) is not in proportion to the process: the
    # verdict is on the runs that saved at least 4 GiB; the smaller ones are shown beside it.
    steps = [r.get("suspend") for r in recs if r.get("kind") == "cr" and r.get("path") in ("gcr", "gcr-keep")
             and not r.get("skipped") and ok_step(r.get("suspend"))]
    steps += [c.get("suspend") for r in recs if r.get("kind") == "serving" and r.get("path") == "gcr"
              for c in r.get("cycles") or [] if ok_step(c.get("suspend"))]

    def saved(st):
        return (num(dig(st, "shim", "bytes")) or 0) - (num(dig(st, "shim", "zero")) or 0)
    big = [host_ratio(st) for st in steps if saved(st) >= 4 * GIB and host_ratio(st) is not None]
    small = [host_ratio(st) for st in steps if saved(st) < 4 * GIB and host_ratio(st) is not None]
    name = "staging host bytes ≤ 1.05× bytes saved (worst run saving ≥ 4 GiB)"
    extra = "; runs saving < 4 GiB: worst %.3f×" % max(small) if small else ""
    if big:
        rows.append([name, "%.3f× (median %.3f×)%s" % (max(big), median(big), extra),
                     "PASS" if max(big) <= 1.05 else "FAIL"])
    else:
        rows.append([name, "not measured" + extra, "—"])
    for bench, limit, label in (("torch-eager", 1.0, "PyTorch eager step"), ("torch-graphs", 1.0, "PyTorch CUDA-graph step"),
                                ("launch-submit", 3.0, "launch-bound: host time per launch call"),
                                ("launch-kernel", 3.0, "launch-bound: empty kernels, launch to idle")):
        rs = [r for r in recs if r.get("kind") == "overhead" and r.get("bench") == bench and r.get("ok")]
        pct, paired, _ = overhead_pct(rs, overhead_metric(bench))
        name = "overhead ≤ %g%%: %s" % (limit, label)
        if pct is None:
            rows.append([name, "not measured", "—"])
        else:
            extra = "" if paired is None else " (pairs: median %+.2f%%)" % paired
            rows.append([name, "%+.2f%%%s" % (pct, extra), "PASS" if pct <= limit else "FAIL"])
    return rows


def target_table(recs):
    return table(["target (issue 5)", "measured: median (min–max)", "verdict"], targets(recs)) + (
        "\n\nVerdicts on medians; “not measured” where the logs hold no successful run of that case.")


# ---- plots (--plots DIR; needs matplotlib) --------------------------------------------------

def plots(recs, outdir):
    """Writes the PNG plots; returns their paths. Imports matplotlib only here."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(outdir, exist_ok=True)
    written = []
    styles = {"gcr": ("GCR", "o-", "C0"), "driver": ("driver API alone", "s--", "C3"),
              "gcr-keep": ("GCR --keep-context", "^:", "C2")}

    def series(path, step):
        xs, med, lo, hi = [], [], [], []
        for gib in sorted({num(r.get("gib")) for r in recs if r.get("kind") == "cr" and r.get("prog") == "testprog"
                           and r.get("case", "sizes") in ("sizes", "keep") and num(r.get("gib"))}):
            v = [x for x in _cr_vals(recs, gib, path, step) if x is not None]
            if v:
                xs.append(gib)
                med.append(median(v) / 1000.0)
                lo.append(median(v) / 1000.0 - min(v) / 1000.0)
                hi.append(max(v) / 1000.0 - median(v) / 1000.0)
        return xs, med, lo, hi

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, step in zip(axes, ("suspend", "resume")):
        for path, (label, style, color) in styles.items():
            xs, med, lo, hi = series(path, step)
            if xs:
                ax.errorbar(xs, med, yerr=[lo, hi], fmt=style, color=color, label=label, capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("process GPU memory (GiB)")
        ax.set_ylabel("%s latency (s)" % step)
        ax.set_title(step)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("Suspend / resume latency vs size (median, min–max)")
    fig.tight_layout()
    path = os.path.join(outdir, "latency_vs_size.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    written.append(path)

    keep = sorted({num(r.get("gib")) for r in recs if r.get("kind") == "cr" and r.get("path") == "gcr-keep"
                   and num(r.get("gib"))})
    if keep:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        width = 0.13
        for i, gib in enumerate(keep):
            for j, (path, step) in enumerate([(p, s) for s in ("suspend", "resume") for p in ("driver", "gcr", "gcr-keep")]):
                m = median(_cr_vals(recs, gib, path, step))
                if m is not None:
                    ax.bar(i + (j - 2.5) * width, m / 1000.0, width, color=styles[path][2],
                           alpha=1.0 if step == "suspend" else 0.55,
                           label="%s %s" % (styles[path][0], step) if i == 0 else None)
        ax.set_xticks(range(len(keep)))
        ax.set_xticklabels(["%g GiB" % g for g in keep])
        ax.set_yscale("log")
        ax.set_ylabel("latency (s), median")
        ax.set_title("Keep-context: data path alone vs full GCR vs driver alone")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        fig.tight_layout()
        path = os.path.join(outdir, "keep_context.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    serving = [r for r in recs if r.get("kind") == "serving" and r.get("path") == "gcr" and r.get("cycles")]
    if serving:
        r = serving[-1]
        cyc = [c for c in r["cycles"] if ok_step(c.get("suspend"))]
        xs = [c.get("cycle") for c in cyc]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.5))
        a1.bar(xs, [moved_gib(c.get("suspend")) or 0 for c in cyc], color="C0", label="copied by the shim")
        tot = (num(r.get("weights_gib")) or 0) + (num(r.get("state_gib")) or 0)
        a1.axhline(num(r.get("state_gib")) or 0, color="C2", ls="--", label="state (changes every step)")
        a1.axhline(tot, color="C3", ls=":", label="weights + state")
        a1.set_xticks(xs)
        a2.set_xticks(xs)
        a1.set_xlabel("suspend cycle")
        a1.set_ylabel("GiB copied")
        a1.set_title("Incremental suspend: bytes per cycle")
        a1.legend(fontsize=8)
        a2.plot(xs, [(step_ms(c.get("suspend")) or 0) / 1000.0 for c in cyc], "o-", color="C0", label="GCR suspend")
        a2.plot(xs, [(step_ms(c.get("resume")) or 0) / 1000.0 if ok_step(c.get("resume")) else None for c in cyc],
                "s-", color="C1", label="GCR resume")
        d = serving_medians(recs, "driver")
        if d["suspend"]:
            a2.axhline(median(d["suspend"]) / 1000.0, color="C3", ls="--", label="driver alone suspend")
        if d["resume"]:
            a2.axhline(median(d["resume"]) / 1000.0, color="C3", ls=":", label="driver alone resume")
        a2.set_yscale("log")
        a2.set_xlabel("suspend cycle")
        a2.set_ylabel("latency (s)")
        a2.set_title("Incremental suspend: time per cycle")
        a2.legend(fontsize=8)
        a2.grid(True, which="both", alpha=0.3)
        fig.suptitle("Serving %g GiB weights + %g GiB state, GCR_INCREMENTAL=1" % (
            num(r.get("weights_gib")) or 0, num(r.get("state_gib")) or 0))
        fig.tight_layout()
        path = os.path.join(outdir, "incremental.png")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


# ---- steady-state overhead (bench_overhead.py, kind "overhead") -----------------------------

def overhead_metric(bench):
    """The field an overhead record of bench is compared on (time per launch or per step)."""
    return "ns_per_launch" if bench.startswith("launch") else "mean_ms"


def overhead_pct(rs, metric):
    """(with/without - 1 on the medians over processes, median of the pairs' ratios (a pair: the
    process with and the one without the shim of one rep, resident side by side, taking turns),
    number of pairs), in percent; None where not measured. rs: ok overhead records of one bench."""
    wo = median([num(r.get(metric)) for r in rs if not r.get("shim")])
    wi = median([num(r.get(metric)) for r in rs if r.get("shim")])
    pct = (wi / wo - 1.0) * 100.0 if wo is not None and wi is not None and wo > 0 else None
    by_rep = {}
    for r in rs:
        if num(r.get(metric)) is not None and r.get(metric) > 0:
            by_rep.setdefault(r.get("rep"), {})[bool(r.get("shim"))] = r.get(metric)
    ratios = [(p[True] / p[False] - 1.0) * 100.0 for p in by_rep.values() if True in p and False in p]
    return pct, median(ratios), len(ratios)


def overhead_tables(recs):
    groups = {}
    for r in recs:
        if r.get("kind") == "overhead":
            groups.setdefault(str(r.get("bench", "?")), []).append(r)
    if not groups:
        return "_No overhead measurements._"
    rows = []
    for bench in sorted(groups):
        rs = groups[bench]
        launch = bench.startswith("launch")
        metric = overhead_metric(bench)

        def vals(shim):
            return [num(r.get(metric)) for r in rs if bool(r.get("shim")) == shim and r.get("ok")]

        ok = [r for r in rs if r.get("ok")]
        p, paired, npairs = overhead_pct(ok, metric)
        pct = "n/a" if p is None else "%+.2f%%" % p
        if paired is not None:
            pct += " (%d pairs: median %+.2f%%)" % (npairs, paired)
        unit = "ns/launch" if launch else "ms/step (mean)"
        extra = ""
        if launch:
            ps_wo = median([num(r.get("per_s")) for r in rs if not r.get("shim") and r.get("ok")])
            ps_wi = median([num(r.get("per_s")) for r in rs if r.get("shim") and r.get("ok")])
            extra = "%s / %s" % (f(ps_wo), f(ps_wi))
        else:
            extra = "%s / %s" % (f(median([num(r.get("p90_ms")) for r in rs if not r.get("shim") and r.get("ok")]), "%.3f"),
                                 f(median([num(r.get("p90_ms")) for r in rs if r.get("shim") and r.get("ok")]), "%.3f"))
        nfail = sum(1 for r in rs if not r.get("ok") and not r.get("skipped"))
        nskip = sum(1 for r in rs if r.get("skipped"))
        runs = "%d ok" % sum(1 for r in rs if r.get("ok"))
        if nfail:
            runs += ", %d FAIL" % nfail
        if nskip:
            runs += ", %d NOT RUN" % nskip
        rows.append([bench, unit, spread(vals(False), "%.4g"), spread(vals(True), "%.4g"), pct,
                     ("launches/s without / with: " if launch else "p90 ms without / with: ") + extra, runs])
    out = [table(["benchmark", "unit", "without shim", "with shim", "overhead", "detail", "runs"], rows)]
    out.append("\nOverhead = with / without − 1 on the medians over processes (time per step or per launch; lower "
               "is better); “pairs”: the median of that ratio over the with/without pairs, which run side by side and take turns.")
    return "\n".join(out)


# ---- test results (test_gpu.py, kinds "test" and "measure") ---------------------------------

def test_tables(recs):
    tests = [r for r in recs if r.get("kind") == "test"]
    if not tests:
        return "_No test results._"
    cyc = {}
    for r in recs:
        if r.get("kind") == "measure" and r.get("event") == "cycle":
            cyc.setdefault(r.get("test"), []).append(r)
    rows = []
    for t in tests:
        cs = cyc.get(t.get("name"), [])
        reason = str(t.get("reason") or "").strip().splitlines()
        rows.append([t.get("name", "?"), t.get("status", "?"), f(num(t.get("secs")), "%.1f"), len(cs),
                     spread([num(dig(c, "suspend", "wall_ms")) for c in cs]),
                     spread([num(dig(c, "resume", "wall_ms")) for c in cs]),
                     spread([num(c.get("gpu_mib_suspended")) for c in cs]),
                     (reason[0][:160] if reason else "") + ("; " if reason and t.get("notes") else "")
                     + "; ".join(str(n)[:100] for n in (t.get("notes") or []))])
    counts = {}
    for t in tests:
        counts[t.get("status")] = counts.get(t.get("status"), 0) + 1
    out = [table(["test", "result", "s", "cycles", "suspend wall ms", "resume wall ms", "GPU MiB suspended",
                  "reason / notes"], rows)]
    out.append("\n%d passed, %d failed, %d not run." % (counts.get("PASS", 0), counts.get("FAIL", 0),
                                                        counts.get("NOT RUN", 0)))
    return "\n".join(out)


def env_section(recs):
    envs = [r for r in recs if r.get("kind") == "env"]
    if not envs:
        return ""
    e = envs[-1]
    keys = [k for k in sorted(e) if k not in ("kind", "t")]
    return "\n".join("- %s: %s" % (k, str(e[k]).strip().replace("\n", "; ")[:300]) for k in keys)


def render_records(recs):
    """The benchmark sections alone (bench_cr.py prints them at its end)."""
    return "\n".join(["## Targets\n", target_table(recs), "", "## Checkpoint / restore latency\n", cr_tables(recs), "",
                      "## Incremental serving\n", serving_tables(recs), ""])


def render(paths):
    recs, bad, missing = load(paths)
    parts = ["# GCR GPU results\n"]
    env = env_section(recs)
    if env:
        parts += ["## Machine\n", env, ""]
    parts += [render_records(recs),
              "## Steady-state overhead of the shim\n", overhead_tables(recs), "",
              "## GPU tests\n", test_tables(recs), ""]
    if bad or missing:
        parts.append("_Input problems: %d unparsable lines; missing files: %s._" % (bad, ", ".join(missing) or "none"))
    return "\n".join(parts)


def main(argv):
    outdir = None
    if len(argv) >= 2 and argv[0] == "--plots":
        outdir, argv = argv[1], argv[2:]
    if not argv or argv[0].startswith("-"):
        sys.stderr.write(__doc__)
        return 2
    print(render(argv))
    if outdir:
        try:
            written = plots(load(argv)[0], outdir)
        except ImportError as e:
            sys.stderr.write("report.py: --plots needs matplotlib (pip install --user matplotlib): %s\n" % e)
            return 1
        sys.stderr.write("report.py: wrote %s\n" % ", ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
