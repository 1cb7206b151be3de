#pragma once
// An npm package a test needs (the CloudEvents SDK, s3rver), installed into a directory of the
// build on first use.

#include <cstdlib>
#include <filesystem>
#include <string>

namespace outbox::testing {

// `package` (npm's name) at `version` in `dir`/node_modules, installed with npm on first use: ""
// when it is there, else why not (`used_as` says what the test wanted it for). Several test
// programs may ask at once (ctest -j): one installs under a lock (flock, from util-linux), the
// others wait for it and find it there.
inline std::string EnsureNpmPackage(const std::string& dir, const std::string& package,
                                    const std::string& version, const std::string& used_as) {
  if (std::system("command -v node >/dev/null 2>&1") != 0) {
    return "node (Node.js) is not installed: " + used_as + " is npm's " + package +
           " on Node.js (Debian: apt-get install nodejs npm)";
  }
  if (std::filesystem::exists(dir + "/node_modules/" + package + "/package.json")) return {};
  std::filesystem::create_directories(dir);
  const std::string spec = package + "@" + version;
  if (std::system(("flock '" + dir + "/.install.lock' sh -c '[ -f \"$0/node_modules/" + package +
                   "/package.json\" ] || npm install --prefix \"$0\" --no-audit --no-fund " +
                   "--silent " + spec + "' '" + dir + "' >/dev/null 2>&1")
                      .c_str()) != 0) {
    return "npm install " + spec + " into " + dir + " failed (is the npm registry reachable?)";
  }
  return {};
}

}  // namespace outbox::testing
