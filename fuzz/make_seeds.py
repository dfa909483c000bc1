#!/usr/bin/env python3
"""Writes the checked-in seed corpus: a few small deterministic random inputs per target."""
import os
import random

TARGETS = {"fuzz_descriptors": 96, "fuzz_block_mask": 64, "fuzz_topk": 128, "fuzz_attention": 256}
here = os.path.dirname(os.path.abspath(__file__))
for name, size in TARGETS.items():
    rng = random.Random(name)
    out = os.path.join(here, "corpus", name)
    os.makedirs(out, exist_ok=True)
    for i in range(4):
        n = rng.randint(size // 4, size)
        with open(os.path.join(out, f"seed-{i}"), "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(n)))
