# Simulation (issue 4, item 6): the SwarmController over an in-process fake
# network, in virtual time (ManualRunner) or with real threads.
add_library(swarm_fake_network fake_network.cc)
target_link_libraries(swarm_fake_network PUBLIC swarm_controller)

if(SWARM_BUILD_TESTS)
  # Deterministic virtual-time simulations.
  swarm_test(swarm_controller_test SOURCES swarm_controller_test.cc
    LIBS swarm_fake_network swarm_learner LABELS unit simulation)
  set_tests_properties(swarm_controller_test PROPERTIES
    ENVIRONMENT "GTEST_FILTER=-Threaded*")
  # The same binary, real thread pools (for ThreadSanitizer).
  add_test(NAME swarm_controller_threaded_test
    COMMAND swarm_controller_test --gtest_filter=Threaded*)
  set_tests_properties(swarm_controller_threaded_test PROPERTIES
    LABELS "concurrency;simulation" TIMEOUT 600)
endif()
