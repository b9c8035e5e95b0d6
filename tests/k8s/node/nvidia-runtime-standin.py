#!/usr/bin/env python3
"""The test bed's stand-in for NVIDIA's container runtime (test tooling, not product).

NVIDIA's runtime is runc plus one step: at `create`, for a container whose environment
asks for GPUs (NVIDIA_VISIBLE_DEVICES set, not "void"/"none"), it adds the driver's
libraries and tools to the container's OCI spec, then runs runc. This does the same
with the stand-in driver (tests/fakecuda: libcuda.so.1, libnvidia-ml.so.1, and fakesmi in
nvidia-smi's place), so a pod with runtimeClassName "nvidia" gets a driver the way it
would on a GPU node. runc, containerd and the kubelet are the real ones; only the driver
is a stand-in. The node's one stand-in GPU is the pool file every GPU container shares
(--gpu-dir, mounted at /run/fakecuda-gpu: FAKECUDA_POOL), of --mem-mib MiB, as containers
on a node share its GPU.

`restore` (a container created from a checkpoint: containerd's CRI restore) gets the same
spec edits as `create`, or CRIU would not find the driver's mounts the dump recorded.
--criu-config FILE names, as the annotation org.criu.config, a CRIU configuration runc
passes to CRIU's dump and restore of GPU containers: the stand-in driver holds an
open-file-description lock on its pool slot (CRIU's --file-locks) while a process uses it; its
checkpoint drops it, as the real driver's closes its device files, so this matters only for a
process dumped without that checkpoint.

    nvidia-runtime-standin.py --driver-dir DIR --gpu-dir DIR --mem-mib N [--criu-config FILE]
                              [--runc PATH] -- RUNC-ARGS...
"""
import json
import os
import sys

LIB_DIR = "/usr/lib/x86_64-linux-gnu"
SMI_DEST = "/usr/bin/fakesmi"
GPU_DEST = "/run/fakecuda-gpu"


def wants_gpu(env):
    for e in env:
        if e.startswith("NVIDIA_VISIBLE_DEVICES="):
            return e.split("=", 1)[1] not in ("", "void", "none")
    return False


def inject(bundle, driver_dir, gpu_dir, mem_mib, criu_config):
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    if not wants_gpu(spec.get("process", {}).get("env", [])):
        return
    mounts = spec.setdefault("mounts", [])
    have = {m.get("destination") for m in mounts}
    for src, dest in (("libcuda.so.1", LIB_DIR + "/libcuda.so.1"),
                      ("libnvidia-ml.so.1", LIB_DIR + "/libnvidia-ml.so.1"), ("fakesmi", SMI_DEST)):
        if dest not in have:
            mounts.append({"destination": dest, "type": "bind",
                           "source": os.path.join(driver_dir, src),
                           "options": ["bind", "ro", "nosuid", "nodev"]})
    if GPU_DEST not in have:
        mounts.append({"destination": GPU_DEST, "type": "bind", "source": gpu_dir,
                       "options": ["bind", "rw", "nosuid", "nodev", "noexec"]})
    env = [e for e in spec["process"].get("env", [])
           if not e.startswith(("FAKECUDA_POOL=", "FAKECUDA_MEM_MIB="))]
    spec["process"]["env"] = env + [f"FAKECUDA_POOL={GPU_DEST}/pool", f"FAKECUDA_MEM_MIB={mem_mib}"]
    if criu_config:
        spec.setdefault("annotations", {})["org.criu.config"] = criu_config
    tmp = path + ".gcr-tmp"
    with open(tmp, "w") as f:
        json.dump(spec, f)
    os.rename(tmp, path)


def main(argv):
    driver_dir, gpu_dir, mem_mib, runc, criu_config = None, None, None, "runc", None
    while argv and argv[0] != "--":
        if argv[0] == "--driver-dir" and len(argv) > 1:
            driver_dir, argv = argv[1], argv[2:]
        elif argv[0] == "--gpu-dir" and len(argv) > 1:
            gpu_dir, argv = argv[1], argv[2:]
        elif argv[0] == "--mem-mib" and len(argv) > 1:
            mem_mib, argv = argv[1], argv[2:]
        elif argv[0] == "--criu-config" and len(argv) > 1:
            criu_config, argv = argv[1], argv[2:]
        elif argv[0] == "--runc" and len(argv) > 1:
            runc, argv = argv[1], argv[2:]
        else:
            sys.exit("nvidia-runtime-standin: usage: --driver-dir DIR --gpu-dir DIR --mem-mib N "
                     "[--runc PATH] -- RUNC-ARGS")
    args = argv[1:]
    if driver_dir is None or gpu_dir is None or mem_mib is None:
        sys.exit("nvidia-runtime-standin: --driver-dir, --gpu-dir and --mem-mib are required")
    if ("create" in args or "restore" in args) and "--bundle" in args:
        i = args.index("--bundle")
        if i + 1 < len(args):
            inject(args[i + 1], driver_dir, gpu_dir, mem_mib, criu_config)
    os.execvp(runc, [runc] + args)


if __name__ == "__main__":
    main(sys.argv[1:])
