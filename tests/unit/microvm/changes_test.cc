// The guest agent's export of its changes (src/guest/agent/changes.h) read
// back by the host's untrusted-archive path (image::ExtractTar): an upper
// dir with every kind of entry comes out in the layer format with its data,
// modes, owners, mtimes, xattrs, links, whiteouts and opaque dirs.
#include "guest/agent/changes.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "common/unique_fd.h"
#include "image/tar_extract.h"
#include "status_matchers.h"

namespace warren::guest {
namespace {

namespace fs = std::filesystem;

class ChangesTarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // On the build's disk: tmpfs lacks user.* xattrs before Linux 6.6.
    std::string tmpl = fs::current_path().string() + "/changes-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    up_ = root_ + "/upper";
    out_ = root_ + "/out";
    ASSERT_EQ(::mkdir(up_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(out_.c_str(), 0755), 0);
  }
  void TearDown() override { fs::remove_all(root_); }

  void Write(const std::string& rel, const std::string& data, mode_t mode = 0644) {
    std::ofstream(up_ + rel, std::ios::binary) << data;
    ASSERT_EQ(::chmod((up_ + rel).c_str(), mode), 0);
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static struct stat Lstat(const std::string& p) {
    struct stat st {};
    EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
    return st;
  }

  // The tar of up_ (reads of `chunk` bytes), extracted into out_.
  Status ExportAndExtract(size_t chunk = 65536) {
    UniqueFd upper(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSIGN_OR_RETURN(std::unique_ptr<runtime::FileReader> r, OpenChangesTar(upper.get(), ""));
    std::string tar;
    for (int i = 0; i < 1000000; ++i) {
      ASSIGN_OR_RETURN(std::string d, r->Read(chunk));
      if (d.empty()) break;
      EXPECT_LE(d.size(), chunk);
      tar += d;
    }
    EXPECT_EQ(tar.size() % 512, 0u);
    std::ofstream(root_ + "/changes.tar", std::ios::binary) << tar;
    return image::ExtractTar(root_ + "/changes.tar", out_);
  }

  std::string root_, up_, out_;
};

TEST_F(ChangesTarTest, EveryKindOfEntryComesBackInTheLayerFormat) {
  std::string big(300000, '\0');
  std::mt19937 rng(7);
  for (char& c : big) c = static_cast<char>(rng());
  Write("/big.bin", big, 0600);
  ASSERT_EQ(::link((up_ + "/big.bin").c_str(), (up_ + "/hard.bin").c_str()), 0);
  ASSERT_EQ(::mkdir((up_ + "/d").c_str(), 0750), 0);
  ASSERT_EQ(::lsetxattr((up_ + "/d").c_str(), "trusted.overlay.opaque", "y", 1, 0), 0);
  ASSERT_EQ(::lsetxattr((up_ + "/d").c_str(), "trusted.overlay.impure", "y", 1, 0), 0);
  Write("/d/f", std::string("a\0b", 3), 04750);
  ASSERT_EQ(::lchown((up_ + "/d/f").c_str(), 3000000, 5678), 0);
  ASSERT_EQ(::chmod((up_ + "/d/f").c_str(), 04750), 0);  // chown dropped setuid
  ASSERT_EQ(::lsetxattr((up_ + "/d/f").c_str(), "user.tag", "v\0x", 3, 0), 0);
  (void)::lsetxattr((up_ + "/d/f").c_str(), "security.evil", "1", 1, 0);  // refused by most file systems
  ASSERT_EQ(::symlink("../etc/passwd", (up_ + "/d/sym").c_str()), 0);
  ASSERT_EQ(::mknod((up_ + "/gone").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);
  ASSERT_EQ(::mknod((up_ + "/d/gone2").c_str(), S_IFCHR | 0, makedev(0, 0)), 0);
  ASSERT_EQ(::mkfifo((up_ + "/fifo").c_str(), 0640), 0);
  const std::string odd = std::string("n\nl\xff");
  Write("/" + odd, "odd");
  const std::string deep = "/" + std::string(200, 'x') + "/" + std::string(200, 'y');
  fs::create_directories(up_ + deep);
  Write(deep + "/f", "deep");
  timespec ts[2] = {{981173106, 123456789}, {981173106, 123456789}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (up_ + "/d/f").c_str(), ts, AT_SYMLINK_NOFOLLOW), 0);
  ASSERT_EQ(::utimensat(AT_FDCWD, (up_ + "/d").c_str(), ts, AT_SYMLINK_NOFOLLOW), 0);

  ASSERT_OK(ExportAndExtract(1000));  // odd chunk sizes split headers and data

  EXPECT_EQ(Read(out_ + "/big.bin"), big);
  struct stat a = Lstat(out_ + "/big.bin"), b = Lstat(out_ + "/hard.bin");
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(a.st_mode & 07777, 0600u);
  struct stat f = Lstat(out_ + "/d/f");
  EXPECT_EQ(Read(out_ + "/d/f"), std::string("a\0b", 3));
  EXPECT_EQ(f.st_mode & 07777, 04750u);
  EXPECT_EQ(f.st_uid, 3000000u);
  EXPECT_EQ(f.st_gid, 5678u);
  EXPECT_EQ(f.st_mtim.tv_sec, 981173106);
  EXPECT_EQ(f.st_mtim.tv_nsec, 123456789);
  char v[16];
  ASSERT_EQ(::lgetxattr((out_ + "/d/f").c_str(), "user.tag", v, sizeof v), 3);
  EXPECT_EQ(std::string(v, 3), std::string("v\0x", 3));
  EXPECT_LT(::lgetxattr((out_ + "/d/f").c_str(), "security.evil", v, sizeof v), 0);
  struct stat d = Lstat(out_ + "/d");
  EXPECT_EQ(d.st_mode & 07777, 0750u);
  EXPECT_EQ(d.st_mtim.tv_nsec, 123456789);
  ASSERT_EQ(::lgetxattr((out_ + "/d").c_str(), "trusted.overlay.opaque", v, sizeof v), 1);
  EXPECT_EQ(v[0], 'y');
  EXPECT_LT(::lgetxattr((out_ + "/d").c_str(), "trusted.overlay.impure", v, sizeof v), 0);
  EXPECT_FALSE(fs::exists(out_ + "/d/.wh..wh..opq"));
  EXPECT_EQ(fs::read_symlink(out_ + "/d/sym").string(), "../etc/passwd");
  for (const char* w : {"/gone", "/d/gone2"}) {
    struct stat st = Lstat(out_ + w);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << w;
    EXPECT_EQ(st.st_rdev, makedev(0, 0)) << w;
  }
  EXPECT_TRUE(S_ISFIFO(Lstat(out_ + "/fifo").st_mode));
  EXPECT_EQ(Read(out_ + "/" + odd), "odd");
  EXPECT_EQ(Read(out_ + deep + "/f"), "deep");
}

TEST_F(ChangesTarTest, AnEmptyUpperIsAnEmptyArchiveAndSocketsAreSkipped) {
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = up_ + "/sock";
  ASSERT_LT(path.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  ASSERT_EQ(::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  ASSERT_OK(ExportAndExtract());
  EXPECT_TRUE(fs::is_empty(out_));
}

TEST_F(ChangesTarTest, APathLongerThanALayerHoldsFailsNamingIt) {
  std::string p;
  // 15 names of 255 bytes: longer than the 3800 a layer holds below its
  // staging dir, still within PATH_MAX here.
  for (int i = 0; i < 15; ++i) p += "/" + std::string(255, static_cast<char>('a' + i));
  fs::create_directories(up_ + p);
  UniqueFd upper(::open(up_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<runtime::FileReader> r, OpenChangesTar(upper.get(), ""));
  StatusOr<std::string> d;
  for (int i = 0; i < 1000; ++i) {
    d = r->Read(65536);
    if (!d.ok() || d->empty()) break;
  }
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(d.status().message()).find("longer than"), std::string::npos) << d.status();
}

TEST_F(ChangesTarTest, WithoutAWritableLayerItIsFailedPrecondition) {
  EXPECT_EQ(OpenChangesTar(-1, "").status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace warren::guest
