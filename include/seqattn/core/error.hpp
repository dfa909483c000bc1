// Error reporting shared by every seqattn component.
//
// Bad input must produce an exception whose message names the argument, the
// shapes involved and, where it applies, the row and the offending index.
// `detail::concat` builds such messages without <format> (GCC 12 lacks it).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace seqattn {

// Thrown for every caller mistake: shape mismatches, malformed segment ids,
// out-of-range indices, invalid block sizes. Derives from
// std::invalid_argument so generic handlers still catch it.
class invalid_argument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}

template <class... Parts>
[[noreturn]] void throw_invalid(const Parts&... parts) {
  throw invalid_argument(concat(parts...));
}

// Argument check that survives release builds.
template <class... Parts>
void require(bool condition, const Parts&... parts) {
  if (!condition) throw_invalid(parts...);
}

}  // namespace detail
}  // namespace seqattn
