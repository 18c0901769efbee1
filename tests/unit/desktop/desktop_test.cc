// The desktop API's shared parts: key names to X11 keysyms, the XWD
// framebuffer header as untrusted input, PNG encoding (decoded back with
// libpng's reader).
#include <png.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "runtime/desktop/keys.h"
#include "runtime/desktop/png.h"
#include "runtime/desktop/x11_desktop.h"
#include "runtime/desktop/xwd.h"
#include "status_matchers.h"

namespace warren::runtime::desktop {
namespace {

using ::testing::HasSubstr;

TEST(Keys, ComboKeysAndX11Keysyms) {
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> codes, ComboKeys("ctrl+shift+Page_Up"));
  EXPECT_THAT(codes, ::testing::ElementsAre("ctrl", "shift", "pgup"));
  std::vector<std::string> syms;
  syms.reserve(codes.size());
  for (const auto& c : codes) syms.push_back(X11Keysym(c));
  EXPECT_THAT(syms, ::testing::ElementsAre("Control_L", "Shift_L", "Prior"));
  EXPECT_EQ(X11Keysym(KeyCode("Return")), "Return");
  EXPECT_EQ(X11Keysym(KeyCode("enter")), "Return");
  EXPECT_EQ(X11Keysym(KeyCode("L")), "l");
  EXPECT_EQ(X11Keysym(KeyCode("F12")), "F12");
  EXPECT_EQ(X11Keysym(KeyCode(".")), "");  // not a key name (type it)
  EXPECT_EQ(X11Keysym(KeyCode("period")), "period");
  EXPECT_EQ(X11Keysym(KeyCode("super")), "Super_L");
  ASSERT_OK_AND_ASSIGN(codes, ComboKeys("ctrl++"));
  EXPECT_THAT(codes, ::testing::ElementsAre("ctrl", "equal"));
  EXPECT_THAT(ComboKeys("ctrl+hyper").status().message(), HasSubstr("unknown key \"hyper\""));
  EXPECT_THAT(ComboKeys("a++b").status().message(), HasSubstr("empty key"));
  // Every name KeyCode knows has a keysym (one table cannot drift from the other).
  for (const char* n :
       {"shift",     "shift_r",    "alt",          "alt_r",     "ctrl",  "ctrl_r",        "menu",      "esc",
        "minus",     "equal",      "backspace",    "tab",       "ret",   "spc",           "caps_lock", "bracket_left",
        "semicolon", "apostrophe", "grave_accent", "backslash", "comma", "dot",           "slash",     "home",
        "end",       "pgup",       "pgdn",         "up",        "down",  "left",          "right",     "insert",
        "delete",    "meta_l",     "meta_r",       "print",     "pause", "bracket_right", "a",         "z",
        "0",         "9",          "f1",           "f10"}) {
    EXPECT_NE(X11Keysym(KeyCode(n)), "") << n;
  }
}

void Put32(std::string* s, size_t off, uint32_t v) {
  (*s)[off] = static_cast<char>(v >> 24);
  (*s)[off + 1] = static_cast<char>(v >> 16);
  (*s)[off + 2] = static_cast<char>(v >> 8);
  (*s)[off + 3] = static_cast<char>(v);
}

// An XWD file as Xvfb -fbdir writes it (the header of a real one, Xvfb 21.1
// at 1024x768x24, scaled to w x h): 160 bytes of header and name, 256
// colormap entries, then the pixels (little-endian 0x00RRGGBB).
std::string Xwd(uint32_t w, uint32_t h) {
  std::string f(160 + 256 * 12 + static_cast<size_t>(w) * h * 4, '\0');
  const uint32_t v[25] = {160, 7,        2,      24,   w, h,   0,   0, 32, 0, 32, 32, w * 4,
                          4,   0xff0000, 0xff00, 0xff, 8, 256, 256, w, h,  0, 0,  0};
  for (int i = 0; i < 25; ++i) Put32(&f, static_cast<size_t>(i) * 4, v[i]);
  std::memcpy(f.data() + 100, "Xvfb test:0.0", 13);
  return f;
}

TEST(Xwd, ParsesXvfbsFramebufferAndConvertsPixels) {
  std::string f = Xwd(3, 2);
  // pixel (1, 0) = red 0x11, green 0x22, blue 0x33 (little-endian 0x00112233)
  const size_t px = 160 + 256 * 12 + 4;
  f[px] = 0x33;
  f[px + 1] = 0x22;
  f[px + 2] = 0x11;
  ASSERT_OK_AND_ASSIGN(XwdImage img, ParseXwdHeader(std::string_view(f).substr(0, kXwdHeadBytes), f.size()));
  EXPECT_EQ(img.width, 3u);
  EXPECT_EQ(img.height, 2u);
  EXPECT_EQ(img.pixel_offset, 160u + 256 * 12);
  EXPECT_EQ(img.end(), f.size());
  std::string rgb = XwdToRgb(img, std::string_view(f).substr(img.pixel_offset));
  ASSERT_EQ(rgb.size(), 18u);
  EXPECT_EQ(rgb.substr(3, 3), "\x11\x22\x33");
  EXPECT_EQ(rgb.substr(0, 3), std::string(3, '\0'));
}

TEST(Xwd, RejectsWhatItCannotTrust) {
  const std::string good = Xwd(4, 4);
  auto parse = [](const std::string& f, uint64_t size) {
    return ParseXwdHeader(std::string_view(f).substr(0, std::min<size_t>(f.size(), kXwdHeadBytes)), size);
  };
  EXPECT_THAT(parse(good.substr(0, 50), 50).status().message(), HasSubstr("no header"));
  EXPECT_THAT(parse(good, good.size() - 1).status().message(), HasSubstr("shorter than"));
  struct Case {
    int field;
    uint32_t value;
    const char* names;
  } cases[] = {
      {1, 6, "file_version 6"},      {0, 99, "header_size 99"},
      {0, 1u << 20, "header_size"},  {2, 1, "pixmap_format 1"},
      {3, 16, "pixmap_depth 16"},    {11, 24, "bits_per_pixel 24"},
      {4, 0, "screen 0x4"},          {5, 100000, "screen 4x100000"},
      {12, 8, "bytes_per_line 8"},   {12, 0xffffffffu, "bytes_per_line"},
      {14, 0xff00ff, "colour mask"}, {19, 0x7fffffff, "ncolors"},
      {7, 9, "byte_order 9"},
  };
  for (const Case& c : cases) {
    std::string f = good;
    Put32(&f, static_cast<size_t>(c.field) * 4, c.value);
    StatusOr<XwdImage> r = parse(f, f.size());
    EXPECT_FALSE(r.ok()) << c.names;
    EXPECT_THAT(r.status().message(), HasSubstr(c.names));
  }
}

// Decodes a PNG with libpng's reader: width, height, RGB rows.
struct Decoded {
  uint32_t w = 0, h = 0;
  std::string rgb;
};
Decoded DecodePng(const std::string& png) {
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  Decoded d;
  if (png_image_begin_read_from_memory(&img, png.data(), png.size()) == 0) return d;
  img.format = PNG_FORMAT_RGB;
  d.rgb.resize(PNG_IMAGE_SIZE(img));
  if (png_image_finish_read(&img, nullptr, d.rgb.data(), 0, nullptr) == 0) return d;
  d.w = img.width;
  d.h = img.height;
  return d;
}

TEST(Png, RoundTripsThroughLibpngsReader) {
  std::string rgb(size_t{5} * 3 * 3, '\0');
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<char>(i * 7);
  ASSERT_OK_AND_ASSIGN(std::string png, EncodePngRgb(rgb, 5, 3));
  EXPECT_EQ(png.substr(1, 3), "PNG");
  Decoded d = DecodePng(png);
  EXPECT_EQ(d.w, 5u);
  EXPECT_EQ(d.h, 3u);
  EXPECT_EQ(d.rgb, rgb);
  EXPECT_THAT(EncodePngRgb(rgb, 5, 4).status().message(), HasSubstr("for a 5x4 RGB image"));
}

TEST(X11Desktop, StartScriptNamesTheLayerAndTheFramebuffer) {
  const std::string s = X11Desktop::StartScript();
  EXPECT_THAT(s, HasSubstr("-fbdir /tmp/.warren-desktop"));
  EXPECT_THAT(s, HasSubstr("toolset/desktop"));
  EXPECT_THAT(s, HasSubstr("1024x768x24"));
}

}  // namespace
}  // namespace warren::runtime::desktop
