"""Copies a built library or program into the wheel's layout with the rpath
it needs there (frontends/c10d/python/mep/meson.build, -Dpython_wheel=true).

Usage: copy_elf.py PATCHELF SRC DST RPATH   (RPATH '-': none)
"""
import shutil
import subprocess
import sys


def main(argv):
    if len(argv) != 4 or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    patchelf, src, dst, rpath = argv
    shutil.copy2(src, dst)  # the file a link points to, with its mode
    opts = ["--remove-rpath"] if rpath == "-" else ["--set-rpath", rpath]
    subprocess.run([patchelf, *opts, dst], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
