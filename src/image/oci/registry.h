// A client of the OCI distribution API (GET manifests and blobs) over
// libcurl: plain HTTP or HTTPS (system CAs or a CA file), basic auth, and the
// bearer token flow (a 401 with "WWW-Authenticate: Bearer realm=..." is
// answered by fetching a token from the realm, with the basic credentials if
// any, and retrying once).
//
// Errors: Unavailable (cannot connect, 5xx), DeadlineExceeded (no byte moved
// for stall_timeout_s), NotFound (404), Unauthenticated / PermissionDenied
// (401 / 403 after auth), DataLoss (a digest or size mismatch), Cancelled
// (the progress callback asked to stop). Each message names the URL.
// Not thread-safe (one client per pull).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "image/oci/digest.h"

namespace warren::image::oci {

struct ImageRef {
  std::string host;        // "host[:port]"
  std::string repository;  // "a/b"
  std::string tag;         // empty when digest is set
  std::string digest;      // "sha256:<hex>" or empty
  // "host/repository:tag" or "host/repository@digest".
  std::string ToString() const;
  // "host[:port]/repo[:tag]" or "host[:port]/repo@sha256:<hex>"; tag
  // default "latest". InvalidArgument naming the bad part.
  static StatusOr<ImageRef> Parse(std::string_view ref);
};

// localhost, 127.0.0.0/8, [::1] (with or without a port).
bool IsLoopbackHost(std::string_view host);

struct RegistryOptions {
  bool plain_http = false;
  std::string ca_file;
  std::string username;
  std::string password;
  std::string bearer_token;
  uint32_t stall_timeout_s = 30;
};

// Called with bytes received so far; returning false cancels the transfer.
using ProgressFn = std::function<bool(uint64_t done)>;

class RegistryClient {
 public:
  RegistryClient(std::string host, RegistryOptions options);

  struct Manifest {
    std::string body;
    std::string content_type;
    std::string digest;  // sha256 of body
  };
  // GET /v2/<repo>/manifests/<reference> (at most 4 MiB). If `reference`
  // is a digest, the body must hash to it (DataLoss otherwise).
  StatusOr<Manifest> GetManifest(std::string_view repo, std::string_view reference);
  // GET /v2/<repo>/blobs/<digest> into `out` (which hashes it); the caller
  // checks the digest with out->Finish.
  Status GetBlob(std::string_view repo, std::string_view digest, HashingFile* out, const ProgressFn& progress);
  // A small blob (config; at most 4 MiB) verified against `digest`.
  StatusOr<std::string> GetSmallBlob(std::string_view repo, std::string_view digest);

 private:
  struct Response;
  // One GET (with one auth retry). Body bytes go to `sink` for 2xx answers.
  Status Get(const std::string& url, const std::string& accept, const std::function<Status(std::string_view)>& sink,
             const ProgressFn& progress, bool bounded_time, Response* resp);
  Status GetOnce(const std::string& url, const std::string& accept, const std::string& auth,
                 const std::function<Status(std::string_view)>& sink, const ProgressFn& progress, bool bounded_time,
                 Response* resp);
  Status Authenticate(const std::string& challenge, const std::string& url);
  std::string BaseUrl() const;

  const std::string host_;
  const RegistryOptions options_;
  std::string auth_header_;  // "Authorization: ..." once known
};

}  // namespace warren::image::oci
