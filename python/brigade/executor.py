"""brigade.executor: training over include/brigade/executor.h.

Owns the Python batch source (a callable turned into a bg_batch_fn that
checks the shape and dtype of what the callable returns and copies it into
the executor's buffers) and the lifetime rules of the C executor: the model
description, the callbacks and every string handed to C stay referenced
until the executor is destroyed. An exception cannot cross C, so a failing
callable records it, sets the C message with bg_error and returns an error
status; step() re-raises it once bg_executor_step has returned.
"""
import ctypes
import dataclasses
import numbers

from . import _lib
from ._lib import BrigadeError, Status, check, encode, lib
from .model import Model

try:
    import numpy as _np
except ImportError:  # plain Python sequences still work
    _np = None

__all__ = ["Executor", "Request", "StepResult", "ExecutorInfo"]

_OPTIMIZERS = {"adamw": 0, "sgd": 1}


@dataclasses.dataclass(frozen=True)
class Request:
    """One microbatch of one replica, as the executor asks for it.

    step is 0-based (brigade's messages count steps from 1); the batch holds
    sequences [first, first + n) of the step's global batch; each has t
    positions; c is the channels of a features input (0: token ids).
    wants_inputs / wants_targets: whether this rank uses them (first / last
    pipeline stage); what is not wanted may be returned as None.
    """
    step: int
    microbatch: int
    replica: int
    first: int
    n: int
    t: int
    c: int
    wants_inputs: bool
    wants_targets: bool

    @property
    def input_shape(self):
        return (self.n, self.t) if self.c == 0 else (self.n, self.t, self.c)

    @property
    def target_shape(self):
        return (self.n, self.t)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """bg_step_result_t: step is the 1-based number of the step just done."""
    step: int
    loss: float
    tokens: float
    step_ms: float
    tokens_per_s: float
    bubble: float
    bytes_sent: int
    peak_bytes: int
    stop: bool
    grad_norm: float  # global L2 norm of the model's gradients before the optimizer step
    moe_aux: float = float("nan")  # this rank's MoE layers: mean load-balancing loss of the step's forwards (NaN: none)
    moe_dropped: int = 0  # this rank's MoE layers: choices the capacity dropped in the step


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """bg_eval_result_t: the loss of the current weights on one global batch (Executor.eval)."""
    loss: float
    tokens: float
    eval_ms: float


@dataclasses.dataclass(frozen=True)
class ExecutorInfo:
    """bg_executor_info_t."""
    rank: int
    world: int
    pp_rank: int
    dp_rank: int
    stages: int
    chunks: int
    params: int
    flops_per_step: float
    predicted_bytes: int
    predicted_act_bytes: int
    predicted_stashed: int
    peak_stashed: int
    peak_act_bytes: int
    numa_node: int
    schedule: str


class _BatchError(ValueError):
    """What the callable returned does not fit the request (re-raised as ValueError)."""


def _shape_text(shape):
    return "(%d,)" % shape[0] if len(shape) == 1 else "(" + ", ".join(str(s) for s in shape) + ")"


def _flatten(value, shape, integer, what, accepted):
    """Nested Python sequences of `shape` as a flat list, element types checked."""
    out = []

    def walk(x, depth, index):
        if depth == len(shape):
            if isinstance(x, bool) or not isinstance(x, numbers.Integral if integer else numbers.Real):
                raise _BatchError("%s%s is %r (%s), not %s" % (what, index, x, type(x).__name__,
                                                               "an integer" if integer else "a number"))
            out.append(int(x) if integer else float(x))
            return
        if isinstance(x, (str, bytes)) or not hasattr(x, "__len__") or not hasattr(x, "__getitem__"):
            raise _BatchError("%s%s is a %s where a sequence of %d was expected (shape %s)"
                              % (what, index, type(x).__name__, shape[depth], accepted))
        if len(x) != shape[depth]:
            raise _BatchError("%s%s has %d entries where %d were expected (shape %s)"
                              % (what, index, len(x), shape[depth], accepted))
        for i in range(shape[depth]):
            walk(x[i], depth + 1, "%s[%d]" % (index, i))

    walk(value, 0, "")
    return out


def _copy_in(value, ptr, shapes, integer, what):
    """Check `value` against the accepted shapes (the first is the canonical
    one) and dtype, then copy it to the C buffer at `ptr`."""
    ctype = ctypes.c_int32 if integer else ctypes.c_float
    count = 1
    for s in shapes[0]:
        count *= s
    kind = "integers (int32)" if integer else "floats (float32)"
    expected = " or ".join(_shape_text(s) for s in shapes)
    if _np is not None and isinstance(value, _np.ndarray):
        if tuple(value.shape) not in shapes:
            raise _BatchError("%s must have shape %s, got %s" % (what, expected, _shape_text(value.shape)))
        ok = value.dtype.kind in "iu" if integer else value.dtype.kind == "f"
        if not ok:
            raise _BatchError("%s must be %s, got dtype %s" % (what, kind, value.dtype))
        a = _np.ascontiguousarray(value, dtype=_np.int32 if integer else _np.float32)
        if integer and value.dtype != _np.int32 and not _np.array_equal(a, value):
            raise _BatchError("%s: values do not fit in int32" % what)
        ctypes.memmove(ptr, a.ctypes.data, a.nbytes)
        return
    if _np is not None and isinstance(value, _np.generic) or not hasattr(value, "__len__"):
        raise _BatchError("%s must be an array or nested sequences of shape %s, got %s"
                          % (what, expected, type(value).__name__))
    # plain sequences: find which accepted shape the nesting follows
    depth, x = 0, value
    while hasattr(x, "__len__") and hasattr(x, "__getitem__") and not isinstance(x, (str, bytes)) and len(x):
        depth, x = depth + 1, x[0]
    shape = next((s for s in shapes if len(s) == depth), shapes[0])
    flat = _flatten(value, shape, integer, what, expected)
    (ctype * count).from_address(ptr)[:] = flat


class _Source:
    """The batch callable behind a bg_batch_source_t, and the exception it
    raised, kept for step() to re-raise. Holds no reference to the executor
    (no cycle: the executor's __del__ runs when the last reference goes)."""

    def __init__(self, batches, seq_len):
        self.batches = batches
        self.seq_len = seq_len
        self.pending = None
        self.c_batch = _lib.BATCH_FN(self._batch)
        self.c_seq_len = _lib.SEQ_LEN_FN(self._seq_len) if seq_len is not None else _lib.SEQ_LEN_FN()

    def _fail(self, exc, message):
        if self.pending is None:
            self.pending = exc
        lib.bg_error(int(Status.ERR_INVALID), b"%s", message.encode("utf-8", "replace"))
        return int(Status.ERR_INVALID)

    def _batch(self, rq_p, tokens, features, targets, arg):
        try:
            q = rq_p.contents
            inputs_ptr = tokens if tokens else features
            req = Request(q.step, q.microbatch, q.replica, q.first, q.in_.n, q.in_.t, q.in_.c, bool(inputs_ptr),
                          bool(targets))
            where = "batch callable (request step=%d, microbatch=%d, replica=%d)" % (req.step, req.microbatch,
                                                                                     req.replica)
            got = self.batches(req)
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise _BatchError("%s must return (inputs, targets), got %s" % (where, type(got).__name__))
            inputs, tgts = got
            n, t, c = req.n, req.t, req.c
            if inputs_ptr:
                if inputs is None:
                    raise _BatchError("%s returned no inputs (None), but this rank runs the first stage" % where)
                if c == 0:
                    shapes = [(n, t)] + ([(n,)] if t == 1 else [])
                    _copy_in(inputs, tokens, shapes, True, "%s: inputs (token ids)" % where)
                else:
                    shapes = [(n, t, c)] + ([(n, c)] if t == 1 else [])
                    _copy_in(inputs, features, shapes, False, "%s: inputs (features)" % where)
            if targets:
                if tgts is None:
                    raise _BatchError("%s returned no targets (None), but this rank runs the last stage" % where)
                shapes = [(n, t)] + ([(n,)] if t == 1 else [])
                _copy_in(tgts, targets, shapes, True, "%s: targets (class ids)" % where)
            return 0
        except _BatchError as e:
            return self._fail(e, str(e))
        except BaseException as e:  # noqa: B902 -- nothing may cross C; step() re-raises it
            return self._fail(e, "batch callable raised %s: %s" % (type(e).__name__, e))

    def _seq_len(self, step, mb, arg):
        try:
            t = self.seq_len(step, mb)
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise _BatchError("seq_len callable (step=%d, microbatch=%d) returned %r, not an integer"
                                  % (step, mb, t))
            return int(t) if int(t) > 0 else 0
        except _BatchError as e:
            self._fail(e, str(e))
        except BaseException as e:  # noqa: B902
            self._fail(e, "seq_len callable raised %s: %s" % (type(e).__name__, e))
        return 0  # out of range: the executor fails the call, step() re-raises

    def reraise(self, message):
        """After a failed C call: raise what a callback recorded, if anything."""
        e, self.pending = self.pending, None
        if e is None:
            return
        if isinstance(e, _BatchError):
            raise ValueError(message) from None
        if hasattr(e, "add_note"):
            e.add_note("(brigade: %s)" % message)
        raise e


def _int_array(values, what):
    if values is None:
        return None, 0
    values = [int(v) for v in values]
    return (ctypes.c_int * max(len(values), 1))(*values), len(values)


_OFFLOAD = {"optimizer": 1, "activations": 2, "params": 4}  # BG_OFFLOAD_* (brigade/executor.h)


def _offload_bits(offload):
    """None, a name or names of _OFFLOAD -> bg_executor_params_t.offload (the library refuses what is not built)."""
    if offload is None:
        return 0
    names = [offload] if isinstance(offload, str) else list(offload)
    bits = 0
    for n in names:
        if n not in _OFFLOAD:
            raise ValueError("Executor: offload must name %s, got %r" % (", ".join(_OFFLOAD), n))
        bits |= _OFFLOAD[n]
    return bits


class Executor:
    """Trains a Model on a pipeline x data-parallel x context-parallel x tensor-parallel layout (bg_executor_t;
    world = pp * dp * cp * tp, tp fastest, then cp; tp must be the degree of the model's tensor-parallel layers;
    cp > 1 splits every sequence over cp ranks with ring attention, docs/executor.md).

    Every rank of the job creates it with the same arguments; rank and world
    come from the environment (brigade launch, torchrun, Open MPI, Slurm).
    `batches(request)` returns (inputs, targets): numpy arrays or nested
    sequences, inputs (n, t) token ids or (n, t, c) features, targets (n, t)
    class ids ((n,) / (n, c) also accepted when t is 1).
    """

    def __init__(self, model, *, batches, pp=1, dp=1, tp=1, schedule="1f1b", batch=8, microbatches=4, optimizer="adamw",
                 lr=1e-3, weight_decay=0.0, beta1=0.9, beta2=0.95, eps=1e-8, momentum=0.9, seq=0, seq_len=None,
                 threads=0, backend=None, chunks=0, split=None, recompute=False, recompute_stages=None, trace=None,
                 process_wide=False, schedule_json=None, zero=0, ep=1, cp=1, offload=None, offload_dir=None):
        self._handle = None
        if not isinstance(model, Model):
            raise TypeError("Executor: model must be a brigade.Model, got %s" % type(model).__name__)
        if not callable(batches):
            raise TypeError("Executor: batches must be a callable(request) -> (inputs, targets)")
        if seq_len is not None and not callable(seq_len):
            raise TypeError("Executor: seq_len must be a callable(step, microbatch) -> int or None")
        if optimizer not in _OPTIMIZERS:
            raise ValueError("Executor: optimizer must be one of %s, got %r" % (", ".join(_OPTIMIZERS), optimizer))
        h = model._live()
        if model._in_use:
            raise ValueError("model %r is already used by a live executor (a layer binds to one at a time); "
                             "close that executor first" % (model.name,))
        self._model = model
        self._source = _Source(batches, seq_len)
        self._seq = int(seq)
        # everything C keeps a pointer to stays referenced here
        self._schedule = encode(schedule, "schedule")
        self._backend = encode(backend, "backend")
        self._trace = encode(trace, "trace path")
        self._schedule_json = encode(schedule_json, "schedule_json")
        self._offload_dir = encode(offload_dir, "offload_dir")
        offload_bits = _offload_bits(offload)
        self._split, nsplit = _int_array(split, "split")
        self._recompute_stages, nrs = _int_array(recompute_stages, "recompute_stages")

        p = _lib.ExecutorParams()
        p.size = ctypes.sizeof(_lib.ExecutorParams)
        p.model = h
        p.pp, p.dp, p.tp, p.ep, p.cp = int(pp), int(dp), int(tp), int(ep), int(cp)
        p.schedule = self._schedule
        p.chunks = int(chunks)
        p.split = ctypes.cast(self._split, ctypes.POINTER(ctypes.c_int)) if self._split is not None else None
        p.nsplit = nsplit
        p.batch, p.microbatches = int(batch), int(microbatches)
        p.optim = _lib.OptimConfig(ctypes.sizeof(_lib.OptimConfig), _OPTIMIZERS[optimizer], lr, beta1, beta2, eps,
                                   momentum, weight_decay)
        p.data.batch = self._source.c_batch
        p.data.seq_len = self._source.c_seq_len
        p.data.arg = None
        p.data.seq = int(seq)
        p.backend = self._backend
        p.threads = int(threads)
        p.comm = None
        p.recompute = int(bool(recompute))
        if self._recompute_stages is not None:
            p.recompute_stages = ctypes.cast(self._recompute_stages, ctypes.POINTER(ctypes.c_int))
        p.nrecompute_stages = nrs
        p.trace_path = self._trace
        p.process_wide = int(bool(process_wide))
        p.schedule_json = self._schedule_json
        p.zero = int(zero)
        p.offload = offload_bits
        p.offload_dir = self._offload_dir
        x = ctypes.c_void_p()
        st = lib.bg_executor_create(ctypes.byref(p), ctypes.byref(x))
        if st != 0:
            msg = lib.bg_last_error().decode("utf-8", "replace")
            self._source.reraise(msg)
            _lib.reraise_pending(msg)
            raise BrigadeError(st, msg)
        self._handle = x
        model._in_use += 1
        info = self.info()
        self.rank, self.world = info.rank, info.world

    def _live(self):
        if self._handle is None:
            raise ValueError("executor is closed")
        return self._handle

    def _call(self, st):
        if st != 0:
            msg = lib.bg_last_error().decode("utf-8", "replace")
            self._source.reraise(msg)
            _lib.reraise_pending(msg)
            raise BrigadeError(st, msg)

    @property
    def model(self):
        return self._model

    def step(self):
        """One optimizer step on every rank (collective). After a failure the
        executor cannot step again (close it; resume from a checkpoint)."""
        r = _lib.StepResult()
        _lib.pending[0] = None  # a Python layer's exception from an earlier call that nothing re-raised
        self._call(lib.bg_executor_step(self._live(), ctypes.byref(r)))
        return StepResult(r.step, r.loss, r.tokens, r.step_ms, r.tokens_per_s, r.bubble, r.bytes_sent, r.peak_bytes,
                          bool(r.stop), r.grad_norm, r.moe_aux, r.moe_dropped)

    def eval(self, index=0, batches=None, seq_len=None):
        """The loss of the current weights on one global batch, with the forward-only
        program of the schedule (collective; no weight, gradient or step changes): batch
        `index` of `batches` (a callable as the training one, asked with request.step =
        index; None: the training batches). Returns EvalResult(loss, tokens, eval_ms)."""
        if batches is not None and not callable(batches):
            raise TypeError("Executor.eval: batches must be a callable(request) -> (inputs, targets) or None")
        src, bs = self._source, None
        if batches is not None:
            src = _Source(batches, seq_len)
            bs = _lib.BatchSource()
            bs.batch, bs.seq_len, bs.arg, bs.seq = src.c_batch, src.c_seq_len, None, self._seq
        r = _lib.EvalResult()
        st = lib.bg_executor_eval(self._live(), ctypes.byref(bs) if bs is not None else None, int(index),
                                  ctypes.byref(r))
        if st != 0:
            msg = lib.bg_last_error().decode("utf-8", "replace")
            src.reraise(msg)
            raise BrigadeError(st, msg)
        return EvalResult(r.loss, r.tokens, r.eval_ms)

    def set_lr(self, lr):
        """Learning rate of the next steps (every rank must set the same)."""
        if not lr > 0:
            raise ValueError("learning rate must be > 0, got %r" % (lr,))
        lib.bg_executor_set_lr(self._live(), float(lr))

    def request_stop(self):
        """The next step's result has stop=True on every rank."""
        lib.bg_executor_request_stop(self._live())

    @property
    def steps_done(self):
        return lib.bg_executor_steps_done(self._live())

    def info(self):
        i = _lib.ExecutorInfo()
        lib.bg_executor_info(self._live(), ctypes.byref(i))
        return ExecutorInfo(i.rank, i.world, i.pp_rank, i.dp_rank, i.stages, i.chunks, i.params, i.flops_per_step,
                            i.predicted_bytes, i.predicted_act_bytes, i.predicted_stashed, i.peak_stashed,
                            i.peak_act_bytes, i.numa_node, i.schedule.decode() if i.schedule else "")

    def save_checkpoint(self, root, keep=0):
        """Checkpoint the steps done under `root`, keeping the newest `keep` (0: all). Collective."""
        self._call(lib.bg_executor_save_checkpoint(self._live(), encode(root, "checkpoint root"), int(keep)))

    def resume(self, root):
        """Load the newest complete checkpoint under `root`; False if there is none."""
        found = ctypes.c_int(0)
        self._call(lib.bg_executor_resume(self._live(), encode(root, "checkpoint root"), ctypes.byref(found)))
        return bool(found.value)

    def save_weights(self, directory):
        """DIR/model.safetensors (one stage) or DIR/model-stageNNN.safetensors. Collective."""
        self._call(lib.bg_executor_save_weights(self._live(), encode(directory, "weights directory")))

    def load_weights(self, directory):
        """Load weights by name from a save_weights directory (any split)."""
        self._call(lib.bg_executor_load_weights(self._live(), encode(directory, "weights directory")))

    def write_trace(self):
        """Write the Chrome trace to `trace` (collective)."""
        self._call(lib.bg_executor_write_trace(self._live()))

    def close(self):
        """Destroy this rank's part of the job (collective: call it on every rank)."""
        if self._handle is None:
            return
        h, self._handle = self._handle, None
        self._model._in_use -= 1
        check(lib.bg_executor_destroy(h))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            self.close()
            return False
        # The block is already failing: its exception is what the user must
        # see. Closing then usually fails too (the other ranks see this one
        # leave early: "the job did not end cleanly"); that error is kept as
        # a note on the block's exception instead of replacing it.
        try:
            self.close()
        except BrigadeError as e:
            if hasattr(exc, "add_note"):
                exc.add_note("brigade: closing the executor after this error also failed: %s" % e)
        return False

    def __del__(self):
        if getattr(self, "_handle", None) is not None and lib is not None:
            try:
                self.close()
            except BrigadeError:
                pass
