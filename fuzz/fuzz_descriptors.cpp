// libFuzzer target: SequenceDescriptor::from_segment_ids_and_pos over fuzzed
// ids / positions (self- or cross-attention, optional extra leading dims,
// positions broadcast over a trailing part of the ids' shape), then
// get_seqlens_and_offsets for every mask type / layout / window / max
// segments, then pack_segments. THD results are compared with the dense-mask
// oracle of tests/descriptors/descriptor_oracle.hpp (TE's definition, O(T^2)).
#include <cstdint>
#include <fuzzer/FuzzedDataProvider.h>
#include <vector>

#include "descriptors/descriptor_oracle.hpp"
#include "fuzz_common.hpp"

using namespace seqattn;
namespace t = seqattn::testing;
using V = std::vector<int>;

namespace {

// ids (shape) as runs of small ids: mostly 0..4, increasing segment numbers.
Tensor<std::int32_t> fuzz_ids(FuzzedDataProvider& fdp, const Extents& shape) {
  Tensor<std::int32_t> ids(shape, 0);
  const index_t len = shape.back();
  const int style = fdp.ConsumeIntegralInRange<int>(0, 3);
  for (index_t r = 0; r < ids.size() / len; ++r) {
    index_t k = 0;
    std::int32_t next = 1;
    while (k < len) {
      const index_t run = fdp.ConsumeIntegralInRange<int>(1, 24);
      std::int32_t id;
      if (style == 0) {
        id = fdp.ConsumeIntegralInRange<std::int32_t>(0, 4);  // arbitrary small ids
      } else if (style == 3 && fdp.ConsumeIntegralInRange<int>(0, 15) == 0) {
        id = fdp.ConsumeIntegralInRange<std::int32_t>(-2, 9);  // out of range now and then
      } else {
        id = fdp.ConsumeIntegralInRange<int>(0, 3) == 0 ? 0 : next++;  // padding or the next segment
      }
      for (index_t j = 0; j < run && k < len; ++j, ++k) ids.data()[r * len + k] = id;
    }
  }
  return ids;
}

// Positions over the trailing `rank` dims of the ids: counting runs (per
// segment), increasing, or arbitrary small ints.
Tensor<std::int32_t> fuzz_pos(FuzzedDataProvider& fdp, const Tensor<std::int32_t>& ids, int rank) {
  Tensor<std::int32_t> pos(ids.shape().last(rank), 0);
  const index_t len = ids.extent(-1);
  const index_t offset_in_ids = ids.size() - pos.size();
  const int mode = fdp.ConsumeIntegralInRange<int>(0, 3);
  for (index_t r = 0; r < pos.size() / len; ++r) {
    std::int32_t* out = pos.data() + r * len;
    const std::int32_t* src = ids.data() + offset_in_ids + r * len;
    if (mode <= 1) {
      const V p = t::arange_per_segment(V(src, src + len));
      std::copy(p.begin(), p.end(), out);
    } else if (mode == 2) {
      int v = fdp.ConsumeIntegralInRange<int>(0, 3);
      for (index_t k = 0; k < len; ++k) out[k] = v += fdp.ConsumeIntegralInRange<int>(0, 2);
    } else {
      for (index_t k = 0; k < len; ++k) out[k] = fdp.ConsumeIntegralInRange<int>(-1, 6);
    }
  }
  return pos;
}

V non_negative(const std::int32_t* p, index_t n) {
  V out;
  for (index_t i = 0; i < n; ++i) {
    if (p[i] >= 0) out.push_back(p[i]);
  }
  return out;
}

std::string str(const V& v) {
  std::string s = "[";
  for (int x : v) s += std::to_string(x) + ",";
  return s + "]";
}

struct Input {
  Tensor<std::int32_t> q_ids, kv_ids, q_pos, kv_pos;
  Extents batch;
  bool self = true;
};

void check_thd(const Input& in, const SeqlensAndOffsets& d, AttnMaskType mask, int m) {
  const index_t rows = in.batch.size();
  std::vector<t::RowOracle> oracle;
  bool representable = true;
  for (index_t r = 0; r < rows; ++r) {
    const t::Row q = t::broadcast_row(in.q_ids, in.q_pos, in.batch, r);
    const t::Row kv = t::broadcast_row(in.kv_ids, in.kv_pos, in.batch, r);
    oracle.push_back(t::slow_path_row(q, kv, mask, m));
    representable =
        representable && t::runs_contiguous(oracle.back().row_ids) && t::runs_contiguous(oracle.back().col_ids);
  }
  // Non-contiguous active tokens must be refused (TE would emit misaligned offsets).
  FUZZ_CHECK(representable, "THD derivation accepted ids whose active tokens are not contiguous (mask %s)",
             std::string(to_string(mask)).c_str());
  FUZZ_CHECK(d.seqlens.q.shape() == in.batch.concat(Extents{m}) &&
                 d.offsets.kv.shape() == in.batch.concat(Extents{index_t{m} + 1}),
             "THD result has the wrong shape");
  std::vector<t::PResult> q_rows, kv_rows;
  for (index_t r = 0; r < rows; ++r) {
    const t::RowOracle& o = oracle[static_cast<std::size_t>(r)];
    const V sq(d.seqlens.q.data() + r * m, d.seqlens.q.data() + (r + 1) * m);
    const V skv(d.seqlens.kv.data() + r * m, d.seqlens.kv.data() + (r + 1) * m);
    FUZZ_CHECK(sq == o.q.seqlens, "row %lld q seqlens %s, oracle %s", (long long)r, str(sq).c_str(),
               str(o.q.seqlens).c_str());
    FUZZ_CHECK(skv == o.kv.seqlens, "row %lld kv seqlens %s, oracle %s", (long long)r, str(skv).c_str(),
               str(o.kv.seqlens).c_str());
    FUZZ_CHECK(non_negative(d.offsets.q.data() + r * (m + 1), m + 1) == non_negative(o.q.offsets.data(), m + 1),
               "row %lld q offsets differ from the oracle", (long long)r);
    FUZZ_CHECK(non_negative(d.offsets.kv.data() + r * (m + 1), m + 1) == non_negative(o.kv.offsets.data(), m + 1),
               "row %lld kv offsets differ from the oracle", (long long)r);
    q_rows.push_back(o.q);
    kv_rows.push_back(o.kv);
  }
  const PackedSegments p = pack_segments(d);
  const t::OraclePacked oq = t::te_pack(q_rows, m, in.q_ids.extent(-1));
  const t::OraclePacked okv = t::te_pack(kv_rows, m, in.kv_ids.extent(-1));
  FUZZ_CHECK(t::values(p.seqlens.q) == oq.seqlens && t::values(p.offsets.q) == oq.offsets &&
                 t::values(p.cu_seqlens.q) == oq.cu_seqlens,
             "packed q segments differ from TE's packing");
  FUZZ_CHECK(t::values(p.seqlens.kv) == okv.seqlens && t::values(p.offsets.kv) == okv.offsets &&
                 t::values(p.cu_seqlens.kv) == okv.cu_seqlens,
             "packed kv segments differ from TE's packing");
  const SegmentTable table = p.table();
  table.validate(p.total_tokens.q, p.total_tokens.kv);
}

void check_bshd(const Input& in, const SeqlensAndOffsets& d) {
  FUZZ_CHECK(d.seqlens.q.shape() == in.batch && d.seqlens.kv.shape() == in.batch, "BSHD seqlens have the wrong shape");
  for (index_t i = 0; i < d.seqlens.q.size(); ++i) {
    FUZZ_CHECK(d.seqlens.q.data()[i] >= 0 && d.seqlens.q.data()[i] <= in.q_ids.extent(-1), "BSHD q seqlen %d",
               d.seqlens.q.data()[i]);
    FUZZ_CHECK(d.seqlens.kv.data()[i] >= 0 && d.seqlens.kv.data()[i] <= in.kv_ids.extent(-1), "BSHD kv seqlen %d",
               d.seqlens.kv.data()[i]);
  }
  const PackedSegments p = pack_segments(d);
  p.table().validate(p.total_tokens.q, p.total_tokens.kv);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  const index_t rows = fdp.ConsumeIntegralInRange<int>(1, 4);
  const index_t q_len = fdp.ConsumeIntegralInRange<int>(1, 64);
  Input in;
  in.self = fdp.ConsumeBool();
  const index_t kv_len = in.self ? q_len : fdp.ConsumeIntegralInRange<int>(1, 64);
  Extents extra;
  const int n_extra = fdp.ConsumeIntegralInRange<int>(0, 3) == 0 ? fdp.ConsumeIntegralInRange<int>(1, 2) : 0;
  for (int e = 0; e < n_extra; ++e) extra = extra.concat(Extents{fdp.ConsumeIntegralInRange<int>(1, 2)});
  in.batch = extra.concat(Extents{rows});
  in.q_ids = fuzz_ids(fdp, in.batch.concat(Extents{q_len}));
  in.q_pos = fuzz_pos(fdp, in.q_ids, fdp.ConsumeIntegralInRange<int>(1, in.q_ids.rank()));
  if (in.self) {
    in.kv_ids = in.q_ids;
    in.kv_pos = in.q_pos;
  } else {
    in.kv_ids = fuzz_ids(fdp, in.batch.concat(Extents{kv_len}));
    in.kv_pos = fuzz_pos(fdp, in.kv_ids, fdp.ConsumeIntegralInRange<int>(1, in.kv_ids.rank()));
  }
  const auto mask = static_cast<AttnMaskType>(fdp.ConsumeIntegralInRange<int>(0, 5));
  const SeqLayout layout = fdp.ConsumeBool() ? SeqLayout::thd : SeqLayout::bshd;
  WindowSize window;
  window.left = fdp.ConsumeIntegralInRange<int>(-1, 6);
  window.right = fdp.ConsumeIntegralInRange<int>(-1, 6);
  const int m = fdp.ConsumeIntegralInRange<int>(0, 15) == 0 ? fdp.ConsumeIntegralInRange<int>(-1, 9)
                                                            : fdp.ConsumeIntegralInRange<int>(1, 4);

  seqattn::fuzz::guarded([&] {
    const SequenceDescriptor desc =
        in.self ? SequenceDescriptor::from_segment_ids_and_pos(in.q_ids, in.q_pos)
                : SequenceDescriptor::from_segment_ids_and_pos({in.q_ids, in.kv_ids}, {in.q_pos, in.kv_pos});
    const SeqlensAndOffsets d = desc.get_seqlens_and_offsets(mask, layout, window, m);
    if (layout == SeqLayout::thd) {
      check_thd(in, d, mask, m);
    } else {
      check_bshd(in, d);
    }
  });
  return 0;
}
