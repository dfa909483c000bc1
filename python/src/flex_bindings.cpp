// seqattn._core: flex_attention BlockMask arrays (masks/flex_export.hpp) and
// the tile table seqattn.torch's mask_mod reads, as NumPy arrays.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <string>
#include <utility>
#include <vector>

#include "seqattn/masks/any_mask.hpp"
#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/flex_export.hpp"

#include "bindings.hpp"

namespace nb = nanobind;

namespace {

using seqattn::index_t;

template <class T>
nb::object owned_numpy(seqattn::Tensor<T>&& t) {
  if (t.empty() && t.rank() == 0) return nb::none();  // an array the export left out
  const seqattn::Extents shape = t.shape();
  auto* heap = new seqattn::Tensor<T>(std::move(t));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<seqattn::Tensor<T>*>(p); });
  std::vector<std::size_t> dims;
  for (index_t d : shape.dims()) dims.push_back(static_cast<std::size_t>(d));
  static T empty{};  // NumPy wants a non-null pointer even for zero elements
  T* data = heap->empty() ? &empty : heap->data();
  return nb::cast(nb::ndarray<nb::numpy, T>(data, dims.size(), dims.data(), owner));
}

// The bytes the export and the tile table allocate (int32 throughout; the
// tile bits are left out: at most the BlockMask's own), saturated: the export
// checks its sizes against the limits itself.
std::size_t flex_bytes(const seqattn::BlockMask& bm, index_t B, index_t H, bool separate_full_blocks,
                       bool compute_q_blocks) {
  using seqattn::detail::add_fits;
  using seqattn::detail::mul_fits;
  constexpr auto kSaturated = std::numeric_limits<std::size_t>::max();
  if (bm.batch() == 0) return 0;
  const index_t nq = bm.num_q_blocks(0), nkv = bm.num_kv_blocks(0);
  index_t bh = 0, per_side = 0, tiles = 0, sides = 0, total = 0;
  // Per side: [B, H, n] counts and [B, H, n, m] indices, twice when full blocks are separate.
  const index_t copies = separate_full_blocks ? 2 : 1;
  if (!mul_fits(B, H, bh) || !mul_fits(nq, nkv + 1, per_side) || !mul_fits(bh, per_side, per_side) ||
      !mul_fits(per_side, copies * (compute_q_blocks ? 2 : 1), sides) || !mul_fits(bm.batch(), bm.heads(), tiles) ||
      !mul_fits(tiles, nq, tiles) || !mul_fits(tiles, nkv, tiles) || !add_fits(sides, tiles, total) ||
      !mul_fits(total, index_t{4}, total)) {
    return kSaturated;
  }
  return static_cast<std::size_t>(total);
}

nb::dict export_arrays(const seqattn::BlockMask& bm, index_t B, index_t H, bool separate_full_blocks,
                       bool compute_q_blocks) {
  seqattn::FlexBlockMaskArrays a;
  seqattn::FlexTileTable table;
  {
    nb::gil_scoped_release release;
    const index_t nq = bm.batch() > 0 ? bm.num_q_blocks(0) : 0, nkv = bm.batch() > 0 ? bm.num_kv_blocks(0) : 0;
    const std::string what = seqattn::detail::concat("seqattn.torch.block_mask: the flex arrays for B=", B, ", H=", H,
                                                     " and ", nq, " x ", nkv, " blocks");
    seqattn::detail::allocating(what.c_str(), flex_bytes(bm, B, H, separate_full_blocks, compute_q_blocks), [&] {
      a = seqattn::to_flex_block_mask(bm, B, H, {separate_full_blocks, compute_q_blocks});
      table = seqattn::flex_tile_table(bm);
    });
  }
  nb::dict d;
  d["kv_num_blocks"] = owned_numpy(std::move(a.kv_num_blocks));
  d["kv_indices"] = owned_numpy(std::move(a.kv_indices));
  d["full_kv_num_blocks"] = owned_numpy(std::move(a.full_kv_num_blocks));
  d["full_kv_indices"] = owned_numpy(std::move(a.full_kv_indices));
  d["q_num_blocks"] = owned_numpy(std::move(a.q_num_blocks));
  d["q_indices"] = owned_numpy(std::move(a.q_indices));
  d["full_q_num_blocks"] = owned_numpy(std::move(a.full_q_num_blocks));
  d["full_q_indices"] = owned_numpy(std::move(a.full_q_indices));
  d["tile_ids"] = owned_numpy(std::move(table.tile_ids));
  d["tile_bits"] = owned_numpy(std::move(table.tile_bits));
  d["seq_lengths"] = nb::make_tuple(a.q_len, a.kv_len);
  d["block_size"] = nb::make_tuple(a.block.q, a.block.kv);
  return d;
}

}  // namespace

void bind_flex(nb::module_& m) {
  m.def(
      "_flex_block_mask_arrays",
      [](nb::handle mask, index_t B, index_t H, index_t q_len, index_t kv_len, index_t block_q, index_t block_kv,
         index_t mask_batch, bool separate_full_blocks, bool compute_q_blocks) {
        const seqattn::AnyMask& m = mask_from_python(mask, "mask");
        std::shared_ptr<const seqattn::BlockMask> bm;
        {
          nb::gil_scoped_release release;
          bm = std::make_shared<const seqattn::BlockMask>(seqattn::build_block_mask(
              m, seqattn::RaggedLengths::uniform(mask_batch, q_len, kv_len), H, {block_q, block_kv}));
        }
        return export_arrays(*bm, B, H, separate_full_blocks, compute_q_blocks);
      },
      nb::arg("mask"), nb::arg("B"), nb::arg("H"), nb::arg("q_len"), nb::arg("kv_len"), nb::arg("block_q"),
      nb::arg("block_kv"), nb::arg("mask_batch"), nb::arg("separate_full_blocks"), nb::arg("compute_q_blocks"),
      "flex BlockMask arrays and the tile table of a mask (see seqattn.torch.block_mask).");
  m.def(
      "_flex_block_mask_arrays_from_block_mask",
      [](nb::handle block_mask, index_t B, index_t H, bool separate_full_blocks, bool compute_q_blocks) {
        const std::shared_ptr<const seqattn::BlockMask> bm = block_mask_from_python(block_mask, "block_mask");
        return export_arrays(*bm, B, H, separate_full_blocks, compute_q_blocks);
      },
      nb::arg("block_mask"), nb::arg("B"), nb::arg("H"), nb::arg("separate_full_blocks"), nb::arg("compute_q_blocks"),
      "flex BlockMask arrays and the tile table of a seqattn BlockMask.");
}
