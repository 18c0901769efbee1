#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace warren {
namespace {

namespace fs = std::filesystem;

TEST(FileUtil, ReadWriteAndRemoveTree) {
  char tmpl[] = "/tmp/warren-fileutil-XXXXXX";
  const std::string root = ::mkdtemp(tmpl);
  const std::string f = root + "/a/b/f";
  fs::create_directories(root + "/a/b");
  std::ofstream(f) << "";
  ASSERT_TRUE(WriteFile(f, "hello").ok());
  auto r = ReadSmallFile(f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "hello");
  EXPECT_EQ(ReadSmallFile(f, 3).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadSmallFile(root + "/nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(WriteFile(root + "/nope", "x").code(), absl::StatusCode::kNotFound);  // never created
  int fd = ::open(f.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(WriteAll(fd, std::string(100000, 'z'), f).ok());
  ::close(fd);
  EXPECT_EQ(fs::file_size(f), 100000u);
  ASSERT_EQ(::symlink("/etc", (root + "/a/link").c_str()), 0);  // never followed
  EXPECT_TRUE(RemoveTree(root).ok());
  EXPECT_FALSE(fs::exists(root));
  EXPECT_TRUE(fs::exists("/etc/passwd"));
  EXPECT_TRUE(RemoveTree(root).ok());  // already gone
}

}  // namespace
}  // namespace warren
