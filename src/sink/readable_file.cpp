#include "outbox/sink/readable_file.h"

#include <filesystem>
#include <fstream>
#include <system_error>

namespace outbox {

bool IsReadableFile(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error) && std::ifstream(path).good();
}

}  // namespace outbox
