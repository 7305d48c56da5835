"""Every configuration of the engine, frozen and validated at construction (errors name the
field): ``MemoryConfig`` (memory.py), ``TinyConfig`` (model.py), ``SpecConfig``
(speculative.py) and ``EngineConfig`` holding them (engine.py).

Keeps: configs are the engine's bottom layer — they import nothing of the engine but its
errors, and every component is built from one of them (never the reverse).
"""

from engine.config.engine import STRICT_ENV, EngineConfig, resolve_strict_level
from engine.config.memory import CacheKind, MemoryConfig
from engine.config.model import TinyConfig
from engine.config.speculative import SpecConfig

__all__ = [
    "STRICT_ENV",
    "CacheKind",
    "EngineConfig",
    "MemoryConfig",
    "SpecConfig",
    "TinyConfig",
    "resolve_strict_level",
]
