// image/oci: refs, index/manifest/config parsing, platform selection, and
// the image store over a real layer store (mkfs.erofs, root).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/unique_fd.h"
#include "gtest/gtest.h"
#include "image/erofs.h"
#include "image/fs_util.h"
#include "image/layer_store.h"
#include "image/oci/digest.h"
#include "image/oci/image_store.h"
#include "image/oci/manifest.h"
#include "image/oci/registry.h"
#include "image/oci/source.h"
#include "status_matchers.h"
#include "test_util.h"

namespace warren::image::oci {
namespace {

using ::warren::image::testing::MakeTempDir;
using ::warren::image::testing::ReadFile;
using ::warren::image::testing::TarEntry;
using ::warren::image::testing::WriteFile;
using ::warren::image::testing::WriteTar;

TEST(ImageRefTest, ParsesHostRepoTagAndDigest) {
  ASSERT_OK_AND_ASSIGN(ImageRef r, ImageRef::Parse("127.0.0.1:5000/a/b:v1"));
  EXPECT_EQ(r.host, "127.0.0.1:5000");
  EXPECT_EQ(r.repository, "a/b");
  EXPECT_EQ(r.tag, "v1");
  ASSERT_OK_AND_ASSIGN(r, ImageRef::Parse("localhost/x"));
  EXPECT_EQ(r.tag, "latest");
  EXPECT_EQ(r.ToString(), "localhost/x:latest");
  const std::string d = "sha256:" + std::string(64, 'a');
  ASSERT_OK_AND_ASSIGN(r, ImageRef::Parse("reg.example:443/x@" + d));
  EXPECT_EQ(r.digest, d);
  EXPECT_TRUE(r.tag.empty());
  for (const char* bad : {"noslash", "/x:1", "h/UPPER", "h/x:", "h/x@sha256:12", "h/a//b", "h/x:t@g"}) {
    EXPECT_EQ(ImageRef::Parse(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ImageRefTest, Loopback) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1:5000"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost("[::1]:80"));
  EXPECT_FALSE(IsLoopbackHost("128.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("registry.example"));
}

Descriptor Entry(const std::string& platform, char fill) {
  return Descriptor{std::string(kOciManifest), "sha256:" + std::string(64, fill), 1, platform, ""};
}

TEST(ManifestTest, SelectsThePlatformAndNamesOthers) {
  std::vector<Descriptor> idx = {Entry("linux/arm64/v8", 'a'), Entry("linux/amd64", 'b')};
  ASSERT_OK_AND_ASSIGN(Descriptor d, SelectFromIndex(idx, "linux/amd64", ""));
  EXPECT_EQ(d.digest.back(), 'b');
  ASSERT_OK_AND_ASSIGN(d, SelectFromIndex(idx, "linux/arm64", ""));  // the variant is ignored
  EXPECT_EQ(d.digest.back(), 'a');
  Status s = SelectFromIndex({Entry("linux/arm64", 'a'), Entry("windows/amd64", 'c')}, "linux/amd64", "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("linux/arm64, windows/amd64"), std::string::npos) << s;
  // One entry without a platform: taken (the config is checked later).
  ASSERT_OK(SelectFromIndex({Entry("", 'e')}, "linux/amd64", "").status());
}

TEST(ManifestTest, ParsesAndRejects) {
  const std::string d = "sha256:" + std::string(64, '1');
  nlohmann::json m{
      {"schemaVersion", 2},
      {"mediaType", kOciManifest},
      {"config", {{"mediaType", "x"}, {"digest", d}, {"size", 2}}},
      {"layers", {{{"mediaType", "application/vnd.oci.image.layer.v1.tar+gzip"}, {"digest", d}, {"size", 9}}}}};
  ASSERT_OK_AND_ASSIGN(bool index, IsIndex(m.dump(), ""));
  EXPECT_FALSE(index);
  ASSERT_OK_AND_ASSIGN(Manifest man, ParseManifest(m.dump()));
  ASSERT_EQ(man.layers.size(), 1u);
  EXPECT_EQ(man.layers[0].size, 9);
  m["layers"][0]["digest"] = "md5:00";
  Status s = ParseManifest(m.dump()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layers[0]"), std::string::npos) << s;
  EXPECT_FALSE(ParseManifest("[1]").ok());
  EXPECT_EQ(CheckLayerMediaType("application/vnd.oci.image.layer.v1.tar+encrypted", d).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_OK(CheckLayerMediaType("application/vnd.docker.image.rootfs.diff.tar.gzip", d));
}

TEST(ManifestTest, Config) {
  ASSERT_OK_AND_ASSIGN(ImageConfig c, ParseConfig(R"({"os":"linux","architecture":"amd64","config":{
      "Env":["A=1"],"WorkingDir":"/w","User":"1:2","Entrypoint":["/e"],"Cmd":["c"],
      "ExposedPorts":{"80/tcp":{}}}})"));
  EXPECT_EQ(c.env, std::vector<std::string>{"A=1"});
  EXPECT_EQ(c.workdir, "/w");
  EXPECT_EQ(c.user, "1:2");
  EXPECT_EQ(c.exposed_ports, std::vector<std::string>{"80/tcp"});
  ASSERT_OK(CheckConfigPlatform(c, "linux/amd64"));
  EXPECT_EQ(CheckConfigPlatform(c, "linux/arm64").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ImageStoreTest, NamesAndRecords) {
  ASSERT_OK_AND_ASSIGN(std::string n, ImageStore::NormalizeName("reg:5000/a/b"));
  EXPECT_EQ(n, "reg:5000/a/b:latest");
  ASSERT_OK_AND_ASSIGN(n, ImageStore::NormalizeName("a/b:v1"));
  EXPECT_EQ(n, "a/b:v1");
  for (const char* bad : {"", "a/../b", "/a", "a b", "-a"}) {
    EXPECT_FALSE(ImageStore::NormalizeName(bad).ok()) << bad;
  }
  ImageRecord r{"a:1", "sha256:x", "src", 5, {{"sha256:o", "sha256:l", "base/oci-sha256@o", 7}}, {}};
  r.config.env = {"A=1"};
  ASSERT_OK_AND_ASSIGN(ImageRecord back, RecordFromJson(RecordToJson(r)));
  EXPECT_EQ(back.layers[0].layer_name, "base/oci-sha256@o");
  EXPECT_EQ(back.config.env, r.config.env);
}

TEST(DigestTest, HashingFileRemovesAMismatch) {
  std::string dir = MakeTempDir();
  const std::string path = dir + "/f";
  {
    ASSERT_OK_AND_ASSIGN(auto f, HashingFile::Create(path));
    ASSERT_OK(f->Write("hello"));
    Status s = f->Finish("sha256:" + std::string(64, '0'), 5, "blob");
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("sha256:" + Sha256Hex("hello")), std::string::npos) << s;
  }
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  rmdir(dir.c_str());
}

// The image store over a real layer store, fed by an OCI layout written here.
class StoreBackend final : public LayerBackend {
 public:
  explicit StoreBackend(LayerStore* s) : s_(s) {}
  StatusOr<LayerInfo> Resolve(const std::string& ref) const override { return s_->Resolve(ref); }
  StatusOr<LayerInfo> BuildFromTar(const std::string& name, const std::string& tar,
                                   const TarProgressFn& progress) override {
    ++builds;
    return s_->BuildFromTar(name, tar, progress);
  }
  StatusOr<LayerInfo> BuildMerged(const std::string& name, const std::vector<std::string>& digests) override {
    ++merges;
    return s_->BuildMerged(name, digests);
  }
  Status Remove(const std::string& ref) override { return s_->Remove(ref); }
  std::vector<LayerInfo> List() const override { return s_->List(); }
  int builds = 0;
  int merges = 0;

 private:
  LayerStore* s_;
};

class LayoutWriter {
 public:
  explicit LayoutWriter(std::string dir) : dir_(std::move(dir)) {
    mkdir(dir_.c_str(), 0755);
    mkdir((dir_ + "/blobs").c_str(), 0755);
    mkdir((dir_ + "/blobs/sha256").c_str(), 0755);
  }
  nlohmann::json Blob(const std::string& data, const std::string& media_type) {
    const std::string hex = Sha256Hex(data);
    WriteFile(dir_ + "/blobs/sha256/" + hex, data);
    return {{"mediaType", media_type}, {"digest", "sha256:" + hex}, {"size", data.size()}};
  }
  // An image of the given layer tars, named `name` in index.json.
  void Image(const std::string& name, const std::vector<std::string>& tars) {
    nlohmann::json layers = nlohmann::json::array();
    for (const std::string& t : tars) layers.push_back(Blob(ReadFile(t), "application/vnd.oci.image.layer.v1.tar"));
    nlohmann::json cfg = Blob(R"({"os":"linux","architecture":"amd64","config":{"Env":["X=1"]}})",
                              "application/vnd.oci.image.config.v1+json");
    nlohmann::json man = Blob(nlohmann::json{{"schemaVersion", 2}, {"config", cfg}, {"layers", layers}}.dump(),
                              std::string(kOciManifest));
    man["annotations"] = {{"org.opencontainers.image.ref.name", name}};
    index_["manifests"].push_back(man);
    WriteFile(dir_ + "/index.json", index_.dump());
  }

 private:
  std::string dir_;
  nlohmann::json index_{{"schemaVersion", 2}, {"manifests", nlohmann::json::array()}};
};

TEST(ImageStoreTest, SharedLayerConvertedOnceAndTamperLeavesNothing) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (mounts EROFS to verify builds)";
  std::string dir = MakeTempDir();
  ASSERT_OK_AND_ASSIGN(auto layers, LayerStore::Open(dir + "/store"));
  StoreBackend backend(layers.get());
  ASSERT_OK_AND_ASSIGN(auto images, ImageStore::Open(dir + "/store/images", dir + "/store/tmp", &backend));
  WriteTar(dir + "/l1.tar", {TarEntry{.path = "a", .data = "1"}});
  WriteTar(dir + "/l2.tar", {TarEntry{.path = "b", .data = "2"}});
  WriteTar(dir + "/l3.tar", {TarEntry{.path = "c", .data = "3"}});
  LayoutWriter w(dir + "/oci");
  w.Image("one", {dir + "/l1.tar", dir + "/l2.tar"});
  w.Image("two", {dir + "/l1.tar", dir + "/l3.tar"});

  ASSERT_OK_AND_ASSIGN(auto src1, NewLayoutSource(dir + "/oci", "one"));
  ASSERT_OK_AND_ASSIGN(ImageRecord one, images->Add(*src1, "img:one", "", nullptr));
  EXPECT_EQ(backend.builds, 2);
  EXPECT_EQ(one.config.env, std::vector<std::string>{"X=1"});
  std::vector<std::string> phases;
  ASSERT_OK_AND_ASSIGN(auto src2, NewLayoutSource(dir + "/oci", "two"));
  ASSERT_OK_AND_ASSIGN(ImageRecord two, images->Add(*src2, "img:two", "", [&](const PullProgress& p) {
    if (p.phase == "exists" || p.phase == "done") phases.push_back(p.phase);
    return true;
  }));
  EXPECT_EQ(backend.builds, 3);  // l1 was not converted again
  EXPECT_EQ(phases, (std::vector<std::string>{"exists", "done"}));
  EXPECT_EQ(two.layers[0].layer_digest, one.layers[0].layer_digest);

  // Removing "two" keeps l1 (used by "one") and drops l3.
  ASSERT_OK(images->Remove("img:two", [](const std::string&) { return false; }));
  EXPECT_TRUE(layers->Resolve(two.layers[0].layer_name).ok());
  EXPECT_EQ(layers->Resolve(two.layers[1].layer_name).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(images->Remove("img:one", [](const std::string&) { return true; }).code(),
            absl::StatusCode::kFailedPrecondition);

  // A tampered second layer: DataLoss, and the first layer this add built is removed again.
  WriteTar(dir + "/l4.tar", {TarEntry{.path = "d", .data = "4"}});
  WriteTar(dir + "/l5.tar", {TarEntry{.path = "e", .data = "5"}});
  w.Image("bad", {dir + "/l4.tar", dir + "/l5.tar"});
  WriteFile(dir + "/oci/blobs/sha256/" + Sha256Hex(ReadFile(dir + "/l5.tar")), ReadFile(dir + "/l3.tar"));
  const size_t before = layers->List().size();
  ASSERT_OK_AND_ASSIGN(auto src3, NewLayoutSource(dir + "/oci", "bad"));
  Status s = images->Add(*src3, "img:bad", "", nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(layers->List().size(), before);
  EXPECT_EQ(images->List().size(), 1u);
  EXPECT_EQ(testing::ListDir(dir + "/store/tmp"), std::vector<std::string>{});
  ASSERT_OK(RemoveTree(dir));
}

// Mounts a layer of the store and returns the fd of its root (the mount goes
// away with the fd's mount fd, kept in `mnt`).
UniqueFd OpenLayerRoot(LayerStore* layers, const std::string& digest, UniqueFd* mnt) {
  StatusOr<UniqueFd> m = MountErofs(layers->BlobPath(digest));
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return UniqueFd();
  *mnt = std::move(*m);
  return UniqueFd(openat(mnt->get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
}

std::string ReadAt(int dir, const std::string& path) {
  UniqueFd f(openat(dir, path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!f.valid()) return "<" + std::string(strerror(errno)) + ">";
  std::string out(4096, '\0');
  ssize_t n = read(f.get(), out.data(), out.size());
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

bool Exists(int dir, const std::string& path) {
  struct stat st;
  return fstatat(dir, path.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

TEST(ImageStoreTest, MergeAppliesWhiteoutsAndOpaqueDirsAndIsSharedByChain) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (mounts EROFS and overlayfs)";
  std::string dir = MakeTempDir();
  ASSERT_OK_AND_ASSIGN(auto layers, LayerStore::Open(dir + "/store"));
  StoreBackend backend(layers.get());
  ASSERT_OK_AND_ASSIGN(auto images, ImageStore::Open(dir + "/store/images", dir + "/store/tmp", &backend));
  WriteTar(dir + "/l1.tar",
           {TarEntry{.path = "d", .type = AE_IFDIR, .perm = 0755}, TarEntry{.path = "d/a", .data = "a1"},
            TarEntry{.path = "d/keep", .data = "k"}, TarEntry{.path = "h1", .data = "h"},
            TarEntry{.path = "h2", .hardlink = "h1"}, TarEntry{.path = "opq", .type = AE_IFDIR, .perm = 0755},
            TarEntry{.path = "opq/x", .data = "x"}, TarEntry{.path = "gone", .data = "g"},
            TarEntry{.path = "xa", .data = "v", .xattrs = {{"user.k", "v1"}}},
            TarEntry{.path = "suid", .perm = 04755, .data = "s", .uid = 1000, .gid = 1000}});
  WriteTar(dir + "/l2.tar", {TarEntry{.path = ".wh.gone"}, TarEntry{.path = "opq", .type = AE_IFDIR, .perm = 0700},
                             TarEntry{.path = "opq/.wh..wh..opq"}, TarEntry{.path = "opq/y", .data = "y"},
                             TarEntry{.path = "d/a", .data = "a2"}});
  WriteTar(dir + "/l3.tar", {TarEntry{.path = "top", .data = "t"}});
  WriteTar(dir + "/l4.tar", {TarEntry{.path = "top", .data = "other"}});
  LayoutWriter w(dir + "/oci");
  w.Image("one", {dir + "/l1.tar", dir + "/l2.tar", dir + "/l3.tar"});
  w.Image("two", {dir + "/l1.tar", dir + "/l2.tar", dir + "/l4.tar"});
  w.Image("single", {dir + "/l1.tar"});
  ASSERT_OK_AND_ASSIGN(auto src1, NewLayoutSource(dir + "/oci", "one"));
  ASSERT_OK_AND_ASSIGN(ImageRecord one, images->Add(*src1, "img:one", "", nullptr));
  EXPECT_EQ(one.Stack().size(), 3u);

  // Over the cap: refused, nothing built.
  EXPECT_EQ(images->Merge("img:one", false, 1, nullptr).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend.merges, 0);
  ASSERT_OK_AND_ASSIGN(ImageRecord merged, images->Merge("img:one", false, 0, nullptr));
  EXPECT_EQ(backend.merges, 1);
  EXPECT_EQ(merged.merged_count, 2u);
  EXPECT_EQ(merged.merged.layer_name.rfind("base/oci-chain@", 0), 0u) << merged.merged.layer_name;
  ASSERT_EQ(merged.Stack().size(), 2u);
  EXPECT_EQ(merged.Stack()[0].layer_name, merged.merged.layer_name);
  EXPECT_EQ(merged.Stack()[1].layer_name, one.layers[2].layer_name);  // the top stays its own layer
  ASSERT_OK_AND_ASSIGN(ImageRecord got, images->Get("img:one"));
  EXPECT_EQ(got.merged_count, 2u);
  EXPECT_EQ(got.merged.layer_digest, merged.merged.layer_digest);

  {
    UniqueFd mnt;
    UniqueFd root = OpenLayerRoot(layers.get(), merged.merged.layer_digest, &mnt);
    ASSERT_TRUE(root.valid());
    // The whiteout and the opaque dir are applied, not copied.
    EXPECT_FALSE(Exists(root.get(), "gone"));
    EXPECT_FALSE(Exists(root.get(), ".wh.gone"));
    EXPECT_FALSE(Exists(root.get(), "opq/x"));
    EXPECT_FALSE(Exists(root.get(), "opq/.wh..wh..opq"));
    EXPECT_EQ(ReadAt(root.get(), "opq/y"), "y");
    EXPECT_EQ(ReadAt(root.get(), "d/a"), "a2");
    EXPECT_EQ(ReadAt(root.get(), "d/keep"), "k");
    EXPECT_FALSE(Exists(root.get(), "top"));
    struct stat a, b, opq, su;
    ASSERT_EQ(fstatat(root.get(), "h1", &a, AT_SYMLINK_NOFOLLOW), 0);
    ASSERT_EQ(fstatat(root.get(), "h2", &b, AT_SYMLINK_NOFOLLOW), 0);
    EXPECT_EQ(a.st_ino, b.st_ino);  // still one inode
    ASSERT_EQ(fstatat(root.get(), "opq", &opq, AT_SYMLINK_NOFOLLOW), 0);
    EXPECT_EQ(opq.st_mode & 07777, 0700u);  // the upper dir's mode
    char v[16] = {};
    UniqueFd xa(openat(root.get(), "xa", O_RDONLY | O_CLOEXEC));
    EXPECT_EQ(fgetxattr(xa.get(), "user.k", v, sizeof(v)), 2);
    EXPECT_STREQ(v, "v1");
    EXPECT_LT(fgetxattr(xa.get(), "trusted.overlay.opaque", v, sizeof(v)), 0);
    ASSERT_EQ(fstatat(root.get(), "suid", &su, AT_SYMLINK_NOFOLLOW), 0);
    EXPECT_EQ(su.st_mode & 07777, 04755u);
    EXPECT_EQ(su.st_uid, 1000u);
  }

  // Again: nothing to do. "two" has the same lower layers: the same merged layer, not built again.
  ASSERT_OK(images->Merge("img:one", false, 0, nullptr).status());
  ASSERT_OK_AND_ASSIGN(auto src2, NewLayoutSource(dir + "/oci", "two"));
  ASSERT_OK(images->Add(*src2, "img:two", "", nullptr).status());
  ASSERT_OK_AND_ASSIGN(ImageRecord two, images->Merge("img:two", false, 0, nullptr));
  EXPECT_EQ(backend.merges, 1);
  EXPECT_EQ(two.merged.layer_digest, merged.merged.layer_digest);
  // A one-layer image has nothing to merge.
  ASSERT_OK_AND_ASSIGN(auto src3, NewLayoutSource(dir + "/oci", "single"));
  ASSERT_OK(images->Add(*src3, "img:single", "", nullptr).status());
  EXPECT_EQ(images->Merge("img:single", true, 0, nullptr).status().code(), absl::StatusCode::kFailedPrecondition);

  // The merged layer goes with the last image listing it.
  auto unused = [](const std::string&) { return false; };
  ASSERT_OK(images->Remove("img:one", unused));
  EXPECT_TRUE(layers->Resolve(merged.merged.layer_name).ok());
  ASSERT_OK(images->Remove("img:two", unused));
  EXPECT_EQ(layers->Resolve(merged.merged.layer_name).status().code(), absl::StatusCode::kNotFound);
  ASSERT_OK(images->Remove("img:single", unused));
  EXPECT_EQ(layers->List().size(), 0u);
  ASSERT_OK(RemoveTree(dir));
}

// Blocks LayerFile of one digest until opened, telling when it got there.
class GatedSource final : public ImageSource {
 public:
  GatedSource(std::unique_ptr<ImageSource> inner, std::string digest)
      : inner_(std::move(inner)), digest_(std::move(digest)) {}
  StatusOr<ResolvedImage> Resolve(const std::string& p) override { return inner_->Resolve(p); }
  StatusOr<std::string> LayerFile(const Descriptor& d, const std::string& scratch, const ProgressFn& pr) override {
    if (d.digest == digest_) {
      std::unique_lock<std::mutex> lock(mu_);
      arrived_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return open_; });
    }
    return inner_->LayerFile(d, scratch, pr);
  }
  std::string Describe() const override { return inner_->Describe(); }
  void WaitArrived() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return arrived_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::unique_ptr<ImageSource> inner_;
  std::string digest_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool arrived_ = false, open_ = false;
};

TEST(ImageStoreTest, RollbackKeepsALayerAConcurrentPullFound) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (mounts EROFS to verify builds)";
  std::string dir = MakeTempDir();
  ASSERT_OK_AND_ASSIGN(auto layers, LayerStore::Open(dir + "/store"));
  StoreBackend backend(layers.get());
  ASSERT_OK_AND_ASSIGN(auto images, ImageStore::Open(dir + "/store/images", dir + "/store/tmp", &backend));
  WriteTar(dir + "/l1.tar", {TarEntry{.path = "shared", .data = "1"}});
  WriteTar(dir + "/l2.tar", {TarEntry{.path = "good", .data = "2"}});
  WriteTar(dir + "/l5.tar", {TarEntry{.path = "bad", .data = "5"}});
  LayoutWriter w(dir + "/oci");
  w.Image("bad", {dir + "/l1.tar", dir + "/l5.tar"});
  w.Image("good", {dir + "/l1.tar", dir + "/l2.tar"});
  // Tamper with l5's blob: "bad" fails on its second layer and rolls back.
  WriteFile(dir + "/oci/blobs/sha256/" + Sha256Hex(ReadFile(dir + "/l5.tar")), ReadFile(dir + "/l2.tar"));
  const std::string l1 = "sha256:" + Sha256Hex(ReadFile(dir + "/l1.tar"));
  const std::string l2 = "sha256:" + Sha256Hex(ReadFile(dir + "/l2.tar"));
  const std::string l5 = "sha256:" + Sha256Hex(ReadFile(dir + "/l5.tar"));

  ASSERT_OK_AND_ASSIGN(auto bad_inner, NewLayoutSource(dir + "/oci", "bad"));
  GatedSource bad(std::move(bad_inner), l5);
  ASSERT_OK_AND_ASSIGN(auto good_inner, NewLayoutSource(dir + "/oci", "good"));
  GatedSource good(std::move(good_inner), l2);
  Status bad_status;
  std::thread a([&] { bad_status = images->Add(bad, "img:bad", "", nullptr).status(); });
  bad.WaitArrived();  // "bad" converted l1 and now fetches l5
  StatusOr<ImageRecord> good_rec = absl::UnknownError("unset");
  std::thread b([&] { good_rec = images->Add(good, "img:good", "", nullptr); });
  good.WaitArrived();  // "good" found l1 (converted by "bad") and now fetches l2
  bad.Open();
  a.join();
  EXPECT_EQ(bad_status.code(), absl::StatusCode::kDataLoss) << bad_status;
  good.Open();
  b.join();
  ASSERT_OK(good_rec.status());
  EXPECT_EQ(backend.builds, 2);  // l1 once, l2
  // "good"'s layers are all there: the rollback left l1 to it.
  for (const ImageLayerRef& l : good_rec->layers) EXPECT_OK(layers->Resolve(l.layer_name).status()) << l.layer_name;
  EXPECT_EQ(layers->Resolve(ImageStore::LayerNameFor(l5)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(good_rec->layers[0].oci_digest, l1);
  ASSERT_OK(RemoveTree(dir));
}

TEST(ImageStoreTest, RemoveDuringACreateKeepsTheLayersUntilGc) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (mounts EROFS to verify builds)";
  std::string dir = MakeTempDir();
  ASSERT_OK_AND_ASSIGN(auto layers, LayerStore::Open(dir + "/store"));
  StoreBackend backend(layers.get());
  ASSERT_OK_AND_ASSIGN(auto images, ImageStore::Open(dir + "/store/images", dir + "/store/tmp", &backend));
  WriteTar(dir + "/l1.tar", {TarEntry{.path = "a", .data = "1"}});
  WriteTar(dir + "/l2.tar", {TarEntry{.path = "b", .data = "2"}});
  LayoutWriter w(dir + "/oci");
  w.Image("one", {dir + "/l1.tar", dir + "/l2.tar"});
  w.Image("two", {dir + "/l1.tar"});
  ASSERT_OK_AND_ASSIGN(auto src, NewLayoutSource(dir + "/oci", "one"));
  ASSERT_OK_AND_ASSIGN(ImageRecord one, images->Add(*src, "img:one", "", nullptr));
  ASSERT_OK_AND_ASSIGN(auto src2, NewLayoutSource(dir + "/oci", "two"));
  ASSERT_OK(images->Add(*src2, "img:two", "", nullptr).status());
  auto unused = [](const std::string&) { return false; };
  ASSERT_OK_AND_ASSIGN(ImageStore::GcResult none, images->CollectGarbage(unused));
  EXPECT_TRUE(none.removed.empty());

  {
    // A create resolved "one" and has not mounted its layers yet: the
    // image goes, its layers stay for the create.
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ImageUse> use, images->Use("img:one"));
    ASSERT_OK(images->Remove("img:one", unused));
    EXPECT_EQ(images->Get("img:one").status().code(), absl::StatusCode::kNotFound);
    for (const ImageLayerRef& l : use->record().Stack()) EXPECT_OK(layers->Resolve(l.layer_name).status());
    ASSERT_OK_AND_ASSIGN(ImageStore::GcResult held, images->CollectGarbage(unused));
    EXPECT_TRUE(held.removed.empty());
  }
  // The create is done and a sandbox uses l2: still kept.
  const std::string l2_digest = one.layers[1].layer_digest;
  ASSERT_OK_AND_ASSIGN(ImageStore::GcResult used,
                       images->CollectGarbage([&](const std::string& d) { return d == l2_digest; }));
  EXPECT_TRUE(used.removed.empty());
  // The sandbox is gone: l2 is reclaimed, l1 stays ("two" lists it).
  ASSERT_OK_AND_ASSIGN(ImageStore::GcResult gc, images->CollectGarbage(unused));
  EXPECT_EQ(gc.removed, std::vector<std::string>{one.layers[1].layer_name});
  EXPECT_EQ(gc.bytes, one.layers[1].size_bytes);
  EXPECT_OK(layers->Resolve(one.layers[0].layer_name).status());
  EXPECT_EQ(layers->Resolve(one.layers[1].layer_name).status().code(), absl::StatusCode::kNotFound);
  ASSERT_OK(RemoveTree(dir));
}

}  // namespace
}  // namespace warren::image::oci
