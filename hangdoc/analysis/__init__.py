"""Analysis: one ``JobSnapshot`` in, one ``Diagnosis`` out, deterministic and offline.

``analyse.analyse`` is the one entry point. ``ops`` recognises the distributed operation a
thread is in, ``progress`` whether a rank moved over the window, ``views`` what that makes
each rank, ``merge`` builds the merged call tree (the only user of networkx), ``classify``
decides the verdict and ``wording`` says it. ``native.needs_native`` is the one question
capture asks before a diagnosis (does a rank need one native sample). Imports only the
ground floor.
"""
