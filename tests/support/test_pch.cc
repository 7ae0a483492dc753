// The owner of the tests' precompiled header (the top-level CMakeLists.txt,
// swarm_test_pch): CMake compiles the header once for this target and every
// test target reuses it. Nothing here.
