"""The report (`kvspec report`, driven by run.py): the cells (cells.py, memory_cells.py) run
where the backend says (backends.py), each with a pool timeline (timeline.py), optionally
beside real engines (targets.py: the registry's targets); their results, plain data
(model.py), are printed (console.py) and written (files.py, html.py, svg.py,
target_view.py), all with the same small texts (text.py).

Keeps: every format shows the same cells in the same order with the same verdicts.
"""
