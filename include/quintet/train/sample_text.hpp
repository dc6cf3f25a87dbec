// sample_text: generated tokens as text a terminal and a report can hold. Bytes of a byte corpus
// are shown as they are when printable ASCII, as C escapes otherwise (\n, \t, \\, \", \xNN), so a
// sample never writes control codes or broken UTF-8 to the terminal; tokens of a small synthetic
// vocabulary are one character each (0-9 then a-z), larger ones ids separated by spaces.
#pragma once

#include <quintet/core/error.hpp>

#include <cstdint>
#include <span>
#include <string>

namespace quintet::train {

// Byte tokens (0..255) as printable ASCII with C escapes.
inline std::string escape_bytes(std::span<const std::int32_t> tokens) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  for (const std::int32_t t : tokens) {
    QUINTET_CHECK(t >= 0 && t < 256, "escape_bytes: token {} is not a byte", t);
    const char c = static_cast<char>(t);
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      default:
        if (t >= 0x20 && t < 0x7f) {
          out += c;
        } else {
          out += "\\x";
          out += hex[t >> 4];
          out += hex[t & 15];
        }
    }
  }
  return out;
}

// Tokens of a vocabulary of `vocab` ids: one character each (0-9, a-z) up to 36 ids, else decimal
// ids separated by spaces.
inline std::string token_text(std::span<const std::int32_t> tokens, std::int64_t vocab) {
  static constexpr char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  std::string out;
  for (const std::int32_t t : tokens) {
    QUINTET_CHECK(t >= 0 && t < vocab, "token_text: token {} is outside [0, {})", t, vocab);
    if (vocab <= 36) {
      out += digits[t];
    } else {
      if (!out.empty()) out += ' ';
      out += std::to_string(t);
    }
  }
  return out;
}

}  // namespace quintet::train
