#include "common/logging.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace swarm {
namespace {

using ::testing::HasSubstr;

TEST(JsonEscapeTest, EscapesQuotesBackslashesAndControlCharacters) {
  EXPECT_EQ(JsonEscape("plain text 123"), "plain text 123");
  EXPECT_EQ(JsonEscape("say \"hi\""), "say \\\"hi\\\"");
  EXPECT_EQ(JsonEscape("C:\\dir\\"), "C:\\\\dir\\\\");
  EXPECT_EQ(JsonEscape("a\nb\rc\td\be\ff"), "a\\nb\\rc\\td\\be\\ff");
  EXPECT_EQ(JsonEscape(std::string("nul\0x", 5)), "nul\\u0000x");
  EXPECT_EQ(JsonEscape("\x01\x1f\x7f"), "\\u0001\\u001f\\u007f");
  EXPECT_EQ(JsonEscape("/<>'"), "/<>'");  // Nothing else is escaped.
}

TEST(JsonEscapeTest, KeepsValidUtf8AndReplacesInvalidBytes) {
  EXPECT_EQ(JsonEscape("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  const std::string replacement = "\xEF\xBF\xBD";
  EXPECT_EQ(JsonEscape("a\xFF"
                       "b"),
            "a" + replacement + "b");
  // A lone continuation byte, a truncated sequence, an overlong "/", a
  // UTF-16 surrogate, a code point past U+10FFFF.
  EXPECT_EQ(JsonEscape("\x80"), replacement);
  EXPECT_EQ(JsonEscape("\xE2\x82"), replacement + replacement);
  EXPECT_EQ(JsonEscape("\xC0\xAF"), replacement + replacement);
  EXPECT_EQ(JsonEscape("\xED\xA0\x80"),
            replacement + replacement + replacement);
  EXPECT_EQ(JsonEscape("\xF4\x90\x80\x80"),
            replacement + replacement + replacement + replacement);
}

LogRecord Record() {
  LogRecord record;
  record.time = "2026-11-30T06:13:50.123Z";
  record.severity = LogSeverity::kWarning;
  record.site = "site-a";
  record.job = "demo-1";
  record.message = "round 3: result from \"site-b\"\nrefused";
  return record;
}

TEST(FormatLogRecordTest, JsonIsOneObjectPerLine) {
  EXPECT_EQ(FormatLogRecord(LogFormat::kJson, Record()),
            "{\"time\":\"2026-11-30T06:13:50.123Z\",\"level\":\"warning\","
            "\"site\":\"site-a\",\"job\":\"demo-1\",\"round\":3,"
            "\"msg\":\"round 3: result from \\\"site-b\\\"\\nrefused\"}");
}

TEST(FormatLogRecordTest, JsonEventAndFields) {
  LogRecord record = Record();
  record.severity = LogSeverity::kInfo;
  record.job.clear();
  record.event = "metrics_listening";
  record.message = "metrics on 127.0.0.1:9464";
  record.fields = {{"address", "127.0.0.1:9464"}, {"path", "/metrics"}};
  EXPECT_EQ(FormatLogRecord(LogFormat::kJson, record),
            "{\"time\":\"2026-11-30T06:13:50.123Z\",\"level\":\"info\","
            "\"site\":\"site-a\",\"event\":\"metrics_listening\","
            "\"msg\":\"metrics on 127.0.0.1:9464\",\"fields\":{\"address\":"
            "\"127.0.0.1:9464\",\"path\":\"/metrics\"}}");
  EXPECT_EQ(FormatLogRecord(LogFormat::kText, record),
            "2026-11-30T06:13:50.123Z I site-a| metrics on 127.0.0.1:9464 "
            "address=127.0.0.1:9464 path=/metrics");
}

TEST(FormatLogRecordTest, RoundOnlyWhenTheMessageStartsWithIt) {
  LogRecord record = Record();
  for (const char* message :
       {"rounds: 3", "round x", "round 12abc", "a round 3: x", "round "}) {
    record.message = message;
    EXPECT_THAT(FormatLogRecord(LogFormat::kJson, record),
                ::testing::Not(HasSubstr("\"round\":")))
        << message;
  }
  record.message = "round 12 closed";
  EXPECT_THAT(FormatLogRecord(LogFormat::kJson, record),
              HasSubstr("\"round\":12,"));
  record.message = "round 7";
  EXPECT_THAT(FormatLogRecord(LogFormat::kJson, record),
              HasSubstr("\"round\":7,"));
}

TEST(FormatLogRecordTest, TextStaysAsBefore) {
  EXPECT_EQ(FormatLogRecord(LogFormat::kText, Record()),
            "2026-11-30T06:13:50.123Z W site-a| round 3: result from "
            "\"site-b\"\nrefused");
  LogRecord untagged = Record();
  untagged.site.clear();
  untagged.message = "hello";
  EXPECT_EQ(FormatLogRecord(LogFormat::kText, untagged),
            "2026-11-30T06:13:50.123Z W hello");
}

TEST(ParseLogFormatTest, NamesTheFlag) {
  EXPECT_EQ(*ParseLogFormat("--log-format", "json"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("--log-format", "text"), LogFormat::kText);
  absl::StatusOr<LogFormat> bad = ParseLogFormat("--log-format", "xml");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("--log-format: \"xml\" is not a log format"));
}

}  // namespace
}  // namespace swarm
