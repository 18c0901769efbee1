// PNG encoding of a screen (libpng): what the desktop API returns
// (runtime/desktop.h's Screenshot) for screens read as raw pixels.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace warren::runtime::desktop {

// A PNG (8-bit RGB, no interlace, zlib level 1: screenshots are taken often
// and screens compress well) of `rgb`: width * height packed RGB triples,
// rows top to bottom. InvalidArgument when the sizes disagree; Internal for
// a libpng error.
StatusOr<std::string> EncodePngRgb(std::string_view rgb, uint32_t width, uint32_t height);

}  // namespace warren::runtime::desktop
