"""``python -m quantize``: see quantize.cli."""

import sys

from quantize.cli import main

if __name__ == "__main__":
    sys.exit(main())
