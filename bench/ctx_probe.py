# bench/ctx_probe.py: what the driver's checkpoint of a bare CUDA context costs, and how much of
# it the context's local-memory reservation (sized from the stack limit) is. Drives
# bench/ctx_probe (LAUNCH-free, context only) through `gcrctl suspend/resume --driver-only`.
"""Usage: python3 bench/ctx_probe.py PROBE_BINARY [--stacks "default 512 16384 shrink0"] [--reps 3] [--log FILE]
(shrinkN: run a kernel with the default limit, then lower it to N bytes, as the shim would)"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "gpu"))
import harness as H  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("probe")
    ap.add_argument("--stacks", default="default 512 16384")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--log", default="/tmp/ctx_probe.jsonl")
    a = ap.parse_args(argv)
    S = H.Session(H.Config(), a.log)
    rows = []
    try:
        for rep in range(a.reps):
            for st in a.stacks.split():
                if st.startswith("shrink"):
                    args = [a.probe, "--shrink-after", st[len("shrink"):]]
                else:
                    args = [a.probe] + ([] if st == "default" else ["--stack", st])
                p = S.start("ctx-probe-%s-r%d" % (st, rep), args)
                rec = {"kind": "ctx-probe", "stack_arg": st, "rep": rep, "ok": False}
                try:
                    if st.startswith("shrink"):
                        m = p.expect(r"SHRINK ms=(\S+) freed_mib=(-?\d+)", 60, what="SHRINK")
                        rec.update(shrink_ms=float(m.group(1)), freed_mib=int(m.group(2)))
                    m = p.expect(r"READY pid=\d+ stack=(\d+) free_mib=(\d+)", 60, what="READY")
                    rec.update(stack=int(m.group(1)), free_mib=int(m.group(2)),
                               gpu_mib=H.gpu_mem_mib(S.cfg, p.pid))
                    s = S.ctl("suspend", p.pid, flags=["--driver-only"], timeout=120)
                    r = S.ctl("resume", p.pid, flags=["--driver-only"], timeout=120)
                    rec.update(suspend_ms=H.dig(s.data, "ms"), resume_ms=H.dig(r.data, "ms"),
                               suspend_err=s.error, resume_err=r.error)
                    p.send("check")
                    if st.startswith("shrink"):
                        rec["grow_ms"] = float(p.expect(r"GROW ms=(\S+)", 60, what="GROW").group(1))
                    res = p.expect(r"RESULT (.*)", 60, what="RESULT").group(1)
                    rec["ok"] = res.strip() == "ok" and s.error is None and r.error is None
                except H.HarnessError as e:
                    rec["error"] = str(e)
                finally:
                    S.finish(p)
                S.log.write(**rec)
                rows.append(rec)
                print(json.dumps(rec), flush=True)
    finally:
        S.close()
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
