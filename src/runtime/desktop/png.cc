#include "runtime/desktop/png.h"

#include <png.h>
#include <zlib.h>

#include <csetjmp>
#include <vector>

namespace warren::runtime::desktop {

namespace {

void Append(png_structp png, png_bytep data, png_size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}

void Flush(png_structp /*png*/) {}

}  // namespace

StatusOr<std::string> EncodePngRgb(std::string_view rgb, uint32_t width, uint32_t height) {
  if (width == 0 || height == 0 || rgb.size() != static_cast<size_t>(width) * height * 3) {
    return absl::InvalidArgumentError("png: " + std::to_string(rgb.size()) + " bytes for a " + std::to_string(width) +
                                      "x" + std::to_string(height) + " RGB image");
  }
  std::string out;
  std::vector<png_bytep> rows(height);
  for (uint32_t y = 0; y < height; ++y) {
    rows[y] = reinterpret_cast<png_bytep>(const_cast<char*>(rgb.data() + static_cast<size_t>(y) * width * 3));
  }
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  if (png == nullptr) return absl::InternalError("png_create_write_struct failed");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_write_struct(&png, nullptr);
    return absl::InternalError("png_create_info_struct failed");
  }
  // libpng reports errors by longjmp: nothing with a destructor is created
  // between here and png_destroy_write_struct.
  if (setjmp(png_jmpbuf(png)) != 0) {  // NOLINT(cert-err52-cpp): libpng's error model
    png_destroy_write_struct(&png, &info);
    return absl::InternalError("png: libpng failed to encode the screen");
  }
  png_set_write_fn(png, &out, Append, Flush);
  png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_set_compression_level(png, Z_BEST_SPEED);
  png_set_filter(png, PNG_FILTER_TYPE_BASE, PNG_FILTER_SUB);
  png_set_rows(png, info, rows.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

}  // namespace warren::runtime::desktop
