// Output of the CLI: JSON documents (--json) and human tables. JSON keys are
// the proto field names (snake_case); 64-bit numbers are JSON numbers, states
// are lower-case words ("running"), bytes are base64 under "<field>_b64".
// Text that is not valid UTF-8 is printed with U+FFFD replacements.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_util.h"  // ReadAll, ReadFull, WriteAll
#include "common/status.h"
#include "common/time.h"  // WallNowNs
#include "warren/v1/warren.pb.h"

namespace warren::cli {

std::string StateName(v1::SandboxState state);
std::string FileTypeName(v1::FileType type);

nlohmann::json ResourcesToJson(const v1::Resources& r);
nlohmann::json SandboxToJson(const v1::Sandbox& s);
// QoS classes by name (NodeStatus.qos, ClusterNode.qos).
nlohmann::json QosToJson(const google::protobuf::RepeatedPtrField<v1::QosClassCapacity>& classes);
nlohmann::json LayerToJson(const v1::Layer& l);
nlohmann::json NodeStatusToJson(const v1::NodeStatus& n);
// stdout/stderr both as lossy text and exact base64 (stdout_b64, stderr_b64).
nlohmann::json ExecResultToJson(const v1::ExecResult& r);

// One JSON document, 2-space indented, newline-terminated, invalid UTF-8
// replaced by U+FFFD (never throws).
std::string DumpJson(const nlohmann::json& j);
void PrintJson(const nlohmann::json& j);

std::string Base64Encode(std::string_view bytes);

// "42s", "5m", "3h", "2d" since created_at_ns; "-" if unknown (0).
std::string FormatAge(int64_t created_at_ns, int64_t now_ns);
// 1536 -> "1.5KiB", 0 -> "0B".
std::string FormatBytes(uint64_t bytes);
// Short digest for tables: "sha256:0123456789ab".
std::string ShortDigest(const std::string& digest);

// Left-aligned columns separated by two spaces; the first row is the header.
void PrintTable(std::ostream& out, const std::vector<std::vector<std::string>>& rows);

// "error: NOT_FOUND: <message>" on stderr.
void PrintError(const Status& s);

}  // namespace warren::cli
