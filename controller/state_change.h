// StateChange: one change of a site's state or round, at the time the
// machine made it. SiteMachine keeps the last few in a journal so that an
// observer that looks now and then (the daemon's status watcher, which
// feeds the metrics and the round record) still sees every phase with its
// true start and end.
#ifndef SWARM_CONTROLLER_STATE_CHANGE_H_
#define SWARM_CONTROLLER_STATE_CHANGE_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "proto/swarm.pb.h"

namespace swarm {

struct StateChange {
  uint64_t seq = 0;  // 1, 2, ... in the order made.
  v1::SiteState state = v1::SITE_STATE_IDLE;
  uint32_t round = 0;  // As in SiteStatus.round.
  absl::Time at;
  // As they were right after the change (SiteStatus.counters, .metrics).
  v1::SiteCounters counters;
  std::map<std::string, double> metrics;
};

}  // namespace swarm

#endif  // SWARM_CONTROLLER_STATE_CHANGE_H_
