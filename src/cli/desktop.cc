// warren screenshot ID [-o FILE]: the sandbox's screen as PNG (vm backend);
// warren input ID key COMBO | type TEXT | mouse X Y [--button B] [--action A]
// | scroll DX DY: keyboard and pointer (warren.v1.Desktop).
#include <fstream>
#include <iostream>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "warren/v1/desktop.grpc.pb.h"

namespace warren::cli {
namespace {

int RunScreenshot(Invocation& inv) {
  Client client(inv.global);
  v1::Desktop::Stub stub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::ScreenshotRequest req;
  req.set_id(inv.desktop.id);
  v1::ScreenImage img;
  Status st = FromGrpc(stub.Screenshot(&ctx, req, &img));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  const std::string& out = inv.desktop.out;
  if (out == "-") {
    std::cout.write(img.png().data(), static_cast<std::streamsize>(img.png().size()));
    return std::cout.good() ? kExitOk : kExitError;
  }
  std::ofstream f(out, std::ios::binary | std::ios::trunc);
  f.write(img.png().data(), static_cast<std::streamsize>(img.png().size()));
  f.close();
  if (!f) {
    PrintError(absl::UnavailableError("cannot write " + out));
    return kExitError;
  }
  if (inv.global.json) {
    PrintJson({{"path", out}, {"width", img.width()}, {"height", img.height()}, {"bytes", img.png().size()}});
  } else {
    std::cout << out << " " << img.width() << "x" << img.height() << "\n";
  }
  return kExitOk;
}

int RunInput(Invocation& inv) {
  const DesktopArgs& a = inv.desktop;
  v1::InputRequest req;
  req.set_id(a.id);
  if (a.kind == "key") {
    req.mutable_key()->set_keys(a.text);
  } else if (a.kind == "type") {
    req.mutable_type()->set_text(a.text);
  } else if (a.kind == "mouse") {
    static const std::map<std::string, v1::MouseButton> kButtons = {{"", v1::MOUSE_BUTTON_NONE},
                                                                    {"left", v1::MOUSE_BUTTON_LEFT},
                                                                    {"middle", v1::MOUSE_BUTTON_MIDDLE},
                                                                    {"right", v1::MOUSE_BUTTON_RIGHT}};
    static const std::map<std::string, v1::MouseAction> kActions = {{"move", v1::MOUSE_ACTION_MOVE},
                                                                    {"click", v1::MOUSE_ACTION_CLICK},
                                                                    {"down", v1::MOUSE_ACTION_DOWN},
                                                                    {"up", v1::MOUSE_ACTION_UP}};
    auto b = kButtons.find(a.button);
    auto ac = kActions.find(a.action);
    if (b == kButtons.end() || ac == kActions.end()) {
      PrintError(
          absl::InvalidArgumentError("--button must be left, middle or right and --action move, click, down "
                                     "or up"));
      return kExitUsage;
    }
    v1::MouseInput* m = req.mutable_mouse();
    m->set_x(a.x);
    m->set_y(a.y);
    m->set_button(b->second);
    m->set_action(ac->second);
  } else {
    req.mutable_scroll()->set_dx(a.x);
    req.mutable_scroll()->set_dy(a.y);
  }
  Client client(inv.global);
  v1::Desktop::Stub stub(client.channel());
  grpc::ClientContext ctx;
  client.Prepare(&ctx);
  v1::Empty resp;
  Status st = FromGrpc(stub.Input(&ctx, req, &resp));
  if (!st.ok()) {
    PrintError(st);
    return kExitError;
  }
  return kExitOk;
}

}  // namespace

void AddDesktopCommands(CLI::App& root, Invocation& inv) {
  CLI::App* shot = root.add_subcommand("screenshot", "Save a sandbox's screen as PNG (backend vm).");
  shot->fallthrough();
  shot->add_option("id", inv.desktop.id, "sandbox id")->required();
  shot->add_option("-o,--output", inv.desktop.out, "PNG file to write (- = stdout)")->default_val("screen.png");
  shot->callback([&inv] {
    inv.verb = "screenshot";
    inv.run = RunScreenshot;
  });
  CLI::App* input = root.add_subcommand("input", "Send keys, text, pointer or wheel events to a sandbox's screen.");
  input->fallthrough();
  input->require_subcommand(1);
  input->add_option("id", inv.desktop.id, "sandbox id")->required();
  auto verb = [&inv](const char* kind) {
    return [&inv, kind] {
      inv.desktop.kind = kind;
      inv.verb = std::string("input ") + kind;
      inv.run = RunInput;
    };
  };
  CLI::App* key = input->add_subcommand("key", "Press a combination such as ctrl+l, Return, shift+Tab.");
  key->add_option("keys", inv.desktop.text, "keys joined by +")->required();
  key->callback(verb("key"));
  CLI::App* type = input->add_subcommand("type", "Type text (printable ASCII, \\n and \\t; US layout).");
  type->add_option("text", inv.desktop.text, "the text")->required();
  type->callback(verb("type"));
  CLI::App* mouse = input->add_subcommand("mouse", "Move the pointer to X Y, then an action.");
  mouse->add_option("x", inv.desktop.x, "pixels from the left")->required();
  mouse->add_option("y", inv.desktop.y, "pixels from the top")->required();
  mouse->add_option("--button", inv.desktop.button, "left, middle or right");
  mouse->add_option("--action", inv.desktop.action, "move (default), click, down or up");
  mouse->callback(verb("mouse"));
  CLI::App* scroll = input->add_subcommand("scroll", "Wheel clicks: DY > 0 down, DX > 0 right.");
  scroll->add_option("dx", inv.desktop.x, "horizontal clicks")->required();
  scroll->add_option("dy", inv.desktop.y, "vertical clicks")->required();
  scroll->callback(verb("scroll"));
}

}  // namespace warren::cli
