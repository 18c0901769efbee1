// image/oci: refs, index/manifest/config parsing, platform selection, and
// the image store over a real layer store (mkfs.erofs, root).
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
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
  StatusOr<LayerInfo> BuildFromTar(const std::string& name, const std::string& tar) override {
    ++builds;
    return s_->BuildFromTar(name, tar);
  }
  Status Remove(const std::string& ref) override { return s_->Remove(ref); }
  int builds = 0;

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

}  // namespace
}  // namespace warren::image::oci
