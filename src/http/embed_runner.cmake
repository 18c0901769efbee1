# Writes OUTPUT: a C++ file defining warren::http::JupyterRunnerSource() from INPUT.
file(READ ${INPUT} content)
file(WRITE ${OUTPUT} "// Generated from jupyter_runner.py by embed_runner.cmake. Do not edit.\n#include \"http/run_code_server.h\"\nnamespace warren::http {\nconst std::string& JupyterRunnerSource() {\n  static const std::string* const kSrc = new std::string(R\"WARRENRUNNER(${content})WARRENRUNNER\");\n  return *kSrc;\n}\n}  // namespace warren::http\n")
