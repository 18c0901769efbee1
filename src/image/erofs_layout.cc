#include "image/erofs_layout.h"

#include <cstring>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace warren::image {
namespace {

constexpr uint64_t kSuperOffset = 1024;
constexpr uint32_t kMagic = 0xE0F5E1E2;
constexpr uint32_t kNullAddr = 0xffffffff;
// i_format: bit 0 the inode version (extended), bits 1..3 the data layout.
enum Layout : uint16_t {
  kFlatPlain = 0,
  kCompressedFull = 1,
  kFlatInline = 2,
  kCompressedCompact = 3,
  kChunkBased = 4
};
constexpr uint16_t kChunkFormatIndexes = 0x20;  // 8-byte chunk indexes (else 4-byte block addresses)
constexpr uint16_t kChunkBitsMask = 0x1f;
constexpr uint16_t kTypeMask = 0170000, kTypeDir = 0040000, kTypeReg = 0100000;

template <typename T>
T Le(const std::string& b, size_t off) {
  T v{};
  std::memcpy(&v, b.data() + off, sizeof v);  // x86-64 and aarch64: little-endian, as EROFS is
  return v;
}

class Walker {
 public:
  Walker(const ErofsReadFn& read, uint64_t size) : read_(read), size_(size) {}

  StatusOr<ErofsLayout> Run() {
    std::string sb;
    RETURN_IF_ERROR(Bytes(kSuperOffset, 128, &sb, /*raw=*/true));
    if (Le<uint32_t>(sb, 0) != kMagic) return Bad("no EROFS superblock (bad magic)");
    const uint8_t bits = static_cast<uint8_t>(sb[12]);
    if (bits < 9 || bits > 16) return Bad("block size 2^" + std::to_string(bits) + " out of range");
    bs_ = uint32_t{1} << bits;
    meta_blkaddr_ = Le<uint32_t>(sb, 40);
    const uint64_t blocks = (size_ + bs_ - 1) / bs_;
    data_.assign(blocks, false);
    std::vector<uint64_t> stack{Le<uint16_t>(sb, 14)};
    std::unordered_set<uint64_t> seen;
    while (!stack.empty()) {
      const uint64_t nid = stack.back();
      stack.pop_back();
      if (!seen.insert(nid).second) continue;
      RETURN_IF_ERROR(Inode(nid, &stack));
    }
    ErofsLayout out;
    out.block_bytes = bs_;
    out.image_bytes = size_;
    out.inodes = seen.size();
    uint64_t first_data = blocks;
    for (uint64_t b = 0; b < blocks; ++b) {
      if (data_[b]) {
        first_data = b;
        break;
      }
    }
    for (uint64_t b = 0; b < blocks; ++b) {
      if (data_[b]) continue;
      out.metadata_bytes += bs_;
      if (b >= first_data) out.stray_metadata_bytes += bs_;
    }
    out.metadata_end = std::min<uint64_t>(first_data * bs_, size_);
    return out;
  }

 private:
  static Status Bad(const std::string& what) { return absl::InvalidArgumentError("EROFS image: " + what); }

  // [off, off + len) of the image into *out, block by block through the
  // walk's own cache (raw: the superblock, read before the block size is known).
  Status Bytes(uint64_t off, uint64_t len, std::string* out, bool raw = false) {
    if (off > size_ || len > size_ - off) {
      return Bad("metadata at " + std::to_string(off) + " (+" + std::to_string(len) + ") past the image's end");
    }
    out->clear();
    if (raw) {
      out->resize(len);
      ASSIGN_OR_RETURN(size_t got, read_(off, len, out->data()));
      if (got != len) return Bad("short read at " + std::to_string(off));
      return absl::OkStatus();
    }
    out->reserve(len);
    while (len > 0) {
      const uint64_t blk = off / bs_, in = off % bs_;
      const uint64_t n = std::min<uint64_t>(len, bs_ - in);
      auto it = blocks_.find(blk);
      if (it == blocks_.end()) {
        if ((blocks_.size() + 1) * bs_ > kMaxErofsMetadataBytes) {
          return Bad("more than " + std::to_string(kMaxErofsMetadataBytes >> 20) + " MiB of metadata");
        }
        std::string b(std::min<uint64_t>(bs_, size_ - blk * bs_), '\0');
        ASSIGN_OR_RETURN(size_t got, read_(blk * bs_, b.size(), b.data()));
        if (got != b.size()) return Bad("short read of block " + std::to_string(blk));
        it = blocks_.emplace(blk, std::move(b)).first;
      }
      out->append(it->second, in, n);
      off += n;
      len -= n;
    }
    return absl::OkStatus();
  }

  void MarkData(uint64_t blk, uint64_t n) {
    for (uint64_t b = blk; b < blk + n && b < data_.size(); ++b) data_[b] = true;
  }

  Status Inode(uint64_t nid, std::vector<uint64_t>* stack) {
    const uint64_t at = uint64_t{meta_blkaddr_} * bs_ + nid * 32;
    std::string head;
    RETURN_IF_ERROR(Bytes(at, 32, &head));
    const uint16_t format = Le<uint16_t>(head, 0);
    const bool extended = (format & 1) != 0;
    const uint16_t layout = (format >> 1) & 7;
    const uint16_t xattr_count = Le<uint16_t>(head, 2);
    const uint16_t mode = Le<uint16_t>(head, 4);
    uint64_t size = Le<uint32_t>(head, 8);
    if (extended) {
      std::string ext;
      RETURN_IF_ERROR(Bytes(at, 64, &ext));
      size = Le<uint64_t>(ext, 8);
    }
    const uint32_t u = Le<uint32_t>(head, 16);
    const uint64_t isize = extended ? 64 : 32;
    const uint64_t xsize = xattr_count == 0 ? 0 : 12 + (uint64_t{xattr_count} - 1) * 4;
    const uint64_t tail_at = at + isize + xsize;  // inline tail / chunk indexes
    const uint16_t type = mode & kTypeMask;
    if (type != kTypeReg && type != kTypeDir)
      return absl::OkStatus();  // symlinks, devices: no data blocks of their own
    if (layout == kCompressedFull || layout == kCompressedCompact) {
      return absl::UnimplementedError("EROFS image: inode " + std::to_string(nid) + " is compressed");
    }
    if (type == kTypeDir) {
      if (layout != kFlatPlain && layout != kFlatInline) {
        return Bad("directory inode " + std::to_string(nid) + " has layout " + std::to_string(layout));
      }
      return Dir(nid, layout, size, u, tail_at, stack);
    }
    switch (layout) {
      case kFlatPlain: MarkData(u, (size + bs_ - 1) / bs_); return absl::OkStatus();
      case kFlatInline: MarkData(u, size / bs_); return absl::OkStatus();
      case kChunkBased: return Chunks(nid, size, u, tail_at);
      default: return Bad("inode " + std::to_string(nid) + " has unknown layout " + std::to_string(layout));
    }
  }

  Status Chunks(uint64_t nid, uint64_t size, uint32_t info, uint64_t index_at) {
    const uint16_t fmt = static_cast<uint16_t>(info);
    const uint32_t cbits = fmt & kChunkBitsMask;
    if (cbits > 30) return Bad("inode " + std::to_string(nid) + ": chunk size 2^" + std::to_string(cbits) + " blocks");
    const uint64_t chunk = uint64_t{bs_} << cbits;
    const uint64_t count = (size + chunk - 1) / chunk;
    const bool indexes = (fmt & kChunkFormatIndexes) != 0;
    const uint64_t unit = indexes ? 8 : 4;
    if (count > size_ / unit) return Bad("inode " + std::to_string(nid) + ": more chunk indexes than the image holds");
    index_at = (index_at + unit - 1) / unit * unit;
    std::string idx;
    RETURN_IF_ERROR(Bytes(index_at, count * unit, &idx));
    for (uint64_t i = 0; i < count; ++i) {
      const uint32_t blk = Le<uint32_t>(idx, i * unit + (indexes ? 4 : 0));
      if (blk == kNullAddr) continue;  // a hole
      const uint64_t bytes = std::min(chunk, size - i * chunk);
      MarkData(blk, (bytes + bs_ - 1) / bs_);
    }
    return absl::OkStatus();
  }

  Status Dir(uint64_t nid, uint16_t layout, uint64_t size, uint32_t blkaddr, uint64_t tail_at,
             std::vector<uint64_t>* stack) {
    const uint64_t full = layout == kFlatInline ? size / bs_ : (size + bs_ - 1) / bs_;
    std::string b;
    for (uint64_t i = 0; i <= full; ++i) {
      uint64_t len = bs_;
      if (i < full) {
        RETURN_IF_ERROR(Bytes((uint64_t{blkaddr} + i) * bs_, std::min<uint64_t>(bs_, size - i * bs_), &b));
      } else {
        len = size - full * bs_;
        if (layout != kFlatInline || len == 0) break;
        RETURN_IF_ERROR(Bytes(tail_at, len, &b));
      }
      if (b.size() < 12) return Bad("directory inode " + std::to_string(nid) + " has a short block");
      const uint16_t first_name = Le<uint16_t>(b, 8);
      if (first_name < 12 || first_name % 12 != 0 || first_name > b.size()) {
        return Bad("directory inode " + std::to_string(nid) + " has a bad first name offset");
      }
      for (uint64_t d = 0; d < first_name / 12; ++d) stack->push_back(Le<uint64_t>(b, d * 12));
    }
    return absl::OkStatus();
  }

  const ErofsReadFn& read_;
  const uint64_t size_;
  uint32_t bs_ = 4096;
  uint32_t meta_blkaddr_ = 0;
  std::vector<bool> data_;  // per block: a regular file's data
  std::unordered_map<uint64_t, std::string> blocks_;
};

}  // namespace

StatusOr<ErofsLayout> ReadErofsLayout(const ErofsReadFn& read, uint64_t image_bytes) {
  if (image_bytes < kSuperOffset + 128) return absl::InvalidArgumentError("EROFS image: shorter than a superblock");
  return Walker(read, image_bytes).Run();
}

}  // namespace warren::image
