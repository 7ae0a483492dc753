add_library(swarm_controller task_runner.cc model_store.cc swarm_controller.cc
  peer_service.cc peer_client.cc)
target_link_libraries(swarm_controller PUBLIC swarm_controller_config
  swarm_gatherer_rules swarm_aggregation swarm_learner swarm_streaming
  swarm_persist swarm_security absl::synchronization absl::time)
