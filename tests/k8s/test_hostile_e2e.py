#!/usr/bin/env python3
"""A hostile tenant on a shared GPU node (issue 33): the tier k8s-hostile.

    python3 tests/k8s/test_hostile_e2e.py [BUILD_DIR]

One real-node test bed (test_node_e2e.py's: kubelet, containerd, runc, CRIU, the stand-in GPU
of GCR_TESTBED_GPU_MIB, 512 MiB here), the chart installed once with its defaults plus what the
attacks need: images.kubelet, eviction and eviction.restore on (the routes a tenant attacks),
and the overrides the case modules ask for. Then every module tests/k8s/hostile/cases_*.py is
imported and its CASES run in order, module by module (sorted by file name).

A module's interface:
    CASES = [("name", fn), ...]   fn(ctx) raises AssertionError (or any exception) on failure
    HELM_SET = {"key": "value"}   optional: helm --set values the module's cases need, set once
                                  at the install (two modules setting one key differently: the
                                  install fails)
ctx (class Ctx below): the test_node_e2e helpers (ctx.N, ctx.kubectl, ctx.kjson, ctx.apply,
ctx.wait_until, ctx.check, ctx.log), ctx.node, ctx.build, ctx.values (the --set values
installed), ctx.namespace(name) (created now, deleted after the case), ctx.agent(),
ctx.agent_log(), ctx.metrics() / ctx.metric(name, **labels), ctx.restart_agent(),
ctx.helm_upgrade(extra) (a case that must change the chart puts it back itself),
ctx.figure(text) (a line also printed in the summary at the end: before/under-attack times).

GCR_HOSTILE_E2E_CASES: a comma list of case names, "module:name" or module names (cases_shares
or shares) to run after the install; GCR_HOSTILE_E2E_SET: a comma list of key=value added as
helm --set values after everything else (a case's fix switched off by a policy value, to see it
fail). Ends with "N passed, N failed"; the figures follow.
"""
import glob
import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_node_e2e as N  # noqa: E402

check, kubectl, kjson, apply, wait_until, log = N.check, N.kubectl, N.kjson, N.apply, N.wait_until, N.log
GPU_MIB = int(os.environ.get("GCR_HOSTILE_E2E_GPU_MIB", "512"))
REGISTRY_PORT = 5055
FIGURES = []


class Ctx:
    """What a case gets. Namespaces made with namespace() are deleted after the case, also when
    it fails, so one case's pods never hold the next one's slots or GPU memory."""
    N = N
    kubectl, kjson, apply = staticmethod(kubectl), staticmethod(kjson), staticmethod(apply)
    wait_until, check, log = staticmethod(wait_until), staticmethod(check), staticmethod(log)

    def __init__(self, values):
        self.values = values
        self.build = N.BUILD
        self.registry_port = REGISTRY_PORT
        self.case = None
        self._namespaces = []

    @property
    def node(self):
        return N.ENV["GCR_TESTBED_NODE"]

    def namespace(self, name):
        N.namespace(name)
        if name not in self._namespaces:
            self._namespaces.append(name)
        return name

    def cleanup(self):
        names, self._namespaces = self._namespaces, []
        for ns in reversed(names):
            N.drop_namespace(ns)

    def agent(self, timeout=120):
        """The Ready agent pod of the node."""
        return wait_until("the agent Ready", N.agent_ready, timeout)

    def agent_log(self, pod=None, since_s=None):
        a = pod or self.agent()
        args = ["logs", "-n", N.SYSTEM_NS, a["metadata"]["name"], "-c", "agent"]
        if since_s:
            args.append(f"--since={int(since_s)}s")
        return kubectl(*args, check=False).stdout.splitlines()

    def metrics(self):
        a = self.agent()
        return kubectl("get", "--raw", f"/api/v1/namespaces/{N.SYSTEM_NS}/pods/{a['metadata']['name']}:9464"
                       "/proxy/metrics").stdout

    def metric(self, name, **labels):
        """The value of one sample of the agent's /metrics (labels matched exactly, in any order),
        None when absent."""
        want = {k: str(v) for k, v in labels.items()}
        for m in re.finditer(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? (\S+)$', self.metrics(), re.M):
            if m.group(1) != name:
                continue
            got = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            if got == want:
                return float(m.group(3))
        return None

    def restart_agent(self):
        """Deletes the agent pod; returns the DaemonSet's new one once Ready."""
        old = self.agent()
        kubectl("delete", "pod", "-n", N.SYSTEM_NS, old["metadata"]["name"], "--wait=false")
        return wait_until("the DaemonSet's new agent Ready", lambda: (p := N.agent_ready()) and
                          p["metadata"]["uid"] != old["metadata"]["uid"] and p, 180)

    def helm_upgrade(self, extra=None):
        """helm upgrade with the installed values plus extra ({key: value}); extra None puts the
        installed values back. Returns the new agent pod once Ready (a new pod when the DaemonSet's
        template changed)."""
        old = self.agent()
        sets = dict(self.values, **(extra or {}))
        N.run([helm()] + ["upgrade", N.RELEASE, N.CHART, "-n", N.SYSTEM_NS] + set_args(sets) +
              ["--wait", "--timeout", "180s"], timeout=200)
        return wait_until("the agent Ready after the upgrade", lambda: (p := N.agent_ready()) and (
            p["metadata"]["uid"] != old["metadata"]["uid"] or p["spec"] == old["spec"]) and p, 180)

    def figure(self, text):
        line = f"{self.case}: {text}" if self.case else text
        FIGURES.append(line)
        log(f"FIGURE {line}")


def helm():
    return os.path.join(N.ENV["GCR_TESTBED_BIN"], "helm")


def set_args(values):
    """helm arguments; an environment variable's value (key ending ".value") as a string."""
    out = []
    for k, v in values.items():
        out += ["--set-string" if k.endswith(".value") else "--set", f"{k}={v}"]
    return out


def modules():
    """(short name, module) of every tests/k8s/hostile/cases_*.py, by file name."""
    out = []
    for path in sorted(glob.glob(os.path.join(HERE, "hostile", "cases_*.py"))):
        name = os.path.basename(path)[:-3]
        spec = importlib.util.spec_from_file_location(f"hostile_{name}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        out.append((name[len("cases_"):], mod))
    return out


def base_values(mods):
    """The --set values of the one install: image, the attacked routes on, the modules' HELM_SET,
    then GCR_HOSTILE_E2E_SET."""
    port = open(os.path.join(N.ENV["GCR_TESTBED_DIR"], "kubelet.port")).read().strip()
    values = {"image.repository": N.IMAGE_REPO, "image.tag": N.IMAGE_TAG,
              "images.kubelet.enabled": "true", "images.kubelet.port": port,
              "eviction.enabled": "true", "eviction.restore.enabled": "true",
              "eviction.restore.registryPort": str(REGISTRY_PORT)}
    owner = {}
    for short, mod in mods:
        for k, v in getattr(mod, "HELM_SET", {}).items():
            v = str(v)
            check(k not in owner or values[k] == v, f"HELM_SET {k}: {owner.get(k)} wants {values.get(k)}, "
                  f"{short} wants {v}")
            values[k], owner[k] = v, short
    for kv in filter(None, os.environ.get("GCR_HOSTILE_E2E_SET", "").split(",")):
        k, _, v = kv.partition("=")
        values[k] = v
    return values


def install(ctx, mods):
    """helm install with base_values; the agent Ready, the shim allocatable on the node."""
    ctx.values.update(base_values(mods))
    N.run([helm(), "install", N.RELEASE, N.CHART, "-n", N.SYSTEM_NS, "--create-namespace"] + set_args(ctx.values) +
          ["--wait", "--timeout", "180s"], timeout=200)
    ctx.agent()
    alloc = wait_until("gpucr.dev/shim on the node", lambda: kjson("get", "node", ctx.node)["status"]
                       .get("allocatable", {}).get("gpucr.dev/shim"), 60)
    extra = {k: v for k, v in ctx.values.items() if not k.startswith(("image.", "images.kubelet.port"))}
    log(f"chart installed; gpucr.dev/shim={alloc}; stand-in GPU {GPU_MIB} MiB; values {extra}")


def selected(short, name):
    only = [x for x in os.environ.get("GCR_HOSTILE_E2E_CASES", "").split(",") if x]
    return not only or any(x in (name, f"{short}:{name}", short, f"cases_{short}") for x in only)


def wrap(ctx, short, name, fn):
    def case():
        ctx.case = f"{short}:{name}"
        try:
            fn(ctx)
        finally:
            ctx.cleanup()
            ctx.case = None
    case.__name__ = f"{short}:{name}"
    return case


def main():
    mods = modules()
    ctx = Ctx({})

    def case_install():
        install(ctx, mods)
    cases = [case_install]
    for short, mod in mods:
        for name, fn in getattr(mod, "CASES", []):
            if selected(short, name):
                cases.append(wrap(ctx, short, name, fn))
    rc = N.main(cases, GPU_MIB)
    if FIGURES:
        print("=== figures")
        for line in FIGURES:
            print(line)
    return rc


if __name__ == "__main__":
    sys.exit(main())
