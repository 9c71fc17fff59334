#!/usr/bin/env python3
"""Module dependency graph of the engine crate: which top-level module refers to which
(`crate::NAME` anywhere in its files), and the cycles among them.

    python3 dev/modgraph.py            # edges and cycles
    python3 dev/modgraph.py --dot      # Graphviz
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


def main():
    edges = graph()
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
