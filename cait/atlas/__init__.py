"""The head atlas: what every class-attention head of a CaiT does over a whole dataset.

    python -m cait.atlas --model cait_micro_136 --data DIR [--boxes boxes.json] --out OUT [--knockouts]
    torchrun --nproc-per-node 2 -m cait.atlas ... --out OUT        # the images shared over processes

Writes OUT/images.csv (one row per image), OUT/skipped.csv (each unreadable image and why), OUT/heads.csv (per
CA head over the data), OUT/summary.json, parquet copies when pyarrow is installed, and OUT/atlas.html (one
self-contained page), each written whole or not at all. Work goes to OUT/shards/ as it is done, each shard
carrying what it covers: the same command after a kill continues, with the same files as a run that never
stopped, and redoes a damaged or foreign shard and the images a shard skipped. Under torchrun the work left is
split over the ranks in whole batches (the log says the split) and rank 0 merges once every rank is done. OUT is
checked writable and locked before any work: a second run into it is refused in one line, and so is an atlas
of another format (made by another version of cait.atlas). Heads and layers are numbered from 1 in every file.
"""

from __future__ import annotations
