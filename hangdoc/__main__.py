"""``python -m hangdoc``."""

import sys

from .cli import main

sys.exit(main())
