"""The e-graph of equivalent programs (egglog): encoding, rule files, saturation, extraction."""
from __future__ import annotations

from .encode import Encoding, encode
from .extract import EGraphView, ExtractionError, Extractor, Rebuilder, read_egraph
from .saturate import RULESETS, EgglogMissing, Saturation, saturate, serialized

__all__ = ["encode", "Encoding", "saturate", "serialized", "Saturation", "RULESETS", "EgglogMissing",
           "read_egraph", "EGraphView", "Extractor", "Rebuilder", "ExtractionError"]
