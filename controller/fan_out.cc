#include "controller/fan_out.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace swarm {

FanOut::Noted FanOut::NoteAnswer(const std::string& target,
                                 const absl::Status& status,
                                 bool may_start_grace) {
  Noted noted;
  if (waiting_.erase(target) == 0) return noted;
  noted.counted = true;
  if (status.ok()) {
    acked_.push_back(target);
    if (may_start_grace && !grace_started_ && !waiting_.empty()) {
      grace_started_ = true;
      noted.start_grace = true;
    }
    return noted;
  }
  missed_[target] = std::string(status.message());
  if (first_error_.ok()) {
    first_error_ = absl::Status(status.code(),
                                absl::StrCat(target, ": ", status.message()));
  }
  return noted;
}

bool FanOut::EndGrace() {
  if (grace_ended_) return false;
  grace_ended_ = true;
  return true;
}

std::vector<std::string> FanOut::GiveUpWaiting(absl::string_view why) {
  grace_ended_ = true;
  std::vector<std::string> silent(waiting_.begin(), waiting_.end());
  for (const std::string& target : silent) missed_[target] = std::string(why);
  waiting_.clear();
  return silent;
}

std::vector<std::string> FanOut::AckedByName() const {
  std::vector<std::string> sorted = acked_;
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

}  // namespace swarm
