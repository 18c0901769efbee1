// warren layer build|ls|get|rm: the node's layer store.
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "common/unique_fd.h"

namespace warren::cli {
namespace {

// Streams `fd` to the Build call in kChunkBytes messages.
Status SendTar(int fd, const std::string& what, grpc::ClientWriter<v1::BuildLayerRequest>& writer) {
  std::string buf(kChunkBytes, '\0');
  for (;;) {
    ASSIGN_OR_RETURN(size_t filled, ReadFull(fd, buf.data(), buf.size(), what));
    if (filled == 0) return absl::OkStatus();
    v1::BuildLayerRequest msg;
    msg.set_tar_chunk(buf.data(), filled);
    // A false Write means the call is over; Finish() reports why.
    if (!writer.Write(msg)) return absl::OkStatus();
    if (filled < buf.size()) return absl::OkStatus();
  }
}

int RunBuild(Invocation& inv) {
  const LayerBuildArgs& a = inv.layer_build;
  if (a.dir.empty() == a.tar.empty()) {
    return UsageError(absl::InvalidArgumentError("give exactly one of --dir or --tar"));
  }
  UniqueFd tar_fd;
  int fd = STDIN_FILENO;
  if (!a.tar.empty() && a.tar != "-") {
    tar_fd.reset(::open(a.tar.c_str(), O_RDONLY | O_CLOEXEC));
    if (!tar_fd.valid()) {
      PrintError(ErrnoToStatus(errno, "open(" + a.tar + ")"));
      return kExitError;
    }
    fd = tar_fd.get();
  }
  v1::BuildLayerRequest header;
  header.set_name(a.name);
  if (!a.dir.empty()) {
    // The daemon reads source_dir on its own host: send it absolute.
    std::error_code ec;
    std::filesystem::path abs = std::filesystem::absolute(a.dir, ec);
    header.set_source_dir(ec ? a.dir : abs.lexically_normal().string());
  }

  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::Layer layer;
  std::unique_ptr<grpc::ClientWriter<v1::BuildLayerRequest>> writer = client.layers().Build(&ctx, &layer);
  Status local = absl::OkStatus();
  if (writer->Write(header) && !a.tar.empty()) {
    local = SendTar(fd, a.tar == "-" ? "stdin" : a.tar, *writer);
    if (!local.ok()) ctx.TryCancel();
  }
  writer->WritesDone();
  Status st = FromGrpc(writer->Finish());
  if (!local.ok()) {
    PrintError(local);
    return kExitError;
  }
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson(LayerToJson(layer));
  } else {
    std::cout << layer.name() << " " << layer.digest() << std::endl;
  }
  return kExitOk;
}

int RunLayerLs(Invocation& inv) {
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::ListLayersResponse resp;
  Status st = FromGrpc(client.layers().List(&ctx, v1::ListLayersRequest(), &resp));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const v1::Layer& l : resp.layers()) list.push_back(LayerToJson(l));
    PrintJson({{"layers", list}});
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {{"NAME", "DIGEST", "SIZE", "IN_USE", "MOUNTED", "AGE"}};
  int64_t now = WallNowNs();
  for (const v1::Layer& l : resp.layers()) {
    rows.push_back({l.name().empty() ? "-" : l.name(), ShortDigest(l.digest()), FormatBytes(l.size_bytes()),
                    absl::StrCat(l.in_use()), l.mounted() ? "yes" : "no", FormatAge(l.created_at_ns(), now)});
  }
  PrintTable(std::cout, rows);
  return kExitOk;
}

int RunLayerGet(Invocation& inv) {
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::GetLayerRequest req;
  req.set_ref(inv.layer_ref);
  v1::Layer l;
  Status st = FromGrpc(client.layers().Get(&ctx, req, &l));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson(LayerToJson(l));
    return kExitOk;
  }
  PrintTable(std::cout, {{"name:", l.name()},
                         {"digest:", l.digest()},
                         {"size:", absl::StrCat(l.size_bytes(), " (", FormatBytes(l.size_bytes()), ")")},
                         {"age:", FormatAge(l.created_at_ns(), WallNowNs())},
                         {"in_use:", absl::StrCat(l.in_use())},
                         {"mounted:", l.mounted() ? "yes" : "no"},
                         {"projects:", l.projects().empty() ? std::string("(the operators': every project's)")
                                                            : absl::StrJoin(l.projects(), ", ")}});
  return kExitOk;
}

int RunLayerRm(Invocation& inv) {
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::RemoveLayerRequest req;
  req.set_ref(inv.layer_ref);
  v1::Empty resp;
  Status st = FromGrpc(client.layers().Remove(&ctx, req, &resp));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson({{"removed", inv.layer_ref}});
  } else {
    std::cout << inv.layer_ref << std::endl;
  }
  return kExitOk;
}

}  // namespace

void AddLayerCommand(CLI::App& root, Invocation& inv) {
  CLI::App* layer = root.add_subcommand("layer", "Build, list, get and remove layers.");
  layer->fallthrough();
  layer->require_subcommand(1);

  CLI::App* build = layer->add_subcommand("build",
                                          "Build a layer from a directory on the daemon's host or a tar stream; "
                                          "prints \"NAME DIGEST\".");
  build->fallthrough();
  build->add_option("name", inv.layer_build.name, "kind/name[@version]")->required();
  CLI::Option* dir =
      build->add_option("--dir", inv.layer_build.dir, "source directory (read by the daemon; root, unix socket)");
  CLI::Option* tar =
      build->add_option("--tar", inv.layer_build.tar, "tar file (plain/gzip/xz/zstd), '-' for stdin; streamed");
  dir->excludes(tar);
  tar->excludes(dir);
  build->callback([&inv] {
    inv.verb = "layer build";
    inv.run = RunBuild;
  });

  CLI::App* ls = layer->add_subcommand("ls", "List layers: NAME DIGEST SIZE IN_USE MOUNTED AGE.");
  ls->fallthrough();
  ls->callback([&inv] {
    inv.verb = "layer ls";
    inv.run = RunLayerLs;
  });

  CLI::App* get = layer->add_subcommand("get", "Show one layer.");
  get->fallthrough();
  get->add_option("ref", inv.layer_ref, "kind/name[@version] or sha256:<hex>")->required();
  get->callback([&inv] {
    inv.verb = "layer get";
    inv.run = RunLayerGet;
  });

  CLI::App* rm = layer->add_subcommand("rm", "Remove a layer (fails while in use).");
  rm->fallthrough();
  rm->add_option("ref", inv.layer_ref, "kind/name[@version] or sha256:<hex>")->required();
  rm->callback([&inv] {
    inv.verb = "layer rm";
    inv.run = RunLayerRm;
  });
}

}  // namespace warren::cli
