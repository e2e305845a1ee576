"""brigade: a ctypes binding of libbrigade's model and executor C API.

    import brigade as bg
    m = bg.Model(name="tiny", input="features", features=16)
    m.add(bg.Linear("fc", 16, 32)).add(bg.Activation("act", "relu")).add(bg.Head("head", 32, 4))
    with bg.Executor(m, batches=lambda rq: (x, y), batch=8, microbatches=2, lr=1e-2) as ex:
        print(ex.step().loss)

The library is found through BRIGADE_LIB, else the one `pip install` put with
the package, else build/libbrigade.so of the source tree this package sits
in, else the system's loader; its version must be the binding's. `python -m
brigade ...` (or the `brigade` command pip installs) runs the brigade CLI.
See docs/python.md.
"""
from ._lib import VERSION as __version__
from ._lib import BrigadeError, Status, library_path
from .executor import Executor, ExecutorInfo, Request, StepResult
from .gradcheck import check_gradients
from .pylayer import Context, Param
from .model import (Activation, Attention, AttentionBlock, Embedding, Head, Layer, LayerNorm, Linear, MLPBlock, Model,
                    Residual, Seq, TransformerBlock, compare_weights)

__all__ = ["BrigadeError", "Status", "library_path", "Executor", "ExecutorInfo", "Request", "StepResult", "Layer",
           "Linear", "Activation", "LayerNorm", "Embedding", "Attention", "Head", "Seq", "Residual", "AttentionBlock",
           "MLPBlock", "TransformerBlock", "Model", "compare_weights", "Param", "Context", "check_gradients"]
