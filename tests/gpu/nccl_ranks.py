# tests/gpu/nccl_ranks.py: one rank of a PyTorch group that communicates through NCCL
# (torch.distributed, one process per GPU), for the group suspend's GPU tests and benchmark.
"""Two workloads, both deterministic, so a run suspended and resumed any number of times must print
the DIGEST of one that was not:

--mode allreduce: every step each rank updates an int64 tensor with an integer recurrence and
  all-reduces it (sum; exact in any order), then all-reduces a float32 tensor (bit-exact only if
  NCCL reduces in the same order after its communicators were made again), and holds --hold-gib
  of patterned int32 memory checked at the end.
--mode tp: a tensor-parallel inference loop: --layers pairs of column-parallel (h x 4h/N) and
  row-parallel (4h/N x h) bf16 linear layers (the row-parallel output all-reduced), seeded weights
  of --weights-gib per rank, greedy decoding of --batch sequences (next token = argmax of the
  logits against a replicated embedding); DIGEST = sha256 of every step's tokens and the final
  activations.

Rendezvous: MASTER_ADDR/MASTER_PORT, RANK, WORLD_SIZE (set by the test), device = RANK %
GPUs. Protocol: "READY pid=P rank=R bytes=B"; with --wait the stdin line "go"; "STEP k" after step
k (its collectives done); "DIGEST hex"; "DONE"; with --wait then the stdin line "exit". A failure
prints "ERROR <what>" (then, with --wait, waits for "exit") and exits 3.
"""

import argparse
import hashlib
import os
import sys
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["allreduce", "tp"], default="allreduce")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--pace-ms", type=float, default=0.0, help="sleep after each step (ms)")
    ap.add_argument("--wait", action="store_true", help="wait for stdin 'go' and 'exit'")
    ap.add_argument("--hold-gib", type=float, default=1.0, help="allreduce: patterned memory held (GiB)")
    ap.add_argument("--weights-gib", type=float, default=8.0, help="tp: weights per rank (GiB)")
    ap.add_argument("--hidden", type=int, default=8192, help="tp: model width")
    ap.add_argument("--batch", type=int, default=8, help="tp: sequences decoded at once")
    ap.add_argument("--vocab", type=int, default=32000, help="tp: vocabulary")
    ap.add_argument("--elems", type=int, default=1 << 24, help="allreduce: elements per tensor")
    ap.add_argument("--timeout-s", type=float, default=600, help="the process group's NCCL timeout")
    return ap.parse_args(argv)


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def wait_for(want):
    for line in sys.stdin:
        if line.strip() == want:
            return
    sys.exit(1)


def main():
    a = parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    import datetime

    import torch
    import torch.distributed as dist

    dev = rank % torch.cuda.device_count()
    torch.cuda.set_device(dev)  # first: no context on any other GPU
    torch.use_deterministic_algorithms(True)
    device = torch.device("cuda", dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device,
                            timeout=datetime.timedelta(seconds=a.timeout_s))
    digest = hashlib.sha256()
    try:
        if a.mode == "allreduce":
            run = allreduce_setup(a, torch, device, rank, world)
        else:
            run = tp_setup(a, torch, device, rank, world)
        torch.cuda.synchronize()
        dist.barrier()
        say("READY pid=%d rank=%d bytes=%d" % (os.getpid(), rank, torch.cuda.memory_allocated(device)))
        if a.wait:
            wait_for("go")
        for k in range(a.steps):
            run.step(k, digest)
            torch.cuda.synchronize()
            say("STEP %d" % k)
            if a.pace_ms > 0:
                time.sleep(a.pace_ms / 1000.0)  # the program's own pace, not a synchronisation
        run.finish(digest)
    except Exception as e:  # noqa: BLE001 - any failure is reported on the protocol
        say("ERROR %s: %s" % (type(e).__name__, str(e).replace("\n", " ")[:300]))
        if a.wait:
            wait_for("exit")
        os._exit(3)
    say("DIGEST %s" % digest.hexdigest())
    say("DONE")
    if a.wait:
        wait_for("exit")
    dist.destroy_process_group()


class AllReduce:
    def __init__(self, a, torch, device, rank, world):
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        g = torch.Generator(device=device)
        g.manual_seed(1000 + rank)
        self.x = torch.randint(0, 1 << 31, (a.elems,), dtype=torch.int64, device=device, generator=g)
        self.f = torch.rand(a.elems // 4, dtype=torch.float32, device=device, generator=g)
        n = int(a.hold_gib * (1 << 30)) // 4
        idx = torch.arange(n, dtype=torch.int64, device=device)
        self.hold = ((idx * 2654435761 + rank) & 0x7FFFFFFF).to(torch.int32)
        self.hold_sum = int(self.hold.sum(dtype=torch.int64))
        del idx

    def step(self, k, digest):
        # An integer recurrence kept below 2^31, then summed over the ranks: exact in any order.
        self.x.mul_(1103515245).add_(12345 + k).bitwise_and_(0x7FFFFFFF)
        self.dist.all_reduce(self.x)
        self.x.bitwise_and_(0x7FFFFFFF)
        self.f.mul_(0.5).add_(k % 7)
        self.dist.all_reduce(self.f)
        if k % 10 == 0:
            digest.update(self.x[:4096].cpu().numpy().tobytes())

    def finish(self, digest):
        digest.update(self.x.cpu().numpy().tobytes())
        digest.update(self.f.cpu().numpy().tobytes())
        if int(self.hold.sum(dtype=self.torch.int64)) != self.hold_sum:
            raise RuntimeError("held memory changed")


def allreduce_setup(a, torch, device, rank, world):
    return AllReduce(a, torch, device, rank, world)


class TensorParallel:
    """Column-parallel W1 (h x 4h/N) then row-parallel W2 (4h/N x h), all-reduced, per layer."""

    def __init__(self, a, torch, device, rank, world):
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        h, ff = a.hidden, 4 * a.hidden // world
        per_layer = 2 * h * ff * 2  # bytes of one layer's two shards, bf16
        self.layers = max(1, int(a.weights_gib * (1 << 30)) // per_layer)
        g = torch.Generator(device=device)
        g.manual_seed(4242 + rank)
        scale = 1.0 / (h ** 0.5)
        self.w1 = [torch.randn(h, ff, dtype=torch.bfloat16, device=device, generator=g) * scale
                   for _ in range(self.layers)]
        self.w2 = [torch.randn(ff, h, dtype=torch.bfloat16, device=device, generator=g) * (1.0 / (ff * world) ** 0.5)
                   for _ in range(self.layers)]
        ge = torch.Generator(device=device)
        ge.manual_seed(7)  # the same embedding on every rank
        self.emb = torch.randn(a.vocab, h, dtype=torch.bfloat16, device=device, generator=ge)
        self.tokens = torch.arange(a.batch, dtype=torch.int64, device=device) * 97 % a.vocab
        self.x = None

    def step(self, k, digest):
        t, F = self.torch, self.torch.nn.functional
        x = self.emb[self.tokens]
        for w1, w2 in zip(self.w1, self.w2):
            y = F.gelu(x @ w1)
            z = y @ w2
            self.dist.all_reduce(z)
            x = F.layer_norm(x + z, (x.shape[-1],))
        logits = (x @ self.emb.t()).float()
        self.tokens = t.argmax(logits, dim=-1)
        self.x = x
        digest.update(self.tokens.cpu().numpy().tobytes())

    def finish(self, digest):
        if self.x is not None:
            digest.update(self.x.float().cpu().numpy().tobytes())


def tp_setup(a, torch, device, rank, world):
    return TensorParallel(a, torch, device, rank, world)


if __name__ == "__main__":
    main()
