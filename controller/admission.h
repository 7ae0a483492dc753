// Admission: the header checks every incoming model stream passes before its
// body is received (design sections 3 and 6), judged only by the job and this
// site's own record, never by what the header claims about its sender. Pure:
// no clock, no I/O, no locks; the caller passes a snapshot of its record.
//
// What it does not judge: that the sender is who it says (the transport
// checks the certificate first), and whether a result fits the round being
// gathered (the aggregation round's rules decide that next).
#ifndef SWARM_CONTROLLER_ADMISSION_H_
#define SWARM_CONTROLLER_ADMISSION_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "controller/job_view.h"
#include "controller/lineage.h"
#include "proto/swarm.pb.h"

namespace swarm {

// What this site itself knows about the job it runs.
struct SiteRecord {
  // This site's name.
  std::string self;
  v1::SiteState state = v1::SITE_STATE_IDLE;
  // The job started here (this site started it, or a learn task came).
  bool started = false;
  // The highest round whose learn task this site accepted, and the
  // aggregator that task named.
  std::optional<uint32_t> last_task_round;
  std::string round_aggregator;
  // That task's attempt and chain (ModelHeader.attempt, .lineage).
  uint32_t attempt = 0;
  Lineage lineage;
  // The daemon restarted and reloaded the job: it trains nothing and keeps
  // no result, so the round it held may come again (a resume, a handoff).
  bool recovered = false;
  // The best-so-far record from the learn tasks this site accepted, from its
  // own aggregation, and from the last round's aggregator's final message.
  v1::BestRecord best;
  // The round of each final model (BEST, LAST) this site stored, and the
  // chain of its LAST (up to and including the final round).
  std::map<v1::ModelKind, uint32_t> final_rounds;
  std::optional<Lineage> final_lineage;
};

// Why the job ends after `round` (its aggregate the last model) although
// rounds remain, given the best record after it: the job's stop_at_metric
// reached, or stop_patience_rounds without a better record. "" to go on.
std::string EarlyStopReason(const JobView& job, const v1::BestRecord& best,
                            uint32_t round);

// The start of every reason TooFewTrainersReason gives.
inline constexpr char kTooFewTrainersStop[] =
    "early stop: too few trainers remain";

// Why the job ends after `round` although rounds remain because trainers
// stopped training for it for good (their privacy budget spent: `stopped`,
// ModelHeader.trainer_stopped) and fewer than the round's minimum remain:
// `trainers` (the round's, `stopped` included) minus `stopped` is below
// min_responses_required (whose default is every trainer: a job that does
// not lower it ends when any trainer stops). "" to go on.
std::string TooFewTrainersReason(const JobView& job, uint32_t round,
                                 int trainers,
                                 const std::set<std::string>& stopped);

// Whether `state` ends the job at this site.
bool IsTerminal(v1::SiteState state);

// Why a site whose job ended (REQUIRES: IsTerminal(site.state)) refuses a
// call: FailedPrecondition when the job is done there, Cancelled when it
// failed or was aborted there. ReplyFromStatus turns the latter into
// OUTCOME_ABORTED, on which a trainer or a scatterer fails the round over
// to the next backup (design section 6) instead of waiting for a site that
// will never aggregate.
absl::Status JobEndedHere(const SiteRecord& site);

// A model stream refused because the chain it comes from loses to the one
// the receiver follows (design section 6: the lower attempt wins). The
// refusal travels as FAILED_PRECONDITION with a message that names the
// chains; its sender learns from it that it is on the losing side, not that
// the receiver is unreachable (it must not fail the round over to a
// backup, which would refuse it too, and end at itself).
absl::Status LosingChainRefusal(absl::string_view what, const Lineage& chain,
                                uint32_t differs, const SiteRecord& site);
// Whether `status` (as the sender got it, prefixed by the transport) is a
// LosingChainRefusal.
bool IsLosingChainRefusal(const absl::Status& status);

// What an admitted learn task is to this site.
enum class TaskVerdict {
  kNew,       // A later round of this site's chain (or its first task).
  kSwitch,    // A winning chain: drop this site's work on the losing one.
  kRepeat,    // The task this site holds, again (an acknowledgement lost).
  kTakeOver,  // This site's round, handed to it as a backup aggregator;
              // it holds the round's base model already.
  kNoted,     // Another attempt of the round this site holds, not for it.
};

// How to go on with an admitted stream.
struct Admitted {
  // Receive the body (false: answer OK with `message` and read no body: a
  // final model this site already stored, sent again; a learn task whose
  // model this site holds).
  bool receive_body = true;
  std::string message;
  TaskVerdict task = TaskVerdict::kNew;  // Learn tasks.
};

// Judges a model stream's header at site `site` running `job` (null: no job
// configured). An error refuses the stream; its code says why:
//   FAILED_PRECONDITION  no job or another job here; the job is over here; a
//                        learn task for a round this site has passed, or of
//                        a chain that lost to this site's
//   PERMISSION_DENIED    the sender may not send this kind now (not a site of
//                        the job, not the round's scatterer, not a trainer,
//                        not the last round's aggregator or the best model's
//                        holder by this site's own record; a handoff from a
//                        site that is not a trainer)
//   INVALID_ARGUMENT     a kind that is never sent to a site; a round outside
//                        the job
// RESULT streams that pass still go through the aggregation round's rules.
absl::StatusOr<Admitted> AdmitStream(const JobView* job, const SiteRecord& site,
                                     const v1::ModelHeader& header);

// The job check every request makes: `job_id` must be the job configured
// here. FAILED_PRECONDITION naming both otherwise.
absl::Status CheckJobId(const JobView* job, absl::string_view self,
                        absl::string_view job_id);

}  // namespace swarm

#endif  // SWARM_CONTROLLER_ADMISSION_H_
