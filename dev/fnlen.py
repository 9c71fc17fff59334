#!/usr/bin/env python3
"""Functions longer than a limit (default 100 lines) and files longer than 600 lines on the
request path of the engine (issue 34's bounds). Counts from the `fn` line to its closing
brace at the same indentation; tests (`mod tests`) are left out.

    python3 dev/fnlen.py            # list them
    python3 dev/fnlen.py --check    # exit 1 if any
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(__file__), "..", "crates", "veloxy-engine", "src")
REQUEST_PATH = ["downstream", "exchange", "upstream", "http1", "cache", "router.rs", "rules.rs",
                "listener", "message.rs", "compress.rs", "static_files", "search"]
FN = re.compile(r"^(\s*)(pub(\([a-z]+\))? )?(async )?(const )?(unsafe )?fn (\w+)")


def files():
    for entry in REQUEST_PATH:
        path = os.path.join(SRC, entry)
        if path.endswith(".rs"):
            yield path
            continue
        for root, _, names in os.walk(path):
            for n in names:
                if n.endswith(".rs"):
                    yield os.path.join(root, n)


def long_fns(path, limit):
    lines = open(path).read().split("\n")
    end = next((i for i, l in enumerate(lines) if l.startswith("#[cfg(test)]")), len(lines))
    out = []
    i = 0
    while i < end:
        m = FN.match(lines[i])
        if m and not lines[i].rstrip().endswith(";"):
            indent = m.group(1)
            j = i + 1
            while j < end and lines[j] != indent + "}":
                j += 1
            n = j - i + 1
            if n > limit:
                out.append((m.group(7), i + 1, n))
            i = j
        i += 1
    return out, end


def main():
    limit = 100
    bad = 0
    for path in sorted(files()):
        rel = os.path.relpath(path, SRC)
        fns, length = long_fns(path, limit)
        if length > 600:
            print(f"{rel}: {length} lines (over 600)")
            bad += 1
        for name, line, n in fns:
            print(f"{rel}:{line}: fn {name}: {n} lines (over {limit})")
            bad += 1
    if "--check" in sys.argv and bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
