"""brigade._lib: loads libbrigade.so and declares the C API to ctypes.

Owns: finding the library, the ctypes mirrors of the public C structs (the
exact layout of include/brigade/*.h, checked field by field against the C
compiler by tests/python/test_binding.py), every function's argtypes and
restype, the status enum and BrigadeError. It holds no Python-side state and
no policy: model.py and executor.py build the API on it.
"""
import ctypes
import ctypes.util
import enum
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int32, c_int64,
                    c_size_t, c_uint64, c_void_p)

__all__ = ["lib", "BrigadeError", "Status", "check", "library_path", "VERSION", "check_version"]

# The binding's version: the library it loads must report the same (check_version).
VERSION = "0.1.0"

# --------------------------------------------------------------------- statuses

class Status(enum.IntEnum):
    """bg_status_t (include/brigade/status.h: BG_STATUS_MAP)."""
    OK = 0
    ERR_INVALID = -1
    ERR_NOMEM = -2
    ERR_IO = -3
    ERR_PARSE = -4
    ERR_UNSUPPORTED = -5
    ERR_NOT_FOUND = -6
    ERR_TIMEOUT = -7
    ERR_PEER = -8
    ERR_TRANSPORT = -9
    ERR_CANCELED = -10
    ERR_NO_FIT = -11
    ERR_DEADLOCK = -12
    ERR_MISMATCH = -13
    ERR_DEVICE = -14
    ERR_INTERNAL = -15
    IN_PROGRESS = 1


class BrigadeError(Exception):
    """A brigade call failed: `status` (a Status) and `message` (bg_last_error(),
    which names the rank, stage, layer, tensor or step)."""

    def __init__(self, status, message):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        super().__init__(status, message)

    def __str__(self):
        what = lib.bg_status_string(int(self.status)).decode() if lib is not None else str(self.status)
        return "%s: %s" % (what, self.message) if self.message else what


# --------------------------------------------------------------------- structs
# Each mirrors the C struct of the same name field for field (x86-64 and
# aarch64 Linux: ctypes applies the C alignment rules).

BG_NAME_MAX = 96
BG_PARAM_MAX_DIMS = 4


class Shape(Structure):
    """bg_shape_t: n sequences, t positions, c channels (0: token ids)."""
    _fields_ = [("n", c_int), ("t", c_int), ("c", c_int)]


class ModelDescParams(Structure):
    """bg_model_desc_params_t."""
    _fields_ = [("size", c_size_t), ("name", c_char_p), ("input", c_int), ("vocab", c_int), ("seq_len", c_int),
                ("features", c_int), ("seed", c_uint64)]


class ModelConfig(Structure):
    """bg_model_config_t."""
    _fields_ = [("size", c_size_t), ("kind", c_int), ("layers", c_int), ("d_model", c_int), ("heads", c_int),
                ("seq_len", c_int), ("vocab", c_int), ("in_features", c_int), ("classes", c_int),
                ("seed", c_uint64), ("tie_embeddings", c_int), ("tp", c_int),
                ("sequence_parallel", c_int), ("precision", c_int), ("kv_heads", c_int), ("ffn_hidden", c_int),
                ("rope_theta", c_float), ("experts", c_int), ("top_k", c_int), ("moe_every", c_int),
                ("capacity_factor", c_float), ("moe_aux_coef", c_float), ("moe_gate", c_int), ("ep", c_int)]


class OptimConfig(Structure):
    """bg_optim_config_t."""
    _fields_ = [("size", c_size_t), ("kind", c_int), ("lr", c_float), ("beta1", c_float), ("beta2", c_float),
                ("eps", c_float), ("momentum", c_float), ("weight_decay", c_float)]


class BatchRequest(Structure):
    """bg_batch_request_t."""
    _fields_ = [("step", c_int64), ("microbatch", c_int), ("replica", c_int), ("first", c_int), ("in_", Shape)]


# bg_batch_fn and bg_seq_len_fn. The buffers are void pointers so that NULL
# ("not wanted on this rank") arrives as None and the address as an int.
BATCH_FN = CFUNCTYPE(c_int, POINTER(BatchRequest), c_void_p, c_void_p, c_void_p, c_void_p)
SEQ_LEN_FN = CFUNCTYPE(c_int, c_int64, c_int, c_void_p)


class BatchSource(Structure):
    """bg_batch_source_t."""
    _fields_ = [("batch", BATCH_FN), ("seq_len", SEQ_LEN_FN), ("arg", c_void_p), ("seq", c_int)]


class ExecutorParams(Structure):
    """bg_executor_params_t."""
    _fields_ = [("size", c_size_t), ("model", c_void_p), ("pp", c_int), ("dp", c_int), ("tp", c_int),
                ("schedule", c_char_p), ("chunks", c_int), ("split", POINTER(c_int)), ("nsplit", c_int),
                ("batch", c_int), ("microbatches", c_int), ("optim", OptimConfig), ("data", BatchSource),
                ("backend", c_char_p), ("threads", c_int), ("comm", c_void_p), ("recompute", c_int),
                ("recompute_stages", POINTER(c_int)), ("nrecompute_stages", c_int), ("trace_path", c_char_p),
                ("process_wide", c_int), ("schedule_json", c_char_p), ("zero", c_int),
                ("emulate", c_char_p), ("emulate_scale", c_double), ("ps", c_int), ("staleness", c_int),
                ("device_mem", POINTER(c_size_t)), ("ndevice_mem", c_int),
                ("clip_grad", c_double), ("data_seed", c_uint64), ("ep", c_int), ("cp", c_int),
                ("offload", c_int), ("offload_dir", c_char_p)]


class StepResult(Structure):
    """bg_step_result_t."""
    _fields_ = [("step", c_int64), ("loss", c_double), ("tokens", c_double), ("step_ms", c_double),
                ("tokens_per_s", c_double), ("bubble", c_double), ("bytes_sent", c_uint64), ("peak_bytes", c_size_t),
                ("stop", c_int), ("grad_norm", c_double), ("ps_role", c_int), ("staleness", c_int),
                ("bytes_recv", c_uint64), ("optim_ms", c_double), ("idle", c_double), ("live_workers", c_int),
                ("moe_aux", c_double), ("moe_dropped", c_int64)]


class EvalResult(Structure):
    """bg_eval_result_t."""
    _fields_ = [("loss", c_double), ("tokens", c_double), ("eval_ms", c_double)]


class ExecutorInfo(Structure):
    """bg_executor_info_t."""
    _fields_ = [("rank", c_int), ("world", c_int), ("pp_rank", c_int), ("dp_rank", c_int), ("stages", c_int),
                ("chunks", c_int), ("params", c_size_t), ("flops_per_step", c_double), ("predicted_bytes", c_size_t),
                ("predicted_act_bytes", c_size_t), ("predicted_stashed", c_int), ("peak_stashed", c_int),
                ("peak_act_bytes", c_size_t), ("numa_node", c_int), ("schedule", c_char_p),
                ("zero", c_int)]


class CompareResult(Structure):
    """bg_compare_result_t."""
    _fields_ = [("tensors", c_int), ("identical", c_int), ("only_a", c_int), ("only_b", c_int),
                ("shape_mismatch", c_int), ("max_abs", c_double), ("max_rel", c_double),
                ("worst", c_char * (2 * BG_NAME_MAX)), ("rel_l2", c_double)]


class Layer(Structure):
    """struct bg_layer (public in layer.h); read only, for names."""
    _fields_ = [("ops", c_void_p), ("name", c_char * BG_NAME_MAX), ("nparams", c_int), ("params", c_void_p),
                ("nchildren", c_int), ("children", c_void_p), ("impl", c_void_p), ("precision", c_int)]


class Param(Structure):
    """bg_param_t: one parameter tensor of a layer (data and grad set when a model binds it)."""
    _fields_ = [("name", c_char * BG_NAME_MAX), ("ndim", c_int), ("shape", c_int64 * BG_PARAM_MAX_DIMS),
                ("numel", c_size_t), ("init", c_int), ("init_value", c_float), ("decay", c_int),
                ("data", c_void_p), ("grad", c_void_p), ("split_dim", c_int), ("split_parts", c_int),
                ("split_blocks", c_int), ("tp_partial", c_int), ("split_ep", c_int)]


class LayerCtx(Structure):
    """bg_layer_ctx_t: the per-call context a layer's compute functions get."""
    _fields_ = [("be", c_void_p), ("in_", Shape), ("tokens", c_void_p), ("targets", c_void_p),
                ("loss_scale", c_float), ("stash", c_void_p), ("wstash", c_void_p), ("scratch", c_void_p),
                ("tp", c_void_p), ("deferred", c_void_p), ("no_backward", c_int), ("ep", c_void_p),
                ("cp", c_void_p)]


# bg_tp_comm_t's collectives (the group's; arguments as in layer.h).
TP_ALLREDUCE_FN = CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t)
TP_ALLGATHER_FN = CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, c_size_t)


class TpComm(Structure):
    """bg_tp_comm_t: a tensor-parallel group as layers see it (ctx.tp). The
    optional non-blocking slots are mirrored as plain pointers: Python layers
    use the blocking allreduce and allgather only."""
    _fields_ = [("size", c_int), ("rank", c_int), ("allreduce", TP_ALLREDUCE_FN), ("allgather", TP_ALLGATHER_FN),
                ("arg", c_void_p), ("iallreduce", c_void_p), ("wait", c_void_p), ("reduce_scatter", c_void_p),
                ("ireduce_scatter", c_void_p), ("iallgather", c_void_p), ("alltoallv", c_void_p)]


# bg_layer_ops_t's function types. The layer, the context (a LayerCtx) and
# every buffer are void pointers: NULL arrives as None, an address as an int
# (no ctypes object to build per call).
OUT_SHAPE_FN = CFUNCTYPE(c_int, c_void_p, Shape, POINTER(Shape))
BYTES_FN = CFUNCTYPE(c_size_t, c_void_p, Shape)
FLOPS_FN = CFUNCTYPE(c_double, c_void_p, Shape)
FORWARD_FN = CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, c_void_p)
BACKWARD_INPUT_FN = CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p)
BACKWARD_WEIGHT_FN = CFUNCTYPE(c_int, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p)
DESTROY_FN = CFUNCTYPE(None, c_void_p)
CLASSES_FN = CFUNCTYPE(c_int, c_void_p)


class LayerOps(Structure):
    """bg_layer_ops_t: a layer type's functions (Python layers fill one per class)."""
    _fields_ = [("type", c_char_p), ("out_shape", OUT_SHAPE_FN), ("stash_bytes", BYTES_FN),
                ("wstash_bytes", BYTES_FN), ("scratch_bytes", BYTES_FN), ("fwd_flops", FLOPS_FN),
                ("bwd_flops", FLOPS_FN), ("forward", FORWARD_FN), ("backward_input", BACKWARD_INPUT_FN),
                ("backward_weight", BACKWARD_WEIGHT_FN), ("destroy", DESTROY_FN), ("loss_classes", CLASSES_FN),
                ("tp_cost", c_void_p), ("backward", c_void_p)]


# The structs the layout test compares with the C compiler, by C name.
STRUCTS = {
    "bg_shape_t": Shape, "bg_model_desc_params_t": ModelDescParams, "bg_model_config_t": ModelConfig,
    "bg_optim_config_t": OptimConfig, "bg_batch_request_t": BatchRequest, "bg_batch_source_t": BatchSource,
    "bg_executor_params_t": ExecutorParams, "bg_step_result_t": StepResult, "bg_eval_result_t": EvalResult,
    "bg_executor_info_t": ExecutorInfo,
    "bg_compare_result_t": CompareResult, "bg_layer_t": Layer, "bg_param_t": Param, "bg_layer_ctx_t": LayerCtx,
    "bg_layer_ops_t": LayerOps, "bg_tp_comm_t": TpComm,
}
# C field names that are Python keywords.
C_FIELD = {"in_": "in"}

# --------------------------------------------------------------------- loading

HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = os.path.join(HERE, "_native")  # what `pip install` put with the package (python/setup.py)


def installed():
    """(library, CLI) paths of the installed brigade the package was built against (BRIGADE_LIB or
    pkg-config at `pip install` time, python/setup.py), ("", "") when it bundles its own or is a source tree."""
    try:
        with open(os.path.join(NATIVE, "installed")) as f:
            lines = f.read().splitlines()
        return (lines + ["", ""])[0], (lines + ["", ""])[1]
    except OSError:
        return "", ""


def _candidates():
    env = os.environ.get("BRIGADE_LIB")
    if env:
        return [env], True
    c = [os.path.join(NATIVE, "lib", "libbrigade.so.0")]
    if installed()[0]:
        c.append(installed()[0])
    root = os.path.dirname(os.path.dirname(HERE))  # python/brigade -> the source tree
    c.append(os.path.join(root, "build", "libbrigade.so"))
    found = ctypes.util.find_library("brigade")
    if found:
        c.append(found)
    c += ["libbrigade.so.0", "libbrigade.so"]
    return c, False


def _load():
    cands, from_env = _candidates()
    errors = []
    for path in cands:
        if "/" in path and not os.path.exists(path):
            errors.append("%s: no such file" % path)
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append("%s: %s" % (path, e))
    hint = "BRIGADE_LIB=%s cannot be loaded" % cands[0] if from_env else \
        "set BRIGADE_LIB to the path of libbrigade.so (build/libbrigade.so after cmake --build build)"
    raise ImportError("brigade: cannot load libbrigade (%s); tried: %s" % (hint, "; ".join(errors)))


lib = None
lib, library_path = _load()
_libc = ctypes.CDLL(None)
_libc.free.argtypes = [c_void_p]
_libc.free.restype = None

# --------------------------------------------------------------------- functions

def _decl(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


P = c_void_p  # opaque handles: bg_model_desc_t *, bg_layer_t *, bg_executor_t *
PP = POINTER(c_void_p)
st = c_int

_decl("bg_version", c_char_p)
_decl("bg_status_string", c_char_p, c_int)
_decl("bg_last_error", c_char_p)
_decl("bg_error_clear", None)
# bg_error is variadic; the binding only calls it as bg_error(st, "%s", msg):
# integer-class arguments pass the same way to variadic functions on the
# x86-64 and aarch64 Linux ABIs.
_decl("bg_error", st, c_int, c_char_p, c_char_p)

_decl("bg_model_desc_create", st, POINTER(ModelDescParams), PP)
_decl("bg_model_desc_destroy", None, P)
_decl("bg_model_desc_add", st, P, P)
_decl("bg_model_desc_tie", st, P, c_char_p, c_char_p)
_decl("bg_model_desc_check", st, P)
_decl("bg_model_desc_params", POINTER(ModelDescParams), P)
_decl("bg_model_desc_num_layers", c_int, P)
_decl("bg_model_desc_layer", POINTER(Layer), P, c_int)
_decl("bg_model_desc_classes", c_int, P)
_decl("bg_model_desc_num_ties", c_int, P)
_decl("bg_model_desc_tie_names", None, P, c_int, POINTER(c_char_p), POINTER(c_char_p))
_decl("bg_model_desc_input_shape", Shape, P, c_int, c_int)
_decl("bg_model_desc_param_count", c_size_t, P)
_decl("bg_model_desc_precision", c_int, P)
_decl("bg_model_desc_tensor_layer", c_int, P, c_char_p)
_decl("bg_model_desc_to_json", st, P, POINTER(c_void_p))
_decl("bg_model_desc_from_json", st, c_char_p, PP)
_decl("bg_model_config_check", st, POINTER(ModelConfig))
_decl("bg_model_build", st, POINTER(ModelConfig), PP)
_decl("bg_safetensors_compare_dirs", st, c_char_p, c_char_p, POINTER(CompareResult))

_decl("bg_layer_create", st, POINTER(LayerOps), c_char_p, c_int, POINTER(Param), c_void_p, PP)
_decl("bg_layer_destroy", None, P)
_decl("bg_layer_param_count", c_size_t, P)
_decl("bg_layer_loss_classes", c_int, P)
_decl("bg_layer_linear", st, c_char_p, c_int, c_int, c_int, c_float, PP)
_decl("bg_layer_activation", st, c_char_p, c_int, PP)
_decl("bg_layer_layernorm", st, c_char_p, c_int, PP)
_decl("bg_layer_embedding", st, c_char_p, c_int, c_int, c_int, c_float, PP)
_decl("bg_layer_attention", st, c_char_p, c_int, c_int, PP)
_decl("bg_layer_head", st, c_char_p, c_int, c_int, c_int, c_float, PP)
_decl("bg_layer_seq", st, c_char_p, c_int, PP, PP)
_decl("bg_layer_residual", st, c_char_p, P, PP)
_decl("bg_layer_attention_block", st, c_char_p, c_int, c_int, c_float, c_float, PP)
_decl("bg_layer_mlp_block", st, c_char_p, c_int, c_float, c_float, PP)
_decl("bg_layer_transformer_block", st, c_char_p, c_int, c_int, c_float, c_float, PP)

_decl("bg_executor_create", st, POINTER(ExecutorParams), PP)
_decl("bg_executor_step", st, P, POINTER(StepResult))
_decl("bg_executor_eval", st, P, POINTER(BatchSource), c_int64, POINTER(EvalResult))
_decl("bg_executor_set_lr", None, P, c_float)
_decl("bg_executor_request_stop", None, P)
_decl("bg_executor_steps_done", c_int64, P)
_decl("bg_executor_rank", c_int, P)
_decl("bg_executor_info", None, P, POINTER(ExecutorInfo))
_decl("bg_executor_save_checkpoint", st, P, c_char_p, c_int)
_decl("bg_executor_resume", st, P, c_char_p, POINTER(c_int))
_decl("bg_executor_save_weights", st, P, c_char_p)
_decl("bg_executor_load_weights", st, P, c_char_p)
_decl("bg_executor_write_trace", st, P)
_decl("bg_executor_destroy", st, P)


# The first exception a Python layer's method raised inside a C call
# (pylayer.py), kept for the Python call that made that C call to re-raise.
pending = [None]


def reraise_pending(message):
    """After a failed C call: raise what a Python layer raised during it, if
    anything (type and traceback kept, brigade's message added as a note)."""
    e, pending[0] = pending[0], None
    if e is None:
        return
    if hasattr(e, "add_note"):
        e.add_note("(brigade: %s)" % message)
    raise e


def check_version():
    """ImportError unless the loaded library is the version this binding mirrors
    (its structs and functions are those of one version of the headers)."""
    got = lib.bg_version().decode()
    if got != VERSION:
        raise ImportError("brigade: the Python binding is version %s but %s is libbrigade %s; install the matching "
                          "package or point BRIGADE_LIB at a libbrigade %s" % (VERSION, library_path, got, VERSION))


check_version()


def check(status):
    """Raise BrigadeError(status, bg_last_error()) unless status is OK (or
    the exception a Python layer raised during the call)."""
    if status != 0:
        msg = lib.bg_last_error().decode("utf-8", "replace")
        reraise_pending(msg)
        raise BrigadeError(status, msg)


def take_string(ptr):
    """Copy a malloc'ed C string into a str and free() it."""
    try:
        return ctypes.string_at(ptr).decode("utf-8")
    finally:
        _libc.free(ptr)


def encode(s, what):
    """A str argument as the bytes C wants (None stays None)."""
    if s is None:
        return None
    if isinstance(s, os.PathLike):
        s = os.fspath(s)
    if isinstance(s, bytes):
        return s
    if not isinstance(s, str):
        raise TypeError("%s must be a str, got %s" % (what, type(s).__name__))
    if "\0" in s:
        raise ValueError("%s contains a NUL character" % what)
    return s.encode("utf-8")
