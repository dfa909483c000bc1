#!/usr/bin/env python3
"""Writes the checked-in seed corpus: a few small deterministic random inputs per target
(fuzz/corpus/<target>/ for the libFuzzer targets, python/tests/fuzz/corpus/ for the atheris one)."""
import os
import random

TARGETS = {
    "fuzz_descriptors": 96,
    "fuzz_block_mask": 64,
    "fuzz_topk": 128,
    "fuzz_attention": 256,
    "fuzz_plan": 384,
    "fuzz_paged": 384,
    "fuzz_any_mask": 128,
    "fuzz_export": 128,
}
here = os.path.dirname(os.path.abspath(__file__))
outputs = {name: (os.path.join(here, "corpus", name), size) for name, size in TARGETS.items()}
outputs["fuzz_entry_points"] = (os.path.join(here, "..", "python", "tests", "fuzz", "corpus"), 128)
for name, (out, size) in outputs.items():
    rng = random.Random(name)
    os.makedirs(out, exist_ok=True)
    for i in range(4 if name in ("fuzz_descriptors", "fuzz_block_mask", "fuzz_topk", "fuzz_attention") else 8):
        n = rng.randint(size // 4, size)
        with open(os.path.join(out, f"seed-{i}"), "wb") as f:
            f.write(bytes(rng.randrange(256) for _ in range(n)))
