// Core vocabulary: errors, shapes, strided views, owning tensors, bfloat16.
#pragma once

#include "seqattn/core/bfloat16.hpp"
#include "seqattn/core/error.hpp"
#include "seqattn/core/segments.hpp"
#include "seqattn/core/tensor.hpp"
#include "seqattn/version.hpp"
