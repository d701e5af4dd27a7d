"""Read the dump files a user already has, offline, into a snapshot for ``hangdoc analyze``.

``dumpfile`` tells what a file is and builds the ``JobSnapshot``: from py-spy's text and
``ray stack`` (``dumptext``), py-spy's JSON (``dumpjson``), condensed dumps (``dumpcondensed``,
their labels read by ``dumplabels``), with ``dumpranks`` deciding which processes are ranks
and their numbers and ``dumped`` holding what the parsers share; ``flight_files`` reads a
directory of flight recorder dumps. Imports ``capture.find`` (a rank's environment,
redaction), ``capture.read`` (py-spy's words, the flight recorder's format) and the ground
floor.
"""
