#!/usr/bin/env python3
"""Prints docs/layers.md from the code: the layers of src/ with their folders and line counts,
the import rule checked on every `crate::` path, the calls that go up through installed entries,
and one row per kernel family with its files in each layer.

usage: scripts/docs/layers.py            print the page
       scripts/docs/layers.py --check    exit 1 if docs/layers.md differs from what this prints, or if
                                    a file imports from a layer above its own
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(ROOT, "src")
PAGE = os.path.join(ROOT, "docs", "layers.md")

# Bottom to top: (name, the top-level modules of src/ in it, what it holds). A file may import
# from its own layer and the layers below; `faces` are two siblings that do not import each
# other.
LAYERS = [
    ("core", ["error", "handle", "dtype", "memory", "node", "config", "version", "seams", "glm52"],
     "the one `Error` and status table; `Dtype`; the opaque handle; size and memory-limit "
     "checks; one typed node per kernel family (`node/`: inputs, outputs, parameters, "
     "`ChunkSize`); the environment read once (`config`); versions; the test switches' "
     "readers (`seams`, constants without the `testing` feature); GLM-5.2's layout arithmetic"),
    ("bridge", ["bridge"],
     "MLX's C++ API through cxx; the CPU primitive; the `metal_kernel` / `cuda_kernel` launches"),
    ("registry", ["registry"], "live handles as never-reused tokens; the process-wide MLX lock"),
    ("backends", ["cpu", "metal", "cuda"],
     "the CPU kernels in Rust; the GPU launches of `kernels/metal/*.metal` (Metal, and MLX CUDA "
     "on the same texts)"),
    ("ops", ["ops"],
     "argument checks naming the argument; graph building; the backend choice (`Backend`)"),
    ("faces", ["api", "capi"],
     "the safe Rust API (`api/`) and the C ABI (`capi/`, `extern \"C\"`), side by side"),
    ("testing", ["testing"], "test hooks, built only with the `testing` feature"),
]
FAMILIES = ["gated_delta", "silu_rms_heads", "gated_rms_norm", "glm52"]
# The columns of the family table: (heading, folder under the repository root, file pattern).
COLUMNS = [
    ("C ABI", "src/capi", None),
    ("Rust API", "src/api", None),
    ("ops", "src/ops", None),
    ("node", "src/node", None),
    ("CPU", "src/cpu", None),
    ("GPU launches", "src/metal", None),
    ("kernel texts", "kernels/metal", ".metal"),
]


def rel(path):
    return os.path.relpath(path, ROOT)


def files_under(folder, exts=(".rs",)):
    out = []
    for root, _, names in os.walk(folder):
        for n in names:
            if n.endswith(exts):
                out.append(os.path.join(root, n))
    return sorted(out)


def top_module(path):
    parts = os.path.relpath(path, SRC).split(os.sep)
    name = parts[0]
    return name[:-3] if name.endswith(".rs") else name


def layer_of(module):
    for i, (_, modules, _) in enumerate(LAYERS):
        if module in modules:
            return i
    return None


def code_text(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"//[^\n]*", "", text)
    # Unit-test modules may reach anywhere.
    return re.split(r"#\[cfg\(test\)\]\s*mod\s+tests", text)[0]


def imports():
    """Every (file, imported top-level module) pair from `crate::` paths."""
    pairs = []
    for path in files_under(SRC):
        if os.path.basename(path) == "lib.rs" and os.path.dirname(path) == SRC:
            continue
        text = code_text(path)
        found = set(re.findall(r"\bcrate::([a-z_][a-z0-9_]*)", text))
        for group in re.findall(r"\buse\s+crate::\{([^}]*)\}", text):
            found.update(re.findall(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", group))
        pairs.extend((path, m) for m in sorted(found))
    return pairs


def violations():
    bad = []
    for path, target in imports():
        mine, theirs = layer_of(top_module(path)), layer_of(target)
        if mine is None or theirs is None:
            continue
        face_cross = LAYERS[mine][0] == "faces" and theirs == mine and top_module(path) != target
        if theirs > mine or face_cross:
            bad.append(f"{rel(path)} imports crate::{target}")
    return bad


def upcalls():
    """The bridge's entries the layers above install (`install_*` in src/bridge/mod.rs), with
    the files that install them."""
    bridge = os.path.join(SRC, "bridge", "mod.rs")
    names = re.findall(r"pub fn (install_[a-z_]+)\(", code_text(bridge))
    rows = []
    for name in names:
        callers = [rel(p) for p in files_under(SRC) if p != bridge and name in code_text(p)]
        rows.append((name, callers))
    return rows


def family_files(family, folder, ext):
    base = os.path.join(ROOT, folder)
    found = []
    for path in files_under(base, (ext,) if ext else (".rs",)):
        first = os.path.relpath(path, base).split(os.sep)[0]
        stem = first[: -len(ext)] if ext and first.endswith(ext) else first
        stem = stem[:-3] if stem.endswith(".rs") else stem
        if stem == family or (ext and stem.startswith(family + "_")):
            found.append(os.path.relpath(path, base))
    return found


def cell(family, folder, ext):
    files = family_files(family, folder, ext)
    if not files:
        return "none"
    if ext:
        return ", ".join(f"`{f}`" for f in files)
    if len(files) == 1 and os.sep not in files[0]:
        return f"`{files[0]}`"
    inner = ", ".join(os.path.relpath(os.path.join(folder, f), os.path.join(folder, family))
                      for f in files)
    return f"`{family}/`: {inner}"


def page():
    out = []
    w = out.append
    w("# Layers and kernel families")
    w("")
    w("Generated by `scripts/docs/layers.py` from the code (`make test-layers` fails when this page")
    w("differs from what the script prints, or when an import breaks the rule below). Paths are")
    w("relative to `src/` unless they start with `kernels/`.")
    w("")
    w("## Layers, bottom to top")
    w("")
    w("| layer | modules | files | holds |")
    w("|---|---|---|---|")
    counted = set()
    for name, modules, holds in LAYERS:
        paths = []
        for m in modules:
            folder = os.path.join(SRC, m)
            if os.path.isdir(folder):
                paths += files_under(folder, (".rs", ".cc", ".h"))
            if os.path.isfile(folder + ".rs"):
                paths.append(folder + ".rs")
        counted.update(paths)
        shown = ", ".join(
            ", ".join(
                f"`{m}{suffix}`"
                for suffix, there in [(".rs", os.path.isfile(os.path.join(SRC, m + ".rs"))),
                                      ("/", os.path.isdir(os.path.join(SRC, m)))]
                if there
            )
            for m in modules
        )
        w(f"| {name} | {shown} | {len(paths)} | {holds} |")
    rest = [p for p in files_under(SRC, (".rs", ".cc", ".h")) if p not in counted]
    w(f"| (root) | {', '.join('`' + os.path.relpath(p, SRC) + '`' for p in rest)} | {len(rest)} "
      "| the crate root: module list, re-exports |")
    w("")
    w("## The import rule")
    w("")
    w("A file imports (`crate::…`) only from its own layer and the layers below; the two faces")
    w("do not import each other. Checked on every `crate::` path of every file (unit-test")
    w("modules excepted): " + (f"{len(violations())} imports break it." if violations()
                               else "no import breaks it."))
    for v in violations():
        w(f"- {v}")
    w("")
    w("Control goes up only at evaluation, from MLX through the bridge's `extern \"Rust\"`")
    w("entries, and reaches the layers above through entries they install (function pointers),")
    w("not imports:")
    w("")
    for name, callers in upcalls():
        w(f"- `bridge::{name}`, installed by {', '.join('`' + c + '`' for c in callers)}")
    w("")
    w("## Kernel families")
    w("")
    w("One name in every layer; a form of a kernel (chunked, pool, packed, backward) sits inside")
    w("its family. CUDA runs the GPU launches' texts through `cuda.rs` (and `cuda/`), shared by")
    w("every family.")
    w("")
    w("| family | " + " | ".join(c[0] for c in COLUMNS) + " |")
    w("|---|" + "---|" * len(COLUMNS))
    for fam in FAMILIES:
        cells = [cell(fam, folder, ext) for _, folder, ext in COLUMNS]
        if fam == "glm52":
            cells[COLUMNS.index(("CPU", "src/cpu", None))] = "`glm52.rs` (core, pure arithmetic)"
        w(f"| {fam} | " + " | ".join(cells) + " |")
    w("")
    return "\n".join(out)


def main():
    text = page()
    if "--check" in sys.argv[1:]:
        ok = True
        if violations():
            print("layers: imports that break the rule:\n  " + "\n  ".join(violations()))
            ok = False
        try:
            with open(PAGE, encoding="utf-8") as f:
                current = f.read()
        except FileNotFoundError:
            current = ""
        if current != text:
            print("layers: docs/layers.md is not what scripts/docs/layers.py prints; run "
                  "`python3 scripts/docs/layers.py > docs/layers.md`")
            ok = False
        if ok:
            print("layers: docs/layers.md is current; no import breaks the rule")
        sys.exit(0 if ok else 1)
    sys.stdout.write(text)


if __name__ == "__main__":
    main()
