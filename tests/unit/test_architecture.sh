#!/bin/bash
# The rules of docs/architecture.md, checked on the source:
#  1. the #include "..." graph of shim/ (and of node-agent/, lib/) has no cycle;
#  2. no folder includes a header from a layer above it (lib <- shim, lib <- node-agent;
#     shim/core never includes a vendor backend's header except through shim_gpu.h's ops, nor
#     NCCL's except through shim_comm.h's);
#  3. a process-state string is compared in one place only (lib/gcr_cr.c, gcr_cr_state), and
#     so is a Checkpoint's or Restore's phase (node-agent/kube/agent_phase.c, agent_phase_of);
#  4. vendor-neutral code never asks which backend it runs on (no "== &shim_cuda_ops");
#  5. node-agent/'s folders point one way: msg/ (wire formats) < kube/ (the API, pods) < node/
#     (the node's services) < the roles (controller/, scaler/, overcommit/, evict/,
#     deviceplugin/), which never include each other < daemon/ (the entry and its wiring);
#  6. docs/architecture.md's module table links every .c file of shim/, lib/ and node-agent/, and
#     every .proto file (whose protobuf-c code, *.pb-c.c, the build makes: an in-tree build's copy
#     has no row);
#  7. shim/core includes no vendor header (cuda.h, cudaTypedefs.h, hip/..., nccl.h, ...), directly
#     or through any header it includes, and names no backend-only symbol: of shim/cuda and
#     shim/hip it knows only the ops tables (shim_cuda_ops, shim_hip_ops) and the hook tables
#     (shim_hooks, shim_hip_hooks, laid out in shim_hooktab.h).
set -euo pipefail
top=${top_srcdir:-$(cd "$(dirname "$0")/../.." && pwd)}
exec python3 - "$top" <<'EOF'
import os, re, sys
top = sys.argv[1]
fail = []

def sources(*dirs):
    for d in dirs:
        for root, _, files in os.walk(os.path.join(top, d)):
            for f in files:
                if f.endswith(('.c', '.h', '.def')):
                    yield os.path.join(root, f)

inc = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
# The folder a header lives in, by bare name (headers are included by bare name).
where = {}
for p in sources('lib', 'include', 'shim', 'node-agent'):
    where.setdefault(os.path.basename(p), []).append(p)

def module(p):  # foo.c and foo.h are one module
    return os.path.splitext(os.path.relpath(p, top))[0]

def graph(dirs):
    g = {}
    for p in sources(*dirs):
        m = module(p)
        g.setdefault(m, set())
        for h in inc.findall(open(p, errors='replace').read()):
            for q in where.get(os.path.basename(h), []):
                if any(os.path.relpath(q, top).startswith(d + '/') for d in dirs):
                    if module(q) != m:
                        g[m].add(module(q))
    return g

def cycles(g):
    out, state, stack = [], {}, []
    def visit(n):
        state[n] = 1; stack.append(n)
        for k in sorted(g.get(n, ())):
            if state.get(k) == 1:
                out.append(stack[stack.index(k):] + [k])
            elif k not in state:
                visit(k)
        stack.pop(); state[n] = 2
    for n in sorted(g):
        if n not in state:
            visit(n)
    return out

for dirs in (('shim',), ('node-agent',), ('lib',)):
    for c in cycles(graph(dirs)):
        fail.append('include cycle in %s/: %s' % (dirs[0], ' -> '.join(c)))

# Layers: lib and include know nothing of shim or node-agent; shim and node-agent never
# include each other; shim/core names no vendor header (shim_gpu.h is the seam).
def layer_check(src_dirs, banned_dirs, why):
    for p in sources(*src_dirs):
        for h in inc.findall(open(p, errors='replace').read()):
            for q in where.get(os.path.basename(h), []):
                rq = os.path.relpath(q, top)
                if not h.endswith('.def') and any(rq.startswith(b + '/') for b in banned_dirs):
                    fail.append('%s includes %s (%s)' % (os.path.relpath(p, top), rq, why))
layer_check(('lib', 'include'), ('shim', 'node-agent'), 'lib is below shim and node-agent')
layer_check(('shim',), ('node-agent',), 'the shim does not know the agent')
layer_check(('node-agent',), ('shim',), 'the agent speaks to the shim only through lib/ and protocol.h')
layer_check(('shim/core',), ('shim/cuda', 'shim/hip'), 'the core reaches a backend only through shim_gpu_ops')
layer_check(('shim/core',), ('shim/nccl',), 'the core reaches NCCL only through shim_comm_ops')

# One place compares process states.
state_word = re.compile(r'"(running|suspending|suspended|resuming|checkpointed|locked|resident|none)"'
                        r'|GCR_\w*STATE\w*')
for p in sources('lib', 'shim', 'node-agent'):
    rp = os.path.relpath(p, top)
    for i, line in enumerate(open(p, errors='replace'), 1):
        if 'strcmp' in line and state_word.search(line) and rp != 'lib/gcr_cr.c':
            fail.append('%s:%d compares a process state outside gcr_cr_state: %s' % (rp, i, line.strip()))

# One place compares phases (a pod's too: the same names).
phase_word = re.compile(r'"(Pending|Running|Succeeded|Failed)"')
for p in sources('node-agent'):
    rp = os.path.relpath(p, top)
    for i, line in enumerate(open(p, errors='replace'), 1):
        if 'strcmp' in line and phase_word.search(line) and rp != 'node-agent/kube/agent_phase.c':
            fail.append('%s:%d compares a phase outside agent_phase_of: %s' % (rp, i, line.strip()))

for p in sources('shim'):
    rp = os.path.relpath(p, top)
    for i, line in enumerate(open(p, errors='replace'), 1):
        if re.search(r'[=!]=\s*&shim_(cuda|hip)_ops|&shim_(cuda|hip)_ops\s*[=!]=', line):
            fail.append('%s:%d asks which backend it runs on: %s' % (rp, i, line.strip()))

# node-agent/: each folder includes only from folders of a lower rank (roles share rank 3, so a
# role never reads another role's header: what two roles share goes down a layer, or the daemon
# wires it as a callback). A new folder must be given its rank here.
rank = {'msg': 0, 'kube': 1, 'node': 2, 'controller': 3, 'scaler': 3, 'overcommit': 3, 'evict': 3,
        'deviceplugin': 3, 'daemon': 4, 'cli': 4}
for p in sources('node-agent'):
    rp = os.path.relpath(p, top)
    src = rp.split('/')[1] if rp.count('/') >= 2 else None
    if src is None:
        continue
    if src not in rank:
        fail.append('%s: folder node-agent/%s/ has no rank in test_architecture.sh' % (rp, src))
        continue
    for h in inc.findall(open(p, errors='replace').read()):
        for q in where.get(os.path.basename(h), []):
            rq = os.path.relpath(q, top)
            if not rq.startswith('node-agent/') or rq.count('/') < 2:
                continue
            dst = rq.split('/')[1]
            if dst != src and rank.get(dst, 99) >= rank[src]:
                fail.append('%s includes %s (node-agent/%s/ may not depend on %s/)' % (rp, rq, src, dst))

# A newcomer finds every module in docs/architecture.md: each .c (not generated) and .proto file has
# its row, linked.
doc = open(os.path.join(top, 'docs', 'architecture.md'), errors='replace').read()
protos = [os.path.join(r, f) for d in ('shim', 'lib', 'node-agent')
          for r, _, fs in os.walk(os.path.join(top, d)) for f in fs if f.endswith('.proto')]
for p in list(sources('shim', 'lib', 'node-agent')) + protos:
    rp = os.path.relpath(p, top)
    if rp.endswith(('.c', '.proto')) and not rp.endswith('.pb-c.c') and '(../%s)' % rp not in doc:
        fail.append('%s has no row in docs/architecture.md ("[`...`](../%s) | what it owns |")' % (rp, rp))

# shim/core is vendor-neutral: no vendor header reaches it, not even through a header of its
# own or a backend's .def list; backends are reached only through their tables.
vendor_inc = re.compile(r'^\s*#\s*include\s*[<"]((?:cuda|cudaTypedefs|cuda_runtime|cuda_runtime_api|cudaGL|'
                        r'nccl|nvml|rccl)\.h|hip/[^>"]*|rccl/[^>"]*)[>"]', re.M)
def includes(path):
    out = []
    for h in inc.findall(open(path, errors='replace').read()):
        out.extend(where.get(os.path.basename(h), []))
    return out
def vendor_chain(path):
    """The include chain from path to a file that includes a vendor header, or None."""
    seen, todo = {path: None}, [path]
    while todo:
        q = todo.pop(0)
        m = vendor_inc.search(open(q, errors='replace').read())
        if m:
            chain, r = [], q
            while r is not None:
                chain.append(os.path.relpath(r, top))
                r = seen[r]
            return list(reversed(chain)) + ['<%s>' % m.group(1)]
        for r in includes(q):
            if r not in seen:
                seen[r] = q
                todo.append(r)
    return None
for p in sources('shim/core'):
    c = vendor_chain(p)
    if c:
        fail.append('%s includes a vendor header: %s (vendor types and calls belong in shim/cuda or '
                    'shim/hip, behind shim_gpu_ops)' % (os.path.relpath(p, top), ' -> '.join(c)))

def code_only(text):  # comments and string literals blanked (lines kept), so only code is matched
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"', lambda m: ' ' + '\n' * m.group(0).count('\n'),
                  text, flags=re.S)
backend_sym = re.compile(r'\b(shim_gpu_(?:set_)?last_code|shim_cu|SHIM_REAL|SHIM_HIP_REAL|'
                         r'shim_(?:cuda|hip)_\w+)\b')
seam = {'shim_cuda_ops', 'shim_hip_ops', 'shim_hip_hooks', 'shim_hip_hook_id'}
for p in sources('shim/core'):
    rp = os.path.relpath(p, top)
    for i, line in enumerate(code_only(open(p, errors='replace').read()).split('\n'), 1):
        for name in sorted(set(backend_sym.findall(line))):
            if name not in seam:
                fail.append('%s:%d names %s, a backend\'s own symbol (go through shim_gpu_ops)' % (rp, i, name))

for f in fail:
    print('FAIL', f)
print('architecture: %d problem(s)' % len(fail))
sys.exit(1 if fail else 0)
EOF
