#include "persist/safetensors.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "persist/atomic_file.h"

namespace swarm::persist {
namespace {

using Json = nlohmann::json;

constexpr absl::string_view kMetadataKey = "__metadata__";
constexpr uint64_t kPrefixBytes = 8;
// A valid header nests three levels deep ({ "t": { "shape": [ ); deeper input
// is refused before parsing so that a hostile header cannot make the parser
// build a huge stack.
constexpr int kMaxJsonDepth = 16;
// Names quoted in error messages are cut to this many bytes.
constexpr size_t kMaxQuotedBytes = 200;

// `s` quoted and escaped for an error message.
std::string Quote(absl::string_view s) {
  if (s.size() <= kMaxQuotedBytes)
    return absl::StrCat("\"", absl::CHexEscape(s), "\"");
  return absl::StrCat("\"", absl::CHexEscape(s.substr(0, kMaxQuotedBytes)),
                      "\"... (", s.size(), " bytes)");
}

// `s` with bytes outside printable ASCII shown as \xNN, cut to a sane length.
std::string Printable(absl::string_view s) {
  std::string out;
  for (char c : s.substr(0, 4 * kMaxQuotedBytes)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7F) {
      out.push_back(c);
    } else {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    }
  }
  return out;
}

std::string TensorLabel(absl::string_view name) {
  return absl::StrCat("tensor ", Quote(name));
}

std::string ShapeString(const std::vector<uint64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string RangeString(uint64_t begin, uint64_t end) {
  return absl::StrCat("[", begin, ", ", end, "]");
}

// RFC 3629 UTF-8 (no overlong forms, no surrogates, at most U+10FFFF).
bool IsValidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int extra;
    uint32_t code;
    uint32_t min;
    if ((c & 0xE0) == 0xC0) {
      extra = 1, code = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, code = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, code = c & 0x07, min = 0x10000;
    } else {
      return false;
    }
    if (end - p <= extra) return false;
    for (int i = 1; i <= extra; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      code = (code << 6) | (p[i] & 0x3F);
    }
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return false;
    }
    p += extra + 1;
  }
  return true;
}

absl::Status CheckNesting(absl::string_view json) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : json) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors header JSON nests deeper than ",
                         kMaxJsonDepth, " levels"));
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return absl::OkStatus();
}

// Records the parser's own error message (the DOM parser in no-exception
// mode only says "discarded").
class ErrorCapture : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    message = ex.what();
    return false;
  }
  std::string message;
};

// Parses the header JSON, refusing duplicate keys at any level (the DOM
// silently keeps only the last one).
absl::StatusOr<Json> ParseJson(absl::string_view json) {
  if (json.empty() || json[0] != '{') {
    return absl::InvalidArgumentError(
        "safetensors header is not a JSON object: it does not start with '{'");
  }
  SWARM_RETURN_IF_ERROR(CheckNesting(json));
  struct Frame {
    std::set<std::string> keys;
    std::string owner;  // The key whose value this object is.
  };
  std::vector<Frame> frames;
  std::string last_key;
  std::string duplicate_error;
  const Json::parser_callback_t callback =
      [&](int depth, Json::parse_event_t event, Json& parsed) {
        switch (event) {
          case Json::parse_event_t::object_start:
            frames.push_back(Frame{{}, frames.empty() ? "" : last_key});
            break;
          case Json::parse_event_t::object_end:
            if (!frames.empty()) frames.pop_back();
            break;
          case Json::parse_event_t::key: {
            const auto* key = parsed.get_ptr<const std::string*>();
            if (key == nullptr || frames.empty()) break;
            if (!frames.back().keys.insert(*key).second &&
                duplicate_error.empty()) {
              duplicate_error =
                  frames.size() == 1
                      ? absl::StrCat("duplicate tensor name ", Quote(*key),
                                     " in safetensors header")
                      : absl::StrCat("duplicate field ", Quote(*key),
                                     " in the entry of ",
                                     Quote(frames.back().owner));
            }
            last_key = *key;
            break;
          }
          default:
            break;
        }
        return true;
      };
  const char* begin = json.data();
  const char* end = json.data() + json.size();
  Json root = Json::parse(begin, end, callback, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    ErrorCapture capture;
    Json::sax_parse(begin, end, &capture);
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors header is malformed JSON: ",
        capture.message.empty() ? "parse error" : Printable(capture.message)));
  }
  if (!duplicate_error.empty()) {
    return absl::InvalidArgumentError(duplicate_error);
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        "safetensors header is not a JSON object");
  }
  return root;
}

// A non-negative JSON integer, or nullopt.
std::optional<uint64_t> AsUint64(const Json& value) {
  if (const auto* u = value.get_ptr<const Json::number_unsigned_t*>()) {
    return static_cast<uint64_t>(*u);
  }
  if (const auto* i = value.get_ptr<const Json::number_integer_t*>()) {
    if (*i >= 0) return static_cast<uint64_t>(*i);
  }
  return std::nullopt;
}

// begin <= end and (end - begin) == product(shape) * dtype size.
absl::Status CheckTensorBytes(const SafetensorsTensor& t) {
  if (DTypeSize(t.dtype) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(TensorLabel(t.name),
                                                   ": unknown dtype value ",
                                                   static_cast<int>(t.dtype)));
  }
  if (t.begin > t.end) {
    return absl::InvalidArgumentError(
        absl::StrCat(TensorLabel(t.name), ": data_offsets ",
                     RangeString(t.begin, t.end), " have begin > end"));
  }
  absl::StatusOr<uint64_t> bytes = TensorByteSize(t.dtype, t.shape);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        TensorLabel(t.name), ": shape ", ShapeString(t.shape), " of ",
        DTypeName(t.dtype), ": ", bytes.status().message()));
  }
  if (t.end - t.begin != *bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        TensorLabel(t.name), ": data_offsets ", RangeString(t.begin, t.end),
        " span ", t.end - t.begin, " bytes but shape ", ShapeString(t.shape),
        " of ", DTypeName(t.dtype), " needs ", *bytes, " bytes"));
  }
  return absl::OkStatus();
}

// The tensors, taken in the given order, must tile [0, total) with no overlap
// and no gap. Sets *total to the end of the last tensor.
absl::Status CheckTiling(const std::vector<SafetensorsTensor>& tensors,
                         uint64_t* total) {
  uint64_t expected = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor& t : tensors) {
    if (t.begin < expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          TensorLabel(t.name), ": data_offsets ", RangeString(t.begin, t.end),
          " overlap ", TensorLabel(previous->name), " at ",
          RangeString(previous->begin, previous->end)));
    }
    if (t.begin > expected) {
      return absl::InvalidArgumentError(
          previous == nullptr
              ? absl::StrCat("gap of ", t.begin,
                             " bytes in the data section before the first ",
                             TensorLabel(t.name), " (data_offsets ",
                             RangeString(t.begin, t.end), ")")
              : absl::StrCat("gap of ", t.begin - expected,
                             " bytes in the data section between ",
                             TensorLabel(previous->name), " (ends at ",
                             previous->end, ") and ", TensorLabel(t.name),
                             " (begins at ", t.begin, ")"));
    }
    expected = t.end;
    previous = &t;
  }
  *total = expected;
  return absl::OkStatus();
}

std::string TrailingGapMessage(const SafetensorsLayout& layout, uint64_t total,
                               uint64_t data_size) {
  if (layout.tensors.empty()) {
    return absl::StrCat("gap of ", data_size - total,
                        " bytes in the data section: no tensor covers them");
  }
  return absl::StrCat("gap of ", data_size - total,
                      " bytes in the data section after the last ",
                      TensorLabel(layout.tensors.back().name), " (ends at ",
                      total, "; the data section has ", data_size, " bytes)");
}

absl::Status ParseMetadata(const Json& value,
                           std::map<std::string, std::string>* metadata) {
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        "safetensors __metadata__ is not a JSON object of strings");
  }
  for (auto it = value.begin(); it != value.end(); ++it) {
    const auto* text = it.value().get_ptr<const std::string*>();
    if (text == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors __metadata__ value of key ",
                       Quote(it.key()), " is not a string"));
    }
    (*metadata)[it.key()] = *text;
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsTensor> ParseTensorEntry(const std::string& name,
                                                   const Json& entry) {
  const std::string label = TensorLabel(name);
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": entry is not a JSON object"));
  }
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    if (it.key() != "dtype" && it.key() != "shape" &&
        it.key() != "data_offsets") {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": unexpected field ", Quote(it.key()),
          " (a tensor entry has exactly dtype, shape and data_offsets)"));
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": missing field \"", field, "\""));
    }
  }
  SafetensorsTensor tensor;
  tensor.name = name;

  const auto* dtype_name = entry.find("dtype")->get_ptr<const std::string*>();
  if (dtype_name == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": \"dtype\" is not a string"));
  }
  absl::StatusOr<DType> dtype = ParseDTypeName(*dtype_name);
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": ", dtype.status().message()));
  }
  tensor.dtype = *dtype;

  const Json& shape = *entry.find("shape");
  if (!shape.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": \"shape\" is not an array of non-negative integers"));
  }
  tensor.shape.reserve(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    std::optional<uint64_t> dim = AsUint64(shape[i]);
    if (!dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": \"shape\" element ", i, " (",
          shape[i].dump(-1, ' ', true, Json::error_handler_t::replace),
          ") is not a non-negative integer"));
    }
    tensor.shape.push_back(*dim);
  }

  const Json& offsets = *entry.find("data_offsets");
  std::optional<uint64_t> begin, end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = AsUint64(offsets[0]);
    end = AsUint64(offsets[1]);
  }
  if (!begin || !end) {
    return absl::InvalidArgumentError(
        absl::StrCat(label,
                     ": \"data_offsets\" is not an array [begin, end] of two "
                     "non-negative integers"));
  }
  tensor.begin = *begin;
  tensor.end = *end;
  SWARM_RETURN_IF_ERROR(CheckTensorBytes(tensor));
  return tensor;
}

// Parses and checks everything except the size of the data section:
// data_size is set to where the tiling ends.
absl::StatusOr<SafetensorsLayout> ParseHeaderUnbounded(absl::string_view json) {
  SWARM_ASSIGN_OR_RETURN(Json root, ParseJson(json));
  SafetensorsLayout layout;
  layout.tensors.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == kMetadataKey) {
      SWARM_RETURN_IF_ERROR(ParseMetadata(it.value(), &layout.metadata));
      continue;
    }
    SWARM_ASSIGN_OR_RETURN(SafetensorsTensor tensor,
                           ParseTensorEntry(it.key(), it.value()));
    layout.tensors.push_back(std::move(tensor));
  }
  std::sort(layout.tensors.begin(), layout.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
              return std::tie(a.begin, a.end, a.name) <
                     std::tie(b.begin, b.end, b.name);
            });
  SWARM_RETURN_IF_ERROR(CheckTiling(layout.tensors, &layout.data_size));
  return layout;
}

// The first tensor that ends beyond `available` bytes.
const SafetensorsTensor& FirstBeyond(const SafetensorsLayout& layout,
                                     uint64_t available) {
  for (const SafetensorsTensor& t : layout.tensors) {
    if (t.end > available) return t;
  }
  return layout.tensors.back();  // Unreachable when data_size > available.
}

// Rules of EncodeSafetensorsPrefix beyond CheckTensorBytes/CheckTiling.
absl::Status ValidateLayoutForWrite(const SafetensorsLayout& layout) {
  std::set<absl::string_view> names;
  for (const SafetensorsTensor& t : layout.tensors) {
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          "tensor name \"__metadata__\" is reserved by the safetensors format");
    }
    if (!IsValidUtf8(t.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(TensorLabel(t.name), ": name is not valid UTF-8"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("duplicate tensor name ", Quote(t.name)));
    }
    SWARM_RETURN_IF_ERROR(CheckTensorBytes(t));
  }
  uint64_t total = 0;
  SWARM_RETURN_IF_ERROR(CheckTiling(layout.tensors, &total));
  if (total > layout.data_size) {
    const SafetensorsTensor& t = FirstBeyond(layout, layout.data_size);
    return absl::InvalidArgumentError(absl::StrCat(
        TensorLabel(t.name), ": data_offsets ", RangeString(t.begin, t.end),
        " out of bounds of the ", layout.data_size, "-byte data section"));
  }
  if (total < layout.data_size) {
    return absl::InvalidArgumentError(
        TrailingGapMessage(layout, total, layout.data_size));
  }
  for (const auto& [key, value] : layout.metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors __metadata__ entry ", Quote(key),
                       " is not valid UTF-8"));
    }
  }
  return absl::OkStatus();
}

uint64_t LoadLittleEndian64(const char* p) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(p[i]);
  }
  return value;
}

void AppendLittleEndian64(uint64_t value, std::string* out) {
  for (int i = 0; i < 8; ++i) {
    out->push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
  }
}

}  // namespace

absl::StatusOr<SafetensorsLayout> ParseSafetensorsHeader(absl::string_view json,
                                                         uint64_t data_size) {
  SWARM_ASSIGN_OR_RETURN(SafetensorsLayout layout, ParseHeaderUnbounded(json));
  const uint64_t total = layout.data_size;
  if (total > data_size) {
    const SafetensorsTensor& t = FirstBeyond(layout, data_size);
    return absl::InvalidArgumentError(absl::StrCat(
        TensorLabel(t.name), ": data_offsets ", RangeString(t.begin, t.end),
        " out of bounds of the ", data_size, "-byte data section"));
  }
  if (total < data_size) {
    return absl::InvalidArgumentError(
        TrailingGapMessage(layout, total, data_size));
  }
  return layout;
}

absl::StatusOr<SafetensorsLayout> ParseSafetensors(absl::string_view file_bytes,
                                                   uint64_t* data_start) {
  if (file_bytes.size() < kPrefixBytes) {
    return absl::DataLossError(
        absl::StrCat("safetensors file truncated: ", file_bytes.size(),
                     " bytes, shorter than the 8-byte header length"));
  }
  const uint64_t header_len = LoadLittleEndian64(file_bytes.data());
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors header length ", header_len, " exceeds the limit of ",
        kMaxSafetensorsHeaderBytes, " bytes (oversize header)"));
  }
  const uint64_t after_prefix = file_bytes.size() - kPrefixBytes;
  if (header_len > after_prefix) {
    return absl::DataLossError(absl::StrCat(
        "safetensors header length ", header_len, " exceeds the ", after_prefix,
        " bytes that follow the length prefix (file truncated)"));
  }
  SWARM_ASSIGN_OR_RETURN(
      SafetensorsLayout layout,
      ParseHeaderUnbounded(file_bytes.substr(kPrefixBytes, header_len)));
  const uint64_t available = after_prefix - header_len;
  if (layout.data_size > available) {
    const SafetensorsTensor& t = FirstBeyond(layout, available);
    return absl::DataLossError(absl::StrCat(
        "safetensors data section truncated: ", TensorLabel(t.name),
        " ends at byte ", t.end, " of the data section but only ", available,
        " bytes follow the header"));
  }
  if (layout.data_size < available) {
    return absl::InvalidArgumentError(
        TrailingGapMessage(layout, layout.data_size, available));
  }
  if (data_start != nullptr) *data_start = kPrefixBytes + header_len;
  return layout;
}

absl::StatusOr<SafetensorsLayout> MakeSafetensorsLayout(
    const std::vector<TensorDecl>& tensors,
    std::map<std::string, std::string> metadata) {
  SafetensorsLayout layout;
  layout.metadata = std::move(metadata);
  layout.tensors.reserve(tensors.size());
  uint64_t offset = 0;
  for (const TensorDecl& decl : tensors) {
    if (DTypeSize(decl.dtype) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(TensorLabel(decl.name), ": unknown dtype value ",
                       static_cast<int>(decl.dtype)));
    }
    absl::StatusOr<uint64_t> bytes = TensorByteSize(decl.dtype, decl.shape);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          TensorLabel(decl.name), ": shape ", ShapeString(decl.shape), " of ",
          DTypeName(decl.dtype), ": ", bytes.status().message()));
    }
    if (*bytes > UINT64_MAX - offset) {
      return absl::InvalidArgumentError(absl::StrCat(
          TensorLabel(decl.name), ": the data section size overflows 64 bits"));
    }
    SafetensorsTensor t;
    t.name = decl.name;
    t.dtype = decl.dtype;
    t.shape = decl.shape;
    t.begin = offset;
    t.end = offset + *bytes;
    offset = t.end;
    layout.tensors.push_back(std::move(t));
  }
  layout.data_size = offset;
  SWARM_RETURN_IF_ERROR(ValidateLayoutForWrite(layout));
  return layout;
}

absl::StatusOr<std::string> EncodeSafetensorsPrefix(
    const SafetensorsLayout& layout) {
  SWARM_RETURN_IF_ERROR(ValidateLayoutForWrite(layout));
  Json header = Json::object();
  if (!layout.metadata.empty()) {
    Json metadata = Json::object();
    for (const auto& [key, value] : layout.metadata) metadata[key] = value;
    header[std::string(kMetadataKey)] = std::move(metadata);
  }
  for (const SafetensorsTensor& t : layout.tensors) {
    Json shape = Json::array();
    for (uint64_t dim : t.shape) shape.push_back(dim);
    Json offsets = Json::array();
    offsets.push_back(t.begin);
    offsets.push_back(t.end);
    Json entry = Json::object();
    entry["dtype"] = std::string(DTypeName(t.dtype));
    entry["shape"] = std::move(shape);
    entry["data_offsets"] = std::move(offsets);
    header[t.name] = std::move(entry);
  }
  // Strings were checked for UTF-8 above, so `replace` never fires.
  std::string json = header.dump(-1, ' ', /*ensure_ascii=*/false,
                                 Json::error_handler_t::replace);
  const size_t padded = (json.size() + 7) / 8 * 8;
  if (padded > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors header of ", padded, " bytes exceeds the limit of ",
        kMaxSafetensorsHeaderBytes, " bytes (oversize header)"));
  }
  json.resize(padded, ' ');
  std::string prefix;
  prefix.reserve(kPrefixBytes + padded);
  AppendLittleEndian64(padded, &prefix);
  prefix += json;
  return prefix;
}

// ----------------------------------------------------------- SafetensorsFile

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path) {
  SWARM_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file,
                         MappedFile::Open(path));
  uint64_t data_start = 0;
  absl::StatusOr<SafetensorsLayout> layout =
      ParseSafetensors(file->data(), &data_start);
  if (!layout.ok()) {
    return absl::Status(layout.status().code(),
                        absl::StrCat(path, ": ", layout.status().message()));
  }
  return std::unique_ptr<SafetensorsFile>(
      new SafetensorsFile(std::move(file), *std::move(layout), data_start));
}

SafetensorsFile::SafetensorsFile(std::unique_ptr<MappedFile> file,
                                 SafetensorsLayout layout, uint64_t data_start)
    : path_(file->path()),
      file_(std::move(file)),
      layout_(std::move(layout)),
      data_start_(data_start) {}

std::optional<size_t> SafetensorsFile::FindTensor(
    absl::string_view name) const {
  for (size_t i = 0; i < layout_.tensors.size(); ++i) {
    if (layout_.tensors[i].name == name) return i;
  }
  return std::nullopt;
}

absl::string_view SafetensorsFile::data_section() const {
  if (file_ == nullptr) return absl::string_view();
  return file_->data().substr(static_cast<size_t>(data_start_));
}

absl::string_view SafetensorsFile::tensor_data(size_t i) const {
  if (file_ == nullptr) return absl::string_view();
  const SafetensorsTensor& t = layout_.tensors[i];
  return data_section().substr(static_cast<size_t>(t.begin),
                               static_cast<size_t>(t.end - t.begin));
}

absl::Status WriteSafetensorsFile(
    const std::string& path, const SafetensorsLayout& layout,
    absl::Span<const absl::string_view> tensor_data) {
  SWARM_ASSIGN_OR_RETURN(std::string prefix, EncodeSafetensorsPrefix(layout));
  if (tensor_data.size() != layout.tensors.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("writing ", path, ": ", tensor_data.size(),
                     " data buffers for ", layout.tensors.size(), " tensors"));
  }
  for (size_t i = 0; i < tensor_data.size(); ++i) {
    const SafetensorsTensor& t = layout.tensors[i];
    if (tensor_data[i].size() != t.end - t.begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          "writing ", path, ": ", TensorLabel(t.name), " has ",
          tensor_data[i].size(), " bytes of data but its layout needs ",
          t.end - t.begin));
    }
  }
  SWARM_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileWriter> writer,
                         AtomicFileWriter::Create(path));
  SWARM_RETURN_IF_ERROR(writer->Append(prefix));
  for (absl::string_view bytes : tensor_data) {
    SWARM_RETURN_IF_ERROR(writer->Append(bytes));
  }
  return writer->Commit();
}

}  // namespace swarm::persist
