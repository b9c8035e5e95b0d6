#!/usr/bin/env python3
"""The test bed's stand-in for NVIDIA's container runtime (test tooling, not product).

NVIDIA's runtime is runc plus one step: at `create`, for a container whose environment
asks for GPUs (NVIDIA_VISIBLE_DEVICES set, not "void"/"none"), it adds the driver's
libraries and tools to the container's OCI spec, then runs runc. This does the same
with the stand-in driver (tests/fakecuda: libcuda.so.1, and fakesmi in nvidia-smi's
place), so a pod with runtimeClassName "nvidia" gets a driver the way it would on a GPU
node. runc, containerd and the kubelet are the real ones; only the driver is a stand-in.

    nvidia-runtime-standin.py --driver-dir DIR [--runc PATH] -- RUNC-ARGS...
"""
import json
import os
import sys

LIB_DEST = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
SMI_DEST = "/usr/bin/fakesmi"


def wants_gpu(env):
    for e in env:
        if e.startswith("NVIDIA_VISIBLE_DEVICES="):
            return e.split("=", 1)[1] not in ("", "void", "none")
    return False


def inject(bundle, driver_dir):
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        spec = json.load(f)
    if not wants_gpu(spec.get("process", {}).get("env", [])):
        return
    mounts = spec.setdefault("mounts", [])
    have = {m.get("destination") for m in mounts}
    for src, dest in (("libcuda.so.1", LIB_DEST), ("fakesmi", SMI_DEST)):
        if dest not in have:
            mounts.append({"destination": dest, "type": "bind",
                           "source": os.path.join(driver_dir, src),
                           "options": ["bind", "ro", "nosuid", "nodev"]})
    tmp = path + ".gcr-tmp"
    with open(tmp, "w") as f:
        json.dump(spec, f)
    os.rename(tmp, path)


def main(argv):
    driver_dir, runc = None, "runc"
    while argv and argv[0] != "--":
        if argv[0] == "--driver-dir" and len(argv) > 1:
            driver_dir, argv = argv[1], argv[2:]
        elif argv[0] == "--runc" and len(argv) > 1:
            runc, argv = argv[1], argv[2:]
        else:
            sys.exit("nvidia-runtime-standin: usage: --driver-dir DIR [--runc PATH] -- RUNC-ARGS")
    args = argv[1:]
    if driver_dir is None:
        sys.exit("nvidia-runtime-standin: --driver-dir is required")
    if "create" in args and "--bundle" in args:
        i = args.index("--bundle")
        if i + 1 < len(args):
            inject(args[i + 1], driver_dir)
    os.execvp(runc, [runc] + args)


if __name__ == "__main__":
    main(sys.argv[1:])
