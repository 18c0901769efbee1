# Script mode (cmake -P): embeds a file into a C++ source as a byte array.
#   cmake -DINPUT=<file> -DOUTPUT=<file.cc> -DSYMBOL=<c identifier> -P embed.cmake
# Defines `extern "C" const char SYMBOL[]` (NUL-terminated) and
# `extern "C" const unsigned long SYMBOL_size` (without the NUL). Hex bytes, not
# a raw string literal, so any content embeds unchanged.
file(READ "${INPUT}" _hex HEX)
string(LENGTH "${_hex}" _hex_len)
math(EXPR _size "${_hex_len} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," _bytes "${_hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" _bytes "${_bytes}")
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by embed.cmake. Do not edit.\n"
  "extern \"C\" const char ${SYMBOL}[] = {\n${_bytes}0x00};\n"
  "extern \"C\" const unsigned long ${SYMBOL}_size = ${_size};\n")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
