// JobReport: one job's report assembled from every site's history (the
// History RPC, report/round_recorder.h) and rendered as a self-contained
// HTML page with inline SVG plots, as CSV and as JSON (swarmctl report).
//
//   std::vector<SiteHistory> sites = ...;  // one per site of the job
//   absl::StatusOr<JobReport> report = JobReport::Build(job, sites, {});
//   std::string html = report->Html();
//
// Per round: attempt, aggregator, participants (the sites that trained),
// missing (the job's trainers that did not), the participants' mean
// validation metric of the round's input model (unweighted), the best mean
// so far, an optional test metric (e.g. the demo's), the mean time the
// sites spent in each phase, the slowest site's round time, and the model
// bytes sent and received by all sites. Per site: whether it answered,
// its state, rounds trained, aggregated and missed, failovers, trainers it
// dropped, rejoins and its last error. With differential privacy, each
// site's epsilon spent over the rounds (a curve per site).
#ifndef SWARM_REPORT_JOB_REPORT_H_
#define SWARM_REPORT_JOB_REPORT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/swarm.pb.h"

namespace swarm {
namespace report {

// What one site of the job answered.
struct SiteHistory {
  v1::SiteInfo site;
  // Not OK: the site did not answer (the reply is empty).
  absl::Status status;
  v1::HistoryReply reply;
};

struct RoundRow {
  uint32_t round = 0;
  uint32_t attempt = 0;
  std::string aggregator;
  std::vector<std::string> participants;
  std::vector<std::string> missing;
  std::optional<double> mean_metric;
  std::optional<double> best_so_far;
  std::optional<double> test_metric;
  // Mean over the sites that recorded the round, by phase (in phase order).
  std::vector<std::pair<std::string, double>> phase_seconds;
  double seconds = 0;  // The slowest site's round time.
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t failovers = 0;
  uint64_t trainers_dropped = 0;
  std::string outcome;  // A site's outcome other than success, if any.
  // Differential privacy: each site's epsilon spent at the end of the round
  // (its accountant, RoundRecord.privacy_epsilon), by site.
  std::map<std::string, double> epsilon;
};

struct SiteRow {
  std::string name;
  std::string address;
  bool answered = false;
  std::string error;  // Why it did not answer, or "no history of the job".
  std::string state;  // "done", "failed", ...
  std::string end_reason;
  int rounds_trained = 0;
  int rounds_aggregated = 0;
  int rounds_missed = 0;  // Rounds of the report it should have trained.
  uint64_t failovers = 0;
  uint64_t rounds_taken_over = 0;
  uint64_t trainers_dropped = 0;
  uint64_t rejoins = 0;
  std::string last_error;
  // Differential privacy: the site's epsilon spent at its last recorded
  // round, for `delta`; absent when it reported none.
  std::optional<double> epsilon;
  double delta = 0;
};

// The phases, in the order a round goes through them.
const std::vector<std::string>& PhaseOrder();

class JobReport {
 public:
  // NotFound, naming the job and every site asked, when no site answered
  // with a history of the job. `test_metric`: round -> value (may be empty).
  static absl::StatusOr<JobReport> Build(
      const v1::JobConfig& job, const std::vector<SiteHistory>& sites,
      const std::map<uint32_t, double>& test_metric,
      const std::string& test_metric_name = "test_accuracy");

  const std::string& job_id() const { return job_id_; }
  const std::string& metric_name() const { return metric_name_; }
  const std::vector<RoundRow>& rounds() const { return rounds_; }
  const std::vector<SiteRow>& sites() const { return sites_; }
  // The sites that did not answer (or had no history of the job).
  std::vector<std::string> MissingSites() const;

  // One self-contained page: inline CSS, SVG and script, nothing fetched.
  // Each plot is an <svg class="plot"> with data-points (the number of
  // points or marks drawn); the page's script counts the marks it finds
  // and sets data-rendered-points beside it, and body data-ready="1" when
  // it ran (data-script-errors when a script failed).
  std::string Html() const;
  // One line per round (header first); lists joined with ';'.
  std::string Csv() const;
  std::string Json() const;

 private:
  JobReport() = default;

  std::string job_id_;
  std::string metric_name_;
  std::string test_metric_name_;
  bool lower_is_better_ = false;
  int64_t generated_ms_ = 0;
  std::vector<RoundRow> rounds_;
  std::vector<SiteRow> sites_;
};

// Reads a test metric per round from a CSV with a header line: the column
// `round` and the column `column` (e.g. the demo's rounds.csv and
// test_accuracy). Empty values are skipped.
absl::StatusOr<std::map<uint32_t, double>> ParseMetricCsv(
    const std::string& text, const std::string& column);

// Writes report.html, report.csv and report.json into `dir` (made if
// missing).
absl::Status WriteReport(const JobReport& report, const std::string& dir);

}  // namespace report
}  // namespace swarm

#endif  // SWARM_REPORT_JOB_REPORT_H_
