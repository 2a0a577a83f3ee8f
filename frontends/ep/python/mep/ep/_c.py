"""ctypes bindings of libmep-ep (frontends/ep/include/mep/ep.h) and of the
parts of libmep's public API (mep.h) that mep.ep needs.

The libraries are found by path, through _paths, which meson generates: in
the build tree they are where the build put them; installed, they are at
_paths.INSTALL_LIB_REL from this package: <prefix>/lib for `meson install`
(the package being <prefix>/lib/mep/python/mep/ep), site-packages/
.mep.mesonpy.libs in a wheel (docs/install.md). MEP_EP_LIBRARY (a path to
libmep-ep.so) overrides both. libmep is loaded first, by path and
RTLD_GLOBAL, so that libmep-ep's dependency on it resolves to that same copy
without LD_LIBRARY_PATH.
"""
import ctypes
import os
import threading

from . import _paths

# ep.h
MAX_TOPK = 16
MAX_LOCAL_EXPERTS = 1024
HOST = 0x1
CUDA = 0x2
FP8 = 0x1
ROUND_SCALE = 0x2
UE8M0 = 0x4
ZERO_COPY = 0x8
SEND = 0x10
RECV = 0x20

_vp = ctypes.c_void_p


class CommOpts(ctypes.Structure):
    """mep_comm_opts_t (mep.h)."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("config", _vp),
                ("name", ctypes.c_char_p), ("timeout_ms", ctypes.c_int),
                ("max_size", ctypes.c_int), ("join", ctypes.c_int)]


class Config(ctypes.Structure):
    """mep_ep_config_t."""
    _fields_ = [("struct_size", ctypes.c_size_t),
                ("max_tokens_per_rank", ctypes.c_int), ("hidden", ctypes.c_int),
                ("num_experts", ctypes.c_int), ("flags", ctypes.c_uint),
                ("timeout_us", ctypes.c_int64)]


class DispatchArgs(ctypes.Structure):
    """mep_ep_dispatch_args_t."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("x", _vp), ("topk_idx", _vp),
                ("num_tokens", ctypes.c_int), ("num_topk", ctypes.c_int),
                ("flags", ctypes.c_uint), ("active_ranks", _vp),
                ("timeout_us", ctypes.c_int64), ("recv_x", _vp),
                ("recv_scales", _vp), ("recv_src_info", _vp),
                ("recv_layout_range", _vp), ("recv_count", _vp), ("stream", _vp),
                ("recv_stats", _vp)]


class CombineArgs(ctypes.Structure):
    """mep_ep_combine_args_t."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("x", _vp), ("topk_idx", _vp),
                ("topk_weights", _vp), ("src_info", _vp), ("layout_range", _vp),
                ("num_tokens", ctypes.c_int), ("num_topk", ctypes.c_int),
                ("flags", ctypes.c_uint), ("active_ranks", _vp),
                ("timeout_us", ctypes.c_int64), ("out", _vp), ("stream", _vp)]


# The normal (high-throughput) mode.
NORMAL_MAX_TOPK = 32
_i, _i64 = ctypes.c_int, ctypes.c_int64


class NormalConfig(ctypes.Structure):
    """mep_ep_normal_config_t."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("num_bytes", ctypes.c_size_t),
                ("flags", ctypes.c_uint), ("timeout_us", _i64)]


class LayoutArgs(ctypes.Structure):
    """mep_ep_layout_args_t."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("topk_idx", _vp),
                ("num_tokens", _i), ("num_topk", _i), ("num_experts", _i),
                ("num_ranks", _i), ("ranks_per_host", _i),
                ("num_tokens_per_rank", _vp), ("num_tokens_per_rdma_rank", _vp),
                ("num_tokens_per_expert", _vp), ("is_token_in_rank", _vp),
                ("flags", ctypes.c_uint), ("stream", _vp)]


class NotifyArgs(ctypes.Structure):
    """mep_ep_notify_args_t."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("num_tokens", _i),
                ("num_experts", _i), ("expert_alignment", _i), ("num_channels", _i),
                ("num_tokens_per_rank", _vp), ("num_tokens_per_expert", _vp),
                ("is_token_in_rank", _vp), ("hidden", _i), ("x_elem_size", _i),
                ("num_scales", _i), ("num_topk", _i), ("active_ranks", _vp),
                ("timeout_us", _i64), ("num_recv_tokens", _vp),
                ("num_recv_tokens_per_expert", _vp), ("rank_prefix_matrix", _vp),
                ("channel_prefix_matrix", _vp), ("flags", ctypes.c_uint), ("stream", _vp)]


class NormalDispatchArgs(ctypes.Structure):
    """mep_ep_normal_dispatch_args_t."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("x", _vp), ("num_tokens", _i),
                ("hidden", _i), ("x_elem_size", _i), ("x_scales", _vp),
                ("num_scales", _i), ("scale_token_stride", _i64),
                ("scale_hidden_stride", _i64), ("topk_idx", _vp),
                ("topk_weights", _vp), ("num_topk", _i), ("num_experts", _i),
                ("is_token_in_rank", _vp), ("cached_rank_prefix_matrix", _vp),
                ("num_channels", _i), ("active_ranks", _vp), ("timeout_us", _i64),
                ("recv_capacity", _i), ("recv_x", _vp), ("recv_x_scales", _vp),
                ("recv_src_idx", _vp), ("recv_topk_idx", _vp),
                ("recv_topk_weights", _vp), ("send_head", _vp),
                ("recv_channel_prefix_matrix", _vp), ("stream", _vp)]


class NormalCombineArgs(ctypes.Structure):
    """mep_ep_normal_combine_args_t."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("x", _vp),
                ("num_recv_tokens", _i), ("hidden", _i), ("topk_weights", _vp),
                ("num_topk", _i), ("bias_0", _vp), ("bias_1", _vp),
                ("rank_prefix_matrix", _vp), ("is_token_in_rank", _vp),
                ("num_tokens", _i), ("active_ranks", _vp), ("timeout_us", _i64),
                ("combined_x", _vp), ("combined_topk_weights", _vp), ("stream", _vp),
                ("send_head", _vp), ("num_channels", _i)]


def _lib_dirs():
    """(directory of libmep, directory of libmep-ep) for this package."""
    here = os.path.dirname(os.path.realpath(__file__))
    if here == os.path.realpath(_paths.BUILD_PKG_DIR):
        return _paths.BUILD_CORE_DIR, _paths.BUILD_EP_DIR
    libdir = os.path.normpath(os.path.join(here, _paths.INSTALL_LIB_REL))
    return libdir, libdir


class _Libs:
    def __init__(self):
        ep_path = os.environ.get("MEP_EP_LIBRARY")
        core_dir, ep_dir = _lib_dirs()
        if ep_path:
            core_dir = os.path.dirname(os.path.realpath(ep_path))
        else:
            ep_path = os.path.join(ep_dir, "libmep-ep.so.0")
        core_path = os.path.join(core_dir, "libmep.so.0")
        try:
            if os.path.exists(core_path):
                self.mep = ctypes.CDLL(core_path, mode=ctypes.RTLD_GLOBAL)
            else:  # MEP_EP_LIBRARY elsewhere: its own rpath finds libmep
                self.mep = None
            self.ep = ctypes.CDLL(ep_path, mode=ctypes.RTLD_GLOBAL)
            if self.mep is None:
                self.mep = self.ep  # libmep's symbols, through the dependency
        except OSError as e:
            raise ImportError(f"mep.ep: cannot load libmep-ep ({ep_path}) or libmep "
                              f"({core_path}): {e}; set MEP_EP_LIBRARY to the path of "
                              "libmep-ep.so") from None
        self._declare()

    def _declare(self):
        m, e = self.mep, self.ep
        i, vp, pvp = ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
        sigs = [
            (m, "mep_strerror", ctypes.c_char_p, [i]),
            (m, "mep_last_error", ctypes.c_char_p, []),
            (m, "mep_store_server_start", i, [ctypes.c_char_p, i, pvp]),
            (m, "mep_store_server_port", i, [vp]),
            (m, "mep_store_server_stop", None, [vp]),
            (m, "mep_store_tcp_connect", i, [ctypes.c_char_p, i, i, pvp]),
            (m, "mep_store_destroy", None, [vp]),
            (m, "mep_comm_create", i, [vp, i, i, ctypes.POINTER(CommOpts), pvp]),
            (m, "mep_comm_destroy", i, [vp]),
            (m, "mep_comm_timeout_ms", i, [vp]),
            (m, "mep_barrier", i, [vp, vp]),
            (e, "mep_ep_size_hint", ctypes.c_size_t, [i, i, i, i]),
            (e, "mep_ep_buffer_create", i, [vp, ctypes.POINTER(Config), pvp]),
            (e, "mep_ep_buffer_destroy", i, [vp]),
            (e, "mep_ep_active_ranks", vp, [vp]),
            (e, "mep_ep_combine_buffer", vp, [vp]),
            (e, "mep_ep_dispatch", i, [vp, ctypes.POINTER(DispatchArgs)]),
            (e, "mep_ep_combine", i, [vp, ctypes.POINTER(CombineArgs)]),
            (e, "mep_ep_normal_size_hint", ctypes.c_size_t, [i, i, i, i]),
            (e, "mep_ep_normal_create", i, [vp, ctypes.POINTER(NormalConfig), pvp]),
            (e, "mep_ep_normal_destroy", i, [vp]),
            (e, "mep_ep_normal_pair_bytes", ctypes.c_size_t, [vp]),
            (e, "mep_ep_normal_active_ranks", vp, [vp]),
            (e, "mep_ep_get_dispatch_layout", i, [ctypes.POINTER(LayoutArgs)]),
            (e, "mep_ep_notify_dispatch", i, [vp, ctypes.POINTER(NotifyArgs)]),
            (e, "mep_ep_normal_dispatch", i, [vp, ctypes.POINTER(NormalDispatchArgs)]),
            (e, "mep_ep_normal_combine", i, [vp, ctypes.POINTER(NormalCombineArgs)]),
        ]
        for lib, name, res, args in sigs:
            f = getattr(lib, name)
            f.restype, f.argtypes = res, args
            setattr(self, name[4:], f)  # mep_ep_dispatch -> self.ep_dispatch


def gpu_arch():
    """The GPU architecture the kernels were built for ("sm_90"), or ""."""
    return getattr(_paths, "GPU_ARCH", "")


_libs = None
_lock = threading.Lock()


def libs():
    """The loaded libraries (loaded at the first use, so `import mep.ep`
    works, and says why it cannot, only when a Buffer is used)."""
    global _libs
    with _lock:
        if _libs is None:
            _libs = _Libs()
        return _libs


class MepError(RuntimeError):
    """A call of libmep or libmep-ep failed; `code` is its MEP_ERR_*."""

    def __init__(self, what, code):
        lib = libs()
        last = (lib.last_error() or b"").decode(errors="replace")
        name = (lib.strerror(code) or b"").decode(errors="replace")
        super().__init__(f"mep: {what}: {last or 'failed'} ({name})")
        self.code = code


def check(rc, what):
    """Raises MepError for a negative return code."""
    if rc < 0:
        raise MepError(what, rc)
    return rc
