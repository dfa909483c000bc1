#pragma once

#define SEQATTN_VERSION_MAJOR 0
#define SEQATTN_VERSION_MINOR 1
#define SEQATTN_VERSION_PATCH 0

namespace seqattn {
inline constexpr int kVersionMajor = SEQATTN_VERSION_MAJOR;
inline constexpr int kVersionMinor = SEQATTN_VERSION_MINOR;
inline constexpr int kVersionPatch = SEQATTN_VERSION_PATCH;
}  // namespace seqattn
