"""``python -m coinfer.quantize``: see coinfer.quantize.cli."""

import sys

from coinfer.quantize.cli import main

if __name__ == "__main__":
    sys.exit(main())
