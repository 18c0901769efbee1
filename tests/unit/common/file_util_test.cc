#include "common/file_util.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "status_matchers.h"

namespace warren {
namespace {

namespace fs = std::filesystem;

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
    ASSERT_OK(WriteAll(fd.get(), data, path));
  }
  StatusOr<std::string> got = ReadSmallFile(path);
  ASSERT_OK(got);
  EXPECT_EQ(*got, data);
}

TEST_F(FileUtilTest, ReadSmallFileNamesTheFileAndKeepsErrno) {
  StatusOr<std::string> got = ReadSmallFile(root_ + "/missing");
  ASSERT_THAT(got, ::testing::Not(IsOk()));
  EXPECT_EQ(StatusErrno(got.status()), ENOENT);
  EXPECT_NE(got.status().message().find("open(" + root_ + "/missing)"), std::string::npos) << got.status();
}

TEST_F(FileUtilTest, ReadSmallFileRefusesAFileLongerThanTheMaximum) {
  const std::string path = root_ + "/big";
  {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_OK(WriteAll(fd.get(), std::string(100, 'x'), path));
  }
  StatusOr<std::string> got = ReadSmallFile(path, 99);
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_OK(ReadSmallFile(path, 100));
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
  ASSERT_OK(MkdirAll(deep, 0750));
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/a/b/c").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_OK(MkdirAll(deep, 0750));  // existing: fine
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

TEST(FileUtil, ReadWriteAndRemoveTree) {
  char tmpl[] = "/tmp/warren-fileutil-XXXXXX";
  const std::string root = ::mkdtemp(tmpl);
  const std::string f = root + "/a/b/f";
  fs::create_directories(root + "/a/b");
  std::ofstream(f) << "";
  ASSERT_OK(WriteFile(f, "hello"));
  auto r = ReadSmallFile(f);
  ASSERT_OK(r);
  EXPECT_EQ(*r, "hello");
  EXPECT_THAT(ReadSmallFile(f, 3), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(ReadSmallFile(root + "/nope"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(WriteFile(root + "/nope", "x"), StatusIs(absl::StatusCode::kNotFound));  // never created
  int fd = ::open(f.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_OK(WriteAll(fd, std::string(100000, 'z'), f));
  ::close(fd);
  EXPECT_EQ(fs::file_size(f), 100000u);
  ASSERT_EQ(::symlink("/etc", (root + "/a/link").c_str()), 0);  // never followed
  EXPECT_OK(RemoveTree(root));
  EXPECT_FALSE(fs::exists(root));
  EXPECT_TRUE(fs::exists("/etc/passwd"));
  EXPECT_OK(RemoveTree(root));  // already gone
}

}  // namespace
}  // namespace warren
