// The shared segment-run parser (core/segment_runs.hpp) against a naive run
// finder, token by token, on random rows (contiguous and strided, every
// RunPositions mode), plus its edge cases and error paths. Its two callers
// (descriptors, DocumentLayout) are tested with their own rules elsewhere.
#include "seqattn/core/segment_runs.hpp"

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "seqattn/masks.hpp"

#include "support/catch.hpp"

// Everything below in a namespace of this file's own (unity builds).
namespace seqattn_test_descriptors_segment_runs_test {

using namespace seqattn;
using Catch::Matchers::Contains;
using detail::ParsedRun;
using detail::RowPtr;
using detail::RunPositions;

namespace {

constexpr auto kInt32Max = std::numeric_limits<std::int32_t>::max();

struct Where {
  std::string operator()() const { return "ids of shape (1, " + std::to_string(len) + "), row 0"; }
  std::size_t len;
};
using Rules = detail::StandardRunRules<Where>;

// What the parser should do, found the slow way: the runs (rule R3) and the
// first rule violation (R2, R4, R5) as (token, message fragment).
struct Expected {
  std::vector<ParsedRun> runs;
  std::optional<std::pair<std::int64_t, std::string>> error;
};

Expected naive_runs(const std::vector<std::int32_t>& ids, const std::vector<std::int32_t>& pos, RunPositions mode) {
  Expected e;
  for (std::size_t t = 0; t < ids.size(); ++t) {
    const std::int32_t v = ids[t];
    const auto at = static_cast<std::int64_t>(t);
    if (v == 0) continue;
    if (v < 0) {
      e.error = {at, "negative segment id " + std::to_string(v)};
      return e;
    }
    if (t > 0 && ids[t - 1] == v) {  // continues the current run
      ParsedRun& r = e.runs.back();
      r.end = at + 1;
      if (mode == RunPositions::none) continue;
      if (mode == RunPositions::consecutive && std::int64_t{pos[t]} != std::int64_t{r.first_pos} + (at - r.begin)) {
        e.error = {at, "positions within segment " + std::to_string(v) + " must count up by one, got " +
                           std::to_string(pos[t]) + " after " + std::to_string(pos[t - 1])};
        return e;
      }
      r.min_pos = std::min(r.min_pos, pos[t]);
      r.max_pos = std::max(r.max_pos, pos[t]);
      continue;
    }
    for (const ParsedRun& r : e.runs) {
      if (r.id == v) {
        e.error = {at, "segment id " + std::to_string(v) + " appears again after its run ended at token " +
                           std::to_string(r.end - 1)};
        return e;
      }
    }
    const std::int32_t p = mode == RunPositions::none ? 0 : pos[t];
    e.runs.push_back({v, at, at + 1, p, p, p});
  }
  return e;
}

template <RunPositions Mode, bool Unit>
std::vector<ParsedRun> parse(detail::SegmentRunParser& parser, const std::vector<std::int32_t>& ids,
                             const std::vector<std::int32_t>& pos) {
  const auto len = static_cast<index_t>(ids.size());
  Rules rules{Where{ids.size()}};
  if constexpr (Unit) {
    const auto s = parser.parse<Mode>(RowPtr<true>{ids.data(), 1}, RowPtr<true>{pos.data(), 1}, len, rules);
    return {s.begin(), s.end()};
  } else {
    // The same row, strided: every other element of an interleaved buffer.
    std::vector<std::int32_t> ids2(2 * ids.size() + 1, -7), pos2(2 * pos.size() + 1, -7);
    for (std::size_t t = 0; t < ids.size(); ++t) {
      ids2[2 * t] = ids[t];
      pos2[2 * t] = pos[t];
    }
    const auto s = parser.parse<Mode>(RowPtr<false>{ids2.data(), 2}, RowPtr<false>{pos2.data(), 2}, len, rules);
    return {s.begin(), s.end()};
  }
}

template <RunPositions Mode, bool Unit>
void check_against_naive(detail::SegmentRunParser& parser, const std::vector<std::int32_t>& ids,
                         const std::vector<std::int32_t>& pos) {
  const Expected e = naive_runs(ids, pos, Mode);
  if (e.error) {
    const std::string token = "token " + std::to_string(e.error->first) + ": ";
    CHECK_THROWS_WITH((parse<Mode, Unit>(parser, ids, pos)), Contains(token) && Contains(e.error->second));
    return;
  }
  const std::vector<ParsedRun> got = parse<Mode, Unit>(parser, ids, pos);
  REQUIRE(got.size() == e.runs.size());
  for (std::size_t r = 0; r < got.size(); ++r) {
    INFO("run " << r);
    CHECK(got[r].id == e.runs[r].id);
    CHECK(got[r].begin == e.runs[r].begin);
    CHECK(got[r].end == e.runs[r].end);
    CHECK(got[r].first_pos == e.runs[r].first_pos);
    CHECK(got[r].min_pos == e.runs[r].min_pos);
    CHECK(got[r].max_pos == e.runs[r].max_pos);
  }
}

template <bool Unit>
void check_all_modes(detail::SegmentRunParser& parser, const std::vector<std::int32_t>& ids,
                     const std::vector<std::int32_t>& pos) {
  check_against_naive<RunPositions::none, Unit>(parser, ids, pos);
  check_against_naive<RunPositions::range, Unit>(parser, ids, pos);
  check_against_naive<RunPositions::consecutive, Unit>(parser, ids, pos);
}

// A random row: runs of random (short or block-spanning) lengths with padding
// gaps; ids increasing, or distinct in random order; positions consecutive,
// shifted, or random (resets inside runs); then, sometimes, one corruption.
struct RandomRow {
  std::vector<std::int32_t> ids, pos;
};

RandomRow random_row(std::mt19937& rng) {
  std::uniform_int_distribution<int> coin(0, 3), run_len(1, 90), gap(0, 4), n_runs(0, 12);
  std::uniform_int_distribution<std::int32_t> any_pos(-5, 200);
  RandomRow row;
  const int runs = n_runs(rng);
  std::vector<std::int32_t> run_ids(static_cast<std::size_t>(runs));
  for (int r = 0; r < runs; ++r) run_ids[static_cast<std::size_t>(r)] = r + 1 + (coin(rng) == 0 ? 1000 : 0) * r;
  if (coin(rng) == 0) std::shuffle(run_ids.begin(), run_ids.end(), rng);
  const int pos_kind = coin(rng);
  for (int r = 0; r < runs; ++r) {
    for (int g = coin(rng) == 0 ? gap(rng) : 0; g > 0; --g) {
      row.ids.push_back(0);
      row.pos.push_back(any_pos(rng));
    }
    const int len = coin(rng) == 0 ? run_len(rng) : 1 + coin(rng);
    const std::int32_t first = pos_kind == 1 ? any_pos(rng) : 0;
    for (int k = 0; k < len; ++k) {
      row.ids.push_back(run_ids[static_cast<std::size_t>(r)]);
      row.pos.push_back(pos_kind == 3 ? any_pos(rng) : first + k);
    }
  }
  for (int g = coin(rng) == 0 ? gap(rng) : 0; g > 0; --g) {
    row.ids.push_back(0);
    row.pos.push_back(any_pos(rng));
  }
  if (!row.ids.empty() && coin(rng) == 0) {  // corrupt one token: a repeat, a negative id or a position
    std::uniform_int_distribution<std::size_t> at(0, row.ids.size() - 1);
    const std::size_t t = at(rng), src = at(rng);
    switch (coin(rng)) {
      case 0:
        row.ids[t] = -1 - coin(rng);
        break;
      case 1:
        row.ids[t] = row.ids[src];
        break;
      default:
        row.pos[t] += 1 + coin(rng);
        break;
    }
  }
  return row;
}

}  // namespace

TEST_CASE("Segment runs: random rows match a naive run finder, contiguous and strided") {
  std::mt19937 rng(20261121);
  detail::SegmentRunParser parser;  // reused across rows, as the callers do
  for (int trial = 0; trial < 1500; ++trial) {
    const RandomRow row = random_row(rng);
    INFO("trial " << trial << ", " << row.ids.size() << " tokens");
    check_all_modes<true>(parser, row.ids, row.pos);
    check_all_modes<false>(parser, row.ids, row.pos);
  }
}

TEST_CASE("Segment runs: empty rows and all-padding rows have no runs") {
  detail::SegmentRunParser parser;
  const std::vector<std::int32_t> none;
  CHECK(parse<RunPositions::range, true>(parser, none, none).empty());
  CHECK(parse<RunPositions::consecutive, false>(parser, none, none).empty());
  const std::vector<std::int32_t> padding(100, 0), junk_pos{-3, 7, kInt32Max, -1, 0};
  std::vector<std::int32_t> pos(100);
  for (std::size_t t = 0; t < pos.size(); ++t) pos[t] = junk_pos[t % junk_pos.size()];  // never read
  CHECK(parse<RunPositions::none, true>(parser, padding, pos).empty());
  CHECK(parse<RunPositions::consecutive, true>(parser, padding, pos).empty());
  CHECK(parse<RunPositions::range, false>(parser, padding, pos).empty());
}

TEST_CASE("Segment runs: only an id change splits a run, never a position reset") {
  detail::SegmentRunParser parser;
  // One id with positions restarting inside: one run (TE's boundary rule).
  const std::vector<std::int32_t> ids{0, 1, 1, 1, 1, 0, 2, 2};
  const std::vector<std::int32_t> pos{9, 0, 1, 0, 1, 5, 4, 3};
  const auto runs = parse<RunPositions::range, true>(parser, ids, pos);
  REQUIRE(runs.size() == 2);
  CHECK((runs[0].id == 1 && runs[0].begin == 1 && runs[0].end == 5));
  CHECK((runs[0].first_pos == 0 && runs[0].min_pos == 0 && runs[0].max_pos == 1));
  CHECK((runs[1].id == 2 && runs[1].begin == 6 && runs[1].end == 8));
  CHECK((runs[1].first_pos == 4 && runs[1].min_pos == 3 && runs[1].max_pos == 4));
  // Under RunPositions::consecutive the reset is an error, not a split.
  CHECK_THROWS_WITH((parse<RunPositions::consecutive, true>(parser, ids, pos)),
                    Contains("ids of shape (1, 8), row 0, token 3: positions within segment 1 must count up by one, "
                             "got 0 after 1"));
  // Adjacent runs of different ids need no padding between them; ids need not be ordered.
  const std::vector<std::int32_t> adjacent{7, 7, 3, 3, 3, 9};
  const auto r2 = parse<RunPositions::none, true>(parser, adjacent, adjacent);
  REQUIRE(r2.size() == 3);
  CHECK((r2[0].id == 7 && r2[1].id == 3 && r2[1].begin == 2 && r2[1].end == 5 && r2[2].id == 9));
  CHECK((r2[0].first_pos == 0 && r2[0].max_pos == 0));  // positions not read
}

TEST_CASE("Segment runs: error messages name the argument, shape, row, token and value") {
  detail::SegmentRunParser parser;
  const std::vector<std::int32_t> negative{1, 1, 0, -4};
  CHECK_THROWS_AS((parse<RunPositions::none, true>(parser, negative, negative)), invalid_argument);
  CHECK_THROWS_WITH((parse<RunPositions::none, true>(parser, negative, negative)),
                    Contains("ids of shape (1, 4), row 0, token 3: negative segment id -4 (0 is padding"));
  const std::vector<std::int32_t> repeated{2, 2, 1, 0, 2};
  CHECK_THROWS_WITH((parse<RunPositions::none, false>(parser, repeated, repeated)),
                    Contains("ids of shape (1, 5), row 0, token 4: segment id 2 appears again after its run ended at "
                             "token 1; each segment must be one contiguous run"));
  // Repeats found after the by-id index was built (ids stopped increasing at token 2).
  const std::vector<std::int32_t> late{5, 1, 0, 9, 8, 9};
  CHECK_THROWS_WITH((parse<RunPositions::none, true>(parser, late, late)),
                    Contains("token 5: segment id 9 appears again after its run ended at token 3"));
  // Positions are compared in 64 bits: no wrap past INT32_MAX, in blocks or token by token.
  for (const std::size_t len : {std::size_t{3}, std::size_t{70}}) {
    std::vector<std::int32_t> ids(len, 1), pos(len);
    for (std::size_t t = 0; t < len; ++t) pos[t] = static_cast<std::int32_t>(kInt32Max - (len - 2) + t);  // wraps
    CHECK_THROWS_WITH((parse<RunPositions::consecutive, true>(parser, ids, pos)),
                      Contains("token " + std::to_string(len - 1) +
                               ": positions within segment 1 must count up by "
                               "one, got -2147483648 after 2147483647"));
    pos.back() = 0;  // still not consecutive
    CHECK_THROWS_AS((parse<RunPositions::consecutive, true>(parser, ids, pos)), invalid_argument);
    ids.back() = 0;  // the run now ends at INT32_MAX exactly
    const auto runs = parse<RunPositions::consecutive, true>(parser, ids, pos);
    REQUIRE(runs.size() == 1);
    CHECK((runs[0].end == static_cast<index_t>(len) - 1 && runs[0].max_pos == kInt32Max));
  }
}

TEST_CASE("Segment runs: callers' rules run at each run start and may reject it") {
  // A caller's rule: ids 1, 2, 3, ... in order (what the descriptors demand).
  struct InOrder : detail::StandardRunRules<Where> {
    std::vector<std::tuple<std::int32_t, index_t, std::int32_t, index_t>> starts;
    void on_run_start(std::int32_t v, index_t t, std::int32_t p, index_t before) {
      starts.emplace_back(v, t, p, before);
      if (v != before + 1) throw invalid_argument("out of order at token " + std::to_string(t));
    }
  };
  detail::SegmentRunParser parser;
  const std::vector<std::int32_t> ids{0, 1, 1, 2, 0, 3};
  const std::vector<std::int32_t> pos{0, 4, 5, 0, 0, 7};
  InOrder rules{{Where{ids.size()}}, {}};
  const auto runs = parser.parse<RunPositions::range>(RowPtr<true>{ids.data(), 1}, RowPtr<true>{pos.data(), 1},
                                                      static_cast<index_t>(ids.size()), rules);
  CHECK(runs.size() == 3);
  using Start = std::tuple<std::int32_t, index_t, std::int32_t, index_t>;
  CHECK(rules.starts == std::vector<Start>{{1, 1, 4, 0}, {2, 3, 0, 1}, {3, 5, 7, 2}});
  const std::vector<std::int32_t> skip{1, 3, 3};
  InOrder strict{{Where{skip.size()}}, {}};
  CHECK_THROWS_WITH(
      parser.parse<RunPositions::none>(RowPtr<true>{skip.data(), 1}, RowPtr<true>{skip.data(), 1}, 3, strict),
      Contains("out of order at token 1"));
}

TEST_CASE("Segment runs: both callers accept and reject the same rows where their rules agree") {
  // DocumentLayout allows any id order; a reappearing id is rejected by both.
  const std::vector<std::int32_t> unordered{3, 3, 0, 1, 2, 2};
  const DocumentLayout layout = DocumentLayout::from_segment_ids(
      TensorView<const std::int32_t>(unordered.data(), Extents{1, static_cast<index_t>(unordered.size())}));
  const auto runs = layout.view().q_row(0);
  REQUIRE(runs.size() == 3);
  CHECK((runs[0].id == 3 && runs[0].begin == 0 && runs[0].end == 2));
  CHECK((runs[1].id == 1 && runs[1].begin == 3 && runs[1].end == 4));
  CHECK((runs[2].id == 2 && runs[2].begin == 4 && runs[2].end == 6));
  CHECK(layout.view().q_run_of_token[2] == -1);
  CHECK(layout.view().q_run_of_token[5] == 2);
  const std::vector<std::int32_t> again{3, 1, 3};
  CHECK_THROWS_WITH(
      DocumentLayout::from_segment_ids(TensorView<const std::int32_t>(again.data(), Extents{1, 3})),
      Contains("q_segment_ids row 0 of shape (1, 3): segment 3 is not one contiguous run (tokens 0 and 2)"));
}

}  // namespace seqattn_test_descriptors_segment_runs_test
