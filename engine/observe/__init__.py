"""Observation: everything the checker's state view is built from — the exact census of each
pool (census*.py), the memory layer's part of the view (memory_view.py), the request views
(req_views.py), the session views (session_views.py) and the assembly of the whole view at
an event (state_view.py).

Keeps: nothing here is on the serving path — it reads the components (allocator, request
table, caches, scheduler, sessions, decode policy) and the changes they publish, and changes
nothing the engine computes (the node registry's owner sync it triggers freezes node values:
a later write into one raises instead of going unseen); with no observer attached none of
it runs.
"""
