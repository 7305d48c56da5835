"""The vllm target: vLLM v1's real ``Scheduler`` and ``KVCacheManager`` on CPU, in their own venv
(``make vllm-env``), driven by kvspec's op traces with only the model runner's output faked.

``adapter.py`` is how the rest of kvspec runs it; ``blocks.py`` keeps the block records the
driver sends as deltas; ``driver/`` runs under the vllm venv's python and maps the block pool
onto kvspec's state view, so the engine-neutral catalog (pool sums, exact census by block id)
and vLLM's own rules (catalog/vllm.yaml) run at every step.
"""
