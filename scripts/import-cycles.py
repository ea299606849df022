#!/usr/bin/env python3
"""The house checks CI runs (.ci/run): no import cycle among src/ modules
and no src/ file over 700 lines. Exit 1 naming what fails, else 0.

    python3 scripts/import-cycles.py          # file level (CI)
    python3 scripts/import-cycles.py top      # stage level, with the edges

Edges are the `crate::` and `super::` paths each file's non-test code names
(grouped `use crate::{a, b::c}` too), comments and string literals removed;
a path counts for the longest module prefix it names. Cycles are Tarjan's
strongly connected components. A folder's mod.rs and its own files may refer
to each other (the KINDS table, a child using its parent's types); edges
between a module and its ancestor are not counted.
"""
import glob
import re
import sys

MAX_LINES = 700


def modname(f):
    p = f[len('src/'):-3]
    if p.endswith('/mod'):
        p = p[:-4]
    if p == 'lib':
        p = ''
    return p.replace('/', '::')


def code_of(text):
    """The file's non-test code, without comments and string literals."""
    i = text.find('#[cfg(test)]')
    if i >= 0:
        text = text[:i]
    out, j, n = [], 0, len(text)
    while j < n:
        c = text[j]
        if text.startswith('//', j):
            k = text.find('\n', j)
            j = n if k < 0 else k
        elif text.startswith('/*', j):
            k = text.find('*/', j + 2)
            j = n if k < 0 else k + 2
        elif c == 'r' and re.match(r'r#*"', text[j:j + 8]) and (j == 0 or not (text[j - 1].isalnum() or text[j - 1] == '_')):
            hashes = re.match(r'r(#*)"', text[j:]).group(1)
            k = text.find('"' + hashes, j + 2 + len(hashes))
            j = n if k < 0 else k + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            k = j + 1
            while k < n and text[k] != '"':
                k += 2 if text[k] == '\\' else 1
            j = k + 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[j:j + 4]):
            j = text.find("'", j + 1 + (text[j + 1] == '\\')) + 1
        else:
            out.append(c)
            j += 1
    return ''.join(out)


def expand(code):
    """Every path the code names from `crate::`/`super::`, grouped imports
    expanded (`crate::{a, b::{c, d}}` -> crate::a, crate::b::c, ...)."""
    paths = []

    def walk(prefix, s):
        # s: the text inside one brace group
        depth, start, items = 0, 0, []
        for k, ch in enumerate(s):
            if ch == '{':
                depth += 1
            elif ch == '}':
                depth -= 1
            elif ch == ',' and depth == 0:
                items.append(s[start:k])
                start = k + 1
        items.append(s[start:])
        for it in items:
            it = it.strip()
            if not it:
                continue
            b = it.find('{')
            if b >= 0:
                walk(prefix + it[:b].strip().rstrip(':').split('::') if it[:b].strip().rstrip(':') else prefix, it[b + 1:it.rfind('}')])
            else:
                paths.append(prefix + [p.strip() for p in it.split(' as ')[0].split('::') if p.strip()])

    for m in re.finditer(r'\b(crate|super(?:::super)*)::(\{)?', code):
        root = m.group(1).split('::')
        if m.group(2):
            depth, k = 1, m.end()
            while k < len(code) and depth:
                depth += {'{': 1, '}': -1}.get(code[k], 0)
                k += 1
            walk(root, code[m.end():k - 1])
        else:
            rest = re.match(r'(?:\w+::)*\w+', code[m.end():])
            if rest:
                paths.append(root + rest.group(0).split('::'))
    return paths


def graph():
    files = [f for f in glob.glob('src/**/*.rs', recursive=True) if not f.endswith('main.rs') and '/bin/' not in f]
    mods = {modname(f): f for f in files}
    # Modules declared `#[cfg(test)] mod x;` are tests, not the library's
    # structure: a test may use any stage.
    tests = set()
    for m, f in mods.items():
        for t in re.findall(r'#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+(\w+)\s*;', open(f).read()):
            tests.add(f'{m}::{t}' if m else t)
    mods = {m: f for m, f in mods.items() if not any(m == t or m.startswith(t + '::') for t in tests)}
    edges = {}
    for m, f in mods.items():
        here = m.split('::') if m else []
        refs = set()
        for p in expand(code_of(open(f).read())):
            if p[0] == 'crate':
                parts = p[1:]
            else:
                # `super` in module a::b is a, whatever the file layout
                ups = p.count('super')
                base = here[:max(len(here) - ups, 0)]
                parts = base + [x for x in p if x != 'super']
            best = None
            for k in range(len(parts), 0, -1):
                c = '::'.join(parts[:k])
                if c in mods:
                    best = c
                    break
            if best is None or best == m:
                continue
            if m and (best.startswith(m + '::') or m.startswith(best + '::')):
                continue
            refs.add(best)
        edges[m] = refs
    return edges


def cycles(edges):
    idx, low, st, on, out, c = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def sc(v):
        idx[v] = low[v] = c[0]
        c[0] += 1
        st.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in idx:
                sc(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in sorted(edges):
        if v not in idx:
            sc(v)
    return out


def main():
    level = sys.argv[1] if len(sys.argv) > 1 else 'file'
    edges = graph()
    if level == 'top':
        top = {}
        for m, rs in edges.items():
            t = m.split('::')[0]
            for r in rs:
                u = r.split('::')[0]
                if u != t:
                    top.setdefault(t, set()).add(u)
        edges = top
    found = cycles(edges)
    bad = False
    if found:
        bad = True
        for comp in found:
            inner = [f'{a} -> {b}' for a in comp for b in sorted(edges.get(a, ())) if b in comp]
            print('import cycle: ' + ', '.join(comp))
            for e in inner:
                print('    ' + e)
    else:
        print(f'import cycles ({level} level, {len(edges)} modules): none')
    if level == 'top':
        for k in sorted(edges):
            print(k, '->', sorted(edges[k]))
    big = []
    for f in sorted(glob.glob('src/**/*.rs', recursive=True)):
        n = sum(1 for _ in open(f))
        if n > MAX_LINES:
            big.append((n, f))
    if big:
        bad = True
        for n, f in sorted(big, reverse=True):
            print(f'over {MAX_LINES} lines: {f} ({n})')
    else:
        print(f'files over {MAX_LINES} lines in src/: none')
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
