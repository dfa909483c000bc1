// Instantiates the SEQATTN_TEST_REFERENCE group of support/engine_instances.hpp.
#define SEQATTN_TEST_ENGINE_INSTANCES_TU
#include "support/engine_instances.hpp"

SEQATTN_TEST_DEFINE(SEQATTN_TEST_REFERENCE)
