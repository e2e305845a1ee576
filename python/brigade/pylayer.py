"""brigade.pylayer: layers written in Python, run by brigade as C layers.

Owns: the one set of C callbacks every Python layer shares (made once, never
freed, so no callback can be freed while C runs it), the bg_layer_ops_t of
each Python layer class, the registry from a layer's impl key to its Python
object, the views of brigade's buffers that the layer's methods get (numpy
arrays, or DLPack exporters for a class whose `views` is "dlpack"; views,
never copies) and the exception a layer raised, kept for the Python
call that ran it (step(), check(), ...) to re-raise.

It must not let a Python exception cross into C: a failing method sets a
message with bg_error and returns BG_ERR_INVALID, so the executor fails the
step on every rank naming this one, and this rank's caller re-raises the
original exception with its traceback (_lib.reraise_pending).
"""
import ctypes
import itertools
import threading
import weakref

from . import _lib
from . import dlpack as _dlpack
from ._lib import Shape, check, encode, lib

__all__ = ["Param", "Context", "TensorGroup"]

_np = None


def _numpy():
    global _np
    if _np is None:
        try:
            import numpy
        except ImportError:
            raise ImportError("brigade: Python layers need numpy (pip install numpy)") from None
        _np = numpy
    return _np


_INITS = {"normal": 0, "const": 1}


class Param:
    """A parameter tensor a Python layer declares; brigade allocates it in the
    stage's flat buffers, initialises it (normal(0, std) or the constant
    value, from the model's seed), reduces, shards, optimises and saves it.
    decay: whether weight decay applies (default: tensors of 2 or more dims).
    split=(dim, parts): the tensor is split along `dim` over a tensor-parallel
    group of `parts` members and `shape` is one member's shard (the full
    tensor has shape[dim] * parts there); brigade initialises, saves and loads
    the full tensor and gives each member its piece, as for its own
    tensor-parallel layers (docs/python.md)."""

    def __init__(self, name, shape, init="normal", std=0.02, value=0.0, decay=None, split=None):
        if init not in _INITS:
            raise ValueError("param %r: init must be \"normal\" or \"const\", got %r" % (name, init))
        shape = tuple(int(s) for s in shape)
        if not 1 <= len(shape) <= _lib.BG_PARAM_MAX_DIMS or min(shape) < 1:
            raise ValueError("param %r: shape must have 1 to %d positive dims, got %r"
                             % (name, _lib.BG_PARAM_MAX_DIMS, shape))
        self.name, self.shape, self.init = name, shape, init
        self.init_value = float(std if init == "normal" else value)
        self.decay = len(shape) >= 2 if decay is None else bool(decay)
        self.split_dim, self.split_parts = 0, 1
        if split is not None:
            dim, parts = (int(v) for v in split)
            if not 0 <= dim < len(shape) or parts < 1:
                raise ValueError("param %r: split must be (dim, parts) with 0 <= dim < %d and parts >= 1, got %r"
                                 % (name, len(shape), split))
            self.split_dim, self.split_parts = dim, parts


class _Array:
    """An __array_interface__ holder: numpy.asarray of it is a view of C memory."""
    __slots__ = ("__array_interface__",)


def _view(addr, shape, typestr, readonly, dev=None):
    """A numpy view of brigade's memory, or with `dev` (a DLPack device: the layer's views are "dlpack") a
    brigade.dlpack.View of it."""
    if dev is not None:
        return _dlpack.View(addr, shape, typestr, dev, readonly)
    a = _Array()
    a.__array_interface__ = {"data": (addr, readonly), "shape": shape, "typestr": typestr, "version": 3}
    return _np.asarray(a)


def _f32_buffer(a, what, writable):
    """The address and element count of `a`, a C-contiguous float32 numpy array (a view of brigade's
    memory or the layer's own): the group's collectives read and write it in place."""
    np = _numpy()
    if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
        raise TypeError("tensor group %s: needs a C-contiguous float32 numpy array, got %s"
                        % (what, type(a).__name__ if not isinstance(a, np.ndarray) else "%s %s%s" % (
                            a.dtype, a.shape, "" if a.flags.c_contiguous else " (not contiguous)")))
    if writable and not a.flags.writeable:
        raise ValueError("tensor group %s: the array is read-only" % what)
    return a.ctypes.data, a.size


class TensorGroup:
    """The tensor-parallel group of a call (ctx.tp; None without one): size
    members, this one being `rank`. Its collectives are brigade's
    (bg_tp_comm_t, the ones its own tensor-parallel layers use): every member
    calls them in the same order with the same sizes, and their results are
    bitwise equal on every member. They block until the group is done."""
    __slots__ = ("_c",)

    def __init__(self, addr):
        self._c = _lib.TpComm.from_address(addr)  # read at each use: a later group may sit at this address

    @property
    def size(self):
        return self._c.size

    @property
    def rank(self):
        return self._c.rank

    def allreduce(self, a):
        """Sum `a` (float32, C-contiguous, writable) over the group, in place; returns a."""
        addr, n = _f32_buffer(a, "allreduce", True)
        if self._c.size > 1 and n:
            check(self._c.allreduce(self._c.arg, addr, n))
        return a

    def allgather(self, a, out=None):
        """Every member's `a`, stacked: out (size, *a.shape) float32, member i's at out[i]
        (allocated when None); returns out."""
        np = _numpy()
        send, n = _f32_buffer(a, "allgather input", False)
        if out is None:
            out = np.empty((self.size,) + a.shape, np.float32)
        recv, m = _f32_buffer(out, "allgather output", True)
        if m != n * self.size:
            raise ValueError("tensor group allgather: output has %d elements where %d x %d were expected"
                             % (m, self.size, n))
        if self.size == 1:
            out.reshape(-1)[:] = a.reshape(-1)
        elif n:
            check(self._c.allgather(self._c.arg, send, recv, n))
        return out


_groups = {}  # bg_tp_comm_t address -> TensorGroup (a model's group lives as long as its executor)


class Context:
    """What one call of a layer method gets besides its activations. shape: the
    input's (n, t, c); stash / wstash / scratch: uint8 arrays of the bytes the
    layer reported for this shape (None when 0; .view(numpy.float32) for
    floats), the stash kept from forward to the last of the backward, the
    wstash from backward_input to backward_weight, the scratch for this call
    only; tokens: (n, t) int32 ids when the input is tokens (c = 0); targets:
    (n, t) int32 class ids and loss_scale (d objective / d each position's
    loss) for loss layers; no_backward: True in a forward that no backward
    follows (keep nothing for one); tp: the tensor-parallel group (a TensorGroup; None
    when the model runs without one)."""
    __slots__ = ("shape", "_c", "_layer")

    def __init__(self, shape, c, layer):
        self.shape, self._c, self._layer = shape, c, layer

    def _bytes(self, addr, which):
        n = getattr(self._layer, which)(self.shape)
        return _view(addr, (n,), "|u1", False, self._layer._py.dev) if addr and n else None

    @property
    def stash(self):
        return self._bytes(self._c.stash, "stash_bytes")

    @property
    def wstash(self):
        return self._bytes(self._c.wstash, "wstash_bytes")

    @property
    def scratch(self):
        return self._bytes(self._c.scratch, "scratch_bytes")

    @property
    def tokens(self):
        a = self._c.tokens
        return _view(a, self.shape[:2], "<i4", True, self._layer._py.dev) if a else None

    @property
    def targets(self):
        a = self._c.targets
        return _view(a, self.shape[:2], "<i4", True, self._layer._py.dev) if a else None

    @property
    def loss_scale(self):
        return self._c.loss_scale

    @property
    def no_backward(self):
        """True in a forward whose stash no backward will read (recomputation's first forward, whose backward
        runs the forward again; an evaluation): state kept for the backward beyond the stash is not needed."""
        return bool(self._c.no_backward)

    @property
    def tp(self):
        a = self._c.tp
        if not a:
            return None
        g = _groups.get(a)
        if g is None:
            g = _groups[a] = TensorGroup(a)
        return g


# ------------------------------------------------------------------ registry

_keys = itertools.count(1)
_weak = {}    # impl key -> weakref to the layer (every live Python layer)
_strong = {}  # impl key -> the layer, while C owns its handle (a model or composite took it)
_IMPL_OFF = _lib.Layer.impl.offset
_PARAMS_OFF = _lib.Layer.params.offset
_NPARAMS_OFF = _lib.Layer.nparams.offset
_NAME_OFF = _lib.Layer.name.offset
_pending_lock = threading.Lock()


def _get(l):
    key = ctypes.c_void_p.from_address(l + _IMPL_OFF).value
    o = _strong.get(key)
    return o if o is not None else _weak[key]()


def _fail(l, method, e):
    """Keep `e` for this rank's caller and turn it into a status C understands."""
    with _pending_lock:
        if _lib.pending[0] is None:
            _lib.pending[0] = e
    name = ctypes.string_at(l + _NAME_OFF).decode("utf-8", "replace")
    key = ctypes.c_void_p.from_address(l + _IMPL_OFF).value
    ref = _weak.get(key)
    cls = type(ref()).__name__ if ref is not None and ref() is not None else "?"
    msg = "python layer %s (%s.%s) raised %s: %s" % (name, cls, method, type(e).__name__, e)
    lib.bg_error(int(_lib.Status.ERR_INVALID), b"%s", msg.encode("utf-8", "replace"))
    return int(_lib.Status.ERR_INVALID)


# ------------------------------------------------------------------ per-call state

class _State:
    """A Python layer's private state: its handle's key, shapes by input
    shape, and the views of its parameters (rebuilt when brigade moves them)."""
    __slots__ = ("key", "shapes", "bound", "backend", "dlpack", "dev")

    def __init__(self, key, dlpack):
        self.key, self.shapes, self.bound, self.backend = key, {}, None, None
        self.dlpack, self.dev = dlpack, ((_dlpack.KDL_CPU, 0) if dlpack else None)


def _out_shape(o, shape):
    s = o._py.shapes.get(shape)
    if s is None:
        s = o.out_shape(shape)
        if not (isinstance(s, tuple) and len(s) == 3 and all(isinstance(v, int) and v >= 0 for v in s)):
            raise TypeError("out_shape must return a tuple (n, t, c) of ints, got %r" % (s,))
        o._py.shapes[shape] = s
    return s


def _bind(o, l, c):
    """Refresh o.params / o.grads when brigade has (re)bound the buffers, and
    refuse a backend whose memory numpy cannot read."""
    st = o._py
    if c.be and c.be != st.backend:
        ops = ctypes.c_void_p.from_address(c.be).value
        name = ctypes.c_char_p.from_address(ops + ctypes.sizeof(ctypes.c_size_t)).value or b"?"
        if name.startswith(b"cuda") and st.dlpack:
            st.dev = (_dlpack.KDL_CUDA, _cuda_device())
        elif not name.startswith(b"cpu"):
            raise RuntimeError("Python layers with numpy views run on the CPU backend only (views = \"dlpack\" "
                               "takes CUDA too); this stage runs on %r" % name.decode())
        st.backend, st.bound = c.be, None
    n = ctypes.c_int.from_address(l + _NPARAMS_OFF).value
    if not n:
        return
    arr = (_lib.Param * n).from_address(ctypes.c_void_p.from_address(l + _PARAMS_OFF).value)
    key = tuple((p.data, p.grad) for p in arr)
    if key == st.bound:
        return
    params, grads = {}, {}
    for p in arr:
        shape = tuple(p.shape[:p.ndim])
        nm = p.name.decode()
        params[nm] = _view(p.data, shape, "<f4", False, st.dev) if p.data else None
        grads[nm] = _view(p.grad, shape, "<f4", False, st.dev) if p.grad else None
    o.params, o.grads, st.bound = params, grads, key


def _acts(l, ctx_p):
    """The layer, its context, and its input and output shapes for one call."""
    c = _lib.LayerCtx.from_address(ctx_p)
    o = _get(l)
    shape = (c.in_.n, c.in_.t, c.in_.c)
    _bind(o, l, c)
    return o, c, shape, _out_shape(o, shape)


_views = {}  # (address, shape, read-only) -> float32 view: the stage reuses its buffers, so most calls hit


def _f32(addr, shape, readonly, dev):
    if not addr:
        return None
    key = (addr, shape, readonly, dev)
    v = _views.get(key)
    if v is None:
        if len(_views) >= 4096:
            _views.clear()
        v = _views[key] = _view(addr, shape, "<f4", readonly, dev)
    return v


def _cuda_device():
    """The CUDA device of the calling thread (the stage's), for a DLPack device; 0 when cudart cannot say."""
    try:
        rt = ctypes.CDLL("libcudart.so")
        d = ctypes.c_int(0)
        return d.value if rt.cudaGetDevice(ctypes.byref(d)) == 0 else 0
    except OSError:
        return 0


# ------------------------------------------------------------------ the C callbacks

def _c_out_shape(l, shape, out_p):
    try:
        n, t, c = _out_shape(_get(l), (shape.n, shape.t, shape.c))
        out_p[0] = Shape(n, t, c)
        return 0
    except BaseException as e:  # noqa: B902 -- nothing may cross C
        return _fail(l, "out_shape", e)


def _bytes_cb(method):
    def cb(l, shape):
        try:
            return int(getattr(_get(l), method)((shape.n, shape.t, shape.c)))
        except BaseException as e:  # noqa: B902
            _fail(l, method, e)
            return 0  # sizes have no error status: the layer's next call asks again (ctx.stash), fails, re-raises
    return cb


def _flops_cb(which):
    def cb(l, shape):
        try:
            return float(_get(l).flops((shape.n, shape.t, shape.c))[which])
        except BaseException as e:  # noqa: B902
            _fail(l, "flops", e)
            return 0.0
    return cb


def _c_forward(l, ctx_p, x, y):
    try:
        o, c, si, so = _acts(l, ctx_p)
        d = o._py.dev
        o.forward(Context(si, c, o), _f32(x, si, True, d) if si[2] else None, _f32(y, so, False, d))
        return 0
    except BaseException as e:  # noqa: B902
        return _fail(l, "forward", e)


def _c_backward_input(l, ctx_p, x, y, dy, dx):
    try:
        o, c, si, so = _acts(l, ctx_p)
        d = o._py.dev
        o.backward_input(Context(si, c, o), _f32(x, si, True, d) if si[2] else None, _f32(y, so, True, d),
                         _f32(dy, so, True, d), _f32(dx, si, False, d))
        return 0
    except BaseException as e:  # noqa: B902
        return _fail(l, "backward_input", e)


def _c_backward_weight(l, ctx_p, x, y, dy):
    try:
        o, c, si, so = _acts(l, ctx_p)
        d = o._py.dev
        o.backward_weight(Context(si, c, o), _f32(x, si, True, d) if si[2] else None, _f32(y, so, True, d),
                          _f32(dy, so, True, d))
        return 0
    except BaseException as e:  # noqa: B902
        return _fail(l, "backward_weight", e)


def _c_destroy(l):
    key = ctypes.c_void_p.from_address(l + _IMPL_OFF).value
    _weak.pop(key, None)
    _strong.pop(key, None)


def _c_classes(l):
    try:
        return int(getattr(_get(l), "classes", 0) or 0)
    except BaseException as e:  # noqa: B902
        _fail(l, "classes", e)
        return 0


_CB = {
    "out_shape": _lib.OUT_SHAPE_FN(_c_out_shape),
    "stash_bytes": _lib.BYTES_FN(_bytes_cb("stash_bytes")),
    "wstash_bytes": _lib.BYTES_FN(_bytes_cb("wstash_bytes")),
    "scratch_bytes": _lib.BYTES_FN(_bytes_cb("scratch_bytes")),
    "fwd_flops": _lib.FLOPS_FN(_flops_cb(0)),
    "bwd_flops": _lib.FLOPS_FN(_flops_cb(1)),
    "forward": _lib.FORWARD_FN(_c_forward),
    "backward_input": _lib.BACKWARD_INPUT_FN(_c_backward_input),
    "backward_weight": _lib.BACKWARD_WEIGHT_FN(_c_backward_weight),
    "destroy": _lib.DESTROY_FN(_c_destroy),
    "loss_classes": _lib.CLASSES_FN(_c_classes),
}
_OPS = {}  # class -> (LayerOps, its type string): kept for the life of the process


def _ops_for(cls, base):
    got = _OPS.get(cls)
    if got is not None:
        return got[0]
    overrides = lambda m: getattr(cls, m, None) is not getattr(base, m, None)  # noqa: E731
    if not overrides("forward") or not overrides("backward_input"):
        raise TypeError("%s: a Python layer defines forward and backward_input" % cls.__name__)
    tname = encode(getattr(cls, "type_name", None) or cls.__name__, "type_name")
    ops = _lib.LayerOps()
    ops.type = tname
    for slot in ("out_shape", "forward", "backward_input", "destroy"):
        setattr(ops, slot, _CB[slot])
    for slot in ("stash_bytes", "wstash_bytes", "scratch_bytes"):
        if overrides(slot):
            setattr(ops, slot, _CB[slot])
    if overrides("flops"):
        ops.fwd_flops, ops.bwd_flops = _CB["fwd_flops"], _CB["bwd_flops"]
    if overrides("backward_weight"):
        ops.backward_weight = _CB["backward_weight"]
    ops.loss_classes = _CB["loss_classes"]  # a layer is a loss layer when its `classes` is set, at any time
    _OPS[cls] = (ops, tname)
    return ops


def create(layer, base, name, params):
    """Make the bg_layer_t of Python layer `layer` (a subclass of `base`)."""
    _numpy()
    params = list(params)
    names = [p.name for p in params]
    if any(not isinstance(p, Param) for p in params):
        raise TypeError("layer %r: params must be brigade.Param objects" % (name,))
    if len(set(names)) != len(names):
        raise ValueError("layer %r: two parameters are named alike: %s" % (name, names))
    ops = _ops_for(type(layer), base)
    if params and not ops.backward_weight:
        raise TypeError("layer %r (%s) has parameters but no backward_weight" % (name, type(layer).__name__))
    arr = (_lib.Param * max(len(params), 1))()
    for i, p in enumerate(params):
        a = arr[i]
        a.name = encode(p.name, "param name")
        a.ndim = len(p.shape)
        for d, s in enumerate(p.shape):
            a.shape[d] = s
        a.init, a.init_value, a.decay = _INITS[p.init], p.init_value, int(p.decay)
        if p.split_parts > 1:
            a.split_dim, a.split_parts, a.split_blocks = p.split_dim, p.split_parts, 1
    key = next(_keys)
    views = getattr(type(layer), "views", "numpy")
    if views not in ("numpy", "dlpack"):
        raise ValueError("layer %r: views must be \"numpy\" or \"dlpack\", got %r" % (name, views))
    layer._py = _State(key, views == "dlpack")
    layer.params, layer.grads = {}, {}
    _weak[key] = weakref.ref(layer)
    h = ctypes.c_void_p()
    try:
        check(lib.bg_layer_create(ctypes.byref(ops), encode(name, "layer name"), len(params), arr,
                                  ctypes.c_void_p(key), ctypes.byref(h)))
    except BaseException:
        _weak.pop(key, None)
        raise
    return h


def given_to_c(layer):
    """C owns the layer's handle now: keep the Python object alive until C destroys it."""
    _strong[layer._py.key] = layer
