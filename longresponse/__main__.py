"""``python -m longresponse``: the same command line as ``longresponse``."""

import sys

from .cli import main

sys.exit(main())
