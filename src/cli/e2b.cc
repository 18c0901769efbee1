// warren e2b template ls | set NAME LAYER... | rm NAME | resolve REF
// [--file F]: the E2B template mapping file (warrend --e2b-templates;
// e2b/templates.h), edited in place. warrend reads it again when it
// changes, so an edit applies to the next Sandbox.create without a restart.
// Local: no daemon is called.
#include <sys/stat.h>

#include <cerrno>
#include <iostream>

#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "e2b/templates.h"

namespace warren::cli {
namespace {

// The file as it is; an absent file is an empty mapping (set creates it).
StatusOr<e2b::TemplateMap> Load(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return e2b::TemplateMap();
    return ErrnoToStatus(errno, "stat(" + path + ")");
  }
  return e2b::ReadTemplates(path, {});
}

int Fail(const Status& s) {
  PrintError(s);
  return s.code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitError;
}

int RunTemplate(Invocation& inv, const std::string& action) {
  const E2bArgs& a = inv.e2b;
  StatusOr<e2b::TemplateMap> templates = Load(a.file);
  if (!templates.ok()) return Fail(templates.status());
  if (action == "ls") {
    if (inv.global.json) {
      nlohmann::json j = nlohmann::json::object();
      for (const auto& [id, layers] : *templates) j[id] = layers;
      PrintJson(j);
      return kExitOk;
    }
    std::vector<std::vector<std::string>> rows = {{"TEMPLATE", "LAYERS"}};
    for (const auto& [id, layers] : *templates) rows.push_back({id, absl::StrJoin(layers, ",")});
    PrintTable(std::cout, rows);
    return kExitOk;
  }
  if (action == "resolve") {
    StatusOr<std::string> key = e2b::ResolveTemplate(*templates, a.name);
    if (!key.ok()) return Fail(key.status());
    if (inv.global.json) {
      PrintJson({{"template", *key}, {"layers", templates->at(*key)}});
    } else {
      std::cout << *key << " " << absl::StrJoin(templates->at(*key), ",") << std::endl;
    }
    return kExitOk;
  }
  if (Status s = e2b::CheckTemplateRef(a.name); !s.ok()) return Fail(s);
  if (action == "set") {
    for (const std::string& l : a.layers) {
      if (l.empty()) return Fail(absl::InvalidArgumentError("template \"" + a.name + "\": an empty layer"));
    }
    (*templates)[a.name] = a.layers;
  } else if (templates->erase(a.name) == 0) {
    return Fail(absl::NotFoundError("template \"" + a.name + "\" is not in " + a.file));
  }
  if (Status s = e2b::WriteTemplates(a.file, *templates); !s.ok()) return Fail(s);
  return kExitOk;
}

}  // namespace

void AddE2bCommand(CLI::App& root, Invocation& inv) {
  CLI::App* e2b = root.add_subcommand("e2b", "The E2B front end (warrend --e2b-listen): its template mapping.");
  e2b->fallthrough();
  e2b->require_subcommand(1);
  CLI::App* tmpl = e2b->add_subcommand(
      "template", "Edit the template mapping file (warrend --e2b-templates; warrend reads it again when it changes).");
  tmpl->fallthrough();
  tmpl->require_subcommand(1);
  tmpl->add_option("--file", inv.e2b.file, "the mapping file")->capture_default_str();
  struct Verb {
    const char* name;
    const char* help;
  };
  for (const Verb& v : {Verb{"ls", "List the templates: TEMPLATE LAYERS."},
                        Verb{"set", "Map a template (name, name:tag or namespace/name:tag) to layers, bottom first."},
                        Verb{"rm", "Remove a template."},
                        Verb{"resolve", "Show the template and layers a reference (as E2B's SDK sends it) names."}}) {
    CLI::App* sub = tmpl->add_subcommand(v.name, v.help);
    sub->fallthrough();
    const std::string action = v.name;
    if (action != "ls") sub->add_option("template", inv.e2b.name, "template reference")->required();
    if (action == "set") sub->add_option("layers", inv.e2b.layers, "layers, bottom first")->required();
    sub->callback([&inv, action] {
      inv.verb = "e2b template " + action;
      inv.run = [action](Invocation& i) { return RunTemplate(i, action); };
    });
  }
}

}  // namespace warren::cli
