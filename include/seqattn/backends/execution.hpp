// Execution policies moved to seqattn/core/execution.hpp (they serve every
// backend and the planner); this header stays for existing includes.
#pragma once

#include "seqattn/core/execution.hpp"
