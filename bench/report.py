# bench/report.py: turns the raw JSON lines of tests/gpu/test_gpu.py, bench/bench_cr.py and
# bench/bench_overhead.py into the markdown tables of docs/benchmarks.md, printed on stdout.
"""Usage: python3 bench/report.py LOG.jsonl [LOG.jsonl ...]

Never crashes on missing, failed or malformed entries: they show as "n/a", "FAIL" or
"NOT RUN". Only the Python standard library is used.
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
            f(median([num(dig(s, "bytes", "moved")) for s in sus]) / 2.0 ** 30
              if median([num(dig(s, "bytes", "moved")) for s in sus]) is not None else None, "%.2f"),
        ])
    out = [table(["program", "size", "path", "ok/runs", "suspend ms", "suspend wall ms",
                  "data/lock/checkpoint ms", "resume ms", "resume wall ms", "restore/unlock/data ms",
                  "GPU MiB suspended", "GPU MiB running", "GiB moved by shim"], rows)]
    out.append("\nms = gcrctl's own `ms.total` (start-up excluded), median (min–max); wall = the whole "
               "gcrctl command. Part columns are medians; n/a where gcrctl did not report them.\n")
    srows = []
    sizes = sorted({(k[0], k[1]) for k in groups})
    for prog, gib in sizes:
        def med(path, step):
            return median([step_ms(r.get(step)) for r in groups.get((prog, gib, path), [])
                           if not r.get("skipped") and ok_step(r.get(step))])
        ds, gs, dr, gr = med("driver", "suspend"), med("gcr", "suspend"), med("driver", "resume"), med("gcr", "resume")
        tot_d = ds + dr if num(ds) is not None and num(dr) is not None else None
        tot_g = gs + gr if num(gs) is not None and num(gr) is not None else None
        srows.append([prog, "%g GiB" % gib, f(ds), f(gs), ratio(ds, gs), f(dr), f(gr), ratio(dr, gr),
                      ratio(tot_d, tot_g)])
    out.append(table(["program", "size", "driver suspend ms", "GCR suspend ms", "suspend speed-up",
                      "driver resume ms", "GCR resume ms", "resume speed-up", "suspend+resume speed-up"], srows))
    fails = [r for rs in groups.values() for r in rs if not r.get("skipped") and not r.get("ok")]
    if fails:
        out.append("\nFailed runs:\n")
        for r in fails[:20]:
            err = r.get("error") or dig(r, "suspend", "error") or dig(r, "resume", "error") or r.get("result")
            out.append("- %s %g GiB %s rep %s: %s" % (r.get("prog"), num(r.get("gib")) or 0, r.get("path"),
                                                   r.get("rep"), str(err).splitlines()[0][:200] if err else "?"))
    return "\n".join(out)


# ---- steady-state overhead (bench_overhead.py, kind "overhead") -----------------------------

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
        metric = "ns_per_launch" if launch else "mean_ms"

        def vals(shim):
            return [num(r.get(metric)) for r in rs if bool(r.get("shim")) == shim and r.get("ok")]

        wo, wi = median(vals(False)), median(vals(True))
        pct = "n/a"
        if num(wo) is not None and num(wi) is not None and wo > 0:
            pct = "%+.2f%%" % ((wi / wo - 1.0) * 100.0)
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
    out.append("\nOverhead = with / without − 1 on the medians (time per step or per launch; lower is better).")
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


def render(paths):
    recs, bad, missing = load(paths)
    parts = ["# GCR GPU results\n"]
    env = env_section(recs)
    if env:
        parts += ["## Machine\n", env, ""]
    parts += ["## Checkpoint / restore latency\n", cr_tables(recs), "",
              "## Steady-state overhead of the shim\n", overhead_tables(recs), "",
              "## GPU tests\n", test_tables(recs), ""]
    if bad or missing:
        parts.append("_Input problems: %d unparsable lines; missing files: %s._" % (bad, ", ".join(missing) or "none"))
    return "\n".join(parts)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.stderr.write(__doc__)
        sys.exit(2)
    print(render(sys.argv[1:]))
