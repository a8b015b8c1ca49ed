#!/usr/bin/env python3
"""Lists the backticked paths in the READMEs and docs/ pages that name no file or folder of the
repository, so that a moved file cannot leave a page pointing at its old place.

A backticked word is taken as a path when it ends in a source or document suffix (`.rs`, `.metal`,
`.md`, ...) or in `/`. Pages write paths relative to the folder they speak of (`cpu/grad.rs` for
`src/cpu/grad.rs`, `gated_delta/update.rs` for `tests/gated_delta/update.rs`), so a path resolves
when a tracked file or folder is it or ends with it; `{a,b}` is expanded; paths with `...`, `*`,
`<`, `$` or a build output's folder (`build/`, `target/`, `.venv`) are not checked.

usage: scripts/docs/paths.py           print each stale path as FILE:LINE: PATH; exit 1 if any
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUFFIXES = (".rs", ".metal", ".h", ".hpp", ".cuh", ".c", ".cc", ".cpp", ".py", ".sh", ".ts",
            ".swift", ".md", ".toml", ".txt", ".cmake", ".supp", ".json", ".in")
SKIP = ("...", "*", "<", "$", " ", "build/", "target/", ".venv", "~", "http", "::")
# Paths of other projects and of an install, which the pages name on purpose.
OUTSIDE = ("mlx/", "include/mlx/", "lib/", "backend/", "gemms/", "bf16_math.h", "MLXConfig.cmake",
           "crate/", "Resources/")


def tracked():
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    names = set()
    for f in filter(None, out):
        names.add(f)
        parts = f.split("/")
        for i in range(1, len(parts)):
            names.add("/".join(parts[:i]) + "/")
    return names


def expand(word):
    m = re.search(r"\{([^{}]*)\}", word)
    if not m:
        return [word]
    return [w for alt in m.group(1).split(",")
            for w in expand(word[:m.start()] + alt + word[m.end():])]


def resolves(path, names, suffixes):
    path = path.lstrip("./") if path.startswith("./") else path
    return path in names or ("/" + path) in suffixes


def main():
    names = tracked()
    suffixes = set()
    for n in names:
        parts = n.rstrip("/").split("/")
        tail = "/" if n.endswith("/") else ""
        for i in range(len(parts)):
            suffixes.add("/" + "/".join(parts[i:]) + tail)
    pages = ["README.md", "bun/README.md", "swift/README.md", "tests/metal_emu/README.md"]
    for folder in ("docs", "docs/hosts"):
        pages += sorted(folder + "/" + f for f in os.listdir(os.path.join(ROOT, folder))
                        if f.endswith(".md"))
    stale = 0
    for page in pages:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                for word in re.findall(r"`([^`\n]+)`", line):
                    if any(s in word for s in SKIP) or word.startswith(("/", ".") + OUTSIDE):
                        continue
                    word = re.sub(r":\d+$", "", word)
                    if not (word.endswith(SUFFIXES) or (word.endswith("/") and len(word) > 1)):
                        continue
                    for path in expand(word):
                        if not resolves(path, names, suffixes):
                            print(f"{page}:{number}: {path}")
                            stale += 1
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
