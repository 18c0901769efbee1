#include "runtime/desktop/xwd.h"

#include <bit>

namespace warren::runtime::desktop {

namespace {

// XWDFileHeader: 25 CARD32 fields, most significant byte first.
enum Field : int {
  kHeaderSize = 0,
  kFileVersion,
  kPixmapFormat,
  kPixmapDepth,
  kPixmapWidth,
  kPixmapHeight,
  kXOffset,
  kByteOrder,
  kBitmapUnit,
  kBitmapBitOrder,
  kBitmapPad,
  kBitsPerPixel,
  kBytesPerLine,
  kVisualClass,
  kRedMask,
  kGreenMask,
  kBlueMask,
  kBitsPerRgb,
  kColormapEntries,
  kNColors,
  kFieldCount = 25,
};
constexpr uint32_t kHeaderBytes = kFieldCount * 4;
constexpr uint32_t kXwdColorBytes = 12;  // XWDColor: CARD32 pixel, 3 x CARD16, 2 x CARD8
constexpr uint32_t kZPixmap = 2;
constexpr uint32_t kTrueColor = 4, kDirectColor = 5;

uint32_t Be32(std::string_view s, size_t off) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data() + off);
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

Status Bad(const std::string& what) { return absl::InvalidArgumentError("framebuffer (XWD): " + what); }

// 8 contiguous bits.
bool ByteMask(uint32_t m) { return std::popcount(m) == 8 && (m >> std::countr_zero(m)) == 0xffu; }

}  // namespace

StatusOr<XwdImage> ParseXwdHeader(std::string_view head, uint64_t file_size) {
  if (head.size() < kHeaderBytes) return Bad("file of " + std::to_string(head.size()) + " bytes has no header");
  uint32_t f[kFieldCount];
  for (int i = 0; i < kFieldCount; ++i) f[i] = Be32(head, static_cast<size_t>(i) * 4);
  if (f[kFileVersion] != 7) return Bad("file_version " + std::to_string(f[kFileVersion]) + " (want 7)");
  if (f[kHeaderSize] < kHeaderBytes || f[kHeaderSize] > kXwdHeadBytes) {
    return Bad("header_size " + std::to_string(f[kHeaderSize]));
  }
  if (f[kPixmapFormat] != kZPixmap) return Bad("pixmap_format " + std::to_string(f[kPixmapFormat]) + " (want ZPixmap)");
  if (f[kPixmapDepth] != 24) return Bad("pixmap_depth " + std::to_string(f[kPixmapDepth]) + " (want 24)");
  if (f[kBitsPerPixel] != 32) return Bad("bits_per_pixel " + std::to_string(f[kBitsPerPixel]) + " (want 32)");
  if (f[kVisualClass] != kTrueColor && f[kVisualClass] != kDirectColor) {
    return Bad("visual_class " + std::to_string(f[kVisualClass]) + " (want TrueColor)");
  }
  if (f[kXOffset] != 0) return Bad("xoffset " + std::to_string(f[kXOffset]));
  if (f[kByteOrder] > 1) return Bad("byte_order " + std::to_string(f[kByteOrder]));
  const uint64_t w = f[kPixmapWidth], h = f[kPixmapHeight];
  if (w == 0 || h == 0 || w > 4096 || h > 4096 || w * h > kXwdMaxPixels) {
    return Bad("screen " + std::to_string(w) + "x" + std::to_string(h) + " (1..4096 each)");
  }
  if (f[kBytesPerLine] < w * 4 || f[kBytesPerLine] > w * 4 + 64) {
    return Bad("bytes_per_line " + std::to_string(f[kBytesPerLine]) + " for width " + std::to_string(w));
  }
  for (Field m : {kRedMask, kGreenMask, kBlueMask}) {
    if (!ByteMask(f[m])) return Bad("colour mask " + std::to_string(f[m]) + " is not 8 contiguous bits");
  }
  if (f[kNColors] > 65536) return Bad("ncolors " + std::to_string(f[kNColors]));
  XwdImage img;
  img.width = static_cast<uint32_t>(w);
  img.height = static_cast<uint32_t>(h);
  img.bytes_per_line = f[kBytesPerLine];
  img.pixel_offset = uint64_t{f[kHeaderSize]} + uint64_t{f[kNColors]} * kXwdColorBytes;
  img.msb_first = f[kByteOrder] == 1;
  img.red_mask = f[kRedMask];
  img.green_mask = f[kGreenMask];
  img.blue_mask = f[kBlueMask];
  if (img.end() > file_size) {
    return Bad("file of " + std::to_string(file_size) + " bytes is shorter than its " + std::to_string(img.end()) +
               " bytes of header and pixels");
  }
  return img;
}

std::string XwdToRgb(const XwdImage& img, std::string_view pixels) {
  std::string rgb(static_cast<size_t>(img.width) * img.height * 3, '\0');
  const int rs = std::countr_zero(img.red_mask), gs = std::countr_zero(img.green_mask),
            bs = std::countr_zero(img.blue_mask);
  char* out = rgb.data();
  for (uint32_t y = 0; y < img.height; ++y) {
    const auto* row =
        reinterpret_cast<const unsigned char*>(pixels.data() + static_cast<size_t>(y) * img.bytes_per_line);
    for (uint32_t x = 0; x < img.width; ++x) {
      const unsigned char* p = row + static_cast<size_t>(x) * 4;
      const uint32_t v = img.msb_first
                             ? (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]}
                             : (uint32_t{p[3]} << 24) | (uint32_t{p[2]} << 16) | (uint32_t{p[1]} << 8) | uint32_t{p[0]};
      *out++ = static_cast<char>((v >> rs) & 0xffu);
      *out++ = static_cast<char>((v >> gs) & 0xffu);
      *out++ = static_cast<char>((v >> bs) & 0xffu);
    }
  }
  return rgb;
}

}  // namespace warren::runtime::desktop
