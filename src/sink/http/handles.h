#pragma once
// RAII for libcurl's handles, and its one global initialisation.

#include <curl/curl.h>

#include <memory>

namespace outbox::webhook {

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
void InitCurlOnce();

}  // namespace outbox::webhook
