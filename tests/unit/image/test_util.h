// Helpers shared by the image tests: temp dirs, files, tars, mountinfo.
#pragma once

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "image/erofs_layout.h"
#include "image/fs_util.h"

namespace warren::image::testing {

inline std::string MakeTempDir() {
  char tmpl[] = "/tmp/warren-image-test-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

// n pseudo-random bytes, the same for the same seed.
inline std::string RandomBytes(size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(g());
  return s;
}

// ReadErofsLayout's reader over an open file: pread, errors as Status.
inline ErofsReadFn PreadFn(int fd) {
  return [fd](uint64_t off, size_t len, char* buf) -> StatusOr<size_t> {
    const ssize_t n = pread(fd, buf, len, static_cast<off_t>(off));
    if (n < 0) return ErrnoToStatus(errno, "pread");
    return static_cast<size_t>(n);
  };
}

inline void WriteFile(const std::string& path, const std::string& data, mode_t mode = 0644) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  ASSERT_EQ(fchmod(fd, mode), 0);
  close(fd);
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string GetXattr(const std::string& path, const std::string& name) {
  char buf[4096];
  ssize_t n = lgetxattr(path.c_str(), name.c_str(), buf, sizeof(buf));
  if (n < 0) return "<" + std::string(strerror(errno)) + ">";
  return std::string(buf, static_cast<size_t>(n));
}

// Number of mounts whose mount point is exactly `path` (unescaped compare
// is enough: test paths have no spaces).
inline int CountMounts(const std::string& path) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string a, b, c, d, mnt;
    ls >> a >> b >> c >> d >> mnt;
    if (mnt == path) ++n;
  }
  return n;
}

// Number of mounts whose mount point is below `dir`.
inline int CountMountsUnder(const std::string& dir) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string a, b, c, d, mnt;
    ls >> a >> b >> c >> d >> mnt;
    if (mnt.rfind(dir + "/", 0) == 0) ++n;
  }
  return n;
}

inline std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(d);
  return out;
}

struct TarEntry {
  std::string path;
  mode_t type = AE_IFREG;
  mode_t perm = 0644;
  std::string data;
  std::string symlink;   // target, for AE_IFLNK
  std::string hardlink;  // link target path, makes this a hardlink entry
  int64_t uid = 0, gid = 0;
  int64_t mtime = 1000000000;
  std::vector<std::pair<std::string, std::string>> xattrs;
  dev_t rdev = 0;
};

// Writes a pax tar with the given compression ("none", "gzip", "xz", "zstd").
inline void WriteTar(const std::string& path, const std::vector<TarEntry>& entries,
                     const std::string& compression = "none") {
  archive* a = archive_write_new();
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(archive_write_set_format_pax(a), ARCHIVE_OK);
  if (compression == "gzip") {
    ASSERT_EQ(archive_write_add_filter_gzip(a), ARCHIVE_OK);
  } else if (compression == "xz") {
    ASSERT_EQ(archive_write_add_filter_xz(a), ARCHIVE_OK);
  } else if (compression == "zstd") {
    ASSERT_EQ(archive_write_add_filter_zstd(a), ARCHIVE_OK);
  }
  ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK);
  for (const TarEntry& t : entries) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, t.path.c_str());
    archive_entry_set_uid(e, t.uid);
    archive_entry_set_gid(e, t.gid);
    archive_entry_set_mtime(e, t.mtime, 0);
    if (!t.hardlink.empty()) {
      archive_entry_set_filetype(e, AE_IFREG);
      archive_entry_set_perm(e, t.perm);
      archive_entry_set_hardlink(e, t.hardlink.c_str());
      archive_entry_set_size(e, 0);
    } else {
      archive_entry_set_filetype(e, t.type);
      archive_entry_set_perm(e, t.perm);
      if (t.type == AE_IFLNK) archive_entry_set_symlink(e, t.symlink.c_str());
      if (t.type == AE_IFCHR || t.type == AE_IFBLK) archive_entry_set_rdev(e, t.rdev);
      archive_entry_set_size(e, t.type == AE_IFREG ? static_cast<la_int64_t>(t.data.size()) : 0);
    }
    for (const auto& [k, v] : t.xattrs) {
      archive_entry_xattr_add_entry(e, k.c_str(), v.data(), v.size());
    }
    ASSERT_EQ(archive_write_header(a, e), ARCHIVE_OK) << archive_error_string(a);
    if (t.type == AE_IFREG && t.hardlink.empty() && !t.data.empty()) {
      ASSERT_EQ(archive_write_data(a, t.data.data(), t.data.size()), static_cast<la_ssize_t>(t.data.size()));
    }
    archive_entry_free(e);
  }
  ASSERT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
}

}  // namespace warren::image::testing
