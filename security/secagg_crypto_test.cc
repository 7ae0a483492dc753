#include "security/secagg_crypto.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "secagg/masking.h"

namespace swarm::security {
namespace {

using ::testing::HasSubstr;

std::string Hex(absl::string_view hex) { return absl::HexStringToBytes(hex); }
std::string ToHex(absl::string_view bytes) {
  return absl::BytesToHexString(bytes);
}
std::string SeedBytes(const secagg::Seed& seed) {
  return std::string(reinterpret_cast<const char*>(seed.data()), seed.size());
}

// RFC 7748 section 6.1.
constexpr absl::string_view kAlicePrivate =
    "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a";
constexpr absl::string_view kAlicePublic =
    "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a";
constexpr absl::string_view kBobPrivate =
    "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb";
constexpr absl::string_view kBobPublic =
    "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f";
constexpr absl::string_view kShared =
    "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742";

TEST(SecAggCryptoTest, HkdfMatchesRfc5869TestCase1) {
  absl::StatusOr<std::string> okm =
      HkdfSha256(std::string(22, '\x0b'), Hex("000102030405060708090a0b0c"),
                 Hex("f0f1f2f3f4f5f6f7f8f9"), 42);
  ASSERT_TRUE(okm.ok()) << okm.status();
  EXPECT_EQ(ToHex(*okm),
            "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
            "34007208d5b887185865");
}

TEST(SecAggCryptoTest, AesCtrMatchesNistSp800_38aF55) {
  std::string data =
      Hex("6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51"
          "30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710");
  ASSERT_TRUE(AesCtrXor(Hex("603deb1015ca71be2b73aef0857d77811f352c073b6108d7"
                            "2d9810a30914dff4"),
                        Hex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"),
                        absl::MakeSpan(reinterpret_cast<uint8_t*>(data.data()),
                                       data.size()))
                  .ok());
  EXPECT_EQ(ToHex(data),
            "601ec313775789a5b7a7f504bbf3d228f443e3ca4d62b59aca84e990cacaf5c5"
            "2b0930daa23de94ce87017ba2d84988ddfc9c58db67aada613c2dd08457941a6");
}

TEST(SecAggCryptoTest, X25519MatchesRfc7748AndBothSidesDeriveOneSeed) {
  absl::StatusOr<AgreementKey> alice =
      AgreementKey::FromPrivateKey(Hex(kAlicePrivate));
  absl::StatusOr<AgreementKey> bob =
      AgreementKey::FromPrivateKey(Hex(kBobPrivate));
  ASSERT_TRUE(alice.ok() && bob.ok());
  EXPECT_EQ(ToHex(alice->public_key()), kAlicePublic);
  EXPECT_EQ(ToHex(bob->public_key()), kBobPublic);
  EXPECT_EQ(ToHex(alice->private_key()), kAlicePrivate);
  const PairContext context{"job-1", 7, 2, "site-b", "site-a"};
  absl::StatusOr<secagg::Seed> from_alice =
      alice->PairSeed(Hex(kBobPublic), context);
  absl::StatusOr<secagg::Seed> from_bob = bob->PairSeed(
      Hex(kAlicePublic), PairContext{"job-1", 7, 2, "site-a", "site-b"});
  ASSERT_TRUE(from_alice.ok()) << from_alice.status();
  ASSERT_TRUE(from_bob.ok()) << from_bob.status();
  EXPECT_EQ(*from_alice, *from_bob);
  // The documented derivation: HKDF-SHA256 of the RFC's shared secret.
  const std::string info = std::string("job-1") + '\0' + Hex("00000007") +
                           Hex("00000002") + "site-a" + '\0' + "site-b";
  absl::StatusOr<std::string> expected =
      HkdfSha256(Hex(kShared), "swarm secure aggregation v1", info, 32);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(SeedBytes(*from_alice), *expected);
}

TEST(SecAggCryptoTest, EachRoundAttemptAndPairHasItsOwnSeed) {
  absl::StatusOr<AgreementKey> alice =
      AgreementKey::FromPrivateKey(Hex(kAlicePrivate));
  ASSERT_TRUE(alice.ok());
  const std::string bob = Hex(kBobPublic);
  const secagg::Seed base = *alice->PairSeed(bob, {"j", 1, 0, "a", "b"});
  EXPECT_NE(base, *alice->PairSeed(bob, {"j", 2, 0, "a", "b"}));
  EXPECT_NE(base, *alice->PairSeed(bob, {"j", 1, 1, "a", "b"}));
  EXPECT_NE(base, *alice->PairSeed(bob, {"k", 1, 0, "a", "b"}));
  EXPECT_NE(base, *alice->PairSeed(bob, {"j", 1, 0, "a", "c"}));
}

TEST(SecAggCryptoTest, ForgedOrMalformedPublicKeysAreRefused) {
  absl::StatusOr<AgreementKey> key = AgreementKey::Generate();
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->public_key().size(), 32u);
  // The all-zero point has small order: the shared secret is all zeros.
  absl::StatusOr<secagg::Seed> zero =
      key->PairSeed(std::string(32, '\0'), {"j", 0, 0, "a", "b"});
  ASSERT_FALSE(zero.ok());
  EXPECT_THAT(zero.status().message(), HasSubstr("no usable shared secret"));
  EXPECT_THAT(key->PairSeed("short", {"j", 0, 0, "a", "b"}).status().message(),
              HasSubstr("32 bytes"));
  EXPECT_FALSE(AgreementKey::FromPrivateKey("short").ok());
}

TEST(SecAggCryptoTest, TheMaskStreamIsTheAesCtrKeystreamAndSeeksAnywhere) {
  secagg::Seed seed;
  for (size_t i = 0; i < seed.size(); ++i) seed[i] = static_cast<uint8_t>(i);
  const AesCtrMaskGenerator prg;
  std::vector<uint32_t> whole(10000, 0);
  EXPECT_TRUE(prg.Apply(seed, false, 0, absl::MakeSpan(whole)).ok());
  // Word k is keystream bytes 4k..4k+3, little-endian.
  std::string keystream(64, '\0');
  ASSERT_TRUE(AesCtrXor(SeedBytes(seed), std::string(16, '\0'),
                        absl::MakeSpan(
                            reinterpret_cast<uint8_t*>(keystream.data()), 64))
                  .ok());
  for (int k = 0; k < 16; ++k) {
    uint32_t word;
    std::memcpy(&word, keystream.data() + 4 * k, 4);  // little-endian host
    EXPECT_EQ(whole[k], word) << k;
  }
  // In pieces at offsets that are not block-aligned: the same words.
  std::vector<uint32_t> pieces(10000, 0);
  const std::vector<size_t> bounds = {0, 3, 5, 4099, 8191, 10000};
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    EXPECT_TRUE(prg.Apply(seed, false, bounds[i],
                          absl::MakeSpan(pieces).subspan(
                              bounds[i], bounds[i + 1] - bounds[i]))
                    .ok());
  }
  EXPECT_EQ(pieces, whole);
  // Subtracting takes it off again.
  EXPECT_TRUE(prg.Apply(seed, true, 0, absl::MakeSpan(pieces)).ok());
  EXPECT_EQ(pieces, std::vector<uint32_t>(10000, 0));
}

// Chi-square of the bytes of `words` against uniform (255 degrees of
// freedom: 99.9% of uniform samples stay below ~330).
double ByteChiSquare(const std::vector<uint32_t>& words) {
  std::vector<double> counts(256, 0);
  for (uint32_t w : words) {
    for (int s = 0; s < 32; s += 8) ++counts[(w >> s) & 0xFF];
  }
  const double expected = words.size() * 4 / 256.0;
  double chi2 = 0;
  for (double c : counts) chi2 += (c - expected) * (c - expected) / expected;
  return chi2;
}

TEST(SecAggCryptoTest, AMaskedUpdateLooksUniformWhereThePlainOneDoesNot) {
  // An encoded update of small values near 0 (what a model diff looks like),
  // masked as trainer "site-b" of three.
  std::vector<uint32_t> update(65536);
  for (size_t i = 0; i < update.size(); ++i) {
    update[i] = static_cast<uint32_t>(static_cast<int32_t>(i % 200) - 100);
  }
  EXPECT_GT(ByteChiSquare(update), 1000.0);
  secagg::Seed self_seed;
  ASSERT_TRUE(SecureRandomBytes(absl::MakeSpan(self_seed)).ok());
  absl::StatusOr<AgreementKey> me = AgreementKey::Generate();
  absl::StatusOr<AgreementKey> a = AgreementKey::Generate();
  absl::StatusOr<AgreementKey> c = AgreementKey::Generate();
  ASSERT_TRUE(me.ok() && a.ok() && c.ok());
  std::vector<secagg::PairSeed> pairs = {
      {"site-a",
       *me->PairSeed(a->public_key(), {"j", 0, 0, "site-a", "site-b"})},
      {"site-c",
       *me->PairSeed(c->public_key(), {"j", 0, 0, "site-b", "site-c"})}};
  const AesCtrMaskGenerator prg;
  EXPECT_TRUE(secagg::MaskUpdate(prg, "site-b", self_seed, pairs, 0,
                                 absl::MakeSpan(update))
                  .ok());
  EXPECT_LT(ByteChiSquare(update), 330.0);
}

}  // namespace
}  // namespace swarm::security
