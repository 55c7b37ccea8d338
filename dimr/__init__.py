"""dimr: search slim verifiers (layer masks) for speculative decoding, and decode with them."""

__version__ = "0.1.0"
