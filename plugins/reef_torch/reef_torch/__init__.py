"""reef-torch: the local transformers + peft runtime for Reef. The training toolkit weight
recipes share lives in the ``reef-train`` library (``reef_train``)."""

from .runtime import LocalRuntime

__all__ = ["LocalRuntime"]
__version__ = "0.1.0"
