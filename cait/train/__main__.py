"""`python -m cait.train`: the training command line (`cait.train.loop.main`)."""

import sys

from .loop import main

sys.exit(main())
