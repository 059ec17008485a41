#!/usr/bin/env python3
"""Static checks of braid's CUDA kernels, standing in for a profiler where no GPU runs them.

Reads the sm_90 objects the build compiled (braid_cuda_launch: launch_sum.cu with launch_procs_narrow.cu,
launch_float.cu with launch_procs_wide.cu, and launch_procs.cu; bench/launch/launch.cmake) with cuobjdump
and nvdisasm, and asserts, for every kernel whose name matches
KERNELS below:

  resources  registers within the launch bound (65536 / --bound), stack 0, local memory 0, and no
             local-memory instruction (LDL/STL: spills or per-thread arrays) anywhere in the kernel;
  hot loops  every loop whose back branch is code of --source (the reduce-copy loop, found through the
             -lineinfo line info) and that holds a 128-bit load; at least one per kernel, and at least
             one of them an iteration loop (one that stores). In every hot loop: 128-bit loads are
             global (LDG, not generic LD), weak (no .STRONG) and coherent (no .CONSTANT, the .nc path);
             no generic LD/ST, no LDL/STL, no call except IEEE float division's slow path (64-bit
             integer division and remainder are calls). In every iteration loop: at least U 128-bit
             loads issued before the first instruction that reads a register one of them wrote (U from
             UNROLL and UNROLL_CAP below), and 128-bit global stores (STG). The loops over sources
             beyond the second (no store) are reported, not asserted: ptxas interleaves their loads
             with the arithmetic (docs/gpu-kernels.md);
  PTX        the memory scopes of the synchronisation, PTX_RULES below;
  parameters the bytes of a kernel's parameters within PARAM_BYTES (what every launch copies).

Prints one line per kernel with its figures, then every failure; exits 1 if anything failed, 2 if
the tools or objects are missing (that fails the CTest test too: where nvcc exists, this check must
run).

Usage: check_kernels.py --tools DIR [--source reduce_copy.cuh] [--bound 512] OBJECT...
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

# Kernels checked: demangled name prefixes.
KERNELS = re.compile(r"(braid::cuda::device::collective_kernel|braid::cuda::process::reduce_kernel|"
                     r"braid::gpu_launch::(\(anonymous namespace\)::)?reduce_copy_kernel)<")

# 16-byte loads per source that reduce_copy issues before it uses one: reduce_copy_unroll<T, Op> in
# include/braid/cuda/device/reduce_copy.cuh, by element type. Types summed in a wider accumulator (float)
# unroll less, because the accumulators take more registers. Edit both together.
UNROLL = {"braid::half": 4, "braid::bfloat16": 4, "braid::fp8_e4m3": 2, "braid::fp8_e5m2": 2}
UNROLL_DEFAULT = 8
# ... at most this many in a kernel (collective_unroll: the collective kernel reduces with 4 at most).
UNROLL_CAP = {"collective_kernel": 4}

# The most bytes a kernel's parameters may take: (kernels regex, bytes). The collective kernel's are its
# launch_args (include/braid/cuda/device/executor.cuh: a fixed size, with the parts of up to
# inline_calls ranks) and the operator; every launch copies them, so they must not grow with the
# ranks a GPU serves.
PARAM_BYTES = [("collective_kernel", 512)]

# The synchronisation the kernels are meant to contain, as PTX instructions: (kernels regex, "require"
# or "forbid", alternatives (each a set of '.'-separated opcode parts that must all appear), why).
# Edit this table when the synchronisation changes (include/braid/cuda/device/signal.cuh, executor.cuh).
PTX_RULES = [
    ("collective_kernel", "require", [{"atom", "max", "release", "sys"}],
     "progress post: post_max_release, fetch_max with release at system scope"),
    ("collective_kernel", "require", [{"ld", "acquire", "sys"}],
     "the one acquire after a progress word passed: load_acquire, acquire at system scope"),
    ("collective_kernel", "require", [{"ld", "relaxed", "sys"}],
     "polls of a progress word (and the peers' in_desc): relaxed at system scope"),
    ("collective_kernel", "require", [{"atom", "add", "acq_rel", "gpu"}],
     "block arrival counter: fetch_add acq_rel at device scope"),
    ("collective_kernel", "forbid", [{"membar", "sys"}, {"fence", "sc", "sys"}],
     "no system fence per block: the block barrier, the acq_rel arrival and the cumulative release post order the data"),
    (".", "forbid", [{"ld", "volatile"}, {"st", "volatile"}],
     "no volatile accesses: polls acquire, data accesses are weak"),
    (".", "forbid", [{"ld", "nc"}, {"ld", "global", "nc"}],
     "no non-coherent loads: the data changes while kernels run"),
    ("reduce_kernel|reduce_copy_kernel", "forbid",
     [{"atom"}, {"red"}, {"membar"}, {"fence"}, {"nanosleep"}, {"ld", "acquire"}, {"st", "release"}],
     "no synchronisation inside the process path's reduce kernel (the host synchronises)"),
]
# Calls in a hot loop: integer division and remainder are software routines (a call per element);
# IEEE float division's rare slow path is a call too, and avg's finalize divides every element by
# nranks (as the host does, for identical bits), so that one is allowed.
INT_DIV_CALL = re.compile(r"__cuda_sm\d+_(div|rem)_[us]\d+")
FLOAT_DIV_CALL = re.compile(r"__cuda_sm\w+_div_rn_")

# Reported per kernel, not asserted: relaxed system-scope loads (the collective kernel reads a peer's
# in_desc so, executor.cuh).
PTX_RELAXED = {"ld", "relaxed", "sys"}


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.strip()[:2000]}")
    return r.stdout


def demangle(names):
    names = list(names)
    if not names:
        return {}
    cxxfilt = shutil.which("c++filt")
    if not cxxfilt:
        raise RuntimeError("c++filt not found (binutils)")
    out = subprocess.run([cxxfilt], input="\n".join(names) + "\n", stdout=subprocess.PIPE, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def template_args(demangled):
    """Top-level template arguments of the function's own template, e.g. [S, T, Op]."""
    start = demangled.find("<")
    depth, cur, args = 0, "", []
    for ch in demangled[start + 1:]:
        if ch == "<":
            depth += 1
        elif ch == ">":
            if depth == 0:
                args.append(cur.strip())
                break
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
            continue
        cur += ch
    return args


def element_type(demangled):
    args = template_args(demangled)
    if "collective_kernel<" in demangled:
        return args[1] if len(args) > 1 else "?"
    return args[0] if args else "?"


def short_name(demangled):
    s = demangled.replace("(anonymous namespace)", "{anon}").split("(")[0].replace("{anon}", "(anonymous namespace)")
    for p in ("braid::cuda::device::", "braid::cuda::process::", "braid::gpu_launch::(anonymous namespace)::",
              "braid::gpu_launch::", "braid::schedule::", "braid::detail::", "braid::"):
        s = s.replace(p, "")
    return s.replace(" >", ">")


def sections(out, header):
    """cuobjdump's listing `out` cut at the lines `header` matches: (group 1 of the header, the lines
    up to the next header) for each, in order; the lines before the first header are left out."""
    name, lines = None, []
    for line in out.splitlines():
        m = header.match(line)
        if m:
            if name is not None:
                yield name, lines
            name, lines = m.group(1), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        yield name, lines


# ---- cuobjdump -res-usage -----------------------------------------------------------------------------
RES_FN = re.compile(r"^\s*Function (\S+):\s*$")
RES_KV = re.compile(r"(\w+(?:\[\d+\])?):(\d+)")


def resources(tools, obj):
    res = {}
    for fn, lines in sections(run([os.path.join(tools, "cuobjdump"), "-res-usage", obj]), RES_FN):
        usage = next((line for line in lines if "REG:" in line), None)
        if usage is not None:
            res[fn] = {k: int(v) for k, v in RES_KV.findall(usage)}
    return res


# ---- SASS ---------------------------------------------------------------------------------------------
SASS_FN = re.compile(r"^\.text\.(\S+):\s*$")
SASS_INS = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*$")
SASS_LABEL = re.compile(r"^(\.L_x_\d+):\s*$")
SASS_FILE = re.compile(r'//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
REG = re.compile(r"\bR(\d+)(?:\.64)?\b")


class Ins:
    # operands are split on first use: the checks read them in the hot loops only, a few percent of
    # the 1.1 million instructions (splitting all of them cost about 3 of the test's 56 s run alone)
    __slots__ = ("addr", "pred", "op", "_rest", "_operands", "inner", "text")

    def __init__(self, addr, text, inner):
        self.addr, self.text, self.inner = addr, text, inner  # inner: file of the innermost inlined code
        body = text
        self.pred = None
        if body.startswith("@"):
            self.pred, body = body.split(None, 1)
        parts = body.split(None, 1)
        self.op = parts[0]
        self._rest = parts[1] if len(parts) > 1 else None
        self._operands = None

    @property
    def operands(self):
        if self._operands is None:
            self._operands = [o.strip() for o in self._rest.split(",")] if self._rest is not None else []
        return self._operands


def sass_functions(tools, obj, tmp):
    # cuobjdump -xelf writes into the current directory
    subprocess.run([os.path.join(tools, "cuobjdump"), "-xelf", "all", os.path.abspath(obj)], cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL)
    cubins = sorted(f for f in os.listdir(tmp) if f.endswith(".cubin") and "sm_90" in f)
    if not cubins:
        raise RuntimeError(f"{obj}: no sm_90 cubin inside")
    funcs = {}
    for c in cubins:
        text = run([os.path.join(tools, "nvdisasm"), "-c", "-gi", os.path.join(tmp, c)])
        os.remove(os.path.join(tmp, c))
        cur, inner, pending = None, "", []
        for line in text.splitlines():
            m = SASS_FN.match(line) if line.startswith(".text.") else None
            if m:
                cur = funcs.setdefault(m.group(1), {"ins": [], "labels": {}})
                inner, pending = "", []
                continue
            if cur is None:
                continue
            if line.lstrip().startswith("//##"):
                if not pending:  # only the first line-info comment before an instruction counts
                    f = SASS_FILE.search(line)
                    if f:
                        pending.append(os.path.basename(f.group(1)))
                continue
            m = SASS_LABEL.match(line)
            if m:
                cur["labels"][m.group(1)] = None  # address filled by the next instruction
                cur.setdefault("_open", []).append(m.group(1))
                continue
            m = SASS_INS.match(line)
            if m:
                if pending:
                    inner, pending = pending[0], []
                ins = Ins(int(m.group(1), 16), m.group(2), inner)
                cur["ins"].append(ins)
                for lab in cur.pop("_open", []):
                    cur["labels"][lab] = ins.addr
    return funcs


def loads_dst(ins):
    """Registers an LD/LDG writes: R8 for 32 bit, R8..R9 for 64, R8..R11 for 128."""
    if not ins.operands:
        return set()
    m = re.match(r"R(\d+)$", ins.operands[0])
    if not m:
        return set()
    base = int(m.group(1))
    width = 4 if ".128" in ins.op else 2 if ".64" in ins.op else 1
    return {base + i for i in range(width)}


def reads(ins):
    """Registers an instruction reads (stores read all their operands)."""
    ops = ins.operands if ins.op.split(".")[0] in ("STG", "ST", "STS", "STL", "RED", "ATOM", "ATOMG", "ATOMS") \
        else ins.operands[1:]
    regs = set()
    for o in ops:
        for m in REG.finditer(o):
            r = int(m.group(1))
            regs.add(r)
            if ".64" in m.group(0):
                regs.add(r + 1)
    return regs


def parts(op):
    return op.split(".")


def is_load128(op):
    p = parts(op)
    return p[0] in ("LDG", "LD") and "128" in p


def is_store128(op):
    p = parts(op)
    return p[0] in ("STG", "ST") and "128" in p


def hot_loops(fn, source):
    ins = fn["ins"]
    index = {i.addr: n for n, i in enumerate(ins)}
    loops = []
    for n, i in enumerate(ins):
        if parts(i.op)[0] != "BRA":
            continue
        m = re.search(r"\(\s*(\.L_x_\d+)\s*\)", i.text)
        if not m or fn["labels"].get(m.group(1)) is None:
            continue
        target = fn["labels"][m.group(1)]
        if target > i.addr:
            continue
        body = ins[index[target]:n + 1]
        # the loop's own code (its back branch) is in `source`, and it moves 128-bit data
        if i.inner == source and any(is_load128(b.op) for b in body):
            loops.append(body)
    return loops


def loads_before_use(body):
    written, count = set(), 0
    for i in body:
        if reads(i) & written:
            return count
        if is_load128(i.op):
            count += 1
            written |= loads_dst(i)
    return count


# ---- PTX ----------------------------------------------------------------------------------------------
PTX_ENTRY = re.compile(r"^(?:\.visible\s+)?\.entry\s+(\S+?)\(")


PTX_PARAM = re.compile(r"^\.param\s+(?:\.align\s+\d+\s+)?\.([busf])(\d+)\s+\S+?(?:\[(\d+)\])?,?$")


def ptx_entries(tools, obj):
    """Each entry's PTX instructions, and the bytes of its parameters (entry -> (ops, param bytes))."""
    entries, params = {}, {}
    for entry, lines in sections(run([os.path.join(tools, "cuobjdump"), "-ptx", obj]), PTX_ENTRY):
        ops = entries.setdefault(entry, [])
        params.setdefault(entry, 0)
        for line in lines:
            s = line.strip()
            pm = PTX_PARAM.match(s)
            if pm:
                params[entry] += int(pm.group(2)) // 8 * (int(pm.group(3)) if pm.group(3) else 1)
                continue
            if not s or s.startswith("//") or s.startswith("."):
                continue
            if s.startswith("@"):
                s = s.split(None, 1)[1] if " " in s else ""
            op = s.split(None, 1)[0] if s else ""
            if op and op[0].isalpha():
                ops.append(op.rstrip(";"))
    return entries, params


# ---- main ---------------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", required=True, help="folder with cuobjdump and nvdisasm")
    ap.add_argument("--source", default="reduce_copy.cuh",
                    help="file name whose code marks a hot loop in the line info (default reduce_copy.cuh)")
    ap.add_argument("--bound", type=int, default=512, help="threads per block the kernels are launched with at most")
    ap.add_argument("objects", nargs="+")
    args = ap.parse_args()
    # CMake passes $<TARGET_OBJECTS:...> as one ';'-separated argument
    args.objects = [o for arg in args.objects for o in arg.split(";") if o]
    args.tools = os.path.abspath(args.tools)  # cuobjdump -xelf runs in a scratch folder
    t0 = time.monotonic()

    missing = [t for t in ("cuobjdump", "nvdisasm") if not os.access(os.path.join(args.tools, t), os.X_OK)]
    if missing:
        print(f"check_kernels: {', '.join(missing)} not found in {args.tools}: scripts/deps.sh installs them "
              "(scripts/cuda-tools.sh, from PyPI); where nvcc exists this check must run, so it fails", file=sys.stderr)
        return 2
    for o in args.objects:
        if not os.path.isfile(o):
            print(f"check_kernels: no object {o} (build braid_cuda_launch first)", file=sys.stderr)
            return 2

    max_regs = 65536 // args.bound
    rows, failures, nkernels = [], [], 0
    with tempfile.TemporaryDirectory(prefix="braid-static-") as tmp:
        for obj in args.objects:
            res = resources(args.tools, obj)
            sass = sass_functions(args.tools, obj, tmp)
            ptx, ptx_params = ptx_entries(args.tools, obj)
            names = demangle(set(res) | set(sass) | set(ptx))
            for mangled in sorted(res, key=lambda m: short_name(names.get(m, m))):
                dm = names.get(mangled, mangled)
                dm = dm[5:] if dm.startswith("void ") else dm
                if not KERNELS.match(dm):
                    continue
                nkernels += 1
                name = short_name(dm)
                fails = []
                r = res[mangled]
                if r.get("REG", 0) > max_regs:
                    fails.append(f"{r['REG']} registers > {max_regs} (65536 / {args.bound} threads)")
                if r.get("STACK", 0) != 0:
                    fails.append(f"stack frame {r['STACK']} B (must be 0)")
                if r.get("LOCAL", 0) != 0:
                    fails.append(f"local memory {r['LOCAL']} B (must be 0)")
                fn = sass.get(mangled)
                if fn is None:
                    fails.append("no SASS found")
                    fn = {"ins": [], "labels": {}}
                lmem = sum(1 for i in fn["ins"] if parts(i.op)[0] in ("LDL", "STL"))
                if lmem:
                    fails.append(f"{lmem} local-memory instructions (LDL/STL) in the kernel")
                loops = hot_loops(fn, args.source)
                t = element_type(dm)
                want = UNROLL.get(t, UNROLL_DEFAULT)
                for kern, cap in UNROLL_CAP.items():
                    if kern in name:
                        want = min(want, cap)
                in_flight, per_source = [], []
                ldg = stg = 0
                for body in loops:
                    where = f"loop at {body[0].addr:#06x}-{body[-1].addr:#06x}"
                    bad = {}  # what is wrong in this loop -> how many instructions

                    def flag(msg):
                        bad[msg] = bad.get(msg, 0) + 1

                    for i in body:
                        p = parts(i.op)
                        if is_load128(i.op):
                            if p[0] != "LDG":
                                flag(f"generic 128-bit load {i.op} (not global)")
                            if "STRONG" in p:
                                flag(f"{i.op} is not weak")
                            if "CONSTANT" in p:
                                flag(f"{i.op} uses the non-coherent path")
                            ldg += p[0] == "LDG"
                        elif is_store128(i.op):
                            if p[0] != "STG":
                                flag(f"generic 128-bit store {i.op} (not global)")
                            stg += p[0] == "STG"
                        elif p[0] in ("LD", "ST"):
                            flag(f"generic access {i.op}")
                        if p[0] in ("LDL", "STL"):
                            flag(f"local memory {i.op}")
                        if p[0] == "CALL":
                            target = i.text.split("`")[-1] if "`" in i.text else i.op
                            if INT_DIV_CALL.search(target):
                                flag(f"integer division or remainder {target} (per element)")
                            elif not FLOAT_DIV_CALL.search(target):
                                flag(f"call {target}")
                    n = loads_before_use(body)
                    if any(is_store128(i.op) for i in body):
                        # an iteration loop (it stores): sources 0 and 1 are loaded here
                        in_flight.append(n)
                        if n < want:
                            flag(f"{n} 128-bit loads before the first use of one (want >= U = {want})")
                    else:
                        per_source.append(n)  # the loop over further sources: reported (docs/gpu-kernels.md)
                    fails += [f"{where}: {c} x {m}" if c > 1 else f"{where}: {m}" for m, c in bad.items()]
                if not loops:
                    fails.append(f"no hot loop (a loop with a 128-bit load and code of {args.source})")
                elif not stg:
                    fails.append("no 128-bit global store (STG.E.128) in the hot loops")
                ops = ptx.get(mangled)
                if ops is None:
                    fails.append("no PTX found")
                    ops = []
                # Each distinct instruction once (a kernel has tens of thousands, a few hundred distinct),
                # in order of first appearance.
                distinct = collections.Counter(ops)
                parts_of = {o: set(o.split(".")) for o in distinct}
                for kern, kind, alts, why in PTX_RULES:
                    if not re.search(kern, short_name(dm)):
                        continue
                    hits = [o for o in distinct if any(a <= parts_of[o] for a in alts)]
                    if kind == "require" and not hits:
                        fails.append(f"PTX: no {' or '.join('.'.join(sorted(a)) for a in alts)} ({why})")
                    if kind == "forbid" and hits:
                        fails.append(f"PTX: {sum(distinct[o] for o in hits)} x {hits[0]} ({why})")
                relaxed = sum(c for o, c in distinct.items() if PTX_RELAXED <= parts_of[o])
                pbytes = ptx_params.get(mangled, 0)
                for kern, most in PARAM_BYTES:
                    if re.search(kern, short_name(dm)) and pbytes > most:
                        fails.append(f"parameters: {pbytes} bytes, more than {most} (PARAM_BYTES)")
                if loops and not in_flight:
                    fails.append("no iteration loop (a hot loop with a 128-bit store)")
                rows.append((name, r.get("REG", -1), r.get("STACK", -1), r.get("LOCAL", -1), want, len(loops),
                             min(in_flight) if in_flight else 0, max(in_flight) if in_flight else 0,
                             min(per_source) if per_source else 0, max(per_source) if per_source else 0, ldg, stg,
                             relaxed, pbytes, "ok" if not fails else "FAIL"))
                failures += [f"{name}: {f}" for f in fails]

    w = max(len(r[0]) for r in rows) if rows else 10
    print("in flight: 128-bit loads issued before the first use of one, from the loop's head: in the iteration")
    print("loops (which load sources 0 and 1, then store) and in the loops over further sources (reported only)")
    print(f"{'kernel':<{w}}  REG STACK LOCAL  U loops  in-flight  further-src  LDG128 STG128  ld.relaxed.sys  param-bytes  result")
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:3d} {r[2]:5d} {r[3]:5d} {r[4]:2d} {r[5]:5d}  {r[6]:4d}-{r[7]:<4d}  {r[8]:5d}-{r[9]:<5d}  "
              f"{r[10]:6d} {r[11]:6d}  {r[12]:14d}  {r[13]:11d}  {r[14]}")
    regs = [r[1] for r in rows]
    print(f"\n{nkernels} kernels in {len(args.objects)} objects; registers {min(regs) if regs else 0}-{max(regs) if regs else 0} "
          f"(bound {max_regs}); {sum(1 for r in rows if r[-1] != 'ok')} failed; {time.monotonic() - t0:.1f} s")
    if failures:
        print(f"\n{len(failures)} failures:")
        for f in failures:
            print("  " + f)
    if not nkernels:
        print("check_kernels: no kernel matched", file=sys.stderr)
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
