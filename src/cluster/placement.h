// Placement: which nodes a create should try, in order. Pure: no I/O, no
// clock; the caller (router.h) owns the view, the counts and the random
// source.
//
// Filter: a node is a candidate when it is not draining, offers the backend,
// has a free sandbox slot after the placements this entry node already sent
// it since its last record, has the cpus for the request (capacity, as node
// admission clamps; cpu is over-committed) and the memory free of what its
// sandboxes asked for. Choice: power of k choices: k candidates drawn at
// random, the one with the most free slots (ties: the one holding every
// requested layer, then the more memory) first, the other drawn ones next,
// then the rest by the same order. The first node's admission is final; a
// refusal moves to the next.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cluster/node_record.h"

namespace warren::cluster {

struct PlacementRequest {
  std::string backend;  // "" = any node (its default backend)
  uint32_t cpu_millis = 0;
  uint32_t memory_mb = 0;
  int qos = 0;                      // index of NodeRecord::qos: 0 latency, 1 best-effort
  std::vector<std::string> layers;  // as the create names them ("kind/name" or "kind/name@version")
};

struct PlacementOptions {
  int k = 2;
};

// Node ids to try, best first; empty when no node passes the filter.
// `recent`: per node id, creates this entry node sent it since the record
// in `nodes` was written.
std::vector<std::string> Place(const std::vector<NodeRecord>& nodes, const PlacementRequest& request,
                               const std::map<std::string, uint32_t>& recent, std::mt19937_64& rng,
                               const PlacementOptions& options = {});

// Why no node passed the filter, one phrase per node ("n1: draining").
std::string ExplainNoCandidate(const std::vector<NodeRecord>& nodes, const PlacementRequest& request,
                               const std::map<std::string, uint32_t>& recent);

// Whether `node` caches every layer of `request` (a name without @version
// matches any version).
bool HoldsLayers(const NodeRecord& node, const PlacementRequest& request);

}  // namespace warren::cluster
