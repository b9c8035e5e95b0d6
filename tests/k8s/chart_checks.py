#!/usr/bin/env python3
"""Static checks of a rendered GCR chart (helm template output), run by test_chart.sh.

    chart_checks.py rbac RENDER EXPECTED      RBAC rules == EXPECTED, no wildcards, no secrets
    chart_checks.py default RENDER NAMESPACE  default values: least host access, probes, ...
    chart_checks.py test RENDER NAMESPACE     tests/k8s/values-test.yaml took effect
    chart_checks.py rules RENDER              print "IDENTITY KIND GROUP RESOURCE VERB" of the render

Identities: "node" (the DaemonSet's ServiceAccount, component label agent) and
"scaler" (the Deployment's, component label scaler).

Prints one "ok     NAME" or "FAIL   NAME" line per check; exits 1 if any failed.
"""
import os
import sys

import yaml

failed = 0


def check(name, cond, detail=""):
    global failed
    if cond:
        print(f"ok     {name}")
    else:
        failed += 1
        print(f"FAIL   {name}")
        if detail:
            for line in str(detail).splitlines()[:20]:
                print(f"       | {line}")


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def objs(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def one(docs, kind):
    found = objs(docs, kind)
    if len(found) != 1:
        raise SystemExit(f"chart_checks: expected one {kind}, found {len(found)}")
    return found[0]


def identity(obj):
    """"node" or "scaler": whose object this is, by its component label."""
    comp = (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
    return {"agent": "node", "scaler": "scaler"}.get(comp, "unknown:%s" % comp)


def rule_set(docs):
    """(identity, kind, group, resource, verb) of every ClusterRole and Role rule."""
    out = set()
    for kind in ("ClusterRole", "Role"):
        for role in objs(docs, kind):
            for r in role.get("rules") or []:
                for g in r.get("apiGroups") or []:
                    for res in r.get("resources") or []:
                        for v in r.get("verbs") or []:
                            out.add((identity(role), kind, g or "core", res, v))
    return out


def read_expected(path):
    out = set()
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                parts = line.split()
                if len(parts) != 5:
                    raise SystemExit(f"chart_checks: bad line in {path}: {line}")
                out.add(tuple(parts))
    return out


def cmd_rbac(render, expected_path):
    docs = load(render)
    got, want = rule_set(docs), read_expected(expected_path)
    fmt = lambda s: "\n".join(" ".join(t) for t in sorted(s))  # noqa: E731
    check("RBAC grants nothing beyond rbac-expected.txt", not (got - want),
          "not reviewed:\n" + fmt(got - want))
    check("RBAC grants everything in rbac-expected.txt", not (want - got),
          "missing:\n" + fmt(want - got))
    wild = []
    for kind in ("ClusterRole", "Role"):
        for role in objs(docs, kind):
            for r in role.get("rules") or []:
                for key in ("apiGroups", "resources", "verbs", "nonResourceURLs", "resourceNames"):
                    if any("*" in str(x) for x in r.get(key) or []):
                        wild.append(f"{kind} {role['metadata']['name']}: {key} {r.get(key)}")
                if "nonResourceURLs" in r:
                    wild.append(f"{kind}: nonResourceURLs {r['nonResourceURLs']}")
    check("RBAC has no wildcards and no non-resource URLs", not wild, "\n".join(wild))
    secrets = [t for t in got if t[3].split("/")[0] in ("secrets", "serviceaccounts", "configmaps")
               or t[3] in ("pods/exec", "pods/attach", "pods/portforward", "nodes/proxy")]
    check("RBAC has no access to secrets, tokens, exec or proxies", not secrets, secrets)
    check("leases only through the namespaced Role",
          all(k == "Role" for i, k, g, r, v in got if r == "leases")
          and all(r == "leases" for i, k, g, r, v in got if k == "Role"))
    # The split: a node agent creates nothing but Events (its heartbeat Lease is created
    # by the scaler), deletes nothing, writes no pod.
    node_writes = sorted(" ".join(t) for t in got if t[0] == "node" and (
        t[4] in ("delete", "deletecollection")
        or (t[4] == "create" and t[3] != "events")
        or (t[3].split("/")[0] == "pods" and t[4] not in ("get", "list", "watch"))))
    check("node identity: no create but Events, no delete, no write to pods or pods/status",
          not node_writes, "\n".join(node_writes))
    check("only the scaler identity creates Leases (the nodes' heartbeats, its leader Lease)",
          {t[0] for t in got if (t[3], t[4]) == ("leases", "create")} == {"scaler"})
    check("only the scaler identity patches pods/status or creates Checkpoints/Restores",
          {t[0] for t in got if (t[3], t[4]) in (("pods/status", "patch"), ("checkpoints", "create"),
                                                 ("restores", "create"))} == {"scaler"})
    aggr = [d["metadata"]["name"] for d in objs(docs, "ClusterRole") if d.get("aggregationRule")
            or any(k.startswith("rbac.authorization.k8s.io/aggregate")
                   for k in (d["metadata"].get("labels") or {}))]
    check("ClusterRole neither aggregates nor is aggregated", not aggr, aggr)
    sas = {identity(sa): sa for sa in objs(docs, "ServiceAccount")}
    check("two ServiceAccounts: node and scaler", sorted(sas) == ["node", "scaler"], sorted(sas))
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        bs = objs(docs, kind)
        check(f"{kind}: one per identity", sorted(identity(b) for b in bs) == ["node", "scaler"])
        for b in bs:
            sa = sas.get(identity(b))
            subj = b.get("subjects") or []
            role = [r for r in objs(docs, kind.replace("Binding", "")) if identity(r) == identity(b)]
            check(f"{kind} {b['metadata']['name']} binds only its identity's ServiceAccount to its role",
                  sa is not None and subj == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                               "namespace": sa["metadata"]["namespace"]}]
                  and len(role) == 1 and b["roleRef"]["name"] == role[0]["metadata"]["name"], subj)
    return 0


def pod_spec(docs):
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]


def container(spec, name, init=False):
    for c in spec.get("initContainers" if init else "containers") or []:
        if c["name"] == name:
            return c
    raise SystemExit(f"chart_checks: no container {name}")


def common(docs, ns):
    """Checks that hold for every set of values."""
    bad = [f"{d['kind']}/{d['metadata']['name']}" for d in docs
           if d["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding")
           and d["metadata"].get("namespace") != ns]
    check(f"every namespaced object is in {ns}", not bad, bad)
    spec = pod_spec(docs)
    agent = container(spec, "agent")
    init = container(spec, "install-shim", init=True)
    check("hostPID, no hostNetwork, no hostIPC",
          spec.get("hostPID") is True and not spec.get("hostNetwork") and not spec.get("hostIPC"))
    sas = {identity(sa): sa["metadata"]["name"] for sa in objs(docs, "ServiceAccount")}
    check("node agents use the node ServiceAccount", spec.get("serviceAccountName") == sas.get("node"))
    for c in (agent, init):
        sc = c.get("securityContext") or {}
        check(f"{c['name']}: read-only root filesystem, ALL capabilities dropped",
              sc.get("readOnlyRootFilesystem") is True
              and (sc.get("capabilities") or {}).get("drop") == ["ALL"], sc)
    isc = init.get("securityContext") or {}
    check("install-shim: unprivileged, no capabilities added",
          isc.get("privileged") is False and isc.get("allowPrivilegeEscalation") is False
          and not (isc.get("capabilities") or {}).get("add"), isc)
    check("install-shim copies /opt/gcr/lib to the shim hostPath by rename",
          "/opt/gcr/lib/" in " ".join(init.get("command") or [])
          and "mv -f" in " ".join(init.get("command") or [])
          and [m["name"] for m in init.get("volumeMounts") or []] == ["shim"])
    added = set((agent["securityContext"].get("capabilities") or {}).get("add") or [])
    check("agent: capabilities added are at most DAC_OVERRIDE, SYS_PTRACE",
          added <= {"DAC_OVERRIDE", "SYS_PTRACE"}, sorted(added))
    probes = (agent.get("livenessProbe", {}).get("httpGet", {}).get("path"),
              agent.get("readinessProbe", {}).get("httpGet", {}).get("path"))
    check("probes: liveness /healthz, readiness /readyz", probes == ("/healthz", "/readyz"), probes)
    res = agent.get("resources") or {}
    check("agent has resource requests and limits",
          {"cpu", "memory"} <= set(res.get("requests") or {})
          and {"cpu", "memory"} <= set(res.get("limits") or {}), res)
    args = agent.get("args") or []
    check("agent gets --config from the ConfigMap",
          "--config=/etc/gcr/config.yaml" in args
          and any(v.get("configMap", {}).get("name") == one(docs, "ConfigMap")["metadata"]["name"]
                  for v in spec["volumes"]), args)
    env = {e["name"]: e for e in agent.get("env") or []}
    check("NODE_NAME from spec.nodeName",
          env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "spec.nodeName")
    cfg = yaml.safe_load(one(docs, "ConfigMap")["data"]["config.yaml"])
    check("config.yaml parses and names the lease namespace", cfg.get("leaseNamespace") == ns, cfg)
    check("node agents run --role=node", "--role=node" in args, args)
    ds = one(docs, "DaemonSet")
    sel = ",".join("%s=%s" % kv for kv in sorted(ds["spec"]["selector"]["matchLabels"].items()))
    check("config.yaml agentSelector is the DaemonSet's selector (the scaler creates those nodes' Leases)",
          cfg.get("agentSelector") == sel, (cfg.get("agentSelector"), sel))
    check("POD_IP from status.podIP (the metrics address)",
          env.get("POD_IP", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP")
    reg = [a.split("=", 1)[1] for a in args if a.startswith("--registry-socket=")]
    sroot = cfg["devicePlugin"].get("socketRoot", "")
    check("registry socket in a directory of its own; socketRoot set, elsewhere in socketDir",
          len(reg) == 1 and sroot and os.path.dirname(reg[0]) != sroot.rstrip("/")
          and not sroot.startswith(os.path.dirname(reg[0]) + "/"), (reg, sroot))
    scaler_checks(docs, sas.get("scaler"))
    return spec, agent, cfg


def scaler_checks(docs, sa):
    """The scaler Deployment: role scaler, its own identity, no host access at all."""
    deps = objs(docs, "Deployment")
    check("one scaler Deployment", len(deps) == 1, [d["metadata"]["name"] for d in deps])
    if len(deps) != 1:
        return
    spec = deps[0]["spec"]["template"]["spec"]
    c = spec["containers"][0]
    args = c.get("args") or []
    check("scaler: --role=scaler, its own ServiceAccount",
          "--role=scaler" in args and spec.get("serviceAccountName") == sa and sa is not None, args)
    check("scaler: no hostPID/hostNetwork/hostIPC, no hostPath, no runtimeClass",
          not spec.get("hostPID") and not spec.get("hostNetwork") and not spec.get("hostIPC")
          and not any("hostPath" in v for v in spec.get("volumes") or []) and "runtimeClassName" not in spec)
    sc, psc = c.get("securityContext") or {}, spec.get("securityContext") or {}
    check("scaler: non-root, nothing privileged, ALL capabilities dropped, read-only root",
          psc.get("runAsNonRoot") is True and psc.get("runAsUser") not in (None, 0)
          and sc.get("privileged") is False and sc.get("allowPrivilegeEscalation") is False
          and sc.get("readOnlyRootFilesystem") is True
          and (sc.get("capabilities") or {}).get("drop") == ["ALL"]
          and not (sc.get("capabilities") or {}).get("add"), (psc, sc))
    probes = (c.get("livenessProbe", {}).get("httpGet", {}).get("path"),
              c.get("readinessProbe", {}).get("httpGet", {}).get("path"))
    check("scaler: probes /healthz, /readyz on the metrics port", probes == ("/healthz", "/readyz")
          and c.get("livenessProbe", {}).get("httpGet", {}).get("port") == "metrics", probes)


def host_paths(spec):
    return {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}


def cmd_default(render, ns):
    docs = load(render)
    spec, agent, cfg = common(docs, ns)
    sc = agent["securityContext"]
    check("agent: not privileged, no privilege escalation",
          sc.get("privileged") is False and sc.get("allowPrivilegeEscalation") is False, sc)
    check("default nodeSelector nvidia.com/gpu.present=true",
          spec.get("nodeSelector") == {"nvidia.com/gpu.present": "true"}, spec.get("nodeSelector"))
    hp = host_paths(spec)
    want = {"sockets": "/run/gcr", "registry": "/run/gcr/agent", "shim": "/opt/gcr/lib",
            "device-plugins": "/var/lib/kubelet/device-plugins", "images": "/var/lib/gcr/images"}
    check("hostPath volumes: exactly sockets, registry dir, shim dir, device-plugin dir, images dir", hp == want, hp)
    check("images: the agent's config names the mounted root, keep 2, node-local (imagesShared false)",
          cfg.get("imagesDir") == "/var/lib/gcr/images" and cfg.get("imagesKeep") == 2
          and cfg.get("imagesShared") == "false", cfg)
    check("images of pods off by default: no image dirs for pods, no capability for CRIU",
          "imageRoot" not in cfg["devicePlugin"]
          and "SYS_ADMIN" not in (agent["securityContext"].get("capabilities") or {}).get("add", []), cfg)
    mounts = {m["name"]: m for m in agent.get("volumeMounts") or []}
    check("agent does not mount the shim dir (the kubelet does, for workloads)",
          "shim" not in mounts, sorted(mounts))
    check("driver through the nvidia RuntimeClass",
          spec.get("runtimeClassName") == "nvidia"
          and {"NVIDIA_VISIBLE_DEVICES": "all"}.items()
          <= {e["name"]: e.get("value") for e in agent["env"]}.items())
    check("metrics on the pod's own IP, port 9464 (not the wildcard)",
          "--metrics-address=[$(POD_IP)]:9464" in agent["args"], agent["args"])
    dep = objs(docs, "Deployment")
    check("scaler metrics on its pod's own IP too",
          dep and "--metrics-address=[$(POD_IP)]:9464" in dep[0]["spec"]["template"]["spec"]["containers"][0]["args"])
    check("registry socket /run/gcr/agent/agent.sock, device plugin socketRoot /run/gcr/alloc",
          "--registry-socket=/run/gcr/agent/agent.sock" in agent["args"]
          and cfg["devicePlugin"].get("socketRoot") == "/run/gcr/alloc", (agent["args"], cfg["devicePlugin"]))
    check("no ServiceMonitor or metrics Service by default",
          not objs(docs, "ServiceMonitor") and not objs(docs, "Service"))
    check("overcommit on by default: the agent's policy, GCR_OVERCOMMIT=1 for opted-in containers",
          cfg.get("overcommit") == "true" and cfg.get("overcommitMarginMiB") == 0
          and cfg.get("overcommitMode") == "full" and cfg.get("overcommitEnv") == "false"
          and cfg["devicePlugin"].get("shimEnv") == {"GCR_OVERCOMMIT": "1"}, cfg)
    check("shares per pod by default: the fair share of each table among the slots, half the workers per "
          "namespace; room from the same namespace only, room not used: 60 s without priority",
          cfg.get("sharePods") == 0 and cfg.get("shareRegistryPerPod") == 0 and cfg.get("shareHoldsPerPod") == 0
          and cfg.get("shareRoomPerPod") == 0 and cfg.get("workersPerNamespace") == 0
          and cfg.get("overcommitRoomFrom") == "" and cfg.get("overcommitUnusedBackoffMs") == 60000, cfg)
    check("config: device plugin on, 32 slots of gpucr.dev/shim",
          cfg["devicePlugin"]["enabled"] is True and cfg["devicePlugin"]["slots"] == 32
          and cfg["devicePlugin"]["resourceName"] == "gpucr.dev/shim", cfg)
    return 0


def cmd_test(render, ns):
    docs = load(render)
    spec, agent, cfg = common(docs, ns)
    check("tolerations from values",
          {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
          in (spec.get("tolerations") or []), spec.get("tolerations"))
    check("nodeSelector from values", spec.get("nodeSelector") == {"gcr.test/gpu": "h100"},
          spec.get("nodeSelector"))
    check("config: room policy and shares from values",
          cfg.get("overcommitRoomFrom") == "inference=batch,dev" and cfg.get("shareHoldsPerPod") == 4
          and cfg.get("workersPerNamespace") == 1 and cfg.get("overcommitUnusedBackoffMs") == -1, cfg)
    check("config: 7 slots, shim settings, CDI device",
          cfg["devicePlugin"]["slots"] == 7
          and cfg["devicePlugin"]["shimEnv"] == {"GCR_VMM_MIN_BYTES": "4194304", "GCR_OVERCOMMIT": "1"}
          and cfg["devicePlugin"]["cdiDevice"] == "gpucr.dev/shim=all", cfg)
    sm = objs(docs, "ServiceMonitor")
    svc = objs(docs, "Service")
    check("ServiceMonitor and headless metrics Service rendered",
          len(sm) == 1 and len(svc) == 1 and svc[0]["spec"].get("clusterIP") == "None"
          and sm[0]["metadata"]["labels"].get("release") == "prometheus")
    check("image from values", agent["image"] == "registry.example.com/gcr/agent:test"
          and agent["imagePullPolicy"] == "Always", agent["image"])
    sc = agent["securityContext"]
    check("driver mode hostPath: privileged agent, driver libs read-only, GCR_LIBCUDA",
          sc.get("privileged") is True and "runtimeClassName" not in spec
          and host_paths(spec).get("driver-libs") == "/run/nvidia/driver/usr/lib/x86_64-linux-gnu"
          and any(m["name"] == "driver-libs" and m.get("readOnly") for m in agent["volumeMounts"])
          and {e["name"]: e.get("value") for e in agent["env"]}.get("GCR_LIBCUDA")
          == "/usr/local/nvidia/lib64/libcuda.so.1", sc)
    hp = host_paths(spec)
    check("hostPath volumes: sockets, shim, device plugins, driver libs (no CDI spec dir: the agent writes none)",
          set(hp) == {"sockets", "registry", "shim", "device-plugins", "driver-libs", "images"}
          and "cdiSpecDir" not in cfg["devicePlugin"], hp)
    check("metrics on port 9500, IPv6 bind address bracketed",
          "--metrics-address=[::]:9500" in agent["args"]
          and agent["ports"][0]["containerPort"] == 9500, agent["args"])
    check("ServiceAccount names from values",
          sorted(sa["metadata"]["name"] for sa in objs(docs, "ServiceAccount")) == ["gcr-agent-test", "gcr-scaler-test"])
    dep = one(docs, "Deployment")
    check("scaler: 2 replicas, leader term 20 s in the config",
          dep["spec"]["replicas"] == 2 and cfg.get("leaderLeaseSeconds") == 20, dep["spec"]["replicas"])
    return 0


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "rules":
        for t in sorted(rule_set(load(args[0]))):
            print(" ".join(t))
        return 0
    {"rbac": cmd_rbac, "default": cmd_default, "test": cmd_test}[cmd](*args)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
