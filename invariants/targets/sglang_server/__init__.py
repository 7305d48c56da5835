"""The sglang-server target: SGLang's real HTTP server (launch_server) on CPU, only the model
worker faked, driven over real HTTP and checked inside its scheduler process (adapter.py)."""
