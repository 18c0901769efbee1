// Optional capabilities (runtime/backend.h): discoverable, and a sandbox
// without one is Unimplemented naming the backend and the capability.
#include <gtest/gtest.h>

#include "runtime/backend.h"

namespace warren::runtime {
namespace {

class BareSandbox : public Sandbox {
 public:
  const std::string& id() const override { return id_; }
  StatusOr<ExecOutcome> Exec(const ExecSpec&) override { return ExecOutcome{}; }
  SandboxFiles& files() override { std::abort(); }
  Status Destroy() override { return absl::OkStatus(); }
  nlohmann::json Record() const override { return {}; }
  pid_t init_pid() const override { return 1; }
  std::string_view backend_name() const override { return "microvm"; }

 private:
  std::string id_ = "n0-bare";
};

class PausableSandbox final : public BareSandbox, public Pausable {
 public:
  Status Pause() override { return absl::OkStatus(); }
  Status Resume() override { return absl::OkStatus(); }
};

TEST(Capabilities, ABackendWithoutACapabilityIsUnimplementedNamingBackendAndCapability) {
  BareSandbox sb;
  EXPECT_EQ(As<Pausable>(sb), nullptr);
  EXPECT_EQ(As<ChangeExporter>(sb), nullptr);
  StatusOr<ChangeExporter*> ex = Require<ChangeExporter>(sb);
  ASSERT_EQ(ex.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ex.status().message(), "sandbox n0-bare: export_changes is not supported by the microvm backend");
  StatusOr<Pausable*> p = Require<Pausable>(sb);
  EXPECT_EQ(p.status().message(), "sandbox n0-bare: pause is not supported by the microvm backend");
  EXPECT_EQ(Require<Suspendable>(sb).status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Require<ProcessStarter>(sb).status().code(), absl::StatusCode::kUnimplemented);
}

TEST(Capabilities, AnImplementedCapabilityIsFound) {
  PausableSandbox sb;
  StatusOr<Pausable*> p = Require<Pausable>(sb);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE((*p)->Pause().ok());
  EXPECT_EQ(As<Suspendable>(sb), nullptr);
}

TEST(Capabilities, SetsNameWhatTheyHold) {
  EXPECT_EQ(Capabilities{}.ToString(), "");
  const Capabilities c{Capability::kExportChanges, Capability::kPause};
  EXPECT_TRUE(c.has(Capability::kPause));
  EXPECT_FALSE(c.has(Capability::kSuspend));
  EXPECT_EQ(c.ToString(), "pause,export_changes");
  EXPECT_EQ(CapabilityName(Capability::kProcesses), "processes");
}

}  // namespace
}  // namespace warren::runtime
