#!/usr/bin/env python3
"""runc for the GPU node's rehearsal on the stand-in driver (test tooling; run.sh --standin).

    standin_runc.py RUNC CRIU-CONFIG RUNC-ARGS...

The stand-in driver (tests/fakecuda) holds an open-file-description lock on its pool slot while a
process uses it, which CRIU dumps and restores only when told (--file-locks); its checkpoint drops
it (the real driver's closes its device files), so this matters only for a process dumped without
the driver's checkpoint. runc passes CRIU the configuration
file the annotation org.criu.config names, so at `create` and `restore` of a container that uses
the stand-in GPU (its environment has FAKECUDA_POOL, which the stand-in's CDI spec sets) this adds
the annotation to the bundle's config.json, as the CI test bed's stand-in runtime does
(tests/k8s/node/nvidia-runtime-standin.py), then runs runc. NVIDIA's container runtime calls this
in runc's place; on the GPU machine it calls runc itself.
"""
import json
import os
import sys


def main(argv):
    runc, criu_config, args = argv[0], argv[1], argv[2:]
    if ("create" in args or "restore" in args) and "--bundle" in args:
        i = args.index("--bundle")
        path = os.path.join(args[i + 1], "config.json") if i + 1 < len(args) else None
        if path and os.path.exists(path):
            with open(path) as f:
                spec = json.load(f)
            if any(e.startswith("FAKECUDA_POOL=") for e in spec.get("process", {}).get("env", [])):
                spec.setdefault("annotations", {})["org.criu.config"] = criu_config
                with open(path + ".gcr-tmp", "w") as f:
                    json.dump(spec, f)
                os.rename(path + ".gcr-tmp", path)
    os.execv(runc, [runc] + args)


if __name__ == "__main__":
    main(sys.argv[1:])
