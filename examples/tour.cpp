// A tour of seqattn for newcomers: run it with scripts/demo.sh.
//
// It walks from sequence descriptors to masks to the attention engine, then
// through the three workloads seqattn's first users came from, printing for
// each what is computed, how far it is from an independent brute-force
// oracle, and how much faster it is than the dense path. `--svg FILE` also
// writes the multi-item mask as an SVG picture; `--help` prints the usage.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "seqattn/scenarios.hpp"
#include "seqattn/seqattn.hpp"

#include "support/timing.hpp"

using namespace seqattn;
using namespace seqattn::scenarios;
using seqattn::examples::best_ms;
using seqattn::examples::time_ms;

namespace {

void section(int n, const char* title) { std::printf("\n== %d. %s ==\n\n", n, title); }

float max_diff_rows(const Tensor<float>& got, index_t first_row, const AttentionOutput& want) {
  float e = 0.0f;
  const index_t per_row = want.out.size() / want.out.extent(0);
  for (index_t i = 0; i < want.out.size(); ++i) {
    e = std::max(e, std::fabs(got.data()[first_row * per_row + i] - want.out.data()[i]));
  }
  return e;
}

void descriptors() {
  section(1, "Sequence descriptors: which tokens belong together");
  // A vmapped function sees ids (V=2, B=1, S=10) but positions (B=1, S=10) built once outside it.
  const Tensor<std::int32_t> ids(Extents{2, 1, 10},
                                 std::vector<std::int32_t>{1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3});
  Tensor<std::int32_t> pos(Extents{1, 10});
  for (index_t t = 0; t < 10; ++t) pos(0, t) = static_cast<std::int32_t>(t);
  std::printf("Packed rows carry segment ids (0 = padding). Here a vmapped batch: ids %s, positions %s.\n",
              ids.shape().to_string().c_str(), pos.shape().to_string().c_str());
  std::printf("  example 0: 1 1 1 2 2 2 2 0 0 0      example 1: 1 1 2 2 2 3 3 3 3 3\n");
  const PackedSegments p = vmapped::packed_descriptors(ids.view(), pos.view(), 3);
  std::printf("TransformerEngine-style descriptors, packed for a THD kernel: %td segments, cu_seqlens =",
              p.num_segments);
  for (index_t i = 0; i <= p.num_segments; ++i) std::printf(" %d", p.cu_seqlens.q.data()[i]);
  std::printf("\n(The extra leading dim broadcasts against the shared positions: TE issue #2685.)\n");
}

void masks(const char* svg_path) {
  section(2, "Masks: one description, every representation");
  const std::vector<std::int32_t> query{10, 11, 12};
  const std::vector<std::vector<std::int32_t>> items{{21, 22}, {}, {31, 32, 33}, {41}};
  multi_item::Options o;
  o.delimiter = 63;
  const multi_item::PackedRequest r = multi_item::pack(query, items, o);
  const MultiItemLayout layout = multi_item::layout_of(r);
  const MultiItemMask mask = multi_item_mask(layout);
  std::printf(
      "Multi-item scoring packs `query ‖ d ‖ item1 ‖ d ‖ … ‖ d` into one sequence. The query (3 tokens)\n"
      "and the first delimiter are a shared causal prefix; each item sees that prefix and itself, never\n"
      "another item. Items here have lengths 2, 0, 3, 1. Rows are queries, columns keys, # = may attend:\n\n");
  std::string pic = to_ascii(mask, MaskContext{0, 0, r.size(), r.size()});
  std::size_t at = 0;
  while (at < pic.size()) {
    const std::size_t nl = pic.find('\n', at);
    std::printf("    %s\n", pic.substr(at, nl - at).c_str());
    at = nl + 1;
  }
  if (svg_path) {
    write_text_file(svg_path, to_svg(mask, MaskContext{0, 0, r.size(), r.size()}, "multi-item mask", 128, 16));
    std::printf("\n(SVG written to %s)\n", svg_path);
  }
  // The same description at scale, as the engine sees it: 64x64 tiles, most of them skipped.
  SplitMix64 rng(1);
  const auto many = workloads::random_items(rng, 60, 16, 63);
  const multi_item::PackedRequest big = multi_item::pack(std::vector<std::int32_t>(32, 5), many, o);
  const MultiItemLayout big_layout = multi_item::layout_of(big);
  const BlockMask bm = build_block_mask(multi_item_mask(big_layout), big_layout.lengths(), 1, {64, 64});
  std::printf(
      "\nThe engine consumes a BlockMask. 60 items, %td tokens, in 64x64 tiles (# full: no mask work,\n"
      "+ partial: masked from stored bits, . empty: skipped) — %td of %td tiles are never touched:\n\n",
      big.size(), bm.num_tiles() - bm.num_full_tiles() - bm.num_partial_tiles(), bm.num_tiles());
  pic = to_ascii(bm, 0);
  at = 0;
  while (at < pic.size()) {
    const std::size_t nl = pic.find('\n', at);
    std::printf("    %s\n", pic.substr(at, nl - at).c_str());
    at = nl + 1;
  }
}

void multi_item_scoring() {
  section(3, "Multi-item scoring (sglang-jax PR #912, bugs fixed)");
  const TinyModel model;  // a seeded one-layer attention model with a linear head
  multi_item::Options o;
  o.delimiter = 63;
  const std::vector<std::int32_t> labels{7, 21, 42};
  const std::vector<std::int32_t> query{10, 11, 12, 13};
  SplitMix64 rng(7);
  auto items = workloads::random_items(rng, 24, 12, 63);
  items[0].clear();
  items[9].clear();
  items[10].clear();
  o.mode = multi_item::MaskMode::dense;
  const auto dense = multi_item::score_items(model, query, items, labels, o);
  o.mode = multi_item::MaskMode::segment;
  const auto segment = multi_item::score_items(model, query, items, labels, o);
  double dvs = 0.0, serial = 0.0;
  for (std::size_t j = 0; j < items.size(); ++j) {
    const auto s = multi_item::score_serial(model, query, items[j], labels, o);
    for (std::size_t l = 0; l < labels.size(); ++l) {
      dvs = std::max(dvs, std::fabs(double(dense.scores[j][l]) - segment.scores[j][l]));
      serial = std::max(serial, std::fabs(double(segment.scores[j][l]) - s[l]));
    }
  }
  std::printf(
      "24 items (3 empty, lengths 0..12) scored in one packed pass with positions reset after each\n"
      "delimiter. Each item must score exactly as if run alone as `query ‖ d ‖ item`:\n");
  std::printf("  max |dense mask - segment mask| = %.1e    max |packed - one at a time| = %.1e   (goal <= 1e-4)\n", dvs,
              serial);
  std::printf("  An empty item is read at `query ‖ d`, so it no longer depends on its neighbour (upstream bug).\n");

  const auto big = workloads::random_items(rng, 500, 16, 63);
  const multi_item::PackedRequest p = multi_item::pack(std::vector<std::int32_t>(32, 5), big, o);
  const Projections pr = model.project(p.tokens, p.positions);
  const double t_dense =
      best_ms(1, [&] { (void)multi_item::attend_packed(pr, model.softmax_scale(), p, multi_item::MaskMode::dense); });
  const double t_segment =
      best_ms(3, [&] { (void)multi_item::attend_packed(pr, model.softmax_scale(), p, multi_item::MaskMode::segment); });
  std::printf(
      "500 items (%td tokens): attention with the dense T x T mask %.0f ms, with O(T) segment metadata\n"
      "%.1f ms -> %.0fx faster (upstream measured 2.01x on TPU).\n",
      p.size(), t_dense, t_segment, t_dense / t_segment);
}

void dsa_topk() {
  section(4, "DeepSeek-V3.2 sparse attention: lightning-indexer top-k");
  const index_t tokens = 2048, top_k = 256, heads = 8, dim = 64;
  const auto in = workloads::dsa_inputs(tokens, heads, 2, dim, 4, 32, 11);
  dsa::Result r;
  AttentionOutput dense;
  const double t_total = best_ms(2, [&] {
    r = dsa::sparse_attention(in.q.view(), in.k.view(), in.v.view(), in.scale, in.index_q.view(), in.index_k.view(),
                              in.index_w.view(), top_k);
  });
  const TopKLayout layout = dsa::topk_layout(r.topk);
  const double t_attn = best_ms(2, [&] {
    if (r.path.choice == dsa::Path::full) {
      (void)attend(in.q.view(), in.k.view(), in.v.view(), in.scale, topk_mask(layout));
    } else {
      (void)attend_thd(in.q.view(), r.gathered.k.view(), r.gathered.v.view(), r.gathered.table(), in.scale,
                       dsa::GatheredSelectionMask{&r.gathered});
    }
  });
  const double t_dense =
      best_ms(2, [&] { dense = attend(in.q.view(), in.k.view(), in.v.view(), in.scale, CausalMask{}); });
  const Tensor<std::uint8_t> mask = dsa::mask_by_scatter(r.topk.indices.view(), tokens);
  const index_t first = tokens - 128;
  const auto oracle = reference_attention(in.q.view().slice(0, first, tokens), in.k.view(), in.v.view(), in.scale,
                                          [&](index_t, index_t i, index_t j) { return mask(first + i, j) != 0; });
  std::printf(
      "Each of %td queries keeps the %td keys with the highest score sum_h ReLU(q_h . k) w_h (causal,\n"
      "ties to the lower index; rows with <= k keys bypass the ranking: %td here), and attends to them only.\n"
      "The selections cluster (recent keys, a few heavy hitters): %.1f key tiles per 64-query block in place\n"
      "vs %.1f if gathered, so it runs %s.\n",
      tokens, top_k, r.topk.bypassed_rows, static_cast<double>(r.path.full_tiles) / (tokens / 64.0),
      static_cast<double>(r.path.gathered_tiles) / (tokens / 64.0),
      r.path.choice == dsa::Path::full ? "in place (TopKMask over the full K/V)" : "on gathered K/V");
  std::printf("  engine vs brute-force oracle (last 128 queries): max |error| = %.1e\n",
              max_diff_rows(r.attention.out, first, oracle));
  std::printf(
      "  dense causal attention %.0f ms; top-k attention %.0f ms (%.1fx faster); %.0f ms with the indexer "
      "(%.2fx)\n",
      t_dense, t_attn, t_dense / t_attn, t_total, t_dense / t_total);
}

void kascade_sparse() {
  section(5, "Kascade: reuse one layer's top-k keys in the next layers");
  const index_t tokens = 2048, heads = 8, kv_heads = 2, dim = 64;
  const auto layers = workloads::kascade_layers(tokens, heads, kv_heads, dim, 2, 5);
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const kascade::Config config;
  kascade::Selection anchor;
  const double t_anchor =
      time_ms([&] { anchor = kascade::select_anchor(layers[0].q.view(), layers[0].k.view(), scale, config); });
  const auto& L = layers[1];
  const auto head_map =
      kascade::calibrate_head_map(anchor, kascade::pooled_mass(L.q.view(), L.k.view(), scale, config.tile).view());
  AttentionOutput dense, sparse;
  const double t_dense = best_ms(2, [&] { dense = attend(L.q.view(), L.k.view(), L.v.view(), scale, CausalMask{}); });
  const double t_sparse = best_ms(2, [&] {
    sparse = kascade::sparse_attention(L.q.view(), kascade::gather(anchor, head_map, L.k.view(), L.v.view()), scale);
  });
  double num = 0.0, den = 0.0;
  for (index_t i = 0; i < dense.out.size(); ++i) {
    const double d = static_cast<double>(sparse.out.data()[i]) - dense.out.data()[i];
    num += d * d;
    den += static_cast<double>(dense.out.data()[i]) * dense.out.data()[i];
  }
  const index_t first = tokens - 64;
  const auto oracle = reference_attention(
      L.q.view().slice(0, first, tokens), L.k.view(), L.v.view(), scale, [&](index_t h, index_t i, index_t j) {
        return kascade::reuse_allowed(anchor, head_map, heads / kv_heads, h, first + i, j);
      });
  std::printf(
      "The anchor layer pools its exact attention per 32-query tile and KV group over the keys before the\n"
      "tile and keeps the top %td (10%% of %td, minus the tile) in %.0f ms. The next layer maps its groups to\n"
      "the anchor's (head map [%td %td], calibrated) and each query attends to those keys plus its own tile.\n",
      anchor.k, tokens, t_anchor, head_map[0], head_map[1]);
  std::printf("  engine vs brute-force oracle on the same key sets: max |error| = %.1e\n",
              max_diff_rows(sparse.out, first, oracle));
  std::printf("  output error vs dense attention: relative L2 %.3f\n", std::sqrt(num / den));
  std::printf("  dense causal attention %.0f ms; Kascade reuse layer (gather + attention) %.0f ms -> %.1fx faster\n",
              t_dense, t_sparse, t_dense / t_sparse);
}

void usage(std::FILE* to, const char* program) {
  std::fprintf(to,
               "usage: %s [--svg FILE] [--help]\n"
               "\n"
               "A tour of seqattn: sequence descriptors, masks, the attention engine, then multi-item\n"
               "scoring, the DSA top-k indexer and Kascade sparse attention, each checked against a\n"
               "brute-force oracle and timed against the dense path (single-threaded).\n"
               "\n"
               "  --svg FILE   also write the multi-item mask of section 2 as an SVG picture to FILE\n"
               "  -h, --help   print this help and exit\n"
               "\n"
               "Every mask kind, as ASCII and SVG pictures: seqattn_example_mask_gallery [DIR]\n"
               "(examples/mask_gallery.cpp).\n",
               program);
}

}  // namespace

int main(int argc, char** argv) {
  const char* svg = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      usage(stdout, argv[0]);
      return 0;
    }
    if (std::strcmp(argv[i], "--svg") == 0 && i + 1 < argc) {
      svg = argv[++i];
      continue;
    }
    // A mistyped option must not start a minute-long run that ignores it.
    std::fprintf(stderr, "%s: %s '%s'\n\n", argv[0],
                 std::strcmp(argv[i], "--svg") == 0 ? "missing FILE after" : "unknown argument", argv[i]);
    usage(stderr, argv[0]);
    return 2;
  }
  std::printf("seqattn %d.%d.%d tour (Highway target %s; timings single-threaded, best of a few runs)\n", kVersionMajor,
              kVersionMinor, kVersionPatch, static_simd_target());
  const double total = time_ms([&] {
    descriptors();
    masks(svg);
    multi_item_scoring();
    dsa_topk();
    kascade_sparse();
  });
  std::printf(
      "\nTour done in %.1f s. Examples with more detail: seqattn_example_{multi_item,dsa_topk,kascade,vmapped}.\n",
      total / 1000.0);
  return 0;
}
