#include "net/nft.h"

#include <nftables/libnftables.h>

#include <memory>

namespace warren::net {

StatusOr<std::unique_ptr<Nft>> Nft::Open() {
  nft_ctx* ctx = nft_ctx_new(NFT_CTX_DEFAULT);
  if (ctx == nullptr) return absl::InternalError("nft_ctx_new failed");
  if (nft_ctx_buffer_output(ctx) != 0 || nft_ctx_buffer_error(ctx) != 0) {
    nft_ctx_free(ctx);
    return absl::InternalError("nft_ctx_buffer_output/error failed");
  }
  return std::unique_ptr<Nft>(new Nft(ctx));
}

Nft::~Nft() { nft_ctx_free(ctx_); }

Status Nft::Run(const std::string& cmds) {
  std::lock_guard<std::mutex> l(mu_);
  if (nft_run_cmd_from_buffer(ctx_, cmds.c_str()) == 0) return absl::OkStatus();
  std::string err = nft_ctx_get_error_buffer(ctx_);
  while (!err.empty() && err.back() == '\n') err.pop_back();
  std::string first = cmds.substr(0, cmds.find('\n'));
  return absl::InternalError("nftables: '" + first + "'...: " + err);
}

StatusOr<std::string> Nft::List(const std::string& cmd) {
  std::lock_guard<std::mutex> l(mu_);
  if (nft_run_cmd_from_buffer(ctx_, cmd.c_str()) == 0) return std::string(nft_ctx_get_output_buffer(ctx_));
  std::string err = nft_ctx_get_error_buffer(ctx_);
  if (err.find("No such file or directory") != std::string::npos) return absl::NotFoundError("nft " + cmd + ": " + err);
  return absl::InternalError("nft " + cmd + ": " + err);
}

}  // namespace warren::net
