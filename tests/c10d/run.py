"""Runs one pytest file of the c10d backend's (or mep.ep's) tests: exits 77
(skip) with the reason when the backend was not built or torch or pytest is
missing. meson's tests pass --pythonpath, the package in the build tree,
which goes first on the path of this process and of the ranks it starts;
without it the tests use the mep that this Python has installed (the wheel:
tests/packaging/run.sh)."""
import argparse
import os
import sys

SKIP = 77


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pythonpath", default="",
                    help="the build directory holding the mep package "
                         "(default: the installed one)")
    ap.add_argument("--not-built", default="",
                    help="why the backend was not built ('' when it was)")
    ap.add_argument("test_file")
    args = ap.parse_args()
    if args.not_built:
        print(f"skip: the c10d backend was not built: {args.not_built}")
        return SKIP
    for mod in ("torch", "pytest"):
        try:
            __import__(mod)
        except ImportError as e:
            print(f"skip: {mod} is not importable by {sys.executable}: {e}")
            return SKIP
    import pytest
    if args.pythonpath:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (args.pythonpath, os.environ.get("PYTHONPATH")) if p)
        sys.path.insert(0, args.pythonpath)
    else:
        import importlib.util
        spec = importlib.util.find_spec("mep")
        print(f"testing the installed mep: {spec.origin if spec else 'none found'}")
    here = os.path.dirname(os.path.abspath(args.test_file))
    # --durations: the slowest tests named in the log, where CI time goes
    rc = pytest.main(["-q", "-p", "no:cacheprovider", "--durations=5",
                      "--rootdir", here, args.test_file])
    # pytest's 5 ("no tests collected") is a failure here, not a skip.
    return int(rc) if int(rc) != 5 else 1


if __name__ == "__main__":
    sys.exit(main())
