// xml_text: text made safe for an XML (SVG) element or attribute — &, <, >, " and ' as entities,
// control bytes other than tab dropped (XML 1.0 cannot hold them). The SVG writers (loss curves,
// pipeline timelines) share it.
#pragma once

#include <string>
#include <string_view>

namespace quintet {

inline std::string xml_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    switch (ch) {
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
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(ch) >= 0x20 || ch == '\t') out += ch;
    }
  }
  return out;
}

}  // namespace quintet
