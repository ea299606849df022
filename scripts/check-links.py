#!/usr/bin/env python3
"""Every relative link in README.md, ARCHITECTURE.md and the book's sources
(docs/src/*.md) names a file that exists, and every `#anchor` one of the
headings of the file it names (as mdBook and GitHub make ids: lower case,
punctuation dropped, spaces as `-`). Every chapter file is in SUMMARY.md.
Exit 1 naming each broken link (file:line), else 0. CI runs it after
`mdbook build docs`."""
import glob
import os
import re
import sys

LINK = re.compile(r'(?<!\!)\[[^\]]*\]\(([^)\s]+)\)')


def heading_ids(path):
    ids, fence = set(), False
    for line in open(path, encoding='utf-8'):
        if line.startswith('```'):
            fence = not fence
        elif not fence and re.match(r'#{1,6} ', line):
            text = re.sub(r'[`*_]', '', line.lstrip('#').strip())
            ids.add(re.sub(r'[^\w\- ]', '', text.lower()).replace(' ', '-'))
    return ids


def links(path):
    fence = False
    for n, line in enumerate(open(path, encoding='utf-8'), 1):
        if line.startswith('```'):
            fence = not fence
            continue
        if fence:
            continue
        for m in LINK.finditer(re.sub(r'`[^`]*`', '', line)):
            yield n, m.group(1)


def main():
    files = ['README.md', 'ARCHITECTURE.md'] + sorted(glob.glob('docs/src/*.md'))
    bad = []
    for f in files:
        for n, target in links(f):
            if re.match(r'[a-z]+:', target):
                continue  # http(s), mailto: not checked here
            path, _, anchor = target.partition('#')
            dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            if not os.path.exists(dest):
                bad.append(f'{f}:{n}: {target}: no file {dest}')
            elif anchor and dest.endswith('.md') and anchor not in heading_ids(dest):
                bad.append(f'{f}:{n}: {target}: no heading #{anchor} in {dest}')
    summary = open('docs/src/SUMMARY.md', encoding='utf-8').read()
    for f in sorted(glob.glob('docs/src/*.md')):
        name = os.path.basename(f)
        if name != 'SUMMARY.md' and f'({name})' not in summary:
            bad.append(f'{f}: not in docs/src/SUMMARY.md')
    for b in bad:
        print(b)
    print(f'links checked in {len(files)} files: {len(bad)} broken')
    sys.exit(1 if bad else 0)


if __name__ == '__main__':
    main()
