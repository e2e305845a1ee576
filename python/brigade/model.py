"""brigade.model: layers and model descriptions over include/brigade/model.h
and layer.h.

Owns the Python side of who owns a bg_layer_t: a Layer holds its handle until
a Model, a Seq or a Residual takes it (the C side then owns it, also when
that call fails); a Layer never taken is destroyed with its Python object.
A Model owns its bg_model_desc_t and refuses to change, or to go away, while
an executor uses it. A layer written in Python (a Layer subclass) becomes a
C layer through pylayer.py; C then holds it until it destroys the layer.
"""
import ctypes

from . import _lib
from . import pylayer as _pylayer
from ._lib import check, encode, lib

__all__ = ["Layer", "Linear", "Activation", "LayerNorm", "Embedding", "Attention", "Head", "Seq", "Residual",
           "AttentionBlock", "MLPBlock", "TransformerBlock", "Model", "compare_weights"]

_INPUTS = {"tokens": 0, "features": 1}
_ACTIVATIONS = {"gelu": 0, "relu": 1}


class Layer:
    """A layer (a bg_layer_t) until a model or composite takes it: a built-in
    one (Linear(...), ...), one adopted from C, or a layer written in Python.

    A Python layer subclasses Layer and calls Layer.__init__(self, name,
    params) with its brigade.Param list; it defines forward(ctx, x, y),
    backward_input(ctx, x, y, dy, dx), backward_weight(ctx, x, y, dy) when it
    has parameters, and optionally out_shape(shape), stash_bytes(shape),
    wstash_bytes(shape), scratch_bytes(shape), flops(shape) -> (F, B + W) and
    `classes` (a loss layer). The activations are numpy float32 views of
    brigade's buffers: x (n, t, c) (None when the input is tokens:
    ctx.tokens), y the output (forward assigns it), dy its gradient (None in a
    loss layer: ctx.targets and ctx.loss_scale), dx the input's gradient to
    assign (None on a model's first layer). self.params and self.grads map
    each parameter's name to views of its weights and of its gradient, which
    backward_weight accumulates (+=). See docs/python.md.
    """

    def __init__(self, name, params=()):
        if type(self) is Layer:
            raise TypeError("brigade.Layer(name, params) is for subclasses that define forward and backward_input; "
                            "built-in layers come from brigade.Linear(...), ...")
        self.kind = "python"
        self.name = name
        self._handle = None
        self._owner = None
        self._handle = _pylayer.create(self, Layer, name, params)

    # the defaults of a Python layer's optional methods
    def out_shape(self, shape):
        """The output's (n, t, c) for input shape (n, t, c); raise ValueError to refuse it."""
        return shape

    def stash_bytes(self, shape):
        """Bytes kept from forward to the end of the backward (ctx.stash)."""
        return 0

    def wstash_bytes(self, shape):
        """Bytes kept from backward_input to backward_weight (ctx.wstash)."""
        return 0

    def scratch_bytes(self, shape):
        """Bytes of scratch during one call (ctx.scratch)."""
        return 0

    def flops(self, shape):
        """(forward FLOPs, backward FLOPs) for the partitioner."""
        return (0.0, 0.0)

    def forward(self, ctx, x, y):
        raise NotImplementedError

    def backward_input(self, ctx, x, y, dy, dx):
        raise NotImplementedError

    def backward_weight(self, ctx, x, y, dy):
        raise NotImplementedError

    @classmethod
    def _builtin(cls, kind, name, create):
        self = cls.__new__(cls)
        self.kind = kind
        self.name = name
        self._handle = None
        self._owner = None
        h = ctypes.c_void_p()
        check(create(encode(name, "layer name"), ctypes.byref(h)))
        self._handle = h
        return self

    @classmethod
    def adopt(cls, pointer):
        """Take ownership of a bg_layer_t * made by C code (a layer type of your
        own, compiled into a shared library you load with ctypes and whose
        constructor follows bg_layer_create). The layer's name is read from it."""
        addr = pointer.value if isinstance(pointer, ctypes.c_void_p) else pointer
        if not isinstance(addr, int) or not addr:
            raise ValueError("Layer.adopt: expected a non-NULL bg_layer_t pointer, got %r" % (pointer,))
        s = ctypes.cast(ctypes.c_void_p(addr), ctypes.POINTER(_lib.Layer)).contents
        self = cls.__new__(cls)
        self.kind = "adopted"
        self.name = s.name.decode("utf-8", "replace")
        self._handle = ctypes.c_void_p(addr)
        self._owner = None
        return self

    def _take(self, owner):
        """Hand the handle to C (`owner` describes who takes it)."""
        if self._handle is None:
            raise ValueError("layer %r (%s) already belongs to %s; build a new layer for %s"
                             % (self.name, self.kind, self._owner, owner))
        if self.kind == "python":
            _pylayer.given_to_c(self)
        h, self._handle, self._owner = self._handle, None, owner
        return h

    @property
    def param_count(self):
        """Parameters of the layer and its children (only before it is given away)."""
        if self._handle is None:
            raise ValueError("layer %r already belongs to %s" % (self.name, self._owner))
        return lib.bg_layer_param_count(self._handle)

    @property
    def loss_classes(self):
        """Target classes if this is a loss layer (a Head, or a Seq ending in one), else 0."""
        if self._handle is None:
            raise ValueError("layer %r already belongs to %s" % (self.name, self._owner))
        return lib.bg_layer_loss_classes(self._handle)

    def __del__(self):
        h = getattr(self, "_handle", None)
        if h is not None and lib is not None:
            lib.bg_layer_destroy(h)
            self._handle = None

    def __repr__(self):
        return "<brigade.%s %r>" % (type(self).__name__, self.name)


def Linear(name, c_in, c_out, bias=True, init_std=0.02):
    """(n, t, c_in) -> (n, t, c_out)."""
    return Layer._builtin("linear", name, lambda n, p: lib.bg_layer_linear(n, c_in, c_out, int(bool(bias)), init_std, p))


def Activation(name, kind="gelu"):
    """Elementwise "gelu" or "relu"."""
    if kind not in _ACTIVATIONS:
        raise ValueError("activation %r: kind must be one of %s, got %r" % (name, ", ".join(_ACTIVATIONS), kind))
    return Layer._builtin("activation", name, lambda n, p: lib.bg_layer_activation(n, _ACTIVATIONS[kind], p))


def LayerNorm(name, c):
    """Layer normalisation over c channels (weight and bias)."""
    return Layer._builtin("layernorm", name, lambda n, p: lib.bg_layer_layernorm(n, c, p))


def Embedding(name, vocab, max_t, c, init_std=0.02):
    """Token + position embedding: (n, t) token ids -> (n, t, c); t <= max_t."""
    return Layer._builtin("embedding", name, lambda n, p: lib.bg_layer_embedding(n, vocab, max_t, c, init_std, p))


def Attention(name, c, heads):
    """Causal multi-head attention core: (n, t, 3c) qkv -> (n, t, c); no parameters."""
    return Layer._builtin("attention", name, lambda n, p: lib.bg_layer_attention(n, c, heads, p))


def Head(name, c, classes, bias=True, init_std=0.02):
    """Linear c -> classes + softmax cross-entropy: the loss layer a model ends with."""
    return Layer._builtin("head", name, lambda n, p: lib.bg_layer_head(n, c, classes, int(bool(bias)), init_std, p))


def Seq(name, layers):
    """Composite: `layers` in order (it takes them)."""
    layers = list(layers)
    for l in layers:
        if not isinstance(l, Layer):
            raise TypeError("seq %r: children must be brigade layers, got %s" % (name, type(l).__name__))
    ids = [id(l) for l in layers]
    if len(set(ids)) != len(ids):
        raise ValueError("seq %r: the same layer object appears twice" % (name,))
    taken = [l for l in layers if l._handle is None]
    if taken:  # fail before taking any
        taken[0]._take("seq %r" % (name,))
    arr = (ctypes.c_void_p * max(len(layers), 1))(*[l._take("seq %r" % (name,)) for l in layers])
    return Layer._builtin("seq", name, lambda n, p: lib.bg_layer_seq(n, len(layers), arr, p))


def Residual(name, child):
    """Composite: out = in + child(in) (it takes child)."""
    if not isinstance(child, Layer):
        raise TypeError("residual %r: child must be a brigade layer, got %s" % (name, type(child).__name__))
    h = child._take("residual %r" % (name,))
    return Layer._builtin("residual", name, lambda n, p: lib.bg_layer_residual(n, h, p))


def AttentionBlock(name, c, heads, init_std=0.02, proj_std=None):
    """Pre-norm causal self-attention block: x + proj(attn(qkv(ln(x))))."""
    ps = init_std if proj_std is None else proj_std
    return Layer._builtin("attention_block", name, lambda n, p: lib.bg_layer_attention_block(n, c, heads, init_std, ps, p))


def MLPBlock(name, c, init_std=0.02, proj_std=None):
    """Pre-norm MLP block: x + proj(gelu(fc(ln(x)))), hidden 4c."""
    ps = init_std if proj_std is None else proj_std
    return Layer._builtin("mlp_block", name, lambda n, p: lib.bg_layer_mlp_block(n, c, init_std, ps, p))


def TransformerBlock(name, c, heads, init_std=0.02, proj_std=None):
    """Attention block then MLP block ("attn", "mlp"). proj_std defaults to init_std
    (the GPT builder uses init_std / sqrt(2 * blocks))."""
    ps = init_std if proj_std is None else proj_std
    return Layer._builtin("transformer_block", name,
                 lambda n, p: lib.bg_layer_transformer_block(n, c, heads, init_std, ps, p))


def _desc_param(field, doc):
    """A read-only property of the description's bg_model_desc_params_t."""
    return property(lambda self: getattr(lib.bg_model_desc_params(self._live()).contents, field), doc=doc)


class Model:
    """A model description (bg_model_desc_t): top-level layers, input, loss, ties.

    Model(name="model", input="tokens"|"features", vocab=0, seq_len=1, features=1, seed=1337)
    """

    def __init__(self, name="model", input="features", vocab=0, seq_len=1, features=1, seed=1337, _handle=None):
        self._in_use = 0
        self._handle = None
        if _handle is not None:
            self._handle = _handle
            return
        if input not in _INPUTS:
            raise ValueError("model %r: input must be \"tokens\" or \"features\", got %r" % (name, input))
        self._name = encode(name, "model name")
        p = _lib.ModelDescParams(ctypes.sizeof(_lib.ModelDescParams), self._name, _INPUTS[input], int(vocab),
                                 int(seq_len), int(features), int(seed))
        h = ctypes.c_void_p()
        check(lib.bg_model_desc_create(ctypes.byref(p), ctypes.byref(h)))
        self._handle = h

    # ---------------------------------------------------------------- builders
    @classmethod
    def _build(cls, cfg):
        h = ctypes.c_void_p()
        check(lib.bg_model_build(ctypes.byref(cfg), ctypes.byref(h)))
        return cls(_handle=h)

    @staticmethod
    def _moe(cfg, moe):
        """The MoE fields of bg_model_config_t from a dict (None: dense): experts, top_k (2), moe_every (1),
        capacity_factor (0: dropless), moe_aux_coef (0.01), moe_gate ("softmax" or "sigmoid"), ep (1: the
        expert-parallel degree the layers are built for; run by an Executor with the same ep)."""
        moe = dict(moe or {})
        gate = moe.pop("moe_gate", "softmax")
        if gate not in ("softmax", "sigmoid"):
            raise ValueError('moe_gate must be "softmax" or "sigmoid", got %r' % (gate,))
        cfg.moe_gate = 1 if gate == "sigmoid" else 0
        for k, v in (("experts", 0), ("top_k", 2), ("moe_every", 1), ("capacity_factor", 0.0), ("moe_aux_coef", 0.01),
                     ("ep", 1)):
            setattr(cfg, k, moe.pop(k, v))
        if moe:
            raise ValueError("unknown MoE settings: %s" % ", ".join(sorted(moe)))
        return cfg

    @classmethod
    def gpt(cls, layers=4, d_model=128, heads=4, seq_len=64, vocab=256, seed=1337, tie_embeddings=False,
            precision="fp32", tp=1, sequence_parallel=False, moe=None):
        """GPT through bg_model_build: embed, blocks.0 .. blocks.L-1, ln_f, head. precision "bf16": the
        blocks keep their activations in bf16 (bg_model_config_t.precision; computing stays fp32). tp > 1:
        the tensor-parallel layers of that degree (run by an Executor with the same tp), with
        sequence_parallel the activations between blocks split along the sequence (docs/layers.md). moe: a
        dict of MoE settings (_moe; docs/layers.md), e.g. {"experts": 8, "top_k": 2}."""
        if precision not in ("fp32", "bf16"):
            raise ValueError('precision must be "fp32" or "bf16", got %r' % (precision,))
        cfg = _lib.ModelConfig(ctypes.sizeof(_lib.ModelConfig), 0, layers, d_model, heads, seq_len, vocab, 32, 8,
                               seed, int(bool(tie_embeddings)), int(tp), int(bool(sequence_parallel)),
                               1 if precision == "bf16" else 0, 0, 0, 10000.0)
        return cls._build(cls._moe(cfg, moe))

    @classmethod
    def llama(cls, layers=4, d_model=128, heads=4, kv_heads=None, ffn_hidden=0, rope_theta=10000.0, seq_len=64,
              vocab=256, seed=1337, tie_embeddings=False, precision="fp32", tp=1, moe=None):
        """Llama through bg_model_build: embed (no position table), blocks.0 .. blocks.L-1 (RMSNorm, rotary
        grouped-query attention with kv_heads key/value heads (None: heads), SwiGLU of ffn_hidden (0: 8 d_model / 3
        rounded up to 64), no biases), norm, head. moe: as for gpt()."""
        if precision not in ("fp32", "bf16"):
            raise ValueError('precision must be "fp32" or "bf16", got %r' % (precision,))
        cfg = _lib.ModelConfig(ctypes.sizeof(_lib.ModelConfig), 2, layers, d_model, heads, seq_len, vocab, 32, 8,
                               seed, int(bool(tie_embeddings)), int(tp), 0, 1 if precision == "bf16" else 0,
                               kv_heads or 0, ffn_hidden, rope_theta)
        return cls._build(cls._moe(cfg, moe))

    @classmethod
    def mlp(cls, layers=4, d_model=128, in_features=32, classes=8, seed=1337, tp=1):
        """MLP through bg_model_build: fc.i, act.i (hidden width d_model), head; tp > 1: its tensor-parallel
        layers of that degree."""
        cfg = _lib.ModelConfig(ctypes.sizeof(_lib.ModelConfig), 1, layers, d_model, 4, 64, 256, in_features, classes,
                               seed, 0, int(tp))
        return cls._build(cfg)

    @classmethod
    def from_json(cls, text):
        """Rebuild a builder-made description from to_json() text."""
        h = ctypes.c_void_p()
        check(lib.bg_model_desc_from_json(encode(text, "model JSON"), ctypes.byref(h)))
        return cls(_handle=h)

    # ---------------------------------------------------------------- editing
    def _live(self):
        if self._handle is None:
            raise ValueError("model is closed")
        return self._handle

    def _editable(self, what):
        h = self._live()
        if self._in_use:
            raise ValueError("model %r: cannot %s while an executor uses it (close the executor first)"
                             % (self.name, what))
        return h

    def add(self, layer):
        """Append a top-level layer; the model takes it (also when this fails). Returns self."""
        if not isinstance(layer, Layer):
            raise TypeError("model %r: add() takes a brigade layer, got %s" % (self.name, type(layer).__name__))
        h = self._editable("add layers")
        check(lib.bg_model_desc_add(h, layer._take("model %r" % (self.name,))))
        return self

    def tie(self, a, b):
        """Tie tensor b to tensor a (full names: "embed.wte", "head.weight"). Returns self."""
        h = self._editable("add ties")
        check(lib.bg_model_desc_tie(h, encode(a, "tensor name"), encode(b, "tensor name")))
        return self

    def check(self):
        """Check the complete description; BrigadeError names the layer or tensor. Returns self."""
        check(lib.bg_model_desc_check(self._live()))
        return self

    def to_json(self):
        """The description as JSON text (layers, tensors and shapes, ties)."""
        out = ctypes.c_void_p()
        check(lib.bg_model_desc_to_json(self._live(), ctypes.byref(out)))
        return _lib.take_string(out)

    # ---------------------------------------------------------------- queries
    @property
    def name(self):
        return lib.bg_model_desc_params(self._live()).contents.name.decode()

    @property
    def input(self):
        return "tokens" if lib.bg_model_desc_params(self._live()).contents.input == 0 else "features"

    vocab = _desc_param("vocab", "Token models: ids are in [0, vocab).")
    seq_len = _desc_param("seq_len", "Positions per sequence (at most, for token models).")
    features = _desc_param("features", "Feature models: channels per position.")
    seed = _desc_param("seed", "Initialisation seed.")

    @property
    def layers(self):
        """Names of the top-level layers, in order."""
        h = self._live()
        return [lib.bg_model_desc_layer(h, i).contents.name.decode() for i in range(lib.bg_model_desc_num_layers(h))]

    @property
    def classes(self):
        """Classes of the loss layer (0 if the last layer is no loss)."""
        return lib.bg_model_desc_classes(self._live())

    @property
    def ties(self):
        """[(source, copy)] tensor names."""
        h = self._live()
        out = []
        for i in range(lib.bg_model_desc_num_ties(h)):
            a, b = ctypes.c_char_p(), ctypes.c_char_p()
            lib.bg_model_desc_tie_names(h, i, ctypes.byref(a), ctypes.byref(b))
            out.append((a.value.decode(), b.value.decode()))
        return out

    @property
    def param_count(self):
        return lib.bg_model_desc_param_count(self._live())

    @property
    def precision(self):
        """"bf16" when a layer keeps its activations in bf16 (bg_model_desc_precision), else "fp32"."""
        return "bf16" if lib.bg_model_desc_precision(self._live()) == 1 else "fp32"

    def input_shape(self, n, t=1):
        """(n, t) for token inputs, (n, t, c) for features (t is the model's for features)."""
        s = lib.bg_model_desc_input_shape(self._live(), n, t)
        return (s.n, s.t) if s.c == 0 else (s.n, s.t, s.c)

    def tensor_layer(self, name):
        """Index of the top-level layer holding tensor `name` (full name), or -1."""
        return lib.bg_model_desc_tensor_layer(self._live(), encode(name, "tensor name"))

    def __len__(self):
        return lib.bg_model_desc_num_layers(self._live())

    def __repr__(self):
        if self._handle is None:
            return "<brigade.Model (closed)>"
        return "<brigade.Model %r: %d layers, %d parameters>" % (self.name, len(self), self.param_count)

    # ---------------------------------------------------------------- lifetime
    def close(self):
        """Destroy the description (refused while an executor uses it)."""
        if self._handle is None:
            return
        if self._in_use:
            raise ValueError("model %r: cannot close while an executor uses it (close the executor first)"
                             % (self.name,))
        lib.bg_model_desc_destroy(self._handle)
        self._handle = None

    def __del__(self):
        # An executor holds a reference, so this runs only when none is alive,
        # except during interpreter teardown: then leaking beats a crash.
        if getattr(self, "_handle", None) is not None and not self._in_use and lib is not None:
            lib.bg_model_desc_destroy(self._handle)
            self._handle = None


def compare_weights(dir_a, dir_b):
    """Compare the safetensors files under two directories tensor by tensor
    (bg_safetensors_compare_dirs): a dict of tensors, identical, only_a,
    only_b, shape_mismatch, max_abs, max_rel, worst, rel_l2."""
    r = _lib.CompareResult()
    check(lib.bg_safetensors_compare_dirs(encode(dir_a, "directory"), encode(dir_b, "directory"), ctypes.byref(r)))
    out = {f: getattr(r, f) for f, _ in _lib.CompareResult._fields_}
    out["worst"] = r.worst.decode()
    return out

