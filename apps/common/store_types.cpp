#include "store_types.h"

#include "outbox/store/mariadb_type.h"
#include "outbox/store/postgres_type.h"
#include "outbox/store/sqlite_type.h"

namespace outbox::apps {

const StoreRegistry& StoreTypes() {
  static const StoreRegistry registry{postgres::Type(), sqlite::Type(), mariadb::Type()};
  return registry;
}

}  // namespace outbox::apps
