set -u; export LD_LIBRARY_PATH=$PWD/.gpubuild; D=$(mktemp -d); export GCR_SOCKET_DIR=$D
nvcc -fatbin -arch=native -o $D/k.fatbin tests/progs/gcr_kernels.cu || exit 1
mkfifo $D/in; exec 5<>$D/in
exec 3< <(LD_PRELOAD=$PWD/.gpubuild/libgcr.so exec .gpubuild/gcr-testprog --mib 4096 --buffers 4 --iters 5 --wait --module $D/k.fatbin 2>&1 <$D/in)
while read -r -t 120 line <&3; do echo "$line"; case $line in READY*) break;; esac; done; pid=${line#READY pid=}; pid=${pid%% *}
for i in 1 2 3 4 5 6; do .gpubuild/gcrctl --json suspend $pid >> $OUT/room.jsonl; .gpubuild/gcrctl --json resume $pid >> $OUT/room.jsonl; done
kill $pid; python3 - <<'PY'
import json,os
rs=[json.loads(l) for l in open(os.environ["OUT"]+"/room.jsonl")]
for r in rs:
    print(r.get("op"), r.get("ok"), "ms:", {k: r.get("ms",{}).get(k) for k in ("total","room","restore","data","checkpoint") if isinstance(r.get("ms"),dict)})
PY
