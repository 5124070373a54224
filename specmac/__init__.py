"""specmac: speculative decoding across MLX, llama.cpp (GGUF) and PyTorch backends.

Importing specmac imports no ML framework; backends load their framework on first use.
"""

from specmac.api import Generation, Pair, generate, stream
from specmac.backends import BaseBackend, load_backend, registry
from specmac.core.sampling import SamplingParams
from specmac.errors import SpecmacError

__version__ = "0.1.0"

__all__ = ["BaseBackend", "Generation", "Pair", "SamplingParams", "SpecmacError",
           "__version__", "generate", "load_backend", "registry", "stream"]
