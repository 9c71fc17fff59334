#!/usr/bin/env python3
"""Module dependency graph of the engine crate: which top-level module refers to which
(`crate::NAME` anywhere in its files), and the cycles among them.

    python3 dev/modgraph.py            # edges and cycles
    python3 dev/modgraph.py --dot      # Graphviz
    python3 dev/modgraph.py --check    # CI: exit 1 on a cycle edge not in the allow-list
    python3 dev/modgraph.py --write-allow   # rewrite the allow-list from the tree

The check is a ratchet (issue 34): `dev/modgraph-allow.txt` lists the edges that lie on a
cycle today, one `a -> b` a line. An edge that closes a new cycle fails CI; an allowed edge
that no longer lies on a cycle fails too, until it is taken off the list, so the list only
shrinks. The layering is clean when the list is empty.
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(__file__), "..", "crates", "veloxy-engine", "src")


def top_module(path):
    rel = os.path.relpath(path, SRC)
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


def strip_tests(text):
    # Unit-test modules may reach anywhere; they are not part of the layering.
    i = text.find("#[cfg(test)]\nmod tests")
    return text if i < 0 else text[:i]


def graph():
    edges = {}
    for root, _, files in os.walk(SRC):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            m = top_module(path)
            if m in ("lib", "main"):
                continue
            text = strip_tests(open(path).read())
            text = re.sub(r"//[^\n]*", "", text)
            names = set(re.findall(r"crate::([a-z_0-9]+)", text))
            # `use crate::{a, b::c}` groups
            for group in re.findall(r"crate::\{([^}]*)\}", text):
                names |= set(re.findall(r"(?:^|,)\s*([a-z_0-9]+)", group))
            edges.setdefault(m, set()).update(n for n in names if n != m)
    return edges


def cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


ALLOW = os.path.join(os.path.dirname(__file__), "modgraph-allow.txt")


def cycle_edges(edges):
    """Every edge whose two ends are in the same strongly connected component."""
    comp = {}
    for i, c in enumerate(cycles(edges)):
        for m in c:
            comp[m] = i
    return sorted(
        f"{a} -> {b}"
        for a in edges
        for b in edges[a]
        if a in comp and comp.get(b) == comp[a]
    )


def check(edges):
    found = set(cycle_edges(edges))
    allowed = set()
    if os.path.exists(ALLOW):
        for line in open(ALLOW):
            line = line.split("#")[0].strip()
            if line:
                allowed.add(line)
    new = sorted(found - allowed)
    gone = sorted(allowed - found)
    for e in new:
        print(f"modgraph: {e}: this edge closes a module cycle (layers import downward only)")
    for e in gone:
        print(f"modgraph: {e}: no longer on a cycle: take it off {os.path.basename(ALLOW)}")
    if new or gone:
        return 1
    print(f"modgraph: ok ({len(found)} allowed cycle edges left, see {os.path.basename(ALLOW)})")
    return 0


def main():
    edges = graph()
    if "--check" in sys.argv:
        sys.exit(check(edges))
    if "--write-allow" in sys.argv:
        with open(ALLOW, "w") as f:
            f.write("# Module edges that lie on a cycle today (issue 34). Only removals are\n"
                    "# allowed: dev/modgraph.py --check fails on a new one and on a stale one.\n")
            for e in cycle_edges(edges):
                f.write(e + "\n")
        return
    if "--dot" in sys.argv:
        print("digraph veloxy_engine {")
        for a in sorted(edges):
            for b in sorted(edges[a]):
                print(f'  "{a}" -> "{b}";')
        print("}")
        return
    for a in sorted(edges):
        print(f"{a} -> {', '.join(sorted(edges[a])) or '-'}")
    cs = cycles(edges)
    print()
    print("cycles:", "none" if not cs else "")
    for c in cs:
        print("  " + " <-> ".join(c))


if __name__ == "__main__":
    main()
