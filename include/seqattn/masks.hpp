// Masks: one description, every representation.
#pragma once

#include "seqattn/masks/block_mask.hpp"
#include "seqattn/masks/concept.hpp"
#include "seqattn/masks/structural.hpp"
