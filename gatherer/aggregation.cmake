# Aggregators: FedAvg (running sum), coordinate-wise median and trimmed mean
# (results on disk, read back in blocks), and the sink that checks incoming
# results as they stream in.
add_library(swarm_aggregation
  aggregator.cc
  aggregator_kernels.cc
  coordinate_aggregator.cc
  fedavg.cc)
target_link_libraries(swarm_aggregation
  PUBLIC swarm_streaming swarm_common swarm_proto Threads::Threads
         absl::status absl::statusor absl::strings absl::str_format
         absl::flat_hash_map)
# The compensated sums rely on every operation being rounded on its own.
set_source_files_properties(aggregator_kernels.cc PROPERTIES
  COMPILE_OPTIONS "-ffp-contract=off")

# Eigen's half / bfloat16 serve as an independent reference for our
# conversions when available (Debian's libeigen3-dev).
find_package(Eigen3 3.3 CONFIG QUIET)

swarm_test(aggregator_kernels_test
  SOURCES aggregator_kernels_test.cc
  LIBS swarm_aggregation
  LABELS unit)
if(TARGET aggregator_kernels_test AND TARGET Eigen3::Eigen)
  target_link_libraries(aggregator_kernels_test PRIVATE Eigen3::Eigen)
  target_compile_definitions(aggregator_kernels_test PRIVATE SWARM_HAVE_EIGEN=1)
endif()

# These run Add / Finish on two threads for large models.
swarm_test(fedavg_test
  SOURCES fedavg_test.cc
  LIBS swarm_aggregation
  LABELS concurrency)
swarm_test(coordinate_aggregator_test
  SOURCES coordinate_aggregator_test.cc
  LIBS swarm_aggregation
  LABELS concurrency)
swarm_test(aggregator_test
  SOURCES aggregator_test.cc
  LIBS swarm_aggregation
  LABELS concurrency)
