"""brigade.gradcheck: finite-difference checks of a model's gradients, run
through the library's own stage (bg_model_create, bg_stage_*), so the layers
(built-in, adopted C, or Python layers behind their C callbacks) are called
exactly as the executor calls them, guard zones included.

Owns only the check: it binds a model on its own CPU backend, and never
touches an executor's model (a description binds to one model at a time).
"""
import ctypes
from ctypes import POINTER, c_char_p, c_float, c_int, c_void_p

from . import _lib
from ._lib import Shape, check, lib

__all__ = ["check_gradients"]

P, PP, st = c_void_p, POINTER(c_void_p), c_int
for _name, _res, _args in [
        ("bg_backend_create", st, [c_char_p, c_void_p, PP]),
        ("bg_backend_destroy", None, [P]),
        ("bg_model_create", st, [P, P, c_int, c_int, PP]),
        ("bg_model_destroy", None, [P]),
        ("bg_model_zero_grads", None, [P]),
        ("bg_model_num_tensors", c_int, [P]),
        ("bg_model_tensor_name", c_char_p, [P, c_int]),
        ("bg_model_tensor", POINTER(_lib.Param), [P, c_int]),
        ("bg_model_input_shape", Shape, [P, c_int, c_int]),
        ("bg_stage_create", st, [P, c_int, PP]),
        ("bg_stage_destroy", None, [P]),
        ("bg_stage_begin", st, [P, c_int, Shape, PP]),
        ("bg_stage_set_data", st, [P, c_int, c_void_p, c_void_p, c_float]),
        ("bg_stage_forward", st, [P, c_int, PP, POINTER(Shape)]),
        ("bg_stage_backward", st, [P, c_int, PP]),
        ("bg_stage_end", None, [P, c_int])]:
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args


def _run(stage, model, shape, x, tokens, targets, backward):
    """One microbatch: the sum of the per-position losses (double), and, when
    `backward`, the gradients accumulated into the model's buffers."""
    inp = c_void_p()
    check(lib.bg_stage_begin(stage, 0, shape, ctypes.byref(inp)))
    try:
        if x is not None:
            ctypes.memmove(inp.value, x.ctypes.data, x.nbytes)
        check(lib.bg_stage_set_data(stage, 0, tokens.ctypes.data if tokens is not None else None,
                                    targets.ctypes.data, 1.0))
        out, oshape = c_void_p(), Shape()
        check(lib.bg_stage_forward(stage, 0, ctypes.byref(out), ctypes.byref(oshape)))
        n = oshape.n * oshape.t * oshape.c
        loss = sum((c_float * n).from_address(out.value))
        if backward:
            din = c_void_p()
            check(lib.bg_stage_backward(stage, 0, ctypes.byref(din)))
        return loss
    finally:
        lib.bg_stage_end(stage, 0)


def check_gradients(model, inputs, targets, eps=1e-2, samples=6, seed=0):
    """Compare each parameter's gradient with central differences of the
    summed loss, (L(w + eps) - L(w - eps)) / (2 eps) (eps as rounded to
    float32), at `samples` elements
    of every tensor (chosen by `seed`). `inputs`: (n, t) token ids or
    (n, t, c) features, `targets`: (n, t) class ids (numpy arrays). Returns
    [(tensor name, index, analytic, numeric)], one row per element checked.
    The model must not be in use by an executor."""
    import numpy as np
    if model._in_use:
        raise ValueError("model %r is used by an executor; check gradients before creating one" % model.name)
    h = model._live()
    check(lib.bg_model_desc_check(h))
    targets = np.ascontiguousarray(targets, dtype=np.int32)
    n, t = targets.shape
    tokens = x = None
    if model.input == "tokens":
        tokens = np.ascontiguousarray(inputs, dtype=np.int32)
    else:
        x = np.ascontiguousarray(inputs, dtype=np.float32)
    rng = np.random.default_rng(seed)
    be, m, stage = c_void_p(), c_void_p(), c_void_p()
    check(lib.bg_backend_create(b"cpu", None, ctypes.byref(be)))
    rows = []
    try:
        check(lib.bg_model_create(h, be, -1, -1, ctypes.byref(m)))
        check(lib.bg_stage_create(m, 1, ctypes.byref(stage)))
        shape = lib.bg_model_input_shape(m, n, t)
        lib.bg_model_zero_grads(m)
        _run(stage, m, shape, x, tokens, targets, True)
        for i in range(lib.bg_model_num_tensors(m)):
            p = lib.bg_model_tensor(m, i).contents
            name = lib.bg_model_tensor_name(m, i).decode()
            data = (c_float * p.numel).from_address(p.data)
            grad = (c_float * p.numel).from_address(p.grad)
            for j in sorted(set(rng.integers(0, p.numel, size=min(samples, p.numel)).tolist())):
                w = data[j]
                data[j] = w + eps
                wp = data[j]  # the float32 the layers see
                up = _run(stage, m, shape, x, tokens, targets, False)
                data[j] = w - eps
                wm = data[j]
                down = _run(stage, m, shape, x, tokens, targets, False)
                data[j] = w
                rows.append((name, j, float(grad[j]), (up - down) / (wp - wm)))
    finally:
        lib.bg_stage_destroy(stage)
        lib.bg_model_destroy(m)
        lib.bg_backend_destroy(be)
    return rows
