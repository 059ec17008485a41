#!/usr/bin/env python3
"""Checks the reference against the headers, both ways (CTest: test_api_names).

1. Every documented name exists: each name a ```cpp synopsis block of README.md or docs/ declares
   (types, functions, members, enumerators), and each component of every `braid::...` name the docs
   write, is declared in include/braid.
2. Every public name is documented: each name declared in namespace braid, braid::cuda, braid::mpi,
   braid::nn or braid::nn::fused, and each public member of a class declared there, appears in
   README.md or docs/ (other namespaces, `detail` among them, are implementation: api.md's "Lower
   layers" says so).

The headers are read by Universal Ctags (Debian's universal-ctags; scripts/deps.sh installs it).
"""
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import doc_examples  # noqa: E402

ROOT = doc_examples.ROOT
PUBLIC = {"braid", "braid::cuda", "braid::mpi", "braid::nn", "braid::nn::fused"}
# Words a synopsis uses that are C++'s or the standard library's, not braid's declarations.
NOT_DECLARATIONS = {
    "if", "for", "while", "switch", "return", "sizeof", "alignof", "decltype", "static_cast", "reinterpret_cast",
    "const_cast", "requires", "noexcept", "operator", "alignas", "static_assert", "true", "false", "nullptr",
    "const", "void", "int", "bool", "auto", "default", "delete", "explicit", "public", "private", "virtual",
    "typename", "template", "class", "struct", "constexpr", "inline", "static", "override", "final",
}


def header_tags():
    ctags = shutil.which("ctags")
    if not ctags:
        raise SystemExit("api_names: ctags not found: install Universal Ctags (apt install universal-ctags; scripts/deps.sh does)")
    out = subprocess.run([ctags, "-R", "--languages=C++", "--langmap=C++:+.cuh", "--fields=+KsSa", "--c++-kinds=+p",
                          "-f", "-", os.path.join(ROOT, "include", "braid")],
                         check=True, capture_output=True, text=True).stdout
    tags = []
    for line in out.splitlines():
        if line.startswith("!"):
            continue
        parts = line.split("\t")
        fields = dict(p.split(":", 1) for p in parts[3:] if ":" in p)
        kind = parts[3] if len(parts) > 3 and ":" not in parts[3] else fields.get("kind", "")
        tags.append((parts[0], os.path.relpath(parts[1], ROOT), kind, fields))
    return tags


# What Ctags does not see: names declared through braid's macros, concepts, variable templates, and
# members or constants with an initialiser it misreads (`std::size_t{8} << 20`, `[[noreturn]]`).
SCANNED = [
    re.compile(r"BRAID_DEFINE_ERROR\(\s*(\w+)"),
    re.compile(r"\bconcept\s+(\w+)"),
]
# A declaration line: specifiers, one type (qualified, with template arguments), the declared name.
DECLARATION = re.compile(r"^(?:\[\[\w+\]\]\s*)?(?:(?:inline|static|constexpr|const|mutable|explicit|virtual)\s+)*"
                         r"[\w:]+(?:<[^;]*?>)?[\s*&]+([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*(?:=|\(|\{|;)")


def scanned_names():
    names = set()
    for d, _, files in os.walk(os.path.join(ROOT, "include", "braid")):
        for f in files:
            if f.endswith((".hpp", ".cuh")):
                text = re.sub(r"//[^\n]*", "", open(os.path.join(d, f), encoding="utf-8").read())
                for rx in SCANNED:
                    names.update(rx.findall(text))
                for line in text.splitlines():
                    m = DECLARATION.match(re.sub(r"^\s*template\s*<[^>]*>\s*", "", line).strip())
                    if m:
                        names.add(m.group(1))
    return names


def documentation():
    return {os.path.relpath(p, ROOT): open(p, encoding="utf-8").read() for p in doc_examples.markdown_files()}


def synopsis_names(code):
    names = set()
    for raw in code.splitlines():
        line = re.sub(r"//.*", "", raw)
        line = line.replace("…", "")
        line = re.sub(r"\btemplate\s*<[^>]*>", "", line)  # template parameters are not braid's names
        for m in re.finditer(r"\b(?:class|struct|enum class|enum|concept|using|namespace)\s+(\w+)", line):
            names.add(m.group(1))
        for m in re.finditer(r"([A-Za-z_][\w:]*)\s*(?:<[^<>()]*>)?\s*\(", line):
            full = m.group(1)
            if full.startswith("std::") or full.startswith("::"):
                continue
            names.add(full.split("::")[-1])
        fields = line
        while re.search(r"\([^()]*\)", fields):  # parameters and their defaults are not members
            fields = re.sub(r"\([^()]*\)", " ", fields)
        for m in re.finditer(r"(?<![:\w])([A-Za-z_]\w*)\s*(?:\[\w*\])?\s*(?==[^=]|;|\{)", fields):
            names.add(m.group(1))
        em = re.search(r"\benum\b[^{]*\{([^}]*)\}", line)
        if em:
            for e in em.group(1).split(","):
                e = e.split("=")[0].strip()
                if e:
                    names.add(e)
    return {n for n in names if n not in NOT_DECLARATIONS and not n.isdigit()}


def main():
    tags = header_tags()
    declared = {name for name, *_ in tags} | scanned_names()
    docs = documentation()
    problems = []

    # 1. Documented names exist.
    for b in doc_examples.blocks():
        if b.kind != "synopsis":
            continue
        for n in sorted(synopsis_names(b.code)):
            if n not in declared:
                problems.append(f"{b.rel}:{b.line}: the synopsis declares `{n}`, which include/braid does not declare")
    for rel, text in docs.items():
        for m in re.finditer(r"\bbraid::((?:\w+::)*\w+)", text):
            line = text.count("\n", 0, m.start()) + 1
            for part in m.group(1).split("::"):
                if part not in declared:
                    problems.append(f"{rel}:{line}: `braid::{m.group(1)}`: `{part}` is not declared in include/braid")
                    break

    # 2. Public names are documented.
    words = set()
    for text in docs.values():
        words.update(re.findall(r"[A-Za-z_]\w*", text))
    public_classes = {f"{f.get('namespace')}::{n}" for n, _, k, f in tags
                      if k in ("class", "struct", "enum", "union") and f.get("namespace") in PUBLIC}
    # A member declared private in its class and defined out of it: the definition's tag has no access.
    hidden = {(next((f[k] for k in ("class", "struct") if k in f), None), n) for n, _, _, f in tags
              if f.get("access") in ("private", "protected")}
    seen = set()
    for name, path, kind, fields in tags:
        if kind in ("local", "parameter", "macro", "header", "namespace", "typedef_local") or "::" in name:
            continue
        if fields.get("access") in ("private", "protected"):
            continue
        scope = next((fields[k] for k in ("namespace", "class", "struct", "enum", "union") if k in fields), None)
        if scope is None or not (scope in PUBLIC or scope in public_classes):
            continue
        if name.startswith(("operator", "~")) or name.endswith("_") or (scope, name) in hidden:
            continue
        if name not in words and (scope, name) not in seen:
            seen.add((scope, name))
            problems.append(f"{path}: `{scope}::{name}` ({kind}) is public and named nowhere in README.md or docs/")

    for p in problems:
        print(p)
    checked = sum(1 for b in doc_examples.blocks() if b.kind == "synopsis")
    print(f"api_names: {len(declared)} names declared in include/braid, {checked} synopsis blocks, "
          f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
