#include "security/model_signature.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "security/certificates.h"

namespace swarm::security {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A SHA-256-sized stream digest (its value does not matter to the signature
// scheme, only that sender and receiver agree on it).
std::string Digest(char fill = 'd') { return std::string(32, fill); }

KeyAndCert Issue(const KeyAndCert& ca, const std::string& name,
                 KeyAlgorithm algorithm = KeyAlgorithm::kEcP256,
                 const std::string& role = kSiteRole) {
  CertRequest request;
  request.common_name = name;
  request.role = role;
  request.key_algorithm = algorithm;
  absl::StatusOr<KeyAndCert> cert = IssueCertificate(ca, request);
  EXPECT_TRUE(cert.ok()) << cert.status();
  return *cert;
}

ModelSigner SignerOf(const KeyAndCert& identity) {
  absl::StatusOr<ModelSigner> signer =
      ModelSigner::Create(identity.key_pem, identity.cert_pem);
  EXPECT_TRUE(signer.ok()) << signer.status();
  return *signer;
}

// A learn task as site-a would scatter it for round 3.
v1::ModelHeader LearnTask(const std::string& sender = "site-a") {
  v1::ModelHeader header;
  header.set_kind(v1::MODEL_KIND_LEARN_TASK);
  header.set_job_id("job-1");
  header.set_round(3);
  header.set_sender(sender);
  header.set_aggregator("site-b");
  header.add_backup_aggregators("site-c");
  header.mutable_best()->set_present(true);
  header.mutable_best()->set_site("site-b");
  header.mutable_best()->set_metric(0.75);
  header.mutable_best()->set_round(2);
  v1::TensorInfo* weights = header.add_tensors();
  weights->set_name("dense/kernel");
  weights->set_dtype(v1::DTYPE_F32);
  weights->add_shape(64);
  weights->add_shape(16);
  weights->set_byte_size(64 * 16 * 4);
  v1::TensorInfo* bias = header.add_tensors();
  bias->set_name("dense/bias");
  bias->set_dtype(v1::DTYPE_F32);
  bias->add_shape(16);
  bias->set_byte_size(16 * 4);
  header.set_total_bytes(64 * 16 * 4 + 16 * 4);
  header.set_chunk_size(1 << 20);
  header.set_digest_algorithm(v1::DIGEST_SHA256);
  (*header.mutable_metadata())["format"] = "pt";
  (*header.mutable_metadata())["epoch"] = "7";
  (*header.mutable_metrics())["accuracy"] = 0.5;
  return header;
}

class ModelSignatureTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ca_ = new KeyAndCert(*CreateCa("job CA"));
    other_ca_ = new KeyAndCert(*CreateCa("another CA"));
    site_a_ = new KeyAndCert(Issue(*ca_, "site-a"));
    site_b_ = new KeyAndCert(Issue(*ca_, "site-b"));
    site_c_ = new KeyAndCert(Issue(*ca_, "site-c"));
    site_a_rsa_ = new KeyAndCert(Issue(*ca_, "site-a", KeyAlgorithm::kRsa2048));
  }
  static void TearDownTestSuite() {
    for (KeyAndCert* p :
         {ca_, other_ca_, site_a_, site_b_, site_c_, site_a_rsa_}) {
      delete p;
    }
  }

  ModelSignatureVerifier Verifier() const {
    absl::StatusOr<ModelSignatureVerifier> verifier =
        ModelSignatureVerifier::Create(ca_->cert_pem);
    EXPECT_TRUE(verifier.ok()) << verifier.status();
    return *verifier;
  }

  // `header` signed by `identity` over `digest`, the signature fields set.
  static v1::ModelHeader Signed(const KeyAndCert& identity,
                                v1::ModelHeader header,
                                const std::string& digest = Digest()) {
    ModelSigner signer = SignerOf(identity);
    absl::StatusOr<std::string> signature = signer.Sign(header, digest);
    EXPECT_TRUE(signature.ok()) << signature.status();
    header.set_digest_signature(*signature);
    header.set_signer_certificate_pem(signer.certificate_pem());
    return header;
  }

  static KeyAndCert* ca_;
  static KeyAndCert* other_ca_;
  static KeyAndCert* site_a_;
  static KeyAndCert* site_b_;
  static KeyAndCert* site_c_;
  static KeyAndCert* site_a_rsa_;
};
KeyAndCert* ModelSignatureTest::ca_;
KeyAndCert* ModelSignatureTest::other_ca_;
KeyAndCert* ModelSignatureTest::site_a_;
KeyAndCert* ModelSignatureTest::site_b_;
KeyAndCert* ModelSignatureTest::site_c_;
KeyAndCert* ModelSignatureTest::site_a_rsa_;

// Refused as a forgery: well formed, but not what the sender signed.
::testing::Matcher<const std::string&> DoesNotVerify() {
  return AllOf(HasSubstr("signature of site-a's learn task for round"),
               HasSubstr("does not verify"));
}

TEST_F(ModelSignatureTest, EcRoundTrip) {
  ModelSigner signer = SignerOf(*site_a_);
  EXPECT_EQ(signer.name(), "site-a");
  EXPECT_EQ(signer.certificate_pem(), site_a_->cert_pem);
  const v1::ModelHeader header = Signed(*site_a_, LearnTask());
  EXPECT_TRUE(Verifier().VerifyHeader(header, Digest()).ok());
  EXPECT_TRUE(Verifier()
                  .Verify(header, Digest(), header.digest_signature(),
                          header.signer_certificate_pem())
                  .ok());
}

TEST_F(ModelSignatureTest, RsaRoundTrip) {
  const v1::ModelHeader header = Signed(*site_a_rsa_, LearnTask());
  EXPECT_EQ(header.digest_signature().size(), 256u);  // RSA 2048.
  absl::Status status = Verifier().VerifyHeader(header, Digest());
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(ModelSignatureTest, SurvivesTheWire) {
  // The receiver parses what the sender serialized; maps may come back in
  // another order.
  v1::ModelHeader header = LearnTask();
  for (int i = 0; i < 20; ++i) {
    (*header.mutable_metadata())[absl::StrCat("key-", i)] = "v";
  }
  const v1::ModelHeader sent = Signed(*site_a_, header);
  v1::ModelHeader received;
  ASSERT_TRUE(received.ParseFromString(sent.SerializeAsString()));
  absl::Status status = Verifier().VerifyHeader(received, Digest());
  EXPECT_TRUE(status.ok()) << status;
}

TEST_F(ModelSignatureTest, SignatureFieldsMayBeSetBeforeSigning) {
  v1::ModelHeader header = LearnTask();
  header.set_signer_certificate_pem(site_a_->cert_pem);
  header.set_digest_signature("placeholder");
  ModelSigner signer = SignerOf(*site_a_);
  header.set_digest_signature(*signer.Sign(header, Digest()));
  EXPECT_TRUE(Verifier().VerifyHeader(header, Digest()).ok());
}

TEST_F(ModelSignatureTest, AFlippedDigestByteIsRefused) {
  const v1::ModelHeader header = Signed(*site_a_, LearnTask());
  for (size_t i : {size_t{0}, size_t{17}, size_t{31}}) {
    std::string digest = Digest();
    digest[i] ^= 0x01;
    absl::Status status = Verifier().VerifyHeader(header, digest);
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(std::string(status.message()), DoesNotVerify());
  }
}

TEST_F(ModelSignatureTest, AReplayedRoundJobOrKindIsRefused) {
  const v1::ModelHeader signed_round_3 = Signed(*site_a_, LearnTask());
  v1::ModelHeader replay = signed_round_3;
  replay.set_round(4);
  EXPECT_THAT(std::string(Verifier().VerifyHeader(replay, Digest()).message()),
              HasSubstr("signature of site-a's learn task for round 4 does "
                        "not verify"));
  replay = signed_round_3;
  replay.set_job_id("job-2");
  EXPECT_THAT(std::string(Verifier().VerifyHeader(replay, Digest()).message()),
              DoesNotVerify());
  replay = signed_round_3;
  replay.set_kind(v1::MODEL_KIND_BEST);
  EXPECT_THAT(std::string(Verifier().VerifyHeader(replay, Digest()).message()),
              HasSubstr("signature of site-a's best model for round 3 does "
                        "not verify"));
}

TEST_F(ModelSignatureTest, AnAlteredTensorTableIsRefused) {
  // The stream digest covers bytes only: same bytes, other meaning.
  const v1::ModelHeader header = Signed(*site_a_, LearnTask());
  std::vector<v1::ModelHeader> altered(4, header);
  altered[0].mutable_tensors(0)->set_dtype(v1::DTYPE_I32);  // Same size.
  altered[1].mutable_tensors(0)->set_shape(0, 16);          // Transposed.
  altered[1].mutable_tensors(0)->set_shape(1, 64);
  altered[2].mutable_tensors(1)->set_name("dense/kernel2");
  altered[3].mutable_tensors()->SwapElements(0, 1);
  for (const v1::ModelHeader& forged : altered) {
    absl::Status status = Verifier().VerifyHeader(forged, Digest());
    EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(std::string(status.message()), DoesNotVerify());
  }
}

// Sets every field of `message` to a value other than its default (one
// element for a repeated field, one entry for a map), recursively.
void FillEveryField(Message* message, int depth = 0) {
  const Reflection* r = message->GetReflection();
  const auto* descriptor = message->GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    const std::string text = absl::StrCat("v-", field->name());
    if (field->is_repeated()) {
      if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
        if (depth < 3) FillEveryField(r->AddMessage(message, field), depth + 1);
        continue;
      }
      switch (field->cpp_type()) {
        case FieldDescriptor::CPPTYPE_INT32:
          r->AddInt32(message, field, 7);
          break;
        case FieldDescriptor::CPPTYPE_INT64:
          r->AddInt64(message, field, 7);
          break;
        case FieldDescriptor::CPPTYPE_UINT32:
          r->AddUInt32(message, field, 7);
          break;
        case FieldDescriptor::CPPTYPE_UINT64:
          r->AddUInt64(message, field, 7);
          break;
        case FieldDescriptor::CPPTYPE_DOUBLE:
          r->AddDouble(message, field, 7);
          break;
        case FieldDescriptor::CPPTYPE_FLOAT:
          r->AddFloat(message, field, 7);
          break;
        case FieldDescriptor::CPPTYPE_BOOL:
          r->AddBool(message, field, true);
          break;
        case FieldDescriptor::CPPTYPE_ENUM:
          r->AddEnumValue(message, field,
                          field->enum_type()
                              ->value(field->enum_type()->value_count() - 1)
                              ->number());
          break;
        case FieldDescriptor::CPPTYPE_STRING:
          r->AddString(message, field, text);
          break;
        default:
          break;
      }
      continue;
    }
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(message, field, 7);
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(message, field, 7);
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(message, field, 7);
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(message, field, 7);
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(message, field, 7);
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        r->SetFloat(message, field, 7);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(message, field, true);
        break;
      case FieldDescriptor::CPPTYPE_ENUM:
        r->SetEnumValue(message, field,
                        field->enum_type()
                            ->value(field->enum_type()->value_count() - 1)
                            ->number());
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetString(message, field, text);
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (depth < 3)
          FillEveryField(r->MutableMessage(message, field), depth + 1);
        break;
    }
  }
}

// Changes the value of `field` of `message` (which is set).
void Alter(Message* message, const FieldDescriptor* field) {
  const Reflection* r = message->GetReflection();
  if (field->is_repeated()) {
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      Message* added = r->AddMessage(message, field);
      if (field->is_map()) {
        added->GetReflection()->SetString(
            added, field->message_type()->map_key(), "added-key");
      }
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
      r->AddString(message, field, "added");
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_UINT64) {
      r->AddUInt64(message, field, 8);
    } else {
      ADD_FAILURE() << "no alteration for " << field->full_name();
    }
    return;
  }
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      r->SetInt32(message, field, r->GetInt32(*message, field) + 1);
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      r->SetInt64(message, field, r->GetInt64(*message, field) + 1);
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      r->SetUInt32(message, field, r->GetUInt32(*message, field) + 1);
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      r->SetUInt64(message, field, r->GetUInt64(*message, field) + 1);
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      r->SetDouble(message, field, r->GetDouble(*message, field) + 1);
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      r->SetFloat(message, field, r->GetFloat(*message, field) + 1);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      r->SetBool(message, field, !r->GetBool(*message, field));
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      // The first value (the fill used the last).
      r->SetEnumValue(message, field, field->enum_type()->value(0)->number());
      break;
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(message, field, r->GetString(*message, field) + "x");
      break;
    case FieldDescriptor::CPPTYPE_MESSAGE: {
      // The nested message's first field altered in turn.
      Message* nested = r->MutableMessage(message, field);
      Alter(nested, nested->GetDescriptor()->field(0));
      break;
    }
  }
}

TEST_F(ModelSignatureTest, EveryHeaderFieldButTheSignatureIsSigned) {
  v1::ModelHeader header;
  FillEveryField(&header);
  header.set_sender("site-a");
  header.set_kind(v1::MODEL_KIND_LEARN_TASK);
  header.set_digest_algorithm(v1::DIGEST_SHA256);
  header.clear_digest_signature();
  header.clear_signer_certificate_pem();
  const v1::ModelHeader signed_header = Signed(*site_a_, header);
  ASSERT_TRUE(Verifier().VerifyHeader(signed_header, Digest()).ok());

  const std::string signed_message =
      *ModelSignatureMessage(signed_header, Digest());
  const auto* descriptor = v1::ModelHeader::descriptor();
  std::vector<std::string> unsigned_fields;
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    v1::ModelHeader forged = signed_header;
    Alter(&forged, field);
    ASSERT_NE(forged.SerializeAsString(), signed_header.SerializeAsString())
        << field->name() << " was not altered";
    if (*ModelSignatureMessage(forged, Digest()) == signed_message) {
      unsigned_fields.push_back(field->name());
      continue;
    }
    const absl::Status status = Verifier().VerifyHeader(forged, Digest());
    if (field->name() == "sender") {
      EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
      EXPECT_THAT(std::string(status.message()),
                  HasSubstr("certificate names site-a, the header claims "
                            "site-ax"));
    } else if (field->name() == "digest_algorithm") {
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(status.message()), HasSubstr("DIGEST_SHA256"));
    } else {
      EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied)
          << field->name() << ": " << status;
      EXPECT_THAT(std::string(status.message()), HasSubstr("does not verify"))
          << field->name();
    }
  }
  // Only the signature, the certificate that checks it and the forward list
  // are left out: a field that a forwarder may change must be added here on
  // purpose.
  EXPECT_THAT(unsigned_fields,
              ::testing::UnorderedElementsAre(
                  "digest_signature", "signer_certificate_pem", "relay_to"));
}

TEST_F(ModelSignatureTest, TheMessageCoversAllButTheSignatureFields) {
  const v1::ModelHeader header = LearnTask();
  const std::string message = *ModelSignatureMessage(header, Digest());
  EXPECT_THAT(message, HasSubstr(kModelSignatureDomain));
  v1::ModelHeader with_signature = header;
  with_signature.set_digest_signature("sig");
  with_signature.set_signer_certificate_pem("pem");
  EXPECT_EQ(*ModelSignatureMessage(with_signature, Digest()), message);
  // Length prefixes: bytes moved from one string field to the next give
  // another message.
  // ("job-1", "site-a") and ("job-1s", "ite-a") concatenate alike.
  v1::ModelHeader shifted = header;
  shifted.set_job_id("job-1s");
  shifted.set_sender("ite-a");
  EXPECT_NE(*ModelSignatureMessage(shifted, Digest()), message);
  EXPECT_NE(*ModelSignatureMessage(header, Digest('e')), message);
}

TEST_F(ModelSignatureTest, UnknownHeaderFieldsAreRefused) {
  v1::ModelHeader header = Signed(*site_a_, LearnTask());
  header.GetReflection()->MutableUnknownFields(&header)->AddVarint(1000, 1);
  absl::Status status = Verifier().VerifyHeader(header, Digest());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("fields this build does not know"));
  EXPECT_EQ(SignerOf(*site_a_).Sign(header, Digest()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelSignatureTest, ACertificateOfAnotherCaIsRefused) {
  const KeyAndCert impostor = Issue(*other_ca_, "site-a");
  const v1::ModelHeader header = Signed(impostor, LearnTask());
  absl::Status status = Verifier().VerifyHeader(header, Digest());
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("certificate of the signer site-a is not issued by "
                        "the job's CA"));
  EXPECT_EQ(Verifier().VerifySigner(impostor.cert_pem, "site-a").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(ModelSignatureTest, ACertificateOfAnotherSiteIsRefusedNamingBoth) {
  // site-b signs its own model, then a forwarder claims site-c sent it.
  v1::ModelHeader header = Signed(*site_b_, LearnTask("site-b"));
  header.set_sender("site-c");
  absl::Status status = Verifier().VerifyHeader(header, Digest());
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("certificate names site-b, the header claims site-c"));
  EXPECT_THAT(
      std::string(
          Verifier().VerifySigner(site_b_->cert_pem, "site-c").message()),
      HasSubstr("certificate names site-b, the header claims site-c"));
}

TEST_F(ModelSignatureTest,
       TheRightCertificateWithAnotherSitesSignatureIsRefused) {
  // A forwarder signs with its own key and attaches the sender's certificate.
  v1::ModelHeader header = Signed(*site_b_, LearnTask("site-b"));
  header.set_sender("site-a");
  header.set_signer_certificate_pem(site_a_->cert_pem);
  absl::Status status = Verifier().VerifyHeader(header, Digest());
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()), DoesNotVerify());
}

TEST_F(ModelSignatureTest, ASignerOnlySignsForItsOwnName) {
  absl::Status status =
      SignerOf(*site_b_).Sign(LearnTask("site-c"), Digest()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("key of site-b"));
}

TEST_F(ModelSignatureTest, AnExpiredOrNotYetValidCertificateIsRefused) {
  CertRequest request;
  request.common_name = "site-a";
  request.role = kSiteRole;
  request.not_before = absl::Now() - absl::Hours(48);
  request.not_after = absl::Now() - absl::Hours(24);
  const KeyAndCert expired = *IssueCertificate(*ca_, request);
  absl::Status status =
      Verifier().VerifyHeader(Signed(expired, LearnTask()), Digest());
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("certificate of the signer site-a has expired"));

  request.not_before = absl::Now() + absl::Hours(24);
  request.not_after = absl::Now() + absl::Hours(48);
  const KeyAndCert early = *IssueCertificate(*ca_, request);
  status = Verifier().VerifyHeader(Signed(early, LearnTask()), Digest());
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("certificate of the signer site-a is not valid yet"));
}

TEST_F(ModelSignatureTest, OnlyASiteSignsModels) {
  const KeyAndCert admin =
      Issue(*ca_, "site-a", KeyAlgorithm::kEcP256, kAdminRole);
  absl::Status status =
      Verifier().VerifyHeader(Signed(admin, LearnTask()), Digest());
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("certificate of site-a has role \"swarm-admin\""));
  // The CA's own certificate chains to itself, but is no site.
  v1::ModelHeader header = LearnTask("job CA");
  status = Verifier().VerifyHeader(Signed(*ca_, header), Digest());
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("has role \"swarm-ca\""));
}

TEST_F(ModelSignatureTest, ANonCryptographicDigestIsRefused) {
  v1::ModelHeader header = LearnTask();
  header.set_digest_algorithm(v1::DIGEST_XXH3_128);
  const std::string xxh3_digest(16, 'x');
  absl::Status status = SignerOf(*site_a_).Sign(header, xxh3_digest).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("DIGEST_XXH3_128 stream digest; a signed model needs "
                        "DIGEST_SHA256"));
  status = Verifier().Verify(header, xxh3_digest, "sig", site_a_->cert_pem);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  // A SHA-256 header with a digest of another length.
  header.set_digest_algorithm(v1::DIGEST_SHA256);
  status = Verifier().Verify(header, xxh3_digest, "sig", site_a_->cert_pem);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("is 16 bytes"));
}

TEST_F(ModelSignatureTest, EmptyOrGarbageSignatureIsInvalidArgument) {
  const v1::ModelHeader header = Signed(*site_a_, LearnTask());
  const v1::ModelHeader rsa_header = Signed(*site_a_rsa_, LearnTask());
  struct Case {
    const v1::ModelHeader* header;
    std::string signature;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {&header, "", "carries no digest signature"},
      {&header, "garbage", "is not a DER ECDSA signature"},
      {&header, std::string(300, '\xff'), "is not a DER ECDSA signature"},
      // A valid DER signature followed by a byte.
      {&header, header.digest_signature() + "x", "is not a DER ECDSA"},
      {&rsa_header, "garbage",
       "is 7 bytes; an RSA signature with this key "
       "is 256"},
      // An EC signature presented with an RSA certificate.
      {&rsa_header, header.digest_signature(), "an RSA signature"},
  };
  for (const Case& c : cases) {
    absl::Status status = Verifier().Verify(*c.header, Digest(), c.signature,
                                            c.header->signer_certificate_pem());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.expected));
  }
  // Of the right RSA length but random: a forgery, not garbage.
  absl::Status status =
      Verifier().Verify(rsa_header, Digest(), std::string(256, '\x42'),
                        rsa_header.signer_certificate_pem());
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  // An RSA signature presented with an EC certificate.
  status = Verifier().Verify(header, Digest(), rsa_header.digest_signature(),
                             header.signer_certificate_pem());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ModelSignatureTest, EmptyOrGarbageCertificateIsInvalidArgument) {
  const v1::ModelHeader header = Signed(*site_a_, LearnTask());
  std::string truncated = site_a_->cert_pem;
  truncated.resize(truncated.size() / 2);
  std::string corrupt = site_a_->cert_pem;
  corrupt[100] = corrupt[100] == 'A' ? 'B' : 'A';  // Inside the base64.
  for (const std::string& pem :
       {std::string(), std::string("garbage"), truncated,
        std::string("-----BEGIN CERTIFICATE-----\nAAAA\n"
                    "-----END CERTIFICATE-----\n"),
        site_a_->key_pem}) {
    absl::Status status =
        Verifier().Verify(header, Digest(), header.digest_signature(), pem);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("certificate of the signer"));
    EXPECT_EQ(Verifier().VerifySigner(pem, "site-a").code(),
              absl::StatusCode::kInvalidArgument);
  }
  // A changed byte inside the certificate breaks its CA signature (or its
  // encoding): refused either way, never accepted.
  absl::Status status =
      Verifier().Verify(header, Digest(), header.digest_signature(), corrupt);
  EXPECT_FALSE(status.ok());
}

TEST_F(ModelSignatureTest, CreateRefusesBadKeysAndCertificates) {
  EXPECT_EQ(ModelSigner::Create("", site_a_->cert_pem).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelSigner::Create("garbage", site_a_->cert_pem).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelSigner::Create(site_a_->key_pem, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status status =
      ModelSigner::Create(site_b_->key_pem, site_a_->cert_pem).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("not the certificate's"));
  EXPECT_TRUE(
      ModelSigner::Create(site_a_rsa_->key_pem, site_a_rsa_->cert_pem).ok());

  EXPECT_EQ(ModelSignatureVerifier::Create("").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelSignatureVerifier::Create("garbage").status().code(),
            absl::StatusCode::kInvalidArgument);
  status = ModelSignatureVerifier::Create(site_a_->cert_pem).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("not a CA"));
}

TEST_F(ModelSignatureTest, OneSignerAndOneVerifierServeManyThreads) {
  const ModelSigner ec_signer = SignerOf(*site_a_);
  const ModelSigner rsa_signer = SignerOf(*site_a_rsa_);
  const ModelSignatureVerifier verifier = Verifier();
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const ModelSigner& signer = t % 2 == 0 ? ec_signer : rsa_signer;
      for (int i = 0; i < 20; ++i) {
        v1::ModelHeader header = LearnTask();
        header.set_round(static_cast<uint32_t>(t * 100 + i));
        absl::StatusOr<std::string> signature = signer.Sign(header, Digest());
        if (!signature.ok() ||
            !verifier
                 .Verify(header, Digest(), *signature, signer.certificate_pem())
                 .ok() ||
            verifier
                .Verify(header, Digest('e'), *signature,
                        signer.certificate_pem())
                .ok()) {
          ++failures[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(failures, ::testing::Each(0));
}

}  // namespace
}  // namespace swarm::security
