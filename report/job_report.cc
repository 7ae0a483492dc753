#include "report/job_report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace swarm {
namespace report {
namespace {

std::string StateName(v1::SiteState state) {
  return absl::AsciiStrToLower(
      absl::StripPrefix(v1::SiteState_Name(state), "SITE_STATE_"));
}

std::string Escape(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A CSV field: quoted when it holds a comma, quote or line break.
std::string CsvField(absl::string_view text) {
  if (text.find_first_of(",\"\n\r") == absl::string_view::npos) {
    return std::string(text);
  }
  return absl::StrCat("\"", absl::StrReplaceAll(text, {{"\"", "\"\""}}), "\"");
}

std::string Number(std::optional<double> value) {
  return value.has_value() ? absl::StrFormat("%.6g", *value) : "";
}

std::string Bytes(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 30)) {
    return absl::StrFormat("%.2f GiB", bytes / double(uint64_t{1} << 30));
  }
  if (bytes >= (uint64_t{1} << 20)) {
    return absl::StrFormat("%.2f MiB", bytes / double(uint64_t{1} << 20));
  }
  if (bytes >= 1024) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrCat(bytes, " B");
}

const char* PhaseColor(size_t index) {
  static const char* const kColors[] = {"#bbbbbb", "#4e79a7", "#f28e2b",
                                        "#76b7b2", "#59a14f", "#e15759",
                                        "#b07aa1"};
  return kColors[index % (sizeof(kColors) / sizeof(kColors[0]))];
}

// One color per series (a site's curve).
const char* SeriesColor(size_t index) {
  static const char* const kColors[] = {
      "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
      "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
  return kColors[index % (sizeof(kColors) / sizeof(kColors[0]))];
}

// The geometry of one plot: rounds along x, values (or rows) along y.
struct Frame {
  static constexpr double kWidth = 820;
  static constexpr double kLeft = 90;
  static constexpr double kRight = 20;
  static constexpr double kTop = 14;
  static constexpr double kBottom = 34;
  double height = 260;
  uint32_t first_round = 0;
  uint32_t last_round = 0;
  double y_min = 0;
  double y_max = 1;
  double y_step = 0.2;

  // Rounds sit half a slot in from the ends, so that bars and cells clear
  // the axis and the row labels.
  double X(uint32_t round) const {
    const double inner = kWidth - kLeft - kRight - Slot();
    if (last_round == first_round) return kLeft + Slot() / 2 + inner / 2;
    return kLeft + Slot() / 2 +
           inner * (round - first_round) / (last_round - first_round);
  }
  double Y(double value) const {
    const double inner = height - kTop - kBottom;
    if (y_max == y_min) return kTop + inner / 2;
    return kTop + inner * (1 - (value - y_min) / (y_max - y_min));
  }
  // Width of one round's slot (bars, cells).
  double Slot() const {
    const double inner = kWidth - kLeft - kRight;
    return std::min(40.0, inner / (last_round - first_round + 1));
  }
  // The x axis with round labels (at most ~20 of them).
  std::string XAxis() const {
    std::string out = absl::StrFormat(
        "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
        "y2=\"%.1f\"/>",
        kLeft, height - kBottom, kWidth - kRight, height - kBottom);
    const uint32_t span = last_round - first_round + 1;
    const uint32_t step = std::max<uint32_t>(1, (span + 19) / 20);
    for (uint32_t r = first_round; r <= last_round; r += step) {
      absl::StrAppendFormat(&out,
                            "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" "
                            "text-anchor=\"middle\">%u</text>",
                            X(r), height - kBottom + 16, r);
    }
    absl::StrAppendFormat(&out,
                          "<text class=\"label\" x=\"%.1f\" y=\"%.1f\" "
                          "text-anchor=\"middle\">round</text>",
                          (kLeft + kWidth - kRight) / 2, height - 2);
    return out;
  }
  // Widens [lo, hi] to whole multiples of a step of 1, 2 or 5 times a
  // power of ten, about `ticks` of them: the y axis's range and ticks.
  void NiceRange(double lo, double hi, int ticks) {
    if (!(hi > lo)) {
      const double pad = std::max(std::fabs(lo) * 0.05, 1e-3);
      lo -= pad;
      hi += pad;
    }
    const double raw = (hi - lo) / ticks;
    const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
    y_step = 10 * magnitude;
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * magnitude >= raw) {
        y_step = m * magnitude;
        break;
      }
    }
    y_min = std::floor(lo / y_step) * y_step;
    y_max = std::ceil(hi / y_step) * y_step;
  }
  std::string YAxis() const {
    std::string out = absl::StrFormat(
        "<line class=\"axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
        "y2=\"%.1f\"/>",
        kLeft, kTop, kLeft, height - kBottom);
    const int ticks = static_cast<int>(std::lround((y_max - y_min) / y_step));
    for (int i = 0; i <= ticks; ++i) {
      const double value = y_min + y_step * i;
      absl::StrAppendFormat(
          &out,
          "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
          "y2=\"%.1f\"/><text class=\"tick\" x=\"%.1f\" y=\"%.1f\" "
          "text-anchor=\"end\">%s</text>",
          kLeft, Y(value), kWidth - kRight, Y(value), kLeft - 6, Y(value) + 4,
          absl::StrFormat("%.3g", value));
    }
    return out;
  }
};

std::string SvgOpen(const char* id, const Frame& frame, int points,
                    const char* title) {
  return absl::StrFormat(
      "<svg class=\"plot\" id=\"%s\" data-points=\"%d\" "
      "viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" "
      "xmlns=\"http://www.w3.org/2000/svg\" role=\"img\" "
      "aria-label=\"%s\">",
      id, points, Frame::kWidth, frame.height, Frame::kWidth, frame.height,
      Escape(title));
}

// A site's row, from its answer to the question about job `job_id`.
SiteRow SiteRowOf(const SiteHistory& site, const std::string& job_id) {
  SiteRow row;
  row.name = site.site.name();
  row.address = site.site.address();
  if (!site.status.ok()) {
    row.error = std::string(site.status.message());
  } else if (!site.reply.known()) {
    row.error = absl::StrCat("no history of job ", job_id);
  } else {
    row.answered = true;
    row.state = StateName(site.reply.state());
    row.end_reason = site.reply.end_reason();
    row.rejoins = site.reply.rejoins();
    row.last_error = site.reply.last_error();
  }
  return row;
}

// The first metric a site reported (by name, the first of its round's);
// empty when none did.
std::string FirstReportedMetric(
    const std::vector<const SiteHistory*>& knowing) {
  for (const SiteHistory* site : knowing) {
    for (const v1::RoundRecord& r : site->reply.rounds()) {
      if (!r.metrics().empty()) {
        std::set<std::string> names;
        for (const auto& [name, value] : r.metrics()) names.insert(name);
        return *names.begin();
      }
    }
  }
  return "";
}

// The sites that train: the job's trainers, else all of its sites.
std::set<std::string> TrainersOf(const v1::JobConfig& job) {
  std::set<std::string> trainers;
  if (job.trainers().empty()) {
    for (const v1::SiteInfo& s : job.sites()) trainers.insert(s.name());
  } else {
    trainers.insert(job.trainers().begin(), job.trainers().end());
  }
  return trainers;
}

// Each round's records, with the site that recorded each.
using RecordsByRound = std::map<
    uint32_t,
    std::vector<std::pair<const SiteHistory*, const v1::RoundRecord*>>>;

RecordsByRound GroupByRound(const std::vector<const SiteHistory*>& knowing) {
  RecordsByRound by_round;
  for (const SiteHistory* site : knowing) {
    for (const v1::RoundRecord& r : site->reply.rounds()) {
      by_round[r.round()].emplace_back(site, &r);
    }
  }
  return by_round;
}

// The site with the most votes (the first by name of those tied).
std::string MostVoted(const std::map<std::string, int>& votes) {
  return std::max_element(
             votes.begin(), votes.end(),
             [](const auto& a, const auto& b) { return a.second < b.second; })
      ->first;
}

// What the sites' records of one round add up to, besides its row.
struct RoundTally {
  std::map<std::string, int> aggregator_votes;
  uint32_t aggregated_attempt = 0;
  std::vector<double> metrics;
  std::map<std::string, double> phase_total;
  std::set<std::string> participants;
};

// Adds site `name`'s record `r` of a round to the round's row, the site's
// row and the round's tally.
void AddRecord(const std::string& name, const v1::RoundRecord& r,
               const std::string& metric_name, RoundRow* row, SiteRow* srow,
               RoundTally* tally) {
  row->attempt = std::max(row->attempt, r.attempt());
  if (r.aggregated() &&
      (row->aggregator.empty() || r.attempt() >= tally->aggregated_attempt)) {
    row->aggregator = name;
    tally->aggregated_attempt = r.attempt();
    ++srow->rounds_aggregated;
  }
  if (!r.aggregator().empty()) ++tally->aggregator_votes[r.aggregator()];
  if (r.trained()) {
    tally->participants.insert(name);
    ++srow->rounds_trained;
    auto metric = r.metrics().find(metric_name);
    if (metric != r.metrics().end()) tally->metrics.push_back(metric->second);
  }
  for (const v1::PhaseTime& phase : r.phases()) {
    tally->phase_total[phase.phase()] += phase.seconds();
  }
  row->seconds = std::max(row->seconds, r.seconds());
  row->bytes_sent += r.bytes_sent();
  row->bytes_received += r.bytes_received();
  row->failovers += r.failovers();
  row->trainers_dropped += r.trainers_dropped();
  srow->failovers += r.failovers();
  srow->rounds_taken_over += r.rounds_taken_over();
  srow->trainers_dropped += r.trainers_dropped();
  if (!r.outcome().empty() && row->outcome.empty()) {
    row->outcome = absl::StrCat(name, ": ", r.outcome());
  }
  if (r.has_privacy_epsilon()) {
    row->epsilon[name] = r.privacy_epsilon();
    // Rounds come in order: the last one's stands for the site.
    srow->epsilon = r.privacy_epsilon();
    srow->delta = r.privacy_delta();
  }
}

// Sets the round's mean metric and, from it, the best mean so far (`best`,
// over the rounds so far).
void SetMeanMetric(const std::vector<double>& metrics, bool lower_is_better,
                   std::optional<double>* best, RoundRow* row) {
  if (!metrics.empty()) {
    double sum = 0;
    for (double m : metrics) sum += m;
    row->mean_metric = sum / metrics.size();
    if (!best->has_value() || (lower_is_better ? *row->mean_metric < **best
                                               : *row->mean_metric > **best)) {
      *best = row->mean_metric;
    }
  }
  row->best_so_far = *best;
}

// The page up to the job id in its title.
constexpr char kPageHeadOpen[] =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
    "<title>Swarm job report: ";

// The rest of the page's head, after the job id in its title.
constexpr char kPageHeadRest[] =
    "</title>\n"
    // First, so that it sees any error of the scripts below.
    "<script>window.onerror=function(m){var e=document.documentElement;"
    "e.setAttribute('data-script-errors',"
    "(e.getAttribute('data-script-errors')||'')+m+';');};</script>\n"
    "<style>\n"
    "body{font:14px/1.4 sans-serif;margin:20px 28px;color:#222}\n"
    "h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 "
    "6px}\n"
    ".meta{color:#555}.warn{color:#a30;font-weight:bold}\n"
    "svg.plot{display:block;background:#fcfcfc;border:1px solid #ddd}\n"
    ".axis{stroke:#444}.grid{stroke:#e6e6e6}.tick{font-size:11px;"
    "fill:#444}.label{font-size:12px;fill:#222}\n"
    ".legend{font-size:12px;margin:4px 0}.legend span{display:inline-block;"
    "width:11px;height:11px;margin:0 4px 0 12px;vertical-align:-1px}\n"
    "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid "
    "#ddd;padding:2px 6px;text-align:right}th{background:#f3f3f3}"
    "td.l,th.l{text-align:left}\n"
    "</style></head><body>\n";

// The end of the page: the script that counts the marks drawn.
constexpr char kPageTail[] =
    "<script>\n"
    "(function(){\n"
    "  var plots=document.querySelectorAll('svg.plot');\n"
    "  for(var i=0;i<plots.length;i++){\n"
    "    plots[i].setAttribute('data-rendered-points',\n"
    "        plots[i].querySelectorAll('.pt').length);\n"
    "  }\n"
    "  document.documentElement.setAttribute('data-ready','1');\n"
    "})();\n"
    "</script>\n</body></html>\n";

// The learning curve: each round's mean and best validation metric and its
// test metric.
std::string LearningCurveSection(const Frame& base,
                                 const std::vector<RoundRow>& rounds,
                                 const std::string& metric_name,
                                 const std::string& test_metric_name) {
  Frame f = base;
  bool any = false;
  double lo = 0, hi = 0;
  for (const RoundRow& r : rounds) {
    for (std::optional<double> v : {r.mean_metric, r.test_metric}) {
      if (!v.has_value()) continue;
      lo = any ? std::min(lo, *v) : *v;
      hi = any ? std::max(hi, *v) : *v;
      any = true;
    }
  }
  if (any) {
    f.NiceRange(lo, hi, 5);
  } else {
    f.NiceRange(0, 1, 5);
  }
  struct Series {
    const char* cls;
    const char* color;
    const char* name;
    std::optional<double> RoundRow::*value;
  };
  const std::string test_label = absl::StrCat("test metric (", test_metric_name,
                                              ") of the round's aggregate");
  // The best first, so that the mean is drawn over it where they meet.
  const Series series[] = {
      {"best", "#59a14f", "best mean so far", &RoundRow::best_so_far},
      {"mean", "#4e79a7", "mean validation of the round's input model",
       &RoundRow::mean_metric},
      {"test", "#e15759", test_label.c_str(), &RoundRow::test_metric},
  };
  std::string body;
  int points = 0;
  std::string legend = "<div class=\"legend\">";
  for (const Series& s : series) {
    std::string line;
    int n = 0;
    for (const RoundRow& r : rounds) {
      const std::optional<double>& v = r.*(s.value);
      if (!v.has_value()) continue;
      absl::StrAppendFormat(&line, "%s%.1f,%.1f", line.empty() ? "" : " ",
                            f.X(r.round), f.Y(*v));
      absl::StrAppendFormat(
          &body,
          "<circle class=\"pt pt-%s\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" "
          "fill=\"%s\"><title>round %u: %s %.4f</title></circle>",
          s.cls, f.X(r.round), f.Y(*v), s.color, r.round, s.name, *v);
      ++n;
    }
    if (n == 0) continue;
    points += n;
    absl::StrAppendFormat(
        &body,
        "<polyline class=\"series-%s\" data-points=\"%d\" fill=\"none\" "
        "stroke=\"%s\" stroke-width=\"2\" points=\"%s\"%s/>",
        s.cls, n, s.color, line,
        std::string(s.cls) == "best" ? " stroke-dasharray=\"6 4\"" : "");
    absl::StrAppendFormat(&legend, "<span style=\"background:%s\"></span>%s",
                          s.color, Escape(s.name));
  }
  return absl::StrCat("<h2>Learning curve (", Escape(metric_name), ")</h2>\n",
                      legend, "</div>\n",
                      SvgOpen("learning-curve", f, points, "learning curve"),
                      f.YAxis(), f.XAxis(), body, "</svg>\n");
}

double TotalSeconds(const RoundRow& r) {
  double total = 0;
  for (const auto& [phase, seconds] : r.phase_seconds) total += seconds;
  return total;
}

// Round time, stacked by phase (mean over the sites).
std::string RoundTimeSection(const Frame& base,
                             const std::vector<RoundRow>& rounds) {
  const std::vector<std::string>& phases = PhaseOrder();
  Frame f = base;
  double hi = 0;
  for (const RoundRow& r : rounds) hi = std::max(hi, TotalSeconds(r));
  f.NiceRange(0, hi > 0 ? hi : 1, 4);
  std::string body;
  int points = 0;
  const double width = f.Slot() * 0.7;
  for (const RoundRow& r : rounds) {
    const double total = TotalSeconds(r);
    if (total <= 0) continue;
    ++points;
    absl::StrAppendFormat(&body,
                          "<g class=\"pt\" data-round=\"%u\"><title>round "
                          "%u: %.3f s (mean over sites)",
                          r.round, r.round, total);
    for (const auto& [phase, seconds] : r.phase_seconds) {
      if (seconds > 0)
        absl::StrAppendFormat(&body, "\n%s %.3f s", phase, seconds);
    }
    body += "</title>";
    double below = 0;
    for (size_t i = 0; i < r.phase_seconds.size(); ++i) {
      const double seconds = r.phase_seconds[i].second;
      if (seconds <= 0) continue;
      const double y_top = f.Y(below + seconds);
      absl::StrAppendFormat(
          &body,
          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.2f\" "
          "fill=\"%s\"/>",
          f.X(r.round) - width / 2, y_top, width, f.Y(below) - y_top,
          PhaseColor(i));
      below += seconds;
    }
    body += "</g>";
  }
  std::string legend = "<div class=\"legend\">";
  for (size_t i = 0; i < phases.size(); ++i) {
    absl::StrAppendFormat(&legend, "<span style=\"background:%s\"></span>%s",
                          PhaseColor(i), phases[i]);
  }
  return absl::StrCat(
      "<h2>Round time by phase (seconds, mean over the sites)</h2>\n", legend,
      "</div>\n", SvgOpen("round-time", f, points, "round time by phase"),
      f.YAxis(), f.XAxis(), body, "</svg>\n");
}

// A plot with one row per site (`rows` of them) instead of a value axis.
Frame RowsFrame(const Frame& base, size_t rows) {
  Frame f = base;
  f.height = Frame::kTop + Frame::kBottom + 22.0 * std::max<size_t>(rows, 1);
  f.y_min = -0.5;
  f.y_max = static_cast<double>(rows) - 0.5;
  return f;
}

// The y of site `i`'s row of `rows`: the first site on the top row.
double RowY(const Frame& f, size_t rows, size_t i) {
  return f.Y(static_cast<double>(rows - 1 - i));
}

// The site names left of the rows.
std::string RowLabels(const Frame& f, const std::vector<std::string>& names) {
  std::string labels;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppendFormat(&labels,
                          "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" "
                          "text-anchor=\"end\">%s</text>",
                          Frame::kLeft - 6, RowY(f, names.size(), i) + 4,
                          Escape(names[i]));
  }
  return labels;
}

// Who aggregated each round.
std::string AggregatorSection(const Frame& base,
                              const std::vector<RoundRow>& rounds,
                              const std::vector<std::string>& names) {
  Frame f = RowsFrame(base, names.size());
  std::string body;
  int points = 0;
  for (const RoundRow& r : rounds) {
    auto it = std::find(names.begin(), names.end(), r.aggregator);
    if (it == names.end()) continue;
    ++points;
    absl::StrAppendFormat(
        &body,
        "<circle class=\"pt\" cx=\"%.1f\" cy=\"%.1f\" r=\"6\" "
        "fill=\"%s\"><title>round %u: aggregated by %s (attempt "
        "%u)</title></circle>",
        f.X(r.round), RowY(f, names.size(), it - names.begin()),
        r.attempt > 0 ? "#e15759" : "#4e79a7", r.round, Escape(r.aggregator),
        r.attempt);
  }
  return absl::StrCat(
      "<h2>Aggregator of each round</h2>\n<div class=\"legend\"><span "
      "style=\"background:#4e79a7\"></span>elected<span "
      "style=\"background:#e15759\"></span>backup after a failover</div>\n",
      SvgOpen("aggregators", f, points, "aggregator of each round"),
      RowLabels(f, names), f.XAxis(), body, "</svg>\n");
}

// One cell of the participation plot: what site `i` did in round `r`.
void AppendParticipationCell(const Frame& f, const RoundRow& r,
                             const SiteRow& site,
                             const std::vector<std::string>& names, size_t i,
                             double w, std::string* body) {
  const bool took_part = std::find(r.participants.begin(), r.participants.end(),
                                   names[i]) != r.participants.end();
  const bool missed = std::find(r.missing.begin(), r.missing.end(), names[i]) !=
                      r.missing.end();
  const char* color = "#dddddd";
  const char* what = "not a trainer";
  if (!site.answered) {
    color = "#ffffff";
    what = "unknown (the site did not answer)";
  } else if (took_part) {
    color = "#59a14f";
    what = "trained";
  } else if (missed) {
    color = "#e15759";
    what = "missing";
  }
  absl::StrAppendFormat(
      body,
      "<rect class=\"pt\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
      "height=\"16\" fill=\"%s\" stroke=\"%s\"><title>round %u, %s: "
      "%s%s</title></rect>",
      f.X(r.round) - w / 2, RowY(f, names.size(), i) - 8, w, color,
      names[i] == r.aggregator ? "#222" : "#bbb", r.round, Escape(names[i]),
      what, names[i] == r.aggregator ? " (aggregator)" : "");
}

// Who took part in each round.
std::string ParticipationSection(const Frame& base,
                                 const std::vector<RoundRow>& rounds,
                                 const std::vector<SiteRow>& sites,
                                 const std::vector<std::string>& names) {
  Frame f = RowsFrame(base, names.size());
  std::string body;
  int points = 0;
  const double w = f.Slot() * 0.8;
  for (const RoundRow& r : rounds) {
    for (size_t i = 0; i < names.size(); ++i) {
      ++points;
      AppendParticipationCell(f, r, sites[i], names, i, w, &body);
    }
  }
  return absl::StrCat(
      "<h2>Participation</h2>\n<div class=\"legend\"><span "
      "style=\"background:#59a14f\"></span>trained<span "
      "style=\"background:#e15759\"></span>missing<span "
      "style=\"background:#ffffff;border:1px solid #bbb\"></span>unknown "
      "(no answer)<span style=\"background:#dddddd\"></span>not a "
      "trainer; dark outline: the round's aggregator</div>\n",
      SvgOpen("participation", f, points, "participation"), RowLabels(f, names),
      f.XAxis(), body, "</svg>\n");
}

// Differential privacy: each site's epsilon spent, over the rounds; empty
// when no site reported any.
std::string PrivacySection(const Frame& base,
                           const std::vector<RoundRow>& rounds,
                           const std::vector<SiteRow>& sites) {
  std::vector<std::string> private_sites;
  for (const SiteRow& s : sites) {
    if (s.epsilon.has_value()) private_sites.push_back(s.name);
  }
  if (private_sites.empty()) return "";
  Frame f = base;
  double hi = 0;
  for (const RoundRow& r : rounds) {
    for (const auto& [site, value] : r.epsilon) hi = std::max(hi, value);
  }
  f.NiceRange(0, hi > 0 ? hi : 1, 5);
  std::string body;
  int points = 0;
  std::string legend = "<div class=\"legend\">";
  for (size_t i = 0; i < private_sites.size(); ++i) {
    const std::string& site = private_sites[i];
    const char* color = SeriesColor(i);
    std::string line;
    int n = 0;
    for (const RoundRow& r : rounds) {
      auto value = r.epsilon.find(site);
      if (value == r.epsilon.end()) continue;
      absl::StrAppendFormat(&line, "%s%.1f,%.1f", line.empty() ? "" : " ",
                            f.X(r.round), f.Y(value->second));
      absl::StrAppendFormat(
          &body,
          "<circle class=\"pt pt-epsilon\" cx=\"%.1f\" cy=\"%.1f\" "
          "r=\"3\" fill=\"%s\"><title>round %u, %s: epsilon %.4f"
          "</title></circle>",
          f.X(r.round), f.Y(value->second), color, r.round, Escape(site),
          value->second);
      ++n;
    }
    if (n == 0) continue;
    points += n;
    absl::StrAppendFormat(&body,
                          "<polyline class=\"series-epsilon\" data-site=\"%s\" "
                          "data-points=\"%d\" fill=\"none\" stroke=\"%s\" "
                          "stroke-width=\"2\" points=\"%s\"/>",
                          Escape(site), n, color, line);
    const SiteRow& row =
        *std::find_if(sites.begin(), sites.end(),
                      [&](const SiteRow& s) { return s.name == site; });
    absl::StrAppendFormat(
        &legend, "<span style=\"background:%s\"></span>%s (%s, delta %g)",
        color, Escape(site), Number(row.epsilon), row.delta);
  }
  return absl::StrCat(
      "<h2>Differential privacy: epsilon spent per site (its accountant, "
      "at the end of each round)</h2>\n",
      legend, "</div>\n",
      SvgOpen("privacy-epsilon", f, points, "epsilon spent per site"),
      f.YAxis(), f.XAxis(), body, "</svg>\n");
}

// The table of the sites.
std::string SitesTable(const std::vector<SiteRow>& sites) {
  std::string out =
      "<h2>Sites</h2>\n<table id=\"sites\"><tr><th class=\"l\">site</th><th "
      "class=\"l\">address</th><th class=\"l\">state</th><th>trained</th>"
      "<th>aggregated</th><th>missed</th><th>failovers</th><th>taken "
      "over</th><th>trainers dropped</th><th>rejoins</th><th "
      "class=\"l\">last error / end</th></tr>\n";
  for (const SiteRow& s : sites) {
    if (!s.answered) {
      absl::StrAppend(&out, "<tr><td class=\"l\">", Escape(s.name),
                      "</td><td class=\"l\">", Escape(s.address),
                      "</td><td class=\"l warn\">no answer</td><td "
                      "colspan=\"7\"></td><td class=\"l\">",
                      Escape(s.error), "</td></tr>\n");
      continue;
    }
    absl::StrAppend(
        &out, "<tr><td class=\"l\">", Escape(s.name), "</td><td class=\"l\">",
        Escape(s.address), "</td><td class=\"l\">", Escape(s.state),
        "</td><td>", s.rounds_trained, "</td><td>", s.rounds_aggregated,
        "</td><td>", s.rounds_missed, "</td><td>", s.failovers, "</td><td>",
        s.rounds_taken_over, "</td><td>", s.trainers_dropped, "</td><td>",
        s.rejoins, "</td><td class=\"l\">",
        Escape(s.last_error.empty() ? s.end_reason : s.last_error),
        "</td></tr>\n");
  }
  out += "</table>\n";
  return out;
}

// The table of the rounds.
std::string RoundsTable(const std::vector<RoundRow>& rounds,
                        const std::string& metric_name,
                        const std::string& test_metric_name) {
  std::string out = absl::StrCat(
      "<h2>Rounds</h2>\n<table id=\"rounds\"><tr><th>round</th>"
      "<th>attempt</th><th class=\"l\">aggregator</th><th "
      "class=\"l\">participants</th><th class=\"l\">missing</th><th>mean ",
      Escape(metric_name), "</th><th>best</th><th>", Escape(test_metric_name),
      "</th><th>seconds</th><th>sent</th><th>received</th><th "
      "class=\"l\">outcome</th></tr>\n");
  for (const RoundRow& r : rounds) {
    absl::StrAppend(
        &out, "<tr><td>", r.round, "</td><td>", r.attempt,
        "</td><td class=\"l\">", Escape(r.aggregator), "</td><td class=\"l\">",
        Escape(absl::StrJoin(r.participants, ", ")), "</td><td class=\"l\">",
        Escape(absl::StrJoin(r.missing, ", ")), "</td><td>",
        Number(r.mean_metric), "</td><td>", Number(r.best_so_far), "</td><td>",
        Number(r.test_metric), "</td><td>", absl::StrFormat("%.3f", r.seconds),
        "</td><td>", Bytes(r.bytes_sent), "</td><td>", Bytes(r.bytes_received),
        "</td><td class=\"l\">", Escape(r.outcome), "</td></tr>\n");
  }
  out += "</table>\n";
  return out;
}

}  // namespace

const std::vector<std::string>& PhaseOrder() {
  static const auto* phases = new std::vector<std::string>{
      "waiting_for_task", "training",  "waiting_for_permission",
      "submitting",       "gathering", "aggregating",
      "distributing"};
  return *phases;
}

absl::StatusOr<JobReport> JobReport::Build(
    const v1::JobConfig& job, const std::vector<SiteHistory>& sites,
    const std::map<uint32_t, double>& test_metric,
    const std::string& test_metric_name) {
  JobReport report;
  report.job_id_ = job.job_id();
  report.test_metric_name_ = test_metric_name;
  report.lower_is_better_ =
      job.metric_direction() == v1::METRIC_LOWER_IS_BETTER;
  report.generated_ms_ = absl::ToUnixMillis(absl::Now());

  std::vector<std::string> asked;
  std::vector<const SiteHistory*> knowing;
  for (const SiteHistory& site : sites) {
    SiteRow row = SiteRowOf(site, job.job_id());
    if (row.answered) knowing.push_back(&site);
    asked.push_back(row.answered ? row.name
                                 : absl::StrCat(row.name, " (", row.address,
                                                ": ", row.error, ")"));
    report.sites_.push_back(std::move(row));
  }
  if (knowing.empty()) {
    return absl::NotFoundError(absl::StrCat("no site knows job ", job.job_id(),
                                            "; asked ",
                                            absl::StrJoin(asked, ", ")));
  }

  // The metric: the job's, else the first one a site reported.
  report.metric_name_ = job.metric_name();
  if (report.metric_name_.empty()) {
    report.metric_name_ = FirstReportedMetric(knowing);
  }

  const std::set<std::string> trainers = TrainersOf(job);

  // Every round some site recorded, with each site's record of it.
  const RecordsByRound by_round = GroupByRound(knowing);
  std::map<std::string, SiteRow*> site_rows;
  for (SiteRow& row : report.sites_) site_rows[row.name] = &row;

  std::optional<double> best;
  for (const auto& [round, records] : by_round) {
    RoundRow row;
    row.round = round;
    RoundTally tally;
    for (const auto& [site, r] : records) {
      const std::string& name = site->site.name();
      AddRecord(name, *r, report.metric_name_, &row, site_rows[name], &tally);
    }
    if (row.aggregator.empty() && !tally.aggregator_votes.empty()) {
      row.aggregator = MostVoted(tally.aggregator_votes);
    }
    row.participants.assign(tally.participants.begin(),
                            tally.participants.end());
    for (const SiteHistory* site : knowing) {
      const std::string& name = site->site.name();
      if (trainers.count(name) > 0 && tally.participants.count(name) == 0) {
        row.missing.push_back(name);
        ++site_rows[name]->rounds_missed;
      }
    }
    SetMeanMetric(tally.metrics, report.lower_is_better_, &best, &row);
    auto test = test_metric.find(round);
    if (test != test_metric.end()) row.test_metric = test->second;
    for (const std::string& phase : PhaseOrder()) {
      auto it = tally.phase_total.find(phase);
      row.phase_seconds.emplace_back(phase, it == tally.phase_total.end()
                                                ? 0.0
                                                : it->second / records.size());
    }
    report.rounds_.push_back(std::move(row));
  }
  return report;
}

std::vector<std::string> JobReport::MissingSites() const {
  std::vector<std::string> missing;
  for (const SiteRow& site : sites_) {
    if (!site.answered) missing.push_back(site.name);
  }
  return missing;
}

std::string JobReport::Csv() const {
  std::string out = absl::StrCat(
      "round,attempt,aggregator,participants,missing,mean_", metric_name_,
      ",best_mean_", metric_name_, ",", test_metric_name_, ",seconds");
  for (const std::string& phase : PhaseOrder()) {
    absl::StrAppend(&out, ",", phase, "_seconds");
  }
  absl::StrAppend(&out,
                  ",bytes_sent,bytes_received,failovers,trainers_dropped,"
                  "outcome,epsilon\n");
  for (const RoundRow& r : rounds_) {
    absl::StrAppend(&out, r.round, ",", r.attempt, ",", CsvField(r.aggregator),
                    ",", CsvField(absl::StrJoin(r.participants, ";")), ",",
                    CsvField(absl::StrJoin(r.missing, ";")), ",",
                    Number(r.mean_metric), ",", Number(r.best_so_far), ",",
                    Number(r.test_metric), ",", Number(r.seconds));
    for (const auto& [phase, seconds] : r.phase_seconds) {
      absl::StrAppend(&out, ",", Number(seconds));
    }
    std::vector<std::string> epsilon;
    for (const auto& [site, value] : r.epsilon) {
      epsilon.push_back(absl::StrCat(site, "=", Number(value)));
    }
    absl::StrAppend(&out, ",", r.bytes_sent, ",", r.bytes_received, ",",
                    r.failovers, ",", r.trainers_dropped, ",",
                    CsvField(r.outcome), ",",
                    CsvField(absl::StrJoin(epsilon, ";")), "\n");
  }
  return out;
}

std::string JobReport::Json() const {
  nlohmann::ordered_json root;
  root["job_id"] = job_id_;
  root["metric"] = metric_name_;
  root["metric_direction"] = lower_is_better_ ? "lower" : "higher";
  root["test_metric"] = test_metric_name_;
  root["generated_time_ms"] = generated_ms_;
  auto optional = [](std::optional<double> value) {
    return value.has_value() ? nlohmann::ordered_json(*value)
                             : nlohmann::ordered_json(nullptr);
  };
  nlohmann::ordered_json rounds = nlohmann::ordered_json::array();
  for (const RoundRow& r : rounds_) {
    nlohmann::ordered_json phases = nlohmann::ordered_json::object();
    for (const auto& [phase, seconds] : r.phase_seconds) {
      phases[phase] = seconds;
    }
    rounds.push_back({{"round", r.round},
                      {"attempt", r.attempt},
                      {"aggregator", r.aggregator},
                      {"participants", r.participants},
                      {"missing", r.missing},
                      {"mean_metric", optional(r.mean_metric)},
                      {"best_so_far", optional(r.best_so_far)},
                      {"test_metric", optional(r.test_metric)},
                      {"seconds", r.seconds},
                      {"phase_seconds", phases},
                      {"bytes_sent", r.bytes_sent},
                      {"bytes_received", r.bytes_received},
                      {"failovers", r.failovers},
                      {"trainers_dropped", r.trainers_dropped},
                      {"outcome", r.outcome},
                      {"epsilon", r.epsilon}});
  }
  root["rounds"] = rounds;
  nlohmann::ordered_json sites = nlohmann::ordered_json::array();
  for (const SiteRow& s : sites_) {
    sites.push_back({{"site", s.name},
                     {"address", s.address},
                     {"answered", s.answered},
                     {"error", s.error},
                     {"state", s.state},
                     {"end_reason", s.end_reason},
                     {"rounds_trained", s.rounds_trained},
                     {"rounds_aggregated", s.rounds_aggregated},
                     {"rounds_missed", s.rounds_missed},
                     {"failovers", s.failovers},
                     {"rounds_taken_over", s.rounds_taken_over},
                     {"trainers_dropped", s.trainers_dropped},
                     {"rejoins", s.rejoins},
                     {"last_error", s.last_error},
                     {"epsilon", optional(s.epsilon)},
                     {"delta", s.delta}});
  }
  root["sites"] = sites;
  root["missing_sites"] = MissingSites();
  return root.dump(2, ' ', false,
                   nlohmann::ordered_json::error_handler_t::replace) +
         "\n";
}

std::string JobReport::Html() const {
  std::string out = absl::StrCat(kPageHeadOpen, Escape(job_id_), kPageHeadRest);
  const std::vector<std::string> missing_sites = MissingSites();
  int answered = static_cast<int>(sites_.size() - missing_sites.size());
  absl::StrAppend(
      &out, "<h1>Swarm job report: ", Escape(job_id_), "</h1>\n",
      "<div class=\"meta\">", rounds_.size(), " rounds, ", answered, " of ",
      sites_.size(), " sites answered; metric: ", Escape(metric_name_), " (",
      lower_is_better_ ? "lower" : "higher", " is better); generated ",
      Escape(absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                              absl::FromUnixMillis(generated_ms_),
                              absl::UTCTimeZone())),
      "</div>\n");
  for (const SiteRow& site : sites_) {
    if (site.answered) continue;
    absl::StrAppend(&out, "<div class=\"warn\" id=\"missing-",
                    Escape(site.name), "\">Site ", Escape(site.name),
                    " did not answer: ", Escape(site.error),
                    " (the report has only the other sites' view)</div>\n");
  }
  if (rounds_.empty()) {
    absl::StrAppend(&out, "<p>No round has been recorded yet.</p>\n");
  }
  Frame base;
  if (!rounds_.empty()) {
    base.first_round = rounds_.front().round;
    base.last_round = rounds_.back().round;
  }

  // 1. The learning curve.
  absl::StrAppend(&out, LearningCurveSection(base, rounds_, metric_name_,
                                             test_metric_name_));
  // 2. Round time, stacked by phase (mean over the sites).
  absl::StrAppend(&out, RoundTimeSection(base, rounds_));
  // 3 and 4. Who aggregated each round; who took part in it.
  std::vector<std::string> names;
  for (const SiteRow& s : sites_) names.push_back(s.name);
  absl::StrAppend(&out, AggregatorSection(base, rounds_, names),
                  ParticipationSection(base, rounds_, sites_, names));
  // 5. Differential privacy: each site's epsilon spent, over the rounds.
  absl::StrAppend(&out, PrivacySection(base, rounds_, sites_));
  // Tables.
  absl::StrAppend(&out, SitesTable(sites_),
                  RoundsTable(rounds_, metric_name_, test_metric_name_),
                  kPageTail);
  return out;
}

absl::StatusOr<std::map<uint32_t, double>> ParseMetricCsv(
    const std::string& text, const std::string& column) {
  std::vector<std::string> lines =
      absl::StrSplit(text, absl::ByAnyChar("\r\n"), absl::SkipEmpty());
  if (lines.empty()) return absl::InvalidArgumentError("empty CSV");
  const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  int round_index = -1, value_index = -1;
  for (size_t i = 0; i < header.size(); ++i) {
    const std::string name(absl::StripAsciiWhitespace(header[i]));
    if (name == "round") round_index = static_cast<int>(i);
    if (name == column) value_index = static_cast<int>(i);
  }
  if (round_index < 0 || value_index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CSV header must name the columns round and ", column,
                     ": ", lines[0]));
  }
  std::map<uint32_t, double> values;
  for (size_t l = 1; l < lines.size(); ++l) {
    const std::vector<std::string> fields = absl::StrSplit(lines[l], ',');
    const size_t needed = std::max(round_index, value_index) + 1;
    uint32_t round = 0;
    double value = 0;
    if (fields.size() < needed ||
        !absl::SimpleAtoi(fields[round_index], &round)) {
      return absl::InvalidArgumentError(
          absl::StrCat("CSV line ", l + 1, " has no round: ", lines[l]));
    }
    if (absl::StripAsciiWhitespace(fields[value_index]).empty()) continue;
    if (!absl::SimpleAtod(fields[value_index], &value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CSV line ", l + 1, ": ", column, " is not a number: ", lines[l]));
    }
    values[round] = value;
  }
  return values;
}

absl::Status WriteReport(const JobReport& report, const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make ", dir, ": ", error.message()));
  }
  const std::pair<const char*, std::string> files[] = {
      {"report.html", report.Html()},
      {"report.csv", report.Csv()},
      {"report.json", report.Json()}};
  for (const auto& [name, content] : files) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    const std::string temporary = path + ".tmp";
    {
      std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
      file << content;
      file.flush();
      if (!file) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot write ", temporary));
      }
    }
    std::filesystem::rename(temporary, path, error);
    if (error) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot rename ", temporary, ": ", error.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace report
}  // namespace swarm
