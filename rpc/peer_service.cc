#include "rpc/peer_service.h"

#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/logging.h"
#include "common/version.h"
#include "config/job_config.h"
#include "controller/model_receiver.h"
#include "controller/replies.h"
#include "rpc/frame_relay.h"
#include "rpc/grpc_stream.h"
#include "rpc/peer_service_internal.h"
#include "rpc/stream_watchdog.h"
#include "security/certificates.h"
#include "streaming/chunker.h"
#include "streaming/digest.h"

namespace swarm {
namespace {

// How much earlier than the caller's deadline a held RequestToSubmit answers,
// so the reply arrives in time.
constexpr absl::Duration kDeadlineMargin = kHoldMargin;
// "ipv4:10.0.0.1:5555" -> "ipv4:10.0.0.1": calls from one host share a
// budget when there is no certificate to tell peers apart.
std::string HostOf(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

}  // namespace

grpc::Status PeerService::Authorize(grpc::ServerContextBase* context,
                                    absl::string_view method, Rule rule,
                                    absl::string_view sender,
                                    std::unique_ptr<CallSlot>* slot) {
  const security::PeerIdentity identity = security::IdentityOf(*context);
  auto refuse = [&](grpc::StatusCode code, std::string reason) {
    SWARM_LOG_WARNING(
        "refused %s from %s (%s): %s", method,
        identity.name.empty() ? std::string(sender) : identity.name,
        context->peer(), reason);
    return grpc::Status(code, reason);
  };
  if (options_.tls) {
    if (!identity.authenticated) {
      return refuse(grpc::StatusCode::UNAUTHENTICATED,
                    "no verified client certificate");
    }
    switch (rule) {
      case Rule::kAdmin:
        if (identity.role != security::kAdminRole) {
          return refuse(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(method, " is for admins; ", identity.name,
                                     " has the role \"", identity.role, "\""));
        }
        break;
      case Rule::kAnyPeer:
        break;
      case Rule::kSender:
        if (identity.role != security::kSiteRole) {
          return refuse(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat(method, " is for sites; ", identity.name,
                                     " has the role \"", identity.role, "\""));
        }
        break;
      case Rule::kFetch: {
        if (identity.role == security::kAdminRole) break;
        const std::optional<v1::JobConfig> job = site_->job();
        if (identity.role != security::kSiteRole || !job.has_value() ||
            FindSite(*job, identity.name) == nullptr) {
          return refuse(
              grpc::StatusCode::PERMISSION_DENIED,
              absl::StrCat(identity.name,
                           " is neither an admin nor a site of the job"));
        }
        break;
      }
    }
    // Every request names its sender, and under TLS that name is the
    // certificate's, whatever the call (the README's rule): a log line or an
    // abort reason never shows a name the caller could not prove.
    if (sender != identity.name) {
      return refuse(grpc::StatusCode::PERMISSION_DENIED,
                    absl::StrCat("sender \"", sender,
                                 "\" does not match the certificate of \"",
                                 identity.name, "\""));
    }
  }
  // Whose budget the call counts against: the certificate's name. Without
  // TLS the claimed sender is trusted (as everywhere in insecure mode), on
  // its host: several sites often share one host, and counted by host alone
  // they would starve each other.
  const std::string peer =
      identity.authenticated ? identity.name
      : sender.empty()       ? HostOf(context->peer())
                       : absl::StrCat(sender, "@", HostOf(context->peer()));
  {
    absl::MutexLock lock(&mu_);
    int& calls = calls_[peer];
    if (calls >= options_.max_calls_per_peer) {
      return refuse(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat(peer, " already has ", calls, " calls in flight (limit ",
                       options_.max_calls_per_peer, ")"));
    }
    ++calls;
  }
  *slot = std::make_unique<CallSlot>(this, peer);
  return grpc::Status::OK;
}

void PeerService::ReleaseSlot(const std::string& peer) {
  absl::MutexLock lock(&mu_);
  auto it = calls_.find(peer);
  if (it != calls_.end() && --it->second <= 0) calls_.erase(it);
}

PeerService::~PeerService() = default;

PeerService::PeerService(SiteDriver* site, PeerServiceOptions options)
    : site_(site),
      options_(std::move(options)),
      watchdog_(std::make_shared<StreamWatchdog>()) {
  // In the order of the service in proto/swarm.proto.
  AddFirstMethods();
  AddLastMethods();
}

void PeerService::AddFirstMethods() {
  AddUnaryMethod<v1::ConfigureRequest, v1::Reply>(
      "Configure",
      [this](grpc::ServerContext* context, const v1::ConfigureRequest* request,
             v1::Reply* reply) {
        std::unique_ptr<CallSlot> slot;
        grpc::Status allowed = Authorize(context, "Configure", Rule::kAdmin,
                                         request->sender(), &slot);
        if (!allowed.ok()) return allowed;
        // A sender of another wire protocol major version is refused before
        // the job is looked at (common/version.h).
        absl::Status compatible = CheckProtocolCompatible(
            PeerProtocolVersion(request->protocol(), request->has_protocol()),
            absl::StrCat("sender ", request->sender()));
        if (!compatible.ok()) {
          reply->set_outcome(v1::OUTCOME_BAD_REQUEST);
          reply->set_message(std::string(compatible.message()));
          return grpc::Status::OK;
        }
        if (options_.check_configure) {
          absl::Status allowed_here = options_.check_configure(*request);
          if (!allowed_here.ok()) {
            reply->set_outcome(v1::OUTCOME_REJECTED);
            reply->set_message(std::string(allowed_here.message()));
            return grpc::Status::OK;
          }
        }
        *reply = site_->Configure(*request);
        return grpc::Status::OK;
      });
  AddUnaryMethod<v1::StartRequest, v1::Reply>(
      "Start", [this](grpc::ServerContext* context,
                      const v1::StartRequest* request, v1::Reply* reply) {
        std::unique_ptr<CallSlot> slot;
        grpc::Status allowed =
            Authorize(context, "Start", Rule::kAdmin, request->sender(), &slot);
        if (!allowed.ok()) return allowed;
        // Waits for the first round's learn tasks to be out, at most until
        // shortly before the call's deadline (an hour without one), so that
        // the "start goes on" answer reaches the caller in time.
        absl::Time deadline = absl::Now() + absl::Hours(1);
        if (context->deadline() !=
            std::chrono::system_clock::time_point::max()) {
          deadline = std::min(deadline, absl::FromChrono(context->deadline()) -
                                            kDeadlineMargin);
        }
        *reply = site_->Start(*request, deadline);
        return grpc::Status::OK;
      });
  auto receive = [this](grpc::CallbackServerContext* context,
                        v1::Reply* reply) {
    return ReceiveModel(context, reply);
  };
  AddCallbackUploadMethod("LearnTask", receive);
  AddCallbackUnaryMethod<v1::SubmitPermissionRequest,
                         v1::SubmitPermissionReply>(
      "RequestToSubmit", [this](grpc::CallbackServerContext* context,
                                const v1::SubmitPermissionRequest* request,
                                v1::SubmitPermissionReply* reply) {
        return RequestToSubmit(context, request, reply);
      });
  AddCallbackUploadMethod("SubmitResult", receive);
}

void PeerService::AddLastMethods() {
  AddUnaryMethod<v1::ShareBestRequest, v1::Reply>(
      "ShareBest",
      [this](grpc::ServerContext* context, const v1::ShareBestRequest* request,
             v1::Reply* reply) {
        std::unique_ptr<CallSlot> slot;
        grpc::Status allowed = Authorize(context, "ShareBest", Rule::kSender,
                                         request->sender(), &slot);
        if (!allowed.ok()) return allowed;
        *reply = site_->ShareBest(*request);
        return grpc::Status::OK;
      });
  AddCallbackUploadMethod(
      "FinalResult",
      [this](grpc::CallbackServerContext* context, v1::Reply* reply) {
        return ReceiveModel(context, reply);
      });
  AddCallbackUnaryMethod<v1::StatusRequest, v1::StatusReply>(
      "Status",
      [this](grpc::CallbackServerContext* context,
             const v1::StatusRequest* request, v1::StatusReply* reply) {
        return Status(context, request, reply);
      });
  AddModelDownloadMethod(
      "FetchModel",
      [this](grpc::ServerContext* context, const v1::FetchModelRequest* request,
             grpc::ServerWriter<grpc::ByteBuffer>* writer) {
        return FetchModel(context, request, writer);
      });
  AddUnaryMethod<v1::HistoryRequest, v1::HistoryReply>(
      "History",
      [this](grpc::ServerContext* context, const v1::HistoryRequest* request,
             v1::HistoryReply* reply) {
        std::unique_ptr<CallSlot> slot;
        grpc::Status allowed = Authorize(context, "History", Rule::kAnyPeer,
                                         request->sender(), &slot);
        if (!allowed.ok()) return allowed;
        if (!options_.history) {
          return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                              "this site keeps no history");
        }
        *reply = options_.history(*request);
        return grpc::Status::OK;
      });
  AddUnaryMethod<v1::AbortRequest, v1::Reply>(
      "Abort", [this](grpc::ServerContext* context,
                      const v1::AbortRequest* request, v1::Reply* reply) {
        std::unique_ptr<CallSlot> slot;
        grpc::Status allowed =
            Authorize(context, "Abort", Rule::kAdmin, request->sender(), &slot);
        if (!allowed.ok()) return allowed;
        *reply = site_->Abort(*request);
        return grpc::Status::OK;
      });
}

// A unary call answered now or held until something changes, as a reactor:
// a held call parks no thread. `attempt(last)` computes the reply and says
// whether it is the answer (with `last`, the deadline has come: it must be);
// otherwise `wait(wake)` asks the controller to run `wake` at the next
// change or at the deadline. The call finishes with `status()` once
// answered, or CANCELLED when the client goes away.
class PeerService::HeldCall final : public grpc::ServerUnaryReactor {
 public:
  using Attempt = std::function<bool(bool last)>;
  using Wait = std::function<void(absl::Time until, std::function<void()>)>;

  HeldCall(std::unique_ptr<CallSlot> slot, absl::Time deadline, Attempt attempt,
           Wait wait, std::function<grpc::Status()> status)
      : shared_(std::make_shared<Shared>()),
        slot_(std::move(slot)),
        deadline_(deadline),
        attempt_(std::move(attempt)),
        wait_(std::move(wait)),
        status_(std::move(status)) {
    absl::MutexLock lock(&shared_->mu);
    shared_->call = this;
  }

  void Start() { Wake(shared_); }

  void OnCancel() override {
    {
      absl::MutexLock lock(&shared_->mu);
      if (shared_->call == nullptr) return;
      shared_->call = nullptr;
      slot_.reset();
    }
    Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override { delete this; }

 private:
  // What a pending wake-up holds: the call, until it finishes.
  struct Shared {
    absl::Mutex mu;
    HeldCall* call ABSL_GUARDED_BY(mu) = nullptr;
  };

  static void Wake(const std::shared_ptr<Shared>& shared) {
    HeldCall* finishing = nullptr;
    grpc::Status status;
    {
      absl::MutexLock lock(&shared->mu);
      HeldCall* call = shared->call;
      if (call == nullptr) return;  // Answered or cancelled already.
      const absl::Time now = absl::Now();
      const bool last = now >= call->deadline_;
      if (!call->attempt_(last) && !last) {
        // Woken at the latest every 30 s, to look again.
        call->wait_(std::min(call->deadline_, now + absl::Seconds(30)),
                    [shared] { Wake(shared); });
        return;
      }
      shared->call = nullptr;
      call->slot_.reset();
      status = call->status_();
      finishing = call;
    }
    // Outside the lock: the reactor may be deleted (OnDone) from here on.
    finishing->Finish(status);
  }

  const std::shared_ptr<Shared> shared_;
  std::unique_ptr<CallSlot> slot_;
  const absl::Time deadline_;
  const Attempt attempt_;
  const Wait wait_;
  const std::function<grpc::Status()> status_;
};

// A permission request as a reactor: the site answers it at once, or holds
// a RETRY until a slot frees or the round opens (up to the caller's
// deadline); the reactor is finished by that answer. No thread waits.
class PeerService::PermissionCall final : public grpc::ServerUnaryReactor {
 public:
  PermissionCall(SiteDriver* site, std::unique_ptr<CallSlot> slot,
                 v1::SubmitPermissionReply* reply)
      : site_(site), shared_(std::make_shared<Shared>()) {
    absl::MutexLock lock(&shared_->mu);
    shared_->call = this;
    shared_->slot = std::move(slot);
    shared_->reply = reply;
  }

  void Start(const v1::SubmitPermissionRequest& request, absl::Time hold) {
    // The answer may finish (and delete) this reactor before
    // RequestToSubmit returns: only the shared part is touched after it.
    std::shared_ptr<Shared> shared = shared_;
    const RequestId id = site_->RequestToSubmit(
        request, hold, [shared](v1::SubmitPermissionReply answer) {
          Answer(shared, std::move(answer));
        });
    absl::MutexLock lock(&shared->mu);
    shared->request = id;
  }

  void OnCancel() override {
    RequestId request = 0;
    {
      absl::MutexLock lock(&shared_->mu);
      if (shared_->call == nullptr) return;  // Answered already.
      shared_->call = nullptr;
      shared_->slot.reset();
      request = shared_->request;
    }
    if (request != 0) site_->CancelRequest(request);
    Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override { delete this; }

 private:
  // What the site's answer finds: the call, until it finishes.
  struct Shared {
    absl::Mutex mu;
    PermissionCall* call ABSL_GUARDED_BY(mu) = nullptr;
    std::unique_ptr<CallSlot> slot ABSL_GUARDED_BY(mu);
    v1::SubmitPermissionReply* reply ABSL_GUARDED_BY(mu) = nullptr;
    RequestId request ABSL_GUARDED_BY(mu) = 0;
  };

  static void Answer(const std::shared_ptr<Shared>& shared,
                     v1::SubmitPermissionReply answer) {
    PermissionCall* finishing = nullptr;
    {
      absl::MutexLock lock(&shared->mu);
      if (shared->call == nullptr) return;  // Cancelled.
      *shared->reply = std::move(answer);
      finishing = shared->call;
      shared->call = nullptr;
      shared->slot.reset();
    }
    // Outside the lock: the reactor may be deleted (OnDone) from here on.
    finishing->Finish(grpc::Status::OK);
  }

  SiteDriver* const site_;
  const std::shared_ptr<Shared> shared_;
};

grpc::ServerUnaryReactor* PeerService::RequestToSubmit(
    grpc::CallbackServerContext* context,
    const v1::SubmitPermissionRequest* request,
    v1::SubmitPermissionReply* reply) {
  std::unique_ptr<CallSlot> slot;
  grpc::Status allowed = Authorize(context, "RequestToSubmit", Rule::kSender,
                                   request->sender(), &slot);
  if (!allowed.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(allowed);
    return reactor;
  }
  auto* call = new PermissionCall(site_, std::move(slot), reply);
  call->Start(*request, CallDeadline(context) - kDeadlineMargin);
  return call;
}

grpc::ServerUnaryReactor* PeerService::Status(
    grpc::CallbackServerContext* context, const v1::StatusRequest* request,
    v1::StatusReply* reply) {
  std::unique_ptr<CallSlot> slot;
  grpc::Status allowed =
      Authorize(context, "Status", Rule::kAnyPeer, request->sender(), &slot);
  if (!allowed.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(allowed);
    return reactor;
  }
  const absl::Time deadline =
      request->wait_for_change_ms() == 0
          ? absl::InfinitePast()
          : std::min(CallDeadline(context) - kDeadlineMargin,
                     absl::Now() + absl::Milliseconds(static_cast<int64_t>(
                                       request->wait_for_change_ms())));
  auto* call = new HeldCall(
      std::move(slot), deadline,
      [this, request, reply](bool last) {
        *reply = site_->Status();
        *reply->mutable_protocol() = OwnProtocolVersion();
        reply->set_build(BuildText());
        return last || reply->version() != request->known_version();
      },
      [this, request](absl::Time until, std::function<void()> wake) {
        site_->WhenStatusChanges(request->known_version(), until,
                                 std::move(wake));
      },
      [request, reply] {
        if (!request->job_id().empty() &&
            reply->status().job_id() != request->job_id()) {
          return grpc::Status(
              grpc::StatusCode::FAILED_PRECONDITION,
              absl::StrCat("site runs job \"", reply->status().job_id(),
                           "\", not \"", request->job_id(), "\""));
        }
        return grpc::Status::OK;
      });
  call->Start();
  return call;
}

grpc::Status PeerService::FetchModel(
    grpc::ServerContext* context, const v1::FetchModelRequest* request,
    grpc::ServerWriter<grpc::ByteBuffer>* writer) {
  std::unique_ptr<CallSlot> slot;
  grpc::Status allowed =
      Authorize(context, "FetchModel", Rule::kFetch, request->sender(), &slot);
  if (!allowed.ok()) return allowed;
  absl::StatusOr<std::shared_ptr<const Model>> model =
      site_->ModelForFetch(*request);
  if (!model.ok()) return ToGrpcStatus(model.status());
  v1::ModelHeader header;
  header.set_kind(request->which() == v1::MODEL_SELECTOR_BEST
                      ? v1::MODEL_KIND_BEST
                  : request->which() == v1::MODEL_SELECTOR_LAST
                      ? v1::MODEL_KIND_LAST
                      : v1::MODEL_KIND_ROUND_GLOBAL);
  header.set_job_id(request->job_id());
  for (const auto& [key, value] : (*model)->metadata()) {
    (*header.mutable_metadata())[key] = value;
  }
  absl::StatusOr<std::unique_ptr<Chunker>> chunker =
      Chunker::Create(*model, header);
  if (!chunker.ok()) return ToGrpcStatus(chunker.status());
  if (!SendModelStream(writer, chunker->get())) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the client went away");
  }
  return grpc::Status::OK;
}

}  // namespace swarm
