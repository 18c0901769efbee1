// The X Window Dump format (XWD, X11's XWDFile.h, file version 7) as Xvfb
// keeps its framebuffer in a file (`Xvfb -fbdir DIR` memory-maps
// DIR/Xvfb_screen0: the header, the window name, the colormap, then the
// pixels): parsed from untrusted bytes (the file lives inside a sandbox), so
// every field is checked before it sizes anything. Only what an X server of
// depth 24 stores is accepted: ZPixmap, 32 bits per pixel, TrueColor masks
// of 8 contiguous bits each. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace warren::runtime::desktop {

// Enough of a file's first bytes for ParseXwdHeader (header_size is
// bounded by it).
constexpr size_t kXwdHeadBytes = 4096;
// The largest screen accepted: 4096 x 4096 pixels (64 MiB of pixels).
constexpr uint64_t kXwdMaxPixels = 4096ull * 4096ull;

struct XwdImage {
  uint32_t width = 0, height = 0;
  uint64_t pixel_offset = 0;    // bytes from the file's start to row 0
  uint32_t bytes_per_line = 0;  // >= width * 4
  bool msb_first = false;       // byte order of each 32-bit pixel
  uint32_t red_mask = 0, green_mask = 0, blue_mask = 0;
  // pixel_offset + bytes_per_line * height: the bytes a screenshot reads.
  uint64_t end() const { return pixel_offset + static_cast<uint64_t>(bytes_per_line) * height; }
};

// The layout of an XWD file from its first bytes (`head`, up to
// kXwdHeadBytes) and its size. InvalidArgument naming the first field out
// of bounds (a truncated file, another version or format, a depth or pixel
// size other than 24/32, a screen above kXwdMaxPixels, masks that are not
// 8 contiguous bits).
StatusOr<XwdImage> ParseXwdHeader(std::string_view head, uint64_t file_size);

// Packed RGB (3 bytes a pixel, rows top to bottom, no padding) from the
// pixel rows of `img` (`pixels`: exactly img.end() - img.pixel_offset bytes).
std::string XwdToRgb(const XwdImage& img, std::string_view pixels);

}  // namespace warren::runtime::desktop
