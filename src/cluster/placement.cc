#include "cluster/placement.h"

#include <algorithm>

namespace warren::cluster {
namespace {

// What a create's 0 resources become on the node (node/admission/validate.cc).
constexpr int64_t kDefaultCpuMillis = 1000;
constexpr int64_t kDefaultMemoryMb = 2048;

uint32_t Recent(const std::map<std::string, uint32_t>& recent, const std::string& id) {
  auto it = recent.find(id);
  return it == recent.end() ? 0 : it->second;
}

// Free slots after this entry's own recent placements.
int64_t EffectiveFree(const NodeRecord& n, const std::map<std::string, uint32_t>& recent) {
  return static_cast<int64_t>(n.free_slots) - Recent(recent, n.id);
}

// "" when `n` may take `r`, else why not.
std::string Refusal(const NodeRecord& n, const PlacementRequest& r, const std::map<std::string, uint32_t>& recent) {
  if (n.drain) return "draining";
  if (!r.backend.empty() && std::find(n.backends.begin(), n.backends.end(), r.backend) == n.backends.end()) {
    return "no backend " + r.backend;
  }
  if (EffectiveFree(n, recent) <= 0) return "no free sandbox slot";
  if (r.cpu_millis > static_cast<uint64_t>(n.cpus) * 1000) {
    return "has " + std::to_string(n.cpus) + " cpus, the request asks " + std::to_string(r.cpu_millis) + " millicpus";
  }
  const QosRecord& q = n.qos[r.qos == 1 ? 1 : 0];
  if (q.bounded) {
    // The node admits by its class's bound (node/admission): what it would
    // refuse is filtered here, with the node defaults a 0 stands for.
    const char* cls = r.qos == 1 ? "best-effort" : "latency";
    const int64_t cpu = r.cpu_millis != 0 ? r.cpu_millis : kDefaultCpuMillis;
    const int64_t mem = r.memory_mb != 0 ? r.memory_mb : kDefaultMemoryMb;
    if (q.free_cpu_millis < cpu) {
      return std::string("qos class ") + cls + " has " + std::to_string(q.free_cpu_millis) +
             " millicpus free, the request asks " + std::to_string(cpu);
    }
    if (q.free_memory_mb < mem) {
      return std::string("qos class ") + cls + " has " + std::to_string(q.free_memory_mb) +
             " MiB free, the request asks " + std::to_string(mem);
    }
    return "";
  }
  if (r.memory_mb > 0 && n.free_memory_mb < static_cast<int64_t>(r.memory_mb)) {
    return "has " + std::to_string(n.free_memory_mb) + " MiB of memory free, the request asks " +
           std::to_string(r.memory_mb) + " MiB";
  }
  return "";
}

}  // namespace

bool HoldsLayers(const NodeRecord& node, const PlacementRequest& request) {
  for (const std::string& want : request.layers) {
    const bool versioned = want.find('@') != std::string::npos;
    bool found = false;
    for (const std::string& have : node.layers) {
      if (have == want || (!versioned && have.rfind(want + "@", 0) == 0)) {
        found = true;
        break;
      }
    }
    if (!found) return false;
  }
  return true;
}

std::vector<std::string> Place(const std::vector<NodeRecord>& nodes, const PlacementRequest& request,
                               const std::map<std::string, uint32_t>& recent, std::mt19937_64& rng,
                               const PlacementOptions& options) {
  struct Cand {
    const NodeRecord* node;
    int64_t free;
    bool layers;
  };
  std::vector<Cand> cands;
  cands.reserve(nodes.size());
  for (const NodeRecord& n : nodes) {
    if (Refusal(n, request, recent).empty()) cands.push_back({&n, EffectiveFree(n, recent), HoldsLayers(n, request)});
  }
  auto better = [](const Cand& a, const Cand& b) {
    if (a.free != b.free) return a.free > b.free;
    if (a.layers != b.layers) return a.layers;
    return a.node->free_memory_mb > b.node->free_memory_mb;
  };
  // The k drawn first (a partial Fisher-Yates shuffle), then the rest.
  const size_t k = std::min(cands.size(), static_cast<size_t>(std::max(1, options.k)));
  for (size_t i = 0; i < k; ++i) {
    std::uniform_int_distribution<size_t> pick(i, cands.size() - 1);
    std::swap(cands[i], cands[pick(rng)]);
  }
  std::stable_sort(cands.begin(), cands.begin() + static_cast<std::ptrdiff_t>(k), better);
  std::stable_sort(cands.begin() + static_cast<std::ptrdiff_t>(k), cands.end(), better);
  std::vector<std::string> order;
  order.reserve(cands.size());
  for (const Cand& c : cands) order.push_back(c.node->id);
  return order;
}

std::string ExplainNoCandidate(const std::vector<NodeRecord>& nodes, const PlacementRequest& request,
                               const std::map<std::string, uint32_t>& recent) {
  if (nodes.empty()) return "no node is registered";
  std::string out;
  for (const NodeRecord& n : nodes) {
    if (!out.empty()) out += "; ";
    std::string why = Refusal(n, request, recent);
    out += n.id + ": " + (why.empty() ? "eligible" : why);
  }
  return out;
}

}  // namespace warren::cluster
