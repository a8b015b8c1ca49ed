"""Sets a bundled ELF library's DT_RUNPATH to `$ORIGIN/../mlx/lib:$ORIGIN` in place.

libmlxkern.so is linked with a runpath to the libmlx it was built against (an absolute path on
the build machine). In the wheel it sits in site-packages/mlxkern/, and the libmlx to use is
the mlx package's, site-packages/mlx/lib. The new string is written over the old one in the
dynamic string table (it must not be longer; the rest is zero-filled), so no section moves.
Not ELF (a macOS dylib): nothing to do.
"""

import struct
import sys

NEW = b"$ORIGIN/../mlx/lib:$ORIGIN"
DT_NULL, DT_STRTAB, DT_RPATH, DT_RUNPATH = 0, 5, 15, 29


def set_runpath(path: str, new: bytes = NEW) -> bool:
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        if data[:4] != b"\x7fELF":
            return False
        if data[4] != 2 or data[5] != 1:
            raise SystemExit(f"set_runpath: {path}: only 64-bit little-endian ELF is handled")
        e_phoff, = struct.unpack_from("<Q", data, 0x20)
        e_phentsize, e_phnum = struct.unpack_from("<HH", data, 0x36)
        loads, dynamic = [], None
        for i in range(e_phnum):
            off = e_phoff + i * e_phentsize
            p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from("<IIQQQQ", data, off)
            if p_type == 1:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            raise SystemExit(f"set_runpath: {path}: no dynamic segment")

        def file_offset(vaddr: int) -> int:
            for v, o, n in loads:
                if v <= vaddr < v + n:
                    return o + (vaddr - v)
            raise SystemExit(f"set_runpath: {path}: address {vaddr:#x} is in no loaded segment")

        strtab, paths = None, []
        for off in range(dynamic[0], dynamic[0] + dynamic[1], 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == DT_NULL:
                break
            if tag == DT_STRTAB:
                strtab = val
            elif tag in (DT_RPATH, DT_RUNPATH):
                paths.append(val)
        if strtab is None or not paths:
            raise SystemExit(f"set_runpath: {path}: no string table or no runpath")
        base = file_offset(strtab)
        for index in paths:
            start = base + index
            end = data.index(b"\0", start)
            if len(new) > end - start:
                raise SystemExit(f"set_runpath: {path}: the new runpath is longer than the old one")
            data[start:end] = new + b"\0" * (end - start - len(new))
        f.seek(0)
        f.write(data)
    return True


if __name__ == "__main__":
    for p in sys.argv[1:]:
        set_runpath(p)
