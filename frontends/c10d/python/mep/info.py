"""python -m mep.info [ARGS] (the wheel also installs it as the command
mep-info): runs the C tool mep-info that comes with this package, which lists
the transport plugins libmep finds (path, ABI, capabilities, whether each runs
here or why not) and, with --size N, the route every rank of a local N-rank
group picks for each peer. ARGS are mep-info's own; --help lists them.

The tool is run rather than rewritten in Python: it reads the plugins'
tables through transport.h, whose layout grows with the plugin ABI, and one
program keeps the Python and the C answers the same.
"""
import os
import subprocess
import sys

from . import _build_info


def executable():
    """The path of the mep-info program of this package."""
    here = os.path.dirname(os.path.realpath(__file__))
    if here == os.path.realpath(_build_info.BUILD_PKG_DIR):
        return _build_info.BUILD_INFO_EXE
    return os.path.normpath(os.path.join(here, _build_info.INSTALL_INFO_REL))


def main(argv=None):
    """Runs mep-info with argv (default: this command's arguments); returns
    its exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    exe = executable()
    if not os.access(exe, os.X_OK):
        print(f"mep.info: the mep-info program of this package is missing: {exe}",
              file=sys.stderr)
        return 1
    sys.stdout.flush()
    try:
        return subprocess.call([exe, *args])
    except KeyboardInterrupt:  # the tool got the same signal and stops
        return 130


if __name__ == "__main__":
    sys.exit(main())
