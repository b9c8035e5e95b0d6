#!/usr/bin/env python3
"""The GPU node's workload (test tooling): a model server generating greedily in a loop, as a
real one serves requests, printing a digest of each iteration's tokens; and the pieces around it.

    llm_serve.py make  --dir DIR [--backend torch|standin] [--seed N] [--size 8b|tiny]
    llm_serve.py serve --dir DIR [--backend ...] [--tokens T] [--prompt-len P] [--period K]
                       [--max-iters N] [--check-every C] [--pace-s S]
    llm_serve.py alloc [--backend ...] --over-free-mib M --hold-s S

make (once per machine, on the GPU): a Llama-architecture model of about 16 GB in bfloat16 (the
shape of Llama 3 8B: 32 layers, hidden 4096, 8 KV heads, vocabulary 128256), its weights random
from a fixed seed, saved with save_pretrained as safetensors in DIR, as a downloaded model lies on
a node (no network there). serve: loads it with from_pretrained from DIR (a cold start is a real
one), then for iteration i = 0, 1, ... greedily generates T tokens (its own loop over the model's
forward with the KV cache) after a prompt of P token ids drawn from a generator seeded with
(seed, i mod K), and prints

    ITER i d=<16 hex: sha256 of the tokens> chain=<16 hex: sha256(previous chain + d)> t0=<first token> t1=<last token>

(times: seconds since the epoch). An uninterrupted run's first K digests are therefore every
iteration's expected digest, and the chain proves that none was skipped or repeated: a process
suspended, resumed, imaged or restored anywhere in its loop must print exactly what an
uninterrupted one prints. Every C iterations it also sums every weight's bits on the GPU
(`WCHECK i ok|FAIL wsum=...`, against the sum taken right after loading). alloc (overcommit's
high-priority pod): allocates the GPU's free memory plus M MiB in one tensor, fills it from a
seed, prints `ALLOC bytes=... free=... ms=<how long the allocation took>`, holds it S seconds,
checks it and exits (`RESULT ok`).

--backend standin runs the same protocol on the stand-in driver (tests/fakecuda, through
ctypes: no PyTorch on the CI machine): the "weights" are random bytes in DIR/weights.bin copied
to the (host-memory) device, and each token is a hash of device bytes the previous token points
at, so a restored device copy that differs by one byte changes the digests.
"""
import argparse
import ctypes
import hashlib
import json
import os
import signal
import struct
import sys
import time

SIZES = {
    # Llama 3 8B's shape: 8.03e9 parameters, 16.06 GB in bfloat16.
    "8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
               rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
    # A few hundred MiB, to try the script anywhere.
    "tiny": dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                 num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=2048,
                 rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False),
}
STANDIN_MIB = {"8b": 192, "tiny": 32}
STANDIN_VOCAB = 32000


def out(line):
    print(line, flush=True)


def hx(b):
    return hashlib.sha256(b).hexdigest()[:16]


# ---- the torch backend ----

def torch_make(args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**SIZES[args.size], bos_token_id=1, eos_token_id=2)
    t0 = time.time()
    torch.manual_seed(args.seed)
    torch.set_default_dtype(torch.bfloat16)
    try:  # initialised on the GPU: seconds, where the CPU takes minutes
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg)
    except Exception as e:  # noqa: BLE001 (whatever refuses it, the CPU can do it)
        out(f"NOTE init on the GPU refused ({type(e).__name__}: {e}); on the CPU")
        torch.manual_seed(args.seed)
        model = LlamaForCausalLM(cfg)
    model.eval()
    n = sum(p.numel() for p in model.parameters())
    t1 = time.time()
    os.makedirs(args.dir, exist_ok=True)
    model.save_pretrained(args.dir, safe_serialization=True, max_shard_size="4GB")
    t2 = time.time()
    size = sum(os.path.getsize(os.path.join(args.dir, f)) for f in os.listdir(args.dir))
    out(f"MADE dir={args.dir} params={n} bytes={size} init_s={t1 - t0:.1f} save_s={t2 - t1:.1f}")


def torch_load(args):
    import torch
    from transformers import LlamaForCausalLM
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    # Straight to the GPU (device_map), as a server loads; transformers versions that want the
    # accelerate package for that get the model loaded on the CPU and moved.
    try:
        try:
            model = LlamaForCausalLM.from_pretrained(args.dir, dtype=torch.bfloat16, device_map="cuda")
        except TypeError:  # transformers before the dtype keyword
            model = LlamaForCausalLM.from_pretrained(args.dir, torch_dtype=torch.bfloat16, device_map="cuda")
    except (ImportError, ValueError, NotImplementedError) as e:
        out(f"NOTE from_pretrained with device_map refused ({type(e).__name__}: {str(e)[:200]}); loading on the CPU")
        model = LlamaForCausalLM.from_pretrained(args.dir, dtype=torch.bfloat16).to("cuda")
    model.eval()
    return model


def torch_wsum(model):
    import torch
    s = 0
    with torch.inference_mode():
        for p in model.parameters():
            s += int(torch.sum(p.view(torch.int16), dtype=torch.int64))
    return s


def torch_generate(model, prompt_ids, tokens):
    """Greedy decoding: one forward over the prompt, then one per token with the KV cache.
    Returns (token ids, time of the first token, time of the last)."""
    import torch
    ids = torch.tensor([prompt_ids], device="cuda")
    got = []
    t_first = None
    with torch.inference_mode():
        o = model(input_ids=ids, use_cache=True)
        for k in range(tokens):
            nxt = o.logits[:, -1, :].argmax(dim=-1, keepdim=True)
            got.append(int(nxt.item()))
            if t_first is None:
                t_first = time.time()
            if k + 1 < tokens:
                o = model(input_ids=nxt, past_key_values=o.past_key_values, use_cache=True)
    return got, t_first, time.time()


# ---- the stand-in backend (tests/fakecuda through ctypes) ----

class Standin:
    def __init__(self):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.check(self.cu.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(self.cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self.check(self.cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        self.check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    @staticmethod
    def check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUresult {rc}")

    def mem_info(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check(self.cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo_v2")
        return free.value, total.value

    def alloc(self, n):
        p = ctypes.c_uint64()
        self.check(self.cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), f"cuMemAlloc_v2({n})")
        return p.value

    def put(self, dptr, data):
        self.check(self.cu.cuMemcpyHtoD_v2(ctypes.c_uint64(dptr), data, ctypes.c_size_t(len(data))), "cuMemcpyHtoD_v2")

    def get(self, dptr, n):
        b = ctypes.create_string_buffer(n)
        self.check(self.cu.cuMemcpyDtoH_v2(b, ctypes.c_uint64(dptr), ctypes.c_size_t(n)), "cuMemcpyDtoH_v2")
        return b.raw


def standin_make(args):
    import random
    rnd = random.Random(args.seed)
    n = STANDIN_MIB[args.size] << 20
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "weights.bin"), "wb") as f:
        for _ in range(n >> 20):
            f.write(rnd.randbytes(1 << 20))
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump({"standin": True, "bytes": n, "seed": args.seed}, f)
    out(f"MADE dir={args.dir} params={n} bytes={n} init_s=0 save_s=0")


class StandinModel:
    KV = 64 << 10  # below the shim's 2 MiB: left to the driver, as a real process's small buffers

    def __init__(self, args):
        self.s = Standin()
        self.kv = self.s.alloc(self.KV)
        path = os.path.join(args.dir, "weights.bin")
        self.n = os.path.getsize(path)
        self.dptr = self.s.alloc(self.n)
        with open(path, "rb") as f:  # piece by piece: the host copy is not kept
            for off in range(0, self.n, 16 << 20):
                self.s.put(self.dptr + off, f.read(16 << 20))

    def wsum(self):
        h = hashlib.sha256()
        for off in range(0, self.n, 16 << 20):
            h.update(self.s.get(self.dptr + off, min(16 << 20, self.n - off)))
        return int(h.hexdigest()[:15], 16)

    def generate(self, prompt_ids, tokens):
        """Each token hashes the previous one, 64 weight bytes it points at and the iteration's
        "KV cache" so far (a small device buffer, cleared per iteration, one 64-byte slot written
        per token): weights and cache must both come back exact from a suspend mid-iteration."""
        prev = hashlib.sha256(struct.pack(f"<{len(prompt_ids)}I", *prompt_ids)).digest()
        self.s.put(self.kv, bytes(self.KV))
        got, t_first = [], None
        for k in range(tokens):
            off = int.from_bytes(prev[:8], "little") % (self.n - 64)
            slot = (k * 64) % self.KV
            prev = hashlib.sha256(prev + self.s.get(self.dptr + off, 64) + self.s.get(self.kv, slot + 64)).digest()
            self.s.put(self.kv + slot, prev + prev)
            got.append(int.from_bytes(prev[:4], "little") % STANDIN_VOCAB)
            if t_first is None:
                t_first = time.time()
        return got, t_first, time.time()


# ---- commands ----

def prompt_for(seed, i, period, length, vocab):
    import random
    rnd = random.Random(seed * 1000003 + i % period)
    return [rnd.randrange(3, vocab) for _ in range(length)]


def serve(args):
    t0 = time.time()
    if args.backend == "torch":
        import torch
        model = torch_load(args)
        vocab = model.config.vocab_size
        wsum = torch_wsum(model)
        gpu_bytes = torch.cuda.memory_allocated()
        gen = lambda p: torch_generate(model, p, args.tokens)  # noqa: E731
        check = lambda: torch_wsum(model)  # noqa: E731
    else:
        model = StandinModel(args)
        vocab = STANDIN_VOCAB
        wsum = model.wsum()
        gpu_bytes = model.n
        gen = lambda p: model.generate(p, args.tokens)  # noqa: E731
        check = model.wsum
    out(f"LOADED pid={os.getpid()} uid={os.getuid()} load_s={time.time() - t0:.2f} wsum={wsum} "
        f"gpu_bytes={gpu_bytes} backend={args.backend}")
    chain = b""
    i = 0
    while args.max_iters <= 0 or i < args.max_iters:
        toks, ta, tb = gen(prompt_for(args.seed, i, args.period, args.prompt_len, vocab))
        d = hashlib.sha256(struct.pack(f"<{len(toks)}I", *toks)).hexdigest()[:16]
        chain = hashlib.sha256(chain + d.encode()).digest()
        out(f"ITER {i} d={d} chain={chain.hex()[:16]} t0={ta:.3f} t1={tb:.3f}")
        if args.check_every > 0 and (i + 1) % args.check_every == 0:
            w = check()
            out(f"WCHECK {i} {'ok' if w == wsum else 'FAIL'} wsum={w}")
        if args.pace_s > 0:
            time.sleep(args.pace_s)
        i += 1
    out("DONE")


def alloc(args):
    over = args.over_free_mib << 20
    if args.backend == "torch":
        import torch
        torch.cuda.init()
        free, total = torch.cuda.mem_get_info()
        n = free + over
        t0 = time.time()
        x = torch.empty(n, dtype=torch.uint8, device="cuda")
        ms = (time.time() - t0) * 1000
        g = torch.Generator(device="cuda").manual_seed(args.seed)
        x.random_(0, 256, generator=g)

        def digest():  # a sum in pieces: summing as int64 at once would make an 8x copy of x
            return sum(int(x[i:i + (64 << 20)].sum(dtype=torch.int64)) for i in range(0, n, 64 << 20))
        s0 = digest()
        out(f"ALLOC bytes={n} free={free} total={total} ms={ms:.1f} t={time.time():.3f}")
        time.sleep(args.hold_s)
        ok = digest() == s0
    else:
        s = Standin()
        s.alloc(64 << 10)  # a context's first allocation, as a real process has made some by now
        free, total = s.mem_info()
        n = free + over
        t0 = time.time()
        p = s.alloc(n)
        ms = (time.time() - t0) * 1000
        import random
        pat = random.Random(args.seed).randbytes(1 << 20)
        for off in range(0, n - (1 << 20) + 1, 1 << 20):
            s.put(p + off, pat)
        out(f"ALLOC bytes={n} free={free} total={total} ms={ms:.1f} t={time.time():.3f}")
        time.sleep(args.hold_s)
        ok = all(s.get(p + off, 1 << 20) == pat for off in range(0, n - (1 << 20) + 1, 1 << 20))
    out(f"RESULT ok t={time.time():.3f}" if ok else f"RESULT FAIL: the allocation's data changed t={time.time():.3f}")
    return 0 if ok else 1


def on_term(signum, frame):
    out(f"TERM t={time.time():.3f}")
    sys.exit(0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["make", "serve", "alloc"])
    ap.add_argument("--backend", choices=["torch", "standin"], default="torch")
    ap.add_argument("--dir", default="/models/llama")
    ap.add_argument("--seed", type=int, default=20261127)
    ap.add_argument("--size", choices=sorted(SIZES), default="8b")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--period", type=int, default=16)
    ap.add_argument("--max-iters", type=int, default=0, help="0: forever")
    ap.add_argument("--check-every", type=int, default=16)
    ap.add_argument("--pace-s", type=float, default=0.0)
    ap.add_argument("--over-free-mib", type=int, default=4096)
    ap.add_argument("--hold-s", type=float, default=20.0)
    args = ap.parse_args(argv)
    # A server ends on SIGTERM, as the kubelet asks at a pod's deletion. Without a handler the
    # container's first process ignores it (PID namespace init) and lives out the grace period:
    # kubectl drain timed out on it in the rehearsal's eviction.
    signal.signal(signal.SIGTERM, on_term)
    try:
        if args.command == "make":
            (torch_make if args.backend == "torch" else standin_make)(args)
        elif args.command == "serve":
            serve(args)
        else:
            return alloc(args)
    except Exception as e:  # one line for the scenarios to quote, then the traceback
        out(f"ERROR {type(e).__name__}: {e}")
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
