#!/usr/bin/env python3
"""Keeps the code true to docs/architecture.md.

Checks, over src/ and include/ of the repository given as the first argument:
  1. A file of module M includes "alpaca/N/..." only when N is M or N sits on a lower line of the
     layer list in docs/architecture.md (between the <!-- layers:begin --> and <!-- layers:end -->
     markers, top layer first; modules on one line may not include each other).
  2. Explicit exceptions to "lower is fine" that the document states: data/ never includes dist/.
  3. Headers under include/ include only the C++ standard library, LibTorch (ATen/, c10/, torch/)
     and "alpaca/..." headers: no third-party header leaks into the public interface.
  4. <mpi.h> and <nccl.h> are included only under src/dist/.
Exit status 0 when clean; 1 with one line per violation (file:line: what and why) otherwise.
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
STD_HEADER = re.compile(r"^[a-z_0-9]+$")  # <vector>, <cstdint>, <filesystem>, ...
TORCH_PREFIXES = ("ATen/", "c10/", "torch/")
FORBIDDEN = {("data", "dist"): "data/ takes rank and world size as integers, never a communicator"}


def read_layers(doc: pathlib.Path):
    text = doc.read_text()
    m = re.search(r"<!-- layers:begin -->(.*?)<!-- layers:end -->", text, re.S)
    if not m:
        sys.exit(f"{doc}: no <!-- layers:begin --> ... <!-- layers:end --> block to read the layer order from")
    lines = [l.strip().strip("`") for l in m.group(1).splitlines()]
    lines = [re.sub(r"[`|]", " ", l).split("#")[0].split() for l in lines if l and not l.startswith("```")]
    lines = [l for l in lines if l]
    rank = {}
    for i, mods in enumerate(reversed(lines)):  # bottom line = rank 0
        for mod in mods:
            rank[mod.rstrip("/")] = i
    return rank


def module_of(path: pathlib.Path, root: pathlib.Path):
    rel = path.relative_to(root).parts
    if rel[0] == "src":
        return "main" if len(rel) == 2 else rel[1]
    if rel[0] == "include" and len(rel) >= 3 and rel[1] == "alpaca":
        return rel[2]
    return None


def check(root: pathlib.Path):
    rank = read_layers(root / "docs" / "architecture.md")
    problems = []
    files = sorted(p for d in ("src", "include") for p in (root / d).rglob("*")
                   if p.suffix in (".h", ".cpp", ".inc", ".hpp", ".cu"))
    for path in files:
        mod = module_of(path, root)
        rel = path.relative_to(root)
        if mod not in rank:
            problems.append(f"{rel}: module '{mod}' is not in the layer list of docs/architecture.md")
            continue
        in_public = rel.parts[0] == "include"
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            kind, name = m.groups()
            where = f"{rel}:{no}"
            if name in ("mpi.h", "nccl.h") and not str(rel).startswith("src/dist/"):
                problems.append(f"{where}: <{name}> outside src/dist/ (only the communicators talk MPI/NCCL)")
            if kind == '"' and name.startswith("alpaca/"):
                parts = name.split("/")
                target = parts[1] if len(parts) > 2 else None
                if target is None or target == mod:
                    continue
                if target not in rank:
                    problems.append(f"{where}: includes {name} of unknown module '{target}'")
                elif (mod, target) in FORBIDDEN:
                    problems.append(f"{where}: {mod}/ includes {name}: {FORBIDDEN[(mod, target)]}")
                elif rank[target] >= rank[mod]:
                    how = "the same layer as" if rank[target] == rank[mod] else "a higher layer than"
                    problems.append(f"{where}: {mod}/ includes {name}, which is {how} {mod}/ "
                                    f"(docs/architecture.md: dependencies point down)")
            elif in_public and kind == "<":
                if not (STD_HEADER.match(name) or name.startswith(TORCH_PREFIXES)):
                    problems.append(f"{where}: third-party header <{name}> in include/; include it in the .cpp "
                                    "(public headers expose only the standard library and LibTorch)")
            elif in_public and kind == '"':
                problems.append(f'{where}: "{name}" in include/ is not an alpaca/ header')
    return problems


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    problems = check(root)
    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} violation(s) of docs/architecture.md")
        return 1
    print("layering: clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
