// Core vocabulary: errors, shapes, strided views, owning tensors, bfloat16,
// execution policies.
#pragma once

#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/checked.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/execution.hpp"
#include "seqattn/core/segments.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/version.hpp"
