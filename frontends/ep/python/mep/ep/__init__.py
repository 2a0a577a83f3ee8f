"""mep.ep: expert-parallel dispatch and combine, a drop-in for DeepEP's
``deep_ep.Buffer``: its low-latency mode (CPU and CUDA tensors) and its
normal (high-throughput) mode (get_dispatch_layout, dispatch, combine; CPU
tensors so far, docs/ep.md "The normal mode").

    from mep.ep import Buffer
    buf = Buffer(group, 0, Buffer.get_low_latency_rdma_size_hint(T, H, R, E),
                 low_latency_mode=True, num_qps_per_rank=E // R)
    recv_x, recv_count, handle, event, hook = buf.low_latency_dispatch(
        x, topk_idx, T, E, use_fp8=False)
    # ... the local experts turn recv_x [L, R*T, H] into y of the same shape
    out, event, hook = buf.low_latency_combine(y, topk_idx, topk_weights, handle)

The methods, arguments, return values and tensor layouts are DeepEP's
(frontends/ep/include/mep/ep.h lists the layouts). CPU tensors run the CPU
path (the calling thread does the work, over any mep transport); CUDA
tensors run the CUDA path on the current stream. docs/ep.md, "Python",
says what differs from DeepEP.

Setup works over any ProcessGroup (gloo, nccl, mep): rank 0 of the group
starts mep's TCP store server and sends its address to the others over the
group; then every rank makes a mep communicator of its own for the Buffer.
The store server listens on 127.0.0.1 when every rank of the group runs on
this host, else on every interface, and the others reach it at
MEP_EP_STORE_HOST when set, else at the address of rank 0's interface
toward MASTER_ADDR (torchrun sets it), else at rank 0's host name.

`import mep.ep` runs the package's mep/__init__.py first, which registers the
c10d backend but loads no extension, so mep.ep imports wherever the c10d
extension is missing or was built against another torch; libmep and
libmep-ep are loaded with ctypes at the first use of a Buffer (_c.py).

The calls themselves go through mep.ep._ops, a C++ extension built with
the c10d backend's torch (outputs from torch's allocator, libmep-ep called
directly: docs/perf.md, "Eager calls from Python"), wherever it was built
against the running torch; elsewhere, and with MEP_EP_OPS=0, through
ctypes. ops_problem() says which, and why.
"""
import contextlib
import ctypes
import itertools
import os
import socket

import torch
import torch.distributed as dist

from . import _c

__all__ = ["Buffer", "Config", "EventOverlap", "topk_idx_t", "ops_problem"]

# The dtype of topk_idx, as deep_ep.topk_idx_t (DeepEP's default build).
topk_idx_t = torch.int64

_buffer_ids = itertools.count()
_ops_state = []  # [module or None, why not], once looked up


def _ops_lookup():
    if not _ops_state:
        from .. import _ext
        why = None
        if os.environ.get("MEP_EP_OPS", "1") == "0":
            why = "MEP_EP_OPS=0"
        else:
            why = _ext.problem()
        mod = None
        if why is None:
            # Built with the c10d extension, against this torch: a failure
            # to load it is a broken install, not a reason to go slower.
            import importlib
            mod = importlib.import_module("mep.ep._ops")
        _ops_state[:] = [mod, why]
    return _ops_state


def ops_problem():
    """None when dispatch and combine go through the C++ extension
    mep.ep._ops; else why they go through ctypes (a sentence)."""
    mod, why = _ops_lookup()
    return None if mod is not None else why
# How long a rank waits for rank 0's store server to accept it.
_STORE_CONNECT_MS = 60000


class EventOverlap:
    """DeepEP's EventOverlap: what a call with async_finish returns to order
    later work after it. On CUDA it holds an event recorded on the stream
    the call ran on; on CPU (the call has finished when it returns) and
    without async_finish it holds none and waiting is a no-op. Usable as a
    context manager (waits on exit)."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event
        self.extra_tensors = extra_tensors  # kept alive with the event

    def current_stream_wait(self):
        """Makes the current CUDA stream wait for the call's work."""
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.current_stream_wait()
        return False


# DeepEP's NUM_MAX_NVL_PEERS: ranks of one host in its size formulas.
_NVL_PEERS = 8


class Config:
    """DeepEP's performance config of the normal mode: Config(num_sms=20,
    num_max_nvl_chunked_send_tokens=6, num_max_nvl_chunked_recv_tokens=256,
    num_max_rdma_chunked_send_tokens=6, num_max_rdma_chunked_recv_tokens=256).
    mep moves a whole call at once and reads only num_sms: its channels,
    num_sms // 2, shape the handle's channel prefix matrices, and on CUDA
    the sends take num_sms blocks; the other values are kept and checked as
    DeepEP checks them."""

    def __init__(self, num_sms=20, num_max_nvl_chunked_send_tokens=6,
                 num_max_nvl_chunked_recv_tokens=256, num_max_rdma_chunked_send_tokens=6,
                 num_max_rdma_chunked_recv_tokens=256):
        vals = (num_sms, num_max_nvl_chunked_send_tokens, num_max_nvl_chunked_recv_tokens,
                num_max_rdma_chunked_send_tokens, num_max_rdma_chunked_recv_tokens)
        if any(isinstance(v, bool) or not isinstance(v, int) for v in vals):
            raise TypeError("Config takes ints")
        if num_sms < 0:
            raise ValueError(f"num_sms must be >= 0, not {num_sms}")
        if not 0 < num_max_nvl_chunked_send_tokens < num_max_nvl_chunked_recv_tokens:
            raise ValueError("need 0 < num_max_nvl_chunked_send_tokens < "
                             "num_max_nvl_chunked_recv_tokens")
        if num_max_rdma_chunked_send_tokens <= 0 or num_max_rdma_chunked_recv_tokens <= 0:
            raise ValueError("the rdma chunk sizes must be positive")
        s = num_max_rdma_chunked_send_tokens
        num_max_rdma_chunked_recv_tokens = -(-num_max_rdma_chunked_recv_tokens // s) * s
        if not s <= num_max_rdma_chunked_recv_tokens // 2:
            raise ValueError("num_max_rdma_chunked_send_tokens must be at most half of "
                             "num_max_rdma_chunked_recv_tokens")
        self.num_sms = num_sms
        self.num_max_nvl_chunked_send_tokens = num_max_nvl_chunked_send_tokens
        self.num_max_nvl_chunked_recv_tokens = num_max_nvl_chunked_recv_tokens
        self.num_max_rdma_chunked_send_tokens = num_max_rdma_chunked_send_tokens
        self.num_max_rdma_chunked_recv_tokens = num_max_rdma_chunked_recv_tokens

    def get_nvl_buffer_size_hint(self, hidden_bytes, num_ranks):
        """DeepEP's formula (its ring buffers of chunked tokens), for code that
        sizes num_nvl_bytes with it. mep holds a whole call instead: when a
        call needs more, it raises ValueError naming the num_nvl_bytes it
        needs (Buffer.get_normal_buffer_size_hint)."""
        rdma = max(num_ranks // _NVL_PEERS, 1)
        nvl = min(num_ranks, _NVL_PEERS)
        ch = self.num_sms // 2
        t = self.num_max_nvl_chunked_recv_tokens
        n = ch * nvl * (2 * rdma + 3) * 4 + ch * nvl * t * hidden_bytes
        n += ch * nvl * t * 128 * (8 + 4 + 4)
        return (n + 127) // 128 * 128

    def get_rdma_buffer_size_hint(self, hidden_bytes, num_ranks):
        """0: mep has no cross-host normal mode yet (docs/ep.md)."""
        return 0

    def __repr__(self):
        return (f"Config({self.num_sms}, {self.num_max_nvl_chunked_send_tokens}, "
                f"{self.num_max_nvl_chunked_recv_tokens}, "
                f"{self.num_max_rdma_chunked_send_tokens}, "
                f"{self.num_max_rdma_chunked_recv_tokens})")


class _CudaMemory:
    """Device memory torch.as_tensor can wrap (the CUDA array interface)."""

    def __init__(self, ptr, shape, typestr, owner):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (ptr, False),
            "strides": None, "version": 2}
        self._owner = owner  # the Buffer lives as long as a view of its memory


def _view(ptr, device, shape, dtype, owner):
    """A tensor over memory of the C buffer (no copy, not owned by torch)."""
    n = 1
    for s in shape:
        n *= s
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    if device.type == "cuda":
        mem = _CudaMemory(ptr, (nbytes,), "|u1", owner)
        t = torch.as_tensor(mem, device=device)
    else:
        mem = (ctypes.c_byte * nbytes).from_address(ptr)
        mem._owner = owner
        t = torch.frombuffer(mem, dtype=torch.uint8)
    return t.view(dtype).view(shape)


def _check_experts(topk_idx, experts):
    """ValueError for an entry of topk_idx outside -1 .. experts - 1 (on
    CUDA one read of its bounds: a bad index must not reach a kernel)."""
    if topk_idx.numel():
        lo, hi = (int(v) for v in torch.aminmax(topk_idx))
        if lo < -1 or hi >= experts:
            raise ValueError(f"topk_idx holds {lo if lo < -1 else hi}; experts are "
                             f"0 .. {experts - 1}, or -1 for none")


def _check(t, name, dtype, shape, device=None, contiguous=True):
    """TypeError for a non-tensor or a wrong dtype, ValueError for a wrong
    shape (None: any size), device or layout."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, not {t.dtype}")
    if t.dim() != len(shape) or any(w is not None and s != w
                                    for s, w in zip(t.shape, shape)):
        want = ", ".join("*" if w is None else str(w) for w in shape)
        raise ValueError(f"{name} has shape {list(t.shape)}, expected [{want}]")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device}, the call's tensors on {device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _positive_int(v, name):
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    if v <= 0:
        raise ValueError(f"{name} must be positive, not {v}")
    return v


def _timeout(v, name="timeout_us"):
    """None (the default) or a positive number of microseconds."""
    if v is None:
        return None
    return _positive_int(v, name)


def _store_addresses(group, rank, size):
    """(address to bind, address the others connect to) on rank 0."""
    hosts = [None] * size
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    env = os.environ.get("MEP_EP_STORE_HOST")
    if rank != 0:
        return None, None
    if env:
        return None, env
    if all(h == hosts[0] for h in hosts):
        return "127.0.0.1", "127.0.0.1"
    master = os.environ.get("MASTER_ADDR")
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((master, 9))  # picks the route; sends nothing
                addr = s.getsockname()[0]
            if not addr.startswith("127."):
                return None, addr
        except OSError:
            pass
    return None, socket.getfqdn()


class Buffer:
    """The communication buffer of one group for dispatch and combine, in
    DeepEP's low-latency mode and its normal mode. Collective: every rank of
    `group` creates it, in the same order as its other Buffers.

    DeepEP's arguments are accepted, positionally in DeepEP's order, so
    existing code runs unchanged: low_latency_mode, num_qps_per_rank,
    allow_nvlink_for_low_latency_mode, allow_mnnvl, use_fabric,
    enable_shrink (mep always masks ranks that fail: see the mask methods),
    comm and any other keyword (**ignored_deepep_kwargs) mean nothing here
    (mep sizes its low-latency memory itself and picks a transport per
    peer). num_nvl_bytes is the normal mode's memory per rank (made at the
    first normal dispatch, on its tensors' device: host memory, or GPU
    memory on the GPU current then; a call that needs more raises ValueError naming
    the size, see get_normal_buffer_size_hint). num_rdma_bytes, when positive, must be
    at least get_low_latency_rdma_size_hint(...) of the calls (ValueError,
    as DeepEP's assertion). explicitly_destroy=True: the memory is released
    by destroy() only (DeepEP's rule); else also when the Buffer is
    garbage-collected.

    Keywords of mep: timeout_us, the per-call deadline for each source
    (None: the communicator's [core] timeout_ms); active_ranks, an int32
    tensor [group size] on the device of the calls that every call reads
    and updates (None: the Buffer's own, see the property).

    The C buffer is made at the first low_latency_dispatch from its
    num_max_dispatch_tokens_per_rank, hidden size, num_experts and device
    (CPU or CUDA); later calls with other values raise ValueError.
    """

    num_sms = 20

    def __init__(self, group, num_nvl_bytes=0, num_rdma_bytes=0,
                 low_latency_mode=True, num_qps_per_rank=24,
                 allow_nvlink_for_low_latency_mode=True, allow_mnnvl=False,
                 use_fabric=False, explicitly_destroy=False, enable_shrink=False,
                 comm=None, *, timeout_us=None, active_ranks=None,
                 **ignored_deepep_kwargs):
        self._lib = None
        self._buf = self._comm = self._store = self._server = None
        self._fast = None  # mep.ep._ops.Fast once the buffer exists
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("mep.ep.Buffer: torch.distributed is not initialized "
                               "(call init_process_group first)")
        self.group = dist.group.WORLD if group is None else group
        self.rank = dist.get_rank(self.group)
        self.group_size = dist.get_world_size(self.group)
        for name, v in (("num_nvl_bytes", num_nvl_bytes), ("num_rdma_bytes", num_rdma_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an int >= 0, not {v!r}")
        self.num_nvl_bytes = num_nvl_bytes
        self.num_rdma_bytes = num_rdma_bytes
        self.low_latency_mode = low_latency_mode
        self.explicitly_destroy = explicitly_destroy
        self._timeout_us = _timeout(timeout_us)
        self._user_active = None
        if active_ranks is not None:
            _check(active_ranks, "active_ranks", torch.int32, (self.group_size,))
            self._user_active = active_ranks
        self._params = None  # (tokens, hidden, experts, device) once made
        self._nbuf = None  # the normal mode's C buffer, made at its first call
        self._ndev = None  # the device of its calls
        self._normal_active = None
        self._lib = _c.libs()
        self._connect()

    # ------------------------------------------------------------- setup

    def _connect(self):
        """Rank 0 serves a mep store; every rank makes its communicator."""
        lib, rank, size = self._lib, self.rank, self.group_size
        bind, addr = _store_addresses(self.group, rank, size)
        msg = [None]
        if rank == 0:
            srv = ctypes.c_void_p()
            rc = lib.store_server_start(bind.encode() if bind else None, 0,
                                        ctypes.byref(srv))
            if rc < 0:
                err = _c.MepError("starting the store server of mep.ep.Buffer", rc)
                msg[0] = ("error", str(err))
            else:
                self._server = srv
                msg[0] = ("ok", addr, lib.store_server_port(srv))
        # The error travels too: the others fail as rank 0 does, not later.
        dist.broadcast_object_list(msg, src=dist.get_global_rank(self.group, 0),
                                   group=self.group)
        if msg[0][0] != "ok":
            self._release()
            raise RuntimeError(f"mep.ep.Buffer: rank 0 of the group failed: {msg[0][1]}")
        _, host, port = msg[0]
        try:
            store = ctypes.c_void_p()
            _c.check(lib.store_tcp_connect(host.encode(), port, _STORE_CONNECT_MS,
                                           ctypes.byref(store)),
                     f"connecting to the store of mep.ep.Buffer at {host}:{port}")
            self._store = store
            self._name = f"ep{next(_buffer_ids)}".encode()
            opts = _c.CommOpts(struct_size=ctypes.sizeof(_c.CommOpts), name=self._name)
            comm = ctypes.c_void_p()
            _c.check(lib.comm_create(store, rank, size, ctypes.byref(opts),
                                     ctypes.byref(comm)),
                     f"creating the communicator of mep.ep.Buffer (rank {rank} of {size})")
            self._comm = comm
        except BaseException:
            self._release()
            raise

    def _ensure(self, tokens, hidden, experts, device):
        """Makes the C buffer at the first call; checks later calls agree."""
        want = (tokens, hidden, experts, device)
        if self._lib is None or self._comm is None:
            raise RuntimeError("mep.ep.Buffer was destroyed")
        if self._params is not None:
            if want != self._params:
                t, h, e, d = self._params
                raise ValueError(
                    "mep.ep.Buffer was made for num_max_dispatch_tokens_per_rank "
                    f"{t}, hidden {h}, num_experts {e} on {d} (at its first "
                    f"dispatch); this call has {tokens}, {hidden}, {experts} on "
                    f"{device}: use one Buffer per setting")
            return
        size = self.group_size
        if experts % size:
            raise ValueError(f"num_experts ({experts}) is not a multiple of the group "
                             f"size ({size})")
        if experts // size > _c.MAX_LOCAL_EXPERTS:
            raise ValueError(f"{experts // size} experts per rank; at most "
                             f"{_c.MAX_LOCAL_EXPERTS}")
        hint = self._lib.ep_size_hint(tokens, hidden, size, experts)
        if self.num_rdma_bytes > 0 and self.num_rdma_bytes < hint:
            raise ValueError(
                f"num_rdma_bytes ({self.num_rdma_bytes}) is smaller than the low-latency "
                f"size hint ({hint}) for num_max_dispatch_tokens_per_rank {tokens}, "
                f"hidden {hidden}, {size} ranks and {experts} experts: size the Buffer "
                "with Buffer.get_low_latency_rdma_size_hint")
        cfg = _c.Config(struct_size=ctypes.sizeof(_c.Config), max_tokens_per_rank=tokens,
                        hidden=hidden, num_experts=experts,
                        flags=_c.CUDA if device.type == "cuda" else _c.HOST, timeout_us=0)
        buf = ctypes.c_void_p()
        what = (f"creating the mep.ep buffer (rank {self.rank} of {size}, {tokens} tokens "
                f"per rank, hidden {hidden}, {experts} experts, {device})")
        if device.type == "cuda":
            with torch.cuda.device(device):
                _c.check(self._lib.ep_buffer_create(self._comm, ctypes.byref(cfg),
                                                    ctypes.byref(buf)), what)
        else:
            _c.check(self._lib.ep_buffer_create(self._comm, ctypes.byref(cfg),
                                                ctypes.byref(buf)), what)
        self._buf = buf
        self._params = want
        ops = _ops_lookup()[0]
        if ops is not None:
            self._fast = ops.Fast(buf.value, experts // size, size, tokens, hidden, experts,
                                  device, self._lib.ep_combine_buffer(buf) or 0)

    def _live(self):
        if self._buf is None:
            raise RuntimeError("mep.ep.Buffer: no buffer (destroyed, or no "
                               "low_latency_dispatch made it yet)")
        return self._buf

    def _active_arg(self, active_ranks, device):
        """The pointer of the call's active ranks (None: the buffer's own)."""
        t = self._user_active if active_ranks is None else active_ranks
        if t is None:
            return None, None
        _check(t, "active_ranks", torch.int32, (self.group_size,), device)
        return t.data_ptr(), t

    def _call_timeout(self, timeout_us):
        t = _timeout(timeout_us)
        if t is None:
            t = self._timeout_us
        return t or 0

    @staticmethod
    def _stream(device):
        if device.type != "cuda":
            return None
        return torch.cuda.current_stream(device).cuda_stream

    @staticmethod
    def _event(async_finish, device, tensors):
        if async_finish and device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(device))
            return EventOverlap(ev, tensors)
        return EventOverlap(None, tensors if async_finish else None)

    # --------------------------------------------------------------- API

    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden,
                                       num_ranks, num_experts):
        """Bytes of communication memory per rank for these parameters (what
        num_rdma_bytes should be at least)."""
        n = _c.libs().ep_size_hint(int(num_max_dispatch_tokens_per_rank), int(hidden),
                                   int(num_ranks), int(num_experts))
        if n == 0:
            raise ValueError(
                "no low-latency buffer fits num_max_dispatch_tokens_per_rank "
                f"{num_max_dispatch_tokens_per_rank}, hidden {hidden}, {num_ranks} ranks, "
                f"{num_experts} experts (hidden must be a multiple of 128, the experts "
                f"a multiple of the ranks, at most {_c.MAX_LOCAL_EXPERTS} per rank)")
        return n

    @staticmethod
    def is_sm90_compiled():
        """Whether the kernels were built for Hopper (sm_90) or later."""
        arch = _c.gpu_arch()
        return arch.startswith("sm_") and int(arch[3:5]) >= 90

    def get_comm_stream(self):
        """The stream communication runs on: mep enqueues each call on the
        caller's current stream, so this is the current stream."""
        return torch.cuda.current_stream()

    @staticmethod
    def set_num_sms(new_num_sms):
        """DeepEP's SM count of the normal mode (even, as DeepEP asserts):
        the default configs' num_sms, whose half is the number of channels
        of the handle's channel prefix matrices. mep's kernels size
        themselves."""
        if isinstance(new_num_sms, bool) or not isinstance(new_num_sms, int) \
                or new_num_sms <= 0 or new_num_sms % 2:
            raise ValueError(f"the SM count must be a positive even int, not {new_num_sms!r}")
        Buffer.num_sms = new_num_sms

    # ------------------------------------------------- normal mode

    _DISPATCH_CONFIGS = {2: (24, 256), 4: (6, 256), 8: (6, 256), 16: (36, 288),
                         24: (32, 288), 32: (32, 288), 48: (32, 288), 64: (32, 288),
                         96: (20, 480), 128: (20, 560), 144: (32, 720), 160: (28, 720)}
    _COMBINE_CONFIGS = {2: (10, 256), 4: (9, 256), 8: (4, 256), 16: (4, 288),
                        24: (1, 288), 32: (1, 288), 48: (1, 288), 64: (1, 288),
                        96: (1, 480), 128: (1, 560), 144: (2, 720), 160: (2, 720)}

    @staticmethod
    def get_dispatch_config(num_ranks):
        """DeepEP's recommended dispatch Config for num_ranks (with the
        current num_sms); any other number of ranks gets Config(num_sms, 6,
        256) instead of DeepEP's assertion, since mep takes any group size."""
        send, recv = Buffer._DISPATCH_CONFIGS.get(num_ranks, (6, 256))
        return Config(Buffer.num_sms, send, recv, 6, 128)

    @staticmethod
    def get_combine_config(num_ranks):
        """DeepEP's recommended combine Config (any other group size:
        Config(num_sms, 6, 256))."""
        send, recv = Buffer._COMBINE_CONFIGS.get(num_ranks, (6, 256))
        return Config(Buffer.num_sms, send, recv, 6, 128)

    @staticmethod
    def get_normal_buffer_size_hint(num_tokens, hidden, num_ranks, num_topk=8):
        """num_nvl_bytes a Buffer needs for normal-mode calls in which no rank
        sends another more than num_tokens tokens of `hidden` bf16 values (or
        FP8 with hidden / 128 scales) with num_topk experts each (at most
        num_tokens per rank: the tokens a rank has)."""
        n = _c.libs().ep_normal_size_hint(int(num_ranks), int(num_tokens), int(hidden),
                                          int(num_topk))
        if n == 0:
            raise ValueError(f"no normal buffer fits {num_tokens} tokens, hidden {hidden}, "
                             f"{num_ranks} ranks, top-{num_topk} (top-k is at most "
                             f"{_c.NORMAL_MAX_TOPK})")
        return n

    def _normal_device(self, t, what):
        """The device of a normal call: CPU or CUDA, and the one of this
        Buffer's normal calls so far."""
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{what}: tensors on {t.device}; mep.ep takes CPU or CUDA "
                             "tensors")
        if self._nbuf is not None and t.device != self._ndev:
            raise ValueError(f"{what}: tensors on {t.device}; this Buffer's normal mode "
                             f"runs on {self._ndev} (its first dispatch's device)")
        return t.device

    def _ensure_normal(self, device):
        """The normal mode's C buffer (num_nvl_bytes of host memory, or of
        device memory on `device` for CUDA), made at the first normal
        dispatch; collective."""
        if self._lib is None or self._comm is None:
            raise RuntimeError("mep.ep.Buffer was destroyed")
        if self._nbuf is not None:
            return self._nbuf
        if self.num_nvl_bytes <= 0:
            raise ValueError("mep.ep.Buffer: the normal mode needs num_nvl_bytes > 0 (the "
                             "constructor's second argument); "
                             "Buffer.get_normal_buffer_size_hint gives what calls need")
        cuda = device.type == "cuda"
        cfg = _c.NormalConfig(struct_size=ctypes.sizeof(_c.NormalConfig),
                              num_bytes=self.num_nvl_bytes, flags=_c.CUDA if cuda else _c.HOST,
                              timeout_us=0)
        buf = ctypes.c_void_p()
        with torch.cuda.device(device) if cuda else contextlib.nullcontext():
            _c.check(self._lib.ep_normal_create(self._comm, ctypes.byref(cfg),
                                                ctypes.byref(buf)),
                     f"creating the normal-mode buffer (rank {self.rank} of "
                     f"{self.group_size}, num_nvl_bytes {self.num_nvl_bytes}, {device})")
        self._nbuf, self._ndev = buf, device
        if cuda:  # the C buffer's own, which its kernels clear
            self._normal_active = _view(self._lib.ep_normal_active_ranks(buf), device,
                                        (self.group_size,), torch.int32, self)
        elif self._normal_active is None:
            self._normal_active = torch.ones(self.group_size, dtype=torch.int32, device="cpu")
        return buf

    def _normal_args(self, active_ranks, timeout_us, device):
        """(active-ranks pointer, tensor kept alive, timeout) of a normal call."""
        t = active_ranks if active_ranks is not None else self._user_active
        if t is None:
            t = self._normal_active
        _check(t, "active_ranks", torch.int32, (self.group_size,), device)
        return t.data_ptr(), t, self._call_timeout(timeout_us)

    @staticmethod
    def _ptr(t):
        return t.data_ptr() if t is not None and t.numel() else None

    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None,
                            async_finish=False, allocate_on_comm_stream=False):
        """DeepEP's get_dispatch_layout: from topk_idx [N, K] int64 (-1:
        none) returns (num_tokens_per_rank int32 [R], num_tokens_per_rdma_rank
        (None: one host), num_tokens_per_expert int32 [num_experts],
        is_token_in_rank bool [N, R], event). Local: no communication. On
        CUDA one kernel on the current stream, which does not check the
        indices: one outside 0 .. num_experts - 1 counts as -1, and
        dispatch raises ValueError for it."""
        _check(topk_idx, "topk_idx", torch.int64, (None, None))
        dev = self._normal_device(topk_idx, "get_dispatch_layout")
        experts = _positive_int(num_experts, "num_experts")
        size = self.group_size
        if experts % size:
            raise ValueError(f"num_experts ({experts}) is not a multiple of the group "
                             f"size ({size})")
        n, k = topk_idx.shape
        if k > _c.NORMAL_MAX_TOPK:
            raise ValueError(f"topk_idx has {k} columns; at most {_c.NORMAL_MAX_TOPK}")
        if dev.type == "cuda":
            return self._cuda_layout(topk_idx, experts, async_finish)
        per_rank = torch.empty(size, dtype=torch.int32, device="cpu")
        per_expert = torch.empty(experts, dtype=torch.int32, device="cpu")
        in_rank = torch.empty((n, size), dtype=torch.bool, device="cpu")
        args = _c.LayoutArgs(struct_size=ctypes.sizeof(_c.LayoutArgs),
                             topk_idx=self._ptr(topk_idx), num_tokens=n, num_topk=k,
                             num_experts=experts, num_ranks=size, ranks_per_host=size,
                             num_tokens_per_rank=per_rank.data_ptr(),
                             num_tokens_per_expert=per_expert.data_ptr(),
                             is_token_in_rank=self._ptr(in_rank))
        rc = self._lib.ep_get_dispatch_layout(ctypes.byref(args))
        if rc == -1:
            raise ValueError((self._lib.last_error() or b"").decode(errors="replace"))
        _c.check(rc, "get_dispatch_layout")
        return per_rank, None, per_expert, in_rank, self._event(async_finish, topk_idx.device,
                                                                (topk_idx,))

    def _cuda_layout(self, topk_idx, experts, async_finish):
        """get_dispatch_layout on the GPU: one kernel on the current stream
        (mep_ep_get_dispatch_layout with MEP_EP_CUDA). topk_idx is not read
        back to check it (that would stop the stream): an index outside
        0 .. experts - 1 counts as -1 here, and dispatch raises ValueError
        for it."""
        dev, size = topk_idx.device, self.group_size
        n, k = topk_idx.shape
        counts = torch.empty(size + experts, dtype=torch.int32, device=dev)
        per_rank, per_expert = counts[:size], counts[size:]
        in_rank = torch.empty((n, size), dtype=torch.bool, device=dev)
        args = _c.LayoutArgs(struct_size=ctypes.sizeof(_c.LayoutArgs),
                             topk_idx=self._ptr(topk_idx), num_tokens=n, num_topk=k,
                             num_experts=experts, num_ranks=size, ranks_per_host=size,
                             num_tokens_per_rank=per_rank.data_ptr(),
                             num_tokens_per_expert=per_expert.data_ptr(),
                             is_token_in_rank=self._ptr(in_rank), flags=_c.CUDA,
                             stream=self._stream(dev))
        _c.check(self._lib.ep_get_dispatch_layout(ctypes.byref(args)), "get_dispatch_layout")
        return per_rank, None, per_expert, in_rank, self._event(async_finish, dev, (topk_idx,))

    @staticmethod
    def _split_x(x):
        """(x, scales or None, element size, number of scales)."""
        if isinstance(x, tuple):
            if len(x) != 2:
                raise ValueError("x as a tuple must be (fp8 values, scales)")
            x, scales = x
            _check(x, "x[0]", torch.float8_e4m3fn, (None, None))
            if not isinstance(scales, torch.Tensor):
                raise TypeError("x[1] (the scales) must be a torch.Tensor")
            if scales.dtype not in (torch.float32, torch.int32):
                raise TypeError(f"x[1] (the scales) must be float32 or int32, not {scales.dtype}")
            if scales.dim() != 2 or scales.shape[0] != x.shape[0]:
                raise ValueError(f"x[1] has shape {list(scales.shape)}, expected "
                                 f"[{x.shape[0]}, *]")
            if scales.device != x.device:
                raise ValueError("x's values and scales are on different devices")
            return x, scales, 1, scales.shape[1]
        _check(x, "x", torch.bfloat16, (None, None))
        return x, None, 2, 0

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None,
                 topk_weights=None, expert_alignment=1, num_worst_tokens=0, config=None,
                 previous_event=None, async_finish=False, allocate_on_comm_stream=False, *,
                 active_ranks=None, timeout_us=None):
        """DeepEP's normal-mode dispatch. x: bf16 [N, H], or (float8_e4m3fn
        [N, H], scales float32/int32 [N, S]), all on the CPU or all on one
        GPU. Without a handle: the layout (num_tokens_per_rank,
        is_token_in_rank, num_tokens_per_expert, from get_dispatch_layout)
        and optionally topk_idx / topk_weights; returns (recv_x,
        recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert_list,
        handle, event): recv_x packed by source rank, each source's tokens in
        order; recv_topk_idx local to this rank's experts (-1 elsewhere),
        recv_topk_weights 0 there. With a handle (the cached mode): no count
        exchange, no top-k; returns (recv_x, None, None, None, None, event).
        num_worst_tokens > 0: the outputs have that many rows (recv_topk_idx
        -1 past the received) and the list is empty. mep's keywords
        active_ranks and timeout_us as for the low-latency calls. On CUDA a
        non-cached dispatch waits for its count exchange (a kernel)
        to say how many tokens arrive (as DeepEP's does); a cached one only
        queues kernels."""
        xv, scales, es, nscales = self._split_x(x)
        dev = self._normal_device(xv, "dispatch")
        cuda = dev.type == "cuda"
        n, hidden = xv.shape
        if not xv.is_contiguous():
            raise ValueError("x must be contiguous")
        if (hidden * es) % 16:
            raise ValueError(f"hidden {hidden} of {es}-byte values is not a multiple of 16 "
                             "bytes (DeepEP's rule)")
        size, rank = self.group_size, self.rank
        config = self.get_dispatch_config(size) if config is None else config
        if not isinstance(config, Config):
            raise TypeError("config must be a mep.ep.Config")
        if config.num_sms % 2:
            raise ValueError(f"config.num_sms ({config.num_sms}) must be even")
        channels = config.num_sms // 2
        if isinstance(num_worst_tokens, bool) or not isinstance(num_worst_tokens, int) \
                or num_worst_tokens < 0:
            raise ValueError(f"num_worst_tokens must be an int >= 0, not {num_worst_tokens!r}")
        if isinstance(expert_alignment, bool) or not isinstance(expert_alignment, int) \
                or expert_alignment < 1:
            raise ValueError(f"expert_alignment must be an int >= 1, not {expert_alignment!r}")
        if handle is not None:
            if topk_idx is not None or topk_weights is not None:
                raise ValueError("a cached dispatch (with a handle) takes no topk_idx or "
                                 "topk_weights")
            rpm, cpm, rcpm, src_idx, in_rank, send_head = self._unpack_handle(handle, dev)
            _check(in_rank, "handle's is_token_in_rank", torch.bool, (n, size), dev)
            k, experts, per_rank, per_expert = 0, 0, None, None
            capacity = src_idx.shape[0]
            outs = self._recv_outputs(capacity, xv, scales, nscales, 0, src_idx)
        else:
            if num_tokens_per_rank is None or is_token_in_rank is None \
                    or num_tokens_per_expert is None:
                raise ValueError("dispatch without a handle needs num_tokens_per_rank, "
                                 "is_token_in_rank and num_tokens_per_expert "
                                 "(get_dispatch_layout)")
            _check(num_tokens_per_rank, "num_tokens_per_rank", torch.int32, (size,), dev)
            _check(is_token_in_rank, "is_token_in_rank", torch.bool, (n, size), dev)
            _check(num_tokens_per_expert, "num_tokens_per_expert", torch.int32, (None,), dev)
            experts = num_tokens_per_expert.shape[0]
            if experts == 0 or experts % size:
                raise ValueError(f"num_tokens_per_expert has {experts} entries, not a positive "
                                 f"multiple of the group size ({size})")
            if (topk_idx is None) != (topk_weights is None):
                raise ValueError("topk_idx and topk_weights come together")
            k = 0
            if topk_idx is not None:
                _check(topk_idx, "topk_idx", torch.int64, (n, None), dev)
                k = topk_idx.shape[1]
                _check(topk_weights, "topk_weights", torch.float32, (n, k), dev)
                if k > _c.NORMAL_MAX_TOPK:
                    raise ValueError(f"topk_idx has {k} columns; at most {_c.NORMAL_MAX_TOPK}")
                _check_experts(topk_idx, experts)
            in_rank = is_token_in_rank
        if previous_event is not None and cuda:
            previous_event.current_stream_wait()
        buf = self._ensure_normal(dev)
        act_ptr, act, tmo = self._normal_args(active_ranks, timeout_us, dev)
        what = f"dispatch of {n} tokens (rank {rank} of {size})"
        if handle is None:
            local = experts // size
            nrecv_c = ctypes.c_int(-1)
            per_expert = torch.empty(local, dtype=torch.int32, device="cpu")
            rpm = torch.empty((size, size), dtype=torch.int32, device=dev)
            cpm = torch.empty((size, channels), dtype=torch.int32, device=dev)
            # before the exchange, whose wait leaves the GPU idle until
            # the dispatch is queued: what does not depend on its counts
            rcpm = torch.empty((size, channels), dtype=torch.int32, device=dev)
            send_head = torch.empty((n, size), dtype=torch.int32, device=dev)
            if num_worst_tokens:
                capacity = num_worst_tokens
                outs = self._recv_outputs(capacity, xv, scales, nscales, k)
            # on CUDA the count exchange is a kernel on the call's stream,
            # which the call waits for: the two host outputs size the rest
            nargs = _c.NotifyArgs(
                struct_size=ctypes.sizeof(_c.NotifyArgs), num_tokens=n, num_experts=experts,
                expert_alignment=expert_alignment, num_channels=channels,
                num_tokens_per_rank=num_tokens_per_rank.data_ptr(),
                num_tokens_per_expert=num_tokens_per_expert.data_ptr(),
                is_token_in_rank=self._ptr(in_rank), hidden=hidden, x_elem_size=es,
                num_scales=nscales, num_topk=k, active_ranks=act_ptr, timeout_us=tmo,
                num_recv_tokens=ctypes.addressof(nrecv_c),
                num_recv_tokens_per_expert=per_expert.data_ptr(),
                rank_prefix_matrix=rpm.data_ptr(), channel_prefix_matrix=self._ptr(cpm),
                flags=_c.CUDA if cuda else 0, stream=self._stream(dev))
            with torch.cuda.device(dev) if cuda else contextlib.nullcontext():
                rc = self._lib.ep_notify_dispatch(buf, ctypes.byref(nargs))
            if rc == -1:  # the inputs or the buffer size: the same on every rank
                raise ValueError(f"mep: {what}: " + (self._lib.last_error() or b"")
                                 .decode(errors="replace"))
            _c.check(rc, what)
            nrecv = nrecv_c.value
            if num_worst_tokens and num_worst_tokens < nrecv:
                raise ValueError(f"this rank receives {nrecv} tokens, more than "
                                 f"num_worst_tokens ({num_worst_tokens})")
            if not num_worst_tokens:
                capacity = nrecv
                outs = self._recv_outputs(capacity, xv, scales, nscales, k)
        cached = handle is not None
        recv_x, recv_scales, src_idx, recv_idx, recv_w = outs
        dargs = _c.NormalDispatchArgs(
            struct_size=ctypes.sizeof(_c.NormalDispatchArgs), x=self._ptr(xv), num_tokens=n,
            hidden=hidden, x_elem_size=es,
            x_scales=self._ptr(scales) if scales is not None else None, num_scales=nscales,
            scale_token_stride=scales.stride(0) if scales is not None else 0,
            scale_hidden_stride=scales.stride(1) if scales is not None else 0,
            topk_idx=self._ptr(topk_idx) if k else None,
            topk_weights=self._ptr(topk_weights) if k else None, num_topk=k,
            num_experts=experts, is_token_in_rank=self._ptr(in_rank),
            cached_rank_prefix_matrix=rpm.data_ptr() if cached else None,
            num_channels=channels, active_ranks=act_ptr, timeout_us=tmo,
            recv_capacity=capacity, recv_x=self._ptr(recv_x),
            recv_x_scales=self._ptr(recv_scales) if recv_scales is not None else None,
            recv_src_idx=None if cached else self._ptr(src_idx),
            recv_topk_idx=self._ptr(recv_idx) if k else None,
            recv_topk_weights=self._ptr(recv_w) if k else None,
            # the CUDA kernels place tokens by send_head, cached calls too
            send_head=self._ptr(send_head) if cuda or not cached else None,
            recv_channel_prefix_matrix=None if cached else self._ptr(rcpm),
            stream=self._stream(dev))
        with torch.cuda.device(dev) if cuda else contextlib.nullcontext():
            _c.check(self._lib.ep_normal_dispatch(buf, ctypes.byref(dargs)), what)
        out_x = (recv_x, recv_scales) if scales is not None else recv_x
        keep = (xv, scales, in_rank, act, recv_x, recv_scales, rpm, send_head)
        event = self._event(async_finish, dev, keep)
        if cached:
            return out_x, None, None, None, None, event
        if capacity > nrecv:  # rows past the received: none (the call writes the rest)
            src_idx[nrecv:] = -1
            if k:
                recv_idx[nrecv:] = -1
                recv_w[nrecv:] = 0
        counts = [] if num_worst_tokens else per_expert.tolist()
        handle = (rpm, cpm, rcpm, src_idx, in_rank, send_head)
        return out_x, recv_idx, recv_w, counts, handle, event

    @staticmethod
    def _recv_outputs(capacity, xv, scales, nscales, k, src_idx=None):
        """A dispatch's outputs of `capacity` rows: (recv_x, recv_scales,
        recv_src_idx, recv_topk_idx, recv_topk_weights), None where the call
        has none; src_idx when given (a cached call's, the handle's). Left
        unset: the call writes every row it receives (a lost source's too),
        and the caller the rows past them."""
        dev = xv.device
        return (torch.empty((capacity, xv.shape[1]), dtype=xv.dtype, device=dev),
                torch.empty((capacity, nscales), dtype=scales.dtype, device=dev)
                if scales is not None else None,
                torch.empty(capacity, dtype=torch.int32, device=dev) if src_idx is None
                else src_idx,
                torch.empty((capacity, k), dtype=torch.int64, device=dev) if k else None,
                torch.empty((capacity, k), dtype=torch.float32, device=dev) if k else None)

    def _unpack_handle(self, handle, dev):
        if not isinstance(handle, (tuple, list)) or len(handle) != 6:
            raise TypeError("handle must be the 6-tuple dispatch returned")
        rpm, cpm, rcpm, src_idx, in_rank, send_head = handle
        size = self.group_size
        _check(rpm, "handle's rank_prefix_matrix", torch.int32, (size, size), dev)
        _check(src_idx, "handle's recv_src_idx", torch.int32, (None,), dev)
        _check(in_rank, "handle's is_token_in_rank", torch.bool, (None, size), dev)
        _check(send_head, "handle's send_head", torch.int32, (in_rank.shape[0], size), dev)
        return rpm, cpm, rcpm, src_idx, in_rank, send_head

    def combine(self, x, handle, topk_weights=None, bias=None, config=None,
                previous_event=None, async_finish=False, allocate_on_comm_stream=False, *,
                active_ranks=None, timeout_us=None):
        """DeepEP's normal-mode combine: x bf16 [num_recv_tokens, H], the
        rows in the order the dispatch of `handle` delivered them, go back
        to their ranks, which sum them per token without weights (plus
        bias: a bf16 [N, H] tensor or a pair of them). topk_weights float32
        [num_recv_tokens, K] are summed alongside. Returns (combined_x
        bf16 [N, H], combined_topk_weights float32 [N, K] or None, event)."""
        _check(x, "x", torch.bfloat16, (None, None))
        dev = self._normal_device(x, "combine")
        cuda = dev.type == "cuda"
        rpm, _, _, src_idx, in_rank, send_head = self._unpack_handle(handle, dev)
        m, hidden = x.shape
        _check(x, "x", torch.bfloat16, (src_idx.shape[0], hidden), dev)
        if hidden % 8:
            raise ValueError(f"hidden {hidden} is not a multiple of 8 (16 bytes of bf16)")
        if config is not None and not isinstance(config, Config):
            raise TypeError("config must be a mep.ep.Config")
        n, size = in_rank.shape[0], self.group_size
        k = 0
        if topk_weights is not None:
            _check(topk_weights, "topk_weights", torch.float32, (m, None), dev)
            k = topk_weights.shape[1]
            if k > _c.NORMAL_MAX_TOPK:
                raise ValueError(f"topk_weights has {k} columns; at most {_c.NORMAL_MAX_TOPK}")
        biases = bias if isinstance(bias, tuple) else (bias, None)
        if len(biases) != 2:
            raise ValueError("bias is a tensor or a pair of tensors")
        for i, b in enumerate(biases):
            if b is not None:
                _check(b, f"bias[{i}]", torch.bfloat16, (n, hidden), dev)
        if self._nbuf is None:
            raise RuntimeError("mep.ep.Buffer: combine before any normal dispatch")
        if previous_event is not None and cuda:
            previous_event.current_stream_wait()
        act_ptr, act, tmo = self._normal_args(active_ranks, timeout_us, dev)
        out = torch.empty((n, hidden), dtype=torch.bfloat16, device=dev)
        out_w = torch.empty((n, k), dtype=torch.float32, device=dev) if k else None
        # the CUDA kernels read the received count from rank_prefix_matrix
        nrecv = m if cuda else int(rpm[size - 1, self.rank])
        args = _c.NormalCombineArgs(
            struct_size=ctypes.sizeof(_c.NormalCombineArgs), x=self._ptr(x),
            num_recv_tokens=nrecv, hidden=hidden,
            topk_weights=self._ptr(topk_weights) if k and m else None, num_topk=k,
            bias_0=self._ptr(biases[0]) if biases[0] is not None else None,
            bias_1=self._ptr(biases[1]) if biases[1] is not None else None,
            rank_prefix_matrix=rpm.data_ptr(), is_token_in_rank=self._ptr(in_rank),
            num_tokens=n, active_ranks=act_ptr, timeout_us=tmo,
            combined_x=self._ptr(out), combined_topk_weights=self._ptr(out_w) if k else None,
            stream=self._stream(dev), send_head=self._ptr(send_head),
            num_channels=(config or self.get_combine_config(size)).num_sms // 2)
        what = f"combine of {m} rows (rank {self.rank} of {size})"
        with torch.cuda.device(dev) if cuda else contextlib.nullcontext():
            _c.check(self._lib.ep_normal_combine(self._nbuf, ctypes.byref(args)), what)
        keep = (x, topk_weights, act, out, rpm, send_head, biases)
        return out, out_w, self._event(async_finish, dev, keep)

    @staticmethod
    def capture():
        """An EventOverlap over the current CUDA stream's work so far."""
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream())
        return EventOverlap(ev)

    @property
    def active_ranks(self):
        """int32 [group size], 1 = active: the constructor's active_ranks, or
        the buffer's own (on the device of the calls, a view of mep's memory,
        valid while the Buffer lives). A source that misses a call's timeout
        is cleared here and skipped from then on; writing 1 back re-admits it
        at a later call. The buffer's own exists from the first dispatch on."""
        if self._user_active is not None:
            return self._user_active
        if self._buf is None and self._normal_active is not None:
            return self._normal_active  # only the normal mode has run
        buf = self._live()
        ptr = self._lib.ep_active_ranks(buf)
        return _view(ptr, self._params[3], (self.group_size,), torch.int32, self)

    @property
    def timeout_us(self):
        """The per-call deadline for each source in microseconds (settable;
        None restores the communicator's timeout)."""
        if self._timeout_us is not None:
            return self._timeout_us
        if self._comm is None:
            return None
        return self._lib.comm_timeout_ms(self._comm) * 1000

    @timeout_us.setter
    def timeout_us(self, value):
        self._timeout_us = _timeout(value)

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank,
                             num_experts, cumulative_local_expert_recv_stats=None,
                             dispatch_wait_recv_cost_stats=None, use_fp8=True,
                             round_scale=False, use_ue8m0=False, async_finish=False,
                             return_recv_hook=False, *, active_ranks=None,
                             timeout_us=None):
        """Sends each token of x [N, H] bf16 to the ranks of its experts
        (topk_idx [N, K] int64, -1 = none) and receives this rank's.

        Returns (recv_x, recv_count, handle, event, hook) as DeepEP does:
        recv_x is [L, R*T, H] bf16, or with use_fp8 a tuple (float8_e4m3fn
        [L, R*T, H], scales) with float32 scales [L, R*T, H/128] (int32
        [L, R*T, H/512] packed exponents with use_ue8m0), both transposed
        views of [L, H/g, R*T]; recv_count int32 [L]; handle (src_info int32
        [L, R*T], layout_range int64 [L, R], T, H, num_experts) for combine.
        With return_recv_hook only the sends run now and hook() receives.
        dispatch_wait_recv_cost_stats is accepted and left unchanged."""
        flags = ((_c.FP8 if use_fp8 else 0) | (_c.ROUND_SCALE if round_scale else 0)
                 | (_c.UE8M0 if use_ue8m0 else 0))
        fast = self._fast
        if fast is not None:
            act = self._user_active if active_ranks is None else active_ranks
            timeout = self._call_timeout(timeout_us)
            r = fast.dispatch(x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                              flags | (_c.SEND if return_recv_hook else 0),
                              cumulative_local_expert_recv_stats, act, timeout)
            if r is not None:
                return self._dispatched(r, x, topk_idx, flags, act, timeout,
                                        cumulative_local_expert_recv_stats, async_finish,
                                        return_recv_hook)
        _check(x, "x", torch.bfloat16, (None, None))
        device = x.device
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"x is on {device}; mep.ep takes CPU or CUDA tensors")
        n, hidden = x.shape
        _check(topk_idx, "topk_idx", torch.int64, (n, None), device)
        k = topk_idx.shape[1]
        if not 1 <= k <= _c.MAX_TOPK:
            raise ValueError(f"topk_idx has {k} columns; 1 to {_c.MAX_TOPK} are supported")
        tokens = _positive_int(num_max_dispatch_tokens_per_rank,
                               "num_max_dispatch_tokens_per_rank")
        experts = _positive_int(num_experts, "num_experts")
        if hidden % 128 or hidden == 0:
            raise ValueError(f"hidden size {hidden} is not a positive multiple of 128")
        if n > tokens:
            raise ValueError(f"x has {n} tokens, more than num_max_dispatch_tokens_per_rank "
                             f"({tokens})")
        if use_ue8m0 and not (use_fp8 and round_scale):
            raise ValueError("use_ue8m0 needs use_fp8=True and round_scale=True")
        if use_ue8m0 and hidden % 512:
            raise ValueError(f"use_ue8m0 needs a hidden size multiple of 512, not {hidden}")
        if round_scale and not use_fp8:
            raise ValueError("round_scale needs use_fp8=True")
        if device.type == "cpu" and n:
            lo, hi = int(topk_idx.min()), int(topk_idx.max())
            if lo < -1 or hi >= experts:
                raise ValueError(f"topk_idx holds {lo if lo < -1 else hi}; experts are "
                                 f"0 .. {experts - 1}, or -1 for none")
        size = self.group_size
        if experts % size:
            raise ValueError(f"num_experts ({experts}) is not a multiple of the group "
                             f"size ({size})")
        local = experts // size
        if cumulative_local_expert_recv_stats is not None:
            _check(cumulative_local_expert_recv_stats, "cumulative_local_expert_recv_stats",
                   torch.int32, (local,), device)
        act_ptr, act = self._active_arg(active_ranks, device)
        call_timeout = self._call_timeout(timeout_us)
        self._ensure(tokens, hidden, experts, device)
        stats = cumulative_local_expert_recv_stats
        buf = self._live()
        ops = _ops_lookup()[0]
        if ops is not None:
            r = ops.dispatch(buf.value, x, topk_idx, local, size, tokens,
                             flags | (_c.SEND if return_recv_hook else 0), act, call_timeout,
                             stats)
            return self._dispatched(r, x, topk_idx, flags, act, call_timeout, stats,
                                    async_finish, return_recv_hook)
        what = f"low_latency_dispatch of {n} tokens (rank {self.rank} of {size})"
        recv_x, scales, src_info, layout_range, count, phase = self._dispatch_ctypes(
            buf, x, topk_idx, local, tokens, hidden, flags, return_recv_hook, act_ptr,
            call_timeout, device, what, stats)
        keep = (x, topk_idx, act, stats, recv_x, scales, src_info, layout_range, count)
        hook = self._recv_hook(phase, what, keep) if return_recv_hook else None
        handle = (src_info, layout_range, tokens, hidden, experts)
        out_x = (recv_x, scales.transpose(1, 2)) if flags & _c.FP8 else recv_x
        return out_x, count, handle, self._event(async_finish, device, keep), hook

    def _dispatched(self, r, x, topk_idx, flags, act, timeout, stats, async_finish,
                    return_recv_hook):
        """The results of a dispatch made through mep.ep._ops (r: its tuple),
        as low_latency_dispatch returns them. Reads no tensor attribute (see
        ops.cpp: Fast)."""
        rc, recv_x, scales, src_info, layout_range, count = r
        if rc:
            _c.check(rc, f"low_latency_dispatch of {x.shape[0]} tokens (rank {self.rank} "
                         f"of {self.group_size})")
        tokens, hidden, experts, device = self._params
        keep = (x, topk_idx, act, stats, recv_x, scales, src_info, layout_range, count)
        hook = None
        if return_recv_hook:
            ops, buf = _ops_lookup()[0], self._buf.value

            def phase():
                return ops.dispatch_phase(buf, x, topk_idx, recv_x, scales, src_info,
                                          layout_range, count, flags | _c.RECV, act, timeout,
                                          stats)
            hook = self._recv_hook(phase, f"low_latency_dispatch (rank {self.rank})", keep)
        handle = (src_info, layout_range, tokens, hidden, experts)
        out_x = (recv_x, scales) if flags & _c.FP8 else recv_x
        return out_x, count, handle, self._event(async_finish, device, keep), hook

    def _dispatch_ctypes(self, buf, x, topk_idx, local, tokens, hidden, flags, two_phase,
                         act_ptr, call_timeout, device, what, stats):
        """The first (or only) phase of a dispatch through ctypes: its
        outputs and the receive phase's call."""
        n, k = topk_idx.shape
        size = self.group_size
        use_fp8, use_ue8m0 = bool(flags & _c.FP8), bool(flags & _c.UE8M0)
        slots = size * tokens
        if use_fp8:
            recv_x = torch.empty((local, slots, hidden), dtype=torch.float8_e4m3fn,
                                 device=device)
            if use_ue8m0:
                scales = torch.empty((local, hidden // 512, slots), dtype=torch.int32,
                                     device=device)
            else:
                scales = torch.empty((local, hidden // 128, slots), dtype=torch.float32,
                                     device=device)
        else:
            recv_x = torch.empty((local, slots, hidden), dtype=torch.bfloat16, device=device)
            scales = None
        src_info = torch.empty((local, slots), dtype=torch.int32, device=device)
        layout_range = torch.empty((local, size), dtype=torch.int64, device=device)
        count = torch.empty((local,), dtype=torch.int32, device=device)
        args = _c.DispatchArgs(
            struct_size=ctypes.sizeof(_c.DispatchArgs), x=x.data_ptr(),
            topk_idx=topk_idx.data_ptr(), num_tokens=n, num_topk=k,
            flags=flags | (_c.SEND if two_phase else 0),
            active_ranks=act_ptr, timeout_us=call_timeout,
            recv_x=recv_x.data_ptr(), recv_scales=scales.data_ptr() if use_fp8 else None,
            recv_src_info=src_info.data_ptr(), recv_layout_range=layout_range.data_ptr(),
            recv_count=count.data_ptr(), stream=self._stream(device),
            recv_stats=stats.data_ptr() if stats is not None else None)
        _c.check(self._lib.ep_dispatch(buf, ctypes.byref(args)), what)
        phase = self._ctypes_phase(self._lib.ep_dispatch, args, flags, device)
        return recv_x, scales, src_info, layout_range, count, phase

    def _ctypes_phase(self, fn, args, flags, device):
        """The receive phase of a two-phase call made through ctypes."""
        def phase():
            args.flags = flags | _c.RECV
            args.stream = self._stream(device)
            return fn(self._live(), ctypes.byref(args))
        return phase

    def _recv_hook(self, phase, what, keep):
        """The receive phase of a two-phase call, to be called once."""
        done = []

        def hook():
            if done:
                raise RuntimeError(f"mep.ep: the receive hook of {what} was already called")
            done.append(keep)
            self._live()
            _c.check(phase(), what + ", receive hook")
        return hook

    def _check_handle(self, handle):
        if not isinstance(handle, (tuple, list)) or len(handle) != 5:
            raise TypeError("handle must be the 5-tuple low_latency_dispatch returned")
        src_info, layout_range, tokens, hidden, experts = handle
        if self._params is None:
            raise RuntimeError("mep.ep.Buffer: combine before any low_latency_dispatch")
        t, h, e, device = self._params
        if (tokens, hidden, experts) != (t, h, e):
            raise ValueError(f"the handle is for {tokens} tokens per rank, hidden {hidden}, "
                             f"{experts} experts; the Buffer was made for {t}, {h}, {e}")
        local, size = e // self.group_size, self.group_size
        _check(src_info, "handle's src_info", torch.int32, (local, size * t), device)
        _check(layout_range, "handle's layout_range", torch.int64, (local, size), device)
        return src_info, layout_range, t, h, e, device

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt=False,
                            zero_copy=False, async_finish=False, return_recv_hook=False,
                            out=None, combine_wait_recv_cost_stats=None, *,
                            active_ranks=None, timeout_us=None):
        """Sends the local experts' outputs x [L, R*T, H] bf16 (rows as the
        dispatch of `handle` delivered them) back and returns (combined_x,
        event, hook): combined_x [N, H] bf16 (`out` when given) holds
        sum_k topk_weights[t, k] * output of expert topk_idx[t, k].
        zero_copy: the outputs were written into
        get_next_low_latency_combine_buffer(handle) (x is not read).
        use_logfmt is not supported (NotImplementedError);
        combine_wait_recv_cost_stats is accepted and left unchanged."""
        if use_logfmt:
            raise NotImplementedError("mep.ep: use_logfmt (LogFMT-compressed combine) is "
                                      "not supported; combine sends bf16")
        fast = self._fast
        if fast is not None:
            act = self._user_active if active_ranks is None else active_ranks
            timeout = self._call_timeout(timeout_us)
            r = fast.combine(x, topk_idx, topk_weights, handle, bool(zero_copy), out, act,
                             _c.SEND if return_recv_hook else 0, timeout)
            if r is not None:
                return self._combined(r, x, topk_idx, topk_weights, handle[0], handle[1],
                                      zero_copy, act, timeout, async_finish, return_recv_hook)
        src_info, layout_range, tokens, hidden, experts, device = self._check_handle(handle)
        size = self.group_size
        local = experts // size
        _check(x, "x", torch.bfloat16, (local, size * tokens, hidden), device,
               contiguous=not zero_copy)
        _check(topk_idx, "topk_idx", torch.int64, (None, None), device)
        n, k = topk_idx.shape
        _check(topk_weights, "topk_weights", torch.float32, (n, k), device)
        if not 1 <= k <= _c.MAX_TOPK:
            raise ValueError(f"topk_idx has {k} columns; 1 to {_c.MAX_TOPK} are supported")
        if n > tokens:
            raise ValueError(f"topk_idx has {n} tokens, more than "
                             f"num_max_dispatch_tokens_per_rank ({tokens})")
        if out is not None:
            _check(out, "out", torch.bfloat16, (n, hidden), device)
        act_ptr, act = self._active_arg(active_ranks, device)
        call_timeout = self._call_timeout(timeout_us)
        buf = self._live()
        xptr = self._lib.ep_combine_buffer(buf) if zero_copy else x.data_ptr()
        flags = _c.ZERO_COPY if zero_copy else 0
        first = flags | (_c.SEND if return_recv_hook else 0)
        what = f"low_latency_combine of {n} tokens (rank {self.rank} of {size})"
        ops = _ops_lookup()[0]
        if ops is not None:
            if out is None:
                r = ops.combine(buf.value, xptr, topk_idx, topk_weights, src_info,
                                layout_range, hidden, first, act, call_timeout)
            else:
                r = (ops.combine_into(buf.value, xptr, topk_idx, topk_weights, src_info,
                                      layout_range, out, first, act, call_timeout), out)
            return self._combined(r, x, topk_idx, topk_weights, src_info, layout_range,
                                  zero_copy, act, call_timeout, async_finish, return_recv_hook)
        if out is None:
            out = torch.empty((n, hidden), dtype=torch.bfloat16, device=device)
        args = _c.CombineArgs(
            struct_size=ctypes.sizeof(_c.CombineArgs), x=xptr,
            topk_idx=topk_idx.data_ptr(), topk_weights=topk_weights.data_ptr(),
            src_info=src_info.data_ptr(), layout_range=layout_range.data_ptr(),
            num_tokens=n, num_topk=k, flags=first, active_ranks=act_ptr,
            timeout_us=call_timeout, out=out.data_ptr(), stream=self._stream(device))
        _c.check(self._lib.ep_combine(buf, ctypes.byref(args)), what)
        phase = self._ctypes_phase(self._lib.ep_combine, args, flags, device)
        keep = (x, topk_idx, topk_weights, src_info, layout_range, act, out)
        hook = self._recv_hook(phase, what, keep) if return_recv_hook else None
        return out, self._event(async_finish, device, keep), hook

    def _combined(self, r, x, topk_idx, topk_weights, src_info, layout_range, zero_copy,
                  act, timeout, async_finish, return_recv_hook):
        """The results of a combine made through mep.ep._ops (r: (rc, out)),
        as low_latency_combine returns them. Reads no tensor attribute but
        for a hook (see ops.cpp: Fast)."""
        rc, out = r
        if rc:
            _c.check(rc, f"low_latency_combine of {topk_idx.shape[0]} tokens (rank "
                         f"{self.rank} of {self.group_size})")
        keep = (x, topk_idx, topk_weights, src_info, layout_range, act, out)
        hook = None
        if return_recv_hook:
            ops, buf = _ops_lookup()[0], self._buf.value
            xptr = self._lib.ep_combine_buffer(buf) if zero_copy else x.data_ptr()
            flags = (_c.ZERO_COPY if zero_copy else 0) | _c.RECV

            def phase():
                return ops.combine_into(buf, xptr, topk_idx, topk_weights, src_info,
                                        layout_range, out, flags, act, timeout)
            hook = self._recv_hook(phase, f"low_latency_combine (rank {self.rank})", keep)
        return out, self._event(async_finish, self._params[3], keep), hook

    # DeepEP's mask buffer: a masked rank is one mep has made inactive
    # (active_ranks == 0): calls neither wait for it nor send to it.

    def low_latency_update_mask_buffer(self, rank_to_mask, mask=False):
        """Masks (mask=True) or unmasks a rank for later calls: clears or
        sets its entry of active_ranks."""
        if isinstance(rank_to_mask, bool) or not isinstance(rank_to_mask, int) \
                or not 0 <= rank_to_mask < self.group_size:
            raise ValueError(f"rank_to_mask must be a rank of the group (0 .. "
                             f"{self.group_size - 1}), not {rank_to_mask!r}")
        self.active_ranks[rank_to_mask] = 0 if mask else 1

    def low_latency_query_mask_buffer(self, mask_status):
        """Writes 1 for every masked (inactive) rank, 0 for the others, into
        mask_status (int32 [group size])."""
        _check(mask_status, "mask_status", torch.int32, (self.group_size,))
        act = self.active_ranks
        mask_status.copy_((act == 0).to(torch.int32).to(mask_status.device))

    def low_latency_clean_mask_buffer(self):
        """Unmasks every rank."""
        self.active_ranks.fill_(1)

    def get_next_low_latency_combine_buffer(self, handle):
        """A bf16 view [L, R*T, H] of the memory a zero_copy combine sends
        from: write the experts' outputs there, then call
        low_latency_combine(..., zero_copy=True). Valid while the Buffer
        lives."""
        _, _, tokens, hidden, experts, device = self._check_handle(handle)
        local = experts // self.group_size
        ptr = self._lib.ep_combine_buffer(self._live())
        return _view(ptr, device, (local, self.group_size * tokens, hidden),
                     torch.bfloat16, self)

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank=None, hidden=None,
                                 num_experts=None):
        """A no-op: mep's signal words carry the call's sequence number, so a
        buffer never needs cleaning between calls (accepted for DeepEP code)."""

    def destroy(self):
        """Releases the buffer, the communicator and the store. Collective
        (every rank calls it; a barrier bounded by the communicator's
        timeout lets the others finish their receives first); CUDA work
        queued on the buffer is waited for."""
        if self._comm is not None and self._params is not None \
                and self._params[3].type == "cuda":
            torch.cuda.synchronize(self._params[3])
        if self._comm is not None:
            self._lib.barrier(self._comm, None)  # a failure only ends the wait
        self._release()

    def _release(self):
        """Frees everything this process holds; not collective."""
        lib = self._lib
        if lib is None:
            return
        self._fast = None
        if self._buf is not None:
            lib.ep_buffer_destroy(self._buf)
            self._buf = None
        if self._nbuf is not None:
            cuda = self._ndev is not None and self._ndev.type == "cuda"
            with torch.cuda.device(self._ndev) if cuda else contextlib.nullcontext():
                lib.ep_normal_destroy(self._nbuf)
            self._nbuf = None
            if cuda:  # a view of the freed buffer
                self._normal_active = None
        if self._comm is not None:
            lib.comm_destroy(self._comm)
            self._comm = None
        if self._store is not None:
            lib.store_destroy(self._store)
            self._store = None
        if self._server is not None:
            lib.store_server_stop(self._server)
            self._server = None

    def __del__(self):
        if getattr(self, "explicitly_destroy", True) or getattr(self, "_lib", None) is None:
            return
        try:
            if self._buf is not None and self._params[3].type == "cuda":
                torch.cuda.synchronize(self._params[3])
            self._release()
        except Exception:  # interpreter teardown: nothing left to report to
            pass
