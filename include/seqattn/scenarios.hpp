// Scenarios: the workloads seqattn's first users came from, end to end.
//   multi_item  — score many items against one query in one packed pass (segment / dense / auto masks)
//   dsa         — DeepSeek-V3.2 lightning-indexer top-k sparse attention
//   kascade     — Kascade anchor/reuse top-k sparse attention (paper semantics)
//   vmapped     — segment ids with extra leading dims against shared positions, BSHD and THD
// plus the seeded tiny model and the reference attention they are checked against.
#pragma once

#include "seqattn/scenarios/attend.hpp"
#include "seqattn/scenarios/dsa.hpp"
#include "seqattn/scenarios/kascade.hpp"
#include "seqattn/scenarios/multi_item.hpp"
#include "seqattn/scenarios/random.hpp"
#include "seqattn/scenarios/reference.hpp"
#include "seqattn/scenarios/tiny_model.hpp"
#include "seqattn/scenarios/vmapped.hpp"
#include "seqattn/scenarios/workloads.hpp"
