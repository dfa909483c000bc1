// Error reporting shared by every seqattn component.
//
// Bad input must produce an exception whose message names the argument, the
// shapes involved and, where it applies, the row and the offending index.
// `detail::concat` builds such messages without <format> (GCC 12 lacks it).
#pragma once

#include <cstddef>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#if defined(__linux__)
#include <sys/sysinfo.h>
#elif defined(__unix__) || defined(__APPLE__)
#include <unistd.h>
#endif

namespace seqattn {

// Thrown for every caller mistake: shape mismatches, malformed segment ids,
// out-of-range indices, invalid block sizes. Derives from
// std::invalid_argument so generic handlers still catch it.
class invalid_argument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Thrown when a request within seqattn's documented limits still cannot be
// allocated on this machine. It names the request in bytes, and the call that
// throws it has written nothing to its outputs. Derives from std::bad_alloc so
// that generic handlers (and Python bindings: MemoryError) still catch it.
class out_of_memory : public std::bad_alloc {
 public:
  out_of_memory(std::string message, std::size_t bytes) : message_(std::move(message)), bytes_(bytes) {}
  const char* what() const noexcept override { return message_.c_str(); }
  // The request that failed, in bytes.
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  std::string message_;
  std::size_t bytes_;
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

// Physical memory plus swap in bytes (0 when the platform does not say): no
// single allocation can get more. Read once.
inline std::size_t machine_memory_bytes() {
  static const std::size_t bytes = [] {
    std::size_t total = 0;
#if defined(__linux__)
    struct sysinfo info {};
    if (sysinfo(&info) == 0 &&
        __builtin_mul_overflow(static_cast<std::size_t>(info.totalram) + info.totalswap, info.mem_unit, &total)) {
      total = 0;
    }
#elif defined(__unix__) || defined(__APPLE__)
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 &&
        __builtin_mul_overflow(static_cast<std::size_t>(pages), static_cast<std::size_t>(page), &total)) {
      total = 0;
    }
#endif
    return total;
  }();
  return bytes;
}

// Runs `allocate` (which allocates about `bytes` bytes for `what`) and turns
// std::bad_alloc into an out_of_memory that names the request, e.g.
//   auto grid = allocating("Splash class grid", n * sizeof(int8_t), [&] { return std::vector<int8_t>(n); });
// A request larger than the machine's memory and swap is refused before the
// allocator sees it: under AddressSanitizer operator new aborts instead of
// throwing, and with overcommit the allocation may succeed only for the
// process to be killed while the buffer is filled.
template <class Allocate>
decltype(auto) allocating(const char* what, std::size_t bytes, Allocate&& allocate) {
  if (const std::size_t machine = machine_memory_bytes(); machine != 0 && bytes > machine) {
    throw out_of_memory(
        concat(what, ": cannot allocate ", bytes, " bytes (this machine has ", machine, " bytes of memory and swap)"),
        bytes);
  }
  try {
    return allocate();
  } catch (const out_of_memory&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw out_of_memory(concat(what, ": cannot allocate ", bytes, " bytes"), bytes);
  }
}

}  // namespace detail
}  // namespace seqattn
