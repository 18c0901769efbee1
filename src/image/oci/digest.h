// OCI content digests ("sha256:<64 lower-case hex>") and a file sink that
// hashes what it writes, so a blob is verified while it streams in.
#pragma once

#include <openssl/evp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/unique_fd.h"

namespace warren::image::oci {

// InvalidArgument naming `what` unless `digest` is "sha256:<64 hex>" (the
// only algorithm accepted).
Status CheckDigest(std::string_view digest, std::string_view what);
// The hex part of a checked digest.
std::string DigestHex(std::string_view digest);
std::string Sha256Hex(std::string_view data);

// Writes bytes to a new file (O_EXCL, 0600) while hashing them. Not
// thread-safe. The file is removed on destruction unless Keep() was called.
class HashingFile {
 public:
  static StatusOr<std::unique_ptr<HashingFile>> Create(const std::string& path);
  ~HashingFile();
  Status Write(std::string_view data);
  uint64_t size() const { return size_; }
  // Closes the file and checks size (if expected_size >= 0) and digest.
  // DataLoss naming `what`, both digests, and removes the file on mismatch.
  Status Finish(std::string_view expected_digest, int64_t expected_size, std::string_view what);
  void Keep() { keep_ = true; }
  const std::string& path() const { return path_; }

 private:
  HashingFile(std::string path, UniqueFd fd, EVP_MD_CTX* ctx) : path_(std::move(path)), fd_(std::move(fd)), ctx_(ctx) {}
  std::string path_;
  UniqueFd fd_;
  EVP_MD_CTX* ctx_;
  uint64_t size_ = 0;
  bool keep_ = false;
};

// Checks that the file at `path` has `digest` (and `size` if >= 0), reading
// it once. DataLoss naming `what` otherwise.
Status VerifyFile(const std::string& path, std::string_view digest, int64_t size, std::string_view what);

// Removes a path when destroyed unless released.
class UnlinkGuard {
 public:
  explicit UnlinkGuard(std::string path) : path_(std::move(path)) {}
  ~UnlinkGuard();
  UnlinkGuard(const UnlinkGuard&) = delete;
  UnlinkGuard& operator=(const UnlinkGuard&) = delete;
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

}  // namespace warren::image::oci
