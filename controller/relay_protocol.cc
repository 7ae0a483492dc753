#include "controller/relay_protocol.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "controller/replies.h"

namespace swarm {

absl::Duration RelayStallBudget(absl::Duration failover, int hops_after) {
  return std::max(absl::Seconds(1), failover) *
         static_cast<int64_t>(std::max(0, hops_after) + 1);
}

absl::Duration RelayIdleBudget(absl::Duration failover) {
  return std::max(absl::Seconds(1), failover);
}

RelayProtocol::RelayProtocol(Mode mode, RelayBudgets budgets, std::string next,
                             std::string what)
    : mode_(mode),
      budgets_(budgets),
      next_(std::move(next)),
      what_(std::move(what)) {}

bool RelayProtocol::paused() const {
  return onward_open() && queued_ >= std::max<size_t>(1, budgets_.max_queued);
}

void RelayProtocol::Start(absl::Time now, size_t header_frames) {
  started_ = true;
  if (onward_open()) queued_ += header_frames;
  Pump(now);
}

void RelayProtocol::OnFrameRead(absl::Time now, size_t produced) {
  reading_ = false;
  if (incoming_.has_value()) return;  // Given up meanwhile.
  if (onward_open()) {
    queued_ += produced;
  } else if (produced > 0) {
    actions_.drop_queued = true;
  }
  Pump(now);
}

void RelayProtocol::OnReadEnd(absl::Time now, absl::Status status,
                              size_t produced) {
  reading_ = false;
  if (incoming_.has_value()) return;
  if (sender_given_up_) {
    status = absl::DeadlineExceededError(
        absl::StrCat(what_, ": no frame from the sender for ",
                     absl::FormatDuration(budgets_.idle)));
  }
  incoming_ = status;
  if (onward_open()) {
    if (status.ok()) {
      queued_ += produced;
    } else {
      // The stream broke: the next hop must not take it for whole.
      EndOnward(absl::CancelledError(absl::StrCat(
                    what_, ": the incoming stream broke: ", status.message())),
                /*cancel=*/true);
    }
  } else if (produced > 0) {
    actions_.drop_queued = true;
  }
  if (mode_ != Mode::kHop && mode_ != Mode::kSource) {
    site_told_ = true;
    actions_.to_site = status;
  }
  MaybeTellSite();
  Pump(now);
}

void RelayProtocol::OnWriteDone(absl::Time now, bool ok) {
  if (!writing_) return;  // Given up before it came back.
  writing_ = false;
  if (!ok) {
    // The onward call broke; its end (OnOnwardEnd) says why. Nothing more
    // goes out meanwhile.
    actions_.drop_queued = true;
    queued_ = 0;
    write_failed_ = true;
  }
  Pump(now);
}

void RelayProtocol::OnOnwardEnd(absl::Time now,
                                absl::StatusOr<v1::Reply> reply) {
  if (!has_onward() || onward_.has_value()) return;
  EndOnward(std::move(reply), /*cancel=*/false);
  Pump(now);
}

void RelayProtocol::OnSiteReply(v1::Reply reply) {
  if (site_reply_.has_value() || finished_) return;
  site_reply_ = std::move(reply);
  MaybeAnswer();
}

void RelayProtocol::Tick(absl::Time now) {
  if (writing_ && onward_open() && now >= write_since_ + budgets_.stall) {
    // The next hop stopped taking frames (frozen, or its own next hop is).
    // The cancelled write may not come back until it wakes: the onward call
    // ends now, so that this site reads on and its caller hears why.
    const std::string why = absl::StrCat(what_, ": no frame taken for ",
                                         absl::FormatDuration(budgets_.stall));
    actions_.given_up = absl::StrCat(
        "the next hop", next_.empty() ? "" : absl::StrCat(" (", next_, ")"),
        ": ", why);
    EndOnward(absl::DeadlineExceededError(why), /*cancel=*/true);
  }
  if (reading_ && !sender_given_up_ && !incoming_.has_value() &&
      now >= read_since_ + budgets_.idle) {
    // The sender sent nothing for the idle budget (frozen, or stalled
    // behind a frozen hop): it is given up, so that every trainer of the
    // chain submits directly instead of waiting for the round's timeout.
    sender_given_up_ = true;
    actions_.cancel_incoming = true;
    actions_.given_up = absl::StrCat("the sender: ", what_, ": no frame for ",
                                     absl::FormatDuration(budgets_.idle));
  }
  Pump(now);
}

absl::Time RelayProtocol::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  if (writing_ && onward_open()) next = write_since_ + budgets_.stall;
  if (reading_ && !sender_given_up_ && !incoming_.has_value()) {
    next = std::min(next, read_since_ + budgets_.idle);
  }
  return next;
}

RelayProtocol::Actions RelayProtocol::TakeActions() {
  Actions taken = std::move(actions_);
  actions_ = Actions();
  return taken;
}

void RelayProtocol::Pump(absl::Time now) {
  if (!started_) return;
  if (onward_open() && !writing_ && !closed_) {
    if (queued_ > 0) {
      --queued_;
      writing_ = true;
      write_since_ = now;
      actions_.write = true;
    } else if (incoming_.has_value() && incoming_->ok()) {
      closed_ = true;
      actions_.close_onward = true;
    }
  }
  // Reads start here only: at most one pending, none while the next hop's
  // queue is full (it resumes when a write makes room or the hop is gone).
  if (!reading_ && !incoming_.has_value() && !sender_given_up_ && !paused()) {
    reading_ = true;
    read_since_ = now;
    actions_.read = true;
  }
}

void RelayProtocol::EndOnward(absl::StatusOr<v1::Reply> result, bool cancel) {
  onward_ = std::move(result);
  writing_ = false;
  queued_ = 0;
  actions_.drop_queued = true;
  if (cancel) actions_.cancel_onward = true;
  if (mode_ == Mode::kSource) {
    finished_ = true;
    actions_.onward_done = *onward_;
    return;
  }
  MaybeTellSite();
  MaybeAnswer();
}

void RelayProtocol::MaybeTellSite() {
  if (mode_ != Mode::kHop || site_told_ || !incoming_.has_value() ||
      !onward_.has_value()) {
    return;
  }
  site_told_ = true;
  actions_.to_site =
      !incoming_->ok() ? *incoming_ : StatusFromHopReply(*onward_);
}

void RelayProtocol::MaybeAnswer() {
  if (finished_ || !site_reply_.has_value()) return;
  if (mode_ == Mode::kRelay && !onward_.has_value()) return;  // Joins it.
  v1::Reply answer = std::move(*site_reply_);
  if (mode_ == Mode::kRelay) AddRelayed(next_, *onward_, &answer);
  finished_ = true;
  actions_.answer = std::move(answer);
}

}  // namespace swarm
