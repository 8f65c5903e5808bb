#!/usr/bin/env python3
"""Code lines of the workspace's crates, as issue #19's targets count them: the `src` of each
crate, without comment lines, blank lines and unit-test modules (`#[cfg(test)] mod ... {}`).

    scripts/code-lines.py            # every crate, per crate
    scripts/code-lines.py fusee -v   # one crate, per file
"""
import os
import re
import sys


def count(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    n, i, in_block = 0, 0, False
    while i < len(lines):
        line = lines[i].strip()
        if in_block:
            in_block = "*/" not in line
        elif line.startswith("/*"):
            in_block = "*/" not in line
        elif line == "#[cfg(test)]" and i + 1 < len(lines) and re.match(r"\s*mod \w+\s*\{", lines[i + 1]):
            depth, i = 0, i + 1
            while i < len(lines):
                depth += lines[i].count("{") - lines[i].count("}")
                i += 1
                if depth == 0:
                    break
            continue
        elif line and not line.startswith("//"):
            n += 1
        i += 1
    return n


def files(src):
    for root, _, names in os.walk(src):
        for name in sorted(names):
            if name.endswith(".rs"):
                yield os.path.join(root, name)


def main():
    args = [a for a in sys.argv[1:] if a != "-v"]
    verbose = "-v" in sys.argv[1:]
    top = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "crates")
    crates = args or sorted(d for d in os.listdir(top) if os.path.isdir(os.path.join(top, d, "src")))
    for crate in crates:
        src = os.path.join(top, crate, "src")
        if not os.path.isdir(src):
            sys.exit(f"code-lines: no crate {crate!r} (no {src})")
        per_file = [(os.path.relpath(f, src), count(f)) for f in files(src)]
        print(f"{crate:12} {sum(n for _, n in per_file):6}")
        if verbose:
            for f, n in sorted(per_file, key=lambda x: -x[1]):
                print(f"  {f:28} {n:6}")


if __name__ == "__main__":
    main()
