"""The HTTP server: SGLang's native API over one Engine (``build_app``), its flags
(``ServerArgs``), the engine loop thread and the monitor seam a checker plugs into."""

from engine.server.app import build_app
from engine.server.args import ServerArgs
from engine.server.loop import EngineLoop
from engine.server.monitor import Metric, Monitor, NullMonitor

__all__ = ["EngineLoop", "Metric", "Monitor", "NullMonitor", "ServerArgs", "build_app"]
