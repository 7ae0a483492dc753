// What the scenario driver prints of the sites: changes as they happen,
// status and stored models on demand, and the script runner.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "controller/scenario/scenario.h"
#include "controller/scenario/scenario_internal.h"

namespace swarm::scenario {
namespace {

const std::set<std::string>& Categories() {
  static const auto* kCategories = new std::set<std::string>{
      "calls", "work", "timers", "state", "trainer", "all"};
  return *kCategories;
}

}  // namespace

void Scenario::NoteChanges(Site& site) {
  const v1::SiteStatus s = site.machine->Status().status();
  // A trainer's busy states show with `trainer`; by default only when the
  // round, the attempt or the job changes with them.
  const bool busy = s.state() == v1::SITE_STATE_TRAINING ||
                    s.state() == v1::SITE_STATE_WAITING_FOR_PERMISSION ||
                    s.state() == v1::SITE_STATE_SUBMITTING ||
                    s.state() == v1::SITE_STATE_IDLE;
  const bool moved = s.job_id() != site.job || s.round() != site.round ||
                     s.attempt() != site.attempt;
  if (moved || (s.state() != site.shown_state &&
                (!busy || shown_.count("trainer") > 0))) {
    site.shown_state = s.state();
    std::string line =
        absl::StrCat(site.name, ": ", StateName(s.state()), " r", s.round());
    if (s.attempt() > 0) absl::StrAppend(&line, " a", s.attempt());
    if (s.job_id() != site.job)
      absl::StrAppend(&line, " (job ", s.job_id(), ")");
    Print("state", line);
    site.job = s.job_id();
    site.round = s.round();
    site.attempt = s.attempt();
  }
  if (s.failovers_size() < site.failovers) site.failovers = 0;  // New job.
  for (int i = site.failovers; i < s.failovers_size(); ++i) {
    const v1::Failover& f = s.failovers(i);
    Print("state", absl::StrCat(site.name, ": failover r", f.round(), " ",
                                f.from(), " -> ", f.to(), ": ", f.reason()));
  }
  site.failovers = s.failovers_size();
  if (s.last_error() != site.error) {
    site.error = s.last_error();
    if (!site.error.empty()) {
      Print("state", absl::StrCat(site.name, ": error: ", site.error));
    }
  }
  if (s.end_reason() != site.end) {
    site.end = s.end_reason();
    if (!site.end.empty()) {
      Print("state", absl::StrCat(site.name, ": ended: ", site.end));
    }
  }
}

// status [SITE...]
absl::Status Scenario::ShowStatus(const std::vector<std::string>& args) {
  const std::vector<std::string> targets = args.empty() ? names_ : args;
  for (const std::string& name : targets) {
    absl::StatusOr<Site*> site = Find(name);
    if (!site.ok()) return site.status();
    const v1::SiteStatus s = (*site)->machine->Status().status();
    auto or_dash = [](const std::string& text) {
      return text.empty() ? std::string("-") : text;
    };
    std::string line = absl::StrCat(
        name, ": ", StateName(s.state()), " ", or_dash(s.job_id()), " r",
        s.round(), " a", s.attempt(), " aggregator ", or_dash(s.aggregator()));
    if (s.best().present()) {
      absl::StrAppendFormat(&line, " best %s@r%d %.3f", s.best().site(),
                            s.best().round(), s.best().metric());
    }
    absl::StrAppend(&line, " global r", s.global_round());
    if ((*site)->dead) absl::StrAppend(&line, " (killed)");
    if ((*site)->frozen) absl::StrAppend(&line, " (frozen)");
    Print("op", line);
  }
  return absl::OkStatus();
}

// models [SITE...]: the BEST, LAST and kept round models each site wrote
// (their first value).
absl::Status Scenario::ShowModels(const std::vector<std::string>& args) {
  const std::vector<std::string> targets = args.empty() ? names_ : args;
  for (const std::string& name : targets) {
    absl::StatusOr<Site*> site = Find(name);
    if (!site.ok()) return site.status();
    std::vector<std::string> parts;
    for (const auto& [kind, value] : (*site)->finals) {
      parts.push_back(absl::StrFormat("%s=%.4f", kind, value));
    }
    for (const auto& [round, value] : (*site)->kept) {
      parts.push_back(absl::StrFormat("r%d=%.4f", round, value));
    }
    Print("op",
          absl::StrCat(name, ": ",
                       parts.empty() ? "none" : absl::StrJoin(parts, " ")));
  }
  return absl::OkStatus();
}

// show CATEGORY...: what is printed besides the commands' own answers.
absl::Status Scenario::Show(const std::vector<std::string>& args) {
  std::set<std::string> shown = {"op"};
  for (const std::string& category : args) {
    if (Categories().count(category) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown category \"", category, "\" (",
                       absl::StrJoin(Categories(), ", "), ")"));
    }
    shown.insert(category);
  }
  shown_ = std::move(shown);
  return absl::OkStatus();
}

std::string RunScript(const std::string& script, Scenario& scenario,
                      std::vector<CaseResult>* cases) {
  const std::vector<std::string> lines = absl::StrSplit(script, '\n');
  std::string out;
  size_t i = 0;
  while (i < lines.size()) {
    const std::string& line = lines[i];
    if (line.empty() || line[0] == '#') {
      // One blank line between cases; none after the last.
      const bool extra_blank =
          line.empty() &&
          (i + 1 == lines.size() || out.empty() || absl::EndsWith(out, "\n\n"));
      if (!extra_blank) absl::StrAppend(&out, line, "\n");
      ++i;
      continue;
    }
    CaseResult result;
    result.line = static_cast<int>(i + 1);
    result.command = line;
    ++i;
    std::vector<std::string> expected;
    if (i < lines.size() && lines[i] == "----") {
      for (++i; i < lines.size() && !lines[i].empty(); ++i) {
        expected.push_back(lines[i]);
      }
      if (i < lines.size()) ++i;  // The blank line that ends the case.
    }
    result.expected = absl::StrJoin(expected, "\n");
    result.actual = scenario.Run(line);
    absl::StrAppend(&out, line, "\n----\n", result.actual, "\n");
    if (i < lines.size()) absl::StrAppend(&out, "\n");
    if (cases != nullptr) cases->push_back(std::move(result));
  }
  while (absl::EndsWith(out, "\n\n")) out.pop_back();
  return out;
}

}  // namespace swarm::scenario
