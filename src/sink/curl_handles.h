#pragma once
// RAII for libcurl's handles, and its one global initialisation: for the webhook sink and the
// claim check's S3 client, which link libcurl PRIVATE and include this from src/.

#include <curl/curl.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace outbox::curl {

struct MultiDeleter {
  void operator()(CURLM* multi) const { curl_multi_cleanup(multi); }
};
struct EasyDeleter {
  void operator()(CURL* easy) const { curl_easy_cleanup(easy); }
};
struct SlistDeleter {
  void operator()(curl_slist* list) const { curl_slist_free_all(list); }
};
struct UrlDeleter {
  void operator()(CURLU* url) const { curl_url_cleanup(url); }
};
struct CurlStringDeleter {
  void operator()(char* text) const { curl_free(text); }
};

using MultiPtr = std::unique_ptr<CURLM, MultiDeleter>;
using EasyPtr = std::unique_ptr<CURL, EasyDeleter>;
using SlistPtr = std::unique_ptr<curl_slist, SlistDeleter>;
using UrlPtr = std::unique_ptr<CURLU, UrlDeleter>;
using CurlString = std::unique_ptr<char, CurlStringDeleter>;

// curl_global_init, once per process, before the first handle (thread-safe: libcurl >= 7.84 is
// built "threadsafe" in Debian). Throws std::runtime_error when libcurl cannot start.
inline void InitCurlOnce() {
  static const CURLcode code = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (code != CURLE_OK) {
    throw std::runtime_error(std::string{"libcurl could not start: "} + curl_easy_strerror(code));
  }
}

}  // namespace outbox::curl
