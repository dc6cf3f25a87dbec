// UTF-8 validation: the length of one well-formed sequence, and the first byte of a text where
// well-formedness fails. JSON writers and readers (run reports, checkpoint headers) share it.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace quintet {

// The length of the well-formed UTF-8 sequence starting at s[i] (1 to 4 bytes), or 0 when none
// does: a stray continuation byte, an overlong form, a surrogate, a code point beyond U+10FFFF,
// or a sequence cut short by the end of `s`. `i` must be less than s.size().
constexpr std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t j) { return static_cast<unsigned char>(s[j]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xbf;  // the range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;   // no overlong forms
    if (lead == 0xed) high = 0x9f;  // no surrogates
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;  // nothing beyond U+10FFFF
  } else {
    return 0;
  }
  if (length > s.size() - i) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t j = 2; j < length; ++j)
    if (byte(i + j) < 0x80 || byte(i + j) > 0xbf) return 0;
  return length;
}

// The offset of the first byte of `s` that does not start a well-formed UTF-8 sequence, or
// nullopt when all of `s` is well-formed.
constexpr std::optional<std::size_t> first_invalid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t length = utf8_sequence_length(s, i);
    if (length == 0) return i;
    i += length;
  }
  return std::nullopt;
}

}  // namespace quintet
