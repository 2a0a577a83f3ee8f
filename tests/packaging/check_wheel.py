"""Checks of the mep wheel and of an environment it is installed in, for
tests/packaging/run.sh (and tests/gpu/wheel.sh). Each command prints what it
checked and exits 1 on the first failure.

  check_wheel.py wheel FILE BUILD_DIR   what the wheel holds and leaves out;
                                        no rpath into BUILD_DIR (or the /tmp
                                        of the build); mep-info executable
  check_wheel.py installed              (the environment's python) the
                                        package, libmep, libmep-ep and the
                                        plugins come from it, with no
                                        LD_LIBRARY_PATH or MEP_PLUGIN_PATH;
                                        import mep.ep loads no mep._C; a
                                        one-rank "mep" group works
  check_wheel.py mismatch WORK_DIR      (the environment's python) a copy of
                                        the installed package that records
                                        another torch: import mep warns,
                                        mep.ep works, a "mep" group is refused
                                        with the reason, nothing crashes
"""
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

LIBS = ".mep.mesonpy.libs"
NEEDED = ["mep/__init__.py", "mep/_build_info.py", "mep/_ext.py", "mep/info.py",
          "mep/options.py", "mep/ft.py", "mep/_C.cpython-*.so", "mep/_bin/mep-info",
          "mep/ep/__init__.py", "mep/ep/_c.py", "mep/ep/_paths.py",
          f"{LIBS}/libmep.so.0", f"{LIBS}/libmep-ep.so.0",
          f"{LIBS}/mep/plugins/libmep-transport-tcp.so",
          "mep-*.dist-info/entry_points.txt"]
# Data, scripts and headers of a wheel live under *.data/: the meson
# install's programs, headers, pkg-config and config stay out.
LEFT_OUT = ["*.data/*", f"{LIBS}/libmep.so.0.*", f"{LIBS}/libmep-ep.so.0.*",
            f"{LIBS}/pkgconfig/*"]


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def rpaths(path):
    """The RUNPATH/RPATH entries of an ELF file (readelf)."""
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    found = re.findall(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[(.*)\]", out)
    return [p for entry in found for p in entry.split(":") if p]


def check_wheel(wheel, build_dir):
    with zipfile.ZipFile(wheel) as z:
        infos = {i.filename: i for i in z.infolist()}
        names = sorted(infos)
        print(f"{wheel}: {len(names)} files")
        for n in names:
            print(f"  {infos[n].file_size:>10}  {n}")
        for pat in NEEDED:
            if not fnmatch.filter(names, pat):
                fail(f"the wheel has no {pat}")
        for pat in LEFT_OUT:
            if fnmatch.filter(names, pat):
                fail(f"the wheel holds {fnmatch.filter(names, pat)}, which it should leave out")
        if not (infos["mep/_bin/mep-info"].external_attr >> 16) & 0o111:
            fail("mep/_bin/mep-info is not executable in the wheel")
        # Built with CUDA (the kernels' architecture recorded): nvlink too.
        if re.search(r'GPU_ARCH = "sm_', z.read("mep/ep/_paths.py").decode()):
            if f"{LIBS}/mep/plugins/libmep-transport-nvlink.so" not in names:
                fail("a CUDA build without the nvlink plugin")
            print("  a CUDA build: the nvlink plugin is in")
        entry = z.read(fnmatch.filter(names, "mep-*.dist-info/entry_points.txt")[0]).decode()
        if "mep-info = mep.info:main" not in entry:
            fail(f"no mep-info console script in entry_points.txt:\n{entry}")
        with tempfile.TemporaryDirectory() as tmp:
            for n in names:
                if n.endswith(".so") or ".so." in n or n.endswith("/mep-info"):
                    path = z.extract(n, tmp)
                    rp = rpaths(path)
                    print(f"  rpath {n}: {':'.join(rp) or '(none)'}")
                    bad = [p for p in rp if p.startswith(os.path.realpath(build_dir))
                           or p.startswith(build_dir)]
                    if bad:
                        fail(f"{n} keeps an rpath into the build: {bad}")
    print("ok: the wheel's layout")


def loaded(name):
    """Paths of the loaded files whose name starts with `name`."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line}
    return sorted(p for p in paths if os.path.basename(p).startswith(name))


def check_installed():
    for var in ("LD_LIBRARY_PATH", "MEP_PLUGIN_PATH", "PYTHONPATH"):
        if os.environ.get(var):
            fail(f"{var} is set ({os.environ[var]}): the check must run without it")
    prefix = os.path.realpath(sys.prefix)
    import mep.ep
    pkg = os.path.realpath(os.path.dirname(mep.__file__))
    if not pkg.startswith(prefix + os.sep):
        fail(f"mep comes from {pkg}, not from this environment ({prefix})")
    if "mep._C" in sys.modules:
        fail("import mep.ep loaded mep._C")
    from mep import _build_info
    if _build_info.LAYOUT != "wheel":
        fail(f"mep's layout is {_build_info.LAYOUT!r}, not 'wheel'")
    if mep.backend_problem():
        fail(f"the backend is unusable: {mep.backend_problem()}")
    import torch
    import torch.distributed as dist
    if "mep" not in dist.Backend.backend_list:
        fail(f"import mep did not register the backend: {dist.Backend.backend_list}")
    mep.ep._c.libs()  # libmep and libmep-ep, by path
    site = os.path.dirname(pkg)
    want = {lib: [os.path.join(site, LIBS, lib + ".0")] for lib in ("libmep.so", "libmep-ep.so")}
    for lib, paths in want.items():
        if loaded(lib) != paths:
            fail(f"{lib} loaded from {loaded(lib)}, not {paths}")
    dist.init_process_group("mep", store=dist.HashStore(), rank=0, world_size=1)
    x = torch.arange(4.0)
    dist.all_reduce(x)
    dist.destroy_process_group()
    if "mep._C" not in sys.modules or not torch.equal(x, torch.arange(4.0)):
        fail("a one-rank 'mep' group did not run on mep._C")
    ext = os.path.realpath(sys.modules["mep._C"].__file__)
    if not ext.startswith(pkg + os.sep) or loaded("libmep.so") != want["libmep.so"]:
        fail(f"mep._C ({ext}) or the libmep it loaded ({loaded('libmep.so')}) is not the wheel's")
    print(f"ok: mep {mep.__version__} from {pkg}, torch {torch.__version__}, "
          f"libraries from {os.path.join(site, LIBS)}, mep.ep without mep._C")


MISMATCH_PROBE = r"""
import sys, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import mep
msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
assert any("built against torch 0.0.0+elsewhere" in m for m in msgs), msgs
print("import mep warned:", msgs[0])
import mep.ep
assert "mep._C" not in sys.modules
import torch.distributed as dist
try:
    dist.init_process_group("mep", store=dist.HashStore(), rank=0, world_size=1)
except RuntimeError as e:
    assert "built against torch 0.0.0+elsewhere" in str(e), e
    print("init_process_group refused:", str(e).splitlines()[-1])
else:
    raise AssertionError("a 'mep' group was made with a mismatched extension")
assert "mep._C" not in sys.modules
"""


def check_mismatch(work):
    import mep
    pkg = os.path.dirname(os.path.realpath(mep.__file__))
    site = os.path.join(work, "site")
    shutil.rmtree(site, ignore_errors=True)
    shutil.copytree(pkg, os.path.join(site, "mep"))
    shutil.copytree(os.path.join(os.path.dirname(pkg), LIBS), os.path.join(site, LIBS))
    info = os.path.join(site, "mep", "_build_info.py")
    with open(info) as f:
        text = f.read()
    with open(info, "w") as f:
        f.write(re.sub(r'TORCH_VERSION = ".*"', 'TORCH_VERSION = "0.0.0+elsewhere"', text))
    env = dict(os.environ, PYTHONPATH=site)
    r = subprocess.run([sys.executable, "-c", MISMATCH_PROBE], env=env, cwd=work,
                       capture_output=True, text=True, timeout=120)
    print(r.stdout + r.stderr)
    if r.returncode != 0:
        fail(f"the mismatch probe exited {r.returncode}")
    print("ok: another torch is refused with the reason, mep.ep still imports")


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, args = argv[0], argv[1:]
    if cmd == "wheel" and len(args) == 2:
        check_wheel(*args)
    elif cmd == "installed" and not args:
        check_installed()
    elif cmd == "mismatch" and len(args) == 1:
        check_mismatch(args[0])
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
