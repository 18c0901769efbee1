// Conversions between the warren.v1 messages and the node/runtime types, and
// the input checks every service shares. A check returns INVALID_ARGUMENT
// naming the field and the value (quoted, C-escaped, cut at 80 bytes).
//
// Pure functions; thread-safe.
#pragma once

#include <map>
#include <string>

#include <google/protobuf/map.h>
#include <grpcpp/support/status.h>

#include "image/layer_store.h"
#include "node/process_table.h"
#include "node/sandbox_manager.h"
#include "runtime/backend.h"
#include "warren/v1/process.pb.h"
#include "warren/v1/warren.pb.h"

namespace warren::api {

// INVALID_ARGUMENT with `msg`.
grpc::Status Invalid(const std::string& msg);
// `s` quoted and C-escaped, cut at 80 bytes.
std::string Quote(const std::string& s);

// Input checks.
grpc::Status CheckId(const std::string& id);  // a sandbox id (field sandbox_id)
grpc::Status CheckPath(const std::string& field, const std::string& path);
grpc::Status CheckEnv(const google::protobuf::Map<std::string, std::string>& env,
                      std::map<std::string, std::string>* out);
// Validates and converts an exec request (argv xor shell, env, cwd, user,
// timeouts, output cap).
grpc::Status ToExecSpec(const warren::v1::ExecRequest& req, runtime::ExecSpec* out);

// Node/runtime -> proto.
void ToProto(const node::SandboxInfo& in, warren::v1::Sandbox* out);
void ToProto(const node::ClassCapacity& in, warren::v1::QosClassCapacity* out);
void ToProto(const runtime::FileInfo& in, warren::v1::FileInfo* out);
void ToProto(const runtime::ExecOutcome& in, warren::v1::ExecResult* out);
void ToProto(runtime::ExecOutcome&& in, warren::v1::ExecResult* out);  // moves the output
void ToProto(const node::ProcessStatus& in, warren::v1::ProcessInfo* out);
void ToProto(node::OutputData&& in, warren::v1::OutputChunk* out);
void ToProto(const node::JobInfo& in, warren::v1::Job* out);
// The layer's own fields (digest, name, size, created_at); in_use and
// mounted are the node's to fill.
void ToProto(const image::LayerInfo& in, warren::v1::Layer* out);

}  // namespace warren::api
