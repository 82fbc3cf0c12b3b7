"""edgespec: lossless speculative sampling on onnxruntime for edge devices.

The runtime needs only onnxruntime, numpy, tokenizers and jinja2. The exporter is the
``edgespec.export`` subpackage (directory ``export/``; its dependencies: ``pip install edgespec[export]``),
never imported by the runtime; pair recipes in ``edgespec.models`` (directory ``models/``).
"""

__version__ = "0.1.0"

from .adaptive import AdaptiveK  # noqa: E402
from .errors import EdgespecError  # noqa: E402
from .generation import Generation, GenerationOptions  # noqa: E402
from .kpolicy import KPolicy, RoundPlan, RoundResult  # noqa: E402
from .proposers import Proposal, Proposer, register  # noqa: E402
from .stats import GenerationStats  # noqa: E402

__all__ = ["AdaptiveK", "EdgespecError", "Generation", "GenerationOptions", "GenerationStats", "KPolicy",
           "Proposal", "Proposer", "RoundPlan", "RoundResult", "SpecDecoder", "register", "__version__"]


def __getattr__(name):  # SpecDecoder imports onnxruntime: only when asked for (the controller does not need it)
    if name == "SpecDecoder":
        from .decoder import SpecDecoder

        return SpecDecoder
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
