// The owner of the libraries' precompiled header (the top-level
// CMakeLists.txt, SWARM_PCH): CMake compiles the header once for this target
// and every library and program reuses it. Nothing here.
