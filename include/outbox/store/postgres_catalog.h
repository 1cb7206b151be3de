#pragma once
// The catalog (outbox/store/catalog.h) read from PostgreSQL.

#include <chrono>
#include <memory>
#include <string>

#include "outbox/store/catalog.h"

namespace outbox {

// A catalog that runs `query` on the PostgreSQL database at `conninfo` (a URI or key=value
// string), on a connection of its own kept between reads (reconnected when lost), each read
// bounded by `deadline`. Its columns are taken by name: name, url and, when present, schema.
// Connects on first Read.
std::unique_ptr<Catalog> OpenPostgresCatalog(std::string conninfo, std::string query,
                                             std::chrono::milliseconds deadline);

}  // namespace outbox
