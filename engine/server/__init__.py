"""The HTTP server: SGLang's native API over one Engine (``app.build_app``), its flags
(``args.ServerArgs``), the engine loop thread (``loop.EngineLoop``) and the monitor seam a
checker plugs into (``monitor.Monitor``). Nothing is imported here, so reading the flags
(`kvspec --help`) does not load FastAPI."""
