#include "common/file_util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/unique_fd.h"

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

class FileUtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warren-file-util-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_F(FileUtilTest, WriteAllThenReadSmallFileRoundTrips) {
  const std::string path = root_ + "/f";
  std::string data(3 << 16, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 13);
  {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(WriteAll(fd.get(), data, path).ok());
  }
  StatusOr<std::string> got = ReadSmallFile(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, data);
}

TEST_F(FileUtilTest, ReadSmallFileNamesTheFileAndKeepsErrno) {
  StatusOr<std::string> got = ReadSmallFile(root_ + "/missing");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(StatusErrno(got.status()), ENOENT);
  EXPECT_NE(got.status().message().find("open(" + root_ + "/missing)"), std::string::npos) << got.status();
}

TEST_F(FileUtilTest, ReadSmallFileRefusesAFileLongerThanTheMaximum) {
  const std::string path = root_ + "/big";
  {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_TRUE(WriteAll(fd.get(), std::string(100, 'x'), path).ok());
  }
  StatusOr<std::string> got = ReadSmallFile(path, 99);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();
  EXPECT_TRUE(ReadSmallFile(path, 100).ok());
}

TEST_F(FileUtilTest, WriteAllNamesWhatFailed) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  UniqueFd r(p[0]), w(p[1]);
  r.reset();
  signal(SIGPIPE, SIG_IGN);
  Status s = WriteAll(w.get(), "x", "the pipe");
  EXPECT_EQ(StatusErrno(s), EPIPE);
  EXPECT_NE(s.message().find("write(the pipe)"), std::string::npos) << s;
}

TEST_F(FileUtilTest, MkdirAllMakesEveryMissingParent) {
  const std::string deep = root_ + "/a/b//c/";
  ASSERT_TRUE(MkdirAll(deep, 0750).ok());
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/a/b/c").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_TRUE(MkdirAll(deep, 0750).ok());  // existing: fine
  const std::string file = root_ + "/file";
  UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  Status s = MkdirAll(file + "/x", 0750);
  EXPECT_EQ(StatusErrno(s), ENOTDIR) << s;
}

TEST(DirnameTest, Cases) {
  EXPECT_EQ(Dirname("/a/b"), "/a");
  EXPECT_EQ(Dirname("/a"), "/");
  EXPECT_EQ(Dirname("a"), ".");
  EXPECT_EQ(Dirname("a/b"), "a");
}

}  // namespace
}  // namespace warren
