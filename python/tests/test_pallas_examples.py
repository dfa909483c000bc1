"""The seed workloads' TPU examples (examples/python/tpu_*.py) run and check what they say they check.

Each example compares seqattn's Pallas kernel (interpret mode) with the C++ engine element by element and raises
AssertionError past its tolerance; here they run as written, their errors are re-checked, and the work counts of
our kernel and Splash are checked to agree on what both must compute (the non-empty tiles of the same mask). One
run is sabotaged on purpose (a wrong page table) to show the examples' checks can fail.
"""

import importlib.util
import pathlib

import numpy as np
import pytest

pytest.importorskip("jax")

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"


def load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_work(result):
    ours, splash = result["ours"], result["splash"]
    assert ours.computed == splash.computed > 0  # the same mask: the same non-empty tiles
    assert ours.grid_steps >= ours.computed and splash.grid_steps >= splash.computed


def test_multi_item_paged_prefill_and_extend():
    result = load("tpu_multi_item_paged").run(verbose=False)
    for name in ("prefill", "prefill_lse", "serial", "extend", "extend_lse"):
        assert result[name] < 1e-4, (name, result[name])
    check_work(result)


def test_multi_item_check_fails_on_a_wrong_page_table(monkeypatch):
    """The prefill check sees a page table whose first two requests' rows are swapped."""
    example = load("tpu_multi_item_paged")
    real = example.page_table

    def swapped(block_table, kv_lens, **kw):
        table = np.array(real(block_table, kv_lens, **kw))
        table[[0, 1]] = table[[1, 0]]
        return table

    monkeypatch.setattr(example, "page_table", swapped)
    with pytest.raises(AssertionError):
        example.run(verbose=False)


def test_dsa_topk():
    result = load("tpu_dsa_topk").run(verbose=False)
    assert result["out"] < 1e-4 and result["lse"] < 1e-4
    check_work(result)


def test_kascade_anchor_and_reuse():
    result = load("tpu_kascade").run(verbose=False, reuse_layers=1)
    for name in ("anchor", "reuse", "reuse_lse"):
        assert result[name] < 1e-4, (name, result[name])
    check_work(result)
    assert result["ours"].grid_steps < result["splash"].grid_steps  # the listed-blocks grid is the narrower one
