"""What every driver shares, run under its engine's own interpreter: an exception as the error
answer kvspec classifies (targets/driver.py). Imports nothing of kvspec or of any engine; a
driver puts this folder on its path.

Keeps: the classification is made from the traceback alone, in one place for every engine,
by the deepest frame that is either the adapter's own (``ours``: the driver's folders) or the
engine's (its package):
  ``drift``  raised in the adapter's own code by an attribute, import, signature or name that
             is not there — the release moved under it;
  ``crash``  raised in the engine's own code: its class, message and where (``site``: the file
             from the engine's package root and the function, stable across releases;
             ``line``: with the line number);
  else       the driver refused the op (a mapping error or a bad op: the run's error).
"""

from __future__ import annotations

import os
import traceback

DRIFT = (AttributeError, ImportError, TypeError, NameError)


def failure(exc: BaseException, ours: tuple[str, ...], package: str) -> dict:
    """``exc`` as an error answer (see the module docstring); ``package``: the engine's
    top-level package (``sglang``, ``vllm``), which sites are named from."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    mine = [f for f in frames if f.filename.startswith(ours)]
    known = [f for f in frames if f in mine or f"/{package}/" in f.filename]
    error = f"{type(exc).__name__}: {exc}"
    answer = dict(error=error, drift=False, trace=traceback.format_exc())
    if mine:
        last = mine[-1]
        answer["where"] = f"{os.path.basename(last.filename)}:{last.lineno} {last.name}"
    if known and known[-1] in mine:
        answer["drift"] = isinstance(exc, DRIFT) and frames[-1] is known[-1]
    elif known:  # the engine's own line, to read
        deepest = known[-1]
        source = deepest.filename[deepest.filename.rfind(f"{package}/") :]
        answer["crash"] = dict(
            error=type(exc).__name__,
            message=str(exc),
            site=f"{source}:{deepest.name}",
            line=f"{source}:{deepest.lineno}",
        )
        answer["error"] = f"{error} [raised at {source}:{deepest.lineno} in {deepest.name}]"
    return answer
