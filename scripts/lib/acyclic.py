"""Reads the module graph `cargo modules dependencies` prints (DOT, "uses" edges between
modules: scripts/check-modules asks for modules only) and fails naming every import circle,
each with the edges that make it. `--self-test` checks that a circle is found.

    python3 scripts/lib/acyclic.py GRAPH.dot
"""

import re
import sys
from collections import defaultdict

EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)" \[label="uses"')


def edges_of(lines):
    edges = defaultdict(set)
    for line in lines:
        m = EDGE.match(line)
        if m and m.group(1) != m.group(2):
            edges[m.group(1)].add(m.group(2))
    return edges


def circles(edges):
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, on, stack, found = {}, {}, set(), [], []
    nodes = sorted(set(edges) | {w for ws in edges.values() for w in ws})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def self_test():
    dot = [
        '"c::a" -> "c::b" [label="uses"];',
        '"c::b" -> "c::a" [label="uses"];',
        '"c::b" -> "c::d" [label="uses"];',
        '"c::a" -> "c::c" [label="owns"];',
    ]
    assert circles(edges_of(dot)) == [["c::a", "c::b"]], circles(edges_of(dot))
    assert circles(edges_of(dot[2:])) == []


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    with open(sys.argv[1]) as f:
        edges = edges_of(f)
    if not edges:
        sys.exit("acyclic: the graph has no edges: not the output of cargo modules dependencies")
    found = circles(edges)
    for component in found:
        print(f"import circle of {len(component)} modules:", file=sys.stderr)
        members = set(component)
        for a in component:
            for b in sorted(edges[a] & members):
                print(f"  {a} -> {b}", file=sys.stderr)
    modules = len(set(edges) | {w for ws in edges.values() for w in ws})
    if found:
        return 1
    print(f"acyclic: {modules} modules, {sum(map(len, edges.values()))} imports, no circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
