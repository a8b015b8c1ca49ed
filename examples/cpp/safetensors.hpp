// A minimal safetensors reader and writer: an 8-byte little-endian header length, a JSON header
// ({"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}), then the raw little-endian tensor bytes. Only what the
// example needs: whole-file reads, the dtypes F32, BF16, F16, I32, U8, BOOL, string metadata.
#ifndef MLXKERN_EXAMPLE_SAFETENSORS_HPP
#define MLXKERN_EXAMPLE_SAFETENSORS_HPP

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace safetensors {

struct Tensor {
  std::string dtype;           // "F32", "BF16", "F16", "I32", "U8", "BOOL"
  std::vector<int64_t> shape;  // row-major
  std::vector<uint8_t> data;   // raw little-endian bytes

  [[nodiscard]] size_t elements() const {
    size_t count = 1;
    for (int64_t dim : shape) count *= static_cast<size_t>(dim);
    return count;
  }
};

[[nodiscard]] inline size_t dtype_size(const std::string &dtype) {
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  throw std::runtime_error("safetensors: unknown dtype " + dtype);
}

struct File {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;

  [[nodiscard]] const Tensor &at(const std::string &name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error("safetensors: no tensor named " + name);
    return it->second;
  }
  [[nodiscard]] const std::string &meta(const std::string &key) const {
    auto it = metadata.find(key);
    if (it == metadata.end()) throw std::runtime_error("safetensors: no metadata key " + key);
    return it->second;
  }
};

namespace detail {

// A small JSON reader, enough for safetensors headers: objects, arrays, strings (with escapes;
// \u escapes below 0x80 only), integers. Values are read into the structures above directly.
class Json {
 public:
  explicit Json(const std::string &text) : text_(text) {}

  /** Each tensor's [begin, end) byte range in the data section, by name. */
  std::map<std::string, std::pair<uint64_t, uint64_t>> ranges;

  File parse_header() {
    File file;
    expect('{');
    if (!consume('}')) {
      do {
        const std::string name = string();
        expect(':');
        if (name == "__metadata__") {
          expect('{');
          if (!consume('}')) {
            do {
              const std::string key = string();
              expect(':');
              file.metadata[key] = string();
            } while (consume(','));
            expect('}');
          }
        } else {
          if (file.tensors.count(name) != 0) fail("duplicate tensor " + name);
          file.tensors[name] = tensor_info(name);
        }
      } while (consume(','));
      expect('}');
    }
    skip_space();
    if (pos_ != text_.size()) fail("trailing characters after the header");
    return file;
  }

 private:
  Tensor tensor_info(const std::string &name) {
    Tensor tensor;
    std::pair<uint64_t, uint64_t> range{0, 0};
    bool have_range = false;
    expect('{');
    do {
      const std::string key = string();
      expect(':');
      if (key == "dtype") {
        tensor.dtype = string();
      } else if (key == "shape") {
        expect('[');
        if (!consume(']')) {
          do tensor.shape.push_back(static_cast<int64_t>(integer()));
          while (consume(','));
          expect(']');
        }
      } else if (key == "data_offsets") {
        expect('[');
        range.first = integer();
        expect(',');
        range.second = integer();
        expect(']');
        have_range = true;
      } else {
        fail("unexpected tensor field " + key);
      }
    } while (consume(','));
    expect('}');
    if (tensor.dtype.empty() || !have_range) fail("tensor entry lacks dtype or data_offsets");
    ranges[name] = range;
    return tensor;
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\t'))
      ++pos_;
  }
  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) fail(std::string("expected '") + c + "'");
  }
  uint64_t integer() {
    skip_space();
    const size_t start = pos_;
    uint64_t value = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      value = value * 10 + static_cast<uint64_t>(text_[pos_] - '0');
      ++pos_;
    }
    if (pos_ == start) fail("expected a non-negative integer");
    return value;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      const char c = text_[pos_++];
      if (c == '"') break;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          if (pos_ + 4 > text_.size()) fail("short \\u escape");
          const unsigned code = static_cast<unsigned>(std::stoul(text_.substr(pos_, 4), nullptr, 16));
          pos_ += 4;
          if (code >= 0x80) fail("non-ASCII \\u escape (unsupported here)");
          out += static_cast<char>(code);
          break;
        }
        default: fail("bad escape");
      }
    }
    return out;
  }
  [[noreturn]] void fail(const std::string &what) const {
    throw std::runtime_error("safetensors header: " + what + " at byte " + std::to_string(pos_));
  }

  const std::string &text_;
  size_t pos_ = 0;
};

inline std::string quote(const std::string &text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) throw std::runtime_error("control char in name");
        out += c;
    }
  }
  return out + "\"";
}

}  // namespace detail

/** Reads a whole safetensors file. Throws std::runtime_error on any inconsistency. */
[[nodiscard]] inline File read(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("safetensors: cannot open " + path);
  unsigned char size_bytes[8];
  if (!in.read(reinterpret_cast<char *>(size_bytes), 8)) throw std::runtime_error(path + ": too short");
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | size_bytes[i];
  if (header_size > (uint64_t{1} << 30)) throw std::runtime_error(path + ": header too large");
  std::string header(static_cast<size_t>(header_size), '\0');
  if (!in.read(&header[0], static_cast<std::streamsize>(header_size)))
    throw std::runtime_error(path + ": truncated header");
  std::vector<uint8_t> body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  detail::Json json(header);
  File file = json.parse_header();
  for (auto &entry : file.tensors) {
    Tensor &tensor = entry.second;
    const auto range = json.ranges.at(entry.first);
    const uint64_t want = tensor.elements() * dtype_size(tensor.dtype);
    if (range.second < range.first || range.second > body.size() || range.second - range.first != want)
      throw std::runtime_error(path + ": bad data_offsets for " + entry.first);
    tensor.data.assign(body.begin() + static_cast<std::ptrdiff_t>(range.first),
                       body.begin() + static_cast<std::ptrdiff_t>(range.second));
  }
  return file;
}

/** Writes `file` (tensors in name order; the header padded with spaces to 8 bytes). */
inline void write(const std::string &path, const File &file) {
  std::string header = "{";
  uint64_t offset = 0;
  bool first = true;
  if (!file.metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first_meta = true;
    for (const auto &entry : file.metadata) {
      if (!first_meta) header += ",";
      header += detail::quote(entry.first) + ":" + detail::quote(entry.second);
      first_meta = false;
    }
    header += "}";
    first = false;
  }
  for (const auto &entry : file.tensors) {
    const Tensor &tensor = entry.second;
    const uint64_t bytes = tensor.data.size();
    if (bytes != tensor.elements() * dtype_size(tensor.dtype))
      throw std::runtime_error("safetensors: " + entry.first + " has the wrong number of bytes");
    if (!first) header += ",";
    header += detail::quote(entry.first) + ":{\"dtype\":" + detail::quote(tensor.dtype) + ",\"shape\":[";
    for (size_t i = 0; i < tensor.shape.size(); ++i) {
      if (i) header += ",";
      header += std::to_string(tensor.shape[i]);
    }
    header += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
    first = false;
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("safetensors: cannot create " + path);
  unsigned char size_bytes[8];
  uint64_t size = header.size();
  for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<unsigned char>((size >> (8 * i)) & 0xFF);
  out.write(reinterpret_cast<const char *>(size_bytes), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto &entry : file.tensors)
    out.write(reinterpret_cast<const char *>(entry.second.data.data()),
              static_cast<std::streamsize>(entry.second.data.size()));
  if (!out) throw std::runtime_error("safetensors: write failed for " + path);
}

}  // namespace safetensors

#endif  // MLXKERN_EXAMPLE_SAFETENSORS_HPP
