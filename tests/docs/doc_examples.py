#!/usr/bin/env python3
"""The C++ blocks of README.md and docs/ as code the build compiles and CTest runs.

Every ```cpp block is one of these, named by the words after `cpp` on its fence line (GitHub shows
only the first word, the language):

  (none)        a whole program with main(): compiled, and run by CTest (it must return 0)
  no-run        a whole program that needs a launcher (mpirun, torchrun): compiled only
  exit=N        a whole program that returns N on purpose (it demonstrates an error)
  ranks=N       a whole program run as N processes: with RANK, WORLD_SIZE and MASTER_ADDR/PORT as
                torchrun sets them, or, compiled with MPI, under mpirun (tests/mpi/launch.sh, two
                simulated hosts)
  fragment      statements: compiled as the body of a function. The names it uses come from an
                HTML comment right above the fence, invisible on the rendered page:
                  <!-- example-args: braid::communicator& comm, std::vector<float>& grad -->
                  <!-- example-setup: void fill(std::span<float>); -->
                example-args are the function's parameters; example-setup is code placed before
                the function, at namespace scope
  declarations  code at namespace scope (types, functions), compiled
  synopsis      declarations as the headers spell them, shortened (members out of their class,
                `…` for a table): not compiled; every name it declares must be declared in
                include/braid (tests/docs/api_names.py checks it)

and one of these, where it cannot be told from the block's own #includes:

  cuda          compiled by the host compiler against the emulated CUDA device (braid::emu)
  mpi           compiled with MPI (braid::mpi)
  nn            compiled with braid::nn
  nn-cuda       braid::nn's device side (nn::fused), on the emulated CUDA device

A block that says none of these and has no main() is an error: say what it is.

`generate OUT` writes one translation unit per toolchain (OUT/doc_examples_<toolchain>.cpp): each
block in a namespace of its own, with #line directives so that a compiler error names the Markdown
file and line, and a main() that runs the runnable programs in order (or the one its argument
names; --list prints them with their process counts). `list` prints every block and what is done
with it. `run EXE [MPIEXEC LAUNCH_SH]` runs EXE's programs: those of one process in one run of EXE,
the others as their ranks= says (CTest's doc_examples_* tests).
"""
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TOOLCHAINS = ("host", "cuda", "mpi", "nn", "nn-cuda")
KINDS = ("program", "no-run", "fragment", "declarations", "synopsis")


def markdown_files():
    out = [os.path.join(ROOT, "README.md")]
    for d, dirs, files in os.walk(os.path.join(ROOT, "docs")):
        dirs[:] = sorted(x for x in dirs if x != "archive")  # history, not documentation of today's API
        out += [os.path.join(d, f) for f in sorted(files) if f.endswith(".md")]
    return out


FENCE = re.compile(r"^```cpp([^\n]*)\n(.*?)^```", re.S | re.M)
COMMENT = re.compile(r"<!--\s*example-(args|setup):(.*?)-->", re.S)


class Block:
    def __init__(self, path, line, words, code, args, setup):
        self.path, self.line, self.code = path, line, code
        self.rel = os.path.relpath(path, ROOT)
        self.args, self.setup = args, setup
        self.exit = 0
        self.ranks = 1
        self.kind = None
        self.toolchain = None
        for w in words:
            if w in KINDS:
                self.kind = w
            elif w in TOOLCHAINS:
                self.toolchain = w
            elif re.fullmatch(r"exit=\d+", w):
                self.kind, self.exit = "program", int(w[5:])
            elif re.fullmatch(r"ranks=\d+", w):
                self.kind, self.ranks = "program", int(w[6:])
            else:
                raise SystemExit(f"{self.rel}:{line}: unknown word '{w}' after ```cpp (known: {', '.join(KINDS + TOOLCHAINS)}, exit=N)")
        has_main = re.search(r"^int main\s*\(", code, re.M) is not None
        if self.kind is None:
            if not has_main:
                raise SystemExit(f"{self.rel}:{line}: a C++ block without main() must say what it is: "
                                 "```cpp fragment, declarations or synopsis (tests/docs/doc_examples.py)")
            self.kind = "program"
        if self.kind in ("program", "no-run") and not has_main:
            raise SystemExit(f"{self.rel}:{line}: a {self.kind} block needs int main()")
        if self.toolchain is None:
            includes = " ".join(re.findall(r"^#include\s*<(braid/[^>]+)>", code, re.M))
            nn = "braid/nn" in includes
            cuda = "cuda" in includes
            self.toolchain = ("mpi" if "braid/mpi" in includes else "nn-cuda" if nn and cuda else "nn" if nn
                              else "cuda" if cuda else "host")
        if (args or setup) and self.kind != "fragment":
            raise SystemExit(f"{self.rel}:{line}: example-args/example-setup belong above a ```cpp fragment")


def blocks():
    out = []
    for p in markdown_files():
        text = open(p, encoding="utf-8").read()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 2  # the block's first line
            # The HTML comments directly above the fence (only blank lines between).
            before = text[:m.start()]
            args = setup = ""
            while True:
                stripped = before.rstrip()
                cm = None
                for c in COMMENT.finditer(stripped):
                    cm = c
                if not cm or cm.end() != len(stripped):
                    break
                if cm.group(1) == "args":
                    args = cm.group(2).strip()
                else:
                    setup = cm.group(2).strip()
                before = stripped[:cm.start()]
            out.append(Block(p, line, m.group(1).split(), m.group(2), args, setup))
    return out


# What every block of a toolchain may use without an #include of its own (fragments have none).
PRELUDE = {
    "host": ["<braid/braid.hpp>"],
    "cuda": ["<braid/cuda.cuh>"],
    "mpi": ["<braid/mpi.hpp>"],
    "nn": ["<braid/nn.hpp>"],
    "nn-cuda": ["<braid/cuda.cuh>", "<braid/nn.hpp>", "<braid/nn/model_device.cuh>", "<braid/nn/pipeline_device.cuh>",
                "<braid/nn/optim_device.cuh>"],
}
STD = ["<chrono>", "<cmath>", "<cstdint>", "<cstdio>", "<cstring>", "<exception>", "<random>", "<span>", "<stop_token>",
       "<string>", "<thread>", "<type_traits>", "<vector>"]


def translation_unit(toolchain, bs):
    head = ["// Generated by tests/docs/doc_examples.py from README.md and docs/: do not edit."]
    head += ["#include " + h for h in PRELUDE[toolchain] + STD]
    body = []
    runs = []
    for i, b in enumerate(bs):
        ns = f"doc_example_{i}"
        lines = b.code.splitlines()
        kept = []
        for ln in lines:
            if re.match(r"\s*#\s*include\b", ln):
                head.append(ln.split("//")[0].rstrip())
                kept.append("")  # keeps every later line at its number
            else:
                kept.append(ln)
        if b.kind == "program":
            # main() in a namespace is an ordinary function: give it main's implicit return 0, before
            # the block's last closing brace (main's, in every program of the docs).
            closing = [i for i, ln in enumerate(kept) if ln.rstrip() == "}"]
            if closing:  # a one-line main has its own return
                kept[closing[-1]] = "return 0; }"
        where = f'#line {b.line} "{b.rel}"'
        body.append(f"// {b.rel}:{b.line} ({b.kind})")
        if b.kind == "fragment":
            body.append(f"namespace {ns} {{")
            if b.setup:
                body.append(b.setup)
            body.append(f'#line {b.line - 1} "{b.rel}"')  # the fence: its example-args comment is just above
            body.append(f"[[maybe_unused]] inline void fragment({b.args}) {{")
            body.append(where)
            body += kept
            body.append("}")
            body.append(f"}} // namespace {ns}")
        else:
            body.append(f"namespace {ns} {{")
            body.append(where)
            body += kept
            body.append(f"}} // namespace {ns}")
        if b.kind == "program":
            runs.append((ns, b))
    head = list(dict.fromkeys(head))  # each include once, in order of first use
    drv = ["", "namespace {",
           "template <class F> int call_main(F f, int argc, char** argv) {",
           "  if constexpr (std::is_invocable_v<F>) { (void)argc; (void)argv; return f(); }",
           "  else return f(argc, argv);",
           "}",
           "} // namespace", "",
           "// Runs every runnable program of these docs (or the one named `file:line`) and checks its exit status.",
           "int main(int argc, char** argv) {",
           "  struct { const char* where; int (*run)(int, char**); int want; int ranks; } programs[] = {"]
    for ns, b in runs:
        drv.append(f'    {{"{b.rel}:{b.line}", [](int c, char** v) {{ return call_main({ns}::main, c, v); }}, {b.exit}, {b.ranks}}},')
    drv += ["    {nullptr, nullptr, 0, 0}};",
            "  if (argc > 1 && std::strcmp(argv[1], \"--list\") == 0) {",
            "    for (auto& p : programs)",
            "      if (p.where) std::printf(\"%s %d\\n\", p.where, p.ranks);",
            "    return 0;",
            "  }",
            "  int failed = 0, ran = 0;",
            "  for (auto& p : programs) {",
            "    if (!p.where || (argc > 1 ? std::strcmp(argv[1], p.where) != 0 : p.ranks != 1)) continue;",
            "    std::printf(\"=== %s\\n\", p.where);",
            "    std::fflush(stdout);",
            "    int got = -1;",
            "    try {",
            "      got = p.run(1, argv);",
            "    } catch (const std::exception& e) {",
            "      std::printf(\"%s: threw: %s\\n\", p.where, e.what());",
            "    }",
            "    std::fflush(stdout);",
            "    ++ran;",
            "    if (got != p.want) {",
            "      ++failed;",
            "      std::printf(\"%s: returned %d, expected %d\\n\", p.where, got, p.want);",
            "    }",
            "  }",
            "  std::printf(\"%d of %d programs as expected\\n\", ran - failed, ran);",
            "  return failed || (argc > 1 && ran == 0) ? 1 : 0;",
            "}"]
    return "\n".join(head + [""] + body + drv) + "\n"


def run(exe, mpiexec=None, launch=None):
    import subprocess
    listed = subprocess.run([exe, "--list"], check=True, capture_output=True, text=True).stdout.split()
    programs = list(zip(listed[0::2], map(int, listed[1::2])))
    failed = 0
    if any(n == 1 for _, n in programs):
        failed += subprocess.run([exe]).returncode != 0
    port = 29400 + os.getpid() % 500
    for where, n in programs:
        if n == 1:
            continue
        print(f"=== {where} as {n} processes", flush=True)
        if mpiexec:
            codes = [subprocess.run(["sh", launch, mpiexec, str(n), "rank % 2", exe, where], timeout=600).returncode]
        else:
            port += 1
            procs = [subprocess.Popen([exe, where], env=dict(os.environ, RANK=str(r), WORLD_SIZE=str(n),
                                                             MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
                     for r in range(n)]
            codes = [p.wait(timeout=600) for p in procs]
        if any(codes):
            failed += 1
            print(f"{where}: exit statuses {codes}", flush=True)
    print(f"{len(programs) - failed} of {len(programs)} runs as expected")
    return 1 if failed else 0


def main():
    if len(sys.argv) in (3, 5) and sys.argv[1] == "run":
        return run(*sys.argv[2:])
    if len(sys.argv) >= 2 and sys.argv[1] == "list":
        for b in blocks():
            print(f"{b.rel}:{b.line}: {b.kind} ({b.toolchain})")
        return 0
    if len(sys.argv) == 3 and sys.argv[1] == "generate":
        out = sys.argv[2]
        os.makedirs(out, exist_ok=True)
        bs = blocks()
        for tc in TOOLCHAINS:
            text = translation_unit(tc, [b for b in bs if b.toolchain == tc and b.kind != "synopsis"])
            path = os.path.join(out, f"doc_examples_{tc.replace('-', '_')}.cpp")
            old = open(path).read() if os.path.exists(path) else None
            if old != text:  # unchanged docs: no rebuild
                open(path, "w").write(text)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
