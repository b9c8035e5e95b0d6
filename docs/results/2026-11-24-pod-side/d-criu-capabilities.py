import os, sys, subprocess
sys.path.insert(0, "/work/wt-k8s/tests/flow")
os.environ["top_builddir"] = "/work/wt-k8s/build"
import test_image_container as t
import test_image as ti
criu, _ = ti.find_criu()
ALL = ["sys_admin", "sys_ptrace", "checkpoint_restore", "dac_read_search", "dac_override", "net_admin", "kill", "setuid", "setgid", "chown", "fowner", "sys_chroot"]
def attempt(caps, c, p, tag):
    d = os.path.join(c.d, "x-" + tag); os.makedirs(d)
    init = int(open("/proc/%d/status" % p.pid).read().split("PPid:")[1].split()[0])
    capset = ",".join("+" + x for x in caps) if caps else ""
    cmd = ["setpriv", "--inh-caps=-all", "--bounding-set=-all" + ("," + capset if capset else ""), "--"] 
    cmd = ["capsh", "--drop=" + ",".join("cap_" + x for x in ALL if x not in caps) + ",cap_sys_module,cap_sys_rawio,cap_net_raw,cap_sys_boot,cap_sys_time,cap_mknod,cap_setpcap,cap_setfcap,cap_fsetid,cap_ipc_lock,cap_ipc_owner,cap_lease,cap_audit_write,cap_net_bind_service,cap_sys_nice,cap_sys_pacct,cap_sys_tty_config,cap_syslog,cap_bpf,cap_perfmon,cap_mac_admin,cap_mac_override,cap_linux_immutable,cap_audit_control,cap_audit_read,cap_wake_alarm,cap_block_suspend,cap_net_broadcast", "--"]
    r = subprocess.run(cmd + ["-c", 'exec "$0" "$@"', criu, "dump", "-t", str(init), "-D", d, "--leave-running", "--shell-job", "--tcp-established", "--ext-unix-sk", "--file-locks", "--external", "mnt[]", "-v4", "-o", "dump.log"], capture_output=True, text=True)
    errs = subprocess.run("grep -E 'Error' %s/dump.log | grep -v RLIMIT_NOFILE | head -3" % d, shell=True, capture_output=True, text=True).stdout.strip()
    print("%-60s rc=%d %s %s" % (tag, r.returncode, errs.replace("\n", " | ")[:300], (r.stderr + r.stdout)[-300:]), flush=True)
    return r.returncode == 0
c = ti.Case("caps", criu)
p = t.start(c, ["--mib", "16", "--wait", "--iters", "40"])
p.send("go"); p.expect(r"ITER 2\b", 60)
rc, rep, err = c.ctl("suspend", str(p.pid)); assert rc == 0, err
base = ["sys_admin", "sys_ptrace", "checkpoint_restore", "dac_read_search", "dac_override", "net_admin"]
attempt(ALL, c, p, "all listed")
attempt(base, c, p, "agent set: " + ",".join(base))
for x in base:
    attempt([y for y in base if y != x], c, p, "agent set without " + x)
attempt(["sys_admin", "sys_ptrace"], c, p, "sys_admin,sys_ptrace only")
attempt(["sys_admin", "sys_ptrace", "net_admin"], c, p, "sys_admin,sys_ptrace,net_admin")
attempt(["checkpoint_restore", "sys_ptrace", "net_admin"], c, p, "checkpoint_restore,sys_ptrace,net_admin (no sys_admin)")
rc, rep, err = c.ctl("resume", str(p.pid)); print("resume", rc, err)
ti.finish(p); print("program RESULT ok after the attempts")
c.close()
