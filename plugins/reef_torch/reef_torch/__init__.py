"""reef-torch: the local transformers + peft runtime for Reef, and the training toolkit
that weight recipes share (``reef_torch.training``)."""

from .runtime import LocalRuntime

__all__ = ["LocalRuntime"]
__version__ = "0.1.0"
