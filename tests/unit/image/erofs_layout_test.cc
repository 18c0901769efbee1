// ReadErofsLayout on images mkfs.erofs built (through the layer store, as
// every layer is built), checked against the kernel's EROFS: an image whose
// bytes past metadata_end are zeroed still mounts with the whole tree (names,
// types, modes, sizes, links, xattrs) while file data reads as zeros.
#include "image/erofs_layout.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "image/erofs.h"
#include "image/fs_util.h"
#include "image/layer_store.h"
#include "status_matchers.h"
#include "test_util.h"

namespace warren::image {
namespace {

using ::warren::image::testing::MakeTempDir;
using ::warren::image::testing::PreadFn;
using ::warren::image::testing::RandomBytes;
using ::warren::image::testing::WriteFile;

// path -> "type mode size link xattr" for every entry below dirfd.
void Describe(int dirfd, const std::string& prefix, std::map<std::string, std::string>* out) {
  DIR* d = fdopendir(dup(dirfd));
  ASSERT_NE(d, nullptr);
  while (dirent* de = readdir(d)) {
    const std::string n = de->d_name;
    if (n == "." || n == "..") continue;
    struct stat st {};
    ASSERT_EQ(fstatat(dirfd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW), 0) << prefix + n;
    std::string line = std::to_string(st.st_mode) + " " + std::to_string(st.st_nlink);
    if (!S_ISDIR(st.st_mode)) line += " " + std::to_string(st.st_size);
    if (S_ISLNK(st.st_mode)) {
      char target[256];
      const ssize_t t = readlinkat(dirfd, n.c_str(), target, sizeof target);
      line += " -> " + std::string(target, t > 0 ? static_cast<size_t>(t) : 0);
    }
    if (S_ISREG(st.st_mode)) {
      const int fd = openat(dirfd, n.c_str(), O_RDONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      char v[64];
      const ssize_t x = fgetxattr(fd, "user.tag", v, sizeof v);
      if (x > 0) line += " user.tag=" + std::string(v, static_cast<size_t>(x));
      close(fd);
    }
    (*out)[prefix + n] = line;
    if (S_ISDIR(st.st_mode)) {
      const int sub = openat(dirfd, n.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      ASSERT_GE(sub, 0);
      Describe(sub, prefix + n + "/", out);
      close(sub);
    }
  }
  closedir(d);
}

class ErofsLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = MakeTempDir();
    auto s = LayerStore::Open(root_ + "/store");
    ASSERT_OK(s);
    store_ = *std::move(s);
    store_->set_chunked_layers(true);  // metadata first (warrend --chunked-layers)
    src_ = root_ + "/src";
    ASSERT_EQ(mkdir(src_.c_str(), 0755), 0);
    // Directories of several blocks, files of every size class, a hole,
    // links, an xattr, an empty directory.
    for (int d = 0; d < 3; ++d) {
      const std::string dir = src_ + "/d" + std::to_string(d);
      ASSERT_EQ(mkdir(dir.c_str(), 0750), 0);
      for (int i = 0; i < 150; ++i) {
        WriteFile(dir + "/a-rather-long-file-name-" + std::to_string(i), RandomBytes(static_cast<size_t>(i) * 61, i));
      }
    }
    big_ = RandomBytes(size_t{1} << 20, 99);
    WriteFile(src_ + "/big", big_);
    const int fd = open((src_ + "/sparse").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, "end", 3, off_t{64} << 20), 3);
    close(fd);
    ASSERT_EQ(symlink("d0/a-rather-long-file-name-7", (src_ + "/link").c_str()), 0);
    ASSERT_EQ(link((src_ + "/big").c_str(), (src_ + "/big.hard").c_str()), 0);
    ASSERT_EQ(setxattr((src_ + "/d1/a-rather-long-file-name-3").c_str(), "user.tag", "v1", 2, 0), 0);
    ASSERT_EQ(mkdir((src_ + "/empty").c_str(), 0700), 0);
  }
  void TearDown() override { EXPECT_OK(RemoveTree(root_)); }

  std::string root_, src_, big_;
  std::unique_ptr<LayerStore> store_;
};

TEST_F(ErofsLayoutTest, ALayersMetadataIsAPrefixThatHoldsTheWholeTree) {
  auto layer = store_->BuildFromDir("base/layout@1", src_);
  ASSERT_OK(layer);
  const std::string blob = store_->BlobPath(layer->digest);
  const int fd = open(blob.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  auto layout = ReadErofsLayout(PreadFn(fd), static_cast<uint64_t>(st.st_size));
  close(fd);
  ASSERT_OK(layout);
  EXPECT_EQ(layout->block_bytes, 4096u);
  EXPECT_EQ(layout->stray_metadata_bytes, 0u) << "chunk-based: all metadata comes first";
  EXPECT_EQ(layout->metadata_bytes, layout->metadata_end);
  EXPECT_EQ(layout->metadata_end % 4096, 0u);
  EXPECT_GT(layout->metadata_end, 4096u);
  EXPECT_LT(layout->metadata_end, static_cast<uint64_t>(st.st_size) / 4) << "the data is most of the image";
  // 450 + 3 dirs + big (its hard link is the same inode) + sparse + link + empty + the root.
  EXPECT_EQ(layout->inodes, 450u + 3 + 1 + 1 + 1 + 1 + 1);

  // The kernel agrees: with every byte past metadata_end zeroed, the tree
  // is whole and the data is gone.
  const std::string cut = root_ + "/cut.erofs";
  WriteFile(cut, testing::ReadFile(blob));
  const std::string zeros(static_cast<size_t>(st.st_size) - layout->metadata_end, '\0');
  const int w = open(cut.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(w, 0);
  ASSERT_EQ(pwrite(w, zeros.data(), zeros.size(), static_cast<off_t>(layout->metadata_end)),
            static_cast<ssize_t>(zeros.size()));
  close(w);
  auto mnt = MountErofs(cut);
  ASSERT_OK(mnt);
  const int img = openat(mnt->get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(img, 0);
  const int orig = open(src_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(orig, 0);
  std::map<std::string, std::string> want, got;
  Describe(orig, "", &want);
  Describe(img, "", &got);
  EXPECT_EQ(got.size(), 458u);
  EXPECT_EQ(got, want);
  const int bf = openat(img, "big", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(bf, 0);
  std::string data(big_.size(), 'x');
  ASSERT_EQ(pread(bf, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  EXPECT_EQ(data, std::string(big_.size(), '\0')) << "big's data lay past metadata_end";
  close(bf);
  close(img);
  close(orig);
}

TEST_F(ErofsLayoutTest, MalformedImagesAreClearErrors) {
  const std::string junk = root_ + "/junk";
  WriteFile(junk, RandomBytes(64 << 10, 5));
  int fd = open(junk.c_str(), O_RDONLY | O_CLOEXEC);
  auto bad = ReadErofsLayout(PreadFn(fd), 64 << 10);
  close(fd);
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_NE(bad.status().message().find("magic"), std::string::npos) << bad.status();

  auto layer = store_->BuildFromDir("base/layout@2", src_);
  ASSERT_OK(layer);
  fd = open(store_->BlobPath(layer->digest).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto tiny = ReadErofsLayout(PreadFn(fd), 100);
  EXPECT_TRUE(absl::IsInvalidArgument(tiny.status())) << tiny.status();
  // Cut inside the metadata: the walk names what lies past the end.
  auto cut = ReadErofsLayout(PreadFn(fd), 8192);
  EXPECT_TRUE(absl::IsInvalidArgument(cut.status())) << cut.status();
  EXPECT_NE(cut.status().message().find("past the image's end"), std::string::npos) << cut.status();
  // A read error is passed on as it is.
  auto eio = ReadErofsLayout(
      [](uint64_t, size_t, char*) -> StatusOr<size_t> { return absl::UnavailableError("store gone"); }, 1 << 20);
  EXPECT_TRUE(absl::IsUnavailable(eio.status())) << eio.status();
  close(fd);
}

}  // namespace
}  // namespace warren::image
