"""`python -m cait.atlas` with one torchrun rank slowed on purpose: rank 1 writes each of its shards
SLOW_RANK_SECONDS late, so rank 0 finishes its own first and must wait for it before merging."""

from __future__ import annotations

import os
import sys
import time

from cait.atlas import shards
from cait.atlas.__main__ import main

if os.environ.get("RANK") == "1":
    write = shards.write_shard

    def late_write(*args, **kwargs):
        time.sleep(float(os.environ["SLOW_RANK_SECONDS"]))
        return write(*args, **kwargs)

    shards.write_shard = late_write

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
