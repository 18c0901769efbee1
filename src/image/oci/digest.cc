#include "image/oci/digest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/file_util.h"
#include "image/fs_util.h"

namespace warren::image::oci {
namespace {

constexpr std::string_view kSha256 = "sha256:";

std::string Hex(const unsigned char* md, unsigned int n) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * static_cast<size_t>(n));
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

}  // namespace

Status CheckDigest(std::string_view digest, std::string_view what) {
  bool ok = digest.size() == kSha256.size() + 64 && digest.substr(0, kSha256.size()) == kSha256;
  for (size_t i = kSha256.size(); ok && i < digest.size(); ++i) {
    char c = digest[i];
    ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  }
  if (!ok) {
    return absl::InvalidArgumentError(std::string(what) + ": digest \"" + std::string(digest.substr(0, 100)) +
                                      "\" is not sha256:<64 lower-case hex>");
  }
  return absl::OkStatus();
}

std::string DigestHex(std::string_view digest) { return std::string(digest.substr(kSha256.size())); }

std::string Sha256Hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_sha256(), nullptr);
  return Hex(md, n);
}

StatusOr<std::unique_ptr<HashingFile>> HashingFile::Create(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ", O_CREAT|O_EXCL)");
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  if (ctx == nullptr || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx);
    ::unlink(path.c_str());
    return absl::InternalError("EVP_DigestInit_ex(sha256) failed");
  }
  return std::unique_ptr<HashingFile>(new HashingFile(path, std::move(fd), ctx));
}

HashingFile::~HashingFile() {
  EVP_MD_CTX_free(ctx_);
  fd_.reset();
  if (!keep_) ::unlink(path_.c_str());
}

Status HashingFile::Write(std::string_view data) {
  EVP_DigestUpdate(ctx_, data.data(), data.size());
  size_ += data.size();
  return WriteAll(fd_.get(), data, path_);
}

Status HashingFile::Finish(std::string_view expected_digest, int64_t expected_size, std::string_view what) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx_, md, &n);
  if (::close(fd_.release()) != 0) return ErrnoToStatus(errno, "close(" + path_ + ")");
  const std::string got = "sha256:" + Hex(md, n);
  if (expected_size >= 0 && size_ != static_cast<uint64_t>(expected_size)) {
    return absl::DataLossError(std::string(what) + ": " + std::to_string(size_) +
                               " bytes received, the descriptor says " + std::to_string(expected_size));
  }
  if (got != expected_digest) {
    return absl::DataLossError(std::string(what) + ": digest mismatch: content has " + got + ", expected " +
                               std::string(expected_digest));
  }
  return absl::OkStatus();
}

Status VerifyFile(const std::string& path, std::string_view digest, int64_t size, std::string_view what) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat(" + path + ")");
  if (size >= 0 && st.st_size != size) {
    return absl::DataLossError(std::string(what) + ": " + std::to_string(st.st_size) +
                               " bytes on disk, the descriptor says " + std::to_string(size));
  }
  ASSIGN_OR_RETURN(std::string hex, Sha256File(path));
  if ("sha256:" + hex != digest) {
    return absl::DataLossError(std::string(what) + ": digest mismatch: content has sha256:" + hex + ", expected " +
                               std::string(digest));
  }
  return absl::OkStatus();
}

UnlinkGuard::~UnlinkGuard() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

}  // namespace warren::image::oci
