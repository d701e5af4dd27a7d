"""One file per schema revision, in order: ``0001``, ``0002``, ..."""
