// Images (DESIGN.md §4): a named, versioned ("name:tag") list of layers of
// the layer store plus the defaults of the image config. Each OCI layer
// becomes the EROFS layer "base/oci-sha256@<hex of its OCI digest>", built
// once per store: a second image with the same layer finds it by that name
// and neither fetches nor converts it again.
//
// Layout: <dir>/<sha256 hex of the name>.json, one record per image, written
// atomically (temp file + rename). The dir sits beside the layer store's so
// that nodes sharing the store share the images.
//
// Thread-safe: concurrent adds of images sharing a layer convert it once in
// this process (a per-digest latch); across nodes the layer store's
// link(2)-based naming keeps one result.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "image/layer_store.h"
#include "image/oci/manifest.h"
#include "image/oci/source.h"

namespace warren::image::oci {

struct ImageLayerRef {
  std::string oci_digest;    // of the blob as distributed
  std::string layer_digest;  // of the EROFS image file
  std::string layer_name;    // "base/oci-sha256@<hex>"
  uint64_t size_bytes = 0;   // of the EROFS image file
};

struct ImageRecord {
  std::string name;    // "name:tag"
  std::string digest;  // manifest digest
  std::string source;
  int64_t created_at_ns = 0;
  std::vector<ImageLayerRef> layers;  // bottom first
  ImageConfig config;
  // Set by ImageStore::Merge: one layer equal to layers[0, merged_count)
  // stacked ("base/oci-chain@<chain hex>", oci_digest "chain:sha256:<hex>").
  // A create then stacks `merged` and layers[merged_count...].
  ImageLayerRef merged;
  uint32_t merged_count = 0;
  // The layers a create from this image stacks, bottom first.
  std::vector<ImageLayerRef> Stack() const;
};

// What the image store needs of the layer store.
class LayerBackend {
 public:
  virtual ~LayerBackend() = default;
  virtual StatusOr<LayerInfo> Resolve(const std::string& ref) const = 0;
  // Converts a layer tar (plain/gz/zstd) with OCI whiteouts
  // (LayerStore::BuildFromTar), reporting the bytes of the tar read.
  virtual StatusOr<LayerInfo> BuildFromTar(const std::string& name, const std::string& tar_path,
                                           const TarProgressFn& progress) = 0;
  // One layer equal to the stack of `layer_digests` (LayerStore::BuildMerged).
  virtual StatusOr<LayerInfo> BuildMerged(const std::string& name, const std::vector<std::string>& layer_digests) = 0;
  // Removes a layer name; FailedPrecondition if a sandbox uses it.
  virtual Status Remove(const std::string& ref) = 0;
  // Every layer name (LayerStore::List), for the garbage collector.
  virtual std::vector<LayerInfo> List() const = 0;
};

// The layers of an image a create is using, held from the record's lookup
// until the sandbox holds the layers itself: while held, Remove and
// CollectGarbage leave the image's layers alone.
class ImageUse;

struct PullProgress {
  std::string layer_digest;
  uint32_t layer_index = 0;
  uint32_t layer_count = 0;
  // "fetching" (bytes_done: of the blob downloaded), "converting" (of the
  // blob read by the conversion), "done", "exists".
  std::string phase;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};
// Returning false cancels the pull (Cancelled).
using PullProgressFn = std::function<bool(const PullProgress&)>;

class ImageStore {
 public:
  // dir: where records live (created); tmp_dir: scratch for downloads, on
  // the layer store's file system. `layers` is borrowed.
  static StatusOr<std::unique_ptr<ImageStore>> Open(const std::string& dir, const std::string& tmp_dir,
                                                    LayerBackend* layers);

  // "name" -> "name:latest"; InvalidArgument for a name outside
  // [A-Za-z0-9._/:@-]{1,255} or with "..".
  static StatusOr<std::string> NormalizeName(const std::string& name);
  static std::string LayerNameFor(const std::string& oci_digest);

  // Resolves `src` for `platform`, converts the layers not in the store yet
  // and records the image as `name` (empty: the source's suggestion),
  // replacing a record of that name. On error the layers this call created
  // are removed and no record is written; scratch files are always removed.
  StatusOr<ImageRecord> Add(ImageSource& src, const std::string& name, const std::string& platform,
                            const PullProgressFn& progress);
  StatusOr<ImageRecord> Get(const std::string& name) const;  // NotFound naming it
  std::vector<ImageRecord> List() const;                     // sorted by name
  // Refuses (FailedPrecondition naming the layer) if `in_use(layer_digest)`
  // for a layer of the image; else removes the record, then each of its
  // layers no other image lists.
  Status Remove(const std::string& name, const std::function<bool(const std::string&)>& in_use);

  // Merges the image's layers offline into one layer (BuildMerged: checked
  // against the stacked layers) and records it: all but the top layer
  // (the top is the image's own, e.g. a task's workspace; needs >= 3
  // layers), or all of them with include_top (needs >= 2). Images with the
  // same lower layers share the merged layer (named by their chain).
  // FailedPrecondition when there is nothing to merge or the layers to merge
  // exceed max_bytes (their EROFS sizes summed; 0 = no cap).
  StatusOr<ImageRecord> Merge(const std::string& name, bool include_top, uint64_t max_bytes,
                              const PullProgressFn& progress);

  // The image's record, its layers held until the ImageUse is destroyed.
  StatusOr<std::unique_ptr<ImageUse>> Use(const std::string& name);

  struct GcResult {
    std::vector<std::string> removed;  // layer names
    uint64_t bytes = 0;                // their EROFS sizes
  };
  // Removes the image layers ("base/oci-sha256@*", "base/oci-chain@*") no
  // record lists, that no pull, merge or create holds and for which
  // `in_use(layer_digest)` is false (a sandbox uses it).
  StatusOr<GcResult> CollectGarbage(const std::function<bool(const std::string&)>& in_use);

 private:
  ImageStore(std::string dir, std::string tmp_dir, LayerBackend* layers)
      : dir_(std::move(dir)), tmp_dir_(std::move(tmp_dir)), layers_(layers) {}
  std::string RecordPath(const std::string& name) const;
  // Converts one layer unless present; `created` is set when this call built it.
  StatusOr<ImageLayerRef> EnsureLayer(ImageSource& src, const Descriptor& d, PullProgress p,
                                      const PullProgressFn& progress, bool* created);

  friend class ImageUse;
  void Hold(const std::string& layer_name);                                                // mu_ held
  void Unhold(const std::string& layer_name);                                              // takes mu_
  bool Held(const std::string& layer_name) const { return holds_.count(layer_name) > 0; }  // mu_ held
  // mu_ held: a record other than `except` lists the layer (as a layer or merged).
  bool Listed(const std::string& layer_name, const std::string& except) const;
  // Waits for and takes the per-key conversion latch (see EnsureLayer).
  void Latch(const std::string& key);
  void Unlatch(const std::string& key);

  const std::string dir_;
  const std::string tmp_dir_;
  LayerBackend* const layers_;
  mutable std::mutex mu_;  // guards converting_ and record writes/removals
  std::condition_variable cv_;
  std::map<std::string, int> converting_;  // OCI digest -> in progress here
  // Layer name -> holders: pulls that produced or found it (until their
  // record is written or they rolled back), merges, creates (ImageUse).
  std::map<std::string, int> holds_;
};

class ImageUse {
 public:
  ~ImageUse();
  ImageUse(const ImageUse&) = delete;
  ImageUse& operator=(const ImageUse&) = delete;
  const ImageRecord& record() const { return rec_; }

 private:
  friend class ImageStore;
  ImageUse(ImageStore* s, ImageRecord rec) : s_(s), rec_(std::move(rec)) {}
  ImageStore* s_;
  ImageRecord rec_;
};

// Record (de)serialization (JSON), exposed for tests.
std::string RecordToJson(const ImageRecord& r);
StatusOr<ImageRecord> RecordFromJson(const std::string& s);

}  // namespace warren::image::oci
