# Job and site configs (JSON, defaults, validation) and the aggregator
# election: pure functions, no threads, no I/O beyond reading a config file.
add_library(swarm_controller_config validation.cc job_config.cc site_config.cc
  election.cc)
target_link_libraries(swarm_controller_config PUBLIC swarm_common swarm_proto swarm_streaming
  protobuf::libprotobuf absl::flat_hash_map absl::status absl::statusor
  absl::strings absl::str_format absl::time)

swarm_test(job_config_test SOURCES job_config_test.cc
  LIBS swarm_controller_config LABELS unit)
swarm_test(site_config_test SOURCES site_config_test.cc
  LIBS swarm_controller_config LABELS unit)
swarm_test(election_test SOURCES election_test.cc
  LIBS swarm_controller_config LABELS unit)
