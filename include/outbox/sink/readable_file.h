#pragma once
// The check the sink types make of the files their options name (TLS certificates and keys,
// credentials): the file is there when the configuration is read, not at the first connect.

#include <string>

namespace outbox {

// True for a regular file (or a link to one) this process can open for reading.
bool IsReadableFile(const std::string& path);

}  // namespace outbox
