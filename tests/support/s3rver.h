#pragma once
// A real S3-compatible server for the claim-check tests (issue #43): s3rver (npm `s3rver`, a
// Node.js implementation of the S3 REST API on the file system), installed into the build
// directory on first use and started by the test on 127.0.0.1 with a free port and a data
// directory of its own, stopped (and the directory removed) at the end.
//
// What s3rver checks and what it does not: it parses the SigV4 Authorization header, requires
// x-amz-content-sha256 and a known access key id (its account S3RVER / S3RVER), but it does NOT
// verify the signature itself (SigV4 calculation is unimplemented there) nor the payload hash.
// A test that needs a refused signature cannot have one from it; an unknown access key id is
// refused (403 InvalidAccessKeyId).
//
// A target using it defines OUTBOX_S3RVER_NODE_DIR (where npm installs it).

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "support/child_process.h"
#include "support/free_port.h"
#include "support/npm_package.h"

namespace outbox::testing {

inline constexpr const char* kS3rverAccessKey = "S3RVER";
inline constexpr const char* kS3rverSecretKey = "S3RVER";

// s3rver in OUTBOX_S3RVER_NODE_DIR, installed with npm on first use: "" when it is there, else why
// not.
inline std::string EnsureS3rver() {
  return EnsureNpmPackage(OUTBOX_S3RVER_NODE_DIR, "s3rver", "3.7.1", "the S3 server of this test");
}

// One s3rver with bucket `bucket`, for the life of the object.
class S3rver {
 public:
  explicit S3rver(std::string bucket) : bucket_(std::move(bucket)), port_(FreePort()) {
    dir_ = std::filesystem::temp_directory_path() /
           ("outbox-s3rver-" + std::to_string(::getpid()) + "-" + std::to_string(port_));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_ + "/data");
    // --service-endpoint localhost: <bucket>.s3.localhost is a virtual-host request (libcurl
    // resolves any *.localhost to the loopback address itself).
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{
            "/usr/bin/env", "node",
            std::string{OUTBOX_S3RVER_NODE_DIR} + "/node_modules/s3rver/bin/s3rver.js", "-d",
            dir_ + "/data", "-a", "127.0.0.1", "-p", std::to_string(port_), "-s",
            "--service-endpoint", "localhost", "--configure-bucket", bucket_},
        dir_ + "/s3rver.log", Ready::LogLine("S3rver listening on"));
    ready_ = process_->WaitReady(std::chrono::seconds{20});
  }
  ~S3rver() {
    if (process_) process_->Stop(SIGTERM, std::chrono::seconds{5});
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  S3rver(const S3rver&) = delete;
  S3rver& operator=(const S3rver&) = delete;

  [[nodiscard]] bool ready() const { return ready_; }
  [[nodiscard]] int port() const { return port_; }
  [[nodiscard]] const std::string& bucket() const { return bucket_; }
  [[nodiscard]] std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // For url_style = "virtual": <bucket>.s3.localhost:<port>.
  [[nodiscard]] std::string virtual_host_endpoint() const {
    return "http://s3.localhost:" + std::to_string(port_);
  }
  // The objects the bucket holds, by key, read from s3rver's files (not through the S3 API).
  [[nodiscard]] std::vector<std::string> Keys() const {
    std::vector<std::string> keys;
    const std::filesystem::path root = dir_ + "/data/" + bucket_;
    if (!std::filesystem::exists(root)) return keys;
    constexpr std::string_view kSuffix = "._S3rver_object";
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
      const std::string relative = entry.path().lexically_relative(root).string();
      if (relative.ends_with(kSuffix))
        keys.push_back(relative.substr(0, relative.size() - kSuffix.size()));
    }
    return keys;
  }
  [[nodiscard]] std::string Log() const {
    std::ifstream in(dir_ + "/s3rver.log");
    return {std::istreambuf_iterator<char>(in), {}};
  }
  // Stops the server (its data stays until the object dies): an unreachable store.
  void Stop() {
    if (process_) process_->Stop(SIGTERM, std::chrono::seconds{5});
    process_.reset();
  }

 private:
  std::string bucket_;
  int port_;
  std::string dir_;
  std::unique_ptr<ChildProcess> process_;
  bool ready_ = false;
};

}  // namespace outbox::testing
