// SHA-256 for model streams (StreamDigest for DIGEST_SHA256, the digest a
// signed model needs), on OpenSSL's libcrypto. The core (streaming/) holds
// the interface and XXH3-128 only, so it links no libcrypto: a program that
// sends or receives SHA-256 streams calls RegisterSha256StreamDigest() once
// at start (the daemon, swarmctl, the stream bench, and the tests that need
// it).
#ifndef SWARM_SECURITY_SHA256_DIGEST_H_
#define SWARM_SECURITY_SHA256_DIGEST_H_

#include <memory>

#include "streaming/digest.h"

namespace swarm::security {

// A new SHA-256 stream digest.
std::unique_ptr<StreamDigest> NewSha256StreamDigest();

// Registers NewSha256StreamDigest as the program's DIGEST_SHA256 (see
// RegisterStreamDigest). Idempotent; safe from any thread.
void RegisterSha256StreamDigest();

}  // namespace swarm::security

#endif  // SWARM_SECURITY_SHA256_DIGEST_H_
