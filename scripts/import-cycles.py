#!/usr/bin/env python3
"""Import cycles among src/ modules (non-test code), by Tarjan's SCC over the
`crate::` paths each file names. `top` (default `file`) folds modules into
their stage folders and prints the stage edges.

    python3 scripts/import-cycles.py          # file level
    python3 scripts/import-cycles.py top      # stage level, with the edges

A folder's mod.rs and its own files may refer to each other (the KINDS
table, a child using its parent's types); those edges are not counted.
"""
import re,glob,os,sys
# file-level module graph: module path from file path
def modname(f):
    p=f[len('src/'):-3]
    if p.endswith('/mod'): p=p[:-4]
    if p=='lib': p=''
    return p.replace('/','::')
files=[f for f in glob.glob('src/**/*.rs',recursive=True) if not f.endswith('main.rs')]
mods={modname(f):f for f in files}
edges={}
for m,f in mods.items():
    s=open(f).read()
    # strip tests
    i=s.find('#[cfg(test)]')
    if i>=0: s=s[:i]
    refs=set()
    for r in re.findall(r'crate::((?:\w+::)*\w+)',s):
        parts=r.split('::')
        # longest prefix that is a module
        best=None
        for k in range(len(parts),0,-1):
            c='::'.join(parts[:k])
            if c in mods: best=c;break
        if best and best!=m and not m.startswith(best+'::') and not best.startswith(m+'::') if m else False: refs.add(best)
        elif best and best!=m and m and not best.startswith(m+'::') and not m.startswith(best+'::'): refs.add(best)
    # super:: refs
    edges[m]=refs
level=sys.argv[1] if len(sys.argv)>1 else 'file'
if level=='top':
    E={}
    for m,rs in edges.items():
        t=m.split('::')[0]
        for r in rs:
            u=r.split('::')[0]
            if u!=t: E.setdefault(t,set()).add(u)
    edges=E
# tarjan SCC
idx={};low={};st=[];on=set();out=[];c=[0]
def sc(v):
    idx[v]=low[v]=c[0];c[0]+=1;st.append(v);on.add(v)
    for w in edges.get(v,()):
        if w not in idx: sc(w);low[v]=min(low[v],low[w])
        elif w in on: low[v]=min(low[v],idx[w])
    if low[v]==idx[v]:
        comp=[]
        while True:
            w=st.pop();on.discard(w);comp.append(w)
            if w==v:break
        if len(comp)>1: out.append(comp)
for v in list(edges):
    if v not in idx: sc(v)
print('cycles:',out if out else 'none')
if level=='top':
    for k in sorted(edges): print(k,'->',sorted(edges[k]))
