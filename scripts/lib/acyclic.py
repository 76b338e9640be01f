"""Fails naming every import circle among a crate's modules, each with the imports that make it,
read from the crate's own source with no build and no tool beyond Python's standard library.

    python3 scripts/lib/acyclic.py src/lib.rs
    python3 scripts/lib/acyclic.py --self-test

The module tree is followed from the root file through `mod NAME;` (NAME.rs or NAME/mod.rs) and
inline `mod NAME { ... }` blocks. A module uses another when one of its `use` declarations, or a
path in its code that starts at `crate`, `super`, `self` or a name one of its `use`s bound,
reaches an item of that module. A path is followed to the module that defines the item, through
the `use` declarations of the modules it passes (a `pub use` re-export leads on to where the item
is defined, a glob re-export to the module it names), as rust-analyzer reads it. A child
module's name in its parent's code (`child::f()`, a field of type `child::T`) is the parent
using its own part, not an import, as cargo-modules (which this check replaced) read it too:
on every commit it passed, this check finds no circle either, save one that `crate::` and
`super::` paths in function bodies hid from it. Items under `#[cfg(test)]` (test
modules, test-only imports) are left out, as in the library that ships; everything else is read
whatever its cfg, so a circle behind a feature is found too. Comments, strings and character
literals are read as blanks.
"""

import os
import re
import sys
import tempfile
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
CHAR = re.compile(r"'(?:[^'\\\n]|\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|.))'")
RAW = re.compile(r'[bc]?r(#*)"')
STRING = re.compile(r'[bc]?"')
MOD = re.compile(rf"\bmod\s+({IDENT})\s*([;{{])")
USE = re.compile(r"\buse\s+([^;]*);")
ITEM = re.compile(
    rf"\b(?:struct|enum|union|trait|type|fn|static(?:\s+mut)?|const(?!\s+fn\b)|macro_rules!)\s+({IDENT})"
)
PATH = re.compile(rf"(?<![\w:])({IDENT}(?:\s*::\s*{IDENT})+)")
CFG_TEST = re.compile(r"#\[cfg\(test\)\]")
ATTRIBUTE = re.compile(r"\s*#\[[^\]]*\]")
KEYWORDS = {"crate", "super", "self"}


def blank(text):
    return re.sub(r"[^\n]", " ", text)


def strip(text):
    """The text with comments, strings and character literals blanked, lines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        ident_before = i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
        elif not ident_before and (m := RAW.match(text, i)):
            end = text.find('"' + m.group(1), m.end())
            j = n if end < 0 else end + 1 + len(m.group(1))
        elif not ident_before and (m := STRING.match(text, i)):
            j = m.end()
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
        elif text[i] == "'" and (m := CHAR.match(text, i)):
            j = m.end()
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(blank(text[i:j]))
        i = j
    return "".join(out)


def block_end(text, start):
    """The index just past the `}` closing the `{` at start."""
    depth = 0
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def item_end(text, start):
    """The index just past the item starting at start: its `;`, or its first block."""
    semi, brace = text.find(";", start), text.find("{", start)
    if brace < 0 or 0 <= semi < brace:
        return len(text) if semi < 0 else semi + 1
    return block_end(text, brace)


def without_test_items(text):
    """The text with every item under `#[cfg(test)]` blanked (its other attributes too)."""
    while m := CFG_TEST.search(text):
        start = m.end()
        while a := ATTRIBUTE.match(text, start):
            start = a.end()
        end = item_end(text, start)
        text = text[: m.start()] + blank(text[m.start() : end]) + text[end:]
    return text


def depth_zero(text):
    """The text with everything inside braces blanked: the module's own items' headers."""
    out, depth = [], 0
    for c in text:
        if c == "}":
            depth -= 1
        out.append(c if depth == 0 or c == "\n" else " ")
        if c == "{":
            depth += 1
    return "".join(out)


def use_tree(tree, prefix=()):
    """The bindings of one `use` tree: (name bound, full path as segments); a glob binds "*"."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+", "@", tree))
    if tree.startswith("::"):
        tree = tree[2:]
    if tree.endswith("}"):
        head, _, inner = tree[:-1].partition("{")
        base = prefix + tuple(s for s in head.split("::") if s)
        parts, depth, start = [], 0, 0
        for j, c in enumerate(inner):
            depth += (c == "{") - (c == "}")
            if c == "," and depth == 0:
                parts.append(inner[start:j])
                start = j + 1
        parts.append(inner[start:])
        return [b for part in parts if part for b in use_tree(part, base)]
    path, _, alias = tree.partition("@")
    if not alias and not re.fullmatch(rf"(?:{IDENT}::)*(?:{IDENT}|\*)", tree):
        return []
    segments = prefix + tuple(path.split("::"))
    if segments[-1] == "self":
        segments = segments[:-1]
    if segments[-1] == "*":
        return [("*", segments[:-1])]
    return [(alias or segments[-1], segments)]


class Module:
    def __init__(self, path, file, text):
        self.path, self.file, self.text = path, file, text
        self.children = {}
        top = depth_zero(text)
        self.items = set(ITEM.findall(top))
        self.bindings = defaultdict(list)  # name -> full paths bound by the module's own `use`s
        for m in USE.finditer(text):
            if top[m.start()] == " ":
                continue  # a `use` inside a function's body binds nothing for other modules
            for name, segments in use_tree(m.group(1)):
                self.bindings[name].append(segments)


class Crate:
    def __init__(self, root):
        self.modules = {}
        self.load((), root, os.path.dirname(root), strip(read(root)))

    def load(self, path, file, child_dir, text):
        """Reads module `path` (text already stripped), its inline modules and its module files."""
        text = without_test_items(text)
        own, inline = text, []
        for m in MOD.finditer(depth_zero(text)):
            name = m.group(1)
            if m.group(2) == "{":
                end = block_end(text, m.end() - 1)
                inline.append((name, m.end(), end - 1))
                own = own[: m.end()] + blank(own[m.end() : end - 1]) + own[end - 1 :]
                continue
            for candidate in (os.path.join(child_dir, name + ".rs"),
                              os.path.join(child_dir, name, "mod.rs")):
                if os.path.isfile(candidate):
                    break
            else:
                sys.exit(f"acyclic: {file}: mod {name}; has no file in {child_dir}")
            base = os.path.basename(candidate)
            grand_dir = os.path.dirname(candidate) if base == "mod.rs" else candidate[:-3]
            self.load(path + (name,), candidate, grand_dir, strip(read(candidate)))
        for name, start, end in inline:
            self.load(path + (name,), file, os.path.join(child_dir, name),
                      blank(text[:start]) + text[start:end])
        module = self.modules[path] = Module(path, file, own)
        for child in self.modules:
            if len(child) == len(path) + 1 and child[:-1] == path:
                module.children[child[-1]] = child

    def resolve(self, at, segments, hops=0):
        """The module defining what `segments` names from module `at`, or None outside the crate."""
        if hops > 32 or not segments:
            return None
        module = self.modules[at]
        first, rest = segments[0], segments[1:]
        if first == "crate":
            current = ()
        elif first in ("self", "super"):
            current = at
            while segments and segments[0] in ("self", "super"):
                if segments[0] == "super":
                    current = current[:-1]
                segments = segments[1:]
            rest = segments
        elif first in module.children:
            current = module.children[first]
        elif first in module.bindings:
            for bound in module.bindings[first]:
                found = self.resolve(at, bound + rest, hops + 1)
                if found is not None:
                    return found
            return None
        else:
            return None
        for i, segment in enumerate(rest):
            here = self.modules[current]
            if segment in here.children:
                current = here.children[segment]
            elif segment in here.items:
                return current
            elif segment in here.bindings:
                for bound in here.bindings[segment]:
                    found = self.resolve(current, bound + rest[i + 1 :], hops + 1)
                    if found is not None:
                        return found
                return current
            else:
                for glob in here.bindings.get("*", ()):
                    found = self.resolve(current, glob + rest[i:], hops + 1)
                    if found is not None and found != current:
                        return found
                return current
        return current

    def imports(self):
        """{module: {module it uses: (file, line) of the first such use}}."""
        edges = defaultdict(dict)
        for path, module in self.modules.items():
            found = []
            for m in USE.finditer(module.text):
                found += [(segments, m.start()) for _, segments in use_tree(m.group(1))]
            for m in PATH.finditer(module.text):
                segments = tuple(re.split(r"\s*::\s*", m.group(1)))
                if segments[0] in KEYWORDS or (
                    segments[0] in module.bindings and segments[0] not in module.children
                ):
                    found.append((segments, m.start()))
            for segments, offset in found:
                target = self.resolve(path, segments)
                if target is not None and target != path and target not in edges[path]:
                    line = module.text.count("\n", 0, offset) + 1
                    edges[path][target] = (module.file, line)
        return edges


def read(file):
    with open(file, encoding="utf-8") as f:
        return f.read()


def circles(edges):
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index, low, on, stack, found = {}, {}, set(), [], []
    nodes = sorted(set(edges) | {w for ws in edges.values() for w in ws})
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
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
                    work.append((w, iter(sorted(edges.get(w, ())))))
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


def name(path):
    return "::".join(("crate",) + path)


def check(root, out=sys.stdout, err=sys.stderr):
    """Prints the crate's circles to err (1) or its size to out (0)."""
    crate = Crate(root)
    edges = crate.imports()
    found = circles(edges)
    for component in found:
        print(f"import circle of {len(component)} modules:", file=err)
        members = set(component)
        for a in component:
            for b in sorted(set(edges[a]) & members):
                file, line = edges[a][b]
                print(f"  {name(a)} -> {name(b)}  ({file}:{line})", file=err)
    if found:
        return 1
    print(f"acyclic: {len(crate.modules)} modules, {sum(map(len, edges.values()))} imports, no circle", file=out)
    return 0


SELF_TEST = {
    # Each way of reaching another module: a grouped `use` with an alias and `self`, a child
    # module by name, `super`, a path in code, a name bound by a `use` and used in code, a
    # parent's `pub use` re-export (it leads to the definer), a glob re-export.
    "lib.rs": """
        pub mod a;
        pub mod b;
        mod c { pub mod d { pub fn f() {} } pub use d::f; }
        pub mod e;
        fn y() { a::g(); }
    """,
    "a.rs": """
        //! use crate::b; (a comment is no import)
        use crate::{c::{self as cc}, e as ee};
        pub struct A;
        pub fn g() { let _ = "crate::b::B"; let _ = '{'; cc::f(); }
    """,
    "b.rs": """
        pub struct B;
        #[cfg(test)]
        mod tests { use crate::a::A; }
    """,
    "e/mod.rs": """
        mod inner;
        pub use inner::*;
        pub struct E;
    """,
    "e/inner.rs": """
        pub struct Deep;
        fn h() -> super::E { super::E }
        fn k() { crate::b::B; }
    """,
}


def self_test():
    def edges_of(files):
        with tempfile.TemporaryDirectory() as root:
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
                with open(os.path.join(root, path), "w") as f:
                    f.write(text)
            crate = Crate(os.path.join(root, "lib.rs"))
            return {name(a): sorted(name(b) for b in bs) for a, bs in crate.imports().items() if bs}

    got = edges_of(SELF_TEST)
    want = {
        "crate::a": ["crate::c", "crate::c::d", "crate::e"],
        "crate::c": ["crate::c::d"],
        "crate::e": ["crate::e::inner"],
        "crate::e::inner": ["crate::b", "crate::e"],
    }
    assert got == want, got
    assert circles(got) == [["crate::e", "crate::e::inner"]], circles(got)
    # A planted circle through a re-export and a path in code: b uses Deep through e's glob
    # re-export (so inner, its definer), inner uses b.
    planted = dict(SELF_TEST, **{"b.rs": "pub struct B;\nfn m() -> crate::e::Deep { todo!() }\n"})
    planted_edges = edges_of(planted)
    assert planted_edges["crate::b"] == ["crate::e::inner"], planted_edges
    assert circles(planted_edges) == [["crate::b", "crate::e", "crate::e::inner"]], circles(planted_edges)
    # And with the circle gone, none is found.
    mended = dict(SELF_TEST, **{"e/inner.rs": "pub struct Deep;\nfn k() { crate::b::B; }\n"})
    assert circles(edges_of(mended)) == [], circles(edges_of(mended))


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    return check(sys.argv[1])


if __name__ == "__main__":
    sys.exit(main())
