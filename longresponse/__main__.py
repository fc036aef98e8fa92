"""``python -m longresponse``: the same command line as ``longresponse``."""

import sys

from .cli import main

if __name__ == "__main__":  # (not when a child process imports it again)
    sys.exit(main())
