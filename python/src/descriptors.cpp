// Sequence descriptors: TransformerEngine's SequenceDescriptor,
// get_seqlens_and_offsets and packing, on NumPy / DLPack int32 arrays.
#include "seqattn/descriptors.hpp"

#include <cstddef>
#include <initializer_list>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <optional>
#include <string>
#include <utility>

#include "internal.hpp"

namespace seqattn::python {
namespace {

using Int32Array = CpuArray<std::int32_t>;

// A read-only NumPy view of a tensor owned by the Python object `owner`.
nb::ndarray<nb::numpy, const std::int32_t> view_numpy(const Tensor<std::int32_t>& t, nb::handle owner) {
  std::vector<std::size_t> dims;
  for (index_t d : t.shape().dims()) dims.push_back(static_cast<std::size_t>(d));
  static const std::int32_t dummy = 0;
  const std::int32_t* data = t.data() != nullptr ? t.data() : &dummy;
  return nb::ndarray<nb::numpy, const std::int32_t>(data, dims.size(), dims.data(), owner);
}

QkvPair<Int32View> pair_of(const Int32Array& q, const std::optional<Int32Array>& kv, const char* q_name,
                           const char* kv_name) {
  const Int32View qv = view_of(q, q_name);
  return {qv, kv ? view_of(*kv, kv_name) : qv};
}

// A descriptor keeps copies of its input arrays: `make` runs with the bytes
// of those copies named, so that a copy that cannot be allocated (a broadcast
// array of 2^40 ids) is a MemoryError saying so rather than std::bad_alloc.
template <class Make>
SequenceDescriptor copying(const char* who, std::initializer_list<std::pair<const char*, Int32View>> inputs,
                           Make&& make) {
  std::size_t bytes = 0;
  std::string what = detail::concat(who, ": copies of");
  for (const auto& [name, view] : inputs) {
    bytes += bytes_of<std::int32_t>(view.size());
    what += detail::concat(" ", name, " ", view.shape());
  }
  return allocating(what, bytes, std::forward<Make>(make));
}

WindowSize window_of(const std::optional<std::pair<int, int>>& w) {
  return w ? WindowSize{w->first, w->second} : WindowSize{};
}

}  // namespace

void bind_descriptors(nb::module_& m) {
  nb::enum_<AttnMaskType>(m, "AttnMaskType", "TransformerEngine's mask types, with TE's integer codes")
      .value("no_mask", AttnMaskType::no_mask)
      .value("padding", AttnMaskType::padding)
      .value("causal", AttnMaskType::causal)
      .value("padding_causal", AttnMaskType::padding_causal)
      .value("causal_bottom_right", AttnMaskType::causal_bottom_right)
      .value("padding_causal_bottom_right", AttnMaskType::padding_causal_bottom_right);
  m.def(
      "parse_attn_mask_type", [](std::string_view s) { return parse_attn_mask_type(s); }, nb::arg("attn_mask_type"),
      "Every spelling TE's canonicalize_attn_mask_type accepts.");

  nb::enum_<SeqLayout>(m, "SeqLayout", "Token layout of a batch row (TE's QKVFormat codes)")
      .value("bshd", SeqLayout::bshd)
      .value("thd", SeqLayout::thd);

  nb::class_<SeqlensAndOffsets>(m, "SeqlensAndOffsets",
                                "Per-row seqlens and offsets (TE's get_seqlens_and_offsets result). Unpacks as "
                                "(q_seqlens, kv_seqlens, q_offsets, kv_offsets), like TE.")
      .def_ro("layout", &SeqlensAndOffsets::layout)
      .def_prop_ro("q_seqlens",
                   [](nb::handle self) { return view_numpy(nb::cast<const SeqlensAndOffsets&>(self).seqlens.q, self); })
      .def_prop_ro(
          "kv_seqlens",
          [](nb::handle self) { return view_numpy(nb::cast<const SeqlensAndOffsets&>(self).seqlens.kv, self); })
      .def_prop_ro("q_offsets",
                   [](nb::handle self) { return view_numpy(nb::cast<const SeqlensAndOffsets&>(self).offsets.q, self); })
      .def_prop_ro(
          "kv_offsets",
          [](nb::handle self) { return view_numpy(nb::cast<const SeqlensAndOffsets&>(self).offsets.kv, self); })
      .def_prop_ro("seq_len", [](const SeqlensAndOffsets& s) { return std::make_pair(s.seq_len.q, s.seq_len.kv); });

  nb::class_<PackedSegments>(m, "PackedSegments",
                             "Segments on the flat token axis: global offsets, lengths and cu_seqlens, what a fused "
                             "kernel (and seqattn.attention's THD layout) consumes")
      .def_ro("layout", &PackedSegments::layout)
      .def_ro("num_segments", &PackedSegments::num_segments)
      .def_prop_ro("total_tokens",
                   [](const PackedSegments& p) { return std::make_pair(p.total_tokens.q, p.total_tokens.kv); })
      .def_prop_ro("q_seqlens",
                   [](nb::handle self) { return view_numpy(nb::cast<const PackedSegments&>(self).seqlens.q, self); })
      .def_prop_ro("kv_seqlens",
                   [](nb::handle self) { return view_numpy(nb::cast<const PackedSegments&>(self).seqlens.kv, self); })
      .def_prop_ro("q_offsets",
                   [](nb::handle self) { return view_numpy(nb::cast<const PackedSegments&>(self).offsets.q, self); })
      .def_prop_ro("kv_offsets",
                   [](nb::handle self) { return view_numpy(nb::cast<const PackedSegments&>(self).offsets.kv, self); })
      .def_prop_ro("q_cu_seqlens",
                   [](nb::handle self) { return view_numpy(nb::cast<const PackedSegments&>(self).cu_seqlens.q, self); })
      .def_prop_ro("kv_cu_seqlens", [](nb::handle self) {
        return view_numpy(nb::cast<const PackedSegments&>(self).cu_seqlens.kv, self);
      });

  nb::class_<SequenceDescriptor>(m, "SequenceDescriptor",
                                 "TransformerEngine's SequenceDescriptor (owning copies of its inputs)")
      .def_static(
          "from_seqlens",
          [](const Int32Array& q, const std::optional<Int32Array>& kv) {
            const auto lens = pair_of(q, kv, "q_seqlens", "kv_seqlens");
            return copying("from_seqlens", {{"q_seqlens", lens.q}, {"kv_seqlens", lens.kv}},
                           [&] { return SequenceDescriptor::from_seqlens(lens); });
          },
          nb::arg("q_seqlens"), nb::arg("kv_seqlens").none() = nb::none())
      .def_static(
          "from_seqlens_and_offsets",
          [](const Int32Array& q_lens, const Int32Array& q_offs, const std::optional<Int32Array>& kv_lens,
             const std::optional<Int32Array>& kv_offs) {
            detail::require(kv_lens.has_value() == kv_offs.has_value(),
                            "from_seqlens_and_offsets: give both kv_seqlens and kv_seq_offsets or neither");
            const auto lens = pair_of(q_lens, kv_lens, "q_seqlens", "kv_seqlens");
            const auto offs = pair_of(q_offs, kv_offs, "q_seq_offsets", "kv_seq_offsets");
            return copying("from_seqlens_and_offsets",
                           {{"q_seqlens", lens.q},
                            {"kv_seqlens", lens.kv},
                            {"q_seq_offsets", offs.q},
                            {"kv_seq_offsets", offs.kv}},
                           [&] { return SequenceDescriptor::from_seqlens_and_offsets(lens, offs); });
          },
          nb::arg("q_seqlens"), nb::arg("q_seq_offsets"), nb::arg("kv_seqlens").none() = nb::none(),
          nb::arg("kv_seq_offsets").none() = nb::none())
      .def_static(
          "from_segment_ids_and_pos",
          [](const Int32Array& q_ids, const Int32Array& q_pos, const std::optional<Int32Array>& kv_ids,
             const std::optional<Int32Array>& kv_pos) {
            detail::require(kv_ids.has_value() == kv_pos.has_value(),
                            "from_segment_ids_and_pos: give both kv_segment_ids and kv_segment_pos or neither");
            if (!kv_ids) {
              const auto ids = view_of(q_ids, "segment_ids"), pos = view_of(q_pos, "segment_pos");
              return copying("from_segment_ids_and_pos", {{"segment_ids", ids}, {"segment_pos", pos}},
                             [&] { return SequenceDescriptor::from_segment_ids_and_pos(ids, pos); });
            }
            const auto ids = pair_of(q_ids, kv_ids, "q_segment_ids", "kv_segment_ids");
            const auto pos = pair_of(q_pos, kv_pos, "q_segment_pos", "kv_segment_pos");
            return copying("from_segment_ids_and_pos",
                           {{"q_segment_ids", ids.q},
                            {"kv_segment_ids", ids.kv},
                            {"q_segment_pos", pos.q},
                            {"kv_segment_pos", pos.kv}},
                           [&] { return SequenceDescriptor::from_segment_ids_and_pos(ids, pos); });
          },
          nb::arg("q_segment_ids"), nb::arg("q_segment_pos"), nb::arg("kv_segment_ids").none() = nb::none(),
          nb::arg("kv_segment_pos").none() = nb::none())
      .def(
          "get_seqlens_and_offsets",
          [](const SequenceDescriptor& d, AttnMaskType mask, SeqLayout layout,
             const std::optional<std::pair<int, int>>& window, int max_segments_per_seq) {
            nb::gil_scoped_release release;
            return d.get_seqlens_and_offsets(mask, layout, window_of(window), max_segments_per_seq);
          },
          nb::arg("attn_mask_type"), nb::arg("qkv_layout"), nb::arg("window_size").none() = nb::none(),
          nb::arg("max_segments_per_seq") = 1);

  m.def(
      "pack_segments",
      [](const SeqlensAndOffsets& d, index_t q_seq_len, index_t kv_seq_len) {
        nb::gil_scoped_release release;
        return pack_segments(d, {q_seq_len, kv_seq_len});
      },
      nb::arg("seqlens_and_offsets"), nb::arg("q_seq_len") = -1, nb::arg("kv_seq_len") = -1,
      "Packs per-row descriptors; seq_len (tokens per row S) defaults to the descriptor's own.");
}

}  // namespace seqattn::python
