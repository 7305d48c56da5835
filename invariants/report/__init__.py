"""The report (`kvspec report`): the cells (cells.py, memory_cells.py) run where the backend
says (backends.py), each with a pool timeline (timeline.py), optionally beside real SGLang
(targets.py); the results are printed and written (run.py, files.py, html.py, svg.py,
target_view.py), all from the same plain data and the same small texts (text.py).

Keeps: every format shows the same cells in the same order with the same verdicts.
"""
