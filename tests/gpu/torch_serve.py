# tests/gpu/torch_serve.py: deterministic PyTorch inference on a small seeded GPT-style model (no
# downloads), the framework workload GCR must suspend and resume bit-exact, and its step-time benchmark.
"""Protocol (as tests/progs/gcr-testprog): "READY pid=<pid> bytes=<n>"; with --wait a stdin
line "go"; "STEP <n>" per step; "DONE"; with --wait a stdin line "check"; then
"DIGEST <sha256 of every step's output bytes and the final state>" and "RESULT ok" (exit 0),
"RESULT FAIL ..." (exit 1) or "ERROR ..." (exit 2).

--bench-steps N instead times N steady-state steps after a warm-up and prints
"STEPTIME_MS <mean> <p50> <p90>" (each step: input H2D, forward, next-token D2H); --bench-blocks
prints BENCH_READY after the warm-up and times blocks of steps on request (stdin "block N" ->
"BLOCK_MS <mean> <p50> <p90>", "end" to finish), for two processes that take turns.

Serving with state (incremental suspend, issue 5): --weights-gib W holds W GiB of read-only
patterned "weights", --state-gib S an int32 state every step updates in place (--state-update
all: every element, every step; ring: one 2 MiB slot per step, as a KV cache fills). With
--commands (implies --wait), after "go" the steps run only when asked: stdin "steps N" runs N
more and prints "STEPS total=<n>", until "check"; so a run with suspends in between does the
same steps as one without. The DIGEST then also covers the state; the weights are checked exactly.

Cold start (issue 18): --save-weights F with --weights-gib W writes those patterned weights as a
safetensors file F (written chunk by chunk, never all in host memory; CUDA is not touched), prints
"SAVED bytes=<n> tensors=<k> s=<seconds>" and exits; --weights-file F instead of --weights-gib loads
them from F straight to the GPU at start (safetensors' safe_open, one tensor at a time), then serves
as with --weights-gib: READY once they are on the GPU, checked exactly at the end.
"""

import argparse
import ctypes
import gc
import hashlib
import math
import os
import sys
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--alloc", choices=["default", "expandable", "async"], default="default",
                    help="PyTorch allocator: the caching allocator (default), with expandable_segments:True "
                         "(expandable), or the backend:cudaMallocAsync allocator (async: stream-ordered "
                         "cudaMallocAsync/cudaFreeAsync per tensor, issue 19)")
    ap.add_argument("--train", action="store_true",
                    help="train instead of serving: each step a forward, cross-entropy loss, backward and "
                         "SGD-momentum update in float32 (gradients set to None: allocation-heavy); the "
                         "DIGEST then also covers every parameter after the last step")
    ap.add_argument("--graphs", action="store_true", help="capture the forward in a CUDA graph and replay it")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--extra-gib", type=float, default=0.0,
                    help="extra GPU memory held as patterned int32 tensors, checked at the end (GiB)")
    ap.add_argument("--wait", action="store_true", help="wait for stdin 'go' and 'check'")
    ap.add_argument("--commands", action="store_true", help="steps only on stdin 'steps N' (implies --wait)")
    ap.add_argument("--weights-gib", type=float, default=0.0, help="read-only patterned weights (GiB)")
    ap.add_argument("--save-weights", metavar="FILE",
                    help="write the --weights-gib weights to FILE as safetensors and exit (no CUDA)")
    ap.add_argument("--weights-file", metavar="FILE",
                    help="load the weights from this safetensors file (as --save-weights wrote it) to the GPU")
    ap.add_argument("--state-gib", type=float, default=0.0, help="int32 state updated in place each step (GiB)")
    ap.add_argument("--state-update", choices=["all", "ring"], default="all")
    ap.add_argument("--bench-steps", type=int, default=0, help="time this many steps instead (no digest)")
    ap.add_argument("--bench-blocks", action="store_true",
                    help="after the warm-up print BENCH_READY, then time the steps stdin asks for: "
                         "'block N' -> 'BLOCK_MS mean p50 p90', until 'end'")
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps before --bench-steps")
    ap.add_argument("--warmup-s", type=float, default=0.0,
                    help="keep warming up until this many seconds passed (start-up work of the process, "
                         "e.g. the shim's background staging, is then over before timing)")
    ap.add_argument("--pin", action="store_true",
                    help="--bench-steps/--bench-blocks: run the steps on one CPU (the first this process may use): a Python "
                         "loop that migrates between cores measures the migrations, not the step")
    ap.add_argument("--pace-ms", type=float, default=0.0,
                    help="sleep after each step (ms) so a run lasts long enough to be suspended mid-way")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--ff-mult", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu only to test this script")
    return ap.parse_args(argv)


ARGS = parse_args()
# Both must be set before torch (and CUDA) initialise.
if ARGS.alloc == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
elif ARGS.alloc == "async":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def info(line):
    sys.stderr.write("torch_serve: " + line + "\n")
    sys.stderr.flush()


class Block(nn.Module):
    """Pre-LayerNorm transformer block; attention written out with matmuls so that it is
    deterministic and capturable whatever SDPA backends this build has."""

    def __init__(self, d, heads, ff):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ff)
        self.fc2 = nn.Linear(ff, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h)) + mask
        y = att.softmax(dim=-1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok = nn.Embedding(a.vocab, a.d_model)
        self.pos = nn.Embedding(a.seq, a.d_model)
        self.blocks = nn.ModuleList(Block(a.d_model, a.heads, a.ff_mult * a.d_model) for _ in range(a.layers))
        self.ln_f = nn.LayerNorm(a.d_model)
        self.head = nn.Linear(a.d_model, a.vocab, bias=False)
        self.register_buffer("mask", torch.full((a.seq, a.seq), float("-inf")).triu(1), persistent=False)
        self.register_buffer("positions", torch.arange(a.seq), persistent=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(self.positions[: idx.shape[1]])
        for blk in self.blocks:
            x = blk(x, self.mask)
        return self.head(self.ln_f(x))


def tensor_bytes(t):
    """The raw bytes of a tensor, copied to the host (no numpy needed)."""
    c = t.detach().contiguous().cpu()
    return ctypes.string_at(c.data_ptr(), c.numel() * c.element_size())


def step_input(a, step):
    """Token ids for a step: fixed by (seed, step), generated on the CPU."""
    g = torch.Generator().manual_seed(a.seed * 1000003 + step)
    return torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)


class Extra:
    """--extra-gib: patterned int32 chunks (value i ^ key(chunk)) checked exactly at the end."""

    CHUNK = 256 << 20  # bytes

    def __init__(self, gib, dev, loaded=()):
        self.chunks = list(loaded)  # --weights-file: chunks 0.. came from the file
        j = len(self.chunks)
        for n in self.sizes(gib):
            self.chunks.append(self.expected(j, n, dev))
            j += 1

    @classmethod
    def sizes(cls, gib):
        """Elements of each chunk for gib GiB."""
        out = []
        left = int(gib * (1 << 30))
        while left > 0:
            n = min(cls.CHUNK, left) // 4
            if n == 0:
                break
            out.append(n)
            left -= n * 4
        return out

    @staticmethod
    def expected(j, n, dev):
        return torch.arange(n, dtype=torch.int32, device=dev).bitwise_xor_((j * 0x9E3779B1) & 0x7FFFFFFF)

    def bad_chunks(self):
        bad = []
        for j, c in enumerate(self.chunks):
            if not torch.equal(c, self.expected(j, c.numel(), c.device)):
                bad.append(j)
        return bad


class State:
    """--state-gib: an int32 tensor of 2 MiB slots that every step changes in place (all:
    every element gets an odd increment, which never leaves a value unchanged; ring: the
    step's slot does), the increment derived from the step's output on the GPU (no sync)."""

    SLOT = 2 << 20  # bytes

    def __init__(self, gib, mode, dev):
        slots = int(gib * (1 << 30)) // self.SLOT
        self.mode = mode
        self.t = None
        if slots > 0:
            self.t = torch.empty((slots, self.SLOT // 4), dtype=torch.int32, device=dev)
            flat, block = self.t.view(-1), 16 << 20  # elements per fill: small temporaries
            for i in range(0, flat.numel(), block):
                n = min(block, flat.numel() - i)
                flat[i:i + n] = torch.arange(i, i + n, dtype=torch.int32, device=dev).bitwise_xor_(0x5BD1E995)

    def bytes(self):
        return 0 if self.t is None else self.t.numel() * 4

    def update(self, step, out):
        if self.t is None:
            return
        inc = (out.argmax(dim=-1).sum().to(torch.int32) * 2 + 1 + step * 2)
        if self.mode == "all":
            self.t.add_(inc)
        else:
            self.t[step % self.t.shape[0]].add_(inc)


def weight_name(j):
    return "w%06d" % j


def save_weights(a):
    """--save-weights: the safetensors layout (8-byte little-endian header length, a JSON header
    naming each tensor's dtype, shape and byte range, the data back to back), written one chunk at
    a time under a temporary name, fsynced, renamed."""
    import json
    import struct

    t0 = time.perf_counter()
    sizes = Extra.sizes(a.weights_gib)
    if not sizes:
        raise RuntimeError("--save-weights needs --weights-gib > 0")
    header, off = {"__metadata__": {"format": "pt", "writer": "gcr torch_serve"}}, 0
    for j, n in enumerate(sizes):
        header[weight_name(j)] = {"dtype": "I32", "shape": [n], "data_offsets": [off, off + n * 4]}
        off += n * 4
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)  # the data starts 8-byte aligned
    tmp = "%s.tmp.%d" % (a.save_weights, os.getpid())
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for j, n in enumerate(sizes):
            f.write(Extra.expected(j, n, torch.device("cpu")).numpy().data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, a.save_weights)
    say("SAVED bytes=%d tensors=%d s=%.3f" % (off, len(sizes), time.perf_counter() - t0))
    return 0


def load_weights(path, dev):
    """--weights-file: every tensor of the file, in name order, straight to dev; the file is
    closed (and unmapped) on return, so a checkpoint of this process holds no mapping of it."""
    from safetensors import safe_open

    t0 = time.perf_counter()
    chunks = []
    with safe_open(path, framework="pt", device=str(dev)) as f:
        names = sorted(f.keys())
        if names != [weight_name(j) for j in range(len(names))]:
            raise RuntimeError("%s: tensors %s... are not the w000000.. this script writes" % (path, names[:3]))
        for k in names:
            t = f.get_tensor(k)
            if t.dtype != torch.int32 or t.dim() != 1:
                raise RuntimeError("%s: %s is %s %s, not 1-D int32" % (path, k, t.dtype, tuple(t.shape)))
            chunks.append(t)
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    info("weights: %d tensors, %d bytes from %s in %.3f s" % (
        len(chunks), sum(c.numel() * 4 for c in chunks), path, time.perf_counter() - t0))
    return chunks


def build(a, dev, dtype):
    torch.manual_seed(a.seed)
    model = TinyGPT(a)  # initialised on the CPU: identical weights in every process
    if a.train:
        return model.to(device=dev).train()  # float32: updates stay finite step after step
    model = model.to(device=dev, dtype=dtype).eval()
    model.mask = model.mask.to(dtype)
    return model


class Trainer:
    """--train: one optimisation step per call on a static input buffer; returns the step's
    last-position logits (before the update), detached, as the serving Runner does."""

    def __init__(self, a, model, dev):
        self.model = model
        self.vocab = a.vocab
        self.static_in = torch.zeros(a.batch, a.seq, dtype=torch.long, device=dev)
        self.opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=False)

    def step(self, tokens):
        self.static_in.copy_(tokens, non_blocking=True)
        logits = self.model(self.static_in)
        # Next-token targets: the input shifted by one (the last position predicts the first).
        loss = F.cross_entropy(logits.view(-1, self.vocab), self.static_in.roll(-1, dims=1).view(-1))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return logits.detach()

    def state_bytes(self):
        return b"".join(tensor_bytes(p) for p in self.model.parameters())


class Runner:
    """One forward step, eager or as a CUDA graph replay, on a static input buffer."""

    def __init__(self, a, model, dev):
        self.model = model
        self.static_in = torch.zeros(a.batch, a.seq, dtype=torch.long, device=dev)
        self.graph = None
        if a.graphs:
            if dev.type != "cuda":
                raise RuntimeError("--graphs needs --device cuda")
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    model(self.static_in)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.static_out = model(self.static_in)
        else:
            model(self.static_in)  # warm-up: cuBLAS handles, kernels loaded

    def step(self, tokens):
        self.static_in.copy_(tokens, non_blocking=True)
        if self.graph is not None:
            self.graph.replay()
            return self.static_out
        return self.model(self.static_in)


def wait_stdin(word):
    while True:
        line = sys.stdin.readline()
        if not line:
            raise RuntimeError("stdin closed before %r" % word)
        if line.strip() == word:
            return


def percentile(sorted_vals, q):
    i = min(len(sorted_vals) - 1, max(0, int(round(q * (len(sorted_vals) - 1)))))
    return sorted_vals[i]


def bench(a, runner, dev):
    inputs = [step_input(a, s) for s in range(8)]
    if dev.type == "cuda":
        inputs = [t.pin_memory() for t in inputs]

    def one(s):
        out = runner.step(inputs[s % len(inputs)])
        return out[:, -1, :].argmax(dim=-1).cpu()  # D2H, synchronises the stream

    if a.pin:
        # Pins this (the main) thread only; the driver's threads, started already, keep the rest.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    t_warm = time.perf_counter()
    s = 0
    while s < a.warmup or time.perf_counter() - t_warm < a.warmup_s:
        one(s)
        s += 1
    if dev.type == "cuda":
        torch.cuda.synchronize()
    # The collector would run at points that differ from process to process; with it off the
    # spread between processes is the steps' own.
    gc.collect()
    gc.disable()

    def timed(n, first):
        times = []
        for s in range(first, first + n):
            t0 = time.perf_counter()
            one(s)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1000.0)
        v = sorted(times)
        return sum(v) / len(v), percentile(v, 0.5), percentile(v, 0.9)

    if a.bench_blocks:
        # Two processes (with and without the shim) take turns, block by block, so drift of the
        # machine over seconds lands on both alike: the caller sends "block N" or "end".
        say("BENCH_READY")
        done = 0
        while True:
            line = sys.stdin.readline()
            words = line.split()
            if not line or words == ["end"]:
                break
            if len(words) != 2 or words[0] != "block" or not words[1].isdigit() or int(words[1]) < 1:
                say("ERROR unknown command %r" % line.strip())
                return 2
            say("BLOCK_MS %.4f %.4f %.4f" % timed(int(words[1]), done))
            done += int(words[1])
    else:
        say("STEPTIME_MS %.4f %.4f %.4f" % timed(a.bench_steps, 0))
    gc.enable()
    say("DONE")
    say("RESULT ok")
    return 0


def command_steps():
    """--commands: the step counts asked for on stdin ("steps N"), until "check"."""
    while True:
        line = sys.stdin.readline()
        if not line:
            raise RuntimeError("stdin closed before 'check'")
        words = line.split()
        if words == ["check"]:
            return
        if len(words) == 2 and words[0] == "steps" and words[1].isdigit():
            yield int(words[1])
        elif words:
            say("ERROR unknown command %r" % line.strip())


def serve(a, runner, dev, extra, state):
    if a.wait:
        wait_stdin("go")
    digest = hashlib.sha256()
    acc = torch.zeros(a.batch, a.vocab, dtype=torch.float32, device=dev)  # state carried across steps
    done = 0
    for n in (command_steps() if a.commands else [a.steps]):
        for s in range(done, done + n):
            out = runner.step(step_input(a, s))[:, -1, :]
            acc.mul_(0.5).add_(out.float())
            state.update(s, out)
            b = tensor_bytes(out)
            digest.update(b)
            if s == 0 and not bool(torch.isfinite(out).all()):
                info("WARNING: step 0 output has non-finite values (still deterministic, but check the model)")
            say("STEP %d" % s)
            if a.pace_ms > 0:
                time.sleep(a.pace_ms / 1000.0)
        done += n
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if a.commands:
            say("STEPS total=%d" % done)
    say("DONE")
    if a.wait and not a.commands:
        wait_stdin("check")
    digest.update(tensor_bytes(acc))
    if isinstance(runner, Trainer):
        digest.update(runner.state_bytes())
    if state.t is not None:
        digest.update(tensor_bytes(state.t))
    bad = extra.bad_chunks()
    say("DIGEST %s" % digest.hexdigest())
    if bad:
        say("RESULT FAIL extra memory differs in %d of %d chunks (first %d)" % (len(bad), len(extra.chunks), bad[0]))
        return 1
    say("RESULT ok")
    return 0


def main(a):
    if a.save_weights:
        return save_weights(a)
    if a.weights_file and a.weights_gib > 0:
        raise RuntimeError("--weights-file and --weights-gib: one or the other")
    dev = torch.device(a.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available to torch")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    if a.steps < 0 or a.bench_steps < 0 or a.d_model % a.heads:
        raise RuntimeError("bad sizes: steps >= 0, bench-steps >= 0, d-model divisible by heads")
    dtype = torch.float16 if a.dtype == "fp16" else torch.bfloat16
    if a.train and (a.graphs or a.bench_steps or a.bench_blocks):
        raise RuntimeError("--train runs alone: not with --graphs or the benchmarks")
    info("torch %s cuda %s alloc_conf=%r backend=%s graphs=%s train=%s dtype=%s" % (
        torch.__version__, torch.version.cuda, os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        torch.cuda.get_allocator_backend() if dev.type == "cuda" else "cpu", a.graphs, a.train, a.dtype))
    if a.commands:
        a.wait = True
    model = build(a, dev, dtype)
    loaded = load_weights(a.weights_file, dev) if a.weights_file else ()
    extra = Extra(a.extra_gib + a.weights_gib, dev, loaded)
    state = State(a.state_gib, a.state_update, dev)
    if dev.type == "cuda" and (a.weights_gib > 0 or a.weights_file or a.state_gib > 0):
        # Free what building them left cached, so the process holds what it uses.
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    with torch.set_grad_enabled(a.train):
        runner = Trainer(a, model, dev) if a.train else Runner(a, model, dev)
        if dev.type == "cuda":
            torch.cuda.synchronize()
            held = torch.cuda.memory_reserved()
        else:
            held = sum(p.numel() * p.element_size() for p in model.parameters())
        say("READY pid=%d bytes=%d weights=%d state=%d" % (
            os.getpid(), held, sum(c.numel() * 4 for c in extra.chunks), state.bytes()))
        if a.bench_steps > 0 or a.bench_blocks:
            return bench(a, runner, dev)
        return serve(a, runner, dev, extra, state)


if __name__ == "__main__":
    try:
        rc = main(ARGS)
    except Exception as e:  # the harness reads stdout: say what failed there too
        import traceback

        traceback.print_exc()
        say("ERROR %s: %s" % (type(e).__name__, str(e).replace("\n", " ")[:500]))
        rc = 2
    sys.stdout.flush()
    sys.exit(rc)
