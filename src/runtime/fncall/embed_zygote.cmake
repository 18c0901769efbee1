# Writes OUTPUT: a C++ file defining warren::runtime::ZygoteSource() from INPUT.
file(READ ${INPUT} content)
file(WRITE ${OUTPUT} "// Generated from zygote.py by embed_zygote.cmake. Do not edit.\n#include \"runtime/fncall/fncall.h\"\nnamespace warren::runtime {\nconst std::string& ZygoteSource() {\n  static const std::string* const kSrc = new std::string(R\"WARRENZYGOTE(${content})WARRENZYGOTE\");\n  return *kSrc;\n}\n}  // namespace warren::runtime\n")
