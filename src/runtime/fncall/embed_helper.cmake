# Writes OUTPUT: a C++ file defining warren::runtime::ZygoteHelperSo() (the
# bytes of INPUT, the freestanding zygote helper shared object).
file(READ ${INPUT} hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${hex}")
file(WRITE ${OUTPUT} "// Generated from zygote_helper.c by embed_helper.cmake. Do not edit.\n#include \"runtime/fncall/fncall.h\"\nnamespace warren::runtime {\nconst std::string& ZygoteHelperSo() {\n  static const char kBytes[] = {${bytes}};\n  static const std::string* const kSo = new std::string(kBytes, sizeof kBytes);\n  return *kSo;\n}\n}  // namespace warren::runtime\n")
