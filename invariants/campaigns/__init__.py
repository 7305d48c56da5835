"""`kvspec campaign CONFIG.yaml`: a matrix of targets × releases × budgets run as one job —
locally or on Ray — journaled so a kill loses nothing (``--resume OUT``), ending in one table
of findings, each with the releases it was seen on. Modules: config.py (the YAML → jobs),
run.py (the jobs on one fleet), table.py (the table and the JSON).
"""
