"""brigade.dlpack: brigade's buffers handed to other array libraries through
DLPack (`__dlpack__` / `__dlpack_device__`, consumed by `torch.from_dlpack`,
`numpy.from_dlpack`, CuPy, JAX ...), host or device memory alike.

Owns the DLPack structs (dlpack.h, v1.0: DLManagedTensor and
DLManagedTensorVersioned), the View object that exports one buffer, and the
lifetime of an export's struct (freed by its consumer's deleter call, or by
the capsule when never consumed). A View never copies and never owns the
memory: brigade does, and a consumer's tensor is valid as long as the buffer
is (for a layer's call, during that call; see docs/python.md).

It must not import numpy or torch: consumers bring their own.
"""
import ctypes

__all__ = ["View", "KDL_CPU", "KDL_CUDA"]

KDL_CPU, KDL_CUDA = 1, 2  # DLDeviceType
_KDL_INT, _KDL_UINT, _KDL_FLOAT = 0, 1, 2  # DLDataTypeCode
_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY

# typestr (numpy's array-interface spelling) -> (DLDataType code, bits)
_DTYPES = {"<f4": (_KDL_FLOAT, 32), "<i4": (_KDL_INT, 32), "|u1": (_KDL_UINT, 8)}


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]


# ------------------------------------------------------------ lifetimes

# An export is one malloc'ed block, the managed struct then its shape, and its deleter is libc's free: nothing of
# Python's runs when a consumer's tensor dies (which may be during the interpreter's finalisation, when no Python
# callback may run). free(void *) takes the block's address as the deleter takes its struct's: the same ABI on
# the platforms brigade builds for (x86-64 and aarch64 Linux).
_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_FREE = ctypes.cast(_libc.free, ctypes.c_void_p).value

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]  # the raw pointer: the capsule is being freed
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_NAME, _NAME_V = b"dltensor", b"dltensor_versioned"  # module constants: a capsule keeps the name's pointer
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # not py_object: no new reference to a dying object


def _capsule_destructor(capsule):
    """A capsule never consumed (still named dltensor) frees its export itself; a consumed one was renamed and
    its consumer calls the deleter."""
    for name in (_NAME, _NAME_V):
        if _api.PyCapsule_IsValid(capsule, name):
            _libc.free(ctypes.c_void_p(_api.PyCapsule_GetPointer(capsule, name)))


_C_CAPSULE_DESTRUCTOR = _CAPSULE_DESTRUCTOR(_capsule_destructor)


# ------------------------------------------------------------ the view

class View:
    """One buffer of brigade's, exported through DLPack: address, shape,
    element type (typestr "<f4", "<i4" or "|u1"), device ((KDL_CPU, 0) or
    (KDL_CUDA, ordinal)) and whether consumers may write it. On the CPU it
    also has __array_interface__, so numpy.asarray(view) is a numpy view."""
    __slots__ = ("address", "shape", "typestr", "device", "readonly")

    def __init__(self, address, shape, typestr="<f4", device=(KDL_CPU, 0), readonly=False):
        if typestr not in _DTYPES:
            raise ValueError("brigade.dlpack.View: element type %r is not one of %s" % (typestr, sorted(_DTYPES)))
        self.address, self.shape, self.typestr = int(address), tuple(int(s) for s in shape), typestr
        self.device, self.readonly = (int(device[0]), int(device[1])), bool(readonly)

    def __repr__(self):
        return "brigade.dlpack.View(0x%x, %r, %r, device=%r%s)" % (self.address, self.shape, self.typestr,
                                                                   self.device, ", readonly" if self.readonly else "")

    @property
    def __array_interface__(self):
        if self.device[0] != KDL_CPU:
            raise AttributeError("a device buffer has no __array_interface__ (use DLPack: __dlpack__)")
        return {"data": (self.address, self.readonly), "shape": self.shape, "typestr": self.typestr, "version": 3}

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A capsule of this buffer (never a copy: copy=True raises BufferError). Versioned (DLPack 1.0, with
        the read-only flag) when the consumer's max_version allows it, else the legacy DLManagedTensor. stream:
        brigade synchronises its own stream before a layer call, so nothing is awaited here."""
        if copy:
            raise BufferError("brigade.dlpack.View: exports never copy (copy=True asked)")
        if dl_device is not None and tuple(dl_device) != self.device:
            raise BufferError("brigade.dlpack.View: the buffer is on device %r, not %r" % (self.device, dl_device))
        # the legacy struct cannot say read-only: a consumer without DLPack 1.0 gets a read-only buffer as
        # writable (as torch.from_numpy takes a read-only numpy array), and must not write it
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        cls = _ManagedVersioned if versioned else _Managed
        size = ctypes.sizeof(cls)
        block = _libc.malloc(size + 8 * max(len(self.shape), 1))
        if not block:
            raise MemoryError("brigade.dlpack.View: no memory for a DLPack export")
        ctypes.memset(block, 0, size)
        m = cls.from_address(block)
        shape = (ctypes.c_int64 * max(len(self.shape), 1)).from_address(block + size)
        shape[:len(self.shape)] = self.shape
        t = m.dl_tensor
        t.data = self.address
        t.device = _Device(*self.device)
        t.ndim = len(self.shape)
        code, bits = _DTYPES[self.typestr]
        t.dtype = _DType(code, bits, 1)
        t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = None  # compact row-major
        t.byte_offset = 0
        m.manager_ctx = None
        m.deleter = _FREE
        if versioned:
            m.version = _Version(1, 0)
            m.flags = _READ_ONLY if self.readonly else 0
        return _api.PyCapsule_New(block, _NAME_V if versioned else _NAME,
                                  ctypes.cast(_C_CAPSULE_DESTRUCTOR, ctypes.c_void_p))
