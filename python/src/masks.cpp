// Masks: every kind as a Python class deriving from seqattn._core.Mask, all
// holding one type-erased AnyMask, so `&`, `|`, `~` compose at run time and
// every representation (dense, additive, bits, BlockMask, ASCII, SVG) and the
// attention engine take any of them.
#include "seqattn/masks.hpp"

#include <memory>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "internal.hpp"

namespace seqattn::python {
namespace {

// The largest q- and kv-block counts over the sequences: the dense [batch,
// heads, q-blocks, kv-blocks] arrays below are padded to them.
std::pair<index_t, index_t> max_block_counts(const BlockMask& bm) {
  index_t nq = 0, nkv = 0;
  for (index_t b = 0; b < bm.batch(); ++b) {
    nq = std::max(nq, bm.num_q_blocks(b));
    nkv = std::max(nkv, bm.num_kv_blocks(b));
  }
  return {nq, nkv};
}

// One C++ type per Python class, so isinstance() tells the kinds apart.
struct PyFull : PyMask {};
struct PyCausal : PyMask {};
struct PySlidingWindow : PyMask {};
struct PyChunkedCausal : PyMask {};
struct PyPrefixLM : PyMask {};
struct PyDocument : PyMask {};
struct PyMultiItem : PyMask {};
struct PyTopK : PyMask {};
struct PyDense : PyMask {};
struct PyPerHead : PyMask {
  std::vector<nb::object> masks;  // the Python masks of the heads, as given
};

using OptIndex = std::optional<index_t>;
using LengthLists = std::optional<std::pair<std::vector<index_t>, std::vector<index_t>>>;

Alignment alignment_of(nb::handle h) {
  if (nb::isinstance<Alignment>(h)) return nb::cast<Alignment>(h);
  if (nb::isinstance<nb::str>(h)) {
    const std::string s = nb::cast<std::string>(h);
    if (s == "top_left") return Alignment::top_left;
    if (s == "bottom_right") return Alignment::bottom_right;
    detail::throw_invalid("alignment: expected \"top_left\" or \"bottom_right\", got \"", s, "\"");
  }
  detail::throw_invalid("alignment: expected seqattn.Alignment or a string, got ",
                        nb::cast<std::string>(nb::str(h.type())));
}

std::string alignment_repr(Alignment a) { return a == Alignment::top_left ? "" : "alignment='bottom_right'"; }

// A read-only property's getter: one field of the description M that a mask
// class's objects are built with.
template <class M, class T>
auto parameter(T M::*field) {
  return [field](const PyMask& s) -> T {
    const M* m = s.mask.target<M>();
    detail::require(m != nullptr, s.repr, ": the mask holds another description than its class builds");
    return m->*field;
  };
}

constexpr const char* kAlignmentDoc =
    "The constructor's alignment, as seqattn.Alignment: where the diagonal sits when q_len != kv_len (top_left: "
    "query i's diagonal is key i; bottom_right: key i + kv_len - q_len).";

std::string join(std::initializer_list<std::string> parts) {
  std::string s;
  for (const std::string& p : parts) {
    if (p.empty()) continue;
    if (!s.empty()) s += ", ";
    s += p;
  }
  return s;
}

std::optional<RaggedLengths> merged_lengths(const PyMask& a, const PyMask& b) {
  return a.lengths ? a.lengths : b.lengths;
}
std::optional<index_t> merged_heads(const PyMask& a, const PyMask& b) { return a.heads ? a.heads : b.heads; }
std::optional<index_t> merged_batch(const PyMask& a, const PyMask& b) { return a.batch ? a.batch : b.batch; }

PyMask make(AnyMask mask, std::string repr, std::string kind, std::optional<RaggedLengths> lengths = {},
            std::optional<index_t> heads = {}, std::optional<index_t> batch = {}) {
  return PyMask{std::move(mask), std::move(repr), std::move(kind), std::move(lengths), heads, batch};
}

// The lengths a representation is built for: explicit ones first, then the
// mask's own (document, top-k, dense and multi-item masks know theirs).
RaggedLengths given_lengths(const PyMask& m, OptIndex q_len, OptIndex kv_len, OptIndex batch,
                            const LengthLists& lengths, const char* who) {
  if (lengths) {
    detail::require(!q_len && !kv_len && !batch, who, ": give either lengths or q_len/kv_len/batch, not both");
    detail::require(lengths->first.size() == lengths->second.size(), who, ": lengths has ", lengths->first.size(),
                    " q lengths but ", lengths->second.size(), " kv lengths");
    return RaggedLengths{lengths->first, lengths->second};
  }
  if (q_len) {
    const index_t b = batch ? *batch : (m.lengths ? m.lengths->batch() : m.batch.value_or(1));
    return RaggedLengths::uniform(b, *q_len, kv_len ? *kv_len : *q_len);
  }
  detail::require(!kv_len, who, ": kv_len given without q_len");
  if (m.lengths) {
    detail::require(!batch || *batch == m.lengths->batch(), who, ": batch=", batch.value_or(0), " but ", m.repr,
                    " holds ", m.lengths->batch(), " sequences");
    return *m.lengths;
  }
  detail::throw_invalid(who, ": ", m.repr, " has no lengths of its own; pass q_len (and kv_len, batch) or lengths");
}

// Checked here as well as by the C++ representations: before the sizes
// derived from the lengths, so that the error names the length.
RaggedLengths resolve_lengths(const PyMask& m, OptIndex q_len, OptIndex kv_len, OptIndex batch,
                              const LengthLists& lengths, const char* who) {
  RaggedLengths l = given_lengths(m, q_len, kv_len, batch, lengths, who);
  detail::check_representation_lengths(l, who);
  return l;
}

index_t resolve_heads(const PyMask& m, OptIndex heads) { return heads ? *heads : m.heads.value_or(1); }

// The bytes pack_bits allocates (bits, a byte-padded segment per sequence and
// head, and indptr), saturated: pack_bits itself rejects sizes over its limit.
std::size_t packed_bytes(const RaggedLengths& l, index_t heads) {
  index_t total = 0, bits = 0;
  for (std::size_t b = 0; b < l.q.size(); ++b) {
    if (!detail::mul_fits(l.q[b], l.kv[b], bits) || !detail::mul_fits(bits, heads, bits) ||
        !detail::add_fits(total, (bits + 7) / 8, total)) {
      return std::numeric_limits<std::size_t>::max();
    }
  }
  index_t segments = 0;
  if (!detail::mul_fits(l.batch(), heads, segments)) return std::numeric_limits<std::size_t>::max();
  return bytes_of<std::uint8_t>(total) + bytes_of<std::int64_t>(segments + 1);
}

// The [batch, heads, max q_len, max kv_len] shape of a dense representation.
Extents dense_shape(const RaggedLengths& l, index_t heads) {
  index_t q = 0, kv = 0;
  for (std::size_t b = 0; b < l.q.size(); ++b) {
    q = std::max(q, l.q[b]);
    kv = std::max(kv, l.kv[b]);
  }
  return Extents{l.batch(), heads, q, kv};
}

// Shared state of a mask built from arrays: the layouts the description views.
template <class Layout>
std::shared_ptr<const Layout> share(Layout&& l) {
  return std::make_shared<const Layout>(std::move(l));
}

std::string shape_string(const Extents& e) { return e.to_string(); }

void bind_mask_base(nb::module_& m) {
  nb::enum_<Alignment>(m, "Alignment", "Where the diagonal sits when q_len != kv_len (TE / FlashAttention)")
      .value("top_left", Alignment::top_left)
      .value("bottom_right", Alignment::bottom_right);
  nb::enum_<TileClass>(m, "TileClass")
      .value("empty", TileClass::empty)
      .value("partial", TileClass::partial)
      .value("full", TileClass::full);

  nb::class_<PyMask>(m, "Mask",
                     "A mask description. Compose with &, |, ~. Representations take the lengths to build for: "
                     "q_len (kv_len defaults to q_len, batch to 1) or lengths=(q_lens, kv_lens) for a ragged batch; "
                     "masks built from data (document, top-k, dense, multi-item) default to their own.")
      .def("__repr__", [](const PyMask& s) { return s.repr; })
      .def_prop_ro(
          "kind", [](const PyMask& s) { return s.kind; },
          "What the mask is, as a string: 'full', 'causal', 'sliding_window', 'chunked_causal', 'prefix_lm', "
          "'document', 'multi_item', 'topk', 'dense' or 'per_head' for the classes of those names; 'and', 'or', "
          "'not' for compositions; 'custom' for masks made elsewhere.")
      .def_prop_ro("head_invariant", [](const PyMask& s) { return s.mask.invariant_over_heads(); })
      .def_prop_ro("lengths",
                   [](const PyMask& s) -> std::optional<std::pair<std::vector<index_t>, std::vector<index_t>>> {
                     if (!s.lengths) return std::nullopt;
                     return std::make_pair(s.lengths->q, s.lengths->kv);
                   })
      .def_prop_ro("heads", [](const PyMask& s) { return s.heads; })
      .def_prop_ro(
          "batch", [](const PyMask& s) -> std::optional<index_t> { return s.lengths ? s.lengths->batch() : s.batch; },
          "The sequences the mask's own data describes (None: any batch).")
      .def("__and__",
           [](const PyMask& a, const PyMask& b) {
             return make(AnyMask(a.mask & b.mask), "(" + a.repr + " & " + b.repr + ")", "and", merged_lengths(a, b),
                         merged_heads(a, b), merged_batch(a, b));
           })
      .def("__or__",
           [](const PyMask& a, const PyMask& b) {
             return make(AnyMask(a.mask | b.mask), "(" + a.repr + " | " + b.repr + ")", "or", merged_lengths(a, b),
                         merged_heads(a, b), merged_batch(a, b));
           })
      .def("__invert__",
           [](const PyMask& a) { return make(AnyMask(~a.mask), "~" + a.repr, "not", a.lengths, a.heads, a.batch); })
      .def(
          "allowed",
          [](const PyMask& s, index_t q, index_t kv, index_t q_len, OptIndex kv_len, index_t batch, index_t head) {
            const MaskContext ctx{batch, head, q_len, kv_len.value_or(q_len)};
            detail::require(q >= 0 && q < ctx.q_len && kv >= 0 && kv < ctx.kv_len, "allowed: (q ", q, ", kv ", kv,
                            ") outside the (", ctx.q_len, ", ", ctx.kv_len, ") grid");
            return s.mask.allowed(ctx, q, kv);
          },
          nb::arg("q"), nb::arg("kv"), nb::kw_only(), nb::arg("q_len"), nb::arg("kv_len").none() = nb::none(),
          nb::arg("batch") = 0, nb::arg("head") = 0,
          "One element (no validation of the mask against the batch: prefer to_dense).")
      .def(
          "to_dense",
          [](const PyMask& s, OptIndex q_len, OptIndex kv_len, OptIndex batch, OptIndex heads,
             const LengthLists& lengths) {
            const RaggedLengths l = resolve_lengths(s, q_len, kv_len, batch, lengths, "to_dense");
            const index_t h = resolve_heads(s, heads);
            const Extents shape = dense_shape(l, h);
            const index_t n = detail::checked_tensor_size(shape, "to_dense: the mask [batch, heads, q_len, kv_len]");
            Tensor<std::uint8_t> dense;
            {
              nb::gil_scoped_release release;
              dense = allocating(detail::concat("to_dense: the mask ", shape), bytes_of<std::uint8_t>(n),
                                 [&] { return to_dense(s.mask, l, h); });
            }
            return to_numpy<bool>(std::move(dense), shape);
          },
          nb::arg("q_len").none() = nb::none(), nb::arg("kv_len").none() = nb::none(), nb::kw_only(),
          nb::arg("batch").none() = nb::none(), nb::arg("heads").none() = nb::none(),
          nb::arg("lengths").none() = nb::none(),
          "bool [batch, heads, max q_len, max kv_len]; past a ragged sequence's end: False.")
      .def(
          "to_additive",
          [](const PyMask& s, OptIndex q_len, OptIndex kv_len, OptIndex batch, OptIndex heads,
             const LengthLists& lengths, float mask_value) {
            const RaggedLengths l = resolve_lengths(s, q_len, kv_len, batch, lengths, "to_additive");
            const index_t h = resolve_heads(s, heads);
            const Extents shape = dense_shape(l, h);
            const index_t n = detail::checked_tensor_size(shape, "to_additive: the mask [batch, heads, q_len, kv_len]");
            Tensor<float> out;
            {
              nb::gil_scoped_release release;
              // The float32 result and the dense mask it is made from.
              out = allocating(detail::concat("to_additive: the mask ", shape, " float32"),
                               bytes_of<float>(n) + bytes_of<std::uint8_t>(n),
                               [&] { return to_additive(s.mask, l, h, mask_value); });
            }
            return to_numpy(std::move(out));
          },
          nb::arg("q_len").none() = nb::none(), nb::arg("kv_len").none() = nb::none(), nb::kw_only(),
          nb::arg("batch").none() = nb::none(), nb::arg("heads").none() = nb::none(),
          nb::arg("lengths").none() = nb::none(), nb::arg("mask_value") = kDefaultMaskValue,
          "float32 [batch, heads, max q_len, max kv_len]: 0 where allowed, mask_value elsewhere.")
      .def(
          "pack_bits",
          [](const PyMask& s, OptIndex q_len, OptIndex kv_len, OptIndex batch, OptIndex heads,
             const LengthLists& lengths) {
            const RaggedLengths l = resolve_lengths(s, q_len, kv_len, batch, lengths, "pack_bits");
            const index_t h = resolve_heads(s, heads);
            PackedMask p;
            {
              nb::gil_scoped_release release;
              // pack_bits checks its size against the limits before it allocates.
              p = allocating(detail::concat("pack_bits: the packed mask of ", l.batch(), " sequences x ", h, " heads"),
                             packed_bytes(l, h), [&] { return pack_bits(s.mask, l, h); });
            }
            return std::make_pair(to_numpy(std::move(p.bits)), to_numpy(std::move(p.indptr)));
          },
          nb::arg("q_len").none() = nb::none(), nb::arg("kv_len").none() = nb::none(), nb::kw_only(),
          nb::arg("batch").none() = nb::none(), nb::arg("heads").none() = nb::none(),
          nb::arg("lengths").none() = nb::none(),
          "FlashInfer's packed custom mask: (bits uint8, indptr int64), one row-major q_len x kv_len segment per "
          "(sequence, head), bit i at bit i % 8 of byte i / 8 (little), each segment padded to a byte.")
      .def(
          "block_mask",
          [](const PyMask& s, OptIndex q_len, OptIndex kv_len, OptIndex batch, OptIndex heads,
             const LengthLists& lengths, std::pair<index_t, index_t> block_size, bool store_tile_bits) {
            const RaggedLengths l = resolve_lengths(s, q_len, kv_len, batch, lengths, "block_mask");
            const index_t h = resolve_heads(s, heads);
            std::shared_ptr<const BlockMask> bm;
            {
              nb::gil_scoped_release release;
              bm = std::make_shared<const BlockMask>(build_block_mask(
                  s.mask, l, h, {block_size.first, block_size.second}, BlockMaskOptions{store_tile_bits}));
            }
            return PyBlockMask{bm};
          },
          nb::arg("q_len").none() = nb::none(), nb::arg("kv_len").none() = nb::none(), nb::kw_only(),
          nb::arg("batch").none() = nb::none(), nb::arg("heads").none() = nb::none(),
          nb::arg("lengths").none() = nb::none(), nb::arg("block_size") = std::make_pair(128, 128),
          nb::arg("store_tile_bits") = true,
          "The tile-level form: full / partial / empty tiles of block_size (block_q, block_kv).")
      .def(
          "to_ascii",
          [](const PyMask& s, OptIndex q_len, OptIndex kv_len, index_t batch_index, index_t head, index_t max_cells) {
            const RaggedLengths l = resolve_lengths(s, q_len, kv_len, std::nullopt, std::nullopt, "to_ascii");
            detail::require(batch_index >= 0 && batch_index < l.batch(), "to_ascii: batch_index ", batch_index,
                            " outside [0, ", l.batch(), ")");
            detail::require(max_cells > 0, "to_ascii: max_cells must be positive, got ", max_cells);
            detail::check_mask(s.mask, l, std::max<index_t>(head + 1, resolve_heads(s, std::nullopt)));
            const auto b = static_cast<std::size_t>(batch_index);
            return to_ascii(s.mask, MaskContext{batch_index, head, l.q[b], l.kv[b]}, max_cells);
          },
          nb::arg("q_len").none() = nb::none(), nb::arg("kv_len").none() = nb::none(), nb::kw_only(),
          nb::arg("batch_index") = 0, nb::arg("head") = 0, nb::arg("max_cells") = 96,
          "One sequence as text: '#' allowed, '.' not (cells of several elements: '#' all, '+' some).")
      .def(
          "to_svg",
          [](const PyMask& s, OptIndex q_len, OptIndex kv_len, index_t batch_index, index_t head,
             const std::string& title, index_t max_cells) {
            const RaggedLengths l = resolve_lengths(s, q_len, kv_len, std::nullopt, std::nullopt, "to_svg");
            detail::require(batch_index >= 0 && batch_index < l.batch(), "to_svg: batch_index ", batch_index,
                            " outside [0, ", l.batch(), ")");
            detail::require(max_cells > 0, "to_svg: max_cells must be positive, got ", max_cells);
            detail::check_mask(s.mask, l, std::max<index_t>(head + 1, resolve_heads(s, std::nullopt)));
            const auto b = static_cast<std::size_t>(batch_index);
            return to_svg(s.mask, MaskContext{batch_index, head, l.q[b], l.kv[b]}, title.empty() ? s.repr : title,
                          max_cells);
          },
          nb::arg("q_len").none() = nb::none(), nb::arg("kv_len").none() = nb::none(), nb::kw_only(),
          nb::arg("batch_index") = 0, nb::arg("head") = 0, nb::arg("title") = "", nb::arg("max_cells") = 128,
          "An SVG picture of one sequence (dark: allowed, light: partly, white: masked).")
      .def("_repr_svg_", [](const PyMask& s) {
        // Notebooks: the mask's own first sequence, or a 32 x 32 grid.
        const index_t n = 32;
        const MaskContext ctx = s.lengths && s.lengths->batch() > 0
                                    ? MaskContext{0, 0, s.lengths->q[0], s.lengths->kv[0]}
                                    : MaskContext{0, 0, n, n};
        RaggedLengths one{{ctx.q_len}, {ctx.kv_len}};
        if (s.lengths) one = *s.lengths;
        detail::check_mask(s.mask, one, s.heads.value_or(1));
        return to_svg(s.mask, ctx, s.repr, 128, ctx.q_len <= 64 && ctx.kv_len <= 64 ? 8 : 4);
      });
}

void bind_block_mask(nb::module_& m) {
  nb::class_<PyBlockMask>(m, "BlockMask",
                          "Tiles of a mask: per (batch, head, q-block) row the full kv-blocks, the partial ones "
                          "(with deduplicated tile bits) and, implicitly, the empty ones.")
      .def_prop_ro("batch", [](const PyBlockMask& p) { return p.block_mask->batch(); })
      .def_prop_ro(
          "heads", [](const PyBlockMask& p) { return p.block_mask->heads(); },
          "1 when the mask is head-invariant: any head reads head 0")
      .def_prop_ro("block_size",
                   [](const PyBlockMask& p) {
                     return std::make_pair(p.block_mask->block_shape().q, p.block_mask->block_shape().kv);
                   })
      .def_prop_ro(
          "lengths",
          [](const PyBlockMask& p) { return std::make_pair(p.block_mask->lengths().q, p.block_mask->lengths().kv); })
      .def_prop_ro("num_full_tiles", [](const PyBlockMask& p) { return p.block_mask->num_full_tiles(); })
      .def_prop_ro("num_partial_tiles", [](const PyBlockMask& p) { return p.block_mask->num_partial_tiles(); })
      .def_prop_ro("num_distinct_partial_tiles",
                   [](const PyBlockMask& p) { return p.block_mask->num_distinct_partial_tiles(); })
      .def_prop_ro("num_tiles", [](const PyBlockMask& p) { return p.block_mask->num_tiles(); })
      .def_prop_ro("memory_bytes", [](const PyBlockMask& p) { return p.block_mask->memory_bytes(); })
      .def(
          "num_q_blocks", [](const PyBlockMask& p, index_t b) { return p.block_mask->num_q_blocks(b); },
          nb::arg("batch_index"))
      .def(
          "num_kv_blocks", [](const PyBlockMask& p, index_t b) { return p.block_mask->num_kv_blocks(b); },
          nb::arg("batch_index"))
      .def(
          "classes",
          [](const PyBlockMask& p) {
            const BlockMask& bm = *p.block_mask;
            const auto [nq, nkv] = max_block_counts(bm);
            Tensor<std::int8_t> out =
                allocate_result("BlockMask.classes: int8", Extents{bm.batch(), bm.heads(), nq, nkv}, std::int8_t{0});
            for (index_t b = 0; b < bm.batch(); ++b) {
              for (index_t h = 0; h < bm.heads(); ++h) {
                for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
                  for (const BlockRange& r : bm.full_ranges(b, h, qb)) {
                    for (auto kb = r.begin; kb < r.end; ++kb) out(b, h, qb, index_t{kb}) = 2;
                  }
                  for (auto kb : bm.partial_blocks(b, h, qb)) out(b, h, qb, index_t{kb}) = 1;
                }
              }
            }
            return to_numpy(std::move(out));
          },
          "int8 [batch, heads, max q-blocks, max kv-blocks]: TileClass values (0 empty, 1 partial, 2 full); "
          "blocks past a ragged sequence's end read 0.")
      .def(
          "partial_tile_ids",
          [](const PyBlockMask& p) {
            const BlockMask& bm = *p.block_mask;
            const auto [nq, nkv] = max_block_counts(bm);
            Tensor<std::int32_t> out = allocate_result("BlockMask.partial_tile_ids: int32",
                                                       Extents{bm.batch(), bm.heads(), nq, nkv}, std::int32_t{-1});
            for (index_t b = 0; b < bm.batch(); ++b) {
              for (index_t h = 0; h < bm.heads(); ++h) {
                for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
                  const auto blocks = bm.partial_blocks(b, h, qb);
                  const auto ids = bm.partial_tile_ids(b, h, qb);
                  for (std::size_t i = 0; i < ids.size(); ++i) out(b, h, qb, index_t{blocks[i]}) = ids[i];
                }
              }
            }
            return to_numpy(std::move(out));
          },
          "int32 [batch, heads, max q-blocks, max kv-blocks]: the tile_bits index of each partial tile, -1 "
          "elsewhere (all -1 when tile bits were not stored).")
      .def(
          "tile_bits",
          [](const PyBlockMask& p) {
            const BlockMask& bm = *p.block_mask;
            const index_t n = bm.num_distinct_partial_tiles(), bq = bm.block_shape().q, bk = bm.block_shape().kv;
            Tensor<std::uint8_t> out =
                allocate_result("BlockMask.tile_bits: bool", Extents{n, bq, bk}, std::uint8_t{0});
            const index_t wpr = bm.words_per_row();
            for (index_t id = 0; id < n; ++id) {
              const auto bits = bm.tile_bits(static_cast<std::int32_t>(id));
              for (index_t r = 0; r < bq; ++r) {
                for (index_t c = 0; c < bk; ++c) {
                  out(id, r, c) = static_cast<std::uint8_t>(seqattn::detail::test_bit(bits.data() + r * wpr, c));
                }
              }
            }
            const Extents shape = out.shape();
            return to_numpy<bool>(std::move(out), shape);
          },
          "bool [distinct partial tiles, block_q, block_kv]: each distinct partial tile's pattern.")
      .def(
          "flex_arrays",
          [](const PyBlockMask& p) {
            const BlockMask& bm = *p.block_mask;
            const auto [nq, nkv] = max_block_counts(bm);
            const Extents counts{bm.batch(), bm.heads(), nq}, indices{bm.batch(), bm.heads(), nq, nkv};
            const index_t n = detail::checked_tensor_size(indices, "BlockMask.flex_arrays: kv_indices");
            Tensor<std::int32_t> kv_num, full_num, kv_idx, full_idx;
            // Two count arrays and two index arrays, all int32.
            allocating(detail::concat("BlockMask.flex_arrays: int32 ", indices, " x 2 and ", counts, " x 2"),
                       2 * (bytes_of<std::int32_t>(n) + bytes_of<std::int32_t>(counts.size())), [&] {
                         kv_num = Tensor<std::int32_t>(counts, 0);
                         full_num = Tensor<std::int32_t>(counts, 0);
                         kv_idx = Tensor<std::int32_t>(indices, 0);
                         full_idx = Tensor<std::int32_t>(indices, 0);
                       });
            for (index_t b = 0; b < bm.batch(); ++b) {
              for (index_t h = 0; h < bm.heads(); ++h) {
                for (index_t qb = 0; qb < bm.num_q_blocks(b); ++qb) {
                  index_t i = 0;
                  for (auto kb : bm.partial_blocks(b, h, qb)) kv_idx(b, h, qb, i++) = kb;
                  kv_num(b, h, qb) = static_cast<std::int32_t>(i);
                  i = 0;
                  for (auto kb : bm.full_blocks(b, h, qb)) full_idx(b, h, qb, i++) = kb;
                  full_num(b, h, qb) = static_cast<std::int32_t>(i);
                }
              }
            }
            nb::dict d;
            d["kv_num_blocks"] = to_numpy(std::move(kv_num));
            d["kv_indices"] = to_numpy(std::move(kv_idx));
            d["full_kv_num_blocks"] = to_numpy(std::move(full_num));
            d["full_kv_indices"] = to_numpy(std::move(full_idx));
            return d;
          },
          "PyTorch flex's BlockMask arrays (int32): kv_num_blocks / kv_indices list the partial blocks, "
          "full_kv_num_blocks / full_kv_indices the full ones, each row's indices ascending then 0-padded.")
      .def(
          "allowed",
          [](const PyBlockMask& p, index_t b, index_t h, index_t q, index_t kv) {
            const BlockMask& bm = *p.block_mask;
            detail::require(b >= 0 && b < bm.batch(), "allowed: batch_index ", b, " outside [0, ", bm.batch(), ")");
            detail::require(q >= 0 && q < bm.q_len(b) && kv >= 0 && kv < bm.kv_len(b), "allowed: (q ", q, ", kv ", kv,
                            ") outside sequence ", b, " of (", bm.q_len(b), ", ", bm.kv_len(b), ")");
            return bm.allowed(MaskContext{b, h, bm.q_len(b), bm.kv_len(b)}, q, kv);
          },
          nb::arg("batch_index"), nb::arg("head"), nb::arg("q"), nb::arg("kv"))
      .def("transposed",
           [](const PyBlockMask& p) {
             return PyBlockMask{std::make_shared<const BlockMask>(p.block_mask->transposed())};
           })
      .def(
          "to_ascii", [](const PyBlockMask& p, index_t b, index_t h) { return to_ascii(*p.block_mask, b, h); },
          nb::arg("batch_index") = 0, nb::arg("head") = 0)
      .def(
          "to_svg",
          [](const PyBlockMask& p, index_t b, index_t h, const std::string& title) {
            return to_svg(*p.block_mask, b, h, title);
          },
          nb::arg("batch_index") = 0, nb::arg("head") = 0, nb::arg("title") = "")
      .def("_repr_svg_", [](const PyBlockMask& p) { return to_svg(*p.block_mask, 0, 0, ""); })
      .def("__repr__", [](const PyBlockMask& p) {
        const BlockMask& bm = *p.block_mask;
        return detail::concat("BlockMask(batch=", bm.batch(), ", heads=", bm.heads(), ", block_size=(",
                              bm.block_shape().q, ", ", bm.block_shape().kv, "), full=", bm.num_full_tiles(),
                              ", partial=", bm.num_partial_tiles(), ", tiles=", bm.num_tiles(), ")");
      });
}

void bind_mask_kinds(nb::module_& m) {
  nb::class_<PyFull, PyMask>(m, "FullMask", "Every query attends to every key.").def("__init__", [](PyFull* self) {
    new (self) PyFull{make(FullMask{}, "FullMask()", "full")};
  });

  nb::class_<PyCausal, PyMask>(m, "CausalMask",
                               "kv <= q (+ kv_len - q_len when bottom-right aligned). Read-only property: alignment.")
      .def(
          "__init__",
          [](PyCausal* self, nb::handle alignment) {
            const Alignment a = alignment_of(alignment);
            new (self) PyCausal{make(CausalMask{a}, "CausalMask(" + alignment_repr(a) + ")", "causal")};
          },
          nb::arg("alignment") = "top_left")
      .def_prop_ro("alignment", parameter(&CausalMask::alignment), kAlignmentDoc);

  nb::class_<PySlidingWindow, PyMask>(m, "SlidingWindowMask",
                                      "Keys in [p - left, p + right] around the diagonal p; a negative side is "
                                      "unbounded (TE / FlashAttention window_size). Read-only properties: left, "
                                      "right, alignment.")
      .def(
          "__init__",
          [](PySlidingWindow* self, index_t left, index_t right, nb::handle alignment) {
            const Alignment a = alignment_of(alignment);
            new (self) PySlidingWindow{make(
                SlidingWindowMask{left, right, a},
                "SlidingWindowMask(" + join({std::to_string(left), std::to_string(right), alignment_repr(a)}) + ")",
                "sliding_window")};
          },
          nb::arg("left"), nb::arg("right") = 0, nb::arg("alignment") = "top_left")
      .def_prop_ro("left", parameter(&SlidingWindowMask::left),
                   "Keys allowed before the diagonal, as given to the constructor (negative: unbounded).")
      .def_prop_ro("right", parameter(&SlidingWindowMask::right),
                   "Keys allowed after the diagonal, as given to the constructor (negative: unbounded).")
      .def_prop_ro("alignment", parameter(&SlidingWindowMask::alignment), kAlignmentDoc);

  nb::class_<PyChunkedCausal, PyMask>(m, "ChunkedCausalMask",
                                      "Causal within chunks of `chunk` keys (Llama 4, Splash ChunkedCausalMask). "
                                      "Read-only properties: chunk, alignment.")
      .def(
          "__init__",
          [](PyChunkedCausal* self, index_t chunk, nb::handle alignment) {
            const Alignment a = alignment_of(alignment);
            detail::require(chunk > 0, "ChunkedCausalMask: chunk must be positive, got ", chunk);
            new (self) PyChunkedCausal{
                make(ChunkedCausalMask{chunk, a},
                     "ChunkedCausalMask(" + join({std::to_string(chunk), alignment_repr(a)}) + ")", "chunked_causal")};
          },
          nb::arg("chunk"), nb::arg("alignment") = "top_left")
      .def_prop_ro("chunk", parameter(&ChunkedCausalMask::chunk),
                   "The chunk size in keys, as given to the constructor.")
      .def_prop_ro("alignment", parameter(&ChunkedCausalMask::alignment), kAlignmentDoc);

  nb::class_<PyPrefixLM, PyMask>(m, "PrefixLMMask",
                                 "Bidirectional over the first `prefix` keys, causal after; prefix may be one int "
                                 "or one length per sequence. Read-only properties: prefix, prefix_lengths, "
                                 "alignment.")
      .def(
          "__init__",
          [](PyPrefixLM* self, nb::handle prefix, nb::handle alignment) {
            const Alignment a = alignment_of(alignment);
            if (nb::isinstance<nb::int_>(prefix)) {
              const auto p = nb::cast<index_t>(prefix);
              detail::require(p >= 0, "PrefixLMMask: prefix must be non-negative, got ", p);
              new (self)
                  PyPrefixLM{make(PrefixLMMask{p, {}, a},
                                  "PrefixLMMask(" + join({std::to_string(p), alignment_repr(a)}) + ")", "prefix_lm")};
              return;
            }
            const auto arr = nb::cast<CpuArray<std::int32_t>>(prefix);
            detail::require(arr.ndim() == 1, "PrefixLMMask: prefix lengths must have shape (batch,), got ",
                            view_of(arr, "prefix").shape());
            auto owned = std::make_shared<const Tensor<std::int32_t>>(owned_copy(arr, "PrefixLMMask", "prefix"));
            const index_t batch = owned->extent(0);
            PrefixLMMask mask{0, owned->values(), a};
            new (self) PyPrefixLM{
                make(AnyMask(mask, owned),
                     "PrefixLMMask(" + join({"<" + std::to_string(batch) + " lengths>", alignment_repr(a)}) + ")",
                     "prefix_lm", std::nullopt, std::nullopt, batch)};
          },
          nb::arg("prefix"), nb::arg("alignment") = "top_left")
      .def_prop_ro(
          "prefix",
          [](const PyPrefixLM& s) -> OptIndex {
            const auto lengths = parameter(&PrefixLMMask::prefix_lengths)(s);
            return lengths.empty() ? OptIndex(parameter(&PrefixLMMask::prefix)(s)) : std::nullopt;
          },
          "The prefix length when the constructor got one int; None when it got one length per sequence.")
      .def_prop_ro(
          "prefix_lengths",
          [](const PyPrefixLM& s) -> std::optional<std::vector<index_t>> {
            const auto lengths = parameter(&PrefixLMMask::prefix_lengths)(s);
            if (lengths.empty()) return std::nullopt;
            return std::vector<index_t>(lengths.begin(), lengths.end());
          },
          "The prefix length of each sequence, as a list, when the constructor got an array; None when it got one "
          "int.")
      .def_prop_ro("alignment", parameter(&PrefixLMMask::alignment), kAlignmentDoc);

  nb::class_<PyDocument, PyMask>(
      m, "DocumentMask",
      "Tokens attend within their own segment (0 = padding, attends nothing), with `inner` applied in "
      "segment-local coordinates (positions, when given, are those coordinates). segment_ids (*E, B, T) int32.")
      .def(
          "__init__",
          [](PyDocument* self, const CpuArray<std::int32_t>& ids, const std::optional<CpuArray<std::int32_t>>& pos,
             const std::optional<PyMask>& inner, const std::optional<CpuArray<std::int32_t>>& kv_ids,
             const std::optional<CpuArray<std::int32_t>>& kv_pos) {
            const auto q_ids = view_of(ids, "segment_ids");
            const auto q_pos = pos ? view_of(*pos, "segment_pos") : TensorView<const std::int32_t>{};
            detail::require(!kv_pos || kv_ids, "DocumentMask: kv_segment_pos given without kv_segment_ids");
            const auto k_ids = kv_ids ? view_of(*kv_ids, "kv_segment_ids") : q_ids;
            const auto k_pos =
                kv_ids ? (kv_pos ? view_of(*kv_pos, "kv_segment_pos") : TensorView<const std::int32_t>{}) : q_pos;
            // Per side and token: a run index, and a copy of the ids when they
            // are strided or broadcast.
            const std::size_t bytes = bytes_of<std::int64_t>(q_ids.size()) + bytes_of<std::int64_t>(k_ids.size());
            std::shared_ptr<const DocumentLayout> layout;
            {
              nb::gil_scoped_release release;
              layout = allocating(detail::concat("DocumentMask: the run tables of segment_ids ", q_ids.shape()), bytes,
                                  [&] { return share(DocumentLayout::from_segment_ids(q_ids, k_ids, q_pos, k_pos)); });
            }
            const AnyMask in = inner ? inner->mask : AnyMask();
            std::string repr = "DocumentMask(<" + shape_string(q_ids.shape()) + " ids>" +
                               (inner ? ", inner=" + inner->repr : std::string()) + ")";
            new (self) PyDocument{make(AnyMask(document_mask(*layout, in), layout), std::move(repr), "document",
                                       layout->lengths(), inner ? inner->heads : std::nullopt)};
          },
          nb::arg("segment_ids"), nb::arg("segment_pos").none() = nb::none(), nb::arg("inner").none() = nb::none(),
          nb::kw_only(), nb::arg("kv_segment_ids").none() = nb::none(), nb::arg("kv_segment_pos").none() = nb::none());

  nb::class_<PyMultiItem, PyMask>(
      m, "MultiItemMask",
      "Multi-item scoring (sglang-jax): each sequence is query ‖ d ‖ item_1 ‖ d ‖ … ‖ d with delimiter d; items see "
      "the query and themselves, causally.")
      .def(
          "__init__",
          [](PyMultiItem* self, const std::vector<CpuArray<std::int32_t>>& sequences, std::int32_t delimiter) {
            MultiItemLayout l;
            for (std::size_t i = 0; i < sequences.size(); ++i) {
              const Tensor<std::int32_t> t = owned_copy(sequences[i], "MultiItemMask", "tokens");
              detail::require(t.rank() == 1, "MultiItemMask: tokens[", i, "] must be 1-D, got shape ", t.shape());
              l.add_packed(t.values(), delimiter);
            }
            auto layout = share(std::move(l));
            new (self) PyMultiItem{make(AnyMask(multi_item_mask(*layout), layout),
                                        "MultiItemMask(<" + std::to_string(sequences.size()) + " sequences>)",
                                        "multi_item", layout->lengths())};
          },
          nb::arg("tokens"), nb::arg("delimiter"));

  nb::class_<PyTopK, PyMask>(m, "TopKMask",
                             "Each query row attends to its own key indices (*E, B, t, k) int32 (-1 = padding), "
                             "among kv_len keys (DeepSeek-V3.2 lightning indexer).")
      .def(
          "__init__",
          [](PyTopK* self, const CpuArray<std::int32_t>& indices, index_t kv_len) {
            const auto v = view_of(indices, "indices");
            std::shared_ptr<const TopKLayout> layout;
            {
              nb::gil_scoped_release release;
              // The keys (and a copy of strided or broadcast indices).
              layout = allocating(detail::concat("TopKMask: the key lists of indices ", v.shape()),
                                  2 * bytes_of<std::int32_t>(v.size()),
                                  [&] { return share(TopKLayout::from_indices(v, kv_len)); });
            }
            const index_t t = v.rank() >= 2 ? v.extent(-2) : 0;
            const index_t batch = v.rank() >= 2 ? v.shape().drop_last(2).size() : 0;
            new (self) PyTopK{
                make(AnyMask(topk_mask(*layout), layout),
                     "TopKMask(<" + shape_string(v.shape()) + " indices>, kv_len=" + std::to_string(kv_len) + ")",
                     "topk", RaggedLengths::uniform(batch, t, kv_len))};
          },
          nb::arg("indices"), nb::arg("kv_len"));

  nb::class_<PyDense, PyMask>(m, "DenseMask",
                              "An explicit 0/1 array (Q, KV), (B, Q, KV) or (*E, B, H, Q, KV) (copied); sequence b "
                              "uses its top-left q_len x kv_len corner.")
      .def(
          "__init__",
          [](PyDense* self, const CpuArray<std::uint8_t>& values) {
            auto owned = std::make_shared<const Tensor<std::uint8_t>>(owned_copy(values, "DenseMask", "values"));
            const Extents& s = owned->shape();
            detail::require(s.rank() >= 2,
                            "DenseMask: values must have shape (Q, KV), (B, Q, KV) or (*E, B, H, Q, KV), got ", s);
            const int r = s.rank();
            const index_t batch = r == 2 ? 1 : r == 3 ? s[0] : s.first(r - 3).size();
            std::optional<index_t> heads;
            if (r >= 4) heads = s[r - 3];
            new (self) PyDense{make(AnyMask(DenseMask<std::uint8_t>{owned->view()}, owned),
                                    "DenseMask(<" + shape_string(s) + ">)", "dense",
                                    RaggedLengths::uniform(batch, s[r - 2], s[r - 1]), heads)};
          },
          nb::arg("values"));

  nb::class_<PyPerHead, PyMask>(m, "PerHeadMask",
                                "Head h uses masks[h] (Splash MultiHeadMask). Read-only property: masks.")
      .def(
          "__init__",
          [](PyPerHead* self, const nb::sequence& seq) {
            std::vector<const PyMask*> masks;
            std::vector<nb::object> objects;
            for (nb::handle item : seq) {
              const PyMask* p = nullptr;
              if (!nb::try_cast<const PyMask*>(item, p) || p == nullptr) {
                detail::throw_invalid("PerHeadMask: masks[", masks.size(), "] is not a seqattn mask but ",
                                      nb::cast<std::string>(nb::str(item.type())));
              }
              masks.push_back(p);
              objects.push_back(nb::borrow(item));
            }
            detail::require(!masks.empty(), "PerHeadMask: masks must not be empty");
            auto owned = std::make_shared<std::vector<AnyMask>>();
            std::string repr = "PerHeadMask([";
            std::optional<RaggedLengths> lengths;
            for (std::size_t i = 0; i < masks.size(); ++i) {
              owned->push_back(masks[i]->mask);
              repr += (i ? ", " : "") + masks[i]->repr;
              if (!lengths) lengths = masks[i]->lengths;
            }
            repr += "])";
            const PerHeadMask<AnyMask> mask{std::span<const AnyMask>(*owned)};
            new (self) PyPerHead{make(AnyMask(mask, std::shared_ptr<const void>(owned)), std::move(repr), "per_head",
                                      lengths, static_cast<index_t>(masks.size())),
                                 std::move(objects)};
          },
          nb::arg("masks"))
      .def_prop_ro(
          "masks",
          [](const PyPerHead& s) {
            nb::list l;
            for (const nb::object& o : s.masks) l.append(o);
            return nb::tuple(l);
          },
          "The mask of each head, as a tuple of the mask objects given to the constructor.");
}

}  // namespace

const AnyMask& mask_from_python(nb::handle obj, const char* what) {
  PyMask* p = nullptr;
  if (!nb::try_cast<PyMask*>(obj, p) || p == nullptr) {
    detail::throw_invalid(what, ": expected a seqattn mask (seqattn.Mask), got ",
                          nb::cast<std::string>(nb::str(obj.type())));
  }
  return p->mask;
}

nb::object mask_to_python(AnyMask mask, const std::string& repr) {
  return nb::cast(make(std::move(mask), repr, "custom"));
}

std::shared_ptr<const BlockMask> block_mask_from_python(nb::handle obj, const char* what) {
  PyBlockMask* p = nullptr;
  if (!nb::try_cast<PyBlockMask*>(obj, p) || p == nullptr) {
    detail::throw_invalid(what, ": expected a seqattn.BlockMask, got ", nb::cast<std::string>(nb::str(obj.type())));
  }
  return p->block_mask;
}

nb::object block_mask_to_python(std::shared_ptr<const BlockMask> block_mask) {
  return nb::cast(PyBlockMask{std::move(block_mask)});
}

void bind_masks(nb::module_& m) {
  bind_mask_base(m);
  bind_block_mask(m);
  bind_mask_kinds(m);
  m.attr("DEFAULT_MASK_VALUE") = kDefaultMaskValue;
}

}  // namespace seqattn::python
