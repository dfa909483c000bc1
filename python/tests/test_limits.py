"""Hostile sizes: inputs are checked before anything is allocated, results over
seqattn's limits are ValueErrors naming the argument and the shape, and
results within the limits that cannot be allocated are MemoryErrors naming
the request in bytes (never a bare std::bad_alloc).

Broadcast NumPy views (stride 0) give terabyte-sized inputs without memory;
`small_address_space` makes terabyte requests fail at once on any machine.
"""

import numpy as np
import pytest

import seqattn
import seqattn.torch as st

TIB = 2**40


def huge(shape, dtype=np.float32):
    return np.broadcast_to(np.zeros((), dtype), shape)


# ---- 36: attention validates q, k, v before allocating its outputs ----------------------------------------


def test_forward_checks_the_inputs_before_allocating_out(small_address_space):
    # out would be [1, 2^20, 2^10, 2^10] float32 = 4 TiB; k's head dim differs from q's.
    q, v = huge((1, 2**20, 2**10, 2**10)), huge((1, 4, 2**10, 2**10))
    k = np.zeros((1, 4, 2**10, 8), np.float32)
    with pytest.raises(ValueError, match="q and k must have the same head dim"):
        seqattn.attention(q, k, v)


def test_backward_checks_the_inputs_before_allocating_the_gradients(small_address_space):
    q, v = huge((1, 2**20, 2**10, 2**10)), huge((1, 4, 2**10, 2**10))
    k = np.zeros((1, 4, 2**10, 8), np.float32)
    lse = huge((1, 2**10, 2**20))
    with pytest.raises(ValueError, match="q and k must have the same head dim"):
        seqattn.attention_backward(q, k, v, q, lse, q)


def test_attention_output_that_cannot_be_allocated_is_a_memory_error_in_bytes(small_address_space):
    # out [1, 2^24, 1, 2^16] float32: 4 TiB, within limits::kMaxTensorElements.
    q, v = huge((1, 2**24, 1, 2**16)), huge((1, 4, 1, 2**16))
    with pytest.raises(MemoryError, match=f"attention: out \\(1, 16777216, 1, 65536\\).* {4 * TIB} bytes"):
        seqattn.attention(q, np.zeros((1, 4, 1, 2**16), np.float32), v)


# ---- 37: representations check their size, then allocate ---------------------------------------------------


def test_to_dense_over_the_limit_names_the_argument_and_shape():
    with pytest.raises(ValueError, match=r"to_dense: .*\(1, 1, 2097152, 2097152\).*kMaxTensorElements"):
        seqattn.FullMask().to_dense(2**21, 2**21)
    with pytest.raises(ValueError, match=r"to_additive: .*\(65536, 65536, 65536, 65536\).*kMaxTensorElements"):
        seqattn.CausalMask().to_additive(2**16, batch=2**16, heads=2**16)


def test_to_dense_within_the_limit_that_cannot_be_allocated(small_address_space):
    with pytest.raises(MemoryError, match=f"to_dense: .*\\(1, 1, 1048576, 1048576\\).* {TIB} bytes"):
        seqattn.FullMask().to_dense(2**20, 2**20)
    # The float32 result and the dense mask it is made from: 5 bytes per element.
    with pytest.raises(MemoryError, match=f"to_additive: .* {5 * TIB} bytes"):
        seqattn.FullMask().to_additive(2**20, 2**20)


def test_block_mask_arrays_that_cannot_be_allocated(small_address_space):
    # 2^16 x 2^16 tiles of 16 x 16: the BlockMask itself is small (ranges per row), its dense views are not.
    bm = seqattn.CausalMask().block_mask(2**20, block_size=(16, 16), store_tile_bits=False)
    with pytest.raises(MemoryError, match=f"BlockMask.classes: .* {2**32} bytes"):
        bm.classes()
    with pytest.raises(MemoryError, match=f"BlockMask.partial_tile_ids: .* {2**34} bytes"):
        bm.partial_tile_ids()
    with pytest.raises(MemoryError, match="BlockMask.flex_arrays: .* bytes"):
        bm.flex_arrays()


def test_broadcast_segment_ids():
    with pytest.raises(ValueError, match=r"segment_ids: shape \(2097152, 1048576\) has more than the limit"):
        seqattn.DocumentMask(huge((2**21, 2**20), np.int32))


def test_broadcast_segment_ids_that_cannot_be_copied(small_address_space):
    with pytest.raises(MemoryError, match=r"DocumentMask: .*segment_ids \(1048576, 1048576\).* bytes"):
        seqattn.DocumentMask(huge((2**20, 2**20), np.int32))


def test_broadcast_mask_values():
    with pytest.raises(ValueError, match=r"values: shape \(1048576, 1048576, 16\) has more than the limit"):
        seqattn.DenseMask(huge((2**20, 2**20, 16), np.uint8))
    with pytest.raises(ValueError, match=r"indices: shape \(1048576, 1048576, 16\) has more than the limit"):
        seqattn.TopKMask(huge((2**20, 2**20, 16), np.int32), 4)


def test_broadcast_mask_values_that_cannot_be_copied(small_address_space):
    with pytest.raises(MemoryError, match=f"DenseMask: values \\(1048576, 1048576\\).* {TIB} bytes"):
        seqattn.DenseMask(huge((2**20, 2**20), np.uint8))


def test_torch_block_mask_for_huge_batch_and_heads(small_address_space):
    with pytest.raises(MemoryError, match=r"block_mask: .*B=65536, H=65536.* bytes"):
        st.block_mask(seqattn.CausalMask(), 2**16, 2**16, 128, 128)


def test_broadcast_descriptor_ids_that_cannot_be_copied(small_address_space):
    ids, pos = huge((2**20, 2**20), np.int32), huge((2**20, 2**20), np.int32)
    with pytest.raises(MemoryError, match=f"from_segment_ids_and_pos: copies of segment_ids .* {8 * TIB} bytes"):
        seqattn.SequenceDescriptor.from_segment_ids_and_pos(ids, pos)


# ---- Lengths with an empty result (Python fuzz finding): at once, or a ValueError naming the length -----------

EMPTY_RESULT_CALLS = """
import numpy as np, seqattn
bits, indptr = seqattn.pack_bits(seqattn.FullMask(), 2**40, 0, batch=2)
assert bits.size == 0 and indptr.tolist() == [0, 0, 0], (bits, indptr)
assert seqattn.to_dense(seqattn.FullMask(), 0, 2**40).shape == (1, 1, 0, 2**40)
for call, name, value in [("pack_bits(seqattn.FullMask(), 2**63 - 1, 0)", "q_len", 2**63 - 1),
                          ("pack_bits(seqattn.CausalMask(), 2**62, 0)", "q_len", 2**62),
                          ("pack_bits(seqattn.FullMask(), 0, 2**63 - 1)", "kv_len", 2**63 - 1),
                          ("to_dense(seqattn.FullMask(), 0, 2**62)", "kv_len", 2**62),
                          ("to_additive(seqattn.FullMask(), 2**41, 0)", "q_len", 2**41)]:
    try:
        eval("seqattn." + call)
    except ValueError as e:
        assert f"{name} of sequence 0 is {value}" in str(e) and "kMaxTensorElements" in str(e), (call, e)
    else:
        raise AssertionError(call + " did not raise")
"""


def test_huge_lengths_with_an_empty_result_return_at_once_or_name_the_length():
    # In a child process: before the fix pack_bits looped over 2^63 rows of nothing.
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", EMPTY_RESULT_CALLS], check=True, timeout=60)
