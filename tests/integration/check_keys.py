#!/usr/bin/env python3
"""conf/mep.ini and docs/config.md document each in-tree plugin's keys
exactly as the plugin declares them: `mep-info --ini` prints the sections
from the plugins' own tables, and each must appear verbatim in conf/mep.ini,
with a row per key (name and default) in docs/config.md.

Usage: check_keys.py MEP_INFO SOURCE_ROOT PLUGIN... (names to check; a
plugin that is not built here is reported and skipped). The out-of-tree
example plugin is found through $MEP_TEST_SHM_PLUGIN, as its own tests find it."""
import os
import re
import subprocess
import sys


def blocks_of(text):
    out = {}
    for block in text.strip().split("\n\n"):
        head = block.split("\n", 1)[0]
        m = re.fullmatch(r"#\[(\S+)\]", head)
        if not m:
            sys.exit(f"mep-info --ini printed a block without a header: {head!r}")
        out[m.group(1)] = block
    return out


def doc_rows(doc, name):
    head = f"#### `[{name}]`"
    at = doc.find(head)
    if at < 0:
        return None
    nxt = doc.find("\n#", at + len(head))
    return doc[at:nxt if nxt > 0 else len(doc)]


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    info, root, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    env = dict(os.environ)
    shm = env.get("MEP_TEST_SHM_PLUGIN")
    if shm:
        env["MEP_PLUGIN_PATH"] = os.path.dirname(shm) + ":" + \
            env.get("MEP_PLUGIN_PATH", "")
    res = subprocess.run([info, "--ini"], capture_output=True, text=True,
                         timeout=60, env=env)
    if res.returncode != 0:
        sys.exit(f"mep-info --ini failed ({res.returncode}): {res.stderr}")
    blocks = blocks_of(res.stdout)
    ini = open(os.path.join(root, "conf", "mep.ini")).read()
    doc = open(os.path.join(root, "docs", "config.md")).read()
    failed = checked = 0
    for name in names:
        if name not in blocks:
            print(f"skip {name}: not built here (no libmep-transport-{name}.so "
                  f"on MEP_PLUGIN_PATH)")
            continue
        checked += 1
        before = failed
        block = blocks[name]
        if "\n" + block + "\n" not in "\n" + ini + "\n":
            print(f"FAIL conf/mep.ini lacks the [{name}] section as the plugin "
                  f"declares it; mep-info --ini prints:\n{block}")
            failed += 1
        part = doc_rows(doc, name)
        for m in re.finditer(r"^#(\w+) =(?: (.*))?$", block, re.M):
            key, default = m.group(1), m.group(2) or ""
            cell = f"`{default}`" if default else "(empty)"
            row = f"| `{key}` | {cell} |"
            if part is None or row not in part:
                print(f"FAIL docs/config.md under #### `[{name}]` lacks the "
                      f"row '{row}'")
                failed += 1
        if failed == before:
            print(f"ok   [{name}]: {block.count(chr(10) + '#')} lines match")
    if not checked:
        sys.exit("none of the plugins was found")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
