#!/usr/bin/env python3
"""Module dependency graph of the engine crate: which top-level module refers to which
(`crate::NAME` anywhere in its files), and the cycles among them.

    python3 dev/modgraph.py            # edges and cycles
    python3 dev/modgraph.py --dot      # Graphviz
    python3 dev/modgraph.py --check    # CI: exit 1 on a cycle or an upward edge
    python3 dev/modgraph.py --write-allow   # rewrite the allow-list from the tree

Layers (`LAYERS` below, the order `lib.rs`'s Layout documents): every module belongs to one;
an edge may point to its own layer or a lower one, never up. Within a layer the modules must
not form a cycle. A module in no layer fails the check too, so a new module takes a place.

The allow-list (`dev/modgraph-allow.txt`, one `a -> b` a line) names exceptions, cycle or
upward edges; it is empty, and `--check` fails on an allowed edge that is no longer needed,
so it can only shrink.
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


# Top to bottom. The request path: entry (server, admin) -> downstream codecs -> exchange
# driver -> the worker's and the process's state and the compiled config -> the exchange's
# steps -> upstream clients and TLS -> primitives every layer may use.
LAYERS = [
    ("entry", ["server", "admin"]),
    ("downstream codecs", ["downstream"]),
    ("exchange driver", ["exchange"]),
    ("state and config", ["worker", "park", "runtime", "config"]),
    ("exchange steps", ["router", "rules", "hooks", "auth", "cors", "search", "cache", "fastcgi",
                        "static_files", "access_log", "metrics", "otel", "acme", "message", "hints"]),
    ("upstream, tls and listener sockets", ["upstream", "tls", "listener"]),
    ("primitives", ["limits", "fleet", "http1", "error", "late", "clock", "deadline",
                    "background", "template", "accept", "compress", "access", "heap"]),
]


def layer_of():
    return {m: i for i, (_, ms) in enumerate(LAYERS) for m in ms}


def upward_edges(edges):
    layer = layer_of()
    return sorted(
        f"{a} -> {b}"
        for a in edges
        for b in edges[a]
        if a in layer and b in layer and layer[b] < layer[a]
    )


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
    layer = layer_of()
    unplaced = sorted(m for m in edges if m not in layer)
    for m in unplaced:
        print(f"modgraph: module `{m}` is in no layer: give it a place in LAYERS")
    found = set(cycle_edges(edges)) | set(upward_edges(edges))
    allowed = set()
    if os.path.exists(ALLOW):
        for line in open(ALLOW):
            line = line.split("#")[0].strip()
            if line:
                allowed.add(line)
    new = sorted(found - allowed)
    gone = sorted(allowed - found)
    for e in new:
        a, b = e.split(" -> ")
        why = ("points up the layers" if layer.get(b, 0) < layer.get(a, 0)
               else "closes a module cycle")
        print(f"modgraph: {e}: this edge {why} (layers import downward only)")
    for e in gone:
        print(f"modgraph: {e}: no longer on a cycle: take it off {os.path.basename(ALLOW)}")
    if new or gone or unplaced:
        return 1
    print(f"modgraph: ok ({len(found)} allowed exceptions, see {os.path.basename(ALLOW)})")
    return 0


def main():
    edges = graph()
    if "--check" in sys.argv:
        sys.exit(check(edges))
    if "--write-allow" in sys.argv:
        with open(ALLOW, "w") as f:
            f.write("# Module edges that lie on a cycle today (issue 34). Only removals are\n"
                    "# allowed: dev/modgraph.py --check fails on a new one and on a stale one.\n")
            for e in sorted(set(cycle_edges(edges)) | set(upward_edges(edges))):
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
    print()
    print("layers (top to bottom):")
    for name, ms in LAYERS:
        print(f"  {name}: {', '.join(ms)}")
    ups = upward_edges(edges)
    print("upward edges:", "none" if not ups else "")
    for e in ups:
        print("  " + e)
    cs = cycles(edges)
    print("cycles:", "none" if not cs else "")
    for c in cs:
        print("  " + " <-> ".join(c))


if __name__ == "__main__":
    main()
