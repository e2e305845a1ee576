"""brigade.torch: a PyTorch nn.Module as a brigade layer (a pipeline stage's
worth, or one layer), used only where torch is installed.

Owns the adapter between autograd and brigade's three layer calls: brigade
owns the parameters' memory (the module's parameters become torch tensors
viewing brigade's buffers, so its optimizer, checkpoints, dp and ZeRO work on
them); forward runs the module with autograd on and keeps the graph (by the
microbatch's stash address) until the microbatch's backward ends (none for a
forward that no backward follows: recomputation's first one, evaluation);
backward_input is torch.autograd.grad to the input keeping the graph;
backward_weight computes the parameter gradients from it later and adds them
to brigade's gradient buffers, so zero-bubble schedules split the two.

It must not own training state of its own: no optimizer, no copies of the
weights beyond the module's first values (copied in once, see Module).
Every buffer reaches torch through DLPack (brigade.dlpack.View, never a
copy), so a CUDA backend's device memory would arrive as CUDA tensors; only
the CPU backend is tested (docs/python.md).
"""
import torch as _torch

from .model import Layer
from .pylayer import Param

__all__ = ["Module"]

# brigade's buffers as torch tensors, through DLPack (brigade.dlpack.View): no copy, host or device memory. The
# read-only ones (x, dy) are only read here. The stage reuses its buffers, so most calls find their tensor made
# (an import costs about ten times torch.from_numpy); a tensor given to autograd is a detached alias of it.
_tensors = {}


def _T(v):
    key = (v.address, v.shape, v.typestr, v.device)
    t = _tensors.get(key)
    if t is None:
        if len(_tensors) >= 4096:
            _tensors.clear()
        t = _tensors[key] = _torch.from_dlpack(v)
    return t


class Module(Layer):
    views = "dlpack"  # the layer's buffers come as brigade.dlpack.View: torch tensors on the backend's device

    """Module(name, module, loss=False, init="module"): `module` maps (n, t, c)
    float32 features, or (n, t) token ids (int64) on a token model's first
    layer, to (n, t, c_out); with loss=True it takes (logits, targets (n, t)
    int64) and returns (n, t) per-position losses, and the layer is the
    model's loss layer (classes = `classes`).

    Tensor names are `name` + "." + the module's parameter names. init
    "module": each tensor starts as the module's own value, copied into
    brigade's buffer at the first call in this process if the buffer still
    holds brigade's initial zeros (so weights resumed from a checkpoint or
    loaded are kept, unless a loaded tensor is all zeros); "zeros": brigade's
    zeros (load weights yourself)."""

    def __init__(self, name, module, loss=False, classes=0, init="module", stash_key_bytes=64):
        if init not in ("module", "zeros"):
            raise ValueError("torch module %r: init must be \"module\" or \"zeros\", got %r" % (name, init))
        if loss and classes < 1:
            raise ValueError("torch module %r: a loss module needs classes >= 1" % (name,))
        self.module = module
        self.loss = bool(loss)
        self._named = [(n, p) for n, p in module.named_parameters()]
        self._init = init
        self._first = {n: p.detach().clone() for n, p in self._named} if init == "module" else {}
        self._graphs = {}   # stash address -> (input tensor, output tensor) of a microbatch in flight
        self._bound = None  # the parameter views the module's tensors are set to
        self._key_bytes = int(stash_key_bytes)
        params = [Param(n, tuple(p.shape), init="const", value=0.0, decay=p.dim() >= 2) for n, p in self._named]
        super().__init__(name, params)
        if loss:
            self.classes = int(classes)

    # ---------------------------------------------------------------- shapes
    def out_shape(self, shape):
        n, t, c = shape
        if self.loss:
            return (n, t, 1)
        with _torch.no_grad():
            out = self.module(_torch.zeros((1, t), dtype=_torch.long) if c == 0 else _torch.zeros((1, t, c)))
        if out.dim() != 3 or out.shape[:2] != (1, t):
            raise ValueError("torch module %s: maps (1, %d, %d) to %s, not (1, %d, c)"
                             % (self.name, t, c, tuple(out.shape), t))
        return (n, t, int(out.shape[2]))

    def stash_bytes(self, shape):
        return self._key_bytes  # its address names the microbatch's graph

    # ---------------------------------------------------------------- calls
    def _sync(self):
        """Point the module's parameters at brigade's buffers (again, when brigade moved them)."""
        views = tuple(id(self.params[n]) for n, _ in self._named)
        if views == self._bound:
            return
        for n, p in self._named:
            t = _T(self.params[n])
            if n in self._first:
                if not t.any():
                    t.copy_(self._first[n])
                del self._first[n]
            p.data = t
        self._bound = views

    def _input(self, ctx, x, grad=True):
        if x is None:
            return _T(ctx.tokens).long()
        return _T(x).detach().requires_grad_(grad)

    @property
    def live_graphs(self):
        """Autograd graphs held for microbatches whose backward has not ended (0 between steps)."""
        return len(self._graphs)

    def forward(self, ctx, x, y):
        self._sync()
        if ctx.no_backward:  # recomputation's first forward, or an evaluation: no graph to keep
            with _torch.no_grad():
                if self.loss:
                    _T(y)[..., 0] = self.module(self._input(ctx, x, False), _T(ctx.targets).long())
                else:
                    _T(y).copy_(self.module(self._input(ctx, x, False)))
            return
        xt = self._input(ctx, x)
        with _torch.enable_grad():
            if self.loss:
                out = self.module(xt, _T(ctx.targets).long())
                _T(y)[..., 0] = out.detach()
            else:
                out = self.module(xt)
                _T(y).copy_(out.detach())
        self._graphs[ctx.stash.address] = (xt, out)

    def _dout(self, ctx, out, dy):
        if self.loss:
            return _torch.full_like(out, ctx.loss_scale)
        return _T(dy)

    def backward_input(self, ctx, x, y, dy, dx):
        key = ctx.stash.address
        xt, out = self._graphs[key] if self._named else self._graphs.pop(key)
        if dx is not None:  # the graph stays for backward_weight when there are parameters
            (g,) = _torch.autograd.grad(out, xt, self._dout(ctx, out, dy), retain_graph=bool(self._named))
            _T(dx).copy_(g)

    def backward_weight(self, ctx, x, y, dy):
        if not self._named:
            return
        xt, out = self._graphs.pop(ctx.stash.address)
        self._sync()
        grads = _torch.autograd.grad(out, [p for _, p in self._named], self._dout(ctx, out, dy), allow_unused=True)
        for (n, _), g in zip(self._named, grads):
            if g is not None:
                _T(self.grads[n]).add_(g)
