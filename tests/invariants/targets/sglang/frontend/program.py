"""An SGLang frontend program, run by the sglang venv's python against `kvspec serve` (argv:
the server's URL): multi-turn ``gen`` with ``stop`` strings and ``max_tokens`` (one with
``min_tokens`` and frequency/presence penalties), ``fork`` into
two branches, then ``select`` among three choices (by the prompt logprobs of each). Prints the
program's state as one JSON line."""

import json
import sys
from pathlib import Path

# the sglang tier's import stubs (no triton on these machines): invariants/targets/sglang/driver
sys.path.insert(
    0, str(Path(__file__).resolve().parents[5] / "invariants" / "targets" / "sglang" / "driver")
)
import stubs

stubs.install()
import sglang as sgl  # noqa: E402


@sgl.function
def chat(s, question):
    s += "Q: " + question + "\nA:"
    s += sgl.gen("answer", max_tokens=16, stop=["\n", "."], temperature=0)
    s += "\nQ: and then?\nA:"
    s += sgl.gen("second", max_tokens=8, temperature=0)
    s += "\nQ: at least five?\nA:"
    s += sgl.gen(
        "penalized",
        max_tokens=12,
        min_tokens=5,
        frequency_penalty=1.0,
        presence_penalty=0.5,
        temperature=0,
    )
    forks = s.fork(2)
    for i, branch in enumerate(forks):
        branch += f" branch {i}:"
        branch += sgl.gen("branch", max_tokens=4, temperature=0)
    forks.join()
    s += "\nThe best cache is the "
    s += sgl.select("kind", choices=["radix tree", "hash map", "paged pool"])


sgl.set_default_backend(sgl.RuntimeEndpoint(sys.argv[1]))
state = chat.run(question="what is a KV cache?")
print(
    json.dumps(
        {
            "answer": state["answer"],
            "second": state["second"],
            "text": state.text(),
            "answer_meta": state.get_meta_info("answer"),
            "second_meta": state.get_meta_info("second"),
            "penalized_meta": state.get_meta_info("penalized"),
            "kind": state["kind"],
            "kind_meta": state.get_meta_info("kind"),
        }
    )
)
