// The store types outboxd can relay from: one entry each (store/registry.h says how to write a
// new one).

#include "config.h"
#include "outbox/store/postgres_type.h"
#include "outbox/store/sqlite_type.h"

namespace outbox::outboxd {

const StoreRegistry& StoreTypes() {
  static const StoreRegistry registry{postgres::Type(), sqlite::Type()};
  return registry;
}

}  // namespace outbox::outboxd
