# One round's collection rules (Gatherer) and the metric comparator: pure
# logic, no threads, no I/O.
add_library(swarm_gatherer_rules metric_comparator.cc gatherer.cc)
target_link_libraries(swarm_gatherer_rules PUBLIC swarm_common swarm_proto
  absl::strings absl::str_format absl::time)

swarm_test(metric_comparator_test SOURCES metric_comparator_test.cc
  LIBS swarm_gatherer_rules LABELS unit)
swarm_test(gatherer_test SOURCES gatherer_test.cc
  LIBS swarm_gatherer_rules LABELS unit)
