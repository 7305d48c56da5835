"""The vllm target: vLLM v1's real ``Scheduler`` and ``KVCacheManager`` on CPU, in their own venv
(``make vllm-env``), driven by kvspec's op traces with only the model runner's output faked,
their block pool mapped onto kvspec's state view so the engine-neutral catalog (pool sums,
exact census by block id) and vLLM's own rules (catalog/vllm.yaml) run at every step.
"""
