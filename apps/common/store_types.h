#pragma once
// The store types outboxd and outboxctl know: one registration line each (store/registry.h says
// how to write a new one). Both programs loop over this one list.

#include "outbox/store/registry.h"

namespace outbox::apps {

const StoreRegistry& StoreTypes();

}  // namespace outbox::apps
