# tests/flow/test_image_container.py: images of a process inside a PID namespace (a container's
# shape: a shell as the namespace's init, the GPU program its child), on the stand-in driver with
# the real CRIU. CRIU cannot dump one process of a namespace; gcrctl checkpoint --container dumps
# the namespace's whole tree from its init (lib/gcr_ctrdump, docs/images.md "Pods").
"""Needs a build dir (top_builddir), root (unshare --pid) and CRIU >= 4 (as test_image.py finds
it): without them every case FAILS, saying why. No sleeps: every wait is on a line or an exit."""

import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_image as ti  # noqa: E402  (its Proc, Case, helpers)

UNSHARE = shutil.which("unshare")


class NsProc(ti.Proc):
    """gcr-testprog as the child of sh, the init of a new PID namespace (unshare --pid --fork);
    self.pid is the program's pid as the host sees it, self.nspid as it sees itself."""

    def __init__(self, d, args, env):
        real_popen = ti.subprocess.Popen

        def popen(argv, **kw):  # the same program, started inside the namespace
            # setsid: the init leads its session, as a container's does (runc); CRIU refuses a
            # tree whose session leader is outside its namespace.
            return real_popen([UNSHARE, "--pid", "--fork", "--kill-child", "--", "setsid", "sh", "-c",
                               '"$@"; exit $?', "sh"] + argv, **kw)
        ti.subprocess.Popen = popen
        try:
            super().__init__(d, args, env)
        finally:
            ti.subprocess.Popen = real_popen
        self.nspid = self.pid
        self.pid = self.host_pid()

    def host_pid(self):
        """The host pid of the program: the descendant of unshare whose NSpid ends in nspid."""
        todo = [self.p.pid]
        while todo:
            pid = todo.pop()
            try:
                with open("/proc/%d/status" % pid) as f:
                    st = dict(l.split(":", 1) for l in f.read().splitlines() if ":" in l)
                nspid = st.get("NSpid", "").split()
                if len(nspid) == 2 and int(nspid[1]) == self.nspid and "gcr-testprog" in st.get("Name", ""):
                    return pid
                with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
                    todo += [int(x) for x in f.read().split()]
            except OSError:
                continue
        raise ti.Fail("no host process for the namespace's pid %d" % self.nspid)


def start(c, args):
    p = NsProc(c.d, args, dict(c.env))
    c.procs.append(p)
    return p


def case_container_leave_running(c):
    """--container --leave-running: CRIU dumps the namespace from its init (core-1.img: the sh),
    the image commits, the program goes on resident and passes its own check."""
    p = start(c, ["--mib", "32", "--wait", "--iters", "40"])
    check_ns(p)
    p.send("go")
    p.expect(r"ITER 3\b", 60)
    img = os.path.join(c.d, "img")
    rep = ti.checkpoint(c, p, img, "--leave-running", "--container")
    crius = os.listdir(os.path.join(img, "criu"))
    ti.check("core-1.img" in crius and "core-%d.img" % p.nspid in crius,
             "the dump lacks the namespace's init or the program: %s" % sorted(crius))
    ti.check(c.alive(p.pid) and c.gpu_bytes(p.pid) > 0, "process not running and resident after the image")
    print("  image %.1f MiB, dump %.1f ms, write %.1f ms" % (ti.image_size(img) / 2**20, rep["ms"]["dump"],
                                                          rep["ms"]["write"]))
    ti.finish(p)


def case_process_alone_refused(c):
    """Without --container CRIU refuses one process of a namespace: the checkpoint fails with its
    reason, no image and no partial directory are left, the program runs on, data intact."""
    p = start(c, ["--mib", "16", "--wait", "--iters", "20"])
    check_ns(p)
    p.send("go")
    p.expect(r"ITER 2\b", 60)
    img = os.path.join(c.d, "img")
    rc, rep, err = c.ctl("checkpoint", "--image", img, "--leave-running", str(p.pid))
    ti.check(rc != 0 and not rep.get("ok"), "checkpoint of one process of a namespace succeeded: %s" % rep)
    ti.check("criu dump failed" in err and "resumed" in err, "message: %s" % err)
    ti.check(not os.path.exists(img) and not [f for f in os.listdir(c.d) if ".partial." in f],
             "an image or a partial directory was left: %s" % os.listdir(c.d))
    ti.check(c.alive(p.pid) and c.gpu_bytes(p.pid) > 0, "process not running and resident after the refusal")
    ti.finish(p)


def check_ns(p):
    ti.check(p.nspid != p.pid, "the program is not in its own PID namespace (pid %d both ways)" % p.pid)


CASES = [case_container_leave_running, case_process_alone_refused]


def main():
    criu, why = ti.find_criu()
    if criu is not None and UNSHARE is None:
        criu, why = None, "no unshare(1) on PATH"
    if criu is not None and os.geteuid() != 0:
        criu, why = None, "needs root (a PID namespace and CRIU)"
    ti.run_cases(CASES, criu, why)


if __name__ == "__main__":
    main()
