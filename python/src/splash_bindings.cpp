// seqattn._core: TPU kernel metadata as NumPy arrays. Splash MaskInfo
// (backends/splash.hpp) in Splash's own dtypes, which seqattn/splash.py wraps
// in JAX's MaskInfo; and our Pallas kernel's BlockLayout (backends/tpu.hpp),
// which seqattn/pallas/static.py wraps in seqattn.pallas.BlockLayout.
#include <cstdint>
#include <memory>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/vector.h>
#include <string>
#include <utility>
#include <vector>

#include "seqattn/backends/splash.hpp"
#include "seqattn/backends/tpu.hpp"
#include "seqattn/masks/any_mask.hpp"

#include "bindings.hpp"
#include "internal.hpp"

namespace nb = nanobind;

namespace {

using seqattn::Extents;
using seqattn::index_t;
using seqattn::backends::SmemDtype;
using seqattn::backends::Splash;
using seqattn::backends::SplashIndexArray;
using seqattn::backends::SplashMaskFunction;
using seqattn::backends::SplashMaskInfo;
using seqattn::backends::SplashOptions;

// A NumPy array owning `values` (moved to the heap, freed with the array).
template <class Out, class T>
nb::object owned_numpy(std::vector<T>&& values, const Extents& shape) {
  static_assert(sizeof(Out) == sizeof(T));
  auto* heap = new std::vector<T>(std::move(values));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  std::vector<std::size_t> dims;
  for (index_t d : shape.dims()) dims.push_back(static_cast<std::size_t>(d));
  static T empty{};  // NumPy wants a non-null pointer even for zero elements
  Out* data = reinterpret_cast<Out*>(heap->empty() ? &empty : heap->data());
  return nb::cast(nb::ndarray<nb::numpy, Out>(data, dims.size(), dims.data(), owner));
}

template <class Small>
nb::object narrowed(const seqattn::Tensor<std::int32_t>& t) {
  std::vector<Small> v(t.values().begin(), t.values().end());
  return owned_numpy<Small>(std::move(v), t.shape());
}

// In the dtype Splash stores it in (the values fit: that is how it was chosen).
nb::object index_array(const SplashIndexArray& a) {
  switch (a.dtype) {
    case SmemDtype::int8:
      return narrowed<std::int8_t>(a.values);
    case SmemDtype::int16:
      return narrowed<std::int16_t>(a.values);
    default:
      return narrowed<std::int32_t>(a.values);
  }
}

nb::dict to_python(SplashMaskInfo&& info) {
  nb::dict d;
  d["data_next"] = index_array(info.data_next);
  d["mask_next"] = info.mask_next ? index_array(*info.mask_next) : nb::none();
  d["block_mask"] = index_array(info.block_mask);
  if (info.partial_mask_blocks) {
    const Extents shape = info.partial_mask_blocks->shape();
    std::vector<std::uint8_t> bytes(info.partial_mask_blocks->values().begin(),
                                    info.partial_mask_blocks->values().end());
    d["partial_mask_blocks"] = owned_numpy<bool>(std::move(bytes), shape);
  } else {
    d["partial_mask_blocks"] = nb::none();
  }
  if (info.q_sequence) {
    const Extents shape = info.q_sequence->shape();
    std::vector<std::int32_t> seq(info.q_sequence->values().begin(), info.q_sequence->values().end());
    d["q_sequence"] = owned_numpy<std::int32_t>(std::move(seq), shape);
  } else {
    d["q_sequence"] = nb::none();
  }
  if (info.mask_function) {
    const SplashMaskFunction& f = *info.mask_function;
    nb::dict fd;
    fd["kind"] = f.kind == SplashMaskFunction::Kind::causal  ? "causal"
                 : f.kind == SplashMaskFunction::Kind::local ? "local"
                                                             : "chunked_causal";
    fd["offset"] = f.offset;
    fd["left"] = f.left < 0 ? nb::none() : nb::cast(f.left);
    fd["right"] = f.right < 0 ? nb::none() : nb::cast(f.right);
    fd["chunk"] = f.chunk;
    d["mask_function"] = fd;
  } else {
    d["mask_function"] = nb::none();
  }
  d["num_unique_masks"] = info.num_unique_masks;
  return d;
}

// One direction of a TPU layout under the contract's field names
// (`prefix` q or kv, `other` the block its entries name: kv or q).
void put_block_lists(nb::dict& d, seqattn::backends::TpuBlockLists&& l, const char* prefix, const char* other,
                     index_t tile_rows, index_t tile_cols) {
  const std::string p = prefix;
  const auto rows = static_cast<index_t>(l.start.size());
  const auto entries = static_cast<index_t>(l.block.size());
  d[(p + "_start").c_str()] = owned_numpy<std::int32_t>(std::move(l.start), Extents{rows});
  d[(p + "_count").c_str()] = owned_numpy<std::int32_t>(std::move(l.count), Extents{rows});
  d[(p + "_" + other).c_str()] = owned_numpy<std::int32_t>(std::move(l.block), Extents{entries});
  d[(p + "_tile").c_str()] = owned_numpy<std::int32_t>(std::move(l.tile), Extents{entries});
  d[(p + "_fetch").c_str()] = owned_numpy<std::int32_t>(std::move(l.fetch), Extents{entries});
  d[(p + "_tiles").c_str()] = owned_numpy<std::int8_t>(std::move(l.tiles), Extents{l.num_tiles, tile_rows, tile_cols});
  d[(p + "_width").c_str()] = l.width;
}

SplashOptions options_of(bool is_dkv, index_t head_shards, index_t q_seq_shards, bool downcast, bool shrink) {
  SplashOptions o;
  o.is_dkv = is_dkv;
  o.head_shards = head_shards;
  o.q_seq_shards = q_seq_shards;
  o.downcast_smem_data = downcast;
  o.shrink_grid = shrink;
  return o;
}

}  // namespace

void bind_splash(nb::module_& m) {
  m.def(
      "_splash_mask_info",
      [](nb::handle mask, index_t q_len, index_t kv_len, index_t heads, index_t block_q, index_t block_kv, bool is_dkv,
         index_t head_shards, index_t q_seq_shards, bool downcast_smem_data, bool shrink_grid) {
        const seqattn::AnyMask& m = mask_from_python(mask, "mask");
        SplashMaskInfo info;
        {
          nb::gil_scoped_release release;
          info = Splash::mask_info(m, q_len, kv_len, heads, {block_q, block_kv},
                                   options_of(is_dkv, head_shards, q_seq_shards, downcast_smem_data, shrink_grid));
        }
        return to_python(std::move(info));
      },
      nb::arg("mask"), nb::arg("q_len"), nb::arg("kv_len"), nb::arg("heads"), nb::arg("block_q"), nb::arg("block_kv"),
      nb::arg("is_dkv"), nb::arg("head_shards"), nb::arg("q_seq_shards"), nb::arg("downcast_smem_data"),
      nb::arg("shrink_grid"),
      "Splash MaskInfo fields of a mask as a dict of NumPy arrays (see seqattn.splash.mask_info).");
  m.def(
      "_splash_mask_info_from_block_mask",
      [](nb::handle block_mask, index_t heads, index_t batch_index, bool is_dkv, index_t head_shards,
         index_t q_seq_shards, bool downcast_smem_data, bool shrink_grid) {
        const std::shared_ptr<const seqattn::BlockMask> bm = block_mask_from_python(block_mask, "block_mask");
        SplashMaskInfo info;
        {
          nb::gil_scoped_release release;
          info = Splash::mask_info(
              *bm, heads, options_of(is_dkv, head_shards, q_seq_shards, downcast_smem_data, shrink_grid), batch_index);
        }
        return to_python(std::move(info));
      },
      nb::arg("block_mask"), nb::arg("heads"), nb::arg("batch_index"), nb::arg("is_dkv"), nb::arg("head_shards"),
      nb::arg("q_seq_shards"), nb::arg("downcast_smem_data"), nb::arg("shrink_grid"),
      "Splash MaskInfo fields of one batch entry of a seqattn BlockMask.");
  m.def(
      "_tpu_layout",
      [](nb::handle mask, index_t q_len, index_t kv_len, index_t batch, index_t heads, index_t block_q,
         index_t block_kv, std::vector<index_t> q_lens, std::vector<index_t> kv_lens, std::vector<index_t> cu_seqlens_q,
         std::vector<index_t> cu_seqlens_kv) {
        using seqattn::backends::Tpu;
        using seqattn::backends::TpuSequences;
        const seqattn::AnyMask& m = mask_from_python(mask, "mask");
        TpuSequences seqs = TpuSequences::padded(batch, q_len, kv_len);
        seqs.q_lens = std::move(q_lens);
        seqs.kv_lens = std::move(kv_lens);
        seqs.cu_seqlens_q = std::move(cu_seqlens_q);
        seqs.cu_seqlens_kv = std::move(cu_seqlens_kv);
        seqattn::backends::TpuLayout layout;
        {
          nb::gil_scoped_release release;
          layout = Tpu::plan(m, seqs, heads, {block_q, block_kv});
        }
        nb::dict d;
        d["mask_heads"] = layout.mask_heads;
        put_block_lists(d, std::move(layout.queries), "q", "kv", block_q, block_kv);
        put_block_lists(d, std::move(layout.keys), "kv", "q", block_kv, block_q);
        return d;
      },
      nb::arg("mask"), nb::arg("q_len"), nb::arg("kv_len"), nb::arg("batch"), nb::arg("heads"), nb::arg("block_q"),
      nb::arg("block_kv"), nb::arg("q_lens"), nb::arg("kv_lens"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_kv"),
      "The Pallas kernel's BlockLayout arrays of a mask (see seqattn.pallas.static_layout).");
  m.def(
      "_tpu_page_table",
      [](const seqattn::python::CpuArray<std::int32_t>& block_table,
         const seqattn::python::CpuArray<std::int32_t>& kv_lens, index_t num_pages, index_t page_size,
         index_t block_kv) {
        const auto table = seqattn::backends::Tpu::page_table(seqattn::python::view_of(block_table, "block_table"),
                                                              seqattn::python::view_of(kv_lens, "kv_lens"), num_pages,
                                                              page_size, block_kv);
        std::vector<std::int32_t> pages = table.pages;
        return owned_numpy<std::int32_t>(std::move(pages), Extents{table.batch, table.pages_per_seq});
      },
      nb::arg("block_table"), nb::arg("kv_lens"), nb::arg("num_pages"), nb::arg("page_size"), nb::arg("block_kv"),
      "The Pallas kernel's int32 [batch, pages] page table from a checked block table (see "
      "seqattn.pallas.page_table).");
}
