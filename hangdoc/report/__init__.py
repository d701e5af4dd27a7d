"""Reporters: each turns one ``Diagnosis`` (and the snapshot it came from) into an output.

``json_report`` is the machine-readable report of ``--json`` (schema in
``docs/json-schema.md``); ``terminal`` prints the human report with rich; ``html`` writes one
self-contained page with the merged tree to explore (``--html``); ``graph`` writes the tree as
DOT or SVG (``--dot``/``--svg``); ``files`` checks and writes their output paths;
``status`` shows, on stderr, what a long capture or analysis is doing (rounds, ranks
captured; ``--quiet`` hides it); ``rows`` (a rank's row, the classes of ranks, the culprits
in words) and ``frames`` (which frames fold, and a folded run's name) decide once what
several reporters say alike, and no reporter takes another's private names. Reporters read
``Diagnosis.tree`` (the frozen ``model.CallTree`` the analysis built); none of them
rebuilds the merged tree. They import only the ground floor (``model``, ``errors``,
``rankranges`` for rank sets, the package's version), never ``hangdoc.analysis``.
"""
