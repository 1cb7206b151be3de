// The store types outboxd can relay from: the ones outboxd and outboxctl share
// (apps/common/store_types.cpp, one registration line each).

#include "config.h"
#include "store_types.h"

namespace outbox::outboxd {

const StoreRegistry& StoreTypes() { return apps::StoreTypes(); }

}  // namespace outbox::outboxd
