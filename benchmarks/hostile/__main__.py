"""``python -m benchmarks.hostile``: the campaign (see ``benchmarks.hostile.campaign``)."""

import sys

from benchmarks.hostile.campaign import main

if __name__ == "__main__":  # the prober's spawned process imports this module again (as __mp_main__)
    sys.exit(main())
