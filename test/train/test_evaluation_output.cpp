// What a run shows of its evaluations and samples: the loss-curve SVG is well-formed XML holding
// its series (one polyline point per step or evaluation), axis labels and the floor; sample bytes
// are escaped for a terminal; report strings stay valid UTF-8 JSON whatever bytes they hold.
#include <catch2/catch.hpp>

#include <quintet/train/json_writer.hpp>
#include <quintet/train/loss_plot.hpp>
#include <quintet/train/sample_text.hpp>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace {

struct xml_element {
  std::string name;
  std::map<std::string, std::string> attributes;
  std::string text;  // the text directly inside it
};

// A strict little XML reader (what an SVG viewer needs): one root, every tag closed in order,
// attributes quoted and not repeated, & only in the five predefined entities; returns the elements
// in document order, or fails the test naming the offset.
std::vector<xml_element> parse_xml(const std::string& doc) {
  std::vector<xml_element> elements;
  std::vector<std::size_t> open;  // indices into elements
  std::size_t i = 0;
  int roots = 0;
  const auto fail = [&](const std::string& why) { FAIL("XML: " << why << " at offset " << i); };
  const auto check_text = [&](const std::string& text) {
    for (std::size_t at = text.find('&'); at != std::string::npos; at = text.find('&', at + 1)) {
      bool known = false;
      for (const char* entity : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"})
        known = known || text.compare(at, std::string(entity).size(), entity) == 0;
      if (!known) fail("a bare &");
    }
  };
  if (doc.starts_with("<?xml")) i = doc.find("?>") + 2;
  while (i < doc.size()) {
    const std::size_t lt = doc.find('<', i);
    const std::string text = doc.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    check_text(text);
    if (!open.empty())
      elements[open.back()].text += text;
    else if (text.find_first_not_of(" \n\t\r") != std::string::npos)
      fail("text outside the root");
    if (lt == std::string::npos) break;
    i = lt + 1;
    const bool closing = doc[i] == '/';
    if (closing) ++i;
    std::size_t end = i;
    while (end < doc.size() && (std::isalnum(static_cast<unsigned char>(doc[end])) ||
                                doc[end] == '_' || doc[end] == '-' || doc[end] == ':'))
      ++end;
    const std::string name = doc.substr(i, end - i);
    if (name.empty()) fail("a tag without a name");
    i = end;
    if (closing) {
      if (open.empty() || elements[open.back()].name != name)
        fail("</" + name + "> closes nothing open");
      open.pop_back();
      if (doc[i] != '>') fail("a malformed closing tag");
      ++i;
      continue;
    }
    if (open.empty()) ++roots;
    xml_element element{.name = name, .attributes = {}, .text = {}};
    while (true) {
      while (std::isspace(static_cast<unsigned char>(doc[i]))) ++i;
      if (doc.compare(i, 2, "/>") == 0 || doc[i] == '>') break;
      const std::size_t eq = doc.find('=', i);
      if (eq == std::string::npos || doc[eq + 1] != '"') fail("an unquoted attribute");
      const std::string key = doc.substr(i, eq - i);
      const std::size_t close = doc.find('"', eq + 2);
      if (close == std::string::npos) fail("an unterminated attribute");
      const std::string value = doc.substr(eq + 2, close - eq - 2);
      if (value.find('<') != std::string::npos) fail("< in an attribute");
      check_text(value);
      if (!element.attributes.emplace(key, value).second) fail("attribute " + key + " twice");
      i = close + 1;
    }
    elements.push_back(element);
    if (doc[i] == '>') {
      open.push_back(elements.size() - 1);
      ++i;
    } else {
      i += 2;
    }
  }
  if (!open.empty()) fail("<" + elements[open.back()].name + "> is not closed");
  if (roots != 1) fail("not one root element");
  return elements;
}

const xml_element* by_id(const std::vector<xml_element>& elements, const std::string& id) {
  for (const auto& e : elements) {
    const auto at = e.attributes.find("id");
    if (at != e.attributes.end() && at->second == id) return &e;
  }
  return nullptr;
}

std::size_t point_count(const xml_element& polyline) {
  const std::string& points = polyline.attributes.at("points");
  if (points.empty()) return 0;
  std::size_t n = 1;
  for (const char c : points) n += c == ' ' ? 1 : 0;
  return n;
}

}  // namespace

TEST_CASE("the loss curve is well-formed SVG holding its series", "[train][plot]") {
  quintet::train::loss_curve curve{.title = "run <A & B>", .floor = 0.9147};
  for (int s = 0; s < 800; ++s)
    curve.training.push_back({double(s), 0.9 + 1.9 * std::exp(-s / 150.0)});
  for (int s = 0; s <= 800; s += 100)
    curve.held_out.push_back({double(s), 1.0 + std::exp(-s / 150.0)});
  const std::string svg = quintet::train::loss_curve_svg(curve);
  const auto elements = parse_xml(svg);
  REQUIRE(elements.front().name == "svg");
  CHECK(elements.front().attributes.at("xmlns") == "http://www.w3.org/2000/svg");
  const auto* training = by_id(elements, "training");
  const auto* held_out = by_id(elements, "held_out");
  REQUIRE(training != nullptr);
  REQUIRE(held_out != nullptr);
  CHECK(training->name == "polyline");
  CHECK(point_count(*training) == 800);
  CHECK(point_count(*held_out) == 9);
  int circles = 0;
  for (const auto& e : elements) circles += e.name == "circle" ? 1 : 0;
  CHECK(circles == 9);
  const auto* floor = by_id(elements, "entropy_floor");
  REQUIRE(floor != nullptr);
  CHECK(floor->attributes.at("stroke-dasharray") == "6 4");
  CHECK(floor->attributes.at("y1") == floor->attributes.at("y2"));
  CHECK(by_id(elements, "x_label")->text == "step");
  CHECK(by_id(elements, "y_label")->text == "loss (nats/token)");
  CHECK(by_id(elements, "title")->text == "run &lt;A &amp; B&gt;");
  CHECK(svg.find(">entropy floor 0.9147</text>") != std::string::npos);
  CHECK(svg.find(">held-out loss</text>") != std::string::npos);
  // Points inside the plot area: x within [70, 780], y within [40, 430] for the default size.
  const std::string& points = training->attributes.at("points");
  bool inside = true;
  for (std::size_t at = 0; at < points.size();) {
    const std::size_t comma = points.find(',', at), space = points.find(' ', comma);
    const double x = std::stod(points.substr(at, comma - at));
    const double y = std::stod(points.substr(comma + 1, space - comma - 1));
    inside = inside && x >= 70 && x <= 780 && y >= 40 && y <= 430;
    at = space == std::string::npos ? points.size() : space + 1;
  }
  CHECK(inside);
}

TEST_CASE("a curve without held-out points or floor, and with a non-finite loss", "[train][plot]") {
  quintet::train::loss_curve curve{.title = "bytes"};
  curve.training = {{0, 5.5}, {1, std::numeric_limits<double>::quiet_NaN()}, {2, 3.0}};
  const std::string svg = quintet::train::loss_curve_svg(curve, 400, 300);
  const auto elements = parse_xml(svg);
  CHECK(point_count(*by_id(elements, "training")) == 2);
  CHECK(by_id(elements, "held_out") == nullptr);
  CHECK(by_id(elements, "entropy_floor") == nullptr);
  CHECK(elements.front().attributes.at("width") == "400");
  REQUIRE_THROWS_WITH(quintet::train::loss_curve_svg(curve, 10, 10),
                      Catch::Contains("loss plot of 10 x 10 pixels is too small"));
}

TEST_CASE("sample bytes are escaped for a terminal", "[train][sample]") {
  const std::vector<std::int32_t> bytes{'G', 'P', 'L', '\n', '"', '\\', '\t', 0, 0x7f, 0xc3, 0xa9};
  CHECK(quintet::train::escape_bytes(bytes) == "GPL\\n\\\"\\\\\\t\\x00\\x7f\\xc3\\xa9");
  CHECK(quintet::train::token_text(std::vector<std::int32_t>{0, 9, 10, 15}, 16) == "09af");
  CHECK(quintet::train::token_text(std::vector<std::int32_t>{3, 40}, 50) == "3 40");
  REQUIRE_THROWS_WITH(quintet::train::escape_bytes(std::vector<std::int32_t>{256}),
                      Catch::Contains("token 256 is not a byte"));
}

TEST_CASE("json_writer keeps strings valid UTF-8 whatever bytes they hold", "[train][json]") {
  quintet::train::json_writer w;
  // Valid two-, three- and four-byte sequences pass; a stray continuation byte, a lone lead byte
  // at the end, an overlong form and a surrogate become \u00XX escapes of their bytes.
  w.begin_array()
      .value("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80")
      .value("a\x80z")
      .value("end\xc3")
      .value("\xc0\xaf")
      .value("\xed\xa0\x80")
      .end_array();
  CHECK(w.str() ==
        "[\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\",\"a\\u0080z\",\"end\\u00c3\","
        "\"\\u00c0\\u00af\",\"\\u00ed\\u00a0\\u0080\"]");
}
