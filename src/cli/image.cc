// warren image pull|import|ls|inspect|rm|merge|prune: the node's images
// (api/warren/v1/image.proto). pull and import print one progress line per
// layer step on stderr (on a terminal redrawn in place, with a bar for the
// blob's bytes fetched and converted) and the image's name and digest on
// stdout.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "warren/v1/image.grpc.pb.h"

namespace warren::cli {
namespace {

nlohmann::json LayerToJson(const v1::ImageLayer& l) {
  return {{"digest", l.digest()}, {"layer", l.layer()}, {"layer_name", l.layer_name()}, {"size_bytes", l.size_bytes()}};
}

nlohmann::json ImageToJson(const v1::Image& img) {
  nlohmann::json layers = nlohmann::json::array();
  for (const v1::ImageLayer& l : img.layers()) layers.push_back(LayerToJson(l));
  // What a create from the image stacks, bottom first.
  nlohmann::json stack = nlohmann::json::array();
  if (img.merged_count() > 0) stack.push_back(img.merged().layer_name());
  for (int i = static_cast<int>(img.merged_count()); i < img.layers_size(); ++i) {
    stack.push_back(img.layers(i).layer_name());
  }
  const v1::ImageConfig& c = img.config();
  auto strings = [](const auto& r) { return std::vector<std::string>(r.begin(), r.end()); };
  return {{"name", img.name()},
          {"digest", img.digest()},
          {"source", img.source()},
          {"created_at_ns", img.created_at_ns()},
          {"in_use", img.in_use()},
          {"layers", layers},
          {"merged", img.merged_count() > 0 ? LayerToJson(img.merged()) : nlohmann::json(nullptr)},
          {"merged_count", img.merged_count()},
          {"stack", stack},
          {"config",
           {{"env", strings(c.env())},
            {"workdir", c.workdir()},
            {"user", c.user()},
            {"entrypoint", strings(c.entrypoint())},
            {"cmd", strings(c.cmd())},
            {"exposed_ports", strings(c.exposed_ports())}}}};
}

uint64_t ImageSize(const v1::Image& img) {
  uint64_t n = 0;
  for (const v1::ImageLayer& l : img.layers()) n += l.size_bytes();
  return n;
}

// "[#########...............]  38%" of done/total (total > 0).
std::string Bar(uint64_t done, uint64_t total) {
  constexpr uint64_t kCells = 24;
  const uint64_t d = std::min(done, total);
  const uint64_t filled = d * kCells / total;
  std::string pct = std::to_string(d * 100 / total);
  return "[" + std::string(filled, '#') + std::string(kCells - filled, '.') + "] " +
         std::string(3 - std::min<size_t>(3, pct.size()), ' ') + pct + "%";
}

// Reads the progress stream; prints progress on stderr unless quiet, and
// the image at the end. Off a terminal, one line per layer and phase.
int FollowProgress(Invocation& inv, grpc::ClientContext& ctx, grpc::ClientReader<v1::ImageProgress>& reader) {
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  v1::ImageProgress m;
  v1::Image image;
  bool have_image = false;
  bool open_line = false;  // a redrawn line is on the terminal
  std::string last_step;   // layer and phase of the last line (off a terminal)
  while (reader.Read(&m)) {
    if (m.has_image()) {
      image = m.image();
      have_image = true;
      continue;
    }
    if (inv.image.quiet || inv.global.json) continue;
    std::string line = absl::StrCat("[", m.layer_index() + 1, "/", m.layer_count(), "] ", ShortDigest(m.layer_digest()),
                                    " ", m.phase());
    const bool measured = (m.phase() == "fetching" || m.phase() == "converting") && m.bytes_total() > 0;
    const bool final = m.phase() == "done" || m.phase() == "exists";
    if (tty) {
      if (measured) {
        absl::StrAppend(&line, " ", Bar(m.bytes_done(), m.bytes_total()), " ", FormatBytes(m.bytes_done()), " / ",
                        FormatBytes(m.bytes_total()));
      }
      std::cerr << "\r\033[K" << line << (final ? "\n" : "") << std::flush;
      open_line = !final;
    } else if (std::string step = absl::StrCat(m.layer_index(), " ", m.phase()); step != last_step) {
      last_step = step;
      if (measured) absl::StrAppend(&line, " ", FormatBytes(m.bytes_total()));
      std::cerr << line << "\n";
    }
  }
  if (open_line) std::cerr << "\n";
  Status st = FromGrpc(reader.Finish());
  (void)ctx;
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (!have_image) {
    PrintError(absl::InternalError("the image stream ended without the image"));
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson(ImageToJson(image));
  } else {
    std::cout << image.name() << " " << image.digest() << std::endl;
  }
  return kExitOk;
}

int RunPull(Invocation& inv) {
  const ImageArgs& a = inv.image;
  v1::PullImageRequest req;
  req.set_ref(a.ref);
  req.set_name(a.name);
  req.set_plain_http(a.plain_http);
  req.set_ca_file(a.ca_file.empty() ? "" : std::filesystem::absolute(a.ca_file).lexically_normal().string());
  req.set_platform(a.platform);
  req.set_stall_timeout_s(a.stall_timeout_s);
  req.mutable_auth()->set_username(a.username);
  req.mutable_auth()->set_bearer_token(a.bearer_token);
  if (a.password_stdin) {
    std::string pw;
    std::getline(std::cin, pw);
    req.mutable_auth()->set_password(pw);
  }
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  auto stub = v1::Images::NewStub(client.channel());
  std::unique_ptr<grpc::ClientReader<v1::ImageProgress>> reader = stub->Pull(&ctx, req);
  return FollowProgress(inv, ctx, *reader);
}

int RunImport(Invocation& inv) {
  const ImageArgs& a = inv.image;
  v1::ImportImageRequest req;
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(a.ref, ec);  // the daemon reads it on its host
  req.set_path(ec ? a.ref : abs.lexically_normal().string());
  req.set_name(a.name);
  req.set_ref_name(a.ref_name);
  req.set_platform(a.platform);
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  auto stub = v1::Images::NewStub(client.channel());
  std::unique_ptr<grpc::ClientReader<v1::ImageProgress>> reader = stub->Import(&ctx, req);
  return FollowProgress(inv, ctx, *reader);
}

int RunImageLs(Invocation& inv) {
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::ListImagesResponse resp;
  Status st = FromGrpc(v1::Images::NewStub(client.channel())->List(&ctx, v1::ListImagesRequest(), &resp));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const v1::Image& i : resp.images()) list.push_back(ImageToJson(i));
    PrintJson({{"images", list}});
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {{"NAME", "DIGEST", "LAYERS", "SIZE", "IN_USE", "AGE"}};
  const int64_t now = WallNowNs();
  for (const v1::Image& i : resp.images()) {
    rows.push_back({i.name(), ShortDigest(i.digest()), absl::StrCat(i.layers_size()), FormatBytes(ImageSize(i)),
                    absl::StrCat(i.in_use()), FormatAge(i.created_at_ns(), now)});
  }
  PrintTable(std::cout, rows);
  return kExitOk;
}

int RunImageInspect(Invocation& inv) {
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::GetImageRequest req;
  req.set_name(inv.image.ref);
  v1::Image img;
  Status st = FromGrpc(v1::Images::NewStub(client.channel())->Get(&ctx, req, &img));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  PrintJson(ImageToJson(img));  // inspect is JSON whatever --json says
  return kExitOk;
}

int RunImageRm(Invocation& inv) {
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::RemoveImageRequest req;
  req.set_name(inv.image.ref);
  v1::Empty resp;
  Status st = FromGrpc(v1::Images::NewStub(client.channel())->Remove(&ctx, req, &resp));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson({{"removed", inv.image.ref}});
  } else {
    std::cout << inv.image.ref << std::endl;
  }
  return kExitOk;
}

int RunImageMerge(Invocation& inv) {
  v1::MergeImageRequest req;
  req.set_name(inv.image.ref);
  req.set_include_top(inv.image.include_top);
  req.set_max_bytes(inv.image.max_bytes);
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  auto stub = v1::Images::NewStub(client.channel());
  std::unique_ptr<grpc::ClientReader<v1::ImageProgress>> reader = stub->Merge(&ctx, req);
  return FollowProgress(inv, ctx, *reader);
}

int RunImagePrune(Invocation& inv) {
  Client client(inv.global);
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::PruneImagesResponse resp;
  Status st = FromGrpc(v1::Images::NewStub(client.channel())->Prune(&ctx, v1::PruneImagesRequest(), &resp));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson({{"removed", std::vector<std::string>(resp.removed().begin(), resp.removed().end())},
               {"bytes_freed", resp.bytes_freed()}});
    return kExitOk;
  }
  for (const std::string& n : resp.removed()) std::cout << n << "\n";
  std::cout << "freed " << FormatBytes(resp.bytes_freed()) << std::endl;
  return kExitOk;
}

}  // namespace

void AddImageCommand(CLI::App& root, Invocation& inv) {
  CLI::App* image = root.add_subcommand("image", "Pull, import, list, inspect, merge and remove images; prune layers.");
  image->fallthrough();
  image->require_subcommand(1);
  ImageArgs& a = inv.image;

  CLI::App* pull = image->add_subcommand(
      "pull", "Pull an image from an OCI registry into layers; prints \"NAME DIGEST\" (progress on stderr).");
  pull->fallthrough();
  pull->add_option("ref", a.ref, "host[:port]/repo[:tag] or host[:port]/repo@sha256:<hex>")->required();
  pull->add_option("--name", a.name, "store as name:tag (default: ref)");
  pull->add_option("--username", a.username, "registry user (basic auth, or to obtain a bearer token)");
  pull->add_flag("--password-stdin", a.password_stdin, "read the registry password from stdin's first line");
  pull->add_option("--bearer-token", a.bearer_token, "a ready registry bearer token");
  pull->add_flag("--plain-http", a.plain_http, "http:// instead of https:// (default for loopback hosts)");
  pull->add_option("--ca-file", a.ca_file, "PEM CA bundle to verify the registry's certificate (on the node)");
  pull->add_option("--platform", a.platform, "os/arch (default linux/amd64)");
  pull->add_option("--stall-timeout", a.stall_timeout_s, "seconds a transfer may move nothing (default 30)");
  pull->add_flag("-q,--quiet", a.quiet, "no progress lines");
  pull->callback([&inv] {
    inv.verb = "image pull";
    inv.run = RunPull;
  });

  CLI::App* imp = image->add_subcommand(
      "import", "Import an OCI layout directory or a docker save archive (read by the daemon; unix socket).");
  imp->fallthrough();
  imp->add_option("path", a.ref, "OCI image layout dir or docker save .tar")->required();
  imp->add_option("--name", a.name, "store as name:tag (default: the archive's tag / the layout's ref name)");
  imp->add_option("--ref-name", a.ref_name, "OCI layout: the manifest's org.opencontainers.image.ref.name");
  imp->add_option("--platform", a.platform, "os/arch (default linux/amd64)");
  imp->add_flag("-q,--quiet", a.quiet, "no progress lines");
  imp->callback([&inv] {
    inv.verb = "image import";
    inv.run = RunImport;
  });

  CLI::App* ls = image->add_subcommand("ls", "List images: NAME DIGEST LAYERS SIZE IN_USE AGE.");
  ls->fallthrough();
  ls->callback([&inv] {
    inv.verb = "image ls";
    inv.run = RunImageLs;
  });

  CLI::App* inspect = image->add_subcommand("inspect", "Show one image (JSON).");
  inspect->fallthrough();
  inspect->add_option("name", a.ref, "name[:tag]")->required();
  inspect->callback([&inv] {
    inv.verb = "image inspect";
    inv.run = RunImageInspect;
  });

  CLI::App* rm = image->add_subcommand("rm", "Remove an image and its layers no other image uses (not while in use).");
  rm->fallthrough();
  rm->add_option("name", a.ref, "name[:tag]")->required();
  rm->callback([&inv] {
    inv.verb = "image rm";
    inv.run = RunImageRm;
  });

  CLI::App* merge = image->add_subcommand(
      "merge", "Merge an image's layers into one verified layer (all but the top one unless --all).");
  merge->fallthrough();
  merge->add_option("name", a.ref, "name[:tag]")->required();
  merge->add_flag("--all", a.include_top, "merge the top layer too");
  merge->add_option("--max-bytes", a.max_bytes, "refuse when the layers hold more (default 3 GiB)");
  merge->add_flag("-q,--quiet", a.quiet, "no progress lines");
  merge->callback([&inv] {
    inv.verb = "image merge";
    inv.run = RunImageMerge;
  });

  CLI::App* prune = image->add_subcommand("prune", "Remove image layers no image lists and nothing uses.");
  prune->fallthrough();
  prune->callback([&inv] {
    inv.verb = "image prune";
    inv.run = RunImagePrune;
  });
}

}  // namespace warren::cli
