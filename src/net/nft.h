// nftables through libnftables (Debian's libnftables1): the nft language as
// text, one nft_run_cmd_from_buffer call = one kernel transaction (all of
// the commands apply, or none). The same words an operator reads back with
// `nft list table inet <name>`.
#pragma once

#include <mutex>
#include <string>

#include "common/status.h"

struct nft_ctx;

namespace warren::net {

class Nft {
 public:
  static StatusOr<std::unique_ptr<Nft>> Open();
  ~Nft();
  Nft(const Nft&) = delete;
  Nft& operator=(const Nft&) = delete;
  // Runs `cmds` (newline-separated) as one transaction. On failure the
  // error names the commands' first line and nft's message. Thread-safe.
  Status Run(const std::string& cmds);
  // Output of a listing command ("list table inet x"); NotFound when nft
  // says the object does not exist.
  StatusOr<std::string> List(const std::string& cmd);

 private:
  explicit Nft(nft_ctx* ctx) : ctx_(ctx) {}
  std::mutex mu_;
  nft_ctx* ctx_;
};

}  // namespace warren::net
