#include "image/oci/source.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/file_util.h"
#include "common/unique_fd.h"
#include "image/fs_util.h"

namespace warren::image::oci {
namespace {

constexpr int kMaxIndexDepth = 4;
constexpr size_t kMaxDocBytes = 4 << 20;

class RegistrySource final : public ImageSource {
 public:
  RegistrySource(ImageRef ref, RegistryOptions options)
      : ref_(std::move(ref)), client_(ref_.host, std::move(options)) {}

  StatusOr<ResolvedImage> Resolve(const std::string& platform) override {
    ResolvedImage out;
    out.default_name = ref_.ToString();
    std::string reference = ref_.digest.empty() ? ref_.tag : ref_.digest;
    for (int depth = 0;; ++depth) {
      if (depth == kMaxIndexDepth) return absl::InvalidArgumentError(Describe() + ": image indexes nested too deep");
      ASSIGN_OR_RETURN(RegistryClient::Manifest m, client_.GetManifest(ref_.repository, reference));
      ASSIGN_OR_RETURN(bool index, IsIndex(m.body, m.content_type));
      if (!index) {
        out.digest = m.digest;
        ASSIGN_OR_RETURN(out.manifest, ParseManifest(m.body));
        break;
      }
      ASSIGN_OR_RETURN(std::vector<Descriptor> entries, ParseIndex(m.body));
      ASSIGN_OR_RETURN(Descriptor d, SelectFromIndex(entries, platform, ""));
      reference = d.digest;
    }
    ASSIGN_OR_RETURN(std::string config, client_.GetSmallBlob(ref_.repository, out.manifest.config.digest));
    ASSIGN_OR_RETURN(out.config, ParseConfig(config));
    RETURN_IF_ERROR(CheckConfigPlatform(out.config, platform));
    return out;
  }

  StatusOr<std::string> LayerFile(const Descriptor& d, const std::string& scratch,
                                  const ProgressFn& progress) override {
    ASSIGN_OR_RETURN(std::unique_ptr<HashingFile> f, HashingFile::Create(scratch));
    RETURN_IF_ERROR(client_.GetBlob(ref_.repository, d.digest, f.get(), progress));
    RETURN_IF_ERROR(f->Finish(d.digest, d.size, "layer blob " + d.digest + " from " + Describe()));
    f->Keep();
    return scratch;
  }

  std::string Describe() const override { return "registry " + ref_.ToString(); }

 private:
  const ImageRef ref_;
  RegistryClient client_;
};

class LayoutSource final : public ImageSource {
 public:
  LayoutSource(std::string dir, std::string ref_name) : dir_(std::move(dir)), ref_name_(std::move(ref_name)) {}

  StatusOr<ResolvedImage> Resolve(const std::string& platform) override {
    ResolvedImage out;
    ASSIGN_OR_RETURN(std::string body, ReadSmallFile(dir_ + "/index.json", kMaxDocBytes));
    std::string ref_name = ref_name_;
    for (int depth = 0;; ++depth) {
      if (depth == kMaxIndexDepth) return absl::InvalidArgumentError(Describe() + ": image indexes nested too deep");
      ASSIGN_OR_RETURN(std::vector<Descriptor> entries, ParseIndex(body));
      ASSIGN_OR_RETURN(Descriptor d, SelectFromIndex(entries, platform, ref_name));
      if (depth == 0 && !d.ref_name.empty()) out.default_name = d.ref_name;
      ref_name.clear();  // names only select in the layout's own index.json
      ASSIGN_OR_RETURN(body, ReadBlob(d));
      ASSIGN_OR_RETURN(bool index, IsIndex(body, d.media_type));
      if (!index) {
        out.digest = d.digest;
        ASSIGN_OR_RETURN(out.manifest, ParseManifest(body));
        break;
      }
    }
    ASSIGN_OR_RETURN(std::string config, ReadBlob(out.manifest.config));
    ASSIGN_OR_RETURN(out.config, ParseConfig(config));
    RETURN_IF_ERROR(CheckConfigPlatform(out.config, platform));
    return out;
  }

  StatusOr<std::string> LayerFile(const Descriptor& d, const std::string&, const ProgressFn& progress) override {
    std::string path = BlobPath(d.digest);
    RETURN_IF_ERROR(VerifyFile(path, d.digest, d.size, "layer blob " + path));
    if (progress && !progress(static_cast<uint64_t>(d.size))) return absl::CancelledError("import cancelled");
    return path;
  }

  std::string Describe() const override { return "OCI layout " + dir_; }

 private:
  std::string BlobPath(const std::string& digest) const { return dir_ + "/blobs/sha256/" + DigestHex(digest); }
  StatusOr<std::string> ReadBlob(const Descriptor& d) {
    const std::string path = BlobPath(d.digest);
    ASSIGN_OR_RETURN(std::string body, ReadSmallFile(path, kMaxDocBytes));
    if ("sha256:" + Sha256Hex(body) != d.digest) {
      return absl::DataLossError("blob " + path + ": digest mismatch: content has sha256:" + Sha256Hex(body));
    }
    return body;
  }

  const std::string dir_;
  const std::string ref_name_;
};

// A member path of the archive, normalized: relative, no "." components,
// ".." resolved without climbing above the archive's root.
StatusOr<std::string> CleanMember(std::string_view p, std::string_view archive) {
  if (!p.empty() && p[0] == '/') {
    return absl::InvalidArgumentError("docker archive " + std::string(archive) + ": member \"" + std::string(p) +
                                      "\" is absolute");
  }
  std::vector<std::string> segs;
  size_t i = 0;
  while (i <= p.size()) {
    size_t j = p.find('/', i);
    if (j == std::string_view::npos) j = p.size();
    std::string_view seg = p.substr(i, j - i);
    if (seg == "..") {
      if (segs.empty()) {
        return absl::InvalidArgumentError("docker archive " + std::string(archive) + ": member \"" + std::string(p) +
                                          "\" climbs out with \"..\"");
      }
      segs.pop_back();
    } else if (!seg.empty() && seg != ".") {
      segs.emplace_back(seg);
    }
    i = j + 1;
  }
  std::string out;
  for (const std::string& s : segs) out += (out.empty() ? "" : "/") + s;
  return out;
}

class DockerArchiveSource final : public ImageSource {
 public:
  DockerArchiveSource(std::string path, std::string scratch) : path_(std::move(path)), scratch_(std::move(scratch)) {}
  ~DockerArchiveSource() override { (void)RemoveTree(scratch_); }

  Status Unpack() {
    if (::mkdir(scratch_.c_str(), 0700) != 0) return ErrnoToStatus(errno, "mkdir(" + scratch_ + ")");
    archive* a = archive_read_new();
    std::unique_ptr<archive, int (*)(archive*)> guard(a, archive_read_free);
    archive_read_support_filter_all(a);
    archive_read_support_format_tar(a);
    if (archive_read_open_filename(a, path_.c_str(), 1 << 20) != ARCHIVE_OK) {
      return absl::InvalidArgumentError("docker archive " + path_ + ": " + ArchiveError(a));
    }
    archive_entry* e = nullptr;
    int n = 0;
    for (;;) {
      int r = archive_read_next_header(a, &e);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK) return absl::InvalidArgumentError("docker archive " + path_ + ": " + ArchiveError(a));
      ASSIGN_OR_RETURN(std::string name, CleanMember(archive_entry_pathname(e), path_));
      const mode_t type = archive_entry_filetype(e);
      if (type == AE_IFLNK) {
        std::string target = archive_entry_symlink(e);
        std::string base = name.find('/') == std::string::npos ? "" : name.substr(0, name.rfind('/') + 1);
        ASSIGN_OR_RETURN(links_[name], CleanMember(base + target, path_));
        continue;
      }
      if (type != AE_IFREG || name.empty()) continue;  // directories are implied
      const std::string file = scratch_ + "/m" + std::to_string(n++);
      UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!fd.valid()) return ErrnoToStatus(errno, "open(" + file + ")");
      const void* buf;
      size_t size;
      la_int64_t off;
      while ((r = archive_read_data_block(a, &buf, &size, &off)) == ARCHIVE_OK) {
        if (::pwrite(fd.get(), buf, size, off) != static_cast<ssize_t>(size)) {
          return ErrnoToStatus(errno, "pwrite(" + file + ")");
        }
      }
      if (r != ARCHIVE_EOF) {
        return absl::InvalidArgumentError("docker archive " + path_ + ": member " + name + ": " + ArchiveError(a));
      }
      if (::ftruncate(fd.get(), archive_entry_size(e)) != 0) return ErrnoToStatus(errno, "ftruncate(" + file + ")");
      members_[name] = file;
    }
    return absl::OkStatus();
  }

  StatusOr<ResolvedImage> Resolve(const std::string& platform) override {
    ASSIGN_OR_RETURN(std::string mpath, Member("manifest.json"));
    ASSIGN_OR_RETURN(std::string body, ReadSmallFile(mpath, kMaxDocBytes));
    nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_array() || j.size() != 1 || !j[0].is_object()) {
      return absl::InvalidArgumentError("docker archive " + path_ +
                                        ": manifest.json must list exactly one image (it is not a one-element array)");
    }
    const nlohmann::json& m = j[0];
    if (!m.contains("Config") || !m["Config"].is_string() || !m.contains("Layers") || !m["Layers"].is_array()) {
      return absl::InvalidArgumentError("docker archive " + path_ + ": manifest.json lacks Config or Layers");
    }
    ResolvedImage out;
    if (m.contains("RepoTags") && m["RepoTags"].is_array() && !m["RepoTags"].empty() && m["RepoTags"][0].is_string()) {
      out.default_name = m["RepoTags"][0].get<std::string>();
    }
    ASSIGN_OR_RETURN(std::string cpath, Member(m["Config"].get<std::string>()));
    ASSIGN_OR_RETURN(std::string config, ReadSmallFile(cpath, kMaxDocBytes));
    out.digest = "sha256:" + Sha256Hex(config);
    out.manifest.config = Descriptor{"", out.digest, static_cast<int64_t>(config.size()), "", ""};
    ASSIGN_OR_RETURN(out.config, ParseConfig(config));
    RETURN_IF_ERROR(CheckConfigPlatform(out.config, platform));
    for (const nlohmann::json& l : m["Layers"]) {
      if (!l.is_string())
        return absl::InvalidArgumentError("docker archive " + path_ + ": a Layers entry is not a string");
      ASSIGN_OR_RETURN(std::string lpath, Member(l.get<std::string>()));
      ASSIGN_OR_RETURN(std::string hex, Sha256File(lpath));
      struct stat st;
      if (::stat(lpath.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat(" + lpath + ")");
      Descriptor d{"", "sha256:" + hex, static_cast<int64_t>(st.st_size), "", ""};
      files_[d.digest] = lpath;
      out.manifest.layers.push_back(std::move(d));
    }
    return out;
  }

  StatusOr<std::string> LayerFile(const Descriptor& d, const std::string&, const ProgressFn& progress) override {
    auto it = files_.find(d.digest);
    if (it == files_.end()) return absl::NotFoundError("docker archive " + path_ + " has no layer " + d.digest);
    if (progress && !progress(static_cast<uint64_t>(d.size))) return absl::CancelledError("import cancelled");
    return it->second;  // hashed by Resolve from our private copy
  }

  std::string Describe() const override { return "docker archive " + path_; }

 private:
  static std::string ArchiveError(archive* a) {
    const char* s = archive_error_string(a);
    return s != nullptr ? s : "unreadable archive";
  }
  StatusOr<std::string> Member(const std::string& raw) {
    ASSIGN_OR_RETURN(std::string name, CleanMember(raw, path_));
    for (int hops = 0; hops < 8; ++hops) {
      if (auto it = members_.find(name); it != members_.end()) return it->second;
      auto l = links_.find(name);
      if (l == links_.end()) break;
      name = l->second;
    }
    return absl::InvalidArgumentError("docker archive " + path_ + ": no member \"" + raw + "\"");
  }

  const std::string path_;
  const std::string scratch_;
  std::map<std::string, std::string> members_;  // member name -> unpacked file
  std::map<std::string, std::string> links_;    // symlink member -> target member
  std::map<std::string, std::string> files_;    // layer digest -> unpacked file
};

}  // namespace

Status CheckConfigPlatform(const ImageConfig& c, const std::string& platform) {
  const std::string os = platform.substr(0, platform.find('/'));
  const std::string arch = platform.find('/') == std::string::npos ? "" : platform.substr(platform.find('/') + 1);
  if ((!c.os.empty() && c.os != os) || (!c.architecture.empty() && !arch.empty() && c.architecture != arch)) {
    return absl::FailedPreconditionError("the image is for " + c.os + "/" + c.architecture + ", not " + platform);
  }
  return absl::OkStatus();
}

StatusOr<std::unique_ptr<ImageSource>> NewRegistrySource(const ImageRef& ref, RegistryOptions options) {
  return std::unique_ptr<ImageSource>(new RegistrySource(ref, std::move(options)));
}

StatusOr<std::unique_ptr<ImageSource>> NewLayoutSource(const std::string& dir, const std::string& ref_name) {
  struct stat st;
  if (::stat((dir + "/index.json").c_str(), &st) != 0) {
    return absl::InvalidArgumentError(dir + " is not an OCI image layout (no index.json)");
  }
  return std::unique_ptr<ImageSource>(new LayoutSource(dir, ref_name));
}

StatusOr<std::unique_ptr<ImageSource>> NewDockerArchiveSource(const std::string& tar_path,
                                                              const std::string& scratch_dir) {
  auto src = std::make_unique<DockerArchiveSource>(tar_path, scratch_dir);
  RETURN_IF_ERROR(src->Unpack());
  return std::unique_ptr<ImageSource>(std::move(src));
}

}  // namespace warren::image::oci
