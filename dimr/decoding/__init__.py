"""The reference three-tier speculative decoder (draft → slim → full) and its lossless baselines.

Modules, one concept each: :mod:`sampling` (logits → probabilities), :mod:`verify` (the acceptance step),
:mod:`tiers` (a model with its own KV cache), :mod:`proposer` (the draft tier), :mod:`sequence` (the output
and the config), :mod:`modes` (``ar``, ``sd``, ``self``, ``via``), :mod:`stats`, :mod:`decoder` (pair +
slim config → a ready decoder, the API behind the CLI), :mod:`costs` (the cost model), :mod:`auto`,
:mod:`shared` (shared-prefix escalation), :mod:`tuning` (via's thresholds tuned into a decoder config) and
:mod:`bench`.
"""

from dimr.decoding.decoder import MODES, Decoder
from dimr.decoding.modes import ar, sd, via
from dimr.decoding.sequence import DecodeConfig, DecodeResult, Thresholds
from dimr.decoding.stats import DecodeStats

__all__ = ["MODES", "DecodeConfig", "DecodeResult", "DecodeStats", "Decoder", "Thresholds", "ar", "sd", "via"]
