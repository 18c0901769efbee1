// warren: the command-line client of warrend. See commands.h.
#include "cli/commands.h"

int main(int argc, char** argv) { return warren::cli::RunCli(argc, argv); }
