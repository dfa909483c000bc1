"""seqattn._cuda, the CUDA backend (backends::Cuda), when this build of seqattn has it.

The module is built only where nvcc was found (python/CMakeLists.txt, option SEQATTN_PYTHON_CUDA) and
is imported only when a caller needs it (seqattn.jax on its first call, seqattn.torch when it is imported
where torch has CUDA): ``import seqattn`` never loads it. It links the CUDA runtime statically and opens
the NVIDIA driver on its first CUDA call, so loading it needs no CUDA library.
"""

import importlib

_NOT_LOADED = object()
_module = _NOT_LOADED
_reason = None


def module():
    """seqattn._cuda, or None when this build of seqattn has none (:func:`reason` says why)."""
    global _module, _reason
    if _module is _NOT_LOADED:
        try:
            _cuda = importlib.import_module(__package__ + "._cuda")
        except ModuleNotFoundError as e:
            if e.name != __package__ + "._cuda":
                raise
            _module, _reason = None, (
                "this build of seqattn has no CUDA module (seqattn._cuda): it was built without nvcc or with "
                "-DSEQATTN_PYTHON_CUDA=OFF; rebuild it where nvcc is found (on PATH, CUDACXX or "
                "/usr/local/cuda/bin): pip install --force-reinstall <seqattn source>")
        except ImportError as e:
            _module, _reason = None, f"seqattn._cuda is there but does not load: {e}"
        else:
            _module = _cuda
    return _module


def reason():
    """Why :func:`module` is None (None when it is not)."""
    module()
    return _reason


def require(who):
    """seqattn._cuda; ValueError naming ``who`` when this build has none."""
    m = module()
    if m is None:
        raise ValueError(f"{who}: CUDA tensors need seqattn's CUDA backend, but {_reason}")
    return m
